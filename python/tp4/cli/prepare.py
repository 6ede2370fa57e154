"""`tp4 share`, `tp4 pack` and `tp4 prepare`: preparing the nodes for the line (issue 11)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from tp4.cli.common import (
    dry_run_option,
    load_line,
    profile_option,
    ssh_option,
    strict_option,
    sysfs_option,
    sysfs_root,
)
from tp4.core.errors import Tp4Error
from tp4.serving.up import MADE_BY, gate  # doctor's blocking checks a later step makes pass (as in `tp4 up`)

if TYPE_CHECKING:
    from tp4.line.plan import Plan
    from tp4.line.profile.load import Loaded
    from tp4.hosts.nodes import Node

STEPS = ("doctor", "download", "share", "pack")


def _line(profile_path: str | None, strict: bool, ssh_options: tuple[str, ...]) -> tuple[Loaded, Plan, list[Node]]:
    from tp4.hosts.nodes import nodes_of

    line = load_line(profile_path, strict)
    return line.loaded, line.plan, nodes_of(line.plan, ssh_options=ssh_options)


def _as_run(node: Node, argv: list[str]) -> str:
    import shlex

    from tp4.core import process

    return f"{node.name}: {shlex.join(process.full_argv(argv, node.remote))}"


def _rehearsed(lines: list[str]) -> None:
    for line in lines:
        click.echo(line)
    click.echo("dry run: nothing was run, no host was asked", err=True)


@click.command("share")
@profile_option
@ssh_option
@strict_option
@dry_run_option
def share(profile_path: str | None, ssh_options: tuple[str, ...], strict: bool, dry_run: bool) -> None:
    """Export the head's checkpoint read-only to exactly the plan's workers (NFSv4) and make each
    worker's weights volume, then check that every worker sees config.json. Idempotent: what
    already matches is left alone. A ring, or nfs.share = false: nothing to do.
    --dry-run prints each host's commands and asks no host; the steps that depend on a host's
    answer (its NFS server, the worker's address, a volume already there) are said so."""
    from tp4.hosts import share as share_mod

    loaded, plan, nodes = _line(profile_path, strict, ssh_options)
    if dry_run:
        _rehearsed(share_mod.rehearse(loaded.profile, plan, nodes))
        return
    share_mod.share(loaded.profile, plan, nodes, click.echo)


@click.command("pack")
@profile_option
@ssh_option
@strict_option
@dry_run_option
def pack(profile_path: str | None, ssh_options: tuple[str, ...], strict: bool, dry_run: bool) -> None:
    """Pack the Engram row shards of every rank with the image's packer, on every node at once
    (the checkpoint as the rank mounts it, into its engram dir), then check every shard's header.
    A node whose two shards are complete is skipped; exit 1 naming each node that failed.
    --dry-run prints each node's packer command and asks no node."""
    from tp4.hosts import pack as pack_mod

    _, plan, nodes = _line(profile_path, strict, ssh_options)
    if dry_run:
        _rehearsed(pack_mod.rehearse(plan, nodes))
        return
    pack_mod.pack(plan, nodes, click.echo)


@click.command("prepare")
@profile_option
@sysfs_option
@ssh_option
@strict_option
@dry_run_option
def prepare(profile_path: str | None, sysfs: str, ssh_options: tuple[str, ...], strict: bool, dry_run: bool) -> None:
    """doctor, download, share, pack: everything the line needs before `tp4 serve`, stopping at
    the first blocking failure. Every step is idempotent: rerun it after a fix and it goes on
    where it stopped. doctor's checkpoint and Engram checks are left to the steps that make them.
    --dry-run prints every step's commands in order, host by host (as `tp4 download`, `tp4 share`
    and `tp4 pack --dry-run` print them), and asks no host: whether a step stops the run or
    skips its work depends on what the hosts answer, which the output says."""
    from tp4.hosts import doctor as doctor_mod
    from tp4.hosts import checkpoint as checkpoint_mod
    from tp4.hosts import pack as pack_mod
    from tp4.hosts import share as share_mod

    sysfs = sysfs_root(sysfs)
    loaded, plan, nodes = _line(profile_path, strict, ssh_options)
    if dry_run:
        limits = doctor_mod.Limits.of_profile(loaded.profile, sysfs=sysfs)
        # doctor's script is the same long constant on every node: shown by name, its arguments as they run
        facts = [
            [
                a if a != doctor_mod.FACTS_SCRIPT else "<FACTS_SCRIPT>"
                for a in doctor_mod.facts_argv(plan, n.rank, limits)
            ]
            for n in nodes
        ]
        steps = (
            [_as_run(n, argv) for n, argv in zip(nodes, facts, strict=True)]
            + ["(the run stops here on a blocking failure other than what the next steps make)"],
            checkpoint_mod.rehearse(loaded.profile),
            share_mod.rehearse(loaded.profile, plan, nodes),
            pack_mod.rehearse(plan, nodes),
        )
        lines = []
        for i, commands in enumerate(steps):
            lines += [f"# prepare: step {i + 1}/{len(STEPS)}: {STEPS[i]}", *commands]
        lines[1:1] = [
            "(<FACTS_SCRIPT>: doctor's one read-only script, the same on every node; `tp4 -v doctor` logs it in full)"
        ]
        _rehearsed(lines)
        return

    def step(i: int) -> None:
        click.echo(f"prepare: step {i + 1}/{len(STEPS)}: {STEPS[i]}")

    def stopped(i: int, why: str, exit_code: int = 1) -> Tp4Error:
        return Tp4Error(
            f"prepare: stopped at step {i + 1}/{len(STEPS)} ({STEPS[i]}): {why}\n"
            "fix: the fix above, then rerun `tp4 prepare` (the steps done are skipped)",
            exit_code=exit_code,
        )

    step(0)
    limits = doctor_mod.Limits.of_profile(loaded.profile, sysfs=sysfs)
    report = doctor_mod.doctor(plan, nodes, limits)
    for line in doctor_mod.table(plan, report.results):
        click.echo(line)
    problem, later = gate(report, MADE_BY)
    if problem:
        raise stopped(0, problem)
    click.echo(
        "prepare: doctor: no blocking failure" + (f" but what the next steps make: {', '.join(later)}" if later else "")
    )
    for i, run in (
        (1, lambda: checkpoint_mod.download(loaded.profile)),
        (2, lambda: share_mod.share(loaded.profile, plan, nodes, click.echo)),
        (3, lambda: pack_mod.pack(plan, nodes, click.echo)),
    ):
        step(i)
        try:
            run()
        except Tp4Error as exc:
            raise stopped(i, exc.message, exc.exit_code) from None
    click.echo("prepare: done: every step passed; next: tp4 serve")
