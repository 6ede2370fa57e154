"""The line's OpenAI-compatible API as tp4 talks to it: completions (plain and streamed), the
engine's load and health endpoints, the liveness probe of `tp4 status` and the checks of
`tp4 smoke`. Standard library only (http.client: no proxy is ever consulted, so a request goes
to the head's address and nowhere else).

Liveness is a real completion, not ``/health``: SGLang's ``/health`` passes on any recent
output of the engine, and a rank wedged in a collective has been seen with ``/health`` at 200
(sglang ``http_server.py``; b12x#313, sparkring#215). A completion that does not come back in
time is read against the load endpoint and SGLang's token counters (``/metrics``, with the
engine's --enable-metrics): a line with running or waiting requests whose counters grow is busy,
not wedged (a long prefill starves a one-token request); one whose counters stand still is
wedged, whatever it counts as running (a scheduler stuck in a collective keeps its requests).

The API key is a :class:`tp4.core.apikey.Secret`: its repr and str never show it, it goes only into the
``Authorization`` header, and no log record or error message of this module carries it.
"""

from __future__ import annotations

import errno
import http.client
import json
import logging
import math
import re
import socket
import time
import urllib.parse
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Literal, NamedTuple

from tp4.core.apikey import Secret
from tp4.core.errors import InvalidInput, Tp4Error

log = logging.getLogger("tp4.serving.api")

Json = None | bool | int | float | str | list["Json"] | dict[str, "Json"]
Message = Mapping[str, Json]

# upstream's smoke (boot.py `smoke()`, start.sh `smoke`): temperature 0, 32 tokens, thinking off
QUESTION = "What is 19 + 23? Reply only with the number."
SMOKE_TIMEOUT = 180.0
NO_THINKING: dict[str, Json] = {"thinking": False}
# the fixture the tool-call check hands the model back (any value the model cannot guess)
FIXTURE_NAME = "tp4-smoke"
FIXTURE_VALUE = "fixture-7391-kestrel"
LOOKUP_FIXTURE: dict[str, Json] = {
    "type": "function",
    "function": {
        "name": "lookup_fixture",
        "description": "Look up the value of a named test fixture.",
        "parameters": {
            "type": "object",
            "properties": {"name": {"type": "string", "description": "the fixture's name"}},
            "required": ["name"],
            "additionalProperties": False,
        },
    },
}
ANSWER_SCHEMA: dict[str, Json] = {
    "type": "json_schema",
    "json_schema": {
        "name": "answer",
        "strict": True,
        "schema": {
            "type": "object",
            "properties": {"answer": {"type": "integer"}},
            "required": ["answer"],
            "additionalProperties": False,
        },
    },
}

_MAX_BODY = 16 << 20  # a completion's JSON; more is no answer of this API
_MAX_LINE = 1 << 20  # one SSE line
_FOLLOW_UP = 5.0  # the load and health reads after a probe timed out, each at most this


# --- the endpoint and its errors ---------------------------------------------------------------------


class Endpoint(NamedTuple):
    """Where the line's API is: ``http://host:port`` of the head (the plan's ``line.api``), the
    served model name (the plan's SERVED_MODEL_NAME) and the key (None: an open endpoint)."""

    url: str
    model: str
    key: Secret | None = None

    @classmethod
    def of(cls, url: str, model: str, key: Secret | None = None) -> Endpoint:
        """An endpoint, its URL checked: http, a host, a port, nothing else."""
        try:
            parts = urllib.parse.urlsplit(url)
            port = parts.port
        except ValueError:
            parts, port = None, None
        if (
            parts is None
            or parts.scheme != "http"
            or not parts.hostname
            or port is None
            or parts.path not in ("", "/")
            or parts.query
            or parts.fragment
            or parts.username is not None
            or parts.password is not None
        ):
            raise InvalidInput(
                f"api: {url!r} is not an API address of the form http://HOST:PORT; fix: give the head's address and API port"
            )
        return cls(f"http://{parts.netloc}", model, key)

    @classmethod
    def from_plan(cls, url: str, env: Mapping[str, str], key: Secret | None) -> Endpoint:
        """The endpoint of a plan: its ``line.api`` and rank 0's env (SERVED_MODEL_NAME)."""
        return cls.of(url, env.get("SERVED_MODEL_NAME") or "default", key)


