"""`tp4 report`: read bench results (ours and sparkDash's own result.json), compare them with a
reference (the published v2.1 tables by default) and render the comparison as tables or JSON.

A result file is sparkDash's result.json (`decode[{trial, job}]`, `prefill[rows]`), with tp4's
additions under `tp4` keys, read through its contract model (tp4.core.contracts.bench_result;
docs/contracts.md): a file that does not fit is refused naming the field. Per (prompt type, concurrency) the report takes the
median over trials of `aggregateDecodeTps`, `medianDecodeTps` (per stream) and `medianTtftMs`;
per `targetTokens` the median of `request.prefillTps`. A level or row marked `tp4.invalid` (or
failed) is shown and never judged.

Numbers are read as exact fractions of their decimal text, so "exactly at the threshold" means
exactly: a value 5 % below its reference is not a regression at `--fail-on-regression 5`, one a
hair lower is. Charts are drawn by tp4.measuring.charts, which alone imports matplotlib.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from fractions import Fraction
from importlib import resources
from pathlib import Path
from typing import Literal, NoReturn, TypeVar

from pydantic import BaseModel, ValidationError

from tp4.core.contracts.base import Bad as _Bad
from tp4.core.contracts.base import describe as _describe
from tp4.core.contracts.base import problems as contract_problems
from tp4.core.contracts.bench_result import BenchResult, Job, Source
from tp4.core.errors import InvalidInput, clip
from tp4.core.userfiles import read_input

# A sparkDash result.json holds every stream's previews and headers: a few MiB for a full sweep.
MAX_RESULT_BYTES = 64 * 1024 * 1024
REFERENCE_KIND = "tp4-report-reference"
DEFAULT_REFERENCE = "v2.1"
# the order the seed's tables list the prompt types in; others follow alphabetically
PROMPT_ORDER = ("prose", "code", "structured", "json")
REPEATED_TOKEN = "repeated-token"
RESULT_FIX = "pass the result.json that `tp4 bench` or sparkDash wrote (or the directory holding it)"

Metric = Literal["aggregate", "perStream", "ttft"]
Status = Literal["ok", "invalid", "failed"]
Kind = Literal["tp4", "sparkdash", "reference"]
M = TypeVar("M", bound=BaseModel)


@dataclass(frozen=True)
class TableSpec:
    key: str
    short: str
    title: str
    unit: str
    higher_is_better: bool


TABLES: tuple[TableSpec, ...] = (
    TableSpec("decodeAggregate", "decode aggregate", "decode: aggregate tok/s", "tok/s", True),
    TableSpec("decodePerStream", "decode per-stream", "decode: per-stream tok/s (the median stream)", "tok/s", True),
    TableSpec("ttft", "TTFT", "TTFT: the median stream's ms (lower is better)", "ms", False),
    TableSpec("prefill", "prefill", "prefill: tok/s by prompt length", "tok/s", True),
)
METRIC_OF_TABLE: dict[str, Metric] = {"decodeAggregate": "aggregate", "decodePerStream": "perStream", "ttft": "ttft"}


# --------------------------------------------------------------------------------------------
# JSON with exact numbers; what JSON cannot hold as a finite 64-bit number is kept as a Bad and
# refused by the contract model (tp4.core.contracts.bench_result) with the field's name


def _parse_float(text: str) -> Fraction | _Bad:
    value = float(text)
    if not math.isfinite(value):
        return _Bad(f"{text[:40]} is beyond the range of a 64-bit number")
    mantissa, _, exponent = text.lower().partition("e")
    if len(mantissa) > 40 or len(exponent) > 4:
        return Fraction(value)  # more digits than a double holds: its nearest double
    return Fraction(text)


def _parse_int(text: str) -> int | _Bad:
    if len(text) > 21:
        return _Bad(f"{text[:40]}... does not fit in 64 bits")
    value = int(text)
    if not -(2**63) <= value < 2**63:
        return _Bad(f"{text} does not fit in 64 bits")
    return value


def _parse_constant(text: str) -> _Bad:
    return _Bad(f"{text} is not a number JSON can hold")


def _loads(text: str, file: str) -> object:
    try:
        value: object = json.loads(text, parse_float=_parse_float, parse_int=_parse_int, parse_constant=_parse_constant)
    except json.JSONDecodeError as exc:
        raise InvalidInput(
            f"{file}: line {exc.lineno} column {exc.colno}: not valid JSON ({exc.msg}); fix: {RESULT_FIX}"
        ) from None
    except (ValueError, RecursionError) as exc:
        raise InvalidInput(f"{file}: not a readable JSON document ({type(exc).__name__}); fix: {RESULT_FIX}") from None
    return value


@dataclass(frozen=True)
class _Src:
    """One file being read: every refusal names it, the field and a fix. A result file's fields
    are checked by its contract model (_validated); a reference data file's by these."""

    file: str

    def fail(self, where: str, reason: str, fix: str = RESULT_FIX) -> NoReturn:
        raise InvalidInput(f"{self.file}: {where}: {reason}; fix: {fix}")

    def obj(self, value: object, where: str) -> Mapping[str, object]:
        if not isinstance(value, dict):
            self.fail(where, f"is {_describe(value)}, not an object")
        return value

    def opt_obj(self, parent: Mapping[str, object], key: str, where: str) -> Mapping[str, object]:
        value = parent.get(key)
        return {} if value is None else self.obj(value, f"{where}.{key}" if where else key)

    def arr(self, parent: Mapping[str, object], key: str, where: str) -> list[object]:
        value = parent.get(key)
        if value is None:
            return []
        if not isinstance(value, list):
            self.fail(f"{where}.{key}" if where else key, f"is {_describe(value)}, not an array")
        return value

    def num_value(self, value: object, at: str, fix: str = RESULT_FIX) -> Fraction | None:
        if value is None:
            return None
        if isinstance(value, _Bad):
            self.fail(at, value.reason, fix)
        if isinstance(value, bool) or not isinstance(value, int | Fraction):
            self.fail(at, f"is {_describe(value)}, not a number", fix)
        if value < 0:
            self.fail(at, f"{float(value):g} is negative", fix)
        return Fraction(value)

    def whole(self, parent: Mapping[str, object], key: str, where: str, *, required: bool) -> int | None:
        """A positive whole number (a concurrency, a trial, a token count)."""
        return self.whole_value(parent.get(key), f"{where}.{key}" if where else key, required=required)

    def whole_value(self, value: object, at: str, *, required: bool) -> int | None:
        if value is None:
            if required:
                self.fail(at, "is missing")
            return None
        number = self.num_value(value, at)
        if number is None or number.denominator != 1 or number < 1:
            self.fail(at, f"is {_describe(value)}, not a positive whole number")
        return int(number)

    def text(self, parent: Mapping[str, object], key: str, where: str) -> str | None:
        return self.text_value(parent.get(key), f"{where}.{key}" if where else key)

    def text_value(self, value: object, at: str) -> str | None:
        if value is None:
            return None
        if not isinstance(value, str):
            self.fail(at, f"is {_describe(value)}, not a string")
        return value


