"""The benchmark scripts say what a machine lacks instead of ending in a traceback."""

from __future__ import annotations

import os
import subprocess
import sys


def test_bench_distribute_names_what_is_missing_and_how_to_set_up(repo, tmp_path):
    bare = tmp_path / "bin"
    bare.mkdir()
    (bare / "python3").symlink_to(sys.executable)
    env = {**os.environ, "PATH": str(bare), "TP4_TEST_BUSYBOX": str(tmp_path / "no-busybox")}
    proc = subprocess.run([sys.executable, str(repo / "bench" / "bench_distribute.py"), "--size-mb", "1"],
                          env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "no-busybox" in proc.stderr and "podman" in proc.stderr
    assert "bash python/setup.sh --test" in proc.stderr
