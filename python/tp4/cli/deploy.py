"""`tp4 deploy`: the flake's NixOS systems on the line's NixOS hosts, checked from here, rolled back by
generation number where they fail (tp4.hosts.deploy)."""

from __future__ import annotations

from pathlib import Path

import click

from tp4.cli.common import (
    flake_option,
    Float,
    dry_run_option,
    err as _err,
    load_line,
    out as _out,
    profile_option,
    ssh_option,
    strict_option,
    sysfs_option,
    sysfs_root,
)
from tp4.core.errors import InvalidInput


@click.command("deploy")
@profile_option
@flake_option("with nixosConfigurations.<node>")
@click.option(
    "--on",
    "on",
    multiple=True,
    metavar="NODE",
    help="Deploy this NixOS node only; repeatable (default: every node of kind nixos).",
)
@click.option(
    "--all-or-nothing",
    is_flag=True,
    help="A host that fails takes every host back to its generation (and one that fails before the switch stops all).",
)
@click.option(
    "--skip-check",
    "skip_checks",
    multiple=True,
    metavar="ID",
    help="A doctor check not to hold against a host after its switch (e.g. PORTS.FREE while the line serves); repeatable.",
)
@click.option(
    "--check-timeout",
    type=Float(1, 3600),
    default=60,
    show_default=True,
    metavar="SECONDS",
    help="How long the post-check waits for ssh to answer and the RDMA check unit to settle after a switch.",
)
@dry_run_option
@sysfs_option
@ssh_option
@strict_option
def deploy(
    profile_path: str | None,
    flake_dir: Path | None,
    on: tuple[str, ...],
    all_or_nothing: bool,
    skip_checks: tuple[str, ...],
    check_timeout: float,
    dry_run: bool,
    sysfs: str,
    ssh_options: tuple[str, ...],
    strict: bool,
) -> None:
    """Build every NixOS host's system here once, copy it to each host, and switch all hosts at
    once (in a transient systemd unit, so an sshd or network restart cannot cut the switch). Then
    check each host from here: a new ssh connection, the RDMA check unit active, the weights, and
    doctor's blocking checks. A host that fails goes back to the generation it had, by number;
    the others stay (--all-or-nothing: all go back). Prints one line per host (from, to, result);
    exits 1 when a host failed."""
    from tp4.hosts import deploy as deploy_mod
    from tp4.hosts import doctor
    from tp4.image import nix
    from tp4.hosts.nodes import nodes_of

    sysfs = sysfs_root(sysfs)
    for check in skip_checks:
        if check not in doctor.BY_ID:
            raise InvalidInput(f"--skip-check {check!r}: no such doctor check; fix: one of {', '.join(doctor.BY_ID)}")
    line = load_line(profile_path, strict)  # no secret is read: deploy needs none
    loaded, plan = line.loaded, line.plan
    nodes = nodes_of(plan, ssh_options=ssh_options)
    flake = str(nix.find_flake(flake_dir))
    limits = doctor.Limits.of_profile(loaded.profile, sysfs=sysfs, interval=0.0, ping=False)
    opts = deploy_mod.Options(
        flake=flake,
        on=on,
        all_or_nothing=all_or_nothing,
        skip_checks=frozenset(skip_checks),
        limits=limits,
        check_timeout=check_timeout,
    )
    if dry_run:
        deploy_mod.dry_run(plan, nodes, opts, _out)
        return
    rows = deploy_mod.deploy(plan, nodes, opts, _out, _err)
    failed = [r.node for r in rows if r.result != "deployed"]
    if failed:
        _err(f"deploy: {len(rows) - len(failed)} of {len(rows)} hosts deployed; failed: {', '.join(failed)}")
        raise SystemExit(1)
    _err(f"deploy: {len(rows)} hosts deployed")
