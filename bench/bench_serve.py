"""Benchmark of `tp4 serve`, `tp4 status` and `tp4 stop` on the four netns hosts of
tests/doctor_hosts.py (tests/line_cluster.py's: real sshd and podman on each, the stand-in engine
in the image; each laid out as a good Spark for the doctor checks serve runs: an RDMA sysfs tree,
a stub nvidia-smi).

    sudo .venv/bin/python bench/bench_serve.py [--runs 3]

Each run brings the line up three ways, one after the other, and stops it after each:

  cli         `python -m tp4 serve --profile <cluster profile>` as a user runs it, wall time from
              the command's start to its exit 0 (interpreter, imports and the plan included)
  parallel    tp4.serving.serve.serve(...) in this process (the plan, nodes and secrets made as the CLI's
              `_line` makes them), as tp4 runs it
  sequential  the same call with tp4.hosts.nodes.SEQUENTIAL = True: every per-node step (checks, env
              files, worker starts, state polls, log checks) on one node after another

Before every serve the shared ssh connections (ControlMaster) are closed, so each serve pays its
handshakes, as a first serve does. After every serve, `tp4 status --profile ...` and `tp4 stop
--profile ...` are timed as commands (with the connections serve left open, as a user runs them
right after it).

Orchestration overhead = serve's wall time minus the stand-in's own boot time. The stand-in's
boot time is measured from the runtime's timestamps, as

    engine = T(head's `Ready: API on port` line, `podman logs -t`) - max(StartedAt of the 4 ranks)

i.e. from the moment the last rank's container was started (`podman inspect` StartedAt) to the
moment the head printed Ready. Not from the earliest StartedAt: no rank gets past dist init
before every rank has joined (the stand-in, like torch.distributed, waits in the dist group for
the others), so the boot of the line cannot begin in earnest before the last container runs,
and the time between the first and the last start is tp4's (it starts the workers, then the
head; done one node after another it grows with the node count). Everything else in the wall
time is tp4's: before the first start (interpreter, plan, doctor's blocking checks of every node, the env
files), the starts, and after Ready (the one-token completion, every rank's boot log fetched and
checked, the run recorded). Each run prints that breakdown. The definition with the earliest
StartedAt is printed too (engine*), for comparison.

Goals (medians over --runs):

  overhead cli           serve's overhead as a command, four nodes (goal: <= 3 s)
  parallel/sequential    the in-process overheads, parallel over sequential (goal: <= 0.5)
  status                 `tp4 status` with the line up (goal: <= 1.5 s)
  stop                   `tp4 stop` (goal: <= 3 s)

The four hosts share this machine's cores: on two cores, per-node work that is CPU-bound (ssh
handshakes, doctor's facts script, podman) can at best halve when run in parallel, where four
Sparks would each do their own. Each run prints how busy the machine was during serve.

The machine runs other work too (the tests): timings may be noisy; medians of several runs help.
Prints every measurement with its goal; exits 1 when a goal is missed, 2 when the machine lacks
something. Needs root, podman with runc, sshd, ssh, ip, nsenter, unshare, a static busybox and
/usr/bin/python3 (the stand-in image), as the serve tests do.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "python"), str(REPO / "tests")]

from doctor_hosts import SYSFS, DoctorCluster  # noqa: E402
from line_cluster import LineCluster  # noqa: E402
from netns_hosts import SSHD  # noqa: E402
from nix_env import BUSYBOX  # noqa: E402

MODES = ("cli", "parallel", "sequential")
READY = "Ready: API on port"


@dataclass(frozen=True)
class Goal:
    """One measurement against its goal (value <= goal); ``binding`` False: printed, not judged."""

    name: str
    value: float
    goal: float
    unit: str = ""
    note: str = ""
    binding: bool = True

    @property
    def met(self) -> bool:
        return self.value <= self.goal

    def line(self) -> str:
        verdict = ("ok" if self.met else "MISSED") if self.binding else "not judged"
        text = f"{self.name:<20} {self.value:9.3f}{self.unit}  goal <= {self.goal:g}{self.unit}  {verdict}"
        return text + (f"  ({self.note})" if self.note else "")


def report(goals: Sequence[Goal], out: Callable[[str], None] = print) -> int:
    """Print every goal; 1 when a binding one is missed, else 0."""
    for g in goals:
        out(g.line())
    missed = [g.name for g in goals if g.binding and not g.met]
    if missed:
        out(f"missed: {', '.join(missed)}")
    return 1 if missed else 0


def missing_prerequisites() -> list[str]:
    """What this machine lacks for the benchmark (empty when it can run)."""
    missing = [] if os.geteuid() == 0 else ["root (network namespaces)"]
    missing += [
        tool
        for tool in ("podman", "runc", "ip", "ssh", "ssh-keygen", "nsenter", "unshare")
        if shutil.which(tool) is None
    ]
    missing += [path for path in (SSHD, BUSYBOX, "/usr/bin/python3") if not os.access(path, os.X_OK)]
    return missing


# --- the runtime's timestamps ---------------------------------------------------------------------

_STAMP = re.compile(r"(\d{4}-\d{2}-\d{2})[T ](\d{2}:\d{2}:\d{2})(?:\.(\d+))?\s*(Z|[+-]\d{2}:?\d{2})?")


def stamp(text: str) -> float:
    """Seconds since the epoch of a podman time: `2026-01-02 03:04:05.123456789 +0000 UTC`
    (inspect) or `2026-01-02T03:04:05.123456789Z` (logs -t); nanoseconds kept to microseconds."""
    m = _STAMP.search(text)
    if m is None:
        raise ValueError(f"not a podman timestamp: {text!r}")
    frac = (m[3] or "0")[:6].ljust(6, "0")
    zone = m[4] or "+00:00"
    zone = "+00:00" if zone == "Z" else (zone if ":" in zone else f"{zone[:3]}:{zone[3:]}")
    return datetime.fromisoformat(f"{m[1]}T{m[2]}.{frac}{zone}").timestamp()


@dataclass(frozen=True)
class Boot:
    """The runtime's view of one boot: every rank's container start, the head's Ready line."""

    started: tuple[float, ...]  # StartedAt of ranks 0..n-1 (epoch seconds)
    ready: float  # the head's Ready line, as podman logged it

    @property
    def engine(self) -> float:
        """The stand-in's own boot: the last container start to Ready (module docstring)."""
        return self.ready - max(self.started)

    @property
    def engine_from_first(self) -> float:
        return self.ready - min(self.started)


