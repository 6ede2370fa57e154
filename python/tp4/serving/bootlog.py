"""What the boot logs of the line say: the check a boot must pass before serve calls it ready,
the boot phases for the progress display, and the boot signature serve stores with the run.

Pure functions over text: the logs are the containers' output as `<runtime> logs` gives it (plain
lines; a `--timestamps` prefix, carriage returns and colour codes are tolerated), the Plan says
what they must contain. No process, no file, no clock.

* `check_boot_logs`: every required boot line of the plan (`Plan.boot_lines`, from
  adapters/registry.toml) in rank 0's log, none of `Plan.forbidden_lines` in any rank's log
  (upstream K README v2.2 gate: `DIFFER`, `CHECK FAILED`, `MISMATCH`, `Traceback`), the same
  source stamps on every rank. The stamps are the image's `SOURCE_COMMIT <tree> <sha>` /
  `SOURCE_PATCH <tree> <hex16>` lines (tp4's image prints them; upstream's fetch_runtime.sh
  writes the files) and the commit the b12x_next adapter names in its armed line
  (`[moe_b12x_next] armed: routed MoE on b12x_next <commit8> ...`, what upstream's line prints).
  `review_boot_logs` gives the problems and, apart, the notes (a line the registry marks
  `required = false` that is missing: evidence, not a gate).
* `phase_of` / `ready_port`: which boot phase a line begins. boot.py (rank 0; its lines as the
  fork copy of docs/upstream.md prints them) runs its smoke as soon as `/health` answers, then its
  warm-up, then prints `Ready: API on port <PORT>`.
* `boot_signature` / `judge`: the boot-state check of the LuZ ring repository (L in docs/upstream.md,
  `scripts/boot-signature.sh`):
  the median per-batch `input throughput (token/s)` between `The server is fired up and ready to
  roll` and `Warm-up done in` (healthy 388-709, a slow boot ~55 with a byte-identical config),
  `tuning from scratch` (the autotune was redrawn), the target-verify CUDA graph capture (> 10 s is
  only a warning), and the KV pool the engine computed (`DSV4 memory calculation: ...
  full_token=<N>`, `max_total_num_tokens=<N>`) against the profile's MAX_TOTAL_TOKENS pin: a pin
  above the pool either kills the boot or is silently clamped (upstream `.env.tp4.example`).
  Upstream's remedy for a slow boot: restart with the config unchanged.
"""

from __future__ import annotations

import re
import statistics
from collections import Counter
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta, timezone
from typing import Literal, NamedTuple

from tp4.line.plan import Json, Plan

SIGNATURE_SCHEMA = "tp4.bootsig/1"
# Boot phases in the order rank 0 goes through them (see `phase_of`).
PHASES = ("weights", "graphs", "smoke", "warmup", "ready")
Phase = Literal["weights", "graphs", "smoke", "warmup", "ready"]
# LuZ `scripts/boot-signature.sh`: a target-verify graph capture above this is worth a warning
GRAPH_CAPTURE_WARN_S = 10.0
# a MAX_TOTAL_TOKENS pin less than this fraction below the KV pool is a warning
PIN_MARGIN = 0.05
# a boot below this fraction of the last good boot's warm-up throughput is slow
SLOW_FRACTION = 0.5
# forbidden-line reports per rank before the rest is summed up
MAX_FORBIDDEN_PER_RANK = 10
_SHOW = 240  # characters of a log line quoted in a message


# --- lines ---------------------------------------------------------------------------------------

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# `docker logs -t` (2024-05-01T12:00:00.123456789Z) and `podman logs -t` (...+00:00) put one before each line
_RUNTIME_TS = re.compile(r"^(?P<ts>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?) ")


def _clean(raw: str) -> tuple[str, datetime | None]:
    """A log line without colour codes, carriage returns and the runtime's timestamp, and that
    timestamp (None when the line has none)."""
    text = _ANSI.sub("", raw).replace("\r", "")
    m = _RUNTIME_TS.match(text)
    if m is None:
        return text, None
    return text[m.end() :], _parse_ts(m["ts"])