# --------------------------------------------------------------------------------------------
# what a report compares


@dataclass(frozen=True)
class Cell:
    """One value of a run (the median over its trials) or of a reference."""

    value: Fraction | None
    status: Status = "ok"
    reason: str | None = None
    samples: tuple[Fraction, ...] = ()  # the values the median was taken over (prefill: the passes)
    excluded: tuple[str, ...] = ()  # why trials were left out of a valid cell's median


@dataclass(frozen=True)
class Measurements:
    """A run (a result file) or a reference, as the report compares them."""

    name: str
    path: str
    kind: Kind
    decode: Mapping[Metric, Mapping[tuple[str, int], Cell]]
    prefill: Mapping[int, Cell]
    prefill_filler: str | None  # REPEATED_TOKEN, "corpus:NAME", "tp4-bench", or None when not known
    prefill_labels: Mapping[int, str] = field(default_factory=dict)
    status: str | None = None
    notes: tuple[str, ...] = ()
    source: Mapping[str, object] | None = None  # a shipped reference's source (where its numbers come from)
    # behind a fleet's router: (prompt type, concurrency) -> line -> (median requests, median tok/s)
    lines: Mapping[tuple[str, int], Mapping[str, tuple[Fraction | None, Fraction | None]]] = field(default_factory=dict)


def median(values: Sequence[Fraction]) -> Fraction:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def filler_text(filler: str | None) -> str:
    if filler == REPEATED_TOKEN:
        return "one repeated token (sparkDash 1.8.8)"
    if filler is None:
        return "not known"
    if filler.startswith("corpus:"):
        return f"real text (corpus {filler.removeprefix('corpus:')})"
    if filler == "tp4-bench":
        return "varied words (tp4 bench's default filler)"
    return filler


# --------------------------------------------------------------------------------------------
# reading result files


@dataclass
class _Level:
    prompt_type: str
    concurrency: int
    aggregate: Fraction | None
    per_stream: Fraction | None
    ttft: Fraction | None
    status: Status
    reason: str | None
    # behind a fleet's router (tp4 bench --fleet): line -> (requests, decode tok/s)
    lines: Mapping[str, tuple[int | None, Fraction | None]] = field(default_factory=dict)


def _result_path(arg: str) -> Path:
    if not arg:
        raise InvalidInput(f"RESULT: the path is empty; fix: {RESULT_FIX}")
    path = Path(arg)
    if "\0" in arg:
        raise InvalidInput(f"RESULT {arg!r}: a path cannot hold a NUL byte; fix: {RESULT_FIX}")
    try:
        if path.is_dir():
            inner = path / "result.json"
            if not inner.exists():
                raise InvalidInput(f"{path}: the directory holds no result.json; fix: {RESULT_FIX}")
            return inner
    except OSError as exc:
        raise InvalidInput(f"{path}: cannot read it: {exc.strerror}; fix: {RESULT_FIX}") from None
    return path


def _read_document(arg: str, what: str) -> tuple[str, object]:
    path = _result_path(arg)
    text = read_input(path, what, missing_fix=RESULT_FIX, limit=MAX_RESULT_BYTES)
    return str(path), _loads(text, str(path))