def boot_of(cluster: LineCluster) -> Boot:
    started = []
    for node, host in zip(cluster.plan.nodes, cluster.hosts, strict=True):
        out = host.run("podman", "inspect", "--format", "{{.State.StartedAt}}", node.run.container).stdout
        started.append(stamp(out.strip()))
    head = cluster.plan.nodes[0].run.container
    log = cluster.head.run("podman", "logs", "-t", head).stdout
    ready = [line for line in log.splitlines() if READY in line]
    if not ready:
        raise SystemExit(f"error: the head's log has no `{READY}` line although serve exited 0")
    return Boot(tuple(started), stamp(ready[-1].split(" ", 1)[0]))


# --- one serve -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    mode: str
    wall: float
    began: float  # epoch seconds when serve was called
    boot: Boot
    status: float
    stop: float
    lines: tuple[tuple[float, str], ...]  # serve's progress lines, seconds since it was called
    cpu: float = 0.0  # CPU seconds the whole machine (the four hosts too) was busy during serve

    @property
    def overhead(self) -> float:
        return self.wall - self.boot.engine

    def breakdown(self) -> str:
        b = self.boot
        first, last = min(b.started), max(b.started)
        return (
            f"before the first start {first - self.began:5.2f} s, starts {last - first:5.2f} s, "
            f"engine {b.engine:5.2f} s, after Ready {self.began + self.wall - b.ready:5.2f} s "
            f"(engine* from the first start {b.engine_from_first:5.2f} s)"
        )


