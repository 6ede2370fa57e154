"""A `tp4 bench decode` or `tp4 bench prefill` run: the levels in order, the result file
written after each, resumed from it, progress shown, the summary table at the end."""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tp4.core.apikey import Secret
from tp4.core.contracts.bench_result import (
    BenchResult,
    Job,
    JobConfig,
    JobProgress,
    ResultTp4,
    RunConfig,
    RunConfigTp4,
    Source,
)
from tp4.measuring.throughput import prompts as P
from tp4.measuring.throughput import result as R
from tp4.measuring.throughput.loadgen import Client, LoadWatcher, StreamResult, wave
from tp4.core.errors import InvalidInput, Tp4Error

Echo = Callable[[str], None]


@dataclass(frozen=True)
class Target:
    """Where the API is, and what the result records about the line (with --profile)."""

    url: str
    model: str | None
    key: Secret | None
    plan_digest: str | None = None
    plan: dict[str, Any] | None = None  # the plan itself (`tp4 plan --json`: no secret, only the key file's path)
    image: str | None = None
    pins: dict[str, str] | None = None
    profile: str | None = None
    # a fleet's router (--fleet): each line's requests so far, as the router counts them (its
    # per-worker metrics, read on its host); the lines' names in the fleet's order
    per_line: Callable[[], dict[str, int]] | None = None
    lines: tuple[str, ...] = ()

    @property
    def node(self) -> str:
        return urllib.parse.urlsplit(self.url).hostname or self.url


@dataclass(frozen=True)
class DecodeConfig:
    levels: tuple[int, ...] = (1, 2, 4, 8, 16)
    max_tokens: int = 256
    types: tuple[str, ...] = P.TYPES
    trials: int = 1
    c1_runs: int = 5
    warmup: int = 2
    same_prompts: bool = False
    shared_prefix: bool = False
    timeout: float = 360.0

    def jobs(self) -> int:
        return max(self.trials, self.c1_runs if 1 in self.levels else 0)

    def levels_of(self, trial: int) -> list[int]:
        """The levels trial ``trial`` runs: c1 in the first c1_runs trials, the others in the first ``trials``."""
        return [c for c in self.levels if trial <= (self.c1_runs if c == 1 else self.trials)]

    def json(self, base: str, model: str, out: str | None, label: str | None) -> dict[str, Any]:
        own = RunConfigTp4(
            kind="decode",
            trials=self.trials,
            levels=list(self.levels),
            sizes=[],
            maxTokens=self.max_tokens,
            promptTypes=list(self.types),
            c1Runs=self.c1_runs,
            warmup=self.warmup,
            samePrompts=self.same_prompts,
            sharedPrefix=self.shared_prefix,
            temperature=0,
        )
        return RunConfig.build(
            base=base, out=None if out is None else str(out), label=label, model=model, tp4=own
        ).document()


@dataclass(frozen=True)
class PrefillConfig:
    sizes: tuple[int, ...] = (4096, 16384, 32768, 65536, 131072, 262144)
    passes: int = 2
    max_tokens: int = 8
    corpus: str | None = None  # the directory, as given
    timeout: float | None = None  # None: sparkDash's min(2.7e6, max(90, 60 + 8 ms/token)) s

    def request_timeout(self, tokens: int) -> float:
        return self.timeout if self.timeout is not None else min(2.7e6, max(90.0, 60.0 + 0.008 * tokens))

    def json(self, base: str, model: str, corpus: str | None, out: str | None, label: str | None) -> dict[str, Any]:
        own = RunConfigTp4(
            kind="prefill",
            trials=self.passes,
            levels=[1],
            sizes=list(self.sizes),
            maxTokens=self.max_tokens,
            promptTypes=[],
            corpus=corpus,
            temperature=0,
        )
        return RunConfig.build(
            base=base, out=None if out is None else str(out), label=label, model=model, tp4=own
        ).document()


