#!/usr/bin/env python3
"""CLI latency from process start to output: `tp4 plan` (goal <= 150 ms) and `tp4 --help`
(goal <= 80 ms), median of N runs each (issue 8 §6; 2 cores).

    .venv/bin/python bench/bench_plan.py [--runs 20] [--python PATH | --tp4 PATH]

By default the code of this checkout (its python/ directory first on PYTHONPATH) runs under the
interpreter running the bench, started the way the console script starts it (`from tp4.cli
import main; main()`): after `bash python/setup.sh`, `.venv/bin/python bench/bench_plan.py`
measures what `.venv/bin/tp4` does. --python picks another interpreter for this checkout's code;
--tp4 runs an installed executable instead (e.g. the nix package's result/bin/tp4), whatever
code it imports.

Bytecode is written as Python normally writes it (PYTHONDONTWRITEBYTECODE is dropped for the
runs; __pycache__ is git-ignored), so the runs time what a user's second run costs, not the
compiler. Prints each median (and the median CPU time, which other processes inflate less than
wall time; a note says when the load average shows the machine busy), its goal and their ratio;
exits 1 when a wall-time goal is missed, 2 when a run fails.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

CHECKOUT_PYTHON = Path(__file__).resolve().parent.parent / "python"
# (label, arguments to tp4, goal in ms)
CASES: list[tuple[str, list[str], float]] = [
    ("tp4 plan", ["plan"], 150.0),
    ("tp4 --help", ["--help"], 80.0),
]
# what the pip console script does, with tp4's argv
CONSOLE = "import sys; from tp4.cli import main; sys.argv[0] = 'tp4'; sys.exit(main())"


def command(args: argparse.Namespace) -> tuple[list[str], dict[str, str], str]:
    """The argv prefix to run tp4, its environment, and what it measures (for the report)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    if args.tp4:
        return [args.tp4], env, f"{args.tp4} (installed)"
    env["PYTHONPATH"] = os.pathsep.join([str(CHECKOUT_PYTHON), *filter(None, [os.environ.get("PYTHONPATH")])])
    return [args.python, "-c", CONSOLE], env, f"{CHECKOUT_PYTHON} under {args.python}"


def measure(argv: list[str], env: dict[str, str], runs: int) -> tuple[list[float], list[float]] | str:
    """Wall and CPU (user + system) times in ms of `runs` runs, or the error of a failed run."""
    wall: list[float] = []
    cpu: list[float] = []
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        proc = subprocess.run(argv, capture_output=True, env=env)
        wall.append((time.perf_counter() - start) * 1000)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu.append((after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime) * 1000)
        if proc.returncode != 0 or not proc.stdout:
            return f"exit {proc.returncode}: {proc.stderr.decode(errors='replace')[-500:]}"
    return wall, cpu


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=20, help="runs per command (default 20)")
    how = parser.add_mutually_exclusive_group()
    how.add_argument(
        "--python", default=sys.executable, help="interpreter for this checkout's code (default: this one)"
    )
    how.add_argument("--tp4", help="an installed tp4 executable to time instead of this checkout's code")
    args = parser.parse_args()
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    prefix, env, what = command(args)
    print(f"timing {what}, {args.runs} runs each")
    load = os.getloadavg()[0]
    if load > (os.cpu_count() or 1) / 2:
        # the goals are for a quiet machine: CPU time (printed too) is less inflated by others' load
        print(f"note: load average {load:.1f} on {os.cpu_count()} cores; wall times are inflated")
    missed = False
    for label, tp4_args, goal in CASES:
        argv = [*prefix, *tp4_args]
        # once untimed: writes bytecode and warms the page cache
        subprocess.run(argv, capture_output=True, env=env)
        result = measure(argv, env, args.runs)
        if isinstance(result, str):
            print(f"{label} failed: {result}", file=sys.stderr)
            return 2
        wall, cpu = result
        median = statistics.median(wall)
        ratio = median / goal
        missed = missed or ratio > 1
        print(
            f"{label}: median {median:.1f} ms (min {min(wall):.1f}, max {max(wall):.1f}; cpu median "
            f"{statistics.median(cpu):.1f}); goal {goal:.0f} ms; ratio {ratio:.2f}{'' if ratio <= 1 else '  MISSED'}"
        )
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
