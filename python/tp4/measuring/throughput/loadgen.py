"""The load generator of `tp4 bench`: streamed OpenAI chat completions, each on a connection of
its own (h11 over asyncio), timed as sparkDash times them, and a watcher of the engine's load
endpoint that sees foreign traffic (httpx, as the other short requests).

One stream (:meth:`Client.stream`) takes its times on one clock (``time.perf_counter``): ``t0``
just before the request is sent, ``t_first`` at the first visible delta (content or reasoning,
non-empty), ``t_last`` at the last one, ``t_end`` when the stream is over. Tokens are counted from
the ``usage`` the server sends at the end (``stream_options.include_usage``), never from events:
on the line one SSE event carries about three tokens (speculative decoding).

Every stream opens a connection of its own after its ``t0`` and closes it when it is over, as
SGLang's ``bench_serving`` does (a new aiohttp session per request, its ``st`` taken before the
POST): a time to first token holds the connect, here as there, and the streams of a level start
together (bench/bench_vs_sglang.py compares the two). That connection is asyncio's own
(``asyncio.open_connection``, as aiohttp connects) and the HTTP/1.1 exchange is h11's (httpx's
own parser), without httpx's pool and anyio layers: their client work per request, under
concurrency, queues behind the other streams' and reads as time to first token.

The body is read as raw bytes and split into server-sent events here (``aiter_raw`` and
:class:`SseSplitter`), which is cheaper per event than a line iterator; bench/bench_loadgen.py
measures how many events one process takes in.
"""

from __future__ import annotations

import asyncio
import json
import math
import socket
import ssl
import time
import urllib.parse
import zlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import h11
import httpx

from tp4.core.apikey import Secret
from tp4.core.errors import Tp4Error

CHAT = "/v1/chat/completions"
# sparkDash's thinking-off switch: one of these is what each chat template reads
NO_THINKING = {"enable_thinking": False, "thinking": False, "thinking_mode": "disabled"}
PREVIEW = 160  # characters of content kept at each end, and of the first SSE data
_HEADERS_KEPT = ("content-type", "server", "x-request-id", "transfer-encoding", "content-encoding")

Clock = Callable[[], float]


@dataclass
class StreamResult:
    """What one streamed completion did, on the perf_counter clock (seconds)."""

    index: int
    prompt: str
    max_tokens: int
    extended: bool  # the request carried min_tokens / ignore_eos / stop
    t0: float = 0.0
    t_first: float | None = None  # the first visible (content or reasoning) delta
    t_first_content: float | None = None
    t_last: float | None = None
    t_end: float | None = None
    status: int | None = None
    headers: dict[str, str] = field(default_factory=dict)
    completion_id: str | None = None
    finish_reason: str | None = None
    events: int = 0  # SSE data events before [DONE]
    first_data: str | None = None
    reasoning_chunks: int = 0
    visible_chars: int = 0
    content: list[str] = field(default_factory=list)
    usage: dict[str, int] | None = None
    error: str | None = None
    done: bool = False  # [DONE] came

    @property
    def text(self) -> str:
        return "".join(self.content)

    @property
    def completion_tokens(self) -> int:
        """usage.completion_tokens when the server sent usage, else the visible text / 4 (sparkDash)."""
        if self.usage is not None and "completion_tokens" in self.usage:
            return self.usage["completion_tokens"]
        return math.ceil(self.visible_chars / 4)

    @property
    def prompt_tokens(self) -> int | None:
        return self.usage.get("prompt_tokens") if self.usage is not None else None


class SseSplitter:
    """Server-sent events from raw body bytes: ``feed`` returns the ``data`` payloads of the
    events completed by this piece (several ``data:`` lines of one event joined by newlines)."""

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = b""

    def feed(self, data: bytes) -> list[bytes]:
        buf = self._buf + data if self._buf else data
        held = b""
        if b"\r" in buf:
            if buf.endswith(b"\r"):  # perhaps a \r\n cut in two: the \r waits for the next piece
                buf, held = buf[:-1], b"\r"
            buf = buf.replace(b"\r\n", b"\n")
        out: list[bytes] = []
        pos = 0
        while True:
            end = buf.find(b"\n\n", pos)
            if end < 0:
                break
            event = buf[pos:end]
            pos = end + 2
            if event.startswith(b"data:") and b"\n" not in event:  # the common case: one data line
                out.append(event[6:] if event[5:6] == b" " else event[5:])
                continue
            lines = [
                line[6:] if line[5:6] == b" " else line[5:] for line in event.split(b"\n") if line.startswith(b"data:")
            ]
            if lines:
                out.append(b"\n".join(lines))
        self._buf = (buf[pos:] if pos else buf) + held
        return out