def _sparkdash_filler(source: Source | None) -> str | None:
    """sparkDash up to 1.8.8 fills prefill prompts with one repeated token; later versions draw
    words (MiaAI-Lab/sparkDash d201ba28), whose release tp4 report does not know."""
    release = None if source is None else source.release
    if release is None:
        return None
    m = re.fullmatch(r"v?(\d+)\.(\d+)\.(\d+)", release.strip())
    if m is None:
        return None
    return REPEATED_TOKEN if tuple(int(g) for g in m.groups()) <= (1, 8, 8) else None


def _levels(job: Job, notes: list[str]) -> list[_Level]:
    prompt_type = None if job.config is None or job.config.promptType is None else printable(job.config.promptType, 40)
    if not prompt_type:
        prompt_type = "prose"
        note = "a decode job without config.promptType is taken as prose (sparkDash run.mjs's decode job)"
        if note not in notes:
            notes.append(note)
    levels = []
    for level in job.results or []:
        extra = level.tp4
        invalid = None if extra is None or extra.invalid is None else printable(extra.invalid) or "invalid"
        error = _error(level.error)
        status: Status = "ok"
        reason = None
        if invalid is not None:
            status, reason = "invalid", invalid
        elif error is not None or level.streamsOk == 0:
            status, reason = "failed", error or "no stream finished"
        per_line = {
            printable(name, 40): (share.requests, share.decodeTps)
            for name, share in ((extra.lines or {}) if extra is not None else {}).items()
        }
        levels.append(
            _Level(
                prompt_type,
                level.concurrency,
                level.aggregateDecodeTps,
                level.medianDecodeTps,
                level.medianTtftMs,
                status,
                reason,
                per_line,
            )
        )
    return levels


def _status_cause(top: Mapping[str, object], jobs: Sequence[Job], levels: Sequence[_Level]) -> str:
    """Why a run is not PASS, in the file's own words: its `error`, a job's `error` or a job left
    `running` (an interrupted sparkDash run), else the failed levels' reasons."""
    causes: list[str] = []
    if (error := _error(top.get("error"))) is not None:
        causes.append(printable(error, 300))
    for job in jobs:
        extra = job.model_extra or {}
        if (error := _error(extra.get("error"))) is not None:
            causes.append(printable(error, 300))
        if job.status == "running":
            progress = job.progress
            message = printable(progress.message, 120) if progress is not None and progress.message else None
            at = progress.currentConcurrency if progress is not None else None
            causes.append(
                "a decode job was left running: the run was interrupted"
                + (f" at c{at}" if at is not None else "")
                + (f" ({message})" if message else "")
            )
    causes += [f"c{lv.concurrency} {lv.prompt_type}: {lv.reason}" for lv in levels if lv.status != "ok" and lv.reason]
    causes = list(dict.fromkeys(causes))
    return "; ".join(causes) if causes else "the file records no cause"


def _error(value: object) -> str | None:
    """sparkDash's `error`: null, a message, or (from some versions) an object; any of them
    but null marks the level failed."""
    if value is None or value == "" or value is False:
        return None
    if isinstance(value, str):
        return printable(value)
    try:
        return printable(json.dumps(value, default=str)[:200])
    except (TypeError, ValueError, RecursionError):
        return "an error"


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def printable(text: str, limit: int = 300) -> str:
    """Text from a result file as the report prints it: no control characters (a label with an
    escape sequence cannot drive the terminal), bounded."""
    clean = _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)
    return clean if len(clean) <= limit else clean[:limit] + "…"


def _cell(samples: Sequence[tuple[Fraction | None, Status, str | None]]) -> Cell:
    """The median over the valid trials; when none is valid, over all of them, marked."""
    valid = [s for s in samples if s[1] == "ok"]
    used = valid or list(samples)
    values = tuple(v for v, _, _ in used if v is not None)
    value = median(values) if values else None
    if valid:
        left_out = tuple(f"{st}: {r or 'no reason given'}" for _, st, r in samples if st != "ok")
        return Cell(value, "ok", None, values, left_out)
    status: Status = "invalid" if any(s[1] == "invalid" for s in samples) else "failed"
    reasons = list(dict.fromkeys(r for _, st, r in samples if st == status and r))
    return Cell(value, status, "; ".join(reasons) or None, values)


def read_result(arg: str) -> Measurements:
    """A result file (or the directory holding result.json), or an InvalidInput naming the field."""
    file, doc = _read_document(arg, "result file")
    return _measurements(_Src(file), doc, arg)


def _validated(src: _Src, model: type[M], doc: Mapping[str, object]) -> M:
    """``doc`` through its contract model; the first problem (the field's path, what is wrong)
    refused with the file's name and a fix."""
    try:
        return model.model_validate(doc)
    except ValidationError as exc:
        found = contract_problems(exc)
        where, reason = found[0]
        more = f" ({len(found) - 1} more problem(s) after this one)" if len(found) > 1 else ""
        src.fail(where, reason + more)


