"""`tp4 download`: the pinned checkpoint into the head's model.dir (tp4.hosts.checkpoint)."""

from __future__ import annotations

import click

from tp4.cli.common import load_line, profile_option, strict_option


@click.command()
@profile_option
@strict_option
def download(profile_path: str | None, strict: bool) -> None:
    """Download model.hf_repo at model.hf_revision into model.dir on the head (this machine),
    verify every file against the Hub's hashes and link model.common_link to it.

    Resumes partial files; skipped when the directory already holds the verified revision.
    The endpoint is HF_ENDPOINT's (default: the Hub); a gated or private repository needs
    HF_TOKEN or `hf auth login`."""
    from tp4.hosts import checkpoint as checkpoint_mod

    checkpoint_mod.download(load_line(profile_path, strict).loaded.profile)
