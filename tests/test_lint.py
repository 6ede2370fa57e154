"""ruff's linter and formatter over the whole Python tree and mypy (strict, pydantic's plugin)
over the tp4 package, each with its settings in python/pyproject.toml."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit


def _ruff() -> Path:
    # beside the interpreter (the venv, a python3.withPackages env), else on PATH (`nix develop`)
    ruff = Path(sys.executable).with_name("ruff")
    return ruff if ruff.exists() else Path(shutil.which("ruff") or "ruff")


def test_every_python_file_is_as_ruff_format_leaves_it(repo):
    """The code is formatted by `ruff format` (120 columns, python/pyproject.toml); fix: run
    `.venv/bin/ruff format --config python/pyproject.toml python tests bench`."""
    proc = subprocess.run(
        [
            str(_ruff()),
            "format",
            "--check",
            "--config",
            str(repo / "python/pyproject.toml"),
            "python",
            "tests",
            "bench",
        ],
        cwd=repo,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-1000:]


def test_ruff_finds_nothing(repo):
    proc = subprocess.run(
        [str(_ruff()), "check", "--config", str(repo / "python/pyproject.toml"), "python", "tests", "bench"],
        cwd=repo,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-1000:]


def test_mypy_strict_finds_nothing(repo, tmp_path):
    # `cd python && mypy`, as a developer runs it: [tool.mypy] names the files (the tp4 package)
    # and the plugin. The interpreter running the tests runs mypy, so the plugin and the stubs
    # are those of the same environment; the cache goes to a fresh directory, never the tree.
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path / "cache")],
        cwd=repo / "python",
        capture_output=True,
        text=True,
    )
    out, code = proc.stdout + proc.stderr, proc.returncode
    assert code == 0, out
    # every module of the package was checked, not a part of it
    modules = sorted((repo / "python/tp4").rglob("*.py"))
    assert re.search(rf"^Success: no issues found in {len(modules)} source files$", out, re.M), out


def test_mypy_is_strict_over_the_whole_package(repo):
    """What the check above means: strict, the pydantic plugin, and no module let off."""
    pyproject = tomllib.loads((repo / "python/pyproject.toml").read_text())["tool"]
    mypy = pyproject["mypy"]
    assert mypy["strict"] is True and mypy["files"] == ["tp4"] and mypy["plugins"] == ["pydantic.mypy"]
    # an override may only concern a third-party module, never let one of ours off
    for override in mypy.get("overrides", []):
        modules = override["module"] if isinstance(override["module"], list) else [override["module"]]
        assert not [m for m in modules if m == "tp4" or m.startswith("tp4.")], override
    # the plugin's checks of model construction: no unknown keyword, typed fields, aliases given
    assert pyproject["pydantic-mypy"] == {
        "init_forbid_extra": True,
        "init_typed": True,
        "warn_required_dynamic_aliases": True,
    }
