"""tp4's Python at the nixpkgs pin: pkgs/tp4.nix checks python/pyproject.toml's bounds against
the interpreter and the dependency versions nixpkgs packages (pkgs/python-bounds.nix) at
evaluation, and docs/build.md's table says the same as the stand-in and pyproject.toml."""

from __future__ import annotations

import json
import re
import subprocess
import tomllib
from pathlib import Path

import pytest

from nix_env import empty_flake, locked_flake_copy, nix, stub_inputs

REPO = Path(__file__).resolve().parent.parent
PYPROJECT = REPO / "python" / "pyproject.toml"


def instantiate(expr: str):
    proc = subprocess.run(
        ["nix-instantiate", "--eval", "--strict", "--json", "--expr", expr], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def satisfies(version: str, constraint: str) -> bool:
    return instantiate(f'(import {REPO}/pkgs/python-bounds.nix).satisfies "{version}" "{constraint}"')


@pytest.mark.parametrize(
    ("version", "constraint", "ok"),
    [
        ("2.13.4", "^2.7", True),
        ("3.0", "^2.7", False),
        ("2.6.9", "^2.7", False),
        ("0.28.1", "^0.28", True),
        ("0.29.0", "^0.28", False),
        ("1.10.2", ">=1.0,<3", True),
        ("3.0.0", ">=1.0,<3", False),
        ("3.13.14", ">=3.11,<3.14", True),
        ("3.14.6", ">=3.11,<3.14", False),
        ("0.6.1", ">=0.6", True),
        ("1.2.9", "~1.2", True),
        ("1.3.0", "~1.2", False),
        ("0.3.2", "0.3.2", True),
        ("0.3.3", "0.3.2", False),
        ("7", "*", True),
    ],
)
def test_poetry_constraints_read_as_poetry_reads_them(version, constraint, ok):
    assert satisfies(version, constraint) is ok


def stub_attr(attr: str):
    return instantiate(f"(import {REPO}/tests/nixpkgs-stub {{ }}).{attr}")


def test_nixpkgs_python3_at_the_pin_is_outside_the_bound_so_tp4_uses_python313():
    bound = tomllib.loads(PYPROJECT.read_text())["tool"]["poetry"]["dependencies"]["python"]
    assert stub_attr("python3.version") == "3.14.6" and not satisfies("3.14.6", bound)
    assert stub_attr("python313.version") == "3.13.14" and satisfies("3.13.14", bound)
    assert "python = pkgs.python313;" in (REPO / "pkgs" / "tp4.nix").read_text()


def doc_table() -> dict[str, tuple[str, str, str]]:
    text = (REPO / "docs" / "build.md").read_text()
    section = text.split("## Python at the pin", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip().strip("`") for c in line.strip().strip("|").split("|")]
        if len(cells) == 5 and re.fullmatch(r"[0-9][0-9.]*", cells[1]):
            rows[cells[0]] = (cells[1], cells[3], cells[4])
    return rows


def test_docs_table_matches_the_stand_in_and_pyproject():
    deps = tomllib.loads(PYPROJECT.read_text())["tool"]["poetry"]["dependencies"]
    rows = doc_table()
    assert set(rows) == {*(d for d in deps if d != "python"), "python3", "python313"}
    for name, (version, bound, ok) in rows.items():
        if name.startswith("python3"):
            assert stub_attr(f"{name}.version") == version and bound == deps["python"]
        else:
            assert stub_attr(f'python3Packages."{name}".version') == version and bound == deps[name]
        assert ok == ("ok" if satisfies(version, bound) else "no"), name


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("python-pin")


def evaluate_tp4(work: Path, flake: Path):
    argv = [
        "eval",
        "--raw",
        f"path:{flake}#packages.x86_64-linux.tp4.drvPath",
        *stub_inputs(REPO, empty_flake(work / "empty")),
    ]
    return nix(argv, work)


def test_the_pin_satisfies_pyproject(work):
    proc = evaluate_tp4(work, locked_flake_copy(REPO, work / "ok"))
    assert proc.returncode == 0, proc.stderr


def test_a_version_outside_the_bounds_stops_evaluation_naming_each(work):
    flake = locked_flake_copy(REPO, work / "bad")
    pyproject = flake / "python" / "pyproject.toml"
    text = pyproject.read_text().replace('pydantic = "^2.7"', 'pydantic = "^3.0"')
    text = text.replace('python = ">=3.11,<3.14"', 'python = ">=3.11,<3.13"')
    pyproject.write_text(text)
    proc = evaluate_tp4(work, flake)
    assert proc.returncode != 0
    assert "the pinned nixpkgs does not satisfy python/pyproject.toml" in proc.stderr
    assert 'python 3.13.14 (pkgs.python313) is outside ">=3.11,<3.13"' in proc.stderr
    assert 'pydantic 2.13.4 (pkgs.python313Packages.pydantic) is outside "^3.0"' in proc.stderr
    assert "click" not in proc.stderr.split("does not satisfy", 1)[1].split("fix:")[0]
    assert "fix: move the bound in python/pyproject.toml" in proc.stderr
