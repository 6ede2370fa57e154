"""The head's image store: `tp4 image-store status --json` (tp4.cli.build builds it through
:class:`ImageStoreStatus`)."""

from __future__ import annotations

from typing import Final, Literal

from pydantic import Field

from tp4.core import schemas
from tp4.core.contracts.base import Closed, version

SCHEMA: Final = schemas.IMAGE_STORE


class ImageStoreStatus(Closed):
    """`tp4 image-store status --json`: printed when the store does not run too (then exit 1)."""

    schema_: Literal["tp4.image-store/1"] = version(SCHEMA)
    running: bool = Field(description="The image store runs.")
    root: str = Field(description="Its state directory.")
    url: str | None = Field(description="host:port on 127.0.0.1 it listens on; null: not running.")
    repo: str = Field(description="The repository tp4 pushes the line's images to.")
    manifests: list[str] = Field(
        description="The manifest digests it holds in that repository (empty: none, or not running)."
    )


MODELS: tuple[type[Closed], ...] = (ImageStoreStatus,)
