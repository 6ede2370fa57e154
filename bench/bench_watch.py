"""Benchmark of `tp4 watch` (issue 27, point 8) on the four netns hosts of tests/doctor_hosts.py
(real sshd and podman on each, the stand-in engine in the image, laid out as good Sparks).

    sudo .venv/bin/python bench/bench_watch.py [--runs 3] [--load-seconds 600]

It first serves the line with a plain `tp4 serve` (the stand-in's own boot, from the runtime's
timestamps as bench/bench_serve.py reads them: the last rank's container start to the head's
`Ready` line), then runs `tp4 watch` with short intervals (--interval, --probe-timeout, --confirm;
--confirm-interval too when `tp4 watch --help` lists it; --backoff 0 and a restart bound that
never binds, so every fault is healed at once) and, --runs times each, at a random moment of the
watch's look cycle:

  wedge      POST /standin/wedge {"wedged": true} on the head's stand-in: /health stays 200, the
             completions hang (tests/standin/engine.py)
  kill       `podman kill` of the last worker's rank container over that node's own runtime

Figures (medians over the runs, every run printed):

  (a) detection of a wedge   the wedge posted to the watchdog's `confirmed` event (stderr, read as
                             it comes: emitted the moment the wedge is confirmed, before the
                             evidence); goal <= 2 x interval + probe timeout
  (b) detection of a kill    the container's end (its FinishedAt) to the `confirmed` event; same goal
  (c) recovery               the `confirmed` event to the `ready` event (a user's recovery starts when
                             the fault is known); goal <= the stand-in's boot + 3 s, the boot being
                             that of the restarted line itself (the runtime's timestamps of the new
                             containers); the boot of the plain serve is printed beside it, and so
                             is the recovery from the `restart` event to `ready` (for information,
                             no goal)
Each detection is also printed up to the `restart` event: the time between `confirmed` and
`restart` is the evidence the watchdog gathers (each rank's log, `tp4 status`, doctor's RoCE
counters) before it restarts the line.

  (d) false restarts         the line served again with TP4_STANDIN_DECODE_TPS (long paced
                             generations), `tp4 watch --interval 5` (its other settings the
                             defaults) and --concurrency (16) streams of chat completions of
                             --max-tokens each (ignore_eos: every one that long), started again as
                             each ends, for --load-seconds (default 600; 0 skips this part); goal
                             0 restarts. Prints the states the watchdog reported and the engine's
                             running and waiting requests, sampled, to show the load held.

Prints each figure, its goal, the ratio figure/goal and PASS or MISS. It is a measurement: it
exits 0 whether the goals are met or not, 1 when the measurement itself fails (a serve or a
restart that fails, a fault the watchdog never reports), 2 on a bad option or when the machine
lacks something (root, podman with runc, sshd, ...; as the serve tests). The machine runs other
work too: timings may be noisy.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "python"), str(REPO / "tests"), str(REPO / "bench")]

from bench_serve import boot_of, missing_prerequisites, stamp  # noqa: E402
from doctor_hosts import SYSFS, DoctorCluster  # noqa: E402

RECOVERY_SLACK = 3.0  # seconds beyond the stand-in's boot (the goal)


# --- options ---------------------------------------------------------------------------------------


def _bounded(kind: type, low: float, high: float) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number; fix: a number") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{text} is outside {low:g}..{high:g}; fix: a value in that range")
        return value

    return parse


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=(__doc__ or "").splitlines()[0],
        epilog="What each part measures and its goal: the script's docstring and docs/watch.md (Measured).",
    )
    p.add_argument("--runs", type=_bounded(int, 1, 100), default=3, help="faults of each kind (default 3)")
    p.add_argument(
        "--interval",
        type=_bounded(float, 0.5, 60),
        default=6.0,
        help="tp4 watch --interval for the detection and recovery parts (default 6)",
    )
    p.add_argument(
        "--probe-timeout",
        type=_bounded(float, 0.5, 60),
        default=2.0,
        help="tp4 watch --probe-timeout for those parts (default 2)",
    )
    p.add_argument(
        "--confirm",
        type=_bounded(int, 1, 10),
        default=3,
        help="tp4 watch --confirm for those parts (default 3, the watch's default)",
    )
    p.add_argument(
        "--confirm-interval",
        type=_bounded(float, 0.1, 60),
        default=1.0,
        help="tp4 watch --confirm-interval, passed only when `tp4 watch --help` lists it (default 1)",
    )
    p.add_argument(
        "--load-seconds",
        type=_bounded(float, 0, 86400),
        default=600.0,
        help="how long the load part runs (default 600; 0 skips it; at least 30 otherwise)",
    )
    p.add_argument(
        "--load-interval",
        type=_bounded(float, 0.5, 60),
        default=5.0,
        help="tp4 watch --interval during the load (default 5)",
    )
    p.add_argument("--concurrency", type=_bounded(int, 1, 256), default=16, help="streams of the load (16)")
    p.add_argument(
        "--max-tokens",
        type=_bounded(int, 1, 1_000_000),
        default=600,
        help="completion tokens of each generation of the load (default 600)",
    )
    p.add_argument(
        "--decode-tps",
        type=_bounded(float, 0.1, 100_000),
        default=20.0,
        help="TP4_STANDIN_DECODE_TPS of the load's line: tokens/s per stream (default 20: 30 s a generation)",
    )
    p.add_argument(
        "--storage-driver",
        choices=("overlay", "vfs"),
        default="overlay",
        help="containers-storage driver of every host (default overlay, as on the nodes)",
    )
    args = p.parse_args(argv)
    if 0 < args.load_seconds < 30:
        p.error(f"--load-seconds {args.load_seconds:g}: too short to say anything; fix: 0 (skip it) or at least 30")
    if args.confirm_interval > args.interval:
        p.error(
            f"--confirm-interval {args.confirm_interval:g}: longer than --interval {args.interval:g}; "
            "fix: a value up to --interval"
        )
    return args


# --- figures against goals -------------------------------------------------------------------------


@dataclass(frozen=True)
class Figure:
    name: str
    value: float
    goal: float
    unit: str = " s"
    note: str = ""

    @property
    def met(self) -> bool:
        return self.value <= self.goal

    def line(self) -> str:
        ratio = f"{self.value / self.goal:6.2f}" if self.goal > 0 else ("  0.00" if self.value == 0 else "   inf")
        text = (
            f"{self.name:<28} {self.value:8.2f}{self.unit}  goal <= {self.goal:.2f}{self.unit}  "
            f"ratio {ratio}  {'PASS' if self.met else 'MISS'}"
        )
        return text + (f"  ({self.note})" if self.note else "")


# --- the watchdog as a command -----------------------------------------------------------------------


def env(state: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO / "python"), "XDG_STATE_HOME": str(state)}


def tp4(state: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tp4", *args], capture_output=True, text=True, timeout=timeout, env=env(state)
    )


def must(what: str, proc: subprocess.CompletedProcess[str]) -> None:
    if proc.returncode != 0:
        raise SystemExit(f"error: {what} exited {proc.returncode}:\n{proc.stdout}{proc.stderr}")


def watch_has(option: str, state: Path) -> bool:
    helped = tp4(state, "watch", "--help", timeout=60)
    must("tp4 watch --help", helped)
    return option in helped.stdout


class Watch:
    """A running `tp4 watch`: every stderr line with the wall time it came (a reader thread)."""

    def __init__(self, state: Path, profile: str, events: Path, options: Sequence[str]) -> None:
        argv = [sys.executable, "-m", "tp4", "watch", "--profile", profile, *options]
        argv += ["--events", str(events), "--metrics", "off", "--sysfs", SYSFS]
        self.events = events
        self.lines: list[tuple[float, str]] = []
        self.lock = threading.Lock()
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env(state)
        )
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            with self.lock:
                self.lines.append((time.time(), line.rstrip("\n")))

    def mark(self) -> int:
        with self.lock:
            return len(self.lines)

    def wait(self, event: str, since: int, seconds: float) -> tuple[float, str]:
        """The first `watch: <event>: ...` line after line ``since``: its time and text. A
        `restart-failed` or `gave-up` on the way, the watch's end or the deadline end the run."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            with self.lock:
                new = self.lines[since:]
            for when, line in new:
                if line.startswith(f"watch: {event}: "):
                    return when, line
                if line.startswith(("watch: restart-failed: ", "watch: gave-up: ")):
                    raise SystemExit(f"error: the watchdog said: {line}\n" + self.tail())
            if self.proc.poll() is not None:
                self.reader.join(5)
                raise SystemExit(
                    f"error: tp4 watch exited {self.proc.returncode} waiting for `{event}`\n" + self.tail()
                )
            time.sleep(0.05)
        raise SystemExit(f"error: no `{event}` event from tp4 watch within {seconds:g} s\n" + self.tail())

    def tail(self, n: int = 30) -> str:
        with self.lock:
            return "\n".join(line for _, line in self.lines[-n:])

    def said(self, since: int = 0) -> list[str]:
        with self.lock:
            return [line for _, line in self.lines[since:]]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.reader.join(10)