def _cause(exc: BaseException) -> str:
    """What the OS said under an httpx connection error (anyio wraps it twice)."""
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            break
        if isinstance(seen, ConnectionRefusedError):
            return "connection refused"
        if isinstance(seen, socket.gaierror):
            return f"the host name does not resolve ({seen.strerror})"
        if isinstance(seen, OSError) and seen.errno is not None:
            return seen.strerror or str(seen)
        seen = seen.__cause__ or seen.__context__
    return str(exc) or type(exc).__name__


def _message(exc: BaseException) -> str:
    if isinstance(exc, httpx.ConnectTimeout):
        return "no connection (timed out)"
    if isinstance(exc, httpx.ConnectError):
        return f"no connection ({_cause(exc)})"
    if isinstance(exc, httpx.TimeoutException | TimeoutError):
        return "timed out"
    if isinstance(exc, httpx.RemoteProtocolError | httpx.ReadError):
        return f"the connection closed mid-answer ({exc or type(exc).__name__})"
    return f"{type(exc).__name__}: {exc}"


def _reason(body: bytes) -> str:
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
    return text[:300]


class _Answer:
    """The response of one stream's POST, read with h11 from its own asyncio connection: what
    :meth:`Client._read` reads of an httpx response (status, headers, the raw body in pieces)."""

    def __init__(self, conn: h11.Connection, head: h11.Response, reader: asyncio.StreamReader) -> None:
        self.conn, self.reader = conn, reader
        self.status_code = head.status_code
        self.headers = httpx.Headers([(k.decode("latin-1"), v.decode("latin-1")) for k, v in head.headers])

    async def aiter_raw(self) -> AsyncIterator[bytes]:
        while True:
            try:
                event = self.conn.next_event()
            except h11.RemoteProtocolError as exc:
                raise httpx.RemoteProtocolError(str(exc)) from exc
            if event is h11.NEED_DATA:
                try:
                    data = await self.reader.read(65536)
                except OSError as exc:
                    raise httpx.ReadError(str(exc) or type(exc).__name__) from exc
                try:
                    self.conn.receive_data(data)
                except h11.RemoteProtocolError as exc:
                    raise httpx.RemoteProtocolError(str(exc)) from exc
            elif isinstance(event, h11.Data):
                yield bytes(event.data)
            else:  # the end of the message, or of the connection
                return

    async def aiter_bytes(self) -> AsyncIterator[bytes]:
        encoding = self.headers.get("content-encoding", "identity").lower()
        if encoding not in ("gzip", "deflate"):
            raise httpx.DecodingError(f"content-encoding {encoding} is not read (tp4 asks for identity)")
        decoder = zlib.decompressobj(zlib.MAX_WBITS | 32)  # gzip or zlib, by its header
        async for raw in self.aiter_raw():
            if out := decoder.decompress(raw):
                yield out

    async def aread(self) -> bytes:
        return b"".join([chunk async for chunk in self.aiter_raw()])


