"""A run of the suite: each task asked once (one request at a time, temperature 0, thinking off,
not streamed), scored, and the results compared with a baseline.

The results document (``--json``, ``--out``) and the baseline are JSON (docs/qeval.md). A
baseline is either a results document of an earlier run or the smaller baseline form
(``{"tp4": {"kind": "qeval-baseline", ...}, "label": ..., "results": {id: "pass"|"fail"}}``).
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from tp4 import __version__

from tp4.serving import api
from tp4.serving.api import Endpoint, Json
from tp4.core.errors import InvalidInput, Tp4Error
from tp4.measuring.qeval.checks import KINDS, Answer, Code, Verdict
from tp4.measuring.qeval.sandbox import Sandbox
from tp4.measuring.qeval.tasks import TASKS, Task, suite_digest

# thinking off under either chat template's name for it (DeepSeek's `thinking`, Qwen's `enable_thinking`)
NO_THINKING: dict[str, Json] = {"enable_thinking": False, "thinking": False}
PREVIEW = 200
REQUEST_TIMEOUT = 300.0
BASELINE_KIND = "qeval-baseline"


@dataclass(frozen=True)
class TaskResult:
    id: str
    kind: str
    passed: bool
    reason: str
    seconds: float  # the request, plus the sandbox run of a code task
    answer: str
    finish_reason: str | None
    completion_tokens: int | None

    def to_json(self) -> dict[str, Json]:
        first = self.answer[:PREVIEW] + ("..." if len(self.answer) > PREVIEW else "")
        return {
            "id": self.id,
            "kind": self.kind,
            "passed": self.passed,
            "reason": self.reason,
            "seconds": round(self.seconds, 3),
            "answer": {"first": first, "chars": len(self.answer)},
            "finish_reason": self.finish_reason,
            "completion_tokens": self.completion_tokens,
        }


def select(only: Sequence[str] = (), kinds: Sequence[str] = ()) -> tuple[Task, ...]:
    """The tasks named (``only``: ids) and of the kinds named; all when neither is given."""
    known = {t.id for t in TASKS}
    unknown = [i for i in only if i not in known]
    if unknown:
        raise InvalidInput(
            f"--only: no task {', '.join(repr(u[:60]) for u in unknown)}; fix: one of the ids `tp4 qeval --list` shows"
        )
    bad = [k for k in kinds if k not in KINDS]
    if bad:
        raise InvalidInput(f"--kind: {bad[0][:40]!r} is no kind; fix: one of {', '.join(KINDS)}")
    chosen = tuple(t for t in TASKS if (not only or t.id in only) and (not kinds or t.kind in kinds))
    if not chosen:
        raise InvalidInput("--only/--kind: no task is both named and of a kind named; fix: widen the selection")
    return chosen


def ask(ep: Endpoint, task: Task, timeout: float) -> api.Completion:
    return api.complete(
        ep, task.prompt, max_tokens=task.max_tokens, timeout=timeout, temperature=0.0, chat_template_kwargs=NO_THINKING
    )


def score(task: Task, answer: Answer, sandbox: Sandbox | None) -> Verdict:
    scorer = task.scorer
    if isinstance(scorer, Code):
        if sandbox is None:
            raise Tp4Error(f"{task.id}: a code task needs a sandbox; fix: --profile (a worker), or --sandbox-host")
        nonce = secrets.token_hex(16)
        outcome = sandbox.run(scorer.program(answer.text, nonce, max(1, int(sandbox.limits.seconds))))
        return scorer.verdict(
            outcome, nonce, seconds_limit=sandbox.limits.seconds, memory_mib=sandbox.limits.memory_mib
        )
    return scorer.score(answer)


def run(
    tasks: Sequence[Task],
    ep: Endpoint,
    sandbox: Sandbox | None,
    *,
    timeout: float = REQUEST_TIMEOUT,
    progress: Callable[[TaskResult, int, int], None] | None = None,
) -> list[TaskResult]:
    """Every task in turn. An API that is down or refuses the key stops the run (every later
    answer would fail alike); any other failed request fails its task, with the reason."""
    results: list[TaskResult] = []
    for i, task in enumerate(tasks, 1):
        started = time.monotonic()
        try:
            out = ask(ep, task, timeout)
        except api.ApiError as exc:
            if exc.kind in ("down", "auth"):
                raise Tp4Error(f"qeval stopped at task {task.id} ({i} of {len(tasks)}): {exc.message}") from None
            result = TaskResult(
                task.id, task.kind, False, f"no answer: {exc.message}", time.monotonic() - started, "", None, None
            )
        else:
            verdict = score(task, Answer(out.content, out.finish_reason), sandbox)
            result = TaskResult(
                task.id,
                task.kind,
                verdict.passed,
                verdict.reason,
                time.monotonic() - started,
                out.content,
                out.finish_reason,
                out.usage.completion_tokens if out.usage else None,
            )
        results.append(result)
        if progress is not None:
            progress(result, i, len(tasks))
    return results


# --- baseline ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Baseline:
    label: str
    suite: str | None
    results: dict[str, bool]


@dataclass(frozen=True)
class Diff:
    newly_failing: list[str]
    newly_passing: list[str]
    not_in_baseline: list[str]

    def to_json(self) -> dict[str, Json]:
        return {
            "newly_failing": list(self.newly_failing),
            "newly_passing": list(self.newly_passing),
            "not_in_baseline": list(self.not_in_baseline),
        }


def parse_baseline(text: str, where: str) -> Baseline:
    """A baseline file's contents (either form, module doc); errors name the field and the fix."""

    def bad(field: str, why: str) -> InvalidInput:
        return InvalidInput(
            f"--baseline {where}: {field}: {why}; fix: pass a file written by `tp4 qeval --out`, or a baseline "
            "in the form of python/tp4/data/qeval-baseline.json"
        )

    from tp4.core.userfiles import parse_json

    # a syntax error, nesting 5,000 deep or a 5,000-digit number: said plainly, never exit 70
    doc = parse_json(
        text,
        f"--baseline {where}: the file",
        "pass a file written by `tp4 qeval --out`, or a baseline in the form of python/tp4/data/qeval-baseline.json",
    )
    if not isinstance(doc, dict):
        raise bad("the file", "not a JSON object")
    meta = doc.get("tp4")
    kind = meta.get("kind") if isinstance(meta, dict) else None
    suite = meta.get("suite") if isinstance(meta, dict) else None
    if suite is not None and not isinstance(suite, str):
        raise bad("tp4.suite", "not a string")
    label = doc.get("label", "")
    if not isinstance(label, str):
        raise bad("label", "not a string")
    results: dict[str, bool] = {}
    if kind == BASELINE_KIND:
        raw = doc.get("results")
        if not isinstance(raw, dict):
            raise bad("results", 'missing or not an object of task id -> "pass" | "fail"')
        for key, value in raw.items():
            if value not in ("pass", "fail"):
                raise bad(f"results.{key[:60]}", f'{json.dumps(value)[:40]} is neither "pass" nor "fail"')
            results[key] = value == "pass"
    elif kind == "qeval":
        tasks = doc.get("tasks")
        if not isinstance(tasks, list):
            raise bad("tasks", "missing or not a list")
        for n, item in enumerate(tasks):
            if (
                not isinstance(item, dict)
                or not isinstance(item.get("id"), str)
                or not isinstance(item.get("passed"), bool)
            ):
                raise bad(f"tasks[{n}]", "not an object with a string id and a boolean passed")
            results[str(item["id"])] = item["passed"] is True
    else:
        raise bad("tp4.kind", f'expected "{BASELINE_KIND}" or "qeval", found {json.dumps(kind)[:40]}')
    return Baseline(label, suite, results)