class Progress:
    """Progress on stderr: one redrawn line on a terminal, plain lines otherwise."""

    def __init__(self, tty: bool | None = None) -> None:
        import click

        self._echo = click.echo
        self.tty = sys.stderr.isatty() if tty is None else tty
        self._live = False

    def live(self, text: str) -> None:
        if self.tty:
            self._echo("\r\x1b[K" + text, err=True, nl=False)
            self._live = True

    def line(self, text: str) -> None:
        if self._live:
            self._echo("\r\x1b[K", err=True, nl=False)
            self._live = False
        self._echo(text, err=True)

    def clear(self) -> None:
        if self._live:
            self._echo("\r\x1b[K", err=True, nl=False)
            self._live = False


class Ticker:
    """The live line during a level: the body reads seen so far, every 0.2 s at most."""

    def __init__(self, progress: Progress, title: str) -> None:
        self.progress, self.title = progress, title
        self.reads = 0
        self.started = self.shown = time.monotonic()

    def tick(self) -> None:
        self.reads += 1
        if self.progress.tty:
            now = time.monotonic()
            if now - self.shown >= 0.2:
                self.shown = now
                self.progress.live(f"{self.title}: {self.reads} reads, {now - self.started:.1f} s")


@dataclass
class Outcome:
    doc: dict[str, Any]
    path: Path | None
    invalid: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("tp4")
    except Exception:  # not installed (a checkout on PYTHONPATH)
        return "unknown"


def _new_doc(
    kind: str, config: dict[str, Any], target: Target, label: str | None, method: str, extra: dict[str, Any]
) -> dict[str, Any]:
    version = _version()
    doc = BenchResult(
        status="FAIL",
        label=label or f"tp4 bench {kind}",
        started=R.now_iso(),
        finished=None,
        source=Source(repo="tp4", commit=None, release=version),
        node=None,  # sparkDash's Node.js version: tp4 runs on none; the API's host is tp4.host
        config=RunConfig.model_validate(config),
        prefill=[],
        decode=[],
        method=method,
        tp4=ResultTp4.model_validate(
            {
                "version": version,
                "host": target.node,
                "kind": kind,
                "plan_digest": target.plan_digest,
                "plan": target.plan,
                "image": target.image,
                "pins": target.pins,
                "profile": target.profile,
                "levels_done": [],
                "interrupted": True,
                **extra,
            }
        ),
    )
    return doc.model_dump(mode="json", by_alias=True, exclude_unset=True)


def _open(
    out: str | None, kind: str, config: dict[str, Any], force: bool, progress: Progress
) -> tuple[Path | None, dict[str, Any] | None]:
    """(the result path, the unfinished run there to resume) for --out; refuses a finished run
    (unless force) and a run of another configuration (unless force: started over)."""
    if out is None:
        return None, None
    path = R.prepare_out(out)
    old = R.read(path)
    if old is None or force:
        return path, None
    # only tp4's own configuration decides: --out and --label may be spelled another way on resume
    if old["tp4"].get("kind") != kind or old["config"].get("tp4") != config["tp4"]:
        diff = R.differences(old["config"].get("tp4") or old["config"], config["tp4"])
        raise InvalidInput(
            f"--out: {path} holds a run of another configuration ({'; '.join(diff)[:600]}); "
            "fix: rerun with that run's options to resume it, choose another --out, or pass --force to start over"
        )
    if not old["tp4"].get("interrupted", False):
        raise InvalidInput(
            f"--out: {path} holds a finished run; fix: choose another --out, or pass --force to run again over it"
        )
    progress.line(f"resuming {path}: {len(old['tp4'].get('levels_done') or [])} levels done")
    return path, old


def _save(path: Path | None, doc: dict[str, Any]) -> None:
    if path is not None:
        R.write(path, doc)


def _all_down(streams: list[StreamResult]) -> bool:
    return bool(streams) and all(s.error is not None and s.error.startswith("no connection") for s in streams)


def _fmt(value: float | None, spec: str = ".1f") -> str:
    return "-" if value is None else format(value, spec)