def _parse_ts(ts: str) -> datetime | None:
    m = re.match(r"^(.{19})(?:[.,](\d+))?(.*)$", ts)
    if m is None:  # pragma: no cover - the caller's pattern guarantees the shape
        return None
    frac = (m[2] or "")[:6].ljust(6, "0")
    zone = m[3]
    if zone == "Z" or not zone:
        zone = "+00:00"
    elif ":" not in zone:
        zone = zone[:3] + ":" + zone[3:]
    try:
        return datetime.fromisoformat(f"{m[1]}.{frac}{zone}")
    except ValueError:
        return None


def log_lines(log: str) -> list[str]:
    """The lines of a container log as the engine printed them (runtime prefixes removed)."""
    return [_clean(raw)[0] for raw in log.splitlines()]


def _show(line: str) -> str:
    line = line.strip()
    return line if len(line) <= _SHOW else line[:_SHOW] + " ..."


# --- phases --------------------------------------------------------------------------------------

_PHASE_OF: tuple[tuple[Phase, re.Pattern[str]], ...] = (
    # SGLang's model runner
    ("weights", re.compile(r"\bLoad weight begin\b")),
    ("graphs", re.compile(r"\bCapture cuda graph begin\b", re.I)),
    # SGLang's HTTP server after its own first request; boot.py's smoke follows once /health answers
    ("smoke", re.compile(r"The server is fired up and ready to roll")),
    # boot.py after the smoke (upstream: `Fresh inference passed: 19 + 23 = 42`; the stand-in:
    # `boot: smoke ok: 42 ...`); the warm-up follows
    ("warmup", re.compile(r"^(?:Fresh inference passed\b|boot: smoke ok\b)")),
)
_READY = re.compile(r"^Ready: API on port (\d+)\b")


def phase_of(line: str) -> Phase | None:
    """The boot phase this line of rank 0's log begins, or None: "weights" (the weight load),
    "graphs" (CUDA graph capture), "smoke" (the server is up; boot.py's smoke runs), "warmup"
    (the smoke passed; boot.py's warm-up runs), "ready" (`Ready: API on port <PORT>`). PHASES
    is their order. With SKIP_SMOKE=1 boot.py goes from "smoke" straight to "ready"."""
    text = _clean(line)[0]
    if _READY.match(text):
        return "ready"
    for phase, pattern in _PHASE_OF:
        if pattern.search(text):
            return phase
    return None


def ready_port(line: str) -> int | None:
    """The port of boot.py's `Ready: API on port <PORT> (rank 0)...` line, else None."""
    m = _READY.match(_clean(line)[0])
    return int(m[1]) if m else None


# --- the check -----------------------------------------------------------------------------------


class LogProblem(NamedTuple):
    """One finding of the boot-log check."""

    rank: int
    node: str
    check: (
        str  # "no-log", "missing-line", "missing-optional-line", "forbidden-line", "source-differs", "source-missing"
    )
    detail: str

    def text(self) -> str:
        return f"{self.node} (rank {self.rank}): {self.check}: {self.detail}"


class BootLogReview(NamedTuple):
    problems: tuple[LogProblem, ...]  # the boot is not ready while there is one
    notes: tuple[LogProblem, ...]  # evidence that is missing, not a failure (registry `required = false`)


class SourceStamp(NamedTuple):
    label: str  # what the value is, as a reader sees it in the log
    value: str
    line: str


_SOURCE = re.compile(
    r"\bSOURCE_(?P<kind>COMMIT|PATCH)\b[:=]?\s+(?:(?P<tree>[A-Za-z_][\w.-]*)[:=]?\s+)?(?P<value>[0-9a-fA-F]{7,64})\b"
)
_ARMED = re.compile(r"\[(?P<adapter>\w+)\] armed: .*? on (?P<tree>b12x_next) (?P<value>[0-9a-fA-F]{7,40})\b")


def source_stamps(lines: Iterable[str]) -> dict[str, SourceStamp]:
    """The source stamps a rank's log prints, by what they stamp (the first of each)."""
    out: dict[str, SourceStamp] = {}
    for line in lines:
        for m in _SOURCE.finditer(line):
            label = f"SOURCE_{m['kind']} {m['tree']}" if m["tree"] else f"SOURCE_{m['kind']}"
            out.setdefault(label, SourceStamp(label, m["value"].lower(), line))
        m2 = _ARMED.search(line)
        if m2:
            label = f"[{m2['adapter']}] armed commit of {m2['tree']}"
            out.setdefault(label, SourceStamp(label, m2["value"].lower(), line))
    return out


