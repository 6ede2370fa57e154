"""`tp4 serve`, `tp4 stop`, `tp4 status`, `tp4 logs`, `tp4 smoke`: the line, from its profile."""

from __future__ import annotations

import json
import sys
import time
from typing import TYPE_CHECKING

import click

from tp4.cli.common import (
    boot_timeout_option,
    Float,
    Int,
    dry_run_option,
    err,
    json_option,
    load_served,
    out,
    profile_option,
    render_status,
    ssh_option,
    strict_option,
    sysfs_option,
    sysfs_root,
    timeouts as parse_timeouts,
)
from tp4.core import schemas
from tp4.core.errors import InvalidInput, Tp4Error

if TYPE_CHECKING:
    from tp4.core.apikey import Secret
    from tp4.line.plan import Plan
    from tp4.hosts.nodes import Node


def _line(
    profile_path: str | None, strict: bool, ssh_options: tuple[str, ...]
) -> tuple[Plan, list[Node], dict[str, Secret]]:
    """(plan, nodes, secrets) of the profile the rule chooses (announced on stderr)."""
    served = load_served(profile_path, strict, ssh_options)
    return served.plan, served.nodes, served.secrets


def _rehearsed(lines: list[str]) -> None:
    """A dry run's commands on stdout, one a line, host first; a note on stderr."""
    for line in lines:
        click.echo(line)
    click.echo("dry run: nothing was run, no host was asked", err=True)


@click.command("serve")
@profile_option
@click.option(
    "--force", is_flag=True, help="Start although a node's GPU has compute apps (doctor's GPU.NO_FOREIGN_APPS)."
)
@boot_timeout_option("")
@click.option(
    "--on-slow-boot",
    type=click.Choice(["report", "restart"]),
    default="report",
    show_default=True,
    help="A boot whose warm-up throughput is below the threshold: report it, or restart it once.",
)
@click.option(
    "--slow-floor",
    type=Float(0, 1e9, low_open=True),
    default=None,
    metavar="TOKENS/S",
    help="Warm-up input throughput below which a boot is slow (default: half the last good boot's).",
)
@click.option(
    "--replace",
    is_flag=True,
    help="The line already runs (from this plan or another): stop it and serve this plan instead of refusing.",
)
@sysfs_option
@ssh_option
@strict_option
@dry_run_option
def serve(
    profile_path: str | None,
    force: bool,
    timeouts: tuple[str, ...],
    on_slow_boot: str,
    slow_floor: float | None,
    replace: bool,
    sysfs: str,
    ssh_options: tuple[str, ...],
    strict: bool,
    dry_run: bool,
) -> None:
    """Start the line and prove it ready, or leave nothing running.

    Runs doctor's blocking checks on every node (refusing with doctor's table) and checks that no
    rank runs yet, writes each rank's environment to its node as a file of mode 0600, starts the
    workers in parallel and then the head, and follows the head's boot. Ready means: the head printed `Ready: API on port <PORT>`,
    a one-token completion answered, and every rank's boot log passed the registry's checks. On
    any failure, or Ctrl-C, every rank started is stopped and the node and check that failed
    are named with that rank's last log lines. A line already running is refused, naming the
    plan it runs from and the fields that differ from this one, unless --replace. Every rank's
    container carries the plan's digest (label tp4.line.plan) and the plan is left beside its env file.
    --dry-run prints the commands that start the ranks, host by host, and asks no host.
    """
    from tp4.serving import serve as serve_mod

    sysfs = sysfs_root(sysfs)
    served = load_served(profile_path, strict, ssh_options)
    loaded = served.line.loaded
    opts = serve_mod.Options(
        force=force,
        timeouts=parse_timeouts(timeouts),
        on_slow_boot=on_slow_boot,
        slow_floor=slow_floor,
        tty=sys.stderr.isatty(),
        sysfs=sysfs,
        volume_kind="nfs" if loaded.profile.nfs.share else "local",
        expected_shards=loaded.profile.model.expected_shards,
        replace=replace,
    )
    if dry_run:  # after every option is checked: a dry run refuses what the real one would
        _rehearsed(serve_mod.rehearse_serve(served.plan, served.nodes))
        return
    serve_mod.serve(served.plan, served.nodes, served.secrets, opts, out, err)


@click.command("stop")
@profile_option
@click.option("--grace", type=Int(0, 3600), default=10, show_default=True, help="Seconds between TERM and KILL.")
@ssh_option
@strict_option
@dry_run_option
def stop(profile_path: str | None, grace: int, ssh_options: tuple[str, ...], strict: bool, dry_run: bool) -> None:
    """Stop every rank of the line (also what a crashed serve left) and check that the API is down
    and no container of the line remains. The stop is recorded on the head first, so that `tp4
    watch` leaves the line stopped (the next `tp4 serve` removes the record). Idempotent.
    --dry-run prints the command each node would run, and asks no host."""
    from tp4.serving import serve as serve_mod

    plan, nodes, secrets = _line(profile_path, strict, ssh_options)
    if dry_run:
        _rehearsed(serve_mod.rehearse_stop(nodes, grace=grace))
        return
    problems = serve_mod.stop(plan, nodes, secrets, out, err, grace=grace)
    if problems:
        raise Tp4Error("not everything stopped:\n" + "\n".join(f"  {p}" for p in problems))


