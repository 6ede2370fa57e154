"""The scorers of `tp4 qeval`: an answer in, a verdict (passed, reason) out; no LLM judge.

* :class:`Code`: the answer's Python (its first fenced block, else the whole answer) runs against
  hidden asserts. This module only writes the program (:meth:`Code.program`) and reads what came
  back (:meth:`Code.verdict`); it runs in :mod:`tp4.measuring.qeval.sandbox`'s container, never here.
* :class:`JsonAnswer`: the answer parsed as one JSON value, checked against a JSON Schema
  (jsonschema, Draft 2020-12) and then by value checks.
* :class:`Numeric`: the answer's last number, matched within a tolerance.
* :class:`Format`: constraints on the form (lines, case, last word, a regular expression ...).
* :class:`Prose`: a prose answer's health: a length range, no long repeated word n-gram, no
  repeated sentence or line, no run of one character, not cut off at max_tokens (a run-away).

Everything here is pure and fast; the tests score a known-good and a known-bad answer of every task.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

from tp4.serving.api import Json

Kind = Literal["code", "json", "numeric", "format", "prose"]
KINDS: tuple[Kind, ...] = ("code", "json", "numeric", "format", "prose")


class Answer(NamedTuple):
    text: str
    finish_reason: str | None = "stop"


class Verdict(NamedTuple):
    passed: bool
    reason: str


def _shown(text: str, limit: int = 60) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")


def _runaway(answer: Answer) -> Verdict | None:
    if answer.finish_reason == "length":
        return Verdict(False, "cut off at max_tokens (finish_reason length): a run-away answer")
    return None


# --- code ------------------------------------------------------------------------------------------

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.S)


def extract_code(text: str) -> str:
    """The Python of an answer: the first fenced block that defines something (```python or a
    bare fence), else the first fenced block, else the whole answer."""
    blocks = [(lang.lower(), body) for lang, body in _FENCE.findall(text)]
    blocks = [(lang, body) for lang, body in blocks if lang in ("", "python", "py", "python3")] or blocks
    for _, body in blocks:
        if re.search(r"^\s*(def|class)\s", body, re.M):
            return str(body)
    return str(blocks[0][1]) if blocks else text


class Outcome(NamedTuple):
    """What a sandboxed run gave back: its exit code (None: stopped at the time limit), its
    stdout, whether the time limit stopped it, how long it took, and whether it was stopped for
    writing more output than the sandbox reads."""

    exit_code: int | None
    stdout: str
    timed_out: bool
    seconds: float
    too_much_output: bool = False


# The program the sandbox runs (python3 -I reads it on stdin). The model's code and the hidden
# asserts are embedded as Python literals (repr), never spliced in as code text. The model's
# stdout and stderr go to /dev/null; the verdict is written to a copy of the original stdout,
# each line headed by a nonce, so nothing the code prints can pass for one.
_RUNNER = """\
import json, os, resource
_NONCE = {nonce!r}
_out = os.dup(1)
_null = os.open(os.devnull, os.O_RDWR)
for _fd in (0, 1, 2):
    os.dup2(_null, _fd)


def _report(**fields):
    os.write(_out, (_NONCE + " " + json.dumps(fields) + "\\n").encode())


def _why(exc):
    try:
        text = type(exc).__name__ + ": " + str(exc)
    except BaseException:
        text = type(exc).__name__
    return text[:300]


_report(started=True)
resource.setrlimit(resource.RLIMIT_CPU, ({cpu}, {cpu} + 1))
_SOURCE = {source!r}
_ASSERTS = {asserts!r}
_ns = {{"__name__": "solution"}}
try:
    exec(compile(_SOURCE, "solution.py", "exec"), _ns)
except BaseException as exc:
    _report(passed=False, reason="the code does not run: " + _why(exc))
    os._exit(0)
if not callable(_ns.get({function!r})):
    _report(passed=False, reason="the code defines no function " + {function!r})
    os._exit(0)
for _i, _test in enumerate(_ASSERTS, 1):
    try:
        exec(compile(_test, "hidden-assert-" + str(_i), "exec"), _ns)
    except AssertionError:
        _report(passed=False, reason="hidden assert %d of %d failed" % (_i, len(_ASSERTS)))
        os._exit(0)
    except BaseException as exc:
        _report(passed=False, reason="hidden assert %d of %d raised " % (_i, len(_ASSERTS)) + _why(exc))
        os._exit(0)
_report(passed=True, reason="%d hidden asserts passed" % len(_ASSERTS))
os._exit(0)
"""


@dataclass(frozen=True)
class Code:
    """The answer defines ``function``; each of ``asserts`` (Python statements) must pass."""

    function: str
    asserts: tuple[str, ...]
    kind: Kind = field(default="code", init=False)

    def program(self, answer: str, nonce: str, cpu_seconds: int) -> str:
        return _RUNNER.format(
            nonce=nonce,
            cpu=int(cpu_seconds),
            source=extract_code(answer),
            asserts=list(self.asserts),
            function=self.function,
        )

    def verdict(self, outcome: Outcome, nonce: str, *, seconds_limit: float, memory_mib: int) -> Verdict:
        reports: list[dict[str, Json]] = []
        for line in outcome.stdout.splitlines():
            head, _, rest = line.partition(" ")
            if head != nonce:
                continue
            try:
                doc = json.loads(rest)
            except (ValueError, RecursionError):  # RecursionError: nested thousands deep
                continue
            if isinstance(doc, dict):
                reports.append(doc)
        final = [r for r in reports if isinstance(r.get("passed"), bool)]
        if final:
            reason = final[-1].get("reason")
            return Verdict(final[-1]["passed"] is True, str(reason))
        if outcome.too_much_output:
            return Verdict(False, "stopped for writing more output than the sandbox reads: no verdict")
        if outcome.timed_out:
            return Verdict(False, f"stopped at the time limit ({seconds_limit:g} s): killed, no verdict")
        code = outcome.exit_code
        if code == 137:
            return Verdict(
                False,
                f"killed (SIGKILL, exit 137): over the memory limit ({memory_mib} MiB), "
                f"the CPU time or the time limit ({seconds_limit:g} s)",
            )
        if code == 152:  # 128 + SIGXCPU
            return Verdict(False, "stopped at the CPU time limit (SIGXCPU)")
        return Verdict(False, f"the program ended without a verdict (exit code {code})")


# --- json ------------------------------------------------------------------------------------------

ValueCheck = tuple[str, Callable[[Json], bool]]


def strip_fence(text: str) -> str:
    """The answer without one surrounding Markdown code fence (```json ... ```)."""
    m = re.fullmatch(r"\s*```[A-Za-z0-9_-]*[ \t]*\n(.*?)\n?```\s*", text, re.S)
    return m[1] if m else text


def _path(parts: Sequence[object]) -> str:
    return "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in parts)


@dataclass(frozen=True)
class JsonAnswer:
    """The answer is one JSON value valid under ``schema``; then each value check holds."""

    schema: dict[str, Json]
    checks: tuple[ValueCheck, ...] = ()
    kind: Kind = field(default="json", init=False)

    def score(self, answer: Answer) -> Verdict:
        from jsonschema import Draft202012Validator  # type: ignore[import-untyped]  # no stubs or py.typed

        text = strip_fence(answer.text).strip()
        try:
            doc: Json = json.loads(text)
        except (ValueError, RecursionError) as exc:  # RecursionError: an answer nested thousands deep
            runaway = _runaway(answer)
            return runaway or Verdict(False, f"not JSON ({exc}): {_shown(text)}")
        errors = sorted(Draft202012Validator(self.schema).iter_errors(doc), key=lambda e: list(e.absolute_path))
        if errors:
            first = errors[0]
            return Verdict(False, f"schema: at {_path(list(first.absolute_path))}: {first.message}")
        for what, check in self.checks:
            try:
                ok = check(doc)
            except (KeyError, IndexError, TypeError, ValueError, AttributeError):
                ok = False
            if not ok:
                return Verdict(False, f"value check failed: {what}")
        return Verdict(True, f"valid under the schema; {len(self.checks)} value checks passed")


# --- numeric ---------------------------------------------------------------------------------------

_NUMBER = re.compile(
    r"(?<![\w.])[-+−]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?(?![\w])|(?<![\w.])[-+−]?\.\d+"
)


def last_number(text: str) -> float | None:
    found = _NUMBER.findall(text)
    if not found:
        return None
    try:
        return float(found[-1].replace(",", "").replace("−", "-"))
    except ValueError:
        return None


@dataclass(frozen=True)
class Numeric:
    """The answer's last number equals ``value`` within ``tolerance`` (absolute) or ``relative``."""

    value: float
    tolerance: float = 0.0
    relative: float = 0.0
    kind: Kind = field(default="numeric", init=False)

    def score(self, answer: Answer) -> Verdict:
        got = last_number(answer.text)
        want = (
            f"{self.value:.12g}"
            + (f" ± {self.tolerance:g}" if self.tolerance else "")
            + (f" (± {self.relative:.0e} relative)" if self.relative else "")
        )
        if got is None:
            return _runaway(answer) or Verdict(False, f"no number in the answer {_shown(answer.text)}; expected {want}")
        ok = math.isclose(got, self.value, rel_tol=self.relative, abs_tol=self.tolerance) or got == self.value
        return Verdict(ok, f"answered {got:.12g}" + ("" if ok else f"; expected {want}"))


# --- format ----------------------------------------------------------------------------------------


def _lines(text: str) -> list[str]:
    return [line.rstrip() for line in text.strip("\n").splitlines()] if text.strip() else []


def _words(text: str) -> list[str]:
    return re.findall(r"[A-Za-z0-9']+(?:-[A-Za-z0-9']+)*", text)


@dataclass(frozen=True)
class Lines:
    count: int

    def check(self, text: str) -> str | None:
        lines = _lines(text)
        if len(lines) != self.count:
            return f"{len(lines)} line{'' if len(lines) == 1 else 's'}; expected exactly {self.count}"
        blank = [i + 1 for i, line in enumerate(lines) if not line.strip()]
        return f"line {blank[0]} is blank" if blank else None


@dataclass(frozen=True)
class AllCaps:
    def check(self, text: str) -> str | None:
        lower = re.findall(r"[a-z]", text)
        if not re.search(r"[A-Z]", text):
            return "no capital letters at all"
        return f"{len(lower)} lower-case letters; expected all caps" if lower else None


@dataclass(frozen=True)
class EndsWith:
    word: str

    def check(self, text: str) -> str | None:
        words = _words(text)
        last = words[-1] if words else ""
        return (
            None
            if last.lower() == self.word.lower() and text.rstrip(" .!\n").endswith(last)
            else f"the last word is {last!r}; expected {self.word!r}"
        )


@dataclass(frozen=True)
class StartsWith:
    prefix: str

    def check(self, text: str) -> str | None:
        return None if text.lstrip().startswith(self.prefix) else f"does not start with {self.prefix!r}"


@dataclass(frozen=True)
class Matches:
    """The whole answer (stripped) matches ``pattern``; ``what`` says what that means."""

    pattern: str
    what: str

    def check(self, text: str) -> str | None:
        return None if re.fullmatch(self.pattern, text.strip(), re.S) else f"is not {self.what}"


@dataclass(frozen=True)
class EachLine:
    pattern: str
    what: str

    def check(self, text: str) -> str | None:
        for i, line in enumerate(_lines(text), 1):
            if not re.fullmatch(self.pattern, line.strip()):
                return f"line {i} {_shown(line)} is not {self.what}"
        return None


@dataclass(frozen=True)
class WordCount:
    least: int
    most: int

    def check(self, text: str) -> str | None:
        n = len(_words(text))
        return None if self.least <= n <= self.most else f"{n} words; expected {self.least} to {self.most}"


@dataclass(frozen=True)
class Lacks:
    """None of ``chars`` (case-insensitive) occurs."""

    chars: str

    def check(self, text: str) -> str | None:
        found = sorted({c for c in text.lower() if c in self.chars.lower()})
        return f"contains {', '.join(repr(c) for c in found)}" if found else None


@dataclass(frozen=True)
class Mentions:
    """Every one of ``words`` occurs (case-insensitive, as a word)."""

    words: tuple[str, ...]

    def check(self, text: str) -> str | None:
        missing = [w for w in self.words if not re.search(rf"\b{re.escape(w)}\b", text, re.I)]
        return f"does not mention {', '.join(missing)}" if missing else None


Constraint = Lines | AllCaps | EndsWith | StartsWith | Matches | EachLine | WordCount | Lacks | Mentions


@dataclass(frozen=True)
class Format:
    """Every constraint holds, and the answer was not cut off at max_tokens."""

    constraints: tuple[Constraint, ...]
    kind: Kind = field(default="format", init=False)

    def score(self, answer: Answer) -> Verdict:
        runaway = _runaway(answer)
        if runaway:
            return runaway
        for c in self.constraints:
            why = c.check(answer.text)
            if why:
                return Verdict(False, why)
        return Verdict(True, f"{len(self.constraints)} format constraints hold")


# --- prose (degeneration) --------------------------------------------------------------------------


@dataclass(frozen=True)
class Prose:
    """A prose answer of ``least``..``most`` words that does not degenerate: no word ``ngram``
    (lower-cased) more than ``repeats`` times, no sentence or line said twice, no run of one
    character over 8, at least ``distinct`` of its words distinct, not cut off at max_tokens;
    it names every word of ``mentions`` (the topic was kept)."""

    least: int
    most: int
    mentions: tuple[str, ...] = ()
    ngram: int = 5
    repeats: int = 2
    distinct: float = 0.35
    kind: Kind = field(default="prose", init=False)

    def score(self, answer: Answer) -> Verdict:
        runaway = _runaway(answer)
        if runaway:
            return runaway
        text = answer.text
        words = [w.lower() for w in _words(text)]
        if not self.least <= len(words) <= self.most:
            return Verdict(False, f"{len(words)} words; expected {self.least} to {self.most}")
        grams = Counter(tuple(words[i : i + self.ngram]) for i in range(len(words) - self.ngram + 1))
        if grams:
            gram, n = grams.most_common(1)[0]
            if n > self.repeats:
                return Verdict(False, f"the {self.ngram}-word phrase {' '.join(gram)!r} repeats {n} times")
        sentences = Counter(
            " ".join(_words(s)).lower() for s in re.split(r"(?<=[.!?])\s+|\n+", text) if len(_words(s)) >= 4
        )
        if sentences:
            said, n = sentences.most_common(1)[0]
            if n > 1:
                return Verdict(False, f"the sentence {_shown(said)} is said {n} times")
        run = re.search(r"(\S)\1{8,}", text)
        if run:
            return Verdict(False, f"a run of {len(run[0])} {run[1]!r} characters")
        if words and len(set(words)) / len(words) < self.distinct:
            return Verdict(False, f"only {len(set(words))} distinct words of {len(words)}")
        missing = [w for w in self.mentions if not re.search(rf"\b{re.escape(w)}", text, re.I)]
        if missing:
            return Verdict(False, f"off topic: does not mention {', '.join(missing)}")
        return Verdict(True, f"{len(words)} words, no repetition")


Scorer = Code | JsonAnswer | Numeric | Format | Prose