def _measurements(src: _Src, doc: object, arg: str) -> Measurements:
    top = src.obj(doc, "the document")
    if top.get("kind") == REFERENCE_KIND:
        src.fail(
            "kind",
            f"is {REFERENCE_KIND!r}: a reference data file, not a result",
            "pass it with --reference FILE, and a result.json as RESULT",
        )
    notes: list[str] = []
    jobs: list[Job] = []
    bare_status: str | None = None
    if "decode" not in top and "prefill" not in top:
        if isinstance(top.get("results"), list) and "benchId" in top:  # a bare sparkDash decode job
            bare = _validated(src, Job, top)
            jobs.append(bare)
            top, bare_status = {}, bare.status
        else:
            src.fail("decode", "missing, and so is prefill: this is not a result.json of tp4 bench or sparkDash")
    result = _validated(src, BenchResult, top)
    jobs += [entry.job for entry in result.decode or []]
    levels = [level for job in jobs for level in _levels(job, notes)]

    extra = result.tp4
    kind: Kind = "tp4" if "tp4" in top else "sparkdash"
    filler: str | None
    corpus = extra.corpus if extra is not None else None
    if kind == "tp4":
        stated = extra.filler if extra is not None else None
        filler = f"corpus:{printable(corpus, 80)}" if corpus else printable(stated, 80) if stated else "tp4-bench"
    else:
        filler = _sparkdash_filler(result.source)
    prefill_samples: dict[int, list[tuple[Fraction | None, Status, str | None]]] = {}
    for row in result.prefill or []:
        request = row.request
        tps = request.prefillTps if request is not None else None
        if tps is None:  # sparkDash's own prefill bench history keeps the rate on the row
            tps = row.prefillTps
        row_corpus = row.tp4.corpus if row.tp4 is not None else None
        if row_corpus and kind == "tp4" and not corpus:
            filler = f"corpus:{printable(row_corpus, 80)}"
        invalid = row.tp4.invalid if row.tp4 is not None else None
        invalid = None if invalid is None else printable(invalid) or "invalid"
        error = _error(request.error if request is not None else None) or _error(row.error)
        sample: tuple[Fraction | None, Status, str | None] = (tps, "ok", None)
        if invalid is not None:
            sample = (tps, "invalid", invalid)
        elif error is not None or tps is None:
            sample = (tps, "failed", error or "no prefill rate")
        prefill_samples.setdefault(row.targetTokens, []).append(sample)

    decode: dict[Metric, dict[tuple[str, int], Cell]] = {"aggregate": {}, "perStream": {}, "ttft": {}}
    grouped: dict[tuple[str, int], list[_Level]] = {}
    for level in levels:
        grouped.setdefault((level.prompt_type, level.concurrency), []).append(level)
    for key, group in grouped.items():
        decode["aggregate"][key] = _cell([(lv.aggregate, lv.status, lv.reason) for lv in group])
        decode["perStream"][key] = _cell([(lv.per_stream, lv.status, lv.reason) for lv in group])
        decode["ttft"][key] = _cell([(lv.ttft, lv.status, lv.reason) for lv in group])
    lines: dict[tuple[str, int], dict[str, tuple[Fraction | None, Fraction | None]]] = {}
    for key, group in grouped.items():
        names = [n for lv in group for n in lv.lines]
        for name in dict.fromkeys(names):
            got = [lv.lines[name] for lv in group if name in lv.lines and lv.status == "ok"]
            counted = [Fraction(r) for r, _ in got if r is not None]
            rates = [t for _, t in got if t is not None]
            lines.setdefault(key, {})[name] = (median(counted) if counted else None, median(rates) if rates else None)
    status = result.status if bare_status is None else bare_status
    status = None if status is None else printable(status, 20)
    if status is not None and status != "PASS":
        notes.append(f"the run's status is {status}: {_status_cause(top, jobs, levels)}")
    if extra is not None and extra.interrupted is True:
        notes.append("the run was interrupted: only the levels it finished are shown")
    label = result.label
    return Measurements(
        name=printable(label or arg, 80),
        path=src.file,
        kind=kind,
        decode=decode,
        prefill={t: _cell(s) for t, s in prefill_samples.items()},
        prefill_filler=filler,
        status=status,
        notes=tuple(notes),
        lines=lines,
    )


# --------------------------------------------------------------------------------------------
# references: a shipped data file (tp4/data/reference-NAME.json), a reference file, or a result


REFERENCE_KEYS = {"kind", "name", "title", "source", "notes", "decode", "prefill"}


def shipped_references() -> list[str]:
    names = []
    for entry in resources.files("tp4.data").iterdir():
        m = re.fullmatch(r"reference-(.+)\.json", entry.name)
        if m:
            names.append(m.group(1))
    return sorted(names)


def read_reference(arg: str) -> Measurements:
    """--reference NAME|FILE: a shipped reference by name, else a reference data file or a result."""
    if arg in shipped_references() and os.sep not in arg:
        text = resources.files("tp4.data").joinpath(f"reference-{arg}.json").read_text(encoding="utf-8")
        return _reference_data(_Src(f"reference {arg}"), _loads(text, f"reference {arg}"), f"reference-{arg}.json")
    if "\0" in arg:
        raise InvalidInput(
            f"--reference {arg!r}: a path cannot hold a NUL byte; fix: name a shipped reference or a file"
        )
    if not arg:
        raise InvalidInput(
            f"--reference: the value is empty; fix: name a shipped reference ({', '.join(shipped_references())}) or a file"
        )
    path = Path(arg)
    if not path.exists() and os.sep not in arg and not arg.endswith(".json"):
        raise InvalidInput(
            f"--reference {arg}: neither a shipped reference ({', '.join(shipped_references())}) "
            "nor a file; fix: name one of those, a reference data file or a result.json"
        )
    file, doc = _read_document(arg, "reference file")
    src = _Src(file)
    top = src.obj(doc, "the document")
    if top.get("kind") == REFERENCE_KIND:
        return _reference_data(src, top, file)
    return _measurements(src, top, arg)


