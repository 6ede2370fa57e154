"""Downloads: hash while streaming, retry with backoff, write to a temporary file and rename it into
place only when the sha256 matches. An interrupted or tampered download leaves nothing behind.

``requests`` is imported when the first download starts, so transforms and offline fetches never
need it. Environment knobs (for mirrors and tests):

* ``TP4_SOURCES_MIRROR=URL``: fetch ``https://HOST/PATH`` from ``URL/HOST/PATH`` instead;
* ``TP4_SOURCES_RETRIES`` (default 4) and ``TP4_SOURCES_BACKOFF`` (seconds, default 1; the n-th
  retry waits BACKOFF * 2**n).
"""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, TYPE_CHECKING

from tp4.core.errors import Tp4Error

if TYPE_CHECKING:
    import requests

CHUNK = 1 << 20
RETRY_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})


def mirror_url(url: str, mirror: str | None = None) -> str:
    mirror = mirror if mirror is not None else os.environ.get("TP4_SOURCES_MIRROR", "")
    if not mirror or "://" not in url:
        return url
    return mirror.rstrip("/") + "/" + url.split("://", 1)[1]


def _retries() -> int:
    return int(os.environ.get("TP4_SOURCES_RETRIES", "4"))


def _backoff() -> float:
    return float(os.environ.get("TP4_SOURCES_BACKOFF", "1"))


def _mib(n: float) -> str:
    return f"{n / (1 << 20):.1f} MiB"


class Progress:
    """Progress on stderr: a live line on a terminal, plain start/end lines otherwise."""

    def __init__(self, label: str, stream: IO[str] | None = None, quiet: bool = False) -> None:
        self.label = label
        self.stream = stream or sys.stderr
        self.quiet = quiet
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.total: int | None = None
        self.done = 0
        self.started = time.monotonic()
        self.shown = 0.0

    def start(self, url: str, total: int | None, attempt: int) -> None:
        self.total, self.done, self.started = total, 0, time.monotonic()
        if self.quiet:
            return
        again = f" (attempt {attempt + 1})" if attempt else ""
        size = f", {_mib(total)}" if total else ""
        if not self.tty:
            print(f"fetching {self.label}{again}: {url}{size}", file=self.stream, flush=True)

    def update(self, n: int) -> None:
        self.done += n
        if self.quiet or not self.tty:
            return
        now = time.monotonic()
        if now - self.shown < 0.1:
            return
        self.shown = now
        rate = self.done / max(now - self.started, 1e-6)
        pct = f" {100 * self.done // self.total:3d}%" if self.total else ""
        of = f" / {_mib(self.total)}" if self.total else ""
        print(f"\r{self.label}: {_mib(self.done)}{of}{pct} {_mib(rate)}/s\033[K", end="", file=self.stream, flush=True)

    def finish(self, note: str) -> None:
        if self.quiet:
            return
        seconds = time.monotonic() - self.started
        line = f"{self.label}: {_mib(self.done)} in {seconds:.1f} s, {note}"
        print(("\r" + line + "\033[K") if self.tty else line, file=self.stream, flush=True)


class _Retry(Exception):
    pass


def host_of(url: str) -> str:
    """The host part of a URL (``https://user@host:443/p`` -> ``host``)."""
    netloc = url.split("://", 1)[-1].split("/", 1)[0].rsplit("@", 1)[-1]
    if netloc.startswith("["):
        return netloc[1:].split("]", 1)[0]
    return netloc.split(":", 1)[0]


def offline_error(
    host: str, what: str, alternative: str = "point TP4_SOURCES_MIRROR at a reachable mirror"
) -> Tp4Error:
    return Tp4Error(
        f"{what}: cannot resolve {host}: this machine looks offline (no DNS answer for the name); "
        f"run it on a machine with network access, or {alternative}"
    )


def unresolvable(exc: BaseException) -> bool:
    """The error, or one it was raised from, is a failed name lookup: retrying cannot help."""
    import socket

    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, socket.gaierror) or type(e).__name__ == "NameResolutionError":
            return True
        # requests wraps urllib3's MaxRetryError, whose `reason` holds the real cause
        todo += [
            e.__cause__,
            e.__context__,
            getattr(e, "reason", None) if isinstance(getattr(e, "reason", None), BaseException) else None,
        ]
        todo += [a for a in e.args if isinstance(a, BaseException)]
    return False


def _reason(exc: BaseException, url: str) -> str:
    """A short cause for a network error (requests' own text nests three exceptions deep)."""
    text = str(exc)
    host = url.split("://", 1)[-1].split("/", 1)[0]
    for needle, reason in (
        ("Failed to resolve", f"cannot resolve {host} (no network or DNS?)"),
        ("Name or service not known", f"cannot resolve {host} (no network or DNS?)"),
        ("Connection refused", f"connection to {host} refused"),
        ("timed out", f"{host} timed out"),
        ("IncompleteRead", "the connection closed before the end of the body"),
        ("Connection broken", "the connection broke during the body"),
    ):
        if needle in text:
            return reason
    return f"{type(exc).__name__}: {text[:200]}"


