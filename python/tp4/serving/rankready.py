"""One rank's readiness on its own node, from the committed plan (`tp4 bootlog wait`, which the
NixOS module's tp4-rank-ready.service runs beside the rank unit): tp4 serve's boot-log check
(tp4.serving.bootlog) on this node's container log. It waits for the rank's `service.ready.pattern`,
then (rank 0) checks the plan's required boot lines; it fails at once on a forbidden line, when
the container is no longer running, and after `service.ready.timeout` seconds."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from tp4.core import process

from tp4.serving import bootlog
from tp4.core.errors import Tp4Error

if TYPE_CHECKING:
    from tp4.line.plan import Plan, RankPlan

TAIL = 20


class NotReady(Tp4Error):
    """The rank failed its readiness (exit 1); the message ends with the log's last lines."""


def _state(node: RankPlan) -> str:
    proc = process.run(
        [node.service.runtime, "container", "inspect", "--format", "{{.State.Status}}", node.run.container],
        check=False,
        timeout=30,
        purpose=f"the state of {node.run.container}",
    )
    return proc.stdout.strip() if proc.returncode == 0 and proc.stdout.strip() else "gone"


def _log(node: RankPlan) -> list[str]:
    proc = process.run(
        [node.service.runtime, "logs", node.run.container],
        check=False,
        timeout=120,
        purpose=f"the log of {node.run.container}",
    )
    return bootlog.log_lines((proc.stdout or "") + (proc.stderr or ""))


def _fail(node: RankPlan, what: str, lines: list[str]) -> NotReady:
    text = f"{node.run.container}: {what}"
    if lines:
        text += f"\nlast lines of the log of {node.run.container}:\n" + "\n".join(
            f"  | {line}" for line in lines[-TAIL:]
        )
    return NotReady(text)


def wait(
    plan: Plan,
    rank: int,
    *,
    poll: float = 5.0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> str:
    """The log line that shows rank `rank` ready; NotReady when it fails or the bound passes."""
    node = plan.nodes[rank]
    ready = re.compile(node.service.ready.pattern)
    # this rank's part of serve's check: the forbidden lines on its log, and on the head the
    # required boot lines (the stamps' agreement needs every rank's log: serve checks it)
    own = plan._replace(nodes=(node,), boot_lines=plan.boot_lines if node.service.ready.required_lines else ())
    deadline = clock() + node.service.ready.timeout
    while True:
        state = _state(node)
        lines = _log(node)
        review = bootlog.review_boot_logs(own, {rank: "\n".join(lines)})
        forbidden = [p for p in review.problems if p.check == "forbidden-line"]
        if forbidden:
            raise _fail(
                node,
                f"{forbidden[0].detail}; fix: read the whole log (tp4 logs), stop the line (tp4 stop) "
                "and fix the cause before the next tp4 serve",
                lines,
            )
        hit = next((line for line in lines if ready.search(line)), None)
        if hit is not None:
            missing = [p for p in review.problems if p.check == "missing-line"]
            if missing:
                texts = " ".join(
                    f"`{b.text}`" for b in own.boot_lines if b.required and not re.search(b.pattern, "\n".join(lines))
                )
                raise _fail(
                    node,
                    f"ready, but the boot lines the plan arms are not in its log: {texts}; fix: check that the "
                    "image carries the adapters and that the rank's env has their gates (tp4 plan)",
                    lines,
                )
            return hit
        if state != "running":
            raise _fail(
                node,
                f"the container is {state} and its log never showed it ready (no line matching "
                f"'{ready.pattern}'); fix: read its log (journalctl -u the rank unit, or tp4 logs) and "
                "start the line again with tp4 serve",
                lines,
            )
        if clock() >= deadline:
            raise _fail(
                node,
                f"not ready after {node.service.ready.timeout}s: no line matching '{ready.pattern}' in its "
                "log; fix: read its log (tp4 logs); a boot that is only slow needs tp4 serve's longer "
                "phase timeouts",
                lines,
            )
        sleep(poll)