# --- detection and recovery ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Cycle:
    kind: str  # wedge or kill
    detect: float  # the fault to the confirmed event
    restart: float  # the fault to the restart event (detect + the evidence)
    recover: float  # the confirmed event to the ready event
    recover_restart: float  # the restart event to the ready event
    said: float  # the ready event's own figure ("ready again after X s")
    boot: float  # the stand-in's boot of the restarted line


def set_wedged(api: str, value: bool) -> None:
    req = urllib.request.Request(f"{api}/standin/wedge", data=json.dumps({"wedged": value}).encode())
    with urllib.request.urlopen(req, timeout=10) as resp:
        if json.loads(resp.read()).get("wedged") is not value:
            raise SystemExit("error: the stand-in did not take the wedge control")


def cycle(cluster: DoctorCluster, w: Watch, kind: str, interval: float, rng: random.Random) -> Cycle:
    time.sleep(interval * (1 + rng.random()))  # a look or more after the last event, at a random phase
    since = w.mark()
    if kind == "wedge":
        fault = time.time()
        set_wedged(cluster.api(), True)
    else:
        k = len(cluster.plan.nodes) - 1
        host, container = cluster.hosts[k], cluster.plan.nodes[k].run.container
        host.run("podman", "kill", container)
        fault = stamp(host.run("podman", "inspect", "--format", "{{.State.FinishedAt}}", container).stdout.strip())
    confirmed_at, _ = w.wait("confirmed", since, 120)
    restart_at, _ = w.wait("restart", since, 120)
    ready_at, ready = w.wait("ready", since, 300)
    m = re.search(r"after ([0-9.]+) s", ready)
    return Cycle(
        kind,
        confirmed_at - fault,
        restart_at - fault,
        ready_at - confirmed_at,
        ready_at - restart_at,
        float(m[1]) if m else float("nan"),
        boot_of(cluster).engine,
    )


