"""The bench result: sparkDash's ``result.json`` (its field names, so sparkDash's readers read
ours and `tp4 report` reads both), tp4's additions under keys named ``tp4`` only.

`tp4 bench` (tp4.measuring.throughput.result, tp4.measuring.throughput.run) writes it; `tp4 report` reads tp4's and sparkDash's
own files through :class:`BenchResult`. sparkDash's objects keep keys tp4 does not name (its
versions differ); tp4's own ``tp4`` objects hold exactly the fields named here. Every field may be
missing (sparkDash's files lack tp4's, older ones some of sparkDash's), except the few a report
cannot do without: a level's ``concurrency``, a prefill row's ``targetTokens``, a decode entry's
``job``.

Numbers are read as exact fractions (tp4.measuring.report parses the decimal text); a value JSON cannot hold
as a finite 64-bit number, a negative rate or a fractional count is refused with its field's
path.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Annotated, Any, Literal

from pydantic import Field, PlainSerializer, PlainValidator, WithJsonSchema
from pydantic_core import PydanticCustomError

from tp4.core.contracts.base import Bad, Closed, Open, describe

SCHEMA_ID = "tp4.bench-result"


def _number(value: object) -> Fraction | None:
    if value is None:
        return None
    if isinstance(value, Bad):
        raise PydanticCustomError("tp4_number", "{reason}", {"reason": value.reason})
    if isinstance(value, bool) or not isinstance(value, int | float | Fraction):
        raise PydanticCustomError("tp4_number", "is {what}, not a number", {"what": describe(value)})
    if isinstance(value, float) and not math.isfinite(value):
        raise PydanticCustomError("tp4_number", "{what} is not a number JSON can hold", {"what": str(value)})
    return Fraction(value)


def _rate(value: object) -> Fraction | None:
    number = _number(value)
    if number is not None and number < 0:
        raise PydanticCustomError("tp4_number", "{value} is negative", {"value": f"{float(number):g}"})
    return number


def _count(value: object) -> int | None:
    number = _rate(value)
    if number is not None and number.denominator != 1:
        raise PydanticCustomError("tp4_number", "is {what}, not a whole number", {"what": describe(value)})
    return None if number is None else int(number)


def _positive(value: object) -> int:
    if value is None:
        raise PydanticCustomError("tp4_missing", "is missing")
    number = _number(value)
    if number is None or number.denominator != 1 or number < 1:
        raise PydanticCustomError("tp4_number", "is {what}, not a positive whole number", {"what": describe(value)})
    return int(number)


def _json_number(value: Fraction | None) -> int | float | None:
    """A number as JSON holds it (the writer builds the file through these models)."""
    if value is None:
        return None
    return int(value) if value.denominator == 1 else float(value)


_AS_JSON = PlainSerializer(_json_number, when_used="json")
# a number, null or absent
Number = Annotated[Fraction | None, PlainValidator(_number), _AS_JSON, WithJsonSchema({"type": ["number", "null"]})]
# a non-negative number (a rate, a time), null or absent
Rate = Annotated[
    Fraction | None, PlainValidator(_rate), _AS_JSON, WithJsonSchema({"type": ["number", "null"], "minimum": 0})
]
# a whole number >= 0 (a count), null or absent
Count = Annotated[int | None, PlainValidator(_count), WithJsonSchema({"type": ["integer", "null"], "minimum": 0})]
# a whole number >= 1, required (a concurrency, a prompt size)
Positive = Annotated[int, PlainValidator(_positive), WithJsonSchema({"type": "integer", "minimum": 1})]
# any JSON value (sparkDash's `error`: null, a message or an object; any of them but null, "" and false marks a failure)
Anything = Annotated[Any, WithJsonSchema({})]


# --- one stream ------------------------------------------------------------------------------------


class StreamTp4(Closed):
    """tp4's additions to a stream: its times from the level's start, so the aggregates can be checked from the file."""

    t0Ms: Rate = Field(None, description="The request's start, ms from the level's start.")
    tFirstMs: Rate = Field(
        None, description="The first visible (content or reasoning) delta, ms from the level's start."
    )
    tLastMs: Rate = Field(None, description="The last visible delta, ms from the level's start.")
    usageSeen: bool | None = Field(
        None, description="The stream ended with a usage object (else completion tokens are the text / 4)."
    )
    exact: bool | None = Field(
        None,
        description="The request carried min_tokens, ignore_eos and stop [] (else the engine refused them and tp4 fell back).",
    )


class HttpRequest(Open):
    """What was asked."""

    model: str | None = Field(None, description="The model name sent.")
    maxTokens: Count = Field(None, description="max_tokens sent.")
    temperature: Number = Field(None, description="The temperature sent (0).")
    stream: bool | None = Field(None, description="Streamed (always true).")
    promptChars: Count = Field(None, description="Characters of the prompt.")


class Http(Open):
    """The HTTP exchange of one stream."""

    url: str | None = Field(None, description="The full chat completions URL (…/v1/chat/completions).")
    status: Count = Field(None, description="The HTTP status (null: no answer).")
    headers: dict[str, Anything] | None = Field(None, description="The response headers.")
    completionId: str | None = Field(None, description="The completion's id.")
    finishReason: str | None = Field(None, description="The finish reason of the last choice.")
    sseEventCount: Count = Field(None, description="Server-sent events received.")
    firstSseDataPreview: str | None = Field(None, description="The start of the first event's data.")
    request: HttpRequest | None = Field(None, description="What was asked.")


class Usage(Open):
    """The usage object the engine returned, in sparkDash's names."""

    promptTokens: Count = Field(None, description="usage.prompt_tokens.")
    completionTokens: Count = Field(None, description="usage.completion_tokens.")
    totalTokens: Count = Field(None, description="usage.total_tokens.")


