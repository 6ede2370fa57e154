"""`tp4 fleet plan | serve | stop | status`: several lines behind SGLang's router (tp4.serving.fleet)."""

from __future__ import annotations

import json
import sys
import time
from typing import TYPE_CHECKING

import click

from tp4.cli.common import (
    boot_timeout_option,
    Float,
    dry_run_option,
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
    from tp4.serving.fleet import Fleet

DEFAULT_FLEET = "fleet.toml"

fleet_option = click.option(
    "--fleet",
    "-f",
    "fleet_path",
    type=click.Path(dir_okay=False),
    default=DEFAULT_FLEET,
    show_default=True,
    help="The fleet file (docs/fleet.md).",
)


def _out(line: str) -> None:
    click.echo(line)


def _err(line: str) -> None:
    click.echo(line, err=True)


def _load(path: str, strict: bool) -> Fleet:
    from tp4.serving import fleet

    loaded = fleet.load(path)
    if strict and loaded.warnings:
        raise InvalidInput(
            f"{path}: {len(loaded.warnings)} warning(s), errors under --strict; fix: address each, or drop --strict",
            list(loaded.warnings),
        )
    for w in loaded.warnings:
        click.echo(f"warning: {w}", err=True)
    return loaded


@click.group("fleet")
def fleet() -> None:
    """Several TP4 lines behind SGLang's router, from one fleet file."""


@fleet.command("plan")
@fleet_option
@click.option("--json", "as_json", is_flag=True, help=f"One JSON object (schema {schemas.FLEET}).")
@strict_option
def plan(fleet_path: str, as_json: bool, strict: bool) -> None:
    """Each line's plan summary and the router's command (the API key never shown)."""
    from tp4.serving import fleet as fleet_mod

    loaded = _load(fleet_path, strict)
    if as_json:
        click.echo(json.dumps(fleet_mod.plan_json(loaded), indent=2))
    else:
        for line in fleet_mod.plan_text(loaded):
            click.echo(line)


@fleet.command("serve")
@fleet_option
@click.option("--all", "all_lines", is_flag=True, help="Every line or none: when one fails, stop them all.")
@click.option(
    "--force", is_flag=True, help="Start although a node's GPU has compute apps (doctor's GPU.NO_FOREIGN_APPS)."
)
@boot_timeout_option("of every line ")
@sysfs_option
@ssh_option
@strict_option
@dry_run_option
def serve(
    fleet_path: str,
    all_lines: bool,
    force: bool,
    timeouts: tuple[str, ...],
    sysfs: str,
    ssh_options: tuple[str, ...],
    strict: bool,
    dry_run: bool,
) -> None:
    """Serve every line in parallel (each proved ready as `tp4 serve` does), then the router over
    the lines that came up; ready when the router reports each of them healthy. A line that
    fails is reported and left out (exit 1, the others keep serving), unless --all. --dry-run
    prints every line's commands and the router's, host by host, and asks no host."""
    from tp4.serving import fleet as fleet_mod
    from tp4.serving import serve as serve_mod

    sysfs = sysfs_root(sysfs)
    loaded = _load(fleet_path, strict)
    opts = serve_mod.Options(force=force, timeouts=parse_timeouts(timeouts), tty=False, sysfs=sysfs)
    if dry_run:  # after every option is checked
        _rehearsed(fleet_mod.rehearse_serve(loaded, ssh_options))
        return
    served = fleet_mod.serve(loaded, opts, _out, _err, all_lines=all_lines, ssh_options=ssh_options)
    if served.failed:
        failed = "\n".join(f"  line {r.line.name}: {r.detail}" for r in served.failed)
        raise Tp4Error(
            f"{len(served.failed)} of {len(served.lines)} lines failed and are left out; the router serves "
            f"{', '.join(line.name for line in served.up)} (`tp4 fleet stop` stops them):\n{failed}"
        )


@fleet.command("stop")
@fleet_option
@ssh_option
@strict_option
@dry_run_option
def stop(fleet_path: str, ssh_options: tuple[str, ...], strict: bool, dry_run: bool) -> None:
    """Stop the router and every line (also what a crashed serve left). Idempotent. --dry-run
    prints the router's and every line's commands, host by host, and asks no host."""
    from tp4.serving import fleet as fleet_mod

    loaded = _load(fleet_path, strict)
    if dry_run:
        _rehearsed(fleet_mod.rehearse_stop(loaded, ssh_options))
        return
    problems = fleet_mod.stop(loaded, _out, _err, ssh_options=ssh_options)
    if problems:
        raise Tp4Error("not everything stopped:\n" + "\n".join(f"  {p}" for p in problems))


def _rehearsed(lines: list[str]) -> None:
    """A dry run's commands on stdout, one a line, where first; a note on stderr."""
    for line in lines:
        _out(line)
    click.echo("dry run: nothing was run, no host was asked", err=True)


def render(data: dict[str, object]) -> list[str]:
    out: list[str] = []
    router = data.get("router")
    if isinstance(router, dict):
        listed = router.get("workers")
        count = len(listed) if isinstance(listed, list) else 0
        out.append(
            f"router {router.get('kind')} {router.get('url')}: {router.get('state')}"
            + (f" (pid {router.get('pid')}, {count} lines registered)" if router.get("pid") else "")
            + (f": {router.get('error')}" if router.get("error") else "")
        )
    lines = data.get("lines")
    for line in lines if isinstance(lines, list) else []:
        if not isinstance(line, dict):
            continue
        out.append(f"line {line.get('name')} {line.get('api')}: {line.get('router_health') or 'not in the router'}")
        sub = line.get("status")
        if isinstance(sub, dict):
            out += [f"  {text}" for text in render_status(sub)]
    return out


@fleet.command("status")
@fleet_option
@click.option("--json", "as_json", is_flag=True, help=f"One JSON object (schema {schemas.FLEET_STATUS}).")
@click.option("--watch", is_flag=True, help="Refresh until Ctrl-C.")
@click.option(
    "--interval",
    type=Float(1, 3600),
    default=10,
    show_default=True,
    help="Seconds between refreshes with --watch.",
)
@click.option(
    "--probe-timeout",
    type=Float(0.1, 600),
    default=10,
    show_default=True,
    help="Seconds each line's one-token completion may take.",
)
@ssh_option
@strict_option
def status(
    fleet_path: str,
    as_json: bool,
    watch: bool,
    interval: float,
    probe_timeout: float,
    ssh_options: tuple[str, ...],
    strict: bool,
) -> None:
    """The router (its process, each line's health as the router sees it) and each line (as `tp4
    status` shows it). Exit 1 unless the router runs and reports every line healthy."""
    from tp4.serving import fleet as fleet_mod

    loaded = _load(fleet_path, strict)
    while True:
        data = fleet_mod.status(loaded, ssh_options=ssh_options, probe_timeout=probe_timeout)
        if as_json:
            click.echo(json.dumps(data, indent=None if watch else 2, sort_keys=True))
        else:
            for line in render(data):
                click.echo(line)
        if not watch:
            if not fleet_mod.healthy(data):
                sys.exit(1)
            return
        time.sleep(interval)
        if not as_json:
            click.echo("")
