"""`tp4 plan`: the rendered line, per rank."""

from __future__ import annotations

import shlex
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
@strict_option
def plan(profile_path: str | None, rank: int | None, as_json: bool, strict: bool) -> None:
    """Show the rendered line: per rank the container env, the engine argv, the run spec, and the
    boot-log lines the armed gates must print. The profile's warnings go to stderr (and into the
    JSON's `warnings`)."""
    from tp4.plan import build_plan

    loaded = load_profile(profile_path, strict)
    result = build_plan(loaded)
    if rank is not None and not 0 <= rank < len(result.nodes):
        raise InvalidInput(f"--rank {rank}: the line has ranks 0..{len(result.nodes) - 1}")
    if as_json:
        import json

        data = result.to_json()
        nodes = data["nodes"]
        if rank is not None and isinstance(nodes, list):
            data["nodes"] = [n for n in nodes if isinstance(n, dict) and n["rank"] == rank]
        click.echo(json.dumps(data, indent=2))
    else:
        click.echo(_human(result, rank))