class ContentPreview(Open):
    """The start and end of the visible text."""

    first: str | None = Field(None, description="The first characters.")
    last: str | None = Field(None, description="The last characters.")
    chars: Count = Field(None, description="Characters of visible text.")


class Stream(Open):
    """One streamed chat completion (sparkDash's per-stream fields; a prefill row's request too)."""

    index: Count = Field(None, description="The stream's index in its level.")
    ttftContentMs: Rate = Field(None, description="ms from the request's start to the first content delta.")
    reasoningChunks: Count = Field(None, description="Reasoning deltas received.")
    ttftMs: Rate = Field(
        None, description="ms from the request's start to the first visible (content or reasoning) delta."
    )
    decodeTps: Rate = Field(None, description="decodeTokens / decodeMs, in tok/s.")
    decodeTokens: Count = Field(None, description="completionTokens - 1.")
    completionTokens: Count = Field(None, description="From usage, else the visible text / 4.")
    prefillTps: Rate = Field(None, description="Prompt tokens / TTFT, in tok/s (`tp4 report` reads a prefill row's).")
    prefillTokens: Count = Field(None, description="usage.prompt_tokens.")
    totalMs: Rate = Field(None, description="ms from the request's start to its end.")
    error: Anything = Field(
        None, description="null, or why the stream failed (`tp4 report` counts a prefill row with one as failed)."
    )
    prompt: str | None = Field(
        None, description="The prompt sent (not kept in a prefill row: see promptChars, promptSha256)."
    )
    http: Http | None = Field(None, description="The HTTP exchange.")
    usage: Usage | None = Field(None, description="The usage the engine returned (null: none).")
    contentPreview: ContentPreview | None = Field(None, description="The start and end of the visible text.")
    decodeMs: Rate = Field(None, description="ms from the first visible delta to the last.")
    tp4: StreamTp4 | None = Field(None, description="tp4's additions.")


# --- one concurrency level -------------------------------------------------------------------------


class LineShare(Closed):
    """One line's share of a level behind a fleet's router."""

    requests: Count = Field(None, description="Requests the router counted for the line during the level.")
    decodeTokens: Count = Field(None, description="The level's decode tokens in that proportion.")
    decodeTps: Rate = Field(None, description="The level's aggregate decode tok/s in that proportion.")