def _ranks(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(str(r) for r in ranks)


def review_boot_logs(plan: Plan, logs: Mapping[int, str]) -> BootLogReview:
    """The boot-log check of the line: `logs` maps each rank to its container's log."""
    unknown = sorted(set(logs) - {n.rank for n in plan.nodes})
    if unknown:
        raise ValueError(f"logs of ranks {unknown}: the plan has ranks 0..{len(plan.nodes) - 1}")
    problems: list[LogProblem] = []
    notes: list[LogProblem] = []
    lines: dict[int, list[str]] = {}
    for node in plan.nodes:
        if node.rank not in logs:
            problems.append(
                LogProblem(
                    node.rank,
                    node.name,
                    "no-log",
                    "no log of this rank to check; fix: read it with `tp4 logs --rank "
                    f"{node.rank}` (the container may never have started)",
                )
            )
            continue
        lines[node.rank] = log_lines(logs[node.rank])
    head = plan.nodes[0]
    if head.rank in lines:
        head_text = "\n".join(lines[head.rank])
        for bl in plan.boot_lines:
            if re.search(bl.pattern, head_text):
                continue
            if bl.required:
                problems.append(
                    LogProblem(
                        head.rank,
                        head.name,
                        "missing-line",
                        f"`{bl.text}` ({bl.adapter}) is not in the boot log, though the plan arms it; "
                        "fix: check that the image carries the adapter and that the rank's env has its gates (`tp4 plan`)",
                    )
                )
            else:
                notes.append(
                    LogProblem(
                        head.rank,
                        head.name,
                        "missing-optional-line",
                        f"`{bl.text}` ({bl.adapter}) is not in the boot log (evidence only, not a gate)",
                    )
                )
    for node in plan.nodes:
        found = 0
        for number, line in enumerate(lines.get(node.rank, ()), 1):
            hits = [f for f in plan.forbidden_lines if f in line]
            if not hits:
                continue
            found += 1
            if found <= MAX_FORBIDDEN_PER_RANK:
                problems.append(
                    LogProblem(node.rank, node.name, "forbidden-line", f"line {number} has `{hits[0]}`: {_show(line)}")
                )
        if found > MAX_FORBIDDEN_PER_RANK:
            problems.append(
                LogProblem(
                    node.rank,
                    node.name,
                    "forbidden-line",
                    f"and {found - MAX_FORBIDDEN_PER_RANK} more lines with a forbidden text",
                )
            )
    problems += _stamps_agree(plan, lines)
    return BootLogReview(tuple(problems), tuple(notes))


def _stamps_agree(plan: Plan, lines: Mapping[int, list[str]]) -> list[LogProblem]:
    """Every rank prints the same source stamps: the value most ranks print (rank 0's on a tie)
    is the line's; each rank that prints another one, or none, is named."""
    names = {n.rank: n.name for n in plan.nodes}
    stamps = {rank: source_stamps(text) for rank, text in sorted(lines.items())}
    labels: list[str] = []
    for per_rank in stamps.values():
        labels += [label for label in per_rank if label not in labels]
    out: list[LogProblem] = []
    for label in labels:
        values = {rank: s[label].value for rank, s in stamps.items() if label in s}
        counts = Counter(values.values())
        top = max(counts.values())
        common = next(v for v in values.values() if counts[v] == top)  # rank order: rank 0 wins a tie
        agree = [r for r, v in values.items() if v == common]
        for rank, per_rank in stamps.items():
            if label not in per_rank:
                out.append(
                    LogProblem(
                        rank,
                        names[rank],
                        "source-missing",
                        f"prints no `{label}`; {_ranks(agree)} print {common}; "
                        "fix: run the same image on every node (`tp4 build` distributes it)",
                    )
                )
            elif per_rank[label].value != common:
                out.append(
                    LogProblem(
                        rank,
                        names[rank],
                        "source-differs",
                        f"`{label}` is {per_rank[label].value} here, {common} on {_ranks(agree)} "
                        f"(line: {_show(per_rank[label].line)}); ranks built from different sources "
                        "compute different results; fix: run the same image on every node (`tp4 build` distributes it)",
                    )
                )
    # within a rank: the adapter's short commit is the stamp's
    for rank, per_rank in stamps.items():
        full = per_rank.get("SOURCE_COMMIT b12x_next")
        armed = next((s for k, s in per_rank.items() if k.endswith("armed commit of b12x_next")), None)
        if full and armed and not full.value.startswith(armed.value):
            out.append(
                LogProblem(
                    rank,
                    names[rank],
                    "source-differs",
                    f"the adapter runs b12x_next {armed.value}, the image's SOURCE_COMMIT is {full.value}; "
                    "fix: rebuild the image (`tp4 build`)",
                )
            )
    return out


def check_boot_logs(plan: Plan, logs: Mapping[int, str]) -> list[LogProblem]:
    """The problems of the boot-log check (empty: the logs pass); see `review_boot_logs`."""
    return list(review_boot_logs(plan, logs).problems)


# --- the boot signature --------------------------------------------------------------------------

_FIRED_UP = re.compile(r"The server is fired up and ready to roll")
_WARM_DONE = re.compile(r"^Warm-up done in\b")
_INPUT_TPS = re.compile(r"input throughput \(token/s\): ([0-9]+(?:\.[0-9]+)?)")
_CAPTURE = re.compile(r"Capture cuda graph end\. Time elapsed: ([0-9]+(?:\.[0-9]+)?) ?s", re.I)
_VERIFY_CAPTURE = re.compile(r"Capture target verify CUDA graph end\. elapsed=([0-9]+(?:\.[0-9]+)?) ?s", re.I)
_RETUNE = re.compile(r"tuning from scratch", re.I)
_FULL_TOKEN = re.compile(r"DSV4 memory calculation:.*\bfull_token=(\d+)")
_MAX_TOTAL = re.compile(r"\bmax_total_num_tokens=(\d+)")


class BootSignature(NamedTuple):
    """What one boot of the line looked like, from the head's log (stored with the run)."""

    warmup_tps_median: float | None  # median `input throughput (token/s)` of the warm-up's batches
    warmup_batches: int  # how many batches that median is over
    graph_capture_s: float | None  # `Capture cuda graph end. Time elapsed: <s>`
    verify_graph_capture_s: float | None  # `Capture target verify CUDA graph end. elapsed=<s>` (DSpark)
    retuned: bool  # `tuning from scratch` seen
    ready_seconds: float | None  # boot start to `Ready: API on port`
    ready_port: int | None
    kv_pool: int | None  # `DSV4 memory calculation: ... full_token=<N>`: the KV budget the engine computed
    max_total_num_tokens: int | None  # the pool the engine runs (min of the pin and the budget)
    pin: int | None  # the profile's MAX_TOTAL_TOKENS (None: no pin)

    def to_json(self) -> dict[str, Json]:
        out: dict[str, Json] = {"schema": SIGNATURE_SCHEMA}
        for name in self._fields:
            value = getattr(self, name)
            out[name] = value
        return out

    @classmethod
    def from_json(cls, data: object) -> BootSignature:
        """A stored signature; ValueError naming the field when it is not one."""
        if not isinstance(data, dict):
            raise ValueError("boot signature: not a JSON object")
        if data.get("schema") != SIGNATURE_SCHEMA:
            raise ValueError(f"boot signature: schema is {data.get('schema')!r}, expected {SIGNATURE_SCHEMA!r}")
        return cls(
            warmup_tps_median=_opt_float(data, "warmup_tps_median"),
            warmup_batches=_int(data, "warmup_batches"),
            graph_capture_s=_opt_float(data, "graph_capture_s"),
            verify_graph_capture_s=_opt_float(data, "verify_graph_capture_s"),
            retuned=_bool(data, "retuned"),
            ready_seconds=_opt_float(data, "ready_seconds"),
            ready_port=_opt_int(data, "ready_port"),
            kv_pool=_opt_int(data, "kv_pool"),
            max_total_num_tokens=_opt_int(data, "max_total_num_tokens"),
            pin=_opt_int(data, "pin"),
        )


def _field(data: dict[object, object], name: str) -> object:
    if name not in data:
        raise ValueError(f"boot signature: {name}: missing")
    return data[name]


def _opt_float(data: dict[object, object], name: str) -> float | None:
    value = _field(data, name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"boot signature: {name}: {value!r} is not a number")
    return float(value)


def _opt_int(data: dict[object, object], name: str) -> int | None:
    value = _field(data, name)
    if value is None:
        return None
    return _int(data, name)


def _int(data: dict[object, object], name: str) -> int:
    value = _field(data, name)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"boot signature: {name}: {value!r} is not an integer")
    return value


