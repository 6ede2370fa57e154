"""`tp4 sources hash` on trees NAR cannot hold or this user cannot read: a user error (exit 2)
naming the path, never an internal error."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _hash(path: Path, *, drop_dac: bool = False) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "tp4", "sources", "hash", str(path)]
    if drop_dac:
        # root without the capabilities that override file modes: a mode-000 directory is unreadable
        caps = "-dac_override,-dac_read_search"
        argv = ["setpriv", f"--inh-caps={caps}", f"--bounding-set={caps}", *argv]
    env = {**os.environ, "PYTHONPATH": str(REPO / "python")}
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)


def test_fifo_inside_the_tree(tmp_path):
    (tmp_path / "t" / "sub").mkdir(parents=True)
    (tmp_path / "t" / "a").write_text("a")
    os.mkfifo(tmp_path / "t" / "sub" / "fifo")
    proc = _hash(tmp_path / "t")
    assert proc.returncode == 2, proc.stderr
    assert f"{tmp_path}/t/sub/fifo: not a regular file" in proc.stderr and "internal error" not in proc.stderr
    assert proc.stdout == ""


def test_unreadable_subdirectory(tmp_path):
    tree = tmp_path / "t"
    (tree / "locked").mkdir(parents=True)
    (tree / "locked" / "f").write_text("x")
    (tree / "locked").chmod(0)
    try:
        proc = _hash(tree, drop_dac=True)
    finally:
        (tree / "locked").chmod(0o755)
    assert proc.returncode == 2, proc.stderr
    assert f"{tree}/locked: Permission denied" in proc.stderr and "internal error" not in proc.stderr
    assert _hash(tree).returncode == 0  # the same tree, readable again, hashes