class LevelTp4(Closed):
    """tp4's additions to a level."""

    invalid: str | None = Field(
        None,
        description="null, or why the level is invalid (foreign traffic: the engine held more requests than the level sent); an invalid level is never judged.",
    )
    maxRunning: Count = Field(None, description="The most requests the engine's load endpoint showed running.")
    maxInEngine: Count = Field(None, description="The most requests it showed in the engine (running plus waiting).")
    loadSamples: Count = Field(None, description="Reads of the load endpoint during the level.")
    samePrompts: bool | None = Field(None, description="Every stream of the level got the same prompt.")
    salted: bool | None = Field(
        None, description="Every prompt opened with a unique salt line (nothing from the prefix cache)."
    )
    lines: dict[str, LineShare] | None = Field(
        None, description="Behind a fleet's router (`tp4 bench --fleet`): line name -> its share."
    )
    linesFrom: str | None = Field(None, description="Where the shares come from.")


class Level(Open):
    """One concurrency level (sparkDash's result row): N streams at once."""

    concurrency: Positive = Field(description="Streams sent at once.")
    streamsOk: Count = Field(
        None, description="Streams without error and with at least one decode token (0: the level failed)."
    )
    streamsFailed: Count = Field(None, description="The other streams.")
    meanDecodeTps: Rate = Field(None, description="Mean per-stream decode tok/s over the OK streams.")
    medianDecodeTps: Rate = Field(None, description="Median per-stream decode tok/s (`tp4 report`'s per-stream value).")
    minDecodeTps: Rate = Field(None, description="Lowest per-stream decode tok/s.")
    maxDecodeTps: Rate = Field(None, description="Highest per-stream decode tok/s.")
    meanTtftMs: Rate = Field(None, description="Mean TTFT, ms.")
    medianTtftMs: Rate = Field(None, description="Median TTFT, ms (`tp4 report`'s TTFT).")
    aggregateDecodeTps: Rate = Field(
        None,
        description="Sum of decode tokens / (latest last delta - earliest first delta) (`tp4 report`'s aggregate).",
    )
    meanPrefillTps: Rate = Field(None, description="Mean per-stream prefill tok/s.")
    medianPrefillTps: Rate = Field(None, description="Median per-stream prefill tok/s.")
    aggregatePrefillTps: Rate = Field(None, description="Sum of prompt tokens / (latest first delta - earliest start).")
    totalPrefillTokens: Count = Field(None, description="Prompt tokens of the OK streams.")
    totalDecodeTokens: Count = Field(None, description="Decode tokens of the OK streams.")
    totalCompletionTokens: Count = Field(None, description="Completion tokens of the OK streams.")
    durationMs: Rate = Field(None, description="The level's wall time, ms.")
    error: Anything = Field(
        None, description='null, or why streams failed (any value but null, "" and false marks the level failed).'
    )
    streams: list[Stream] | None = Field(None, description="Every stream of the level.")
    model: str | None = Field(None, description="The model name.")
    hardwareSamples: list[Anything] | None = Field(
        None, description="sparkDash's hardware samples (tp4: always empty)."
    )
    tp4: LevelTp4 | None = Field(None, description="tp4's additions.")


# --- a decode job ----------------------------------------------------------------------------------


class JobConfig(Open):
    """A decode job's configuration."""

    port: Count = Field(None, description="The API's port.")
    modelId: str | None = Field(None, description="The model name.")
    concurrencies: list[Positive] | None = Field(None, description="The levels the job runs.")
    maxTokens: Count = Field(None, description="max_tokens of every request.")
    promptType: str | None = Field(
        None,
        description="The prompt type (prose, code, structured, json); missing: prose (sparkDash run.mjs's decode job).",
    )
    debug: bool | None = Field(None, description="sparkDash's debug flag (tp4: false).")


class JobProgress(Open):
    """How far the job got."""

    currentConcurrency: Count = Field(None, description="The level running (null: none).")
    completedLevels: Count = Field(None, description="Levels done.")
    totalLevels: Count = Field(None, description="Levels of the job.")
    message: str | None = Field(None, description="sparkDash's progress message.")