@click.command("status")
@profile_option
@json_option("One JSON object.")
@click.option("--watch", is_flag=True, help="Refresh until Ctrl-C.")
@click.option(
    "--interval",
    type=Float(1, 3600),
    default=10,
    show_default=True,
    help="Seconds between refreshes with --watch (status reads no GPU tool: an nvidia-smi poll costs the decode steps).",
)
@click.option(
    "--probe-timeout",
    type=Float(0.1, 600),
    default=10,
    show_default=True,
    help="Seconds the one-token completion may take before the line is busy or wedged.",
)
@ssh_option
@strict_option
def status(
    profile_path: str | None,
    as_json: bool,
    watch: bool,
    interval: float,
    probe_timeout: float,
    ssh_options: tuple[str, ...],
    strict: bool,
) -> None:
    """Each node's rank (state, uptime, image, the digest of the plan it runs from, last log line)
    and the line: a real one-token completion, running and waiting requests (busy is not wedged),
    the current boot's signature, and whether the line runs this plan (else the fields that
    differ). The line's state is the one `tp4 watch` acts on: ready, busy, wedged, down or booting.
    Exit 1 when the line is neither ready nor busy."""
    from tp4.serving import serve as serve_mod

    plan, nodes, secrets = _line(profile_path, strict, ssh_options)
    while True:
        data = serve_mod.status(plan, nodes, secrets, probe_timeout=probe_timeout)
        if as_json:
            click.echo(json.dumps(data, indent=None if watch else 2, sort_keys=True))
        else:
            for line in render_status(data):
                click.echo(line)
        if not watch:
            if data.get("state") not in ("ready", "busy"):
                raise SystemExit(1)
            return
        time.sleep(interval)
        if not as_json:
            click.echo("")


@click.command("logs")
@profile_option
@click.option("--rank", type=Int(0, 255), default=0, show_default=True, help="Whose log.")
@click.option("-f", "--follow", is_flag=True, help="Follow it.")
@click.option("--since", default=None, metavar="T", help="Only lines since T (e.g. 10m, 2026-12-01T10:00:00).")
@click.option("--tail", "tail", type=Int(1, 1_000_000), default=None, help="Only the last N lines.")
@ssh_option
@strict_option
def logs(
    profile_path: str | None,
    rank: int,
    follow: bool,
    since: str | None,
    tail: int | None,
    ssh_options: tuple[str, ...],
    strict: bool,
) -> None:
    """A rank's log (its container's output)."""
    import re

    from tp4.core import process

    plan, nodes, _ = _line(profile_path, strict, ssh_options)
    if rank >= len(nodes):
        raise InvalidInput(f"--rank {rank}: the line has ranks 0..{len(nodes) - 1}")
    node = nodes[rank]
    argv = [node.runtime, "logs"]
    if since is not None:
        if not re.fullmatch(r"[0-9]+[smh]|[0-9]{4}-[0-9]{2}-[0-9]{2}(T[0-9:.]+(Z|[+-][0-9:]+)?)?", since):
            raise InvalidInput(f"--since {since!r}: expected a duration (30s, 10m, 2h) or a time (2026-12-01T10:00:00)")
        argv += ["--since", since]
    if tail is not None:
        argv += ["--tail", str(tail)]
    if follow:
        argv.append("-f")
    process.run([*argv, node.container], remote=node.remote, capture=False, purpose=f"the log of {node.name}")


@click.command("smoke")
@profile_option
@click.option("--full", is_flag=True, help="Also upstream's JSON-schema and tool-call checks.")
@json_option(f"Every check as one JSON object on stdout (schema {schemas.SMOKE}).")
@ssh_option
@strict_option
def smoke(profile_path: str | None, full: bool, as_json: bool, ssh_options: tuple[str, ...], strict: bool) -> None:
    """Upstream's arithmetic check (19 + 23 must be 42, finish reason stop) and a streamed
    completion against the line's API; --full adds the JSON-schema and tool-call checks. Exit 1
    when a check failed."""
    from tp4.core.contracts.smoke_report import SmokeCheck, SmokeReport
    from tp4.serving import api
    from tp4.serving import serve as serve_mod

    plan, _, secrets = _line(profile_path, strict, ssh_options)
    ep = serve_mod.endpoint(plan, secrets)
    results = api.smoke(ep, full=full)
    if as_json:  # built through its contract (tp4.core.contracts.smoke_report)
        report = SmokeReport(
            api=ep.url,
            ok=all(r.ok for r in results),
            checks=[SmokeCheck(name=r.name, ok=r.ok, detail=r.detail, seconds=round(r.seconds, 3)) for r in results],
        )
        click.echo(json.dumps(report.model_dump(mode="json", by_alias=True), indent=2))
    for r in results if not as_json else []:
        click.echo(f"{'ok' if r.ok else 'FAIL':<4} {r.name:<12} {r.seconds:5.1f} s  {r.detail}")
    failed = [r.name for r in results if not r.ok]
    if failed:
        raise Tp4Error(f"smoke failed: {', '.join(failed)}")
