"""Benchmark of a `tp4 up` that has nothing to do: the line already runs from the same plan, on
the four netns hosts of tests/doctor_hosts.py (real sshd and podman each, the stand-in engine in
the image, laid out as good Sparks), the checkpoint pinned to tests/test_download.py's stand-in
of the Hub (as tests/test_up.py).

    sudo .venv/bin/python bench/bench_up.py [--runs 5]

It brings the line up once with `tp4 up` from hosts with nothing prepared (timed and printed,
not held to a goal: the stand-in's boot), then runs `tp4 up` again --runs times, each as a user
runs it (`python -m tp4 up --profile ...`: interpreter, imports, plan, every node asked which plan
its rank runs, smoke), and checks that nothing changed (the same containers).

Goal: the idempotent `tp4 up` in at most 3 s (median); prints each time, the median, and the
ratio to 3 s. Exits 1 when the goal is missed or something changed, 2 when the machine lacks
something (the serve tests' needs: root, podman with runc, sshd, ip, nsenter, unshare).
The machine runs other work too (the tests): timings may be noisy.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from http.server import ThreadingHTTPServer
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "python"), str(REPO / "tests")]

from doctor_hosts import DoctorCluster  # noqa: E402
from test_download import REPO_ID, REV, Hub, make_handler  # noqa: E402
from test_prepare import SHARDS, blank, profile, tp4  # noqa: E402
from test_up import container_ids, stop  # noqa: E402

GOAL = 3.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    if os.geteuid() != 0 or shutil.which("podman") is None:
        print("needs root and podman (as the serve tests)", file=sys.stderr)
        return 2
    assert REPO_ID and REV
    shards = {f"model-{i:05d}-of-{SHARDS:05d}.safetensors": os.urandom(4096 * i) for i in range(1, SHARDS + 1)}
    hub = Hub({"config.json": b'{"architectures": ["DeepseekV4ForCausalLM"]}\n', **shards})
    server = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(hub))
    server.daemon_threads = True
    hub.url = f"http://127.0.0.1:{server.server_address[1]}"
    threading.Thread(target=server.serve_forever, daemon=True).start()
    work = Path(tempfile.mkdtemp(prefix="tp4-up-", dir="/tmp"))
    try:
        with DoctorCluster(work, storage_driver="overlay") as cluster:
            cluster.reset()
            blank(cluster)
            path = str(profile(cluster))
            try:
                began = time.monotonic()
                first = tp4(hub, cluster, "up", "--profile", path)
                if first.returncode != 0:
                    print(first.stdout + first.stderr, file=sys.stderr)
                    return 1
                print(f"tp4 up from nothing prepared: {time.monotonic() - began:.2f} s")
                ids = container_ids(cluster)
                times = []
                for i in range(args.runs):
                    began = time.monotonic()
                    again = tp4(hub, cluster, "up", "--profile", path)
                    times.append(time.monotonic() - began)
                    if again.returncode != 0 or container_ids(cluster) != ids:
                        print(again.stdout + again.stderr, file=sys.stderr)
                        print("the idempotent tp4 up changed the line", file=sys.stderr)
                        return 1
                    print(f"run {i + 1}: tp4 up (line already up from this plan): {times[-1]:.2f} s")
            finally:
                stop(path)
    finally:
        server.shutdown()
        shutil.rmtree(work, ignore_errors=True)
    median = statistics.median(times)
    ok = median <= GOAL
    print(
        f"idempotent tp4 up: median {median:.2f} s, max {max(times):.2f} s over {len(times)} runs; "
        f"goal <= {GOAL:.0f} s: ratio {median / GOAL:.2f} ({'met' if ok else 'MISSED'})"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
