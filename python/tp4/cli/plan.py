"""`tp4 plan`: the rendered line, per rank."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import TYPE_CHECKING

import click

from tp4 import schemas
from tp4.errors import InvalidInput

if TYPE_CHECKING:
    from tp4.plan import Plan
    from tp4.profile.load import Loaded


strict_option = click.option("--strict", is_flag=True, help="Treat the profile's warnings (performance caveats) as errors (exit 2).")


def load_profile(path: str | None, strict: bool = False) -> Loaded:
    """The profile a command names with --profile (the embedded default without); its warnings
    go to stderr as `warning: ...`, or with strict fail the command."""
    from tp4.profile import load_default, load_file
    from tp4.profile import load as load_mod

    loaded = load_default() if path is None else load_file(path, "pass an existing file, or omit --profile to use the embedded default")
    if strict:
        load_mod.strict(loaded)
    for w in loaded.warnings:
        click.echo(f"warning: {w}", err=True)
    return loaded


def _human(plan: Plan, rank: int | None) -> str:
    line, image = plan.line, plan.image
    out = [
        f"line: {line.nnodes} nodes, TP {line.tp}, EP {line.ep}, {line.fabric} fabric, preset {plan.preset} ({plan.source})",
        f"image: {image.tag} ({image.variant}; base {image.base})",
        f"api: {line.api}  dist init: {line.dist_init_addr}",
    ]
    if "API_KEY" in plan.secrets:
        out.append("api key: read from " + plan.secrets["API_KEY"].file + " at serve time (never shown)")
    for node in plan.nodes:
        if rank is not None and node.rank != rank:
            continue
        ssh, run, gid = node.ssh, node.run, node.gid
        out += ["", f"rank {node.rank} ({node.role}) {node.name}  fabric {node.host}  ssh {ssh.user}@{ssh.host}:{ssh.port}",
                f"  container {run.container} image {run.image} command {' '.join(run.command)}",
                f"  --network {run.network} --ipc {run.ipc} --privileged --cap-add {','.join(run.cap_add)} --gpus {run.gpus} --shm-size {run.shm_size}",
                f"  ulimits memlock={run.ulimits.memlock} stack={run.ulimits.stack}  devices " + " ".join(run.devices),
                "  mounts:"]
        for m in run.mounts:
            out.append(f"    {m.source} -> {m.target}" + (" (ro)" if m.read_only else "") + (" [volume]" if m.type == "volume" else ""))
        out.append(f"  gid index {gid.value}: " + (f"pinned by {gid.pinned_by}" if gid.pinned_by else
                   f"looked up on the node by {' and '.join(gid.lookup_by)} at start ({', '.join(gid.hcas)})"))
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
@click.option("--profile", "-p", "profile_path", type=click.Path(), help="Profile TOML; default: the embedded production profile on the example cluster.")
@click.option("--rank", type=int, default=None, help="Show only this rank.")
@click.option("--json", "as_json", is_flag=True, help=f"Machine-readable plan (schema {schemas.PLAN}, see docs/plan-schema.md).")
@click.option("--output", "-o", "output", type=click.Path(dir_okay=False), default=None,
              help="Write the JSON plan to FILE (replaced whole, never half-written): the plan a NixOS host configuration reads, committed beside the profile.")
@click.option("--check", "check", type=click.Path(dir_okay=False), default=None,
              help="Compare FILE (a committed `tp4 plan --json -o FILE`) with the plan the profile renders now: exit 0 when it is current, 1 with the differences when it is stale.")
@strict_option
def plan(profile_path: str | None, rank: int | None, as_json: bool, output: str | None, check: str | None, strict: bool) -> None:
    """Show the rendered line: per rank the container env, the engine argv, the run spec, and the
    boot-log lines the armed gates must print. The profile's warnings go to stderr (and into the
    JSON's `warnings`)."""
    from tp4.plan import build_plan

    if (output or check) and rank is not None:
        raise InvalidInput("--rank: a plan file holds the whole line; fix: leave out --rank with -o or --check")
    if output and check:
        raise InvalidInput("-o and --check: write the plan or check it, not both; fix: run them one after the other")
    loaded = load_profile(profile_path, strict)
    result = build_plan(loaded)
    if rank is not None and not 0 <= rank < len(result.nodes):
        raise InvalidInput(f"--rank {rank}: the line has ranks 0..{len(result.nodes) - 1}")
    if output is not None:
        from tp4.planfile import write_plan

        write_plan(Path(output), result)
        click.echo(f"wrote {output} (schema {schemas.PLAN})", err=True)
        return
    if check is not None:
        from tp4.planfile import stale

        differences = stale(Path(check), result)
        if differences:
            click.echo(f"{check} is stale: the profile ({result.source}) renders another plan:", err=True)
            for d in differences:
                click.echo(f"  {d}", err=True)
            click.echo(f"fix: tp4 plan --json -o {check}" + (f" --profile {profile_path}" if profile_path else "") +
                       ", review the difference and commit it", err=True)
            raise SystemExit(1)
        click.echo(f"{check} is current (the plan the profile renders)", err=True)
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
