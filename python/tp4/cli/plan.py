"""`tp4 plan`: the rendered line, per rank."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import TYPE_CHECKING

import click

from tp4.core import schemas
from tp4.cli.common import Int, json_option, load_line, profile_option, ssh_option, strict_option
from tp4.core.errors import InvalidInput
from tp4.core.netaddr import host_port

if TYPE_CHECKING:
    from tp4.line.plan import Plan


def _human(plan: Plan, rank: int | None) -> str:
    line, image = plan.line, plan.image
    out = [
        f"line: {line.nnodes} nodes, TP {line.tp}, EP {line.ep}, {line.fabric} fabric, preset {plan.preset} ({plan.source})",
        f"image: {image.tag} ({image.variant}; base {image.base})",
        f"api: {line.api}  dist init: {line.dist_init_addr}",
        f"digest: {plan.digest}",
    ]
    if "API_KEY" in plan.secrets:
        out.append("api key: read from " + plan.secrets["API_KEY"].file + " at serve time (never shown)")
    for node in plan.nodes:
        if rank is not None and node.rank != rank:
            continue
        ssh, run, gid = node.ssh, node.run, node.gid
        out += [
            "",
            f"rank {node.rank} ({node.role}) {node.name}  fabric {node.host}  ssh {ssh.user}@{host_port(ssh.host, ssh.port)}",
            f"  container {run.container} image {run.image} command {' '.join(run.command)}",
            f"  --network {run.network} --ipc {run.ipc} --privileged --cap-add {','.join(run.cap_add)} --gpus {run.gpus} --shm-size {run.shm_size}",
            f"  ulimits memlock={run.ulimits.memlock} stack={run.ulimits.stack}  devices " + " ".join(run.devices),
            "  mounts:",
        ]
        for m in run.mounts:
            out.append(
                f"    {m.source} -> {m.target}"
                + (" (ro)" if m.read_only else "")
                + (" [volume]" if m.type == "volume" else "")
            )
        out.append(
            f"  gid index {gid.value}: "
            + (
                f"pinned by {gid.pinned_by}"
                if gid.pinned_by
                else f"looked up on the node by {' and '.join(gid.lookup_by)} at start ({', '.join(gid.hcas)})"
            )
        )
        out.append(f"  env ({len(node.env)}):")
        out += [f"    {k}={v}" for k, v in node.env.items()]
        out.append("  engine argv:")
        out.append("    " + shlex.join(node.argv))
    out += ["", "boot lines that must appear (rank 0):"]
    out += [f"  {b.text}" for b in plan.boot_lines if b.required]
    optional = [b for b in plan.boot_lines if not b.required]
    if optional:
        out.append("useful boot lines:")
        out += [f"  {b.text}" for b in optional]
    out.append("never on any rank: " + ", ".join(plan.forbidden_lines))
    for n in plan.notes:
        out.append(f"note: {n}")
    return "\n".join(out)


@click.command()
@profile_option
@click.option("--rank", type=Int(0, 255), default=None, help="Show only this rank.")
@json_option(f"Machine-readable plan (schema {schemas.PLAN}, see docs/plan-schema.md), with its digest.")
@click.option(
    "--output",
    "-o",
    "output",
    type=click.Path(dir_okay=False),
    default=None,
    help="Write the JSON plan to FILE (replaced whole, never half-written): the plan a NixOS host configuration reads, committed beside the profile.",
)
@click.option(
    "--check",
    "check",
    type=click.Path(dir_okay=False),
    default=None,
    help="Compare FILE (a committed `tp4 plan --json -o FILE`) with the plan the profile renders now: exit 0 when it is current, 1 with the differences when it is stale.",
)
@click.option(
    "--against-running",
    is_flag=True,
    help="Compare with the plan the running line was started from: exit 0 when it runs this plan, 1 when not (the fields that differ).",
)
@ssh_option
@strict_option
def plan(
    profile_path: str | None,
    rank: int | None,
    as_json: bool,
    output: str | None,
    check: str | None,
    against_running: bool,
    ssh_options: tuple[str, ...],
    strict: bool,
) -> None:
    """Show the rendered line: per rank the container env, the engine argv, the run spec, and the
    boot-log lines the armed gates must print, and the plan's digest (the label every rank
    started from it carries). The profile's warnings go to stderr (and into the JSON's
    `warnings`). -o writes the plan file a NixOS host reads, --check says whether a committed one
    is current, --against-running asks the nodes which plan runs and prints the difference."""
    if (output or check) and rank is not None:
        raise InvalidInput("--rank: a plan file holds the whole line; fix: leave out --rank with -o or --check")
    if sum(map(bool, (output, check, against_running))) > 1:
        raise InvalidInput("-o, --check and --against-running: one at a time; fix: run them one after the other")
    line = load_line(profile_path, strict, announce=against_running)
    result = line.plan
    if rank is not None and not 0 <= rank < len(result.nodes):
        raise InvalidInput(f"--rank {rank}: the line has ranks 0..{len(result.nodes) - 1}")
    if against_running:
        _against_running(result, ssh_options, as_json)
        return
    if output is not None:
        from tp4.line.planfile import write_plan

        write_plan(Path(output), result)
        click.echo(f"wrote {output} (schema {schemas.PLAN}, plan {result.digest})", err=True)
        return
    if check is not None:
        from tp4.line.planfile import stale

        differences = stale(Path(check), result)
        if differences:
            click.echo(f"{check} is stale: the profile ({result.source}) renders another plan:", err=True)
            for d in differences:
                click.echo(f"  {d}", err=True)
            click.echo(
                f"fix: tp4 plan --json -o {check}"
                + (f" --profile {profile_path}" if profile_path else "")
                + ", review the difference and commit it",
                err=True,
            )
            raise SystemExit(1)
        click.echo(f"{check} is current (the plan the profile renders, {result.digest})", err=True)
        return
    if as_json:
        import json

        data = result.to_json()
        nodes = data["nodes"]
        if rank is not None and isinstance(nodes, list):
            data["nodes"] = [n for n in nodes if isinstance(n, dict) and n["rank"] == rank]
        click.echo(json.dumps(data, indent=2))
    else:
        click.echo(_human(result, rank))


def _against_running(plan: Plan, ssh_options: tuple[str, ...], as_json: bool) -> None:
    """The plan against the one the line runs: per rank its state and digest, then the fields that
    differ; exit 1 when a rank runs from another plan."""
    from tp4.serving import serve
    from tp4.hosts.nodes import nodes_of

    nodes = nodes_of(plan, ssh_options=ssh_options)
    digests = serve.running_digests(nodes)
    result = serve.compare_running(plan, nodes, digests)
    result["nodes"] = [
        {
            "node": n.name,
            "rank": n.rank.rank,
            "state": digests[n.name][0] or "absent",
            "plan": digests[n.name][1] or None,
        }
        for n in nodes
    ]
    if as_json:
        import json

        click.echo(json.dumps(result, indent=2, sort_keys=True))
    else:
        for n in nodes:
            state, digest = digests[n.name]
            click.echo(f"{n.name} (rank {n.rank.rank}): {state or 'absent'}" + (f"  plan {digest}" if digest else ""))
        click.echo(f"plan: {result['summary']}")
        fields = result["fields"]
        for f in fields if isinstance(fields, list) else []:
            click.echo(f"  {f}")
    if not result["same"]:
        raise SystemExit(1)
