"""`tp4 plan`: the rendered line, per rank."""

from __future__ import annotations

import shlex

import click

from tp4.errors import InvalidInput


def load_profile(path: str | None):
    from tp4.profile import load_default, load_file

    return load_default() if path is None else load_file(path)


def _human(plan, rank: int | None) -> str:
    out = [
        f"line: {plan.line['nnodes']} nodes, TP {plan.line['tp']}, EP {plan.line['ep']}, {plan.line['fabric']} fabric, preset {plan.preset} ({plan.source})",
        f"image: {plan.image['tag']} ({plan.image['variant']}; base {plan.image['base']})",
        f"api: {plan.line['api']}  dist init: {plan.line['dist_init_addr']}",
    ]
    if plan.secrets:
        out.append("api key: read from " + plan.secrets["API_KEY"]["file"] + " at serve time (never shown)")
    for node in plan.nodes:
        if rank is not None and node.rank != rank:
            continue
        ssh = node.ssh
        run = node.run
        out += ["", f"rank {node.rank} ({node.role}) {node.name}  fabric {node.host}  ssh {ssh['user']}@{ssh['host']}:{ssh['port']}",
                f"  container {run['container']} image {run['image']} command {' '.join(run['command'])}",
                f"  --network {run['network']} --ipc {run['ipc']} --privileged --cap-add {','.join(run['cap_add'])} --gpus {run['gpus']} --shm-size {run['shm_size']}",
                "  ulimits " + " ".join(f"{k}={v}" for k, v in run["ulimits"].items()) + "  devices " + " ".join(run["devices"]),
                "  mounts:"]
        for m in run["mounts"]:
            out.append(f"    {m['source']} -> {m['target']}" + (" (ro)" if m["read_only"] else "") + (" [volume]" if m["type"] == "volume" else ""))
        out.append(f"  env ({len(node.env)}):")
        out += [f"    {k}={v}" for k, v in node.env.items()]
        out.append("  engine argv:")
        out.append("    " + shlex.join(node.argv))
    out += ["", "boot lines that must appear (rank 0):"]
    out += [f"  {b['text']}" for b in plan.boot_lines if b["required"]]
    optional = [b for b in plan.boot_lines if not b["required"]]
    if optional:
        out.append("useful boot lines:")
        out += [f"  {b['text']}" for b in optional]
    out.append("never on any rank: " + ", ".join(plan.forbidden_lines))
    for n in plan.notes:
        out.append(f"note: {n}")
    for w in plan.warnings:
        out.append(f"warning: {w}")
    return "\n".join(out)


@click.command()
@click.option("--profile", "-p", "profile_path", type=click.Path(dir_okay=False), help="Profile TOML; default: the embedded production profile on the example cluster.")
@click.option("--rank", type=int, default=None, help="Show only this rank.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable plan (schema tp4.plan/1.1, see docs/plan-schema.md).")
def plan(profile_path: str | None, rank: int | None, as_json: bool) -> None:
    """Show the rendered line: per rank the container env, the engine argv, the run spec, and the
    boot-log lines the armed gates must print."""
    from tp4.plan import build_plan

    loaded = load_profile(profile_path)
    result = build_plan(loaded)
    if rank is not None and not 0 <= rank < len(result.nodes):
        raise InvalidInput(f"--rank {rank}: the line has ranks 0..{len(result.nodes) - 1}")
    if as_json:
        import json

        data = result.to_json()
        if rank is not None:
            data["nodes"] = [n for n in data["nodes"] if n["rank"] == rank]
        click.echo(json.dumps(data, indent=2))
    else:
        click.echo(_human(result, rank))
