"""The result file of `tp4 bench`: a sparkDash ``result.json`` (its field names, so sparkDash's
readers read ours and `tp4 report` reads both), tp4's additions under keys named ``tp4`` only.
Its contract is tp4.core.contracts.bench_result (docs/contracts.md); a result resumed is read through
it, and the tests validate what this module writes against it.

The formulas are sparkDash's (LlmStreaming.js / DecodeBench.js), over the streams of one level:

* per stream: ``ttftMs`` = first visible delta − request start; ``completionTokens`` from usage
  (else the visible text / 4); ``decodeTokens`` = completionTokens − 1; ``decodeMs`` = last
  visible delta − first; ``decodeTps`` = decodeTokens / decodeMs; ``prefillTps`` = prompt
  tokens / TTFT;
* per level: ``aggregateDecodeTps`` = Σ decodeTokens / (max t_last − min t_first);
  ``aggregatePrefillTps`` = Σ prefillTokens / (max t_first − min t0); mean / median / min / max
  over the streams that are OK (no error, at least one decode token); ``streamsFailed`` the others.

The file is written whole after every finished level, atomically (a temporary file beside it,
renamed over it), so a run killed at any moment leaves the last finished level on disk.
"""

from __future__ import annotations

import json
from fractions import Fraction
import os
import stat
import statistics
import tempfile
import time
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from tp4.measuring.throughput.loadgen import CHAT, PREVIEW, StreamResult, Watch
from tp4.core.contracts.base import Closed, Open, problems
from tp4.core.contracts import bench_result as C
from tp4.core.contracts.bench_result import BenchResult
from tp4.core.errors import InvalidInput

Doc = dict[str, Any]
RESULT = "result.json"

METHOD_DECODE = (
    "tp4 bench decode (sparkDash's decode method): per prompt type, {warmup} discarded warm-up request(s), then each "
    "concurrency level sends N streamed chat completions at once (temperature 0, thinking off, max_tokens = min_tokens = "
    "{max_tokens}, ignore_eos, stop [], stream_options.include_usage). TTFT is the first visible (content or reasoning) "
    "delta minus the request start; completion tokens come from usage (else text/4); per-stream decode tok/s = "
    "(completion tokens - 1) / (last visible delta - first); a level's aggregate = sum of decode tokens / (latest last "
    "delta - earliest first delta). c1 runs {c1_runs} time(s) (report its median), other levels {trials}. {prompts} "
    "{salt} The engine's load endpoint is read every 0.25 s; a level during which the engine held more requests than "
    "the level sent is marked invalid (tp4.invalid)."
)
METHOD_PREFILL = (
    "tp4 bench prefill: per pass and prompt size, one streamed chat completion (max_tokens {max_tokens}, temperature 0, "
    "thinking off, include_usage) of a prompt sized to the target token count (chars per token calibrated once from "
    "usage.prompt_tokens), opening with a unique salt line so nothing comes from the prefix cache; the body is {body}. "
    "prefillTps = usage.prompt_tokens / TTFT (first visible delta - request start). A request during which the engine "
    "held another request is marked invalid (tp4.invalid)."
)


def now_iso() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def now_ms() -> int:
    """Epoch milliseconds: sparkDash's job times (startedAt, completedAt)."""
    return time.time_ns() // 1_000_000


