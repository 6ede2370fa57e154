"""A loopback HTTP server (127.0.0.1 only) serving generated files with failure modes:

* ``fail_first=N``: answer 503 to the first N requests of a path;
* ``cut_at=K`` (with ``cut_times``): send the full Content-Length, then K bytes, then close;
* ``tamper=True``: serve other bytes of the same length;
* GitHub API: ``/repos/OWNER/REPO/commits/REF`` answers ``{"sha": ...}`` from ``refs``.
Files on disk (``add_path``) go out with sendfile, for the benchmark.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
from collections import Counter
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


class _Server(ThreadingHTTPServer):
    def handle_error(self, request: object, client_address: object) -> None:
        # a client that hung up (tp4 closing a connection it no longer needs) is no server error;
        # socketserver would print its traceback into the stderr the test reads from tp4
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)  # type: ignore[arg-type]


@dataclass
class Served:
    data: bytes | None = None
    path: Path | None = None
    fail_first: int = 0
    cut_at: int | None = None
    cut_times: int = 1_000_000
    tamper: bool = False

    def size(self) -> int:
        return len(self.data) if self.data is not None else self.path.stat().st_size


class FileServer:
    def __init__(self) -> None:
        self.files: dict[str, Served] = {}
        self.refs: dict[tuple[str, str, str], object] = {}  # the "sha" answered: a str, or junk
        self.hits: Counter[str] = Counter()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # content ---------------------------------------------------------------------------------
    def add(self, path: str, data: bytes, **modes) -> str:
        self.files[path] = Served(data=data, **modes)
        return self.url(path)

    def add_path(self, path: str, file: Path) -> str:
        self.files[path] = Served(path=Path(file))
        return self.url(path)

    def add_ref(self, owner: str, repo: str, ref: str, sha: object) -> None:
        self.refs[(owner, repo, ref)] = sha

    # lifecycle -------------------------------------------------------------------------------
    @property
    def port(self) -> int:
        assert self._server is not None
        return self._server.server_address[1]

    def url(self, path: str = "") -> str:
        return f"http://127.0.0.1:{self.port}{path}" if self._server else path

    def __enter__(self) -> FileServer:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:  # quiet
                pass

            def do_GET(self) -> None:  # noqa: N802
                server.hits[self.path] += 1
                parts = self.path.strip("/").split("/")
                if len(parts) >= 5 and parts[0] == "repos" and parts[3] == "commits":
                    sha = server.refs.get((parts[1], parts[2], "/".join(parts[4:])))
                    body = json.dumps({"sha": sha} if sha else {"message": "No commit found"}).encode()
                    self._reply(200 if sha else 422, body, "application/json")
                    return
                served = server.files.get(self.path)
                if served is None:
                    self._reply(404, b"not found", "text/plain")
                    return
                n = server.hits[self.path]
                if n <= served.fail_first:
                    self._reply(503, b"try later", "text/plain")
                    return
                size = served.size()
                self.send_response(200)
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("Content-Length", str(size))
                self.end_headers()
                if served.cut_at is not None and n - served.fail_first <= served.cut_times:
                    data = served.data if served.data is not None else served.path.read_bytes()
                    self.wfile.write(data[: served.cut_at])
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                if served.data is not None:
                    data = served.data
                    if served.tamper:
                        data = bytes(b ^ 0x55 for b in data[:64]) + data[64:]
                    self.wfile.write(data)
                else:
                    with open(served.path, "rb") as f:
                        self.connection.sendfile(f)

            def _reply(self, code: int, body: bytes, ctype: str) -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self._server = _Server(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        assert self._server is not None
        self._server.shutdown()
        self._server.server_close()


def serve_directory_forever(root: str, port_file: str) -> None:
    """Serve every file under ``root`` at its relative path (the benchmark runs this in a child
    process so the server does not share the client's interpreter lock)."""
    server = FileServer()
    for dirpath, _, names in os.walk(root):
        for name in names:
            full = Path(dirpath, name)
            server.add_path("/" + str(full.relative_to(root)), full)
    with server:
        Path(port_file).write_text(str(server.port))
        threading.Event().wait()


if __name__ == "__main__":
    import sys

    serve_directory_forever(sys.argv[1], sys.argv[2])
