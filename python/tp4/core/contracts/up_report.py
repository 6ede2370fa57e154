"""What `tp4 up --json` prints: every step's outcome and time, the plan it brought up, and the
command that resumes a run that stopped (tp4.serving.up builds it through :class:`UpReport`)."""

from __future__ import annotations

from typing import Final, Literal

from pydantic import Field

from tp4.core import schemas
from tp4.core.contracts.base import Closed, version

SCHEMA: Final = schemas.UP

StepName = Literal["doctor", "image", "distribute", "prepare", "serve", "smoke"]
StepOutcome = Literal["done", "skipped", "failed", "interrupted", "not run"]


class UpStep(Closed):
    """One step of the run, in the order `tp4 up` runs them."""

    name: StepName = Field(description="doctor, image, distribute, prepare, serve or smoke.")
    outcome: StepOutcome = Field(
        description='"done"; "skipped" (nothing to do, --from, or the line already runs this plan); "failed" '
        '(the run stopped there); "interrupted" (Ctrl-C or a stopping signal during it); "not run" (after '
        "the step that stopped the run)."
    )
    seconds: float = Field(description="How long it took (0 for a step not run or skipped before it started).")
    detail: str = Field(description="What it did, why it was skipped, or the first line of why it failed.")


class UpReport(Closed):
    """`tp4 up --json`: the summary of one run (printed when it stopped or was interrupted too)."""

    schema_: Literal["tp4.up/1"] = version(SCHEMA)
    plan: str = Field(description="The digest of the plan brought up (every rank carries it).")
    ok: bool = Field(description="Every step done or skipped: the line runs this plan and its smoke passed.")
    steps: list[UpStep] = Field(description="All six steps, in order.")
    seconds: float = Field(description="The whole run, in seconds.")
    stopped_at: StepName | None = Field(description="The step that failed or was interrupted; null when ok.")
    error: str | None = Field(description="Why it stopped (the step's own message); null when ok.")
    resume: str | None = Field(
        description="The command that resumes the run (`tp4 up --from STEP`); null when ok, or when rerunning "
        "would not help (a line that runs this plan but fails its smoke: see `error`)."
    )


MODELS: tuple[type[Closed], ...] = (UpReport, UpStep)