class Job(Open):
    """One sparkDash decode job: one prompt type, one trial, its levels. `tp4 report` also reads a bare job as a file."""

    benchId: str | None = Field(None, description="The job's id.")
    sparkId: str | None = Field(None, description='sparkDash\'s spark id (tp4: "comparison").')
    status: str | None = Field(None, description="running, completed, ...")
    startedAt: Count | str = Field(
        None,
        description="When the job started, in epoch milliseconds as sparkDash writes it "
        "(a tp4 result of an earlier version: an ISO 8601 string).",
    )
    completedAt: Count | str = Field(
        None, description="When it completed, epoch milliseconds (null while running; earlier tp4: ISO 8601)."
    )
    durationMs: Number = Field(None, description="completedAt - startedAt (null while running).")
    error: Anything = Field(None, description="null, or why the job stopped (sparkDash's message).")
    owner: Anything = Field(None, description="sparkDash's job owner (tp4: null).")
    config: JobConfig | None = Field(None, description="The job's configuration.")
    progress: JobProgress | None = Field(None, description="How far it got.")
    results: list[Level] | None = Field(None, description="One entry per finished level.")


class DecodeEntry(Open):
    """One decode job and its trial."""

    trial: Count = Field(None, description="The trial, from 1 (the c1 runs beyond --trials are jobs with c1 only).")
    job: Job = Field(description="The job.")


class PrefillRequest(Open):
    """A prefill row's request, flat as sparkDash writes it (a tp4 result of an earlier version
    nested the HTTP fields under `http`; `tp4 report` still reads it)."""

    ttftContentMs: Rate = Field(None, description="ms from the request's start to the first content delta.")
    reasoningChunks: Count = Field(None, description="Reasoning deltas received.")
    ttftMs: Rate = Field(None, description="ms from the request's start to the first visible delta.")
    completionTokens: Count = Field(None, description="From usage, else the visible text / 4.")
    prefillTps: Rate = Field(None, description="Prompt tokens / TTFT, in tok/s: the row's rate.")
    prefillTokens: Count = Field(None, description="usage.prompt_tokens.")
    totalMs: Rate = Field(None, description="ms from the request's start to its end.")
    error: Anything = Field(None, description="null, or why the request failed (the row counts as failed).")
    httpStatus: Count = Field(None, description="The HTTP status (null: no answer).")
    responseHeaders: dict[str, Anything] | None = Field(None, description="The response headers.")
    completionId: str | None = Field(None, description="The completion's id.")
    finishReason: str | None = Field(None, description="The finish reason of the last choice.")
    sseEventCount: Count = Field(None, description="Server-sent events received.")
    firstSseDataPreview: str | None = Field(None, description="The start of the first event's data.")
    model: str | None = Field(None, description="The model name sent.")
    t0: Rate = Field(None, description="The request's start, epoch milliseconds.")
    tFirst: Rate = Field(None, description="The first visible delta, epoch milliseconds.")
    tLast: Rate = Field(None, description="The last visible delta, epoch milliseconds.")
    usage: Usage | None = Field(None, description="The usage the engine returned (null: none).")
    contentPreview: ContentPreview | None = Field(None, description="The start and end of the visible text.")


# --- a prefill row ---------------------------------------------------------------------------------


class PrefillTp4(Closed):
    """tp4's additions to a prefill row."""

    corpus: str | None = Field(
        None, description="The corpus the prompt's text came from (null: tp4's filler of common words)."
    )
    invalid: str | None = Field(None, description="null, or why the row is invalid (the engine held another request).")
    promptTokens: Count = Field(None, description="usage.prompt_tokens.")
    maxRunning: Count = Field(None, description="The most requests the load endpoint showed running.")
    head: str | None = Field(None, description="The prompt's first 200 characters.")


class PrefillRow(Open):
    """One prefill request of one pass and prompt size."""

    trial: Count = Field(None, description="The pass, from 1.")
    targetTokens: Positive = Field(description="The prompt size aimed at, in tokens.")
    salt: str | None = Field(None, description="The unique line the prompt opens with.")
    promptChars: Count = Field(None, description="Characters of the prompt.")
    promptSha256: str | None = Field(None, description="SHA-256 of the prompt.")
    request: PrefillRequest | None = Field(
        None, description="The request (sparkDash's flat fields); `request.prefillTps` is the row's rate."
    )
    prefillTps: Rate = Field(
        None,
        description="sparkDash's prefill history keeps the rate on the row (read when request.prefillTps is missing).",
    )
    error: Anything = Field(None, description="null, or why the row failed.")
    tp4: PrefillTp4 | None = Field(None, description="tp4's additions.")


