"""The smoke check: `tp4 smoke --json` (tp4.cli.serve builds it through :class:`SmokeReport`):
upstream's checks against the line's API, each with its verdict."""

from __future__ import annotations

from typing import Final, Literal

from pydantic import Field

from tp4.core import schemas
from tp4.core.contracts.base import Closed, version

SCHEMA: Final = schemas.SMOKE


class SmokeCheck(Closed):
    """One check against the API."""

    name: str = Field(description="arithmetic, stream, json_schema or tool_call.")
    ok: bool = Field(description="It passed.")
    detail: str = Field(description="What was answered, or why it failed.")
    seconds: float = Field(description="How long it took.")


class SmokeReport(Closed):
    """`tp4 smoke --json`: every check run (exit 1 when one failed)."""

    schema_: Literal["tp4.smoke/1"] = version(SCHEMA)
    api: str = Field(description="The API asked (the plan's line.api).")
    ok: bool = Field(description="Every check passed.")
    checks: list[SmokeCheck] = Field(description="Every check, in the order run.")


MODELS: tuple[type[Closed], ...] = (SmokeReport, SmokeCheck)