async def _connect(
    target: Target, timeout: float, connections: int, progress: Progress
) -> tuple[Client, LoadWatcher, str]:
    client = Client(target.url, target.model or "default", target.key, timeout=timeout, connections=connections)
    try:
        served = await client.check()
        client.model = target.model or served
        watcher = LoadWatcher(client)
        if await watcher.probe() is None:
            progress.line(
                f"warning: {target.url} answers neither /v1/loads nor /get_load: foreign traffic is not watched "
                "(point --url at the engine, not a router, to have it watched)"
            )
    except BaseException:
        await client.close()
        raise
    return client, watcher, client.model


# --- decode -------------------------------------------------------------------------------------------


def decode_prompts(cfg: DecodeConfig, kind: str, concurrency: int) -> list[str]:
    return [
        P.salted(P.decode_prompt(kind, i, concurrency, cfg.same_prompts), None if cfg.shared_prefix else P.salt())
        for i in range(concurrency)
    ]


def _job(doc: dict[str, Any], kind: str, trial: int, cfg: DecodeConfig, url: str, model: str) -> dict[str, Any]:
    for entry in doc["decode"]:
        if entry["trial"] == trial and entry["job"]["config"]["promptType"] == kind:
            job: dict[str, Any] = entry["job"]
            return job
    port = urllib.parse.urlsplit(url).port
    levels = cfg.levels_of(trial)
    job = Job(
        benchId=f"tp4-{kind}-{trial}-{int(time.time())}",
        sparkId="comparison",
        status="running",
        startedAt=R.now_ms(),
        completedAt=None,
        durationMs=None,
        error=None,
        owner=None,
        config=JobConfig(
            port=port, modelId=model, concurrencies=levels, maxTokens=cfg.max_tokens, promptType=kind, debug=False
        ),
        progress=JobProgress(currentConcurrency=None, completedLevels=0, totalLevels=len(levels), message=""),
        results=[],
    ).model_dump(mode="json", by_alias=True, exclude_unset=True)
    doc["decode"].append({"trial": trial, "job": job})
    return job