# --- the load --------------------------------------------------------------------------------------


class Load:
    """``streams`` threads, each posting streamed chat completions of ``max_tokens`` (ignore_eos)
    one after another until stopped; a stream cut by the stop is not counted."""

    def __init__(self, api: str, streams: int, max_tokens: int) -> None:
        parts = urllib.parse.urlsplit(api)
        self.host, self.port = parts.hostname or "", parts.port or 80
        self.max_tokens = max_tokens
        self.stopping = threading.Event()
        self.lock = threading.Lock()
        self.done = self.tokens_events = 0
        self.errors: Counter[str] = Counter()
        self.threads = [threading.Thread(target=self._stream, daemon=True) for _ in range(streams)]

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def stop(self) -> None:
        self.stopping.set()
        for t in self.threads:
            t.join(30)

    def _stream(self) -> None:
        body = json.dumps(
            {
                "messages": [{"role": "user", "content": "Write a long story about a watchdog."}],
                "max_tokens": self.max_tokens,
                "ignore_eos": True,
                "stream": True,
            }
        ).encode()
        while not self.stopping.is_set():
            conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
            try:
                conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
                resp = conn.getresponse()
                if resp.status != 200:
                    resp.read()
                    with self.lock:
                        self.errors[f"HTTP {resp.status}"] += 1
                    time.sleep(1)
                    continue
                finished = False
                for raw in resp:
                    if self.stopping.is_set():
                        break
                    if raw.startswith(b"data: [DONE]"):
                        finished = True
                        break
                    if raw.startswith(b"data: "):
                        with self.lock:
                            self.tokens_events += 1
                if finished:
                    with self.lock:
                        self.done += 1
            except (OSError, http.client.HTTPException) as exc:
                if not self.stopping.is_set():
                    with self.lock:
                        self.errors[type(exc).__name__] += 1
                    time.sleep(1)
            finally:
                conn.close()