def _r(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def _ms(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else (b - a) * 1000.0


def stream_json(r: StreamResult, url: str, model: str, level_start: float) -> Doc:
    """One stream's sparkDash fields (and its times from the level's start under ``tp4``)."""
    return _dump(stream_model(r, url, model, level_start))


def _dump(model: Open | Closed) -> Doc:
    return model.model_dump(mode="json", by_alias=True, exclude_unset=True)


def stream_model(r: StreamResult, url: str, model: str, level_start: float) -> C.Stream:
    """One stream, typed by the result model."""
    ttft = _ms(r.t0, r.t_first)
    completion = r.completion_tokens
    decode_tokens = max(completion - 1, 0)
    decode_ms = _ms(r.t_first, r.t_last)
    decode_tps = decode_tokens / (decode_ms / 1000.0) if decode_ms and decode_ms > 0 else None
    prompt_tokens = r.prompt_tokens
    prefill_tps = prompt_tokens / (ttft / 1000.0) if prompt_tokens is not None and ttft and ttft > 0 else None
    text = r.text
    usage = (
        None
        if r.usage is None
        else C.Usage(
            promptTokens=_count(r.usage.get("prompt_tokens")),
            completionTokens=_count(r.usage.get("completion_tokens")),
            totalTokens=_count(r.usage.get("total_tokens")),
        )
    )
    stream = C.Stream(
        index=r.index,
        ttftContentMs=_q(_ms(r.t0, r.t_first_content)),
        reasoningChunks=r.reasoning_chunks,
        ttftMs=_q(ttft),
        decodeTps=_q(decode_tps),
        decodeTokens=decode_tokens,
        completionTokens=completion,
        prefillTps=_q(prefill_tps),
        prefillTokens=prompt_tokens,
        totalMs=_q(_ms(r.t0, r.t_end)),
        error=r.error,
        prompt=r.prompt,
        http=C.Http(
            url=url.rstrip("/") + CHAT,
            status=r.status,
            headers=r.headers,
            completionId=r.completion_id,
            finishReason=r.finish_reason,
            sseEventCount=r.events,
            firstSseDataPreview=r.first_data,
            request=C.HttpRequest(
                model=model, maxTokens=r.max_tokens, temperature=Fraction(0), stream=True, promptChars=len(r.prompt)
            ),
        ),
        usage=usage,
        contentPreview=C.ContentPreview(first=text[:PREVIEW], last=text[-PREVIEW:], chars=len(text)),
        decodeMs=_q(decode_ms),
        tp4=C.StreamTp4(
            t0Ms=_q(_ms(level_start, r.t0)),
            tFirstMs=_q(_ms(level_start, r.t_first)),
            tLastMs=_q(_ms(level_start, r.t_last)),
            usageSeen=r.usage is not None,
            exact=r.extended,
        ),
    )
    return stream


def _q(value: float | None, digits: int = 3) -> Fraction | None:
    """A rounded measurement as the model holds it (exactly the float written)."""
    rounded = _r(value, digits)
    return None if rounded is None else Fraction(rounded)


def _count(value: object) -> int | None:
    """A usage count as the engine sent it, or null when it is not a whole number >= 0."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _ok(s: Doc) -> bool:
    return s["error"] is None and s["decodeTokens"] > 0


def _stats(values: Sequence[float]) -> tuple[float | None, float | None, float | None, float | None]:
    if not values:
        return None, None, None, None
    return statistics.fmean(values), statistics.median(values), min(values), max(values)


def level_json(
    concurrency: int,
    streams: list[StreamResult],
    watch: Watch,
    url: str,
    model: str,
    start: float,
    end: float,
    *,
    same_prompts: bool,
    salted: bool,
) -> Doc:
    """One concurrency level: sparkDash's result row, ``tp4`` {invalid, maxRunning, ...}."""
    models = [stream_model(r, url, model, start) for r in streams]
    rows = [_dump(m) for m in models]
    ok = [(s, r) for s, r in zip(rows, streams, strict=True) if _ok(s)]
    decode = [s["decodeTps"] for s, _ in ok if s["decodeTps"] is not None]
    ttft = [s["ttftMs"] for s, _ in ok if s["ttftMs"] is not None]
    prefill = [s["prefillTps"] for s, _ in ok if s["prefillTps"] is not None]
    total_decode = sum(s["decodeTokens"] for s, _ in ok)
    total_prefill = sum(s["prefillTokens"] or 0 for s, _ in ok)
    firsts = [r.t_first for _, r in ok if r.t_first is not None]
    lasts = [r.t_last for _, r in ok if r.t_last is not None]
    starts = [r.t0 for _, r in ok]
    span = max(lasts) - min(firsts) if firsts and lasts else 0.0
    aggregate = total_decode / span if span > 0 else None
    prefill_span = max(firsts) - min(starts) if firsts and starts else 0.0
    aggregate_prefill = total_prefill / prefill_span if prefill_span > 0 and total_prefill else None
    mean, median, low, high = _stats(decode)
    failed = len(rows) - len(ok)
    errors = sorted({s["error"] for s in rows if s["error"]})
    error = (
        None
        if not failed
        else (
            f"{failed} of {len(rows)} streams failed"
            + (f": {'; '.join(errors)[:500]}" if errors else ": no decode tokens")
        )
    )
    level = C.Level(
        concurrency=concurrency,
        streamsOk=len(ok),
        streamsFailed=failed,
        meanDecodeTps=_q(mean),
        medianDecodeTps=_q(median),
        minDecodeTps=_q(low),
        maxDecodeTps=_q(high),
        meanTtftMs=_q(statistics.fmean(ttft) if ttft else None),
        medianTtftMs=_q(statistics.median(ttft) if ttft else None),
        aggregateDecodeTps=_q(aggregate),
        meanPrefillTps=_q(statistics.fmean(prefill) if prefill else None),
        medianPrefillTps=_q(statistics.median(prefill) if prefill else None),
        aggregatePrefillTps=_q(aggregate_prefill),
        totalPrefillTokens=total_prefill,
        totalDecodeTokens=total_decode,
        totalCompletionTokens=sum(s["completionTokens"] for s, _ in ok),
        durationMs=_q((end - start) * 1000.0),
        error=error,
        streams=models,
        model=model,
        hardwareSamples=[],
        tp4=C.LevelTp4(
            invalid=watch.invalid(concurrency),
            maxRunning=watch.max_running,
            maxInEngine=watch.max_in_engine,
            loadSamples=watch.samples,
            samePrompts=same_prompts,
            salted=salted,
        ),
    )
    return _dump(level)


def prefill_request(r: StreamResult, url: str, model: str) -> C.PrefillRequest:
    """A prefill row's request as sparkDash writes it: the stream's numbers with the HTTP exchange
    flat beside them (httpStatus, responseHeaders, ...) and its times t0, tFirst, tLast in epoch
    milliseconds; not the prompt (the row keeps its size and hash, not 100k+ tokens of text)."""
    stream = stream_model(r, url, model, r.t0)
    http = stream.http
    assert http is not None  # stream_model always sets it
    epoch = time.time() - time.perf_counter()  # the perf_counter clock's zero, in epoch seconds

    def at(t: float | None) -> Fraction | None:
        return None if t is None else _q((epoch + t) * 1000.0)

    request = C.PrefillRequest(
        ttftContentMs=stream.ttftContentMs,
        reasoningChunks=stream.reasoningChunks,
        ttftMs=stream.ttftMs,
        completionTokens=stream.completionTokens,
        prefillTps=stream.prefillTps,
        prefillTokens=stream.prefillTokens,
        totalMs=stream.totalMs,
        error=stream.error,
        httpStatus=http.status,
        responseHeaders=http.headers,
        completionId=http.completionId,
        finishReason=http.finishReason,
        sseEventCount=http.sseEventCount,
        firstSseDataPreview=http.firstSseDataPreview,
        model=model,
        t0=at(r.t0),
        tFirst=at(r.t_first),
        tLast=at(r.t_last),
        usage=stream.usage,
        contentPreview=stream.contentPreview,
    )
    return request


def prefill_row(
    trial: int,
    target: int,
    salt: str,
    prompt: str,
    sha: str,
    r: StreamResult,
    watch: Watch,
    url: str,
    model: str,
    corpus: str | None,
) -> Doc:
    row = C.PrefillRow(
        trial=trial,
        targetTokens=target,
        salt=salt,
        promptChars=len(prompt),
        promptSha256=sha,
        request=prefill_request(r, url, model),
        tp4=C.PrefillTp4(
            corpus=corpus,
            invalid=watch.invalid(1),
            promptTokens=_count(r.prompt_tokens),
            maxRunning=watch.max_running,
            head=prompt[:200],
        ),
    )
    return _dump(row)


# --- the file ------------------------------------------------------------------------------------------


def read(path: Path) -> Doc | None:
    """The result.json in an out directory, or None when there is none; anything that is not a
    tp4 result there is InvalidInput (never overwritten)."""
    from tp4.core.userfiles import parse_json, read_input

    try:
        os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise InvalidInput(
            f"--out: {path} cannot be checked ({exc.strerror}); fix: choose another --out directory"
        ) from None
    text = read_input(path, "--out result", "choose another --out directory", limit=512 << 20)
    # a syntax error, nesting 5,000 deep or a 5,000-digit number: said plainly, never exit 70
    doc = parse_json(text, f"--out: {path}", "choose another --out directory, or remove the file")
    if not isinstance(doc, dict) or not isinstance(doc.get("tp4"), dict) or not isinstance(doc.get("config"), dict):
        raise InvalidInput(f"--out: {path} is not a tp4 bench result; fix: choose another --out directory")
    try:
        BenchResult.model_validate(doc)
    except ValidationError as exc:
        found = problems(exc)
        where, reason = found[0]
        more = f" ({len(found) - 1} more problem(s) after this one)" if len(found) > 1 else ""
        raise InvalidInput(
            f"--out: {path}: {where}: {reason}{more}, not a result this tp4 bench can resume; "
            "fix: choose another --out directory, or remove the file"
        ) from None
    return doc


def write(path: Path, doc: Doc) -> None:
    """Write ``doc`` to ``path`` atomically (temporary file, fsync, rename)."""
    data = json.dumps(doc, indent=1, ensure_ascii=False) + "\n"
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:
        raise InvalidInput(
            f"--out: cannot write in {path.parent} ({exc.strerror}); fix: choose a directory you can write to"
        ) from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)  # a result is for sharing (mkstemp makes it 0600)
        os.replace(tmp, path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise InvalidInput(
            f"--out: cannot write {path} ({exc.strerror}); fix: choose a directory you can write to"
        ) from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def prepare_out(directory: str, *, create: bool = True) -> Path:
    """The out directory (created when missing), checked writable: the result's path. With
    ``create`` False a missing directory is only checked to be creatable (nothing is made)."""
    out = Path(directory).expanduser()
    if not directory.strip():
        raise InvalidInput("--out: the path is empty; fix: name a directory (new or a run's own)")
    if not create and not os.path.lexists(out):
        parent = out.parent
        while not os.path.lexists(parent) and parent != parent.parent:
            parent = parent.parent
        if not parent.is_dir():
            raise InvalidInput(
                f"--out: cannot create {out}: {parent} is not a directory; fix: choose a directory you can write to"
            )
        if not os.access(parent, os.W_OK | os.X_OK):
            raise InvalidInput(
                f"--out: cannot create {out}: {parent} is not writable; fix: choose a directory you can write to"
            )
        # access() says yes to root everywhere: a directory made and removed again is the real
        # answer (/proc, a read-only mount), before the endpoint is asked rather than after a level
        try:
            os.rmdir(tempfile.mkdtemp(prefix=".tp4-out-probe.", dir=parent))
        except OSError as exc:
            raise InvalidInput(
                f"--out: cannot create {out}: {exc.strerror} in {parent}; fix: choose a directory you can write to"
            ) from None
        return out / RESULT
    try:
        out.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise InvalidInput(
            f"--out: {out} exists and is not a directory; fix: name a directory (new or a run's own)"
        ) from None
    except OSError as exc:
        raise InvalidInput(
            f"--out: cannot create {out} ({exc.strerror}); fix: choose a directory you can write to"
        ) from None
    if not out.is_dir():
        raise InvalidInput(f"--out: {out} is not a directory; fix: name a directory (new or a run's own)")
    if not os.access(out, os.W_OK | os.X_OK):
        raise InvalidInput(f"--out: {out} is not writable by this user; fix: choose a directory you can write to")
    target = out / RESULT
    try:
        if not stat.S_ISREG(os.lstat(target).st_mode):
            raise InvalidInput(f"--out: {target} is not a regular file; fix: choose another --out directory")
    except FileNotFoundError:
        pass
    # a real write, so a read-only file system (or a directory the user cannot write after all)
    # is found now, not after the first level
    try:
        fd, tmp = tempfile.mkstemp(dir=out, prefix=".probe.", suffix=".tmp")
        os.close(fd)
        os.unlink(tmp)
    except OSError as exc:
        raise InvalidInput(
            f"--out: cannot write in {out} ({exc.strerror}); fix: choose a directory you can write to"
        ) from None
    return target


def differences(old: Doc, new: Doc) -> list[str]:
    keys = sorted(set(old) | set(new))
    return [f"{k} {json.dumps(old.get(k))} -> {json.dumps(new.get(k))}" for k in keys if old.get(k) != new.get(k)]