def load_baseline(path: str) -> Baseline:
    from tp4.core.userfiles import read_input

    return parse_baseline(read_input(path, "--baseline", "pass a file written by `tp4 qeval --out`"), path)


def compare(baseline: Baseline, results: Sequence[TaskResult]) -> Diff:
    failing = [r.id for r in results if r.id in baseline.results and baseline.results[r.id] and not r.passed]
    passing = [r.id for r in results if r.id in baseline.results and not baseline.results[r.id] and r.passed]
    new = [r.id for r in results if r.id not in baseline.results]
    return Diff(failing, passing, new)


def baseline_doc(results: Sequence[TaskResult], label: str, note: str) -> dict[str, Json]:
    """The baseline form of a run's results."""
    return {
        "tp4": {"kind": BASELINE_KIND, "version": __version__, "suite": suite_digest()},
        "label": label,
        "note": note,
        "results": {r.id: "pass" if r.passed else "fail" for r in results},
    }


# --- the results document ---------------------------------------------------------------------------


def by_kind(results: Sequence[TaskResult]) -> dict[str, tuple[int, int]]:
    out: dict[str, tuple[int, int]] = {}
    for kind in KINDS:
        mine = [r for r in results if r.kind == kind]
        if mine:
            out[kind] = (sum(r.passed for r in mine), len(mine))
    return out


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def results_doc(
    results: Sequence[TaskResult],
    *,
    ep: Endpoint,
    sandbox: Sandbox | None,
    started: str,
    finished: str,
    label: str,
    baseline: Baseline | None,
    baseline_path: str | None,
) -> dict[str, Json]:
    kinds = by_kind(results)
    doc: dict[str, Json] = {
        "tp4": {"version": __version__, "kind": "qeval", "suite": suite_digest()},
        "label": label,
        "started": started,
        "finished": finished,
        "endpoint": {"url": ep.url, "model": ep.model},
        "sandbox": None
        if sandbox is None
        else {
            "node": sandbox.where,
            "image": sandbox.image,
            "runtime": sandbox.runtime,
            "limits": {
                "seconds": sandbox.limits.seconds,
                "cpus": sandbox.limits.cpus,
                "memory_mib": sandbox.limits.memory_mib,
                "pids": sandbox.limits.pids,
                "tmpfs_mib": sandbox.limits.tmpfs_mib,
            },
        },
        "score": {
            "passed": sum(r.passed for r in results),
            "total": len(results),
            "by_kind": {k: {"passed": p, "total": t} for k, (p, t) in kinds.items()},
        },
        "tasks": [r.to_json() for r in results],
        "baseline": None,
    }
    if baseline is not None:
        doc["baseline"] = {
            "file": baseline_path,
            "label": baseline.label,
            "same_suite": baseline.suite in (None, suite_digest()),
            **compare(baseline, results).to_json(),
        }
    return doc


def shipped_baseline() -> Path:
    return Path(__file__).resolve().parents[2] / "data" / "qeval-baseline.json"