ErrorKind = Literal["down", "timeout", "broken", "auth", "http", "malformed"]


class ApiError(Tp4Error):
    """A request to the API that got no usable answer. ``kind``: ``down`` (no connection),
    ``timeout`` (connected, no answer in time), ``broken`` (the connection closed mid-answer),
    ``auth`` (401), ``http`` (another error status; ``status`` says which), ``malformed`` (an
    answer that is not what the endpoint returns)."""

    def __init__(self, message: str, *, kind: ErrorKind, status: int | None = None) -> None:
        super().__init__(message)
        self.kind: ErrorKind = kind
        self.status = status


def _target(ep: Endpoint) -> tuple[str, int]:
    parts = urllib.parse.urlsplit(ep.url)
    if parts.scheme != "http" or not parts.hostname or parts.port is None:
        raise InvalidInput(
            f"api: {ep.url!r} is not an API address of the form http://HOST:PORT; fix: build the endpoint with Endpoint.of"
        )
    return parts.hostname, parts.port


def _seconds(value: float) -> str:
    return f"{value:g} s"


def _down(ep: Endpoint, exc: OSError, timeout: float) -> ApiError:
    if isinstance(exc, ConnectionRefusedError):
        why = "connection refused"
    elif isinstance(exc, TimeoutError):
        why = f"no connection within {_seconds(timeout)}"
    elif isinstance(exc, socket.gaierror):
        why = f"the host name does not resolve ({exc.strerror})"
    else:
        why = exc.strerror or errno.errorcode.get(exc.errno or 0, type(exc).__name__)
    return ApiError(
        f"{ep.url}: API down ({why}); fix: start the line with `tp4 serve`, or check that this is the head's API address",
        kind="down",
    )


class _Call:
    """One request: connected and sent; the response read under a deadline (``total``) or
    with each read bounded (``stall``)."""

    def __init__(self, sock: socket.socket, resp: http.client.HTTPResponse, where: str) -> None:
        # the socket itself: http.client drops it from the connection once a response that
        # closes the connection has taken it over
        self.sock, self.resp, self.where = sock, resp, where

    def bound(self, seconds: float) -> None:
        if seconds <= 0:
            raise TimeoutError
        self.sock.settimeout(seconds)


def _body(data: Mapping[str, Json] | None) -> bytes | None:
    return None if data is None else json.dumps(data).encode()


@contextmanager
def _request(
    ep: Endpoint,
    method: str,
    path: str,
    data: Mapping[str, Json] | None,
    timeout: float,
    *,
    stream: bool = False,
    accept: str | None = None,
) -> Iterator[_Call]:
    """Connect, send, read the status line and headers within ``timeout``; errors are
    :class:`ApiError` (``down`` when no connection was made). The caller reads the body."""
    host, port = _target(ep)
    where = f"{ep.url}{path}"
    headers = {"Accept": accept or ("text/event-stream" if stream else "application/json"), "User-Agent": "tp4"}
    body = _body(data)
    if body is not None:
        headers["Content-Type"] = "application/json"
    if ep.key is not None:
        headers["Authorization"] = "Bearer " + ep.key.reveal()
    log.debug("%s %s", method, where)
    started = time.monotonic()
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        try:
            conn.connect()
        except OSError as exc:
            raise _down(ep, exc, timeout) from None
        sock = conn.sock
        assert isinstance(sock, socket.socket)
        try:
            conn.request(method, path, body=body, headers=headers)
            call = _Call(sock, conn.getresponse(), where)
            # the remaining time for what the caller reads, or the stall bound of a stream
            call.bound(timeout if stream else timeout - (time.monotonic() - started))
        except TimeoutError:
            raise ApiError(f"{where}: no answer within {_seconds(timeout)}", kind="timeout") from None
        except (http.client.HTTPException, OSError) as exc:
            raise _broken(where, exc) from None
        yield call
    finally:
        conn.close()


def _broken(where: str, exc: BaseException) -> ApiError:
    what = str(exc) or type(exc).__name__
    return ApiError(
        f"{where}: the connection closed before a whole answer ({what}); fix: check the head's log (`tp4 logs`): the engine may have crashed",
        kind="broken",
    )


