"""Which workers have the head's image: `tp4 distribute --check --json` (tp4.cli.build builds it
through :class:`DistributeCheck`)."""

from __future__ import annotations

from typing import Final, Literal

from pydantic import Field

from tp4.core import schemas
from tp4.core.contracts.base import Closed, version

SCHEMA: Final = schemas.DISTRIBUTE_CHECK


class WorkerImage(Closed):
    """One worker's copy of the image."""

    node: str = Field(description="The worker's ssh name or address.")
    status: str = Field(description='"present", "missing", "differs" or "failed" (it could not be asked).')
    detail: str = Field(description="The id it has, or why not.")


class DistributeCheck(Closed):
    """`tp4 distribute --check --json`: copies nothing; exit 1 unless every worker has the image."""

    schema_: Literal["tp4.distribute-check/1"] = version(SCHEMA)
    image: str = Field(description="The image reference on the head.")
    id: str = Field(description="Its image id on the head.")
    ok: bool = Field(description="Every worker has that id.")
    workers: list[WorkerImage] = Field(description="Every worker, in the order given.")


MODELS: tuple[type[Closed], ...] = (DistributeCheck, WorkerImage)