def _bool(data: dict[object, object], name: str) -> bool:
    value = _field(data, name)
    if not isinstance(value, bool):
        raise ValueError(f"boot signature: {name}: {value!r} is not true or false")
    return value


def pin_of(plan: Plan) -> int | None:
    """The MAX_TOTAL_TOKENS pin rank 0 runs with (None: no pin, the engine sizes the pool)."""
    value = plan.nodes[0].env.get("MAX_TOTAL_TOKENS", "")
    return int(value) if value.isdigit() and int(value) > 0 else None


def _last(pattern: re.Pattern[str], lines: Iterable[str]) -> str | None:
    found = None
    for line in lines:
        m = pattern.search(line)
        if m:
            found = m[1]
    return found


def boot_signature(
    head_log: str, *, pin: int | None, ready_seconds: float | None, started: datetime | None = None
) -> BootSignature:
    """The signature of the boot whose rank-0 log this is. Time to Ready is `ready_seconds` when
    given; else, when the log carries the runtime's timestamps (`logs --timestamps`), the Ready
    line's time minus `started` (the boot's start) or minus the log's first line; else None."""
    stamped = [_clean(raw) for raw in head_log.splitlines()]
    lines = [text for text, _ in stamped]
    fired = next((i for i, t in enumerate(lines) if _FIRED_UP.search(t)), None)
    rates: list[float] = []
    if fired is not None:
        for text in lines[fired + 1 :]:
            if _WARM_DONE.match(text) or _READY.match(text):
                break
            m = _INPUT_TPS.search(text)
            if m:
                rates.append(float(m[1]))
    ready_at = next((i for i, t in enumerate(lines) if _READY.match(t)), None)
    port = ready_port(lines[ready_at]) if ready_at is not None else None
    seconds = ready_seconds
    if seconds is None and ready_at is not None:
        when = stamped[ready_at][1]
        first = started or next((ts for _, ts in stamped if ts is not None), None)
        if when is not None and first is not None:
            if first.tzinfo is None:
                first = first.replace(tzinfo=timezone.utc)
            seconds = max((when - first) / timedelta(seconds=1), 0.0)
    capture, verify = _last(_CAPTURE, lines), _last(_VERIFY_CAPTURE, lines)
    pool, total = _last(_FULL_TOKEN, lines), _last(_MAX_TOTAL, lines)
    return BootSignature(
        warmup_tps_median=statistics.median(rates) if rates else None,
        warmup_batches=len(rates),
        graph_capture_s=float(capture) if capture else None,
        verify_graph_capture_s=float(verify) if verify else None,
        retuned=any(_RETUNE.search(t) for t in lines),
        ready_seconds=seconds,
        ready_port=port,
        kv_pool=int(pool) if pool else None,
        max_total_num_tokens=int(total) if total else None,
        pin=pin if pin else None,
    )


