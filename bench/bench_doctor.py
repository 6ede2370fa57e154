"""Benchmark of `tp4 doctor` on the four netns hosts of tests/doctor_hosts.py (real sshd, podman,
ip, ping, ss, df on each; each host's RDMA sysfs tree and stub nvidia-smi laid out as a good Spark,
so every check passes).

    .venv/bin/python bench/bench_doctor.py [--runs 3] [--interval 2]   (as root)

Each run measures, one after the other:

  cli         `python -m tp4 doctor --profile <cluster profile>` as a user runs it, wall time from the
              command's start to its exit 0 (interpreter, imports, the plan, the table included)
  parallel    tp4.hosts.doctor.doctor(...) in this process: every node's facts at once (one ssh each)
  sequential  the same call with tp4.hosts.nodes.SEQUENTIAL = True: the same facts command on one node
              after another

Before each measurement the shared ssh connections (ControlMaster) are closed, so each pays its
handshakes, as a first doctor does. The facts script reads the RoCE error counters twice,
--interval seconds apart (default 2, the CLI's), while it reads the rest: that interval is part
of every node's time, in both modes.

Goals (medians over --runs):

  doctor cli             `tp4 doctor`, four nodes, everything passing (goal: <= 3 s)
  parallel/sequential    in-process, parallel over node after node (goal: <= 0.4)

Prints every measurement with its goal; exits 1 when a goal is missed, 2 when the machine lacks
something (what the serve benchmark needs: root, podman with runc, sshd, ...).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "python"), str(REPO / "tests"), str(REPO / "bench")]

from bench_serve import Goal, missing_prerequisites, report  # noqa: E402
from doctor_hosts import SYSFS, DoctorCluster  # noqa: E402


def doctor_cli(profile: str, interval: float) -> float:
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "tp4", "doctor", "--profile", profile, "--sysfs", SYSFS, "--interval", f"{interval:g}"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    wall = time.monotonic() - start
    if proc.returncode != 0:
        raise SystemExit(f"error: tp4 doctor exited {proc.returncode}:\n{proc.stdout}{proc.stderr}")
    return wall


def doctor_in_process(cluster: DoctorCluster, interval: float, sequential: bool) -> float:
    from tp4.hosts import doctor, nodes

    assert cluster.loaded is not None
    limits = doctor.Limits.of_profile(cluster.loaded.profile, sysfs=SYSFS, interval=interval)
    nodes.SEQUENTIAL = sequential
    try:
        start = time.monotonic()
        result = doctor.doctor(cluster.plan, nodes.nodes_of(cluster.plan), limits)
        wall = time.monotonic() - start
    finally:
        nodes.SEQUENTIAL = False
    if result.blocking:
        raise SystemExit(
            "error: doctor found blocking failures on the benchmark's hosts: "
            + "; ".join(f"{r.node} {r.check}: {r.detail}" for r in result.blocking)
        )
    return wall


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="repetitions of each mode (medians are judged)")
    parser.add_argument(
        "--interval", type=float, default=2.0, help="seconds between the two counter reads (the CLI's default)"
    )
    opts = parser.parse_args()
    if opts.runs < 1 or not 0 <= opts.interval <= 60:
        parser.error("--runs: at least 1; --interval: 0 to 60")
    missing = missing_prerequisites()
    if missing:
        print(
            f"error: bench_doctor.py needs {', '.join(missing)}; set the machine up as the tests do "
            "(as root: bash python/setup.sh --test) and run it again",
            file=sys.stderr,
        )
        sys.exit(2)
    walls: dict[str, list[float]] = {"cli": [], "parallel": [], "sequential": []}
    with tempfile.TemporaryDirectory(prefix="tp4-bench-doctor-") as tmp_name:
        tmp = Path(tmp_name)
        os.environ["XDG_STATE_HOME"] = str(tmp / "state")
        os.environ["XDG_CACHE_HOME"] = str(tmp / "cache")
        os.environ["PYTHONPATH"] = os.pathsep.join(
            [str(REPO / "python"), *filter(None, [os.environ.get("PYTHONPATH")])]
        )
        print("starting the four netns hosts and loading the stand-in image ...", flush=True)
        with DoctorCluster(tmp / "cluster", storage_driver="overlay") as cluster:
            cluster.reset()
            for i in range(opts.runs):
                for mode in walls:
                    cluster.hosts.close_connections()
                    if mode == "cli":
                        wall = doctor_cli(str(cluster.profile), opts.interval)
                    else:
                        wall = doctor_in_process(cluster, opts.interval, sequential=mode == "sequential")
                    walls[mode].append(wall)
                    print(f"run {i + 1} {mode:<10} {wall:5.2f} s", flush=True)
    med = {mode: statistics.median(values) for mode, values in walls.items()}
    print(f"\nfour nodes, counter interval {opts.interval:g} s, {opts.runs} runs of each mode, medians:")
    for mode, value in med.items():
        print(f"{mode:<11} {value:6.2f} s")
    print()
    sys.exit(
        report(
            [
                Goal("doctor cli", med["cli"], 3.0, " s", note="`tp4 doctor`, 4 nodes, every check passing"),
                Goal(
                    "parallel/sequential",
                    med["parallel"] / med["sequential"],
                    0.4,
                    note=f"in-process {med['parallel']:.2f} s / {med['sequential']:.2f} s",
                ),
            ]
        )
    )


if __name__ == "__main__":
    main()
