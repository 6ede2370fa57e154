"""The image listing: `tp4 images --json` (tp4.cli.images builds it through
:class:`ImagesListing`): the tp4 images (label tp4.line.ref) of the head and every worker."""

from __future__ import annotations

from typing import Final, Literal

from pydantic import Field

from tp4.core import schemas
from tp4.core.contracts.base import Closed, version

SCHEMA: Final = schemas.IMAGES


class ImageEntry(Closed):
    """One tp4 image in a node's runtime."""

    id: str = Field(description="The image id.")
    tags: list[str] = Field(description="Its tags (empty: untagged).")
    created: str = Field(description="When it was built, ISO 8601 with offset.")
    size: int = Field(description="Its size in bytes, as the runtime counts it.")
    line_ref: str = Field(description="Its tp4.line.ref label: the line reference it was built for.")
    line: bool = Field(description="The line's tag names this image.")
    digest: str | None = Field(
        description="The manifest digest of the head's registry (when pushed or pulled by digest); null: none."
    )
    flake_rev: str | None = Field(description="The flake revision it was built from (its label); null: not recorded.")
    pins: dict[str, str] = Field(description="Component -> commit, from its pin labels.")
    containers: list[str] = Field(description="The containers (any state) created from it.")
    layers: list[str] = Field(description="Its layers' diff ids.")


class ImagesNode(Closed):
    """What one node's runtime holds."""

    node: str = Field(description='"head", or the worker\'s ssh address.')
    host: str | None = Field(description="The ssh host (null: the head, this machine).")
    error: str | None = Field(description="null, or why the node could not be asked (then `tp4 images` exits 1).")
    line: dict[str, str] = Field(description="Line reference -> id of the image its tag names on this node.")
    differs: list[str] = Field(description="How the node's line images differ from the head's (empty: the same).")
    images: list[ImageEntry] = Field(description="Its tp4 images.")


class ImagesListing(Closed):
    """`tp4 images --json`: every node's tp4 images and their provenance."""

    schema_: Literal["tp4.images/1"] = version(SCHEMA)
    runtime: str = Field(description="The container runtime asked (docker or podman).")
    nodes: list[ImagesNode] = Field(description="The head first, then every worker.")


MODELS: tuple[type[Closed], ...] = (ImagesListing, ImagesNode, ImageEntry)