# --- the file --------------------------------------------------------------------------------------


class Source(Open):
    """Which program wrote the file."""

    repo: str | None = Field(None, description='"tp4", or sparkDash\'s repository.')
    commit: str | None = Field(None, description="Its git commit (tp4: null; its version is tp4.version).")
    release: str | None = Field(
        None, description="Its release (sparkDash up to 1.8.8 filled prefill prompts with one repeated token)."
    )


class RunConfigTp4(Closed):
    """tp4's own configuration of the run: a different one refuses to resume into the same --out."""

    kind: Literal["decode", "prefill"] | None = Field(None, description="Which bench.")
    trials: Count = Field(None, description="Trials (decode) or passes (prefill).")
    levels: list[Positive] | None = Field(None, description="Concurrency levels.")
    sizes: list[Positive] | None = Field(None, description="Prefill prompt sizes, tokens.")
    maxTokens: Count = Field(None, description="max_tokens of every request.")
    promptTypes: list[str] | None = Field(None, description="The decode prompt types.")
    c1Runs: Count = Field(None, description="Decode: runs of c1.")
    warmup: Count = Field(None, description="Decode: discarded warm-up requests per prompt type.")
    samePrompts: bool | None = Field(None, description="Decode: every stream of a level gets the same prompt.")
    sharedPrefix: bool | None = Field(None, description="Decode: prompts share their start (no salt line).")
    temperature: Count = Field(None, description="The temperature (0).")
    corpus: str | None = Field(None, description="Prefill: --corpus as given.")


def _csv(values: list[int]) -> str:
    return ",".join(str(v) for v in values)


class RunConfig(Open):
    """The run's configuration: the flags of sparkDash's run.mjs, as it writes them (numbers as the
    comma-separated text given on its command line), and tp4's own configuration under ``tp4``.
    tp4's earlier files held tp4's keys at this level, with lists and numbers: `tp4 report` still reads them."""

    base: str | None = Field(None, description="The API's /v1 URL.")
    out: str | None = Field(None, description="The result directory (--out; null: none).")
    label: str | None = Field(None, description="--label as given (null: none).")
    trials: str | int | None = Field(None, description='Trials (decode) or passes (prefill), as text: "2".')
    levels: str | list[Positive] | None = Field(None, description='Concurrency levels, as text: "1,2,4,8".')
    decode_only: bool | None = Field(None, alias="decode-only", description="Only the decode bench ran.")
    prompt_type: str | None = Field(
        None, alias="prompt-type", description="The decode prompt types, comma-separated (null: no decode)."
    )
    model: str | None = Field(None, description="The model name.")
    sizes: str | list[Positive] | None = Field(
        None, description='Prefill prompt sizes in tokens, as text: "4096,16384".'
    )
    prefill_only: bool | None = Field(None, alias="prefill-only", description="Only the prefill bench ran.")
    extended_concurrency: bool | None = Field(
        None, alias="extended-concurrency", description="A level above sparkDash's 32 (its C64/C128) is allowed."
    )
    tp4: RunConfigTp4 | None = Field(None, description="tp4's own configuration (missing: a sparkDash file).")

    @classmethod
    def build(cls, *, base: str, out: str | None, label: str | None, model: str, tp4: RunConfigTp4) -> "RunConfig":
        """The configuration tp4 writes: sparkDash's flags derived from tp4's own configuration."""
        decode = tp4.kind == "decode"
        return cls.model_validate(
            {
                "base": base.rstrip("/") + "/v1",
                "out": out,
                "label": label,
                "trials": str(tp4.trials),
                "levels": _csv(tp4.levels or []),
                "decode-only": decode,
                "prompt-type": ",".join(tp4.promptTypes or []) if decode else None,
                "model": model,
                "sizes": _csv(tp4.sizes or []),
                "prefill-only": not decode,
                "extended-concurrency": max(tp4.levels or [1]) > 32,
                "tp4": tp4,
            }
        )

    def document(self) -> dict[str, Any]:
        """The JSON object, keys as sparkDash spells them."""
        return self.model_dump(mode="json", by_alias=True, exclude_unset=False)


