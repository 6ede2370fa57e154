"""ruff over the whole Python tree, with the rules in python/pyproject.toml."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit


def test_ruff_finds_nothing(repo):
    # beside the interpreter (the venv, a python3.withPackages env), else on PATH (`nix develop`)
    ruff = Path(sys.executable).with_name("ruff")
    ruff = ruff if ruff.exists() else Path(shutil.which("ruff") or "ruff")
    proc = subprocess.run([str(ruff), "check", "--config", str(repo / "python/pyproject.toml"),
                           "python", "tests", "bench"], cwd=repo, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-1000:]