def _read_all(call: _Call, timeout: float, started: float, limit: int = _MAX_BODY) -> bytes:
    chunks: list[bytes] = []
    size = 0
    try:
        while True:
            call.bound(timeout - (time.monotonic() - started))
            part = call.resp.read1(65536)
            if not part:
                break
            size += len(part)
            if size > limit:
                raise ApiError(
                    f"{call.where}: the answer is larger than {limit >> 20} MiB, which no answer of this API is",
                    kind="malformed",
                )
            chunks.append(part)
    except TimeoutError:
        raise ApiError(f"{call.where}: no answer within {_seconds(timeout)}", kind="timeout") from None
    except (http.client.HTTPException, OSError) as exc:
        raise _broken(call.where, exc) from None
    return b"".join(chunks)


def _reason(body: bytes) -> str:
    """The message of an error body (OpenAI's ``{"error": {"message"}}``, SGLang's
    ``{"message"}``, FastAPI's ``{"detail"}``), else its first line."""
    try:
        doc = json.loads(body)
    except ValueError:
        doc = None
    found: object = None
    if isinstance(doc, dict):
        error = doc.get("error")
        found = (error.get("message") if isinstance(error, dict) else error) or doc.get("message") or doc.get("detail")
    text = (
        found if isinstance(found, str) else json.dumps(found) if found is not None else body.decode("utf-8", "replace")
    )
    text = " ".join(text.split())
    return text[:300] + ("..." if len(text) > 300 else "")


def _redacted(ep: Endpoint, text: str) -> str:
    # an engine that echoes the request's header back must not put the key in our message
    return text.replace(ep.key.reveal(), "***") if ep.key is not None else text


def _status_error(ep: Endpoint, call: _Call, body: bytes) -> ApiError:
    status = call.resp.status
    reason = _redacted(ep, _reason(body)) or call.resp.reason
    if status == 401:
        if ep.key is None:
            return ApiError(
                f"{call.where}: the API wants a key and none was sent (HTTP 401); fix: set api.key_file to the file holding the line's API key",
                kind="auth",
                status=status,
            )
        return ApiError(
            f"{call.where}: the API key was refused (HTTP 401); fix: check api.key_file: it must hold the key the line was started with",
            kind="auth",
            status=status,
        )
    return ApiError(f"{call.where}: HTTP {status}: {reason}", kind="http", status=status)


def _get_json(ep: Endpoint, path: str, timeout: float) -> tuple[int, Json]:
    """(status, JSON body) of a GET; the body is None for an error status other than 401."""
    started = time.monotonic()
    with _request(ep, "GET", path, None, timeout) as call:
        body = _read_all(call, timeout, started)
        if call.resp.status == 401:
            raise _status_error(ep, call, body)
        if call.resp.status != 200:
            return call.resp.status, None
        return 200, _parse(call.where, body)


def get_json(ep: Endpoint, path: str, timeout: float) -> tuple[int, Json]:
    """(status, JSON body) of a GET of ``path`` (e.g. a router's /workers); raises ApiError when
    no usable answer comes."""
    return _get_json(ep, path, timeout)


def _parse(where: str, body: bytes) -> Json:
    try:
        out: Json = json.loads(body)
    except json.JSONDecodeError as exc:
        raise ApiError(f"{where}: the answer is not JSON ({exc.msg} at byte {exc.pos})", kind="malformed") from None
    except ValueError:  # not UTF-8
        raise ApiError(f"{where}: the answer is not JSON (not UTF-8 text)", kind="malformed") from None
    return out


# --- completions -------------------------------------------------------------------------------------


class Usage(NamedTuple):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ToolCall(NamedTuple):
    id: str
    name: str
    arguments: str  # JSON text, as the API gives it


class Completion(NamedTuple):
    content: str
    finish_reason: str | None
    seconds: float
    usage: Usage | None
    tool_calls: tuple[ToolCall, ...] = ()


class Streamed(NamedTuple):
    content: str
    finish_reason: str | None
    chunks: int  # data chunks before [DONE]
    first_token_seconds: float | None  # the first non-empty content; None when none came
    seconds: float


