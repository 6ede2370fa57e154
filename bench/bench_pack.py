"""Benchmark of `tp4 pack` on the four netns hosts of tests/line_cluster.py (real sshd and podman on
each; the image's packer is the stand-in tests/standin/pack_engram.py, which sleeps a fixed time
per node before writing the rank's two shards).

    .venv/bin/python bench/bench_pack.py [--runs 3] [--seconds 2]   (as root)

Node i's packer takes SECONDS + 0.5 * i (so the four differ, the last is the slowest), set through
each host's containers.conf as tests/test_pack.py does. Each run packs from no shards twice:

  parallel    tp4.hosts.pack.pack(...) as `tp4 pack` runs it: every node at once
  sequential  the same with tp4.hosts.nodes.SEQUENTIAL = True: one node after another, so that each
              node's own time (its "started" line to its "done" line: the packer's container
              run, alone on the machine) is measured too

Goals (medians over --runs):

  parallel/slowest       pack's wall time over the slowest node's own time (goal: <= 1.25:
                         "about the slowest node")
  parallel/sequential    pack's wall time over node after node (printed; the sum is what upstream,
                         going node by node, takes)

Exits 1 when a goal is missed, 2 when the machine lacks something (what the serve benchmark needs).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "python"), str(REPO / "tests"), str(REPO / "bench")]

from bench_serve import Goal, missing_prerequisites, report  # noqa: E402
from line_cluster import LineCluster  # noqa: E402
from test_pack import packer_env  # noqa: E402


def one_pack(cluster: LineCluster, sequential: bool) -> tuple[float, dict[str, float]]:
    """pack's wall time and, from its lines, each node's own time (started to done)."""
    from tp4.hosts import nodes, pack

    for rank in cluster.plan.nodes:
        shutil.rmtree(pack.engram_dir(rank), ignore_errors=True)
    cluster.hosts.close_connections()
    began: dict[str, float] = {}
    own: dict[str, float] = {}

    def said(line: str) -> None:
        now = time.monotonic()
        parts = line.split(": ")
        if len(parts) >= 3 and parts[0] == "pack":
            if parts[-1] == "started":  # pack: node2: rank 1 of 4: started
                began[parts[1]] = now
            elif parts[2].startswith("done in") and parts[1] in began:
                own[parts[1]] = now - began[parts[1]]

    nodes.SEQUENTIAL = sequential
    try:
        start = time.monotonic()
        pack.pack(cluster.plan, cluster.nodes(), said)
        wall = time.monotonic() - start
    finally:
        nodes.SEQUENTIAL = False
    if len(own) != len(cluster.plan.nodes):
        raise SystemExit(f"error: pack did not pack every node: {sorted(own)}")
    return wall, own


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="repetitions (medians are judged)")
    parser.add_argument(
        "--seconds", type=float, default=2.0, help="the first node's packer time; each next one takes 0.5 s more"
    )
    opts = parser.parse_args()
    if opts.runs < 1 or not 0 <= opts.seconds <= 600:
        parser.error("--runs: at least 1; --seconds: 0 to 600")
    missing = missing_prerequisites()
    if missing:
        print(
            f"error: bench_pack.py needs {', '.join(missing)}; set the machine up as the tests do "
            "(as root: bash python/setup.sh --test) and run it again",
            file=sys.stderr,
        )
        sys.exit(2)
    par: list[float] = []
    seq: list[float] = []
    slowest: list[float] = []
    work = Path(tempfile.mkdtemp(prefix="tp4-bpack-", dir="/tmp"))  # short: see tests/test_pack.py
    try:
        os.environ["XDG_STATE_HOME"] = str(work / "state")
        print("starting the four netns hosts and loading the stand-in image ...", flush=True)
        with LineCluster(work / "c", storage_driver="overlay") as cluster:
            packer_env(cluster, {i: {"TP4_STANDIN_PACK_SECONDS": f"{opts.seconds + 0.5 * i:g}"} for i in range(4)})
            for i in range(opts.runs):
                wall, _ = one_pack(cluster, sequential=False)
                seq_wall, own = one_pack(cluster, sequential=True)
                par.append(wall)
                seq.append(seq_wall)
                slowest.append(max(own.values()))
                print(
                    f"run {i + 1}: parallel {wall:5.2f} s, sequential {seq_wall:5.2f} s; each node alone: "
                    + ", ".join(f"{n} {t:.2f} s" for n, t in sorted(own.items())),
                    flush=True,
                )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    p, s, w = statistics.median(par), statistics.median(seq), statistics.median(slowest)
    print(
        f"\nfour nodes, packers of {opts.seconds:g} to {opts.seconds + 1.5:g} s, {opts.runs} runs, medians: "
        f"parallel {p:.2f} s, sequential {s:.2f} s, the slowest node alone {w:.2f} s\n"
    )
    sys.exit(
        report(
            [
                Goal("parallel/slowest", p / w, 1.25, note=f"{p:.2f} s / {w:.2f} s"),
                Goal("parallel/sequential", p / s, 1.0, note=f"{p:.2f} s / {s:.2f} s", binding=False),
            ]
        )
    )


if __name__ == "__main__":
    main()