# serve's progress lines that mark its steps, in order (tp4.serving.serve: preflight, _boot, _wait_ready)
MILESTONES = (
    ("checks", "checks: "),
    ("workers", "started "),
    ("head", "started the head"),
    ("Ready seen", "phase: ready"),
    ("verified", "ready: "),
)


def milestones(lines: Sequence[tuple[float, str]]) -> str:
    """When serve said each step was done (seconds since it was called), from its progress lines."""
    got = []
    for name, prefix in MILESTONES:
        at = next(
            (t for t, line in lines if line.startswith(prefix) and not (name == "workers" and "the head" in line)), None
        )
        if at is not None:
            got.append(f"{name} {at:5.2f}")
    return ", ".join(got)


def serve_cli(profile: str) -> tuple[float, list[tuple[float, str]]]:
    """`tp4 serve` as a command: its wall time and its lines (stderr's progress, stdout's result),
    each with the seconds since the command started."""
    lines: list[tuple[float, str]] = []
    start = time.monotonic()
    with tempfile.TemporaryFile("w+") as out:
        child = subprocess.Popen(
            [sys.executable, "-m", "tp4", "serve", "--profile", profile, "--sysfs", SYSFS],
            stdout=out,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert child.stderr is not None
        for line in child.stderr:
            lines.append((time.monotonic() - start, line.rstrip("\n")))
        code = child.wait(timeout=300)
        wall = time.monotonic() - start
        out.seek(0)
        lines += [(wall, line) for line in out.read().splitlines()]
    if code != 0:
        raise SystemExit(f"error: tp4 serve exited {code}:\n" + "\n".join(line for _, line in lines))
    return wall, lines


def tp4(*args: str, timeout: float = 300) -> tuple[float, subprocess.CompletedProcess[str]]:
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "tp4", *args], capture_output=True, text=True, timeout=timeout)
    return time.monotonic() - start, proc


def _must(what: str, proc: subprocess.CompletedProcess[str]) -> None:
    if proc.returncode != 0:
        raise SystemExit(f"error: {what} exited {proc.returncode}:\n{proc.stdout}{proc.stderr}")


def serve_in_process(profile: str, sequential: bool) -> tuple[float, list[tuple[float, str]]]:
    """tp4.serving.serve.serve as the CLI calls it (tp4.cli.serve `serve` and tp4.cli.common `load_served`), timed from the
    profile's load to Ready, tp4.hosts.nodes.SEQUENTIAL set for the call; its wall time and its lines
    (the profile's warnings too), each with the seconds since the call."""
    from tp4.hosts import nodes
    from tp4.serving import serve
    from tp4.cli.common import load_profile
    from tp4.line.plan import build_plan

    lines: list[tuple[float, str]] = []
    start = time.monotonic()

    def said(line: str) -> None:
        lines.append((time.monotonic() - start, line))

    nodes.SEQUENTIAL = sequential
    try:
        with contextlib.redirect_stderr(io.StringIO()) as warnings:  # the profile's warnings (click.echo)
            plan = build_plan(load_profile(profile, False))
        lines += [(0.0, w) for w in warnings.getvalue().splitlines()]
        secrets: dict[str, str] = {}  # the cluster's profile has no api.key_file
        opts = serve.Options(sysfs=SYSFS, volume_kind="local")  # the cluster's profile: nfs.share = false
        serve.serve(plan, nodes.nodes_of(plan), secrets, opts, said, said)
        return time.monotonic() - start, lines
    except Exception as exc:
        raise SystemExit(
            f"error: serve ({'sequential' if sequential else 'parallel'}) failed: {exc}\n"
            + "\n".join(line for _, line in lines)
        ) from None
    finally:
        nodes.SEQUENTIAL = False


