"""Benchmark of `tp4 bench`'s load generator (tp4.measuring.throughput.loadgen): how many streamed chunks (SSE
events) one tp4 process takes in at c16, against a server that streams as fast as it can.

    .venv/bin/python bench/bench_loadgen.py [--runs 3] [--concurrency 16] [--events 2000] [--paced 6000]
                                            [--server minimal|standin]

The server runs in a process of its own:

  minimal   (default) an asyncio SSE server in this script: each request gets a role chunk, then
            --events chunks shaped like SGLang's (``chat.completion.chunk`` JSON, three tokens of
            text each, as the line's speculative decoding sends), the usage chunk and
            ``data: [DONE]``, each chunk its own write with TCP_NODELAY
  standin   the stand-in engine (tests/standin/engine.py) in its engine role with
            TP4_STANDIN_DECODE_TPS=0 (as fast as it can); a thread per stream, so it is slower
            than the minimal server, and it may be the bottleneck rather than the client

The client is what `tp4 bench decode` runs: tp4.measuring.throughput.loadgen.Client and wave() at
--concurrency streams, each asking for exactly 3 x --events tokens; every stream's usage
must say so (a counting check). Measured per run: chunks/s = all streams' SSE data events /
the wave's wall time, and the client's CPU seconds per 1000 chunks (time.process_time of this
process, which runs only the client while the server has its own).

Two runs of each kind: ``burst``, the server writing events as fast as it can (reads then carry
many events each), and ``paced``, the server offering --paced events/s in all (default 6000, 1.2x
the goal), each stream's events evenly spaced, so that most reads carry one event: the client's
cost per read, not per batch, is then what is measured.

Goals (medians over --runs):

  chunks/s        burst, at c16, >= 5000 (issue 13's performance goal)
  paced chunks/s  paced at 6000/s offered, at c16: >= 5000 taken in (the client keeps up)
  x line c16      chunks/s over what the line's best c16 needs: the seed's 659.9 tok/s (json, c16)
                  at ~3 tokens per event is ~220 events/s (printed, not judged)

The two cores of this machine are shared by the server and the client (and whatever else runs):
on a busy machine the numbers drop. Exits 1 when a goal is missed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "python")]

from tp4.measuring.throughput.loadgen import Client, LoadWatcher, wave  # noqa: E402

GOAL_CHUNKS = 5000.0
LINE_C16_TPS = 659.9  # the seed's best c16 aggregate (json), tok/s
TOKENS_PER_EVENT = 3
MODEL = "bench-model"


@dataclass(frozen=True)
class Goal:
    """One measurement against its goal (value >= goal); ``binding`` False: printed, not judged."""

    name: str
    value: float
    goal: float
    unit: str = ""
    note: str = ""
    binding: bool = True

    @property
    def met(self) -> bool:
        return self.value >= self.goal

    def line(self) -> str:
        verdict = ("ok" if self.met else "MISSED") if self.binding else "not judged"
        text = f"{self.name:<16} {self.value:11.1f}{self.unit}  goal >= {self.goal:g}{self.unit}  {verdict}"
        return text + (f"  ({self.note})" if self.note else "")


def report(goals: Sequence[Goal], out: Callable[[str], None] = print) -> int:
    """Print every goal; 1 when a binding one is missed, else 0."""
    for g in goals:
        out(g.line())
    missed = [g.name for g in goals if g.binding and not g.met]
    if missed:
        out(f"missed: {', '.join(missed)}")
    return 1 if missed else 0


# --- the minimal server ---------------------------------------------------------------------------


def _chunk(ident: str, delta: dict[str, object], finish: str | None, **extra: object) -> bytes:
    doc = {
        "id": ident,
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": MODEL,
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish, "matched_stop": None}],
        **extra,
    }
    return b"data: " + json.dumps(doc, separators=(",", ":")).encode() + b"\n\n"


async def _serve_one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":", 1)[1])
            raw = await reader.readexactly(length) if length else b""
            path = head.split(b" ", 2)[1]
            if path != b"/v1/chat/completions":
                body = json.dumps(
                    {"object": "list", "data": [{"id": MODEL, "object": "model"}]}
                    if path == b"/v1/models"
                    else {"detail": "Not Found"}
                ).encode()
                status = b"200 OK" if path == b"/v1/models" else b"404 Not Found"
                writer.write(
                    b"HTTP/1.1 "
                    + status
                    + b"\r\nContent-Type: application/json\r\nContent-Length: "
                    + str(len(body)).encode()
                    + b"\r\n\r\n"
                    + body
                )
                await writer.drain()
                continue
            req = json.loads(raw)
            tokens = int(req["max_tokens"])
            ident = os.urandom(16).hex()
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream; charset=utf-8\r\nCache-Control: no-cache\r\n"
                b"Connection: close\r\n\r\n"
            )
            writer.write(_chunk(ident, {"role": "assistant", "content": "", "reasoning_content": None}, None))
            event = _chunk(ident, {"content": " the hash"}, None)
            gap = float(req.get("x_bench_gap") or 0)  # paced: seconds between two events of a stream
            first = time.monotonic()
            for j in range(tokens // TOKENS_PER_EVENT):
                writer.write(event)
                await writer.drain()
                if gap:
                    await asyncio.sleep(max(0.0, first + (j + 1) * gap - time.monotonic()))
                else:
                    await asyncio.sleep(0)  # one write per event: let the kernel send it
            writer.write(
                _chunk(
                    ident,
                    {},
                    "length",
                    usage={"prompt_tokens": 32, "completion_tokens": tokens, "total_tokens": tokens + 32},
                )
            )
            writer.write(b"data: [DONE]\n\n")
            await writer.drain()
            break
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


def serve_minimal(port: int) -> None:
    async def main() -> None:
        server = await asyncio.start_server(_serve_one, "127.0.0.1", port, backlog=256)
        print("ready", flush=True)
        async with server:
            await server.serve_forever()

    asyncio.run(main())


def start_server(kind: str, port: int) -> subprocess.Popen[bytes]:
    if kind == "minimal":
        argv = [sys.executable, __file__, "--serve", str(port)]
        env = dict(os.environ)
    else:
        argv = [
            sys.executable,
            "-u",
            str(REPO / "tests/standin/engine.py"),
            "python",
            "-m",
            "sglang.launch_server",
            "--model-path",
            "/m",
            "--served-model-name",
            MODEL,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ]
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "TP4_STANDIN_PACE": "0",
            "TP4_STANDIN_DECODE_TPS": "0",
            "TP4_STANDIN_TOKENS_PER_EVENT": str(TOKENS_PER_EVENT),
        }
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc
        except OSError:
            if proc.poll() is not None:
                break
            time.sleep(0.05)
    stop_server(proc)
    sys.exit(f"the {kind} server did not start on port {port}")


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


# --- the client ------------------------------------------------------------------------------------


class PacedClient(Client):
    """The load generator's client, its requests asking the minimal server for a pace."""

    gap = 0.0

    def body(self, prompt: str, max_tokens: int, *, exact: bool) -> dict[str, object]:
        return {**super().body(prompt, max_tokens, exact=exact), "x_bench_gap": self.gap}


