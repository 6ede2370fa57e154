"""The pinned sources' reports: `tp4 sources verify --json` (:class:`SourcesVerify`) and `tp4
sources diff --json` (:class:`SourcesDiff`), built by tp4.cli.sources."""

from __future__ import annotations

from typing import Final, Literal

from pydantic import Field

from tp4.core import schemas
from tp4.core.contracts.base import Closed, version

VERIFY_SCHEMA: Final = schemas.SOURCES_VERIFY
DIFF_SCHEMA: Final = schemas.SOURCES_DIFF


class SourcesVerify(Closed):
    """`tp4 sources verify --json`: printed for a manifest that fails too (then exit 2, or 1 when a
    download did not match)."""

    schema_: Literal["tp4.sources-verify/1"] = version(VERIFY_SCHEMA)
    manifest: str = Field(description="The manifest checked.")
    ok: bool = Field(description="Every check passed.")
    rows: int = Field(description="How many rows were checked (the names given, else every row).")
    unlocked: int = Field(description="How many of them are not locked (each also a warning).")
    trees: int = Field(description="How many trees the manifest declares.")
    downloaded: bool = Field(description="--download: every locked row was downloaded and its hash checked.")
    warnings: list[str] = Field(description="The warnings (unlocked rows).")
    problems: list[str] = Field(description="Every problem (empty: ok).")


class SourcesChange(Closed):
    """One row or tree added, removed or changed."""

    change: Literal["added", "removed", "changed"] = Field(description="What happened to it.")
    kind: str = Field(description='"row" or "tree": a row or a tree of the manifest.')
    name: str = Field(description="Its name.")
    details: list[str] = Field(description='For "changed": each column or attribute, `name: old -> new`.')


class SourcesDiff(Closed):
    """`tp4 sources diff --json`: what changed from the old manifest to the new."""

    schema_: Literal["tp4.sources-diff/1"] = version(DIFF_SCHEMA)
    old: str = Field(description="The old manifest.")
    new: str = Field(description="The new manifest.")
    changes: list[SourcesChange] = Field(description="Every change, rows first, then trees (empty: none).")


VERIFY_MODELS: tuple[type[Closed], ...] = (SourcesVerify,)
DIFF_MODELS: tuple[type[Closed], ...] = (SourcesDiff, SourcesChange)