def _messages(messages: str | Sequence[Message]) -> list[Json]:
    if isinstance(messages, str):
        return [{"role": "user", "content": messages}]
    return [dict(m) for m in messages]


def _chat_body(
    ep: Endpoint,
    messages: str | Sequence[Message],
    max_tokens: int,
    temperature: float,
    stream: bool,
    extra: Mapping[str, Json],
) -> dict[str, Json]:
    body: dict[str, Json] = {
        "model": ep.model,
        "messages": _messages(messages),
        "max_tokens": max_tokens,
        "temperature": temperature,
        **extra,
        "stream": stream,
    }
    return body


def complete(
    ep: Endpoint,
    messages: str | Sequence[Message],
    *,
    max_tokens: int,
    timeout: float,
    temperature: float = 0.0,
    **extra: Json,
) -> Completion:
    """One chat completion (a prompt is one user message); ``extra`` goes into the request body
    (``chat_template_kwargs``, ``response_format``, ``tools`` ...). The whole answer must come
    within ``timeout`` seconds."""
    path = "/v1/chat/completions"
    body = _chat_body(ep, messages, max_tokens, temperature, False, extra)
    started = time.monotonic()
    with _request(ep, "POST", path, body, timeout) as call:
        data = _read_all(call, timeout, started)
        seconds = time.monotonic() - started
        if call.resp.status != 200:
            raise _status_error(ep, call, data)
        doc = _parse(call.where, data)
    return _completion(f"{ep.url}{path}", doc, seconds)


def _completion(where: str, doc: Json, seconds: float) -> Completion:
    def bad(what: str) -> ApiError:
        return ApiError(f"{where}: the answer is not a chat completion ({what})", kind="malformed")

    choice = _first_choice(doc)
    if choice is None:
        raise bad("no choices[0]")
    message = choice.get("message")
    if not isinstance(message, dict):
        raise bad("no choices[0].message")
    content = message.get("content")
    if content is not None and not isinstance(content, str):
        raise bad("choices[0].message.content is not text")
    finish = choice.get("finish_reason")
    if finish is not None and not isinstance(finish, str):
        raise bad("choices[0].finish_reason is not text")
    calls: list[ToolCall] = []
    raw_calls = message.get("tool_calls") or []
    if not isinstance(raw_calls, list):
        raise bad("choices[0].message.tool_calls is not a list")
    for raw in raw_calls:
        fn = raw.get("function") if isinstance(raw, dict) else None
        if not isinstance(raw, dict) or not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise bad("a tool call without a function name")
        args = fn.get("arguments")
        calls.append(
            ToolCall(str(raw.get("id") or ""), str(fn["name"]), args if isinstance(args, str) else json.dumps(args))
        )
    assert isinstance(doc, dict)
    return Completion(content or "", finish, seconds, _usage(doc.get("usage")), tuple(calls))


def _first_choice(doc: Json) -> dict[str, Json] | None:
    if not isinstance(doc, dict):
        return None
    choices = doc.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return None
    return choices[0]


def _usage(raw: Json) -> Usage | None:
    if not isinstance(raw, dict):
        return None
    values = [raw.get(k) for k in Usage._fields]
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        return None
    prompt, completion, total = (int(v) for v in values if isinstance(v, int))
    return Usage(prompt, completion, total)