def _reference_data(src: _Src, doc: object, path: str) -> Measurements:
    fix = "write the reference as tp4/data/reference-v2.1.json does (docs/report.md)"
    top = src.obj(doc, "the document")
    for key in top:
        if key not in REFERENCE_KEYS:
            src.fail(key, "is not a field of a reference", fix)
    name = printable(src.text(top, "name", "") or Path(path).stem, 80)
    source = {
        k: printable(v, 1000) if isinstance(v, str) else [printable(x, 1000) for x in v if isinstance(x, str)]
        for k, v in src.opt_obj(top, "source", "").items()
        if isinstance(v, str | list)
    }
    notes = tuple(
        printable(src.text_value(n, f"notes[{i}]") or "", 1000) for i, n in enumerate(src.arr(top, "notes", ""))
    )
    decode: dict[Metric, dict[tuple[str, int], Cell]] = {"aggregate": {}, "perStream": {}, "ttft": {}}
    dec = src.opt_obj(top, "decode", "")
    for key in dec:
        if key not in ("concurrency", "aggregate", "perStream", "ttftMs"):
            src.fail(f"decode.{key}", "is not a field of a reference's decode table", fix)
    levels: list[int] = []
    for i, raw_level in enumerate(src.arr(dec, "concurrency", "decode")):
        level = src.whole_value(raw_level, f"decode.concurrency[{i}]", required=True)
        assert level is not None
        levels.append(level)
    columns: tuple[tuple[Metric, str], ...] = (
        ("aggregate", "aggregate"),
        ("perStream", "perStream"),
        ("ttft", "ttftMs"),
    )
    for metric, key in columns:
        table = src.opt_obj(dec, key, "decode")
        for prompt_type, raw in table.items():
            at = f"decode.{key}.{prompt_type}"
            if not isinstance(raw, list) or len(raw) != len(levels):
                src.fail(
                    at, f"is {_describe(raw)}, not an array of {len(levels)} values (one per decode.concurrency)", fix
                )
            for i, level in enumerate(levels):
                value = src.num_value(raw[i], f"{at}[{i}]", fix)
                if value is not None:
                    decode[metric][(prompt_type, level)] = Cell(value, samples=(value,))
    # one stream: sparkDash's aggregate is that stream's decode tok/s, the same formula
    for (prompt_type, level), cell in decode["aggregate"].items():
        if level == 1 and (prompt_type, 1) not in decode["perStream"]:
            decode["perStream"][(prompt_type, 1)] = cell
    pre = src.opt_obj(top, "prefill", "")
    for key in pre:
        if key not in ("filler", "rows"):
            src.fail(f"prefill.{key}", "is not a field of a reference's prefill table", fix)
    prefill: dict[int, Cell] = {}
    labels: dict[int, str] = {}
    for i, raw in enumerate(src.arr(pre, "rows", "prefill")):
        at = f"prefill.rows[{i}]"
        row = src.obj(raw, at)
        tokens = src.whole(row, "targetTokens", at, required=True)
        assert tokens is not None
        passes = [src.num_value(v, f"{at}.passes[{j}]", fix) for j, v in enumerate(src.arr(row, "passes", at))]
        values = tuple(v for v in passes if v is not None)
        if not values:
            src.fail(f"{at}.passes", "holds no value", fix)
        prefill[tokens] = Cell(median(values), samples=values)
        labels[tokens] = printable(src.text(row, "label", at) or str(tokens), 20)
    return Measurements(
        name=name,
        path=path,
        kind="reference",
        decode=decode,
        prefill=prefill,
        prefill_filler=src.text(pre, "filler", "prefill"),
        prefill_labels=labels,
        notes=notes,
        source=source,
    )


# --------------------------------------------------------------------------------------------
# the comparison


@dataclass(frozen=True)
class Compared:
    """One run's value in one row: its difference from the reference and the judgement."""

    cell: Cell | None
    diff_pct: Fraction | None = None
    judged: bool = False
    flagged: bool = False
    regressed: bool = False
    why_not_judged: str | None = None


@dataclass(frozen=True)
class Row:
    table: str
    prompt_type: str | None
    concurrency: int | None
    target_tokens: int | None
    label: str
    reference: Cell | None
    runs: tuple[Compared, ...]


@dataclass(frozen=True)
class Regression:
    table: str
    run: str
    label: str
    value: Fraction | None
    reference: Fraction
    diff_pct: Fraction | None  # None: the level failed


@dataclass(frozen=True)
class Report:
    reference: Measurements
    runs: tuple[Measurements, ...]
    tolerance: Fraction
    fail_on: Fraction | None
    rows: tuple[Row, ...]
    regressions: tuple[Regression, ...]
    notes: tuple[str, ...]


def _prompt_key(prompt_type: str) -> tuple[int, str]:
    return (PROMPT_ORDER.index(prompt_type) if prompt_type in PROMPT_ORDER else len(PROMPT_ORDER), prompt_type)