async def one_run(url: str, concurrency: int, events: int, paced: float = 0.0) -> tuple[float, float, int]:
    """(chunks/s, client CPU seconds per 1000 chunks, chunks) of one wave; ``paced``: the
    server sends ``paced`` events/s in all (each stream its share, evenly spaced)."""
    client = PacedClient(url, MODEL, None, timeout=120.0, connections=concurrency)
    client.gap = concurrency / paced if paced else 0.0
    try:
        watcher = LoadWatcher(client)  # not probed: the minimal server has no load endpoint
        tokens = events * TOKENS_PER_EVENT
        cpu = time.process_time()
        streams, _, start, end = await wave(
            client, watcher, [f"[bench {i}]\ncount" for i in range(concurrency)], tokens
        )
        cpu = time.process_time() - cpu
    finally:
        await client.close()
    bad = [s for s in streams if s.error or s.completion_tokens != tokens or s.usage is None]
    if bad:
        sys.exit(f"stream {bad[0].index}: {bad[0].error or f'{bad[0].completion_tokens} tokens, not {tokens}'}")
    chunks = sum(s.events for s in streams)
    return chunks / (end - start), cpu / chunks * 1000, chunks


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--events", type=int, default=2000, help="content events per stream")
    ap.add_argument("--server", choices=("minimal", "standin"), default="minimal")
    ap.add_argument(
        "--paced", type=float, default=6000.0, help="events/s the paced run offers in all (0: no paced run)"
    )
    ap.add_argument("--paced-seconds", type=float, default=3.0, help="how long a paced run lasts")
    ap.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    opts = ap.parse_args()
    if opts.serve:
        serve_minimal(opts.serve)
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    server = start_server(opts.server, port)
    url = f"http://127.0.0.1:{port}"
    results: dict[str, tuple[float, float]] = {}
    modes = [("burst", 0.0)] + ([("paced", opts.paced)] if opts.paced and opts.server == "minimal" else [])
    try:
        asyncio.run(one_run(url, opts.concurrency, 50))  # warm-up
        for mode, pace in modes:
            rates: list[float] = []
            cpus: list[float] = []
            events = opts.events if not pace else max(1, int(pace * opts.paced_seconds / opts.concurrency))
            for run in range(opts.runs):
                rate, cpu, chunks = asyncio.run(one_run(url, opts.concurrency, events, pace))
                rates.append(rate)
                cpus.append(cpu)
                print(
                    f"{mode} run {run + 1}: {chunks} chunks at c{opts.concurrency}: {rate:.0f} chunks/s, "
                    f"client CPU {cpu * 1000:.1f} ms per 1000 chunks"
                )
            results[mode] = (statistics.median(rates), statistics.median(cpus))
    finally:
        stop_server(server)
    need = LINE_C16_TPS / TOKENS_PER_EVENT
    rate, cpu = results["burst"]
    print(
        f"server: {opts.server}; client: one tp4 process (tp4.measuring.throughput.loadgen), c{opts.concurrency}, medians of {opts.runs}"
    )
    goals = [
        Goal(
            "chunks/s",
            rate,
            GOAL_CHUNKS,
            note=f"burst: as fast as the server sends; {rate / GOAL_CHUNKS:.2f}x the goal; "
            f"client CPU {cpu * 1000:.1f} ms per 1000 chunks",
        ),
    ]
    if "paced" in results:
        prate, pcpu = results["paced"]
        goals.append(
            Goal(
                "paced chunks/s",
                prate,
                GOAL_CHUNKS,
                note=f"{opts.paced:g} events/s offered, evenly spaced (about one event per read); client CPU "
                f"{pcpu * 1000:.1f} ms per 1000 chunks, i.e. at most {1e6 / (pcpu * 1000):.0f} chunks per CPU second",
            )
        )
    goals.append(
        Goal(
            "x line c16",
            rate / need,
            1.0,
            "x",
            binding=False,
            note=f"the line's best c16 needs {LINE_C16_TPS} tok/s / {TOKENS_PER_EVENT} per event = {need:.0f} events/s",
        )
    )
    sys.exit(report(goals))


if __name__ == "__main__":
    main()