def running_requests(api: str) -> tuple[int, int] | None:
    """The engine's running and waiting requests (/v1/loads), or None."""
    try:
        with urllib.request.urlopen(f"{api}/v1/loads", timeout=5) as resp:
            load = json.loads(resp.read())["loads"][0]
            return int(load["num_running_reqs"]), int(load["num_waiting_reqs"])
    except (OSError, ValueError, KeyError, IndexError):
        return None


def load_part(cluster: DoctorCluster, work: Path, args: argparse.Namespace) -> tuple[Figure, list[str]]:
    state = work / "state-load"
    profile = work / "load.toml"
    profile.write_text(cluster.profile.read_text() + f'\n[env]\nTP4_STANDIN_DECODE_TPS = "{args.decode_tps:g}"\n')
    must("tp4 serve (the load's line)", tp4(state, "serve", "--profile", str(profile), "--sysfs", SYSFS))
    w = Watch(state, str(profile), work / "events-load.jsonl", ["--interval", f"{args.load_interval:g}"])
    notes: list[str] = []
    try:
        started = w.wait("start", 0, 60)[1]
        w.wait("armed", 0, 120)
        since = w.mark()
        load = Load(cluster.api(), args.concurrency, args.max_tokens)
        began = time.monotonic()
        load.start()
        samples: list[int] = []
        waiting: list[int] = []
        while time.monotonic() - began < args.load_seconds:
            time.sleep(min(5.0, max(0.0, args.load_seconds - (time.monotonic() - began))))
            if w.proc.poll() is not None:
                raise SystemExit(f"error: tp4 watch exited {w.proc.returncode} during the load\n" + w.tail())
            got = running_requests(cluster.api())
            if got is not None:
                samples.append(got[0])
                waiting.append(got[1])
        load.stop()
        said = w.said(since)
    finally:
        w.stop()
        tp4(state, "stop", "--profile", str(profile))
    restarts = [s for s in said if s.startswith(("watch: restart: ", "watch: gave-up: ", "watch: restart-failed: "))]
    states = Counter(s.split(": ")[2] for s in said if s.startswith("watch: state: "))
    generation = args.max_tokens / args.decode_tps
    notes.append(
        f"load: {args.concurrency} streams of {args.max_tokens} tokens at {args.decode_tps:g} tokens/s "
        f"(~{generation:.0f} s a generation) for {args.load_seconds:g} s; tp4 watch --interval "
        f"{args.load_interval:g}, probe timeout and confirm the watch's defaults"
    )
    notes.append(f"load: {started}")
    notes.append(
        f"load: {load.done} generations finished, {load.tokens_events} SSE events read, errors: "
        + (", ".join(f"{k} x{v}" for k, v in load.errors.items()) or "none")
    )
    if samples:
        notes.append(
            f"load: the engine's running requests, sampled every ~5 s ({len(samples)} samples): "
            f"min {min(samples)}, median {statistics.median(samples):g}, max {max(samples)}; waiting "
            f"(such as the watchdog's probe behind a full batch): max {max(waiting)}, "
            f"in {sum(1 for n in waiting if n)} samples"
        )
    notes.append(
        "load: state changes the watchdog reported: "
        + (", ".join(f"{k} x{v}" for k, v in sorted(states.items())) or "none (ready throughout)")
    )
    notes += [f"load: {s}" for s in restarts]
    return (
        Figure(f"(d) false restarts, {args.load_seconds:g} s", float(len(restarts)), 0.0, unit="", note=notes[0]),
        notes,
    )