def _session() -> requests.Session:
    import requests

    session = requests.Session()
    # the bytes as served: a transparently decompressed body would hash differently
    session.headers["Accept-Encoding"] = "identity"
    session.headers["User-Agent"] = "tp4-sources"
    return session


def _stream(
    url: str,
    sink: Callable[[bytes], None],
    reset: Callable[[], None],
    *,
    label: str,
    progress: Progress,
    timeout: float = 60.0,
    headers: dict[str, str] | None = None,
) -> int:
    """GET ``url`` into ``sink`` with retries; ``reset`` discards a partial attempt. Returns bytes."""
    import requests

    real = mirror_url(url)
    retries, backoff = _retries(), _backoff()
    session = _session()
    last = ""
    for attempt in range(retries + 1):
        if attempt:
            time.sleep(backoff * 2 ** (attempt - 1))
        reset()
        try:
            with session.get(real, stream=True, timeout=(15, timeout), headers=headers) as resp:
                if resp.status_code in RETRY_STATUS:
                    raise _Retry(f"HTTP {resp.status_code}")
                if resp.status_code != 200:
                    raise Tp4Error(f"{label}: {real} answered HTTP {resp.status_code} {resp.reason}; is the URL right?")
                length = resp.headers.get("Content-Length")
                total = int(length) if length and length.isdigit() else None
                progress.start(real, total, attempt)
                received = 0
                for chunk in resp.raw.stream(CHUNK, decode_content=False):
                    sink(chunk)
                    received += len(chunk)
                    progress.update(len(chunk))
                if total is not None and received != total:
                    raise _Retry(f"connection closed after {received} of {total} bytes")
                return received
        except _Retry as exc:
            last = str(exc)
        except (
            requests.exceptions.ConnectionError,
            requests.exceptions.Timeout,
            requests.exceptions.ChunkedEncodingError,
        ) as exc:
            if unresolvable(exc):
                raise offline_error(host_of(real), f"{label}: download of {real}") from None
            last = _reason(exc, real)
        except Exception as exc:  # urllib3 errors raised from raw.stream()
            if type(exc).__module__.startswith("urllib3"):
                if unresolvable(exc):
                    raise offline_error(host_of(real), f"{label}: download of {real}") from None
                last = _reason(exc, real)
            else:
                raise
        if not progress.quiet:
            print(
                ("\n" if progress.tty else "")
                + f"{label}: {last}; "
                + ("retrying" if attempt < retries else "giving up"),
                file=progress.stream,
                flush=True,
            )
    raise Tp4Error(f"{label}: download of {real} failed after {retries + 1} attempts ({last})")


def download(
    url: str, dest: Path, sha256: str | None, *, label: str, quiet: bool = False, headers: dict[str, str] | None = None
) -> str:
    """Download to ``dest``; with ``sha256`` the file only appears if its hash matches.

    Returns the sha256 (hex). On any failure nothing is left at ``dest`` or beside it.
    """
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".part", dir=dest.parent)
    tmp = Path(tmp_name)
    progress = Progress(label, quiet=quiet)
    try:
        with os.fdopen(fd, "wb") as out:
            state = {"h": hashlib.sha256()}

            def sink(chunk: bytes) -> None:
                out.write(chunk)
                state["h"].update(chunk)

            def reset() -> None:
                out.seek(0)
                out.truncate()
                state["h"] = hashlib.sha256()

            _stream(url, sink, reset, label=label, progress=progress, headers=headers)
            out.flush()
            os.fsync(out.fileno())
        actual = state["h"].hexdigest()
        if sha256 is not None and actual != sha256:
            raise Tp4Error(
                f"{label}: sha256 mismatch for {mirror_url(url)}\n  expected {sha256}\n  got      {actual}\n"
                "the download was discarded; the pin is unchanged"
            )
        os.replace(tmp, dest)
        progress.finish("sha256 ok" if sha256 else f"sha256 {actual}")
        return actual
    finally:
        if tmp.exists():
            tmp.unlink()


def hash_url(url: str, *, label: str, quiet: bool = False) -> tuple[str, int]:
    """Stream ``url`` through sha256 without writing anything; returns (hex, size)."""
    state = {"h": hashlib.sha256()}

    def reset() -> None:
        state["h"] = hashlib.sha256()

    progress = Progress(label, quiet=quiet)
    size = _stream(url, lambda chunk: state["h"].update(chunk), reset, label=label, progress=progress)
    progress.finish("hashed")
    return state["h"].hexdigest(), size


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        buf = bytearray(CHUNK)
        view = memoryview(buf)
        while n := f.readinto(buf):
            h.update(view[:n])
    return h.hexdigest()
