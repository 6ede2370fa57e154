"""Imports point down: errors <- process <- nix / containers / sources <- build / distribute <- cli;
and only the funnel (tp4.process, and tp4.sources.gitrepo for git) starts programs.

Read from the source with ast (function-level imports count too), so a lazy import that points
up fails here as well."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

PACKAGE = Path(__file__).resolve().parent.parent / "python" / "tp4"

# module prefix -> the tp4 modules it must never import
FORBIDDEN = {
    "tp4.errors": ("tp4.",),
    # the image steps run inside Nix builds with the standard library alone (pkgs/src.nix `oci`)
    "tp4.oci": ("tp4.",),
    "tp4.process": ("tp4.cli", "tp4.build", "tp4.distribute", "tp4.containers", "tp4.nix", "tp4.profile",
                    "tp4.plan", "tp4.sources", "tp4.registry"),
    "tp4.containers": ("tp4.cli", "tp4.build", "tp4.distribute", "tp4.profile", "tp4.plan"),
    "tp4.nix": ("tp4.cli", "tp4.build", "tp4.distribute", "tp4.profile", "tp4.plan"),
    "tp4.sources": ("tp4.cli", "tp4.build", "tp4.distribute", "tp4.containers", "tp4.profile", "tp4.plan"),
    # the profile's rules (validate) and its loader (load) share Problem from its own module
    "tp4.profile.problem": ("tp4.",),
    "tp4.profile.validate": ("tp4.profile.load",),
    "tp4.profile": ("tp4.cli", "tp4.build", "tp4.distribute", "tp4.containers", "tp4.nix", "tp4.process"),
    "tp4.plan": ("tp4.cli", "tp4.build", "tp4.distribute", "tp4.containers", "tp4.nix", "tp4.process"),
    "tp4.registry": ("tp4.cli", "tp4.build", "tp4.distribute", "tp4.containers", "tp4.nix", "tp4.process"),
    "tp4.build": ("tp4.cli",),
    "tp4.distribute": ("tp4.cli",),
}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            if node.module == "tp4":
                found |= {f"tp4.{a.name}" for a in node.names}
    return found


def test_no_module_imports_a_layer_above_it():
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = module_name(path)
        for prefix, banned in FORBIDDEN.items():
            if name == prefix or name.startswith(prefix + "."):
                wrong += [f"{name} imports {m}" for m in sorted(imports(path))
                          if any(m == b.rstrip(".") or m.startswith(b.rstrip(".") + ".") for b in banned)]
    assert wrong == []


# who may start a program: the funnel, and the git module that runs git through GitPython the same way
RUNS_PROGRAMS = {"subprocess": ("tp4.process",), "git": ("tp4.sources.gitrepo",)}
# other ways to start a program that would bypass the funnel
OS_SPAWNERS = ("system", "popen", "spawn", "exec", "posix_spawn", "fork")


def test_only_the_funnel_starts_programs():
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = module_name(path)
        for module, allowed in RUNS_PROGRAMS.items():
            if name not in allowed and any(m == module or m.startswith(module + ".") for m in imports(path)):
                wrong.append(f"{name} imports {module}")
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "os"
                    and node.attr.startswith(OS_SPAWNERS)):
                wrong.append(f"{name} calls os.{node.attr}")
            if isinstance(node, ast.ImportFrom) and node.module in ("os", "pty") and any(
                    a.name.startswith(OS_SPAWNERS) for a in node.names):
                wrong.append(f"{name} imports a spawner from {node.module}")
    assert wrong == []


def test_the_funnel_check_sees_a_lazy_subprocess_import(tmp_path):
    probe = tmp_path / "m.py"
    probe.write_text("def f():\n    import subprocess.run\n    import git\n")
    assert {"subprocess.run", "git"} <= imports(probe)


def test_the_check_sees_lazy_imports(tmp_path):
    probe = tmp_path / "m.py"
    probe.write_text("def f():\n    from tp4.cli import main\n    from tp4 import build\n")
    assert {"tp4.cli", "tp4.build"} <= imports(probe)


def test_python_m_tp4_sources_loads_nothing_of_the_cli(tmp_path):
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "f").write_text("x")
    code = ("import runpy, sys; sys.argv = ['tp4.sources', 'hash', '--format', 'hex', sys.argv[1]]\n"
            "try:\n    runpy.run_module('tp4.sources', run_name='__main__')\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in sys.modules if m.startswith('tp4.cli') or m == 'click'))")
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path / "t")], capture_output=True, text=True,
                          env={"PYTHONPATH": str(PACKAGE.parent)}, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "[]"
