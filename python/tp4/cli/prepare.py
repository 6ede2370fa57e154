"""`tp4 share`: preparing the nodes for the line (issue 11)."""

from __future__ import annotations

from pathlib import Path

import click

DEFAULT_PROFILE = "profile.toml"


@click.command("share")
@click.option("--profile", "-p", "profile_path", type=click.Path(dir_okay=False), default=None,
              help=f"The line's profile (default: ./{DEFAULT_PROFILE} when it exists, else the embedded default).")
@click.option("--ssh-option", "ssh_options", multiple=True, metavar="OPT", help="Extra `ssh -o` option; repeatable.")
@click.option("--strict", is_flag=True, help="Treat the profile's warnings as errors (exit 2).")
def share(profile_path: str | None, ssh_options: tuple[str, ...], strict: bool) -> None:
    """Export the head's checkpoint read-only to exactly the plan's workers (NFSv4) and make each
    worker's weights volume, then check that every worker sees config.json. Idempotent: what
    already matches is left alone. A ring, or nfs.share = false: nothing to do."""
    from tp4 import share as share_mod
    from tp4.cli.plan import load_profile
    from tp4.plan import build_plan
    from tp4.serve import nodes_of

    if profile_path is None and Path(DEFAULT_PROFILE).is_file():
        profile_path = DEFAULT_PROFILE
    loaded = load_profile(profile_path, strict)
    plan = build_plan(loaded)
    share_mod.share(loaded.profile, plan, nodes_of(plan, ssh_options=ssh_options), click.echo)