def _compare(
    spec: TableSpec,
    run: Cell | None,
    ref: Cell | None,
    tolerance: Fraction,
    fail_on: Fraction | None,
    not_comparable: str | None,
) -> Compared:
    if run is None:
        return Compared(None)
    if ref is None or ref.value is None:
        return Compared(run, why_not_judged="no reference" if run.status == "ok" else run.status)
    if ref.status != "ok":
        return Compared(run, why_not_judged=f"reference {ref.status}")
    if run.status == "failed":  # what the reference measured, this run could not: worse than any number
        return Compared(run, regressed=fail_on is not None, why_not_judged="failed")
    if run.status != "ok":
        return Compared(run, why_not_judged=run.status)
    if run.value is None:
        return Compared(run, why_not_judged="no value")
    if ref.value == 0:
        return Compared(run, why_not_judged="reference is 0")
    diff = (run.value - ref.value) / ref.value * 100
    if not_comparable is not None:
        return Compared(run, diff, why_not_judged=not_comparable)
    worse = -diff if spec.higher_is_better else diff
    return Compared(
        run, diff, judged=True, flagged=abs(diff) > tolerance, regressed=fail_on is not None and worse > fail_on
    )


def length_label(tokens: int, labels: Mapping[int, str]) -> str:
    return f"{tokens} ({labels[tokens]})" if tokens in labels and labels[tokens] != str(tokens) else str(tokens)


def compare(
    runs: Sequence[Measurements], reference: Measurements, tolerance: Fraction, fail_on: Fraction | None
) -> Report:
    rows: list[Row] = []
    regressions: list[Regression] = []
    notes: list[str] = []
    names = [run.name for run in runs]
    runs = [
        replace(run, name=f"{run.name} #{i}") if names.count(run.name) > 1 else run for i, run in enumerate(runs, 1)
    ]

    def add(spec: TableSpec, row: Row) -> None:
        rows.append(row)
        for run, got in zip(runs, row.runs, strict=True):
            if got.regressed and got.cell is not None and row.reference is not None and row.reference.value is not None:
                regressions.append(
                    Regression(spec.short, run.name, row.label, got.cell.value, row.reference.value, got.diff_pct)
                )

    for spec in TABLES:
        if spec.key == "prefill":
            keys = sorted({t for run in runs for t in run.prefill})
            if not keys:
                continue
            for run in runs:
                if run.prefill and run.prefill_filler != reference.prefill_filler:
                    if run.prefill_filler is None or reference.prefill_filler is None:
                        notes.append(
                            f"{run.name}: prefill not judged: the filler of the run ({filler_text(run.prefill_filler)}) "
                            f"or of the reference ({filler_text(reference.prefill_filler)}) is not known"
                        )
                    else:
                        notes.append(
                            f"{run.name}: prefill not judged: its filler ({filler_text(run.prefill_filler)}) differs from "
                            f"the reference's ({filler_text(reference.prefill_filler)}), so the numbers are not comparable"
                        )
            for tokens in keys:
                ref = reference.prefill.get(tokens)
                compared = tuple(
                    _compare(
                        spec,
                        run.prefill.get(tokens),
                        ref,
                        tolerance,
                        fail_on,
                        None
                        if run.prefill_filler == reference.prefill_filler and run.prefill_filler is not None
                        else "not comparable (filler)",
                    )
                    for run in runs
                )
                add(
                    spec,
                    Row(spec.key, None, None, tokens, length_label(tokens, reference.prefill_labels), ref, compared),
                )
            continue
        metric = METRIC_OF_TABLE[spec.key]
        decode_keys = sorted(
            {k for run in runs for k, c in run.decode[metric].items() if c.value is not None or c.status != "ok"},
            key=lambda k: (_prompt_key(k[0]), k[1]),
        )
        for prompt_type, level in decode_keys:
            ref = reference.decode[metric].get((prompt_type, level))
            compared = tuple(
                _compare(spec, run.decode[metric].get((prompt_type, level)), ref, tolerance, fail_on, None)
                for run in runs
            )
            add(spec, Row(spec.key, prompt_type, level, None, f"{prompt_type} c{level}", ref, compared))
    return Report(reference, tuple(runs), tolerance, fail_on, tuple(rows), tuple(regressions), tuple(notes))


# --------------------------------------------------------------------------------------------
# rendering: aligned plain text, or JSON


def _num(value: Fraction | None) -> str:
    return "-" if value is None else f"{float(value):.1f}"


def _pct(value: Fraction) -> str:
    return f"{float(value):+.1f} %"


def reference_source(reference: Measurements) -> str:
    if reference.kind != "reference":
        return f"{reference.name} ({printable(reference.path)})"
    src = reference.source or {}
    parts = [str(src[k]) for k in ("document",) if isinstance(src.get(k), str)]
    if isinstance(src.get("repository"), str):
        parts.append(f"in {src['repository']}")
    if isinstance(src.get("measured"), str) or isinstance(src.get("tool"), str):
        parts.append(
            "measured " + " with ".join(str(src[k]) for k in ("measured", "tool") if isinstance(src.get(k), str))
        )
    raw = src.get("raw")
    if isinstance(raw, list) and raw:
        parts.append("raw output " + ", ".join(str(r) for r in raw))
    return f"{reference.name}: " + "; ".join(parts) if parts else reference.name


