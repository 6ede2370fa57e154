"""A profile's check: `tp4 profile check --json` (tp4.cli.profile builds it through
:class:`ProfileCheck`): whether the file is a valid profile, what it describes, its warnings and
every problem."""

from __future__ import annotations

from typing import Final, Literal

from pydantic import Field

from tp4.core import schemas
from tp4.core.contracts.base import Closed, version

SCHEMA: Final = schemas.PROFILE_CHECK


class ProfileCheck(Closed):
    """`tp4 profile check --json`: printed for a valid and an invalid profile alike (exit 0 and 2)."""

    schema_: Literal["tp4.profile-check/1"] = version(SCHEMA)
    file: str = Field(description="The profile file checked, as given.")
    ok: bool = Field(description="The profile is valid (with --strict: and has no warning).")
    preset: str | None = Field(description="Its preset; null: the profile is invalid.")
    nodes: list[str] = Field(description="Its nodes' names, the head first (empty: invalid).")
    tp: int | None = Field(description="Its tensor-parallel size; null: invalid.")
    ep: int | None = Field(description="Its expert-parallel size; null: invalid.")
    image: str | None = Field(description="The image tag it runs; null: invalid.")
    warnings: list[str] = Field(description="Its warnings (performance caveats).")
    problems: list[str] = Field(description="Every problem, each naming the field and the fix (empty: valid).")


MODELS: tuple[type[Closed], ...] = (ProfileCheck,)