async def _decode(
    cfg: DecodeConfig, target: Target, out: str | None, force: bool, label: str | None, progress: Progress
) -> Outcome:
    client, watcher, model = await _connect(target, cfg.timeout, max(cfg.levels), progress)
    try:
        config = cfg.json(target.url, model, out, label)
        path, doc = _open(out, "decode", config, force, progress)
        if doc is None:
            prompts_text = (
                "--same-prompts: every stream of every level sends its type's one prompt."
                if cfg.same_prompts
                else "Stream i of N > 1 gets the suffix ' (stream i/N)' (sparkDash's prompt sets)."
            )
            salt_text = (
                "--shared-prefix: no salt (streams share a prefix)."
                if cfg.shared_prefix
                else "Every prompt opens with a unique salt line, so no two share a prefix."
            )
            method = R.METHOD_DECODE.format(
                warmup=cfg.warmup,
                max_tokens=cfg.max_tokens,
                c1_runs=cfg.c1_runs,
                trials=cfg.trials,
                prompts=prompts_text,
                salt=salt_text,
            )
            doc = _new_doc(
                "decode",
                config,
                target,
                label,
                method,
                {
                    "samePrompts": cfg.same_prompts,
                    "salted": not cfg.shared_prefix,
                    "corpus": None,
                    "c1Runs": cfg.c1_runs,
                    "warmup": cfg.warmup,
                    "timeout": cfg.timeout,
                    "fellBack": False,
                },
            )
        _save(path, doc)
        done = set(doc["tp4"]["levels_done"])
        total = sum(len(cfg.levels_of(t)) for t in range(1, cfg.jobs() + 1)) * len(cfg.types)
        for kind in cfg.types:
            todo = [(t, c) for t in range(1, cfg.jobs() + 1) for c in cfg.levels_of(t) if f"{kind}/{t}/{c}" not in done]
            if not todo:
                continue
            for w in range(cfg.warmup):
                progress.live(f"{kind}: warm-up {w + 1}/{cfg.warmup}")
                warm = await client.stream(0, P.salted(P.PROMPTS[kind], P.salt()), cfg.max_tokens)
                if warm.error is not None:
                    if _all_down([warm]):
                        raise Tp4Error(
                            f"{target.url}: the warm-up found the API down ({warm.error}); fix: check the line (`tp4 status`), then rerun to resume"
                        )
                    progress.line(f"warning: {kind}: warm-up {w + 1} failed: {warm.error}")
            for trial, c in todo:
                job = _job(doc, kind, trial, cfg, target.url, model)
                job["progress"]["currentConcurrency"] = c
                title = f"[{len(done) + 1}/{total}] {kind} trial {trial} c{c}"
                progress.live(title)
                ticker = Ticker(progress, title)
                before = await _line_counts(target)
                streams, watch, start, end = await wave(
                    client, watcher, decode_prompts(cfg, kind, c), cfg.max_tokens, on_event=ticker.tick
                )
                if _all_down(streams):
                    raise Tp4Error(
                        f"{target.url}: the API went down during {kind} c{c} ({streams[0].error}); the finished levels are kept"
                        f"{' in ' + str(path) if path else ''}; fix: check the line (`tp4 status`), then rerun the same command to resume"
                    )
                level = R.level_json(
                    c,
                    streams,
                    watch,
                    target.url,
                    model,
                    start,
                    end,
                    same_prompts=cfg.same_prompts,
                    salted=not cfg.shared_prefix,
                )
                if before is not None:
                    await _per_line(target, level, before, c)
                job["results"].append(level)
                job["progress"].update(completedLevels=len(job["results"]), message=f"c{c} done")
                if len(job["results"]) == job["progress"]["totalLevels"]:
                    completed = R.now_ms()
                    started = job["startedAt"]
                    job.update(
                        status="completed",
                        completedAt=completed,
                        durationMs=completed - started if isinstance(started, int) else None,
                    )
                    # how sparkDash leaves a finished job: no level running, message "Done"
                    job["progress"].update(currentConcurrency=None, message="Done")
                key = f"{kind}/{trial}/{c}"
                done.add(key)
                doc["tp4"]["levels_done"].append(key)
                doc["tp4"]["fellBack"] = doc["tp4"]["fellBack"] or client.fell_back
                _save(path, doc)
                note = f"  INVALID: {level['tp4']['invalid']}" if level["tp4"]["invalid"] else ""
                note += f"  FAILED: {level['error']}" if level["streamsFailed"] else ""
                progress.line(
                    f"[{len(done)}/{total}] {kind} trial {trial} c{c}: aggregate {_fmt(level['aggregateDecodeTps'])} tok/s, "
                    f"per stream {_fmt(level['medianDecodeTps'])} tok/s, TTFT {_fmt(level['medianTtftMs'], '.0f')} ms{note}"
                )
        if client.fell_back:
            progress.line(
                "note: the engine refused min_tokens/ignore_eos/stop (HTTP 400); requests were sent without them, as sparkDash does"
            )
        return _finish(
            doc,
            path,
            [
                (f"{e['job']['config']['promptType']} trial {e['trial']} c{lv['concurrency']}", lv)
                for e in doc["decode"]
                for lv in e["job"]["results"]
            ],
        )
    finally:
        await client.close()


async def _line_counts(target: Target) -> dict[str, int] | None:
    if target.per_line is None:
        return None
    return await asyncio.to_thread(target.per_line)