class Client:
    """The API of one run: the key in the Authorization header only, no proxy consulted
    (``trust_env=False``: a request goes to the address given). The short requests (the model,
    the load) share httpx's kept-alive connections (``http``); every stream opens one of its own
    and closes it when done (:meth:`_stream`)."""

    def __init__(self, url: str, model: str, key: Secret | None, *, timeout: float, connections: int) -> None:
        self.url, self.model, self.timeout = url.rstrip("/"), model, timeout
        headers = {"accept-encoding": "identity", "user-agent": "tp4-bench"}
        if key is not None:
            headers["authorization"] = "Bearer " + key.reveal()
        common: dict[str, Any] = {
            "base_url": self.url,
            "headers": headers,
            "trust_env": False,
            "timeout": httpx.Timeout(timeout, connect=min(timeout, 10.0)),
        }
        self.http = httpx.AsyncClient(limits=httpx.Limits(max_connections=4, max_keepalive_connections=4), **common)
        # the streams' own connections (see _stream): where to, and the head of every POST
        split = urllib.parse.urlsplit(self.url)
        self._tls = ssl.create_default_context() if split.scheme == "https" else None
        self._host = split.hostname or "localhost"
        self._port = split.port or (443 if self._tls else 80)
        self._target = split.path.rstrip("/") + CHAT
        self._head = [("host", split.netloc), ("content-type", "application/json"), *headers.items()]
        self.extended = True  # min_tokens / ignore_eos / stop accepted (until an HTTP 400 says otherwise)
        self.fell_back = False

    async def close(self) -> None:
        await self.http.aclose()

    async def get_json(self, path: str, timeout: float = 5.0) -> tuple[int, object]:
        """(status, JSON body or None) of a GET; a connection error is a Tp4Error naming the URL."""
        try:
            resp = await self.http.get(path, timeout=timeout)
        except httpx.HTTPError as exc:
            raise Tp4Error(
                f"{self.url}{path}: {_message(exc)}; fix: check --url (or the profile's line.api) and that the API is up"
            ) from None
        if resp.status_code != 200:
            return resp.status_code, None
        try:
            return 200, resp.json()
        except ValueError:
            return 200, None

    async def check(self) -> str:
        """The served model's name from /v1/models, proving the endpoint answers; an endpoint
        that does not answer, or refuses the key, is a Tp4Error (exit 1)."""
        status, doc = await self.get_json("/v1/models", timeout=min(self.timeout, 15.0))
        if status == 401:
            raise Tp4Error(
                f"{self.url}/v1/models: the API key was refused or is missing (HTTP 401); "
                "fix: give the line's key (--api-key-file FILE with --url; the profile's api.key_file with --profile)"
            )
        if status != 200 or not isinstance(doc, dict) or not isinstance(doc.get("data"), list):
            raise Tp4Error(
                f"{self.url}/v1/models: HTTP {status}, not an OpenAI-compatible model list; fix: point --url at the API (http://HOST:PORT)"
            )
        ids = [m.get("id") for m in doc["data"] if isinstance(m, dict) and isinstance(m.get("id"), str)]
        if not ids:
            raise Tp4Error(f"{self.url}/v1/models: no model is served; fix: start the line (`tp4 serve`)")
        return str(ids[0])

    def body(self, prompt: str, max_tokens: int, *, exact: bool) -> dict[str, object]:
        body: dict[str, object] = {
            "model": self.model,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
            "chat_template_kwargs": dict(NO_THINKING),
        }
        if exact and self.extended:
            body.update({"min_tokens": max_tokens, "ignore_eos": True, "stop": []})
        else:
            body["top_p"] = 1
        return body

    async def stream(
        self,
        index: int,
        prompt: str,
        max_tokens: int,
        *,
        exact: bool = True,
        timeout: float | None = None,
        on_event: Callable[[], None] | None = None,
    ) -> StreamResult:
        """One streamed completion of ``prompt``; ``exact`` asks for exactly ``max_tokens`` tokens
        (min_tokens, ignore_eos, stop []; retried without them on HTTP 400, as sparkDash does).
        Errors are recorded in the result, never raised."""
        limit = self.timeout if timeout is None else timeout
        while True:
            extended = exact and self.extended
            r = StreamResult(index, prompt, max_tokens, extended)
            try:
                async with asyncio.timeout(limit):
                    retry = await self._stream(r, exact, limit, on_event)
            except (httpx.HTTPError, TimeoutError, OSError) as exc:
                r.error = _message(exc) if not isinstance(exc, TimeoutError) else f"no whole answer within {limit:g} s"
                retry = False
            if r.t_end is None:
                r.t_end = time.perf_counter()
            if not retry:
                return r

    async def _stream(self, r: StreamResult, exact: bool, limit: float, on_event: Callable[[], None] | None) -> bool:
        payload = json.dumps(self.body(r.prompt, r.max_tokens, exact=exact)).encode()
        conn = h11.Connection(h11.CLIENT)
        head = [*self._head, ("content-length", str(len(payload)))]
        clock = time.perf_counter
        r.t0 = clock()
        try:
            async with asyncio.timeout(min(limit, 10.0)):
                reader, writer = await asyncio.open_connection(
                    self._host, self._port, ssl=self._tls, server_hostname=self._host if self._tls else None
                )
        except TimeoutError as exc:
            raise httpx.ConnectTimeout("timed out") from exc
        except OSError as exc:
            raise httpx.ConnectError(str(exc) or type(exc).__name__) from exc
        try:
            writer.write(
                conn.send(h11.Request(method="POST", target=self._target, headers=head))
                + conn.send(h11.Data(data=payload))
                + conn.send(h11.EndOfMessage())
            )
            while True:
                try:
                    event = conn.next_event()
                except h11.RemoteProtocolError as exc:
                    raise httpx.RemoteProtocolError(str(exc)) from exc
                if event is h11.NEED_DATA:
                    try:
                        data = await reader.read(65536)
                    except OSError as exc:
                        raise httpx.ReadError(str(exc) or type(exc).__name__) from exc
                    try:
                        conn.receive_data(data)
                    except h11.RemoteProtocolError as exc:
                        raise httpx.RemoteProtocolError(str(exc)) from exc
                elif isinstance(event, h11.Response):
                    return await self._read(r, _Answer(conn, event, reader), on_event)
                elif isinstance(event, h11.ConnectionClosed):
                    raise httpx.RemoteProtocolError("the server closed the connection without an answer")
        finally:
            writer.close()

    async def _read(self, r: StreamResult, resp: _Answer, on_event: Callable[[], None] | None) -> bool:
        """The answer of one stream (its status, its events), into ``r``; True: send it again
        without min_tokens/ignore_eos/stop."""
        clock = time.perf_counter
        loads = json.loads
        r.status = resp.status_code
        r.headers = {k: v for k, v in resp.headers.items() if k.lower() in _HEADERS_KEPT}
        if resp.status_code != 200:
            body = await resp.aread()
            if resp.status_code == 400 and r.extended:
                self.extended, self.fell_back = False, True  # the engine refused min_tokens/ignore_eos/stop
                return True
            r.error = f"HTTP {resp.status_code}: {_reason(body)}"
            return False
        splitter = SseSplitter()
        encoded = resp.headers.get("content-encoding", "identity").lower() not in ("", "identity")
        chunks = resp.aiter_bytes() if encoded else resp.aiter_raw()
        async for raw in chunks:
            now = clock()
            for data in splitter.feed(raw):
                if data == b"[DONE]":
                    r.done = True
                    break
                r.events += 1
                if r.first_data is None:
                    r.first_data = data[:PREVIEW].decode("utf-8", "replace")
                try:
                    doc = loads(data)
                except ValueError:
                    r.error = f"SSE event {r.events} is not JSON"
                    return False
                if not isinstance(doc, dict):
                    continue
                if doc.get("error"):
                    r.error = f"the stream reported an error: {_reason(data)}"
                    return False
                if r.completion_id is None and isinstance(doc.get("id"), str):
                    r.completion_id = doc["id"]
                usage = doc.get("usage")
                if isinstance(usage, dict):
                    r.usage = {k: v for k, v in usage.items() if isinstance(v, int) and not isinstance(v, bool)}
                choices = doc.get("choices")
                if not choices or not isinstance(choices, list) or not isinstance(choices[0], dict):
                    continue
                choice = choices[0]
                delta = choice.get("delta")
                if isinstance(delta, dict):
                    content = delta.get("content")
                    reasoning = delta.get("reasoning_content") or delta.get("reasoning")
                    visible = False
                    if content and isinstance(content, str):
                        if r.t_first_content is None:
                            r.t_first_content = now
                        r.content.append(content)
                        r.visible_chars += len(content)
                        visible = True
                    if reasoning and isinstance(reasoning, str):
                        r.reasoning_chunks += 1
                        r.visible_chars += len(reasoning)
                        visible = True
                    if visible:
                        if r.t_first is None:
                            r.t_first = now
                        r.t_last = now
                finish = choice.get("finish_reason")
                if isinstance(finish, str):
                    r.finish_reason = finish
            if on_event is not None:
                on_event()
            if r.done:
                break
        r.t_end = clock()
        if not r.done:
            r.error = "the stream ended without data: [DONE]"
        return False