def stream(
    ep: Endpoint,
    messages: str | Sequence[Message],
    *,
    max_tokens: int,
    timeout: float,
    temperature: float = 0.0,
    **extra: Json,
) -> Streamed:
    """A streamed chat completion, read as server-sent events up to ``data: [DONE]``.
    ``timeout`` bounds each wait: for the answer to start and between two chunks; a stream that
    stalls longer, or ends without [DONE], is an :class:`ApiError`."""
    path = "/v1/chat/completions"
    body = _chat_body(ep, messages, max_tokens, temperature, True, extra)
    started = time.monotonic()
    content: list[str] = []
    finish: str | None = None
    chunks = 0
    first: float | None = None
    with _request(ep, "POST", path, body, timeout, stream=True) as call:
        if call.resp.status != 200:
            raise _status_error(ep, call, _read_all(call, timeout, time.monotonic()))
        for event in _events(call, timeout):
            if event == "[DONE]":
                return Streamed("".join(content), finish, chunks, first, time.monotonic() - started)
            doc = _parse(call.where, event.encode())
            if isinstance(doc, dict) and doc.get("error") is not None:
                raise ApiError(
                    f"{call.where}: the stream reported an error: {_redacted(ep, _reason(event.encode()))}",
                    kind="http",
                    status=call.resp.status,
                )
            chunks += 1
            choice = _first_choice(doc)
            if choice is None:
                if isinstance(doc, dict) and doc.get("choices") == []:
                    continue  # a usage-only chunk
                raise ApiError(
                    f"{call.where}: chunk {chunks} of the stream is not a completion chunk (no choices[0])",
                    kind="malformed",
                )
            delta = choice.get("delta")
            text = delta.get("content") if isinstance(delta, dict) else None
            if isinstance(text, str) and text:
                if first is None:
                    first = time.monotonic() - started
                content.append(text)
            reason = choice.get("finish_reason")
            if isinstance(reason, str):
                finish = reason
    raise ApiError(
        f"{ep.url}{path}: the stream ended after {chunks} chunks without data: [DONE]; fix: check the head's log (`tp4 logs`)",
        kind="broken",
    )


def _events(call: _Call, stall: float) -> Iterator[str]:
    """The data of each server-sent event (its ``data:`` lines joined by newlines)."""
    data: list[str] = []
    while True:
        try:
            call.bound(stall)
            raw = call.resp.readline(_MAX_LINE + 1)
        except TimeoutError:
            raise ApiError(f"{call.where}: the stream stalled: nothing for {_seconds(stall)}", kind="timeout") from None
        except (http.client.HTTPException, OSError) as exc:
            raise _broken(call.where, exc) from None
        if len(raw) > _MAX_LINE:
            raise ApiError(f"{call.where}: a line of the stream is longer than {_MAX_LINE >> 20} MiB", kind="malformed")
        if not raw:
            if data:
                yield "\n".join(data)
            return
        line = raw.decode("utf-8", "replace").rstrip("\r\n")
        if not line:
            if data:
                yield "\n".join(data)
                data = []
        elif line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))
        # comments (":"), event:, id:, retry: carry nothing tp4 reads


# --- load, health, liveness --------------------------------------------------------------------------


class Load(NamedTuple):
    running: int
    waiting: int


def load(ep: Endpoint, timeout: float) -> Load | None:
    """Running and waiting requests over every DP rank, from ``/v1/loads`` (SGLang's newer
    endpoint: ``{"loads": [{num_running_reqs, num_waiting_reqs}, ...]}``), else ``/get_load``
    (a list per DP rank of ``{num_reqs, num_waiting_reqs}``, num_reqs counting both). None when
    the engine has neither (404)."""
    for path in ("/v1/loads", "/get_load"):
        status, doc = _get_json(ep, path, timeout)
        if status == 404:
            continue
        if status != 200:
            raise ApiError(f"{ep.url}{path}: HTTP {status}", kind="http", status=status)
        found = _sum_load(doc)
        if found is None:
            raise ApiError(
                f"{ep.url}{path}: the answer is not a load report (no running/waiting request counts)", kind="malformed"
            )
        return found
    return None


def _sum_load(doc: Json) -> Load | None:
    items: list[Json]
    if isinstance(doc, dict) and isinstance(doc.get("loads"), list):
        loads = doc["loads"]
        assert isinstance(loads, list)
        items = loads
    elif isinstance(doc, list):
        items = doc
    elif isinstance(doc, dict):
        items = [doc]
    else:
        return None
    running = waiting = 0
    for item in items:
        if not isinstance(item, dict):
            return None
        run, wait, total = (_count(item.get(k)) for k in ("num_running_reqs", "num_waiting_reqs", "num_reqs"))
        if wait is None:
            return None
        if run is None:
            if total is None:
                return None
            run = max(total - wait, 0)
        running, waiting = running + run, waiting + wait
    return Load(running, waiting)


def _count(value: Json) -> int | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        return None
    return int(value)


