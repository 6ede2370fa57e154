"""`tp4 bootlog`: the boot-log check of one rank on its own node."""

from __future__ import annotations

from pathlib import Path

import click

from tp4.cli.common import Float, Int
from tp4.core.errors import InvalidInput


@click.group()
def bootlog() -> None:
    """The boot-log check of tp4 serve, on one node."""


@bootlog.command()
@click.option(
    "--plan",
    "plan_file",
    required=True,
    type=click.Path(dir_okay=False),
    help="The line's plan file (tp4 plan --json -o FILE), as the host configuration holds it.",
)
@click.option("--rank", type=Int(0, 255), required=True, help="This node's rank in the plan.")
@click.option(
    "--poll",
    type=Float(0, 3600, low_open=True),
    default=5.0,
    show_default=True,
    help="Seconds between two reads of the log.",
)
def wait(plan_file: str, rank: int, poll: float) -> None:
    """Wait until this node's rank shows it is ready in its container's log (the plan's
    service.ready), then check the plan's boot lines on it: exit 0 ready, 1 failed (a forbidden
    line, a stopped container, a missing required line, the plan's bound passed), 2 bad input.
    The NixOS module's tp4-rank-ready.service runs it beside the rank unit."""
    from tp4.line.planfile import load_plan
    from tp4.serving.rankready import wait as wait_ready

    if poll <= 0:
        raise InvalidInput(f"--poll {poll}: not a positive number of seconds; fix: leave it out (5)")
    plan = load_plan(Path(plan_file))
    if not 0 <= rank < len(plan.nodes):
        raise InvalidInput(f"--rank {rank}: the plan has ranks 0..{len(plan.nodes) - 1}; fix: pass this node's rank")
    line = wait_ready(plan, rank, poll=poll)
    click.echo(f"{plan.nodes[rank].run.container}: ready: {line}")
