#!/usr/bin/env python3
"""`tp4 plan` from process start to output, median of 20 runs (target: <= 300 ms on 2 cores).

    .venv/bin/python bench/bench_plan.py [--runs 20] [--tp4 PATH]

Prints the median, the target and their ratio; exits 1 when the target is missed.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

TARGET_MS = 300.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=20)
    default = Path(sys.executable).with_name("tp4")
    parser.add_argument("--tp4", default=str(default) if default.exists() else shutil.which("tp4"))
    parser.add_argument("--args", default="plan", help="arguments to tp4 (default: plan)")
    args = parser.parse_args()
    if not args.tp4:
        print("tp4 is not installed: run bash python/setup.sh first", file=sys.stderr)
        return 2
    argv = [args.tp4, *args.args.split()]
    subprocess.run(argv, capture_output=True, check=True)  # warm the page cache once
    times = []
    for _ in range(args.runs):
        start = time.perf_counter()
        proc = subprocess.run(argv, capture_output=True)
        times.append((time.perf_counter() - start) * 1000)
        if proc.returncode != 0 or not proc.stdout:
            print(f"tp4 {args.args} failed: {proc.stderr.decode()[-500:]}", file=sys.stderr)
            return 2
    median = statistics.median(times)
    print(f"tp4 {args.args}: median {median:.1f} ms over {args.runs} runs (min {min(times):.1f}, max {max(times):.1f})")
    print(f"target {TARGET_MS:.0f} ms; ratio median/target = {median / TARGET_MS:.2f}")
    return 0 if median <= TARGET_MS else 1


if __name__ == "__main__":
    sys.exit(main())