def health(ep: Endpoint, timeout: float) -> int | None:
    """The status of ``GET /health``; None when it gives none in time (down, or hanging)."""
    started = time.monotonic()
    try:
        with _request(ep, "GET", "/health", None, timeout) as call:
            _read_all(call, timeout, started)
            return call.resp.status
    except ApiError:
        return None


# --- progress: SGLang's token counters ------------------------------------------------------------

# The counters whose growth is progress (sgl-project/sglang python/sglang/srt/metrics/collector.py):
# TokenizerMetricsCollector's sglang:prompt_tokens_total and sglang:generation_tokens_total grow when a
# request finishes (observe_one_finished_request); SchedulerMetricsCollector's
# sglang:realtime_tokens_total{mode="prefill_compute"|"prefill_cache"|"decode"} grows at each log
# interval of the scheduler while it computes (increment_realtime_tokens). Each is exported per label
# set (model_name, the ranks, the mode ...): tp4 sums them. /metrics exists only with --enable-metrics.
PROGRESS_COUNTERS = ("sglang:realtime_tokens_total", "sglang:generation_tokens_total", "sglang:prompt_tokens_total")
_MAX_METRICS = 8 << 20  # SGLang's /metrics with every histogram is well under 1 MiB
# one sample line of the text format: name, optional {labels} (quoted values may hold } and escapes),
# value, optional timestamp
_SAMPLE = re.compile(r'([A-Za-z_:][A-Za-z0-9_:]*)(\{(?:[^"}]|"(?:[^"\\]|\\.)*")*\})?[ \t]+(\S+)(?:[ \t]+-?[0-9]+)?')


def parse_counters(text: str, names: Sequence[str] = PROGRESS_COUNTERS) -> dict[str, float]:
    """Each counter of ``names`` summed over its label sets, from a Prometheus text exposition.
    Comments, other metrics and lines that are no sample are skipped, and so is a sample whose
    value is not a finite number of at least 0 (no counter is negative or NaN); a counter with no
    sample is absent from the result."""
    wanted = set(names)
    prefixes = tuple(names)
    found: dict[str, float] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line.startswith(prefixes):
            continue
        m = _SAMPLE.fullmatch(line)
        if m is None or m.group(1) not in wanted:
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        total = found.get(m.group(1), 0.0) + value
        if math.isfinite(value) and value >= 0 and math.isfinite(total):
            found[m.group(1)] = total
    return found


class Tokens(NamedTuple):
    """One reading of SGLang's token counters (:data:`PROGRESS_COUNTERS`, each summed; a counter
    the engine has not exported yet is absent) and when it was taken (``time.monotonic()``)."""

    counts: Mapping[str, float]
    at: float

    def since(self, before: Tokens) -> float:
        """Tokens counted since ``before``: a counter that appeared counts whole, one that went
        down (the engine restarted) counts nothing."""
        return sum(max(0.0, value - before.counts.get(name, 0.0)) for name, value in self.counts.items())


def tokens(ep: Endpoint, timeout: float) -> Tokens | None:
    """SGLang's token counters from ``GET /metrics``; None when the engine serves no /metrics (404:
    it was started without --enable-metrics)."""
    started = time.monotonic()
    with _request(ep, "GET", "/metrics", None, timeout, accept="text/plain; version=0.0.4") as call:
        body = _read_all(call, timeout, started, _MAX_METRICS)
        if call.resp.status == 404:
            return None
        if call.resp.status != 200:
            raise _status_error(ep, call, body)
    return Tokens(parse_counters(body.decode("utf-8", "replace")), time.monotonic())


def _reading(ep: Endpoint, timeout: float) -> tuple[Tokens | None, str]:
    """A reading of the counters, or None and why there is none."""
    try:
        got = tokens(ep, timeout)
    except ApiError as exc:
        return None, f"progress unknown: /metrics gave no reading ({exc.message})"
    if got is None:
        return None, "progress unknown: the engine has no /metrics (it runs without --enable-metrics)"
    return got, ""


def _amount(value: float) -> str:
    return f"{value:.0f}" if value < 1e12 else f"{value:.3g}"