def cpu_busy() -> float:
    """CPU seconds this machine has been busy (every core, /proc/stat), for the load of a run."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def one_run(cluster: LineCluster, mode: str) -> Run:
    profile = str(cluster.profile)
    cluster.hosts.close_connections()
    began = time.time()
    busy = cpu_busy()
    if mode == "cli":
        wall, lines = serve_cli(profile)
    else:
        wall, lines = serve_in_process(profile, sequential=mode == "sequential")
    busy = cpu_busy() - busy
    boot = boot_of(cluster)
    status, proc = tp4("status", "--profile", profile)
    _must("tp4 status", proc)
    stop, proc = tp4("stop", "--profile", profile)
    _must("tp4 stop", proc)
    left = cluster.leftovers()
    if left:
        raise SystemExit("error: tp4 stop left " + "; ".join(left))
    return Run(mode, wall, began, boot, status, stop, tuple(lines), busy)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="repetitions of each mode (medians are judged)")
    parser.add_argument(
        "--storage-driver",
        choices=("overlay", "vfs"),
        default="overlay",
        help="containers-storage driver of every host (overlay, as on the nodes; vfs copies the image per container)",
    )
    opts = parser.parse_args()
    if opts.runs < 1:
        parser.error("--runs: at least 1")
    missing = missing_prerequisites()
    if missing:
        print(
            f"error: bench_serve.py needs {', '.join(missing)}; set the machine up as the tests do "
            "(as root: bash python/setup.sh --test) and run it again",
            file=sys.stderr,
        )
        sys.exit(2)

    runs: list[Run] = []
    with tempfile.TemporaryDirectory(prefix="tp4-bench-serve-") as tmp_name:
        tmp = Path(tmp_name)
        os.environ["XDG_STATE_HOME"] = str(tmp / "state")  # serve's lock and run records
        os.environ["XDG_CACHE_HOME"] = str(tmp / "cache")
        # `python -m tp4` runs this checkout's tp4, not an installed one
        os.environ["PYTHONPATH"] = os.pathsep.join(
            [str(REPO / "python"), *filter(None, [os.environ.get("PYTHONPATH")])]
        )
        print("starting the four netns hosts and loading the stand-in image ...", flush=True)
        with DoctorCluster(tmp / "cluster", storage_driver=opts.storage_driver) as cluster:
            cluster.reset()
            for i in range(opts.runs):
                for mode in MODES:
                    run = one_run(cluster, mode)
                    runs.append(run)
                    print(
                        f"run {i + 1} {mode:<10} serve {run.wall:5.2f} s  overhead {run.overhead:5.2f} s  "
                        f"status {run.status:4.2f} s  stop {run.stop:4.2f} s",
                        flush=True,
                    )
                    print(f"    runtime: {run.breakdown()}", flush=True)
                    print(f"    serve's steps done at (s): {milestones(run.lines)}", flush=True)
                    print(
                        f"    machine busy {run.cpu / run.wall:4.2f} of {os.cpu_count()} cores during serve "
                        "(the four hosts share them)",
                        flush=True,
                    )

    def median(mode: str | None, value: Callable[[Run], float]) -> float:
        return statistics.median(value(r) for r in runs if mode is None or r.mode == mode)

    over = {mode: median(mode, lambda r: r.overhead) for mode in MODES}
    engine = median(None, lambda r: r.boot.engine)
    print(f"\nfour nodes, {opts.runs} runs of each mode, medians; the stand-in's own boot {engine:.2f} s")
    for mode in MODES:
        print(f"{mode:<11} serve {median(mode, lambda r: r.wall):6.2f} s   overhead {over[mode]:6.2f} s")
    print()
    goals = [
        Goal("overhead cli", over["cli"], 3.0, " s", note="`tp4 serve` to exit 0 minus the stand-in's boot, 4 nodes"),
        Goal(
            "parallel/sequential",
            over["parallel"] / over["sequential"],
            0.5,
            note=f"in-process overheads {over['parallel']:.2f} s / {over['sequential']:.2f} s",
        ),
        Goal("status", median(None, lambda r: r.status), 1.5, " s", note="`tp4 status`, the line up"),
        Goal("stop", median(None, lambda r: r.stop), 3.0, " s", note="`tp4 stop`, 4 nodes"),
    ]
    sys.exit(report(goals))


if __name__ == "__main__":
    main()
