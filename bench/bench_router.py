"""Benchmark of the router's overhead (issue 14): `tp4 bench decode` at c16 through SGLang's
router (the pinned sglang-router, with the arguments `tp4 fleet serve` gives it) against the same
bench straight to the line behind it.

    .venv/bin/python bench/bench_router.py [--runs 3] [--tokens 256] [--decode-tps 41] [--per-event 3]

The line is the stand-in engine (tests/standin/engine.py) in its engine role on this machine,
paced like the line at c16: --decode-tps per stream (41 tok/s: the seed's best c16 aggregate,
659.9 tok/s, over 16 streams), --per-event tokens per SSE event (3, as speculative decoding sends
them), prefill at 5000 tok/s. The router runs here too, `python -c <tp4's launcher>` with
tp4.serving.fleet.router_args (round_robin, /health_generate, 30 s timeout, metrics on loopback), its
only worker that stand-in.

Each run is one `tp4 bench decode --levels 16 --prompt-types prose --warmup 1 --c1-runs 1` to the
router and one straight to the engine, in alternating order. Measured from the result files:
the c16 aggregate decode tok/s and the median TTFT.

Goals (medians over --runs):

  router / direct tok/s    >= 0.95   (at most 5 % lower aggregate through the router)
  added median TTFT        <= 5 ms   (router minus direct)

Everything shares this machine's two cores (engine, router, load generator). Exits 1 when a goal
is missed, 2 when the router is not installed (bash python/setup.sh --test installs it).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "python")]

from tp4.serving import fleet  # noqa: E402

ENGINE = REPO / "tests" / "standin" / "engine.py"
MODEL = "bench-model"


@dataclass(frozen=True)
class Goal:
    """A measurement against its bound: ``at_least`` (value >= bound) or at most."""

    name: str
    value: float
    bound: float
    at_least: bool
    unit: str = ""
    note: str = ""

    @property
    def met(self) -> bool:
        return self.value >= self.bound if self.at_least else self.value <= self.bound

    def line(self) -> str:
        op = ">=" if self.at_least else "<="
        text = f"{self.name:<22} {self.value:9.3f}{self.unit}  goal {op} {self.bound:g}{self.unit}  {'ok' if self.met else 'MISSED'}"
        return text + (f"  ({self.note})" if self.note else "")


def report(goals: Sequence[Goal], out: Callable[[str], None] = print) -> int:
    for g in goals:
        out(g.line())
    missed = [g.name for g in goals if not g.met]
    if missed:
        out(f"missed: {', '.join(missed)}")
    return 1 if missed else 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(
    what: str, ok: Callable[[], bool], proc: subprocess.Popen[bytes], log: Path, timeout: float = 60
) -> None:
    deadline = time.monotonic() + timeout
    while not ok():
        if proc.poll() is not None or time.monotonic() > deadline:
            sys.exit(f"bench_router: {what} did not come up; its log:\n{log.read_text(errors='replace')[-3000:]}")
        time.sleep(0.1)


def answers(url: str) -> bool:
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}).encode()
    req = urllib.request.Request(f"{url}/v1/chat/completions", data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status == 200
    except OSError:
        return False


def start(argv: Sequence[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen(list(argv), env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def bench(url: str, out: Path, tokens: int) -> tuple[float, float]:
    """One `tp4 bench decode` at c16: (aggregate decode tok/s, median TTFT ms)."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "tp4",
            "bench",
            "decode",
            "--url",
            url,
            "--model",
            MODEL,
            "--levels",
            "16",
            "--prompt-types",
            "prose",
            "--max-tokens",
            str(tokens),
            "--warmup",
            "1",
            "--c1-runs",
            "1",
            "--out",
            str(out),
        ],
        env={**os.environ, "PYTHONPATH": str(REPO / "python")},
        capture_output=True,
        text=True,
        timeout=600,
    )
    if proc.returncode != 0:
        sys.exit(f"bench_router: tp4 bench decode against {url} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    doc = json.loads((out / "result.json").read_text())
    level = next(lv for e in doc["decode"] for lv in e["job"]["results"] if lv["concurrency"] == 16)
    if level["streamsOk"] != 16:
        sys.exit(f"bench_router: {level['streamsFailed']} of 16 streams failed against {url}")
    return float(level["aggregateDecodeTps"]), float(level["medianTtftMs"])


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--decode-tps", type=float, default=41.0)
    parser.add_argument("--per-event", type=int, default=3)
    args = parser.parse_args()
    try:
        import sglang_router  # noqa: F401
    except ImportError:
        print(
            "bench_router: the router (sglang-router) is not installed in this Python; fix: bash python/setup.sh --test",
            file=sys.stderr,
        )
        sys.exit(2)

    with tempfile.TemporaryDirectory(prefix="tp4-bench-router-") as tmp_s:
        tmp = Path(tmp_s)
        eport, rport, mport = free_port(), free_port(), free_port()
        direct, routed = f"http://127.0.0.1:{eport}", f"http://127.0.0.1:{rport}"
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "TP4_STANDIN_PACE": "0",
            "TP4_STANDIN_DECODE_TPS": str(args.decode_tps),
            "TP4_STANDIN_TOKENS_PER_EVENT": str(args.per_event),
            "TP4_STANDIN_PREFILL_TPS": "5000",
        }
        engine = start(
            [
                sys.executable,
                "-u",
                str(ENGINE),
                "python",
                "-m",
                "sglang.launch_server",
                "--model-path",
                "/models/x",
                "--served-model-name",
                MODEL,
                "--host",
                "127.0.0.1",
                "--port",
                str(eport),
            ],
            env,
            tmp / "engine.log",
        )
        router: subprocess.Popen[bytes] | None = None
        try:
            wait_until("the stand-in engine", lambda: answers(direct), engine, tmp / "engine.log")
            r = fleet.Router(bind="127.0.0.1", port=rport, metrics=fleet.Metrics(port=mport))
            argv = [
                sys.executable,
                "-c",
                fleet.LAUNCHER,
                "",
                fleet.ROUTERS[r.kind].module,
                *fleet.router_args(SimpleNamespace(router=r), [direct]),
            ]  # type: ignore[arg-type]
            router = start(argv, {**os.environ}, tmp / "router.log")
            wait_until("the router", lambda: answers(routed), router, tmp / "router.log", timeout=90)
            print(
                f"line: stand-in engine at {direct} ({args.decode_tps:g} tok/s per stream, {args.per_event} tokens per event); "
                f"router: sglang-router at {routed}, round_robin, /health_generate",
                flush=True,
            )
            ratios, added = [], []
            for i in range(args.runs):
                order = (
                    [("direct", direct), ("router", routed)] if i % 2 == 0 else [("router", routed), ("direct", direct)]
                )
                got = {name: bench(url, tmp / f"{name}-{i}", args.tokens) for name, url in order}
                ratio = got["router"][0] / got["direct"][0]
                ttft = got["router"][1] - got["direct"][1]
                ratios.append(ratio)
                added.append(ttft)
                print(
                    f"run {i + 1}: direct {got['direct'][0]:.1f} tok/s, TTFT {got['direct'][1]:.1f} ms; "
                    f"router {got['router'][0]:.1f} tok/s, TTFT {got['router'][1]:.1f} ms; ratio {ratio:.3f}, added {ttft:+.1f} ms",
                    flush=True,
                )
        finally:
            if router is not None:
                stop(router)
            stop(engine)
    code = report(
        [
            Goal("router / direct tok/s", statistics.median(ratios), 0.95, True, note="aggregate decode at c16"),
            Goal("added median TTFT", statistics.median(added), 5.0, False, " ms", note="router minus direct"),
        ]
    )
    sys.exit(code)


if __name__ == "__main__":
    main()
