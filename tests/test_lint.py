"""ruff over the whole Python tree, with the rules in python/pyproject.toml."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def test_ruff_finds_nothing(repo):
    ruff = Path(sys.executable).with_name("ruff")
    proc = subprocess.run([str(ruff), "check", "--config", str(repo / "python/pyproject.toml"),
                           "python", "tests", "bench"], cwd=repo, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-1000:]
