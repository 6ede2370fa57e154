"""bench/bench_watch.py's options: --help names every part's settings, and a bad value is refused
with exit 2 and a message naming the option and the fix before anything starts (no cluster: the
script's quickest real run takes minutes, too long for the suite)."""

from __future__ import annotations

import subprocess
import sys

import pytest


def run(repo, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(repo / "bench" / "bench_watch.py"), *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_help_names_the_settings_of_each_part(repo):
    proc = run(repo, "--help")
    assert proc.returncode == 0, proc.stderr
    for option in ("--interval", "--probe-timeout", "--confirm", "--confirm-interval", "--load-seconds", "--runs"):
        assert option in proc.stdout
    assert "docs/watch.md" in proc.stdout


@pytest.mark.parametrize(
    ("args", "named", "fix"),
    [
        (["--runs", "0"], "--runs", "outside 1..100"),
        (["--interval", "soon"], "--interval", "not a number"),
        (["--probe-timeout", "-1"], "--probe-timeout", "outside 0.5..60"),
        (["--load-seconds", "10"], "--load-seconds 10", "0 (skip it) or at least 30"),
        (["--concurrency", "0"], "--concurrency", "outside 1..256"),
        (["--interval", "2", "--confirm-interval", "3"], "--confirm-interval 3", "up to --interval"),
    ],
)
def test_a_bad_value_is_refused_before_anything_runs(repo, args, named, fix):
    proc = run(repo, *args)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert named in last and fix in last and "fix:" in last, last
    assert "starting the four netns hosts" not in proc.stdout