async def _per_line(target: Target, level: dict[str, Any], before: dict[str, int], sent: int) -> None:
    """The level's share of each line behind the router: the requests the router counted for it
    during the level, and its decode tokens and tok/s, which are the level's in that proportion
    (every stream of a level asks for the same tokens). More requests than the level sent is
    foreign traffic through the router: the level is invalid."""
    deadline = time.monotonic() + 3.0
    while True:  # the router counts a request when it has ended: give its counters a moment
        after = await _line_counts(target)
        assert after is not None
        got = {name: after.get(name, 0) - before.get(name, 0) for name in target.lines}
        if sum(got.values()) >= sent or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.1)
    total = sum(got.values())
    decode_tokens = level["totalDecodeTokens"]
    aggregate = level["aggregateDecodeTps"]
    lines = {}
    for name in target.lines:
        n = got[name]
        share = n / total if total else 0.0
        lines[name] = {
            "requests": n,
            "decodeTokens": round(decode_tokens * share),
            "decodeTps": None if aggregate is None else round(aggregate * share, 3),
        }
    level["tp4"]["lines"] = lines
    level["tp4"]["linesFrom"] = "the router's per-worker request counts"
    if total > sent and level["tp4"]["invalid"] is None:
        level["tp4"]["invalid"] = (
            f"foreign traffic: the router counted {total} requests to the lines while this level sent {sent}"
        )


def _finish(doc: dict[str, Any], path: Path | None, levels: list[tuple[str, dict[str, Any]]]) -> Outcome:
    outcome = Outcome(doc, path)
    for name, level in levels:
        if level["tp4"]["invalid"]:
            outcome.invalid.append(f"{name}: {level['tp4']['invalid']}")
        error = level.get("error") if "streamsFailed" in level else level["request"].get("error")
        if error:
            outcome.failed.append(f"{name}: {error}")
    doc["status"] = "PASS" if not outcome.invalid and not outcome.failed else "FAIL"
    doc["finished"] = R.now_iso()
    doc["tp4"]["interrupted"] = False
    _save(path, doc)
    return outcome


def decode_summary(doc: dict[str, Any]) -> list[str]:
    """The summary table: per prompt type and level, medians over the trials."""
    rows: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for entry in doc["decode"]:
        for level in entry["job"]["results"]:
            rows.setdefault((entry["job"]["config"]["promptType"], level["concurrency"]), []).append(level)
    out = [
        f"{'prompt type':<12} {'conc':>4} {'runs':>4} {'aggregate tok/s':>16} {'per stream tok/s':>17} {'TTFT ms':>9}  note"
    ]

    def med(levels: list[dict[str, Any]], key: str) -> float | None:
        values = [lv[key] for lv in levels if lv[key] is not None]
        return statistics.median(values) if values else None

    for (kind, c), levels in rows.items():
        note = "invalid (foreign traffic)" if any(lv["tp4"]["invalid"] for lv in levels) else ""
        note = note or ("failed streams" if any(lv["streamsFailed"] for lv in levels) else "")
        out.append(
            f"{kind:<12} {c:>4} {len(levels):>4} {_fmt(med(levels, 'aggregateDecodeTps')):>16} {_fmt(med(levels, 'medianDecodeTps')):>17} "
            f"{_fmt(med(levels, 'medianTtftMs'), '.0f'):>9}  {note}"
        )
    return out + lines_summary(rows)


def lines_summary(rows: dict[tuple[str, int], list[dict[str, Any]]]) -> list[str]:
    """Behind a fleet's router (--fleet): each line's requests and tok/s per level (medians over
    the runs), from the router's per-worker counts; nothing when no level has them."""
    names: list[str] = []
    for levels in rows.values():
        for lv in levels:
            for name in lv["tp4"].get("lines") or {}:
                if name not in names:
                    names.append(name)
    if not names:
        return []
    table = [["prompt type", "conc", *[h for name in names for h in (f"{name} requests", f"{name} tok/s")]]]
    for (kind, c), levels in rows.items():
        row = [kind, str(c)]
        for name in names:
            got = [lv["tp4"]["lines"][name] for lv in levels if name in (lv["tp4"].get("lines") or {})]
            reqs = [g["requests"] for g in got]
            tps = [g["decodeTps"] for g in got if g["decodeTps"] is not None]
            row += [
                _fmt(statistics.median(reqs) if reqs else None, ".0f"),
                _fmt(statistics.median(tps) if tps else None),
            ]
        table.append(row)
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
    text = [
        " ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(r, widths, strict=True)))
        for r in table
    ]
    return ["", "per line (the router's per-worker request counts; tok/s: the level's aggregate in proportion)", *text]