# --- the engine's load: foreign traffic ------------------------------------------------------------


@dataclass
class Watch:
    """What the load endpoint said while a level ran: the most requests the engine held (running
    plus waiting) and the most running, over ``samples`` reads; None when nothing was read."""

    samples: int = 0
    max_in_engine: int | None = None
    max_running: int | None = None
    max_waiting: int | None = None

    def add(self, running: int, waiting: int) -> None:
        self.samples += 1
        self.max_running = max(self.max_running or 0, running)
        self.max_waiting = max(self.max_waiting or 0, waiting)
        self.max_in_engine = max(self.max_in_engine or 0, running + waiting)

    def invalid(self, sent: int) -> str | None:
        """The reason a level that sent ``sent`` requests is invalid (foreign traffic), or None."""
        if self.max_in_engine is None or self.max_in_engine <= sent:
            return None
        return (
            f"foreign traffic: up to {self.max_in_engine} requests were in the engine (at most {self.max_running} running, "
            f"{self.max_waiting} waiting) while this level sent {sent}"
        )


def _ints(entry: dict[str, object], *keys: str) -> list[int] | None:
    out: list[int] = []
    for key in keys:
        value = entry.get(key)
        if not isinstance(value, int) or isinstance(value, bool):
            return None
        out.append(value)
    return out