def _cell_text(got: Compared) -> tuple[str, str, str]:
    """(value, difference, mark): `!` beyond the tolerance, REGRESSED, n/c, invalid or failed."""
    if got.cell is None:
        return "-", "", ""
    value = _num(got.cell.value)
    diff = "" if got.diff_pct is None else _pct(got.diff_pct)
    if got.cell.status != "ok":
        return value, diff, f"{got.cell.status} REGRESSED" if got.regressed else got.cell.status
    if got.diff_pct is not None and not got.judged:
        return value, diff, "n/c"
    return value, diff, "REGRESSED" if got.regressed else "!" if got.flagged else ""


def _align(lines: list[list[str]], right: set[int]) -> list[str]:
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    out = []
    for line in lines:
        cells = [c.rjust(widths[i]) if i in right else c.ljust(widths[i]) for i, c in enumerate(line)]
        out.append("  ".join(cells).rstrip())
    return out


def render_text(report: Report) -> str:
    out: list[str] = []
    ref = report.reference
    out.append(f"reference {reference_source(ref)}")
    for i, run in enumerate(report.runs, 1):
        out.append(f"run {i}: {run.name} ({printable(run.path)}, {'tp4 bench' if run.kind == 'tp4' else 'sparkDash'})")
    out.append(
        f"flagged (!): beyond ±{float(report.tolerance):g} % of the reference"
        + (
            f"; REGRESSED: worse than the reference by more than {float(report.fail_on):g} %"
            if report.fail_on is not None
            else ""
        )
        + "; n/c: not comparable, not judged; invalid levels are shown, not judged"
        + ("; a failed level the reference measured is a regression" if report.fail_on is not None else "")
    )
    for spec in TABLES:
        rows = [r for r in report.rows if r.table == spec.key]
        if not rows:
            continue
        out.append("")
        out.append(f"{spec.title}; the median over trials, against {ref.name}")
        head = ["length (tokens)"] if spec.key == "prefill" else ["prompt", "c"]
        head.append("ref")
        group = [""] * len(head)
        right = set(range(1 if spec.key == "prefill" else 2, len(head)))
        for i in range(1, len(report.runs) + 1):
            right.update((len(head), len(head) + 1))
            head += [spec.unit, "diff", ""]
            group += [f"run {i}" if len(report.runs) > 1 else "", "", ""]
        lines = [group, head] if len(report.runs) > 1 else [head]
        for row in rows:
            line = [row.label] if spec.key == "prefill" else [row.prompt_type or "", f"c{row.concurrency}"]
            line.append(_num(row.reference.value) if row.reference else "-")
            for got in row.runs:
                line += list(_cell_text(got))
            lines.append(line)
        out += _align(lines, right)
        if spec.key == "prefill":
            out.append("")
            if ref.kind == "reference" and any(r.reference for r in rows):
                shown_lengths = {r.target_tokens for r in rows}
                passes = ", ".join(
                    f"{length_label(t, ref.prefill_labels)}: " + " / ".join(_num(v) for v in c.samples)
                    for t, c in sorted(ref.prefill.items())
                    if t in shown_lengths
                )
                out.append(f"reference passes (ref is their median): {passes}")
            out.append(
                f"prefill filler: reference {filler_text(ref.prefill_filler)}; "
                + "; ".join(f"{run.name} {filler_text(run.prefill_filler)}" for run in report.runs if run.prefill)
            )
            if REPEATED_TOKEN in {ref.prefill_filler} | {r.prefill_filler for r in report.runs}:
                out.append(
                    "caveat: sparkDash 1.8.8's prefill filler is one repeated token, so every filler token hits the same "
                    "Engram row and the row cache inflates its numbers (MiaAI-Lab/DeepSeek-v4.1-Flash-DGX-Sparks#21); "
                    "prefill from a varied filler or real text is not comparable with them"
                )
    out += _lines_text(report)
    short = {spec.key: spec.short for spec in TABLES}
    invalid = [
        (run.name, row.label, short[row.table], got.cell)
        for row in report.rows
        for run, got in zip(report.runs, row.runs, strict=True)
        if got.cell is not None and got.cell.status != "ok" and row.table != "decodePerStream" and row.table != "ttft"
    ]
    excluded = [
        (run.name, row.label, short[row.table], got.cell)
        for row in report.rows
        for run, got in zip(report.runs, row.runs, strict=True)
        if got.cell is not None and got.cell.excluded and row.table in ("decodeAggregate", "prefill")
    ]
    if invalid or excluded:
        out.append("")
        for name, label, table, cell in invalid:
            out.append(f"{cell.status}: {name} {table} {label}: {cell.reason or 'no reason given'}")
        for name, label, table, cell in excluded:
            out.append(
                f"left out: {name} {table} {label}: {len(cell.excluded)} trial(s) ({'; '.join(cell.excluded)}); "
                f"the median of the {len(cell.samples)} valid one(s) is shown"
            )
    notes = list(report.notes) + [f"{run.name}: {n}" for run in report.runs for n in run.notes]
    shown = {
        spec.title.split(":")[0].split(" ")[0].lower()
        for spec in TABLES
        if any(r.table == spec.key for r in report.rows)
    }
    if ref.kind == "reference":  # its caveats for the tables shown; prefill's is said above
        notes += [f"reference: {n}" for n in ref.notes if n.split(":")[0].lower() in shown - {"prefill"}]
    if notes:
        out.append("")
        out += [f"note: {n}" for n in notes]
    out.append("")
    flagged = sum(1 for row in report.rows for got in row.runs if got.flagged)
    judged = sum(1 for row in report.rows for got in row.runs if got.judged)
    out.append(f"judged {judged} values; {flagged} beyond ±{float(report.tolerance):g} %")
    if report.fail_on is not None:
        if report.regressions:
            out.append(
                f"regressions (worse than the reference by more than {float(report.fail_on):g} %): {len(report.regressions)}"
            )
            for reg in report.regressions:
                how = "failed" if reg.diff_pct is None else _pct(reg.diff_pct)
                out.append(
                    f"  {reg.run}: {reg.table} {reg.label}: {_num(reg.value)} against {_num(reg.reference)} ({how})"
                )
        else:
            out.append(f"no regression beyond {float(report.fail_on):g} %")
    return "\n".join(out) + "\n"


