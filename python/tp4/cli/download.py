"""`tp4 download`: the pinned checkpoint into the head's model.dir (tp4.hosts.checkpoint)."""

from __future__ import annotations

import click

from tp4.cli.common import dry_run_option, load_line, profile_option, strict_option


@click.command()
@profile_option
@strict_option
@dry_run_option
def download(profile_path: str | None, strict: bool, dry_run: bool) -> None:
    """Download model.hf_repo at model.hf_revision into model.dir on the head (this machine),
    verify every file against the Hub's hashes and link model.common_link to it.

    Resumes partial files; skipped when the directory already holds the verified revision.
    The endpoint is HF_ENDPOINT's (default: the Hub); a gated or private repository needs
    HF_TOKEN or `hf auth login`.

    --dry-run prints what the download does, from the profile alone: neither the Hub nor the
    directory is read, so which files it fetches is said to depend on what model.dir holds."""
    from tp4.hosts import checkpoint as checkpoint_mod

    profile = load_line(profile_path, strict).loaded.profile
    if dry_run:
        for line in checkpoint_mod.rehearse(profile):
            click.echo(line)
        click.echo("dry run: nothing was run, no host was asked", err=True)
        return
    checkpoint_mod.download(profile)