def run_decode(
    cfg: DecodeConfig, target: Target, *, out: str | None, force: bool, label: str | None, progress: Progress
) -> Outcome:
    try:
        return asyncio.run(_decode(cfg, target, out, force, label, progress))
    finally:
        progress.clear()


# --- prefill ------------------------------------------------------------------------------------------

CALIBRATION_CHARS = (1500, 6000)


def _prefill_prompt(body: str, salt: str) -> str:
    return P.salted(P.PREFILL_HEAD + body + P.PREFILL_TAIL, salt, tag="tp4-prefill")


def _body(corpus: P.Corpus | None, chars: int, salt: str, start: int) -> str:
    return corpus.text(chars, start) if corpus is not None else P.filler(chars, salt)


async def _calibrate(client: Client, corpus: P.Corpus | None, max_tokens: int, progress: Progress) -> dict[str, Any]:
    """Chars per token of the body text, and the fixed tokens around it (template, salt, the
    instruction), from two prompts' usage.prompt_tokens; the first is the warm-up too."""
    tokens: list[int] = []
    for i, chars in enumerate(CALIBRATION_CHARS):
        progress.live(f"calibrating the prompt size ({i + 1}/{len(CALIBRATION_CHARS)})")
        s = P.salt()
        r = await client.stream(0, _prefill_prompt(_body(corpus, chars, s, i), s), max_tokens, timeout=120.0)
        if r.error is not None or r.prompt_tokens is None:
            why = r.error or "the answer had no usage.prompt_tokens (stream_options.include_usage)"
            raise Tp4Error(
                f"{client.url}: calibrating the prompt size failed: {why}; fix: check the endpoint answers streamed completions with usage"
            )
        tokens.append(r.prompt_tokens)
    (a, b), (ta, tb) = CALIBRATION_CHARS, tokens
    if tb <= ta:
        raise Tp4Error(
            f"{client.url}: calibrating the prompt size failed: {b} characters gave {tb} prompt tokens, {a} gave {ta}; "
            "fix: check that usage.prompt_tokens counts the prompt"
        )
    per_token = (b - a) / (tb - ta)
    return {
        "charsPerToken": round(per_token, 4),
        "overheadTokens": round(ta - a / per_token, 2),
        "samples": [[a, ta], [b, tb]],
    }