class LoadWatcher:
    """Reads the engine's running requests: SGLang's ``GET /v1/loads`` (``loads[].num_running_reqs``
    and ``num_waiting_reqs``, summed over its data-parallel ranks), else ``GET /get_load``
    (``num_reqs`` − ``num_waiting_reqs``). ``path`` is None when neither answers (a router, a
    server without them): levels are then not checked."""

    INTERVAL = 0.25

    def __init__(self, client: Client) -> None:
        self.client = client
        self.path: str | None = None

    async def probe(self) -> str | None:
        for path in ("/v1/loads", "/get_load"):
            self.path = path
            try:
                if await self.read() is not None:
                    return path
            except Tp4Error:
                pass
        self.path = None
        return None

    async def read(self) -> tuple[int, int] | None:
        """(running, waiting) now, or None when the endpoint gave no load."""
        if self.path is None:
            return None
        status, doc = await self.client.get_json(self.path, timeout=2.0)
        if status != 200:
            return None
        running = waiting = 0
        if self.path == "/v1/loads":
            entries = doc.get("loads") if isinstance(doc, dict) else None
            if not isinstance(entries, list) or not entries:
                return None
            for e in entries:
                values = _ints(e, "num_running_reqs", "num_waiting_reqs") if isinstance(e, dict) else None
                if values is None:
                    return None
                running, waiting = running + values[0], waiting + values[1]
            return running, waiting
        entries = doc if isinstance(doc, list) else [doc] if isinstance(doc, dict) else None
        if not entries:
            return None
        for e in entries:
            values = _ints(e, "num_reqs", "num_waiting_reqs") if isinstance(e, dict) else None
            if values is None:
                return None
            running, waiting = running + values[0] - values[1], waiting + values[1]
        return running, waiting

    async def idle(self, seconds: float = 2.0) -> None:
        """Wait (at most ``seconds``) until the engine holds no request: the last level's
        streams may still be closing on the server's side after their [DONE]."""
        deadline = time.monotonic() + seconds
        while self.path is not None and time.monotonic() < deadline:
            try:
                now = await self.read()
            except Tp4Error:
                return
            if now is None or now == (0, 0):
                return
            await asyncio.sleep(0.05)

    async def watch(self, into: Watch, stop: asyncio.Event) -> None:
        """Sample every INTERVAL until ``stop`` is set (one read after it too). The first read
        comes after one INTERVAL, not while the level's requests are being sent."""
        try:
            await asyncio.wait_for(stop.wait(), self.INTERVAL)
        except TimeoutError:
            pass
        while self.path is not None:
            try:
                now = await self.read()
            except Tp4Error:
                now = None
            if now is not None:
                into.add(*now)
            if stop.is_set():
                return
            try:
                await asyncio.wait_for(stop.wait(), self.INTERVAL)
            except TimeoutError:
                pass


async def wave(
    client: Client,
    watcher: LoadWatcher,
    prompts: list[str],
    max_tokens: int,
    *,
    exact: bool = True,
    timeout: float | None = None,
    on_event: Callable[[], None] | None = None,
) -> tuple[list[StreamResult], Watch, float, float]:
    """All ``prompts`` at once (one stream each), the load watched meanwhile. Returns the
    streams, the watch, and the wave's start and end on the perf_counter clock."""
    await watcher.idle()
    watch = Watch()
    stop = asyncio.Event()
    watching = asyncio.create_task(watcher.watch(watch, stop))
    start = time.perf_counter()
    try:
        streams = await asyncio.gather(
            *(
                client.stream(i, p, max_tokens, exact=exact, timeout=timeout, on_event=on_event)
                for i, p in enumerate(prompts)
            )
        )
    finally:
        end = time.perf_counter()
        stop.set()
        await watching
    return list(streams), watch, start, end