def progress(after: Tokens, starts: Sequence[Tokens | None]) -> tuple[bool | None, str]:
    """Whether any token was counted between the earlier readings ``starts`` (the probe's own,
    the watchdog's previous look's) and ``after``, and that in words; None when no earlier
    reading is there."""
    found = [t for t in starts if t is not None]
    if not found:
        return None, "progress unknown: /metrics gave no reading before the probe"
    gained = max(after.since(t) for t in found)
    window = max(0.0, after.at - min(t.at for t in found))
    if gained > 0:
        return True, f"{_amount(gained)} token(s) counted in the last {window:.1f} s"
    return False, f"no token counted in {window:.1f} s (SGLang's token counters stood still)"


# --- liveness --------------------------------------------------------------------------------------


State = Literal["alive", "busy", "wedged", "down", "error"]


class Liveness(NamedTuple):
    """What a probe found: ``alive`` (a one-token completion came back), ``busy`` (none in time,
    but requests are running or waiting: ``progress`` says whether any token was counted
    meanwhile, None when that is unknown), ``wedged`` (none in time, nothing running or waiting),
    ``down`` (no connection), ``error`` (the API answered, but with an error: a refused key, a
    5xx, a malformed answer). ``detail`` says it in words; ``tokens`` is the probe's last reading
    of the token counters (the next look compares with it)."""

    state: State
    detail: str
    seconds: float
    health: int | None = None
    load: Load | None = None
    progress: bool | None = None
    tokens: Tokens | None = None


def probe(ep: Endpoint, timeout: float, *, since: Tokens | None = None) -> Liveness:
    """The liveness of the line: a one-token completion within ``timeout``. When it does not
    come, the load decides between busy and wedged (each follow-up read at most 5 s), and the
    token counters read before the completion was sent and after it timed out (and ``since``, a
    reading of the caller's previous look) say whether the requests in flight progress."""
    started = time.monotonic()

    def took() -> float:
        return time.monotonic() - started

    follow = min(timeout, _FOLLOW_UP)
    before, _ = _reading(ep, follow)
    try:
        done = complete(
            ep, "Reply with one word: ready.", max_tokens=1, timeout=timeout, chat_template_kwargs=NO_THINKING
        )
    except ApiError as exc:
        if exc.kind == "down":
            return Liveness("down", exc.message, took())
        if exc.kind != "timeout":
            return Liveness("error", exc.message, took(), tokens=before)
    else:
        return Liveness("alive", f"one token in {done.seconds:.2f} s", took(), tokens=before)
    status = health(ep, follow)
    shown = f"health {status}" if status is not None else f"health gave no answer within {_seconds(follow)}"
    try:
        now = load(ep, follow)
    except ApiError as exc:
        return Liveness(
            "wedged",
            f"{shown} but no completion within {_seconds(timeout)}; the load is unknown ({exc.message})",
            took(),
            status,
            tokens=before,
        )
    if now is None:
        return Liveness(
            "wedged",
            f"{shown} but no completion within {_seconds(timeout)}; the engine has no load endpoint to tell busy from wedged",
            took(),
            status,
            tokens=before,
        )
    if now.running or now.waiting:
        after, why = _reading(ep, follow)
        moved, words = progress(after, (since, before)) if after is not None else (None, why)
        return Liveness(
            "busy",
            f"no completion within {_seconds(timeout)}, {now.running} running and {now.waiting} waiting; {words}",
            took(),
            status,
            now,
            moved,
            after or before,
        )
    return Liveness(
        "wedged",
        f"{shown} but no completion within {_seconds(timeout)}, and nothing running or waiting",
        took(),
        status,
        now,
        tokens=before,
    )


# --- the smoke -----------------------------------------------------------------------------------------


class SmokeResult(NamedTuple):
    name: str
    ok: bool
    detail: str
    seconds: float