async def _prefill(
    cfg: PrefillConfig,
    target: Target,
    out: str | None,
    force: bool,
    label: str | None,
    progress: Progress,
    corpus: P.Corpus | None,
) -> Outcome:
    if corpus is None and cfg.corpus is not None:
        corpus = P.load_corpus(cfg.corpus)
    if corpus is not None and corpus.skipped:
        progress.line(
            f"note: --corpus {cfg.corpus}: {corpus.skipped} entries skipped (not regular text files, unreadable or beyond the size limits)"
        )
    client, watcher, model = await _connect(target, 120.0, 1, progress)
    try:
        config = cfg.json(target.url, model, corpus.name if corpus else None, out, label)
        path, doc = _open(out, "prefill", config, force, progress)
        if doc is None:
            body = (
                f"real text: the documents of the corpus {corpus.name!r} joined in path order"
                if corpus
                else "a filler of common words drawn at random per request (no one token repeated)"
            )
            doc = _new_doc(
                "prefill",
                config,
                target,
                label,
                R.METHOD_PREFILL.format(max_tokens=cfg.max_tokens, body=body),
                {
                    "samePrompts": False,
                    "salted": True,
                    "corpus": corpus.name if corpus else None,
                    "corpusChars": corpus.chars if corpus else None,
                    "calibration": None,
                },
            )
        if doc["tp4"].get("calibration") is None:
            doc["tp4"]["calibration"] = await _calibrate(client, corpus, cfg.max_tokens, progress)
        _save(path, doc)
        cal = doc["tp4"]["calibration"]
        done = set(doc["tp4"]["levels_done"])
        total = cfg.passes * len(cfg.sizes)
        for trial in range(1, cfg.passes + 1):
            for n, size in enumerate(cfg.sizes):
                key = f"prefill/{trial}/{size}"
                if key in done:
                    continue
                s = P.salt()
                chars = max(0, round((size - cal["overheadTokens"]) * cal["charsPerToken"]))
                if corpus is not None and chars > corpus.chars and trial == 1:
                    progress.line(
                        f"note: {size} tokens need {chars} characters; the corpus has {corpus.chars}: its text repeats"
                    )
                prompt = _prefill_prompt(_body(corpus, chars, s, trial * 7 + n), s)
                progress.live(
                    f"[{len(done) + 1}/{total}] prefill pass {trial} {size} tokens ({len(prompt)} characters)"
                )
                streams, watch, _, _ = await wave(
                    client, watcher, [prompt], cfg.max_tokens, timeout=cfg.request_timeout(size)
                )
                r = streams[0]
                if _all_down(streams):
                    raise Tp4Error(
                        f"{target.url}: the API went down during prefill {size} ({r.error}); the finished rows are kept"
                        f"{' in ' + str(path) if path else ''}; fix: check the line (`tp4 status`), then rerun the same command to resume"
                    )
                row = R.prefill_row(
                    trial,
                    size,
                    s,
                    prompt,
                    P.sha256(prompt),
                    r,
                    watch,
                    target.url,
                    model,
                    corpus.name if corpus else None,
                )
                doc["prefill"].append(row)
                done.add(key)
                doc["tp4"]["levels_done"].append(key)
                _save(path, doc)
                req = row["request"]
                note = f"  INVALID: {row['tp4']['invalid']}" if row["tp4"]["invalid"] else ""
                note += f"  FAILED: {req['error']}" if req["error"] else ""
                progress.line(
                    f"[{len(done)}/{total}] prefill pass {trial} {size}: {req['prefillTokens']} prompt tokens, "
                    f"TTFT {_fmt(req['ttftMs'], '.0f')} ms, {_fmt(req['prefillTps'], '.0f')} tok/s{note}"
                )
        return _finish(
            doc, path, [(f"prefill pass {row['trial']} {row['targetTokens']}", row) for row in doc["prefill"]]
        )
    finally:
        await client.close()


def prefill_summary(doc: dict[str, Any]) -> list[str]:
    by: dict[int, list[dict[str, Any]]] = {}
    for row in doc["prefill"]:
        by.setdefault(row["targetTokens"], []).append(row)
    out = [f"{'target':>8} {'prompt tokens':>14} {'prefill tok/s (each pass)':<28} {'median':>8}  note"]
    for size, rows in by.items():
        values = [r["request"]["prefillTps"] for r in rows if r["request"]["prefillTps"] is not None]
        tokens = "/".join(str(r["request"]["prefillTokens"]) for r in rows)
        note = "invalid (foreign traffic)" if any(r["tp4"]["invalid"] for r in rows) else ""
        note = note or ("failed" if any(r["request"]["error"] for r in rows) else "")
        out.append(
            f"{size:>8} {tokens:>14} {' / '.join(_fmt(v, '.0f') for v in values):<28} "
            f"{_fmt(statistics.median(values) if values else None, '.0f'):>8}  {note}"
        )
    return out


def run_prefill(
    cfg: PrefillConfig,
    target: Target,
    *,
    out: str | None,
    force: bool,
    label: str | None,
    progress: Progress,
    corpus: P.Corpus | None = None,
) -> Outcome:
    try:
        return asyncio.run(_prefill(cfg, target, out, force, label, progress, corpus))
    finally:
        progress.clear()