# --- the judgement -------------------------------------------------------------------------------

Level = Literal["slow", "warning", "note"]


class Finding(NamedTuple):
    level: Level  # "slow": the boot is slow (serve restarts it with --on-slow-boot restart)
    check: str  # "slow-boot", "not-judged", "retuned", "graph-capture", "pin-above-pool", "pin-near-pool"
    text: str


class Verdict(NamedTuple):
    slow: bool
    threshold: float | None  # the warm-up throughput a boot must reach; None: not judged
    findings: tuple[Finding, ...]

    @property
    def warnings(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.level == "warning")

    def messages(self) -> list[str]:
        return [f.text for f in self.findings]


def judge(sig: BootSignature, *, last_good: BootSignature | None, floor: float | None) -> Verdict:
    """Slow or not, and the warnings of a boot. The warm-up throughput must reach the floor when
    one is given (the profile's), else half the last good boot's; with neither the throughput is
    not judged (said so)."""
    findings: list[Finding] = []
    restart = "fix: restart the line with the config unchanged (`tp4 stop`, then `tp4 serve`; `--on-slow-boot restart` does it once)"
    threshold: float | None = None
    basis = ""
    if floor is not None:
        threshold, basis = floor, "the profile's floor"
    elif last_good is not None and last_good.warmup_tps_median is not None:
        threshold = last_good.warmup_tps_median * SLOW_FRACTION
        basis = f"half of the last good boot's {last_good.warmup_tps_median:.1f}"
    median = sig.warmup_tps_median
    slow = False
    if median is None:
        findings.append(
            Finding(
                "note",
                "not-judged",
                "warm-up throughput: no `input throughput (token/s)` between "
                "`The server is fired up and ready to roll` and `Warm-up done in` (WARMUP=0 or SKIP_SMOKE=1?); not judged",
            )
        )
        threshold = None
    elif threshold is None:
        findings.append(
            Finding(
                "note",
                "not-judged",
                f"warm-up input throughput median {median:.1f} tok/s: not judged "
                "(no last good boot and no floor to compare with)",
            )
        )
    elif median < threshold:
        slow = True
        findings.append(
            Finding(
                "slow",
                "slow-boot",
                f"slow boot: warm-up input throughput median {median:.1f} tok/s over {sig.warmup_batches} batches "
                f"is below {threshold:.1f} tok/s ({basis}); a boot with a byte-identical config can come up "
                f"many times slower and stay so; {restart}",
            )
        )
    if sig.retuned:
        findings.append(
            Finding(
                "warning",
                "retuned",
                "`tuning from scratch` in the head's log: the autotune cache was "
                f"redrawn, so this boot may run slower kernels; {restart}",
            )
        )
    if sig.verify_graph_capture_s is not None and sig.verify_graph_capture_s > GRAPH_CAPTURE_WARN_S:
        findings.append(
            Finding(
                "warning",
                "graph-capture",
                f"the target-verify CUDA graph capture took {sig.verify_graph_capture_s:.1f} s "
                f"(over {GRAPH_CAPTURE_WARN_S:.0f} s); only a warning: healthy boots have taken 30 s",
            )
        )
    findings += _pin_findings(sig)
    return Verdict(slow=slow, threshold=threshold, findings=tuple(findings))