class Calibration(Closed):
    """How many characters make a token, measured once per prefill run from usage.prompt_tokens."""

    charsPerToken: Rate = Field(None, description="Characters per prompt token.")
    overheadTokens: Number = Field(None, description="Tokens the chat template adds.")
    samples: list[list[Count]] | None = Field(
        None, description="[characters, prompt tokens] of the two calibration requests."
    )


class ResultTp4(Closed):
    """tp4's additions to the file: what ran, against which line."""

    version: str | None = Field(None, description="tp4's version.")
    host: str | None = Field(None, description="The host the API runs on (sparkDash's `node` is its Node.js version).")
    kind: Literal["decode", "prefill"] | None = Field(None, description="Which bench.")
    plan_digest: str | None = Field(None, description="The digest of the line's plan (with --profile).")
    plan: dict[str, Anything] | None = Field(
        None, description="The plan itself, as `tp4 plan --json` prints it (no secret, only the key file's path)."
    )
    image: str | None = Field(None, description="The plan's image reference.")
    pins: dict[str, str] | None = Field(None, description="Component -> commit of the source manifest.")
    profile: str | None = Field(None, description="The profile the plan came from.")
    levels_done: list[str] | None = Field(
        None, description="Levels finished (KIND/TRIAL/CONCURRENCY, prefill/PASS/SIZE): a resumed run skips them."
    )
    interrupted: bool | None = Field(
        None, description="true until the run finishes (a report shows an interrupted run's levels, with a note)."
    )
    samePrompts: bool | None = Field(None, description="Every stream of a level got the same prompt.")
    salted: bool | None = Field(None, description="Prompts opened with a unique salt line.")
    corpus: str | None = Field(None, description="Prefill: the corpus's name (null: tp4's filler).")
    corpusChars: Count = Field(None, description="Prefill: characters of the corpus.")
    filler: str | None = Field(
        None, description="What filled the prefill prompts when no corpus did (missing: tp4's filler of common words)."
    )
    c1Runs: Count = Field(None, description="Decode: runs of c1.")
    warmup: Count = Field(None, description="Decode: warm-up requests per prompt type.")
    timeout: Rate = Field(None, description="Decode: seconds a request may take.")
    fellBack: bool | None = Field(
        None, description="Decode: the engine refused min_tokens / ignore_eos and requests ran without them."
    )
    calibration: Calibration | None = Field(None, description="Prefill: characters per token.")


class BenchResult(Open):
    """A result.json of `tp4 bench` or of sparkDash: its decode jobs per trial and its prefill rows."""

    status: str | None = Field(
        None, description="PASS, or FAIL (tp4: a level invalid or failed; sparkDash: a stream lacked usage)."
    )
    label: str | None = Field(None, description="The run's name in a report.")
    started: str | None = Field(None, description="ISO 8601 time the run started.")
    finished: str | None = Field(None, description="ISO 8601 time it finished (null while running).")
    source: Source | None = Field(None, description="Which program wrote the file.")
    node: str | None = Field(
        None, description="sparkDash: the Node.js version it ran on (tp4: null; the API's host is tp4.host)."
    )
    config: RunConfig | None = Field(None, description="The run's configuration.")
    prefill: list[PrefillRow] | None = Field(None, description="The prefill rows, per pass and size.")
    decode: list[DecodeEntry] | None = Field(None, description="The decode jobs, per prompt type and trial.")
    method: str | None = Field(None, description="How it was measured, in words.")
    tp4: ResultTp4 | None = Field(None, description="tp4's additions (missing: a sparkDash file).")


MODELS: tuple[type[Open | Closed], ...] = (
    BenchResult,
    ResultTp4,
    Calibration,
    RunConfig,
    RunConfigTp4,
    Source,
    DecodeEntry,
    Job,
    JobConfig,
    JobProgress,
    Level,
    LevelTp4,
    LineShare,
    Stream,
    StreamTp4,
    Http,
    HttpRequest,
    Usage,
    ContentPreview,
    PrefillRow,
    PrefillRequest,
    PrefillTp4,
)
