"""Doctor's evidence: `tp4 doctor --json`, `-o FILE` (tp4.hosts.doctor.Report.evidence builds it through
:class:`DoctorEvidence`): what every node said and every check's verdict on it."""

from __future__ import annotations

from typing import Final, Literal

from pydantic import Field, JsonValue

from tp4.core import schemas
from tp4.core.contracts.base import Closed, version

SCHEMA: Final = schemas.DOCTOR
Status = Literal["ok", "warn", "fail", "n/a"]


class NodeFacts(Closed):
    """What one node said (the sections of doctor's facts script), or why it could not be read."""

    error: str | None = Field(
        description="null, or why the node's facts could not be read (then every check of it fails)."
    )
    seconds: float = Field(description="How long the node took to answer, seconds.")
    received: float = Field(description="This machine's clock (Unix time) when the facts arrived.")
    derived: dict[str, JsonValue] = Field(
        description="What the checks resolved from the facts (gid_index: HCA -> the RoCE v2 GID index found)."
    )
    sections: dict[str, list[str]] = Field(description="The facts script's sections: name -> its output lines.")


class CheckResult(Closed):
    """One check on one node (or on the line)."""

    id: str = Field(description="The check's stable id (docs/doctor.md lists them).")
    node: str = Field(description="The node it judged.")
    status: Status = Field(description="ok, warn, fail, or n/a where it does not apply.")
    detail: str = Field(description="What was found.")
    fix: str | None = Field(description="For a warning or failure: what to do.")
    blocking: bool = Field(description="A failure of this check stops `tp4 serve` (and makes `tp4 doctor` exit 1).")


class DoctorEvidence(Closed):
    """`tp4 doctor --json`, `-o FILE`: every node's facts and every check."""

    schema_: Literal["tp4.doctor/1"] = version(SCHEMA)
    seconds: float = Field(description="How long doctor took, seconds.")
    nodes: dict[str, NodeFacts] = Field(description="Node name -> what it said.")
    checks: list[CheckResult] = Field(description="Every check on every node, in the order of doctor's table.")


MODELS: tuple[type[Closed], ...] = (DoctorEvidence, NodeFacts, CheckResult)
