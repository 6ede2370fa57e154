"""`tp4 doctor`: every host requirement of the line, read-only, one table node x check with a fix
for each failure (tp4.hosts.doctor)."""

from __future__ import annotations

import json

import click

from tp4.core import schemas
from tp4.cli.common import Float, load_line, profile_option, ssh_option, strict_option, sysfs_option, sysfs_root


@click.command("doctor")
@profile_option
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help=f"The evidence ({schemas.DOCTOR}: every node's facts and every check) as JSON on stdout; the table "
    "then goes to stderr.",
)
@click.option(
    "--output",
    "-o",
    "json_path",
    type=click.Path(dir_okay=False),
    default=None,
    metavar="FILE",
    help=f"Write the evidence ({schemas.DOCTOR}, as --json prints it) to FILE (replaced whole, never half-written).",
)
@click.option(
    "--interval",
    type=Float(0, 60),
    default=2.0,
    show_default=True,
    metavar="SECONDS",
    help="Seconds between the two reads of the RoCE error counters.",
)
@sysfs_option
@ssh_option
@strict_option
def doctor(
    profile_path: str | None,
    as_json: bool,
    json_path: str | None,
    interval: float,
    sysfs: str,
    ssh_options: tuple[str, ...],
    strict: bool,
) -> None:
    """Check every node of the line, read-only and in parallel (one ssh session each): ssh, the
    runtime, the GPU, RDMA (ports, link layer, IPv4, MTU, a jumbo ping, the RoCE v2 GID index,
    memlock, error counters), the kernel, weights, Engram shards, the image, disk, ports, clocks
    and memory. Prints one table (check x node) and a fix for each warning and failure; exits 1
    on a blocking failure (a node ssh cannot reach or whose host key tp4 does not trust is one),
    2 on invalid input (the profile, an option)."""
    from tp4.hosts import doctor as doctor_mod
    from tp4.hosts.nodes import nodes_of

    from tp4.core.userfiles import check_output, write_output

    to_stdout = as_json
    if json_path is not None:  # before the nodes are asked: a device or a FIFO is refused, never replaced
        check_output(json_path, "--output", force=True)
    sysfs = sysfs_root(sysfs)
    chosen = load_line(profile_path, strict)
    loaded, plan = chosen.loaded, chosen.plan
    nodes = nodes_of(plan, ssh_options=ssh_options)
    limits = doctor_mod.Limits.of_profile(loaded.profile, sysfs=sysfs, interval=interval)
    report = doctor_mod.doctor(plan, nodes, limits)
    for line in doctor_mod.table(plan, report.results):
        click.echo(line, err=to_stdout)
    if to_stdout:
        click.echo(json.dumps(report.evidence(), indent=2))
    if json_path is not None:
        # a temporary file of its own beside it, renamed over it (never FILE.tmp, a name another
        # user could plant), and only over a regular file
        write_output(json_path, json.dumps(report.evidence(), indent=2) + "\n", "--output", force=True)
    blocking = report.blocking
    click.echo(
        f"doctor: {len(plan.nodes)} nodes in {report.seconds:.2f} s: "
        + (f"{len(blocking)} blocking failure(s)" if blocking else "ready"),
        err=to_stdout,
    )
    if blocking:
        raise SystemExit(1)