# --- main ------------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    missing = missing_prerequisites()
    if missing:
        print(
            f"error: bench_watch.py needs {', '.join(missing)}; set the machine up as the tests do "
            "(as root: bash python/setup.sh --test) and run it again",
            file=sys.stderr,
        )
        return 2
    rng = random.Random()
    figures: list[Figure] = []
    notes: list[str] = []
    with tempfile.TemporaryDirectory(prefix="tp4-bench-watch-") as tmp_name:
        work = Path(tmp_name)
        os.environ["XDG_CACHE_HOME"] = str(work / "cache")
        state = work / "state"
        options = ["--interval", f"{args.interval:g}", "--probe-timeout", f"{args.probe_timeout:g}"]
        options += ["--confirm", str(args.confirm), "--backoff", "0", "--max-restarts", "100", "--window", "1"]
        if watch_has("--confirm-interval", state):
            options += ["--confirm-interval", f"{args.confirm_interval:g}"]
        print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {socket.gethostname()}, {os.cpu_count()} cores")
        print(f"tp4 watch {' '.join(options)}  (detection and recovery)", flush=True)
        print("starting the four netns hosts and loading the stand-in image ...", flush=True)
        with DoctorCluster(work / "cluster", storage_driver=args.storage_driver) as cluster:
            cluster.reset()
            profile = str(cluster.profile)
            began = time.monotonic()
            must("tp4 serve", tp4(state, "serve", "--profile", profile, "--sysfs", SYSFS))
            wall = time.monotonic() - began
            plain = boot_of(cluster).engine
            print(f"plain tp4 serve: {wall:.2f} s, the stand-in's boot in it {plain:.2f} s", flush=True)
            cycles: list[Cycle] = []
            w = Watch(state, profile, work / "events.jsonl", options)
            try:
                print(w.wait("start", 0, 60)[1], flush=True)
                w.wait("armed", 0, 120)
                for i in range(args.runs):
                    for kind in ("wedge", "kill"):
                        c = cycle(cluster, w, kind, args.interval, rng)
                        cycles.append(c)
                        print(
                            f"run {i + 1} {kind:<5} confirmed {c.detect:5.2f} s (restart event {c.restart:5.2f} s, "
                            f"evidence {c.restart - c.detect:4.2f} s)  recovered {c.recover:5.2f} s from confirmed, "
                            f"{c.recover_restart:5.2f} s from restart (watch says {c.said:.1f} s; the stand-in's "
                            f"boot {c.boot:4.2f} s)",
                            flush=True,
                        )
            finally:
                w.stop()
                tp4(state, "stop", "--profile", profile)
            detect_goal = 2 * args.interval + args.probe_timeout
            for kind, label in (("wedge", "(a) detection, wedge"), ("kill", "(b) detection, killed rank")):
                mine = [c for c in cycles if c.kind == kind]
                restart = statistics.median(c.restart for c in mine)
                figures.append(
                    Figure(
                        label,
                        statistics.median(c.detect for c in mine),
                        detect_goal,
                        note=f"fault to `confirmed`, median of {len(mine)}, max {max(c.detect for c in mine):.2f} s; "
                        f"to the `restart` event (after the evidence) median {restart:.2f} s, "
                        f"ratio {restart / detect_goal:.2f}",
                    )
                )
            recover = statistics.median(c.recover for c in cycles)
            from_restart = statistics.median(c.recover_restart for c in cycles)
            boot = statistics.median(c.boot for c in cycles)
            goal = boot + RECOVERY_SLACK
            figures.append(
                Figure(
                    "(c) recovery to ready",
                    recover,
                    goal,
                    note=f"`confirmed` to `ready`, median of {len(cycles)}, max {max(c.recover for c in cycles):.2f} s; "
                    f"the stand-in's boot {boot:.2f} s (median of the restarts; {plain:.2f} s in the plain serve) "
                    f"+ 3 s; recovery minus that restart's boot: median "
                    f"{statistics.median(c.recover - c.boot for c in cycles):.2f} s",
                )
            )
            notes.append(
                f"(c) for information: `restart` to `ready` median {from_restart:.2f} s, max "
                f"{max(c.recover_restart for c in cycles):.2f} s (ratio {from_restart / goal:.2f} to the same goal; "
                "the evidence before the restart event is left out)"
            )
            if args.load_seconds > 0:
                print(f"load part: {args.load_seconds:g} s ...", flush=True)
                fig, load_notes = load_part(cluster, work, args)
                figures.append(fig)
                notes += load_notes[1:]
    print()
    for f in figures:
        print(f.line())
    for n in notes:
        print(n)
    missed = [f.name for f in figures if not f.met]
    print("all goals met" if not missed else f"missed: {', '.join(missed)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