def smoke(ep: Endpoint, *, full: bool, timeout: float = SMOKE_TIMEOUT) -> list[SmokeResult]:
    """Upstream's smoke: ``arithmetic`` (19 + 23 must be ``42`` with finish_reason stop) and a
    ``stream``ed completion; with ``full`` also ``json_schema`` (``{"answer": 42}`` under a
    JSON schema) and ``tool_call`` (the model calls ``lookup_fixture``, then answers with its
    result). Every check runs; each is bounded by ``timeout``."""
    checks = [("arithmetic", _arithmetic), ("stream", _streamed)]
    if full:
        checks += [("json_schema", _json_schema), ("tool_call", _tool_call)]
    results = []
    for name, check in checks:
        started = time.monotonic()
        try:
            ok, detail = check(ep, timeout)
        except ApiError as exc:
            ok, detail = False, exc.message
        results.append(SmokeResult(name, ok, detail, time.monotonic() - started))
    return results


def _arithmetic(ep: Endpoint, timeout: float) -> tuple[bool, str]:
    out = complete(ep, QUESTION, max_tokens=32, timeout=timeout, chat_template_kwargs=NO_THINKING)
    ok = out.content.strip() == "42" and out.finish_reason == "stop"
    return (
        ok,
        f"19 + 23 answered {_shown(out.content)} (finish_reason {out.finish_reason}){'' if ok else '; expected 42 (finish_reason stop)'}",
    )


def _streamed(ep: Endpoint, timeout: float) -> tuple[bool, str]:
    out = stream(ep, QUESTION, max_tokens=32, timeout=timeout, chat_template_kwargs=NO_THINKING)
    ok = out.chunks > 0 and bool(out.content.strip())
    first = f"first token in {out.first_token_seconds:.2f} s" if out.first_token_seconds is not None else "no content"
    return (
        ok,
        f"{out.chunks} chunks to [DONE], {first}, content {_shown(out.content)}{'' if ok else '; expected some content'}",
    )


def _json_schema(ep: Endpoint, timeout: float) -> tuple[bool, str]:
    out = complete(
        ep,
        "What is 19 + 23? Answer with a JSON object whose field answer holds the number.",
        max_tokens=64,
        timeout=timeout,
        chat_template_kwargs=NO_THINKING,
        response_format=ANSWER_SCHEMA,
    )
    try:
        doc = json.loads(out.content)
    except ValueError:
        return False, f'the answer {_shown(out.content)} is not JSON; expected {{"answer": 42}}'
    ok = isinstance(doc, dict) and doc == {"answer": 42} and type(doc["answer"]) is int
    return ok, f"answered {_shown(out.content)}" + ("" if ok else '; expected {"answer": 42}')


def _tool_call(ep: Endpoint, timeout: float) -> tuple[bool, str]:
    ask: list[Message] = [
        {
            "role": "user",
            "content": f"Use the lookup_fixture tool to look up the fixture named '{FIXTURE_NAME}', then reply with its value only.",
        }
    ]
    first = complete(ep, ask, max_tokens=128, timeout=timeout, chat_template_kwargs=NO_THINKING, tools=[LOOKUP_FIXTURE])
    calls = [c for c in first.tool_calls if c.name == "lookup_fixture"]
    if not calls:
        named = ", ".join(c.name for c in first.tool_calls) or "none"
        return (
            False,
            f"no call of lookup_fixture (tool calls: {named}; answered {_shown(first.content)}, finish_reason {first.finish_reason})",
        )
    call = calls[0]
    try:
        args = json.loads(call.arguments)
    except ValueError:
        return False, f"lookup_fixture called with arguments that are not JSON: {_shown(call.arguments)}"
    if not isinstance(args, dict) or args.get("name") != FIXTURE_NAME:
        return False, f"lookup_fixture called with {_shown(call.arguments)}; expected name {FIXTURE_NAME!r}"
    result = json.dumps({"name": FIXTURE_NAME, "value": FIXTURE_VALUE})
    follow: list[Message] = [
        *ask,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
            ],
        },
        {"role": "tool", "tool_call_id": call.id, "content": result},
    ]
    second = complete(
        ep, follow, max_tokens=128, timeout=timeout, chat_template_kwargs=NO_THINKING, tools=[LOOKUP_FIXTURE]
    )
    ok = FIXTURE_VALUE in second.content
    return ok, (
        f"called lookup_fixture({FIXTURE_NAME!r}), then answered {_shown(second.content)}"
        f"{'' if ok else f'; expected the fixture value {FIXTURE_VALUE}'}"
    )


def _shown(text: str, limit: int = 80) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")