def _lines_text(report: Report) -> list[str]:
    """Behind a fleet's router: each line's tok/s and requests per level, beside the aggregate
    (tp4 bench --fleet: the router's per-worker request counts; invalid levels left out)."""
    out: list[str] = []
    for i, run in enumerate(report.runs, 1):
        if not run.lines:
            continue
        names = list(dict.fromkeys(n for per in run.lines.values() for n in per))
        aggregate = run.decode["aggregate"]
        table = [["prompt", "c", "aggregate", *[h for n in names for h in (f"{n} tok/s", f"{n} req")]]]
        for key in sorted(run.lines, key=lambda k: (_prompt_key(k[0]), k[1])):
            cell = aggregate.get(key)
            row = [key[0], f"c{key[1]}", _num(cell.value) if cell is not None and cell.status == "ok" else "-"]
            for n in names:
                reqs, tps = run.lines[key].get(n, (None, None))
                row += [_num(tps) if tps is not None else "-", f"{float(reqs):g}" if reqs is not None else "-"]
            table.append(row)
        out += [
            "",
            f"decode behind the router, per line and aggregate (run {i}: {run.name}; each line's share from the router's per-worker request counts)",
        ]
        out += _align(table, set(range(1, len(table[0]))))
    return out


def _f(value: Fraction | None) -> float | None:
    return None if value is None else float(value)


def _cell_json(cell: Cell | None) -> dict[str, object] | None:
    if cell is None:
        return None
    return {
        "value": _f(cell.value),
        "status": cell.status,
        "reason": cell.reason,
        "samples": [float(v) for v in cell.samples],
        "leftOut": list(cell.excluded),
    }


def _run_json(run: Measurements) -> dict[str, object]:
    doc: dict[str, object] = {
        "name": run.name,
        "path": run.path,
        "kind": run.kind,
        "status": run.status,
        "prefillFiller": run.prefill_filler,
        "notes": list(run.notes),
    }
    if run.lines:
        doc["lines"] = [
            {
                "promptType": k[0],
                "concurrency": k[1],
                "lines": {n: {"requests": _f(r), "decodeTps": _f(t)} for n, (r, t) in per.items()},
            }
            for k, per in run.lines.items()
        ]
    return doc


def render_json(report: Report, charts: Iterable[Path]) -> str:
    ref = report.reference
    tables: dict[str, list[dict[str, object]]] = {}
    for row in report.rows:
        item: dict[str, object] = {"label": row.label}
        if row.target_tokens is not None:
            item["targetTokens"] = row.target_tokens
        else:
            item["promptType"], item["concurrency"] = row.prompt_type, row.concurrency
        item["reference"] = _cell_json(row.reference)
        item["runs"] = [
            {
                **(_cell_json(got.cell) or {"value": None, "status": None}),
                "diffPct": _f(got.diff_pct),
                "judged": got.judged,
                "flagged": got.flagged,
                "regressed": got.regressed,
                "notJudged": got.why_not_judged,
            }
            for got in row.runs
        ]
        tables.setdefault(row.table, []).append(item)
    doc = {
        "reference": {
            **_run_json(ref),
            "source": dict(ref.source) if ref.source else None,
            "text": reference_source(ref),
            "notes": list(ref.notes),
        },
        "runs": [_run_json(run) for run in report.runs],
        "tolerancePct": float(report.tolerance),
        "failOnRegressionPct": _f(report.fail_on),
        "tables": tables,
        "regressions": [
            {
                "table": r.table,
                "run": r.run,
                "label": r.label,
                "value": _f(r.value),
                "reference": float(r.reference),
                "diffPct": _f(r.diff_pct),
                "failed": r.diff_pct is None,
            }
            for r in report.regressions
        ],
        "notes": list(report.notes),
        "charts": [str(c) for c in charts],
    }
    return json.dumps(doc, indent=2) + "\n"


def parse_percent(text: str, option: str) -> Fraction:
    """A percentage as typed (`5`, `2.5`), exact; NaN, inf, negatives and fractions refused."""
    if not re.fullmatch(r"[0-9]{1,6}(\.[0-9]{1,6})?", text):  # ASCII digits, as written: no '٣', no blanks
        raise InvalidInput(
            f"{option}: {clip(text)} is not a percentage; fix: pass a number of percent such as 5 or 2.5"
        )
    return Fraction(text)