def _pin_findings(sig: BootSignature) -> list[Finding]:
    pool, pin, total = sig.kv_pool, sig.pin, sig.max_total_num_tokens
    if pin is None:
        return []
    if pool is None or pool <= 0:
        if total is not None and total < pin:  # no memory-calculation line, but the engine clamped the pin
            return [
                Finding(
                    "warning",
                    "pin-above-pool",
                    f"the MAX_TOTAL_TOKENS pin {pin} is above the pool the engine runs (max_total_num_tokens={total}): "
                    f"it was silently clamped; fix: lower engine.max_total_tokens to at most {int(total * (1 - PIN_MARGIN))}",
                )
            ]
        return []
    runs = (
        f" (the engine runs max_total_num_tokens={sig.max_total_num_tokens})"
        if sig.max_total_num_tokens is not None
        else ""
    )
    fix = f"fix: lower engine.max_total_tokens to at most {int(pool * (1 - PIN_MARGIN))} (5 % under the pool); do not raise the memory fraction"
    if pin > pool:
        return [
            Finding(
                "warning",
                "pin-above-pool",
                f"the MAX_TOTAL_TOKENS pin {pin} is above the KV pool this boot computed (full_token={pool}){runs}: "
                f"such a pin either kills the boot or is silently clamped; {fix}",
            )
        ]
    margin = (pool - pin) / pool
    if margin <= PIN_MARGIN:
        return [
            Finding(
                "warning",
                "pin-near-pool",
                f"the MAX_TOTAL_TOKENS pin {pin} is only {margin * 100:.1f} % below the KV pool this boot computed "
                f"(full_token={pool}){runs}: a boot with a little less free memory computes a smaller pool, "
                f"and a pin above it kills the boot or is silently clamped; {fix}",
            )
        ]
    return []
