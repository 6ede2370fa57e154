"""Imports point down: errors <- process <- nix / containers / sources <- build / distribute <- cli;
nodes <- doctor <- serve; and only the funnel (tp4.process, and tp4.sources.gitrepo for git) starts
programs. No two modules of tp4 import each other, through any chain.

Read from the source with ast (function-level imports count too), so a lazy import that points
up fails here as well. The cycle check leaves out imports under `if TYPE_CHECKING:` alone: they
name types for the type checker and never run."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
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
    "tp4.profile.validate": ("tp4.profile.load", "tp4.plan"),  # it checks what the loader rendered
    # host handles sit below everything that acts on hosts
    "tp4.nodes": ("tp4.cli", "tp4.serve", "tp4.doctor", "tp4.deploy", "tp4.pack", "tp4.share", "tp4.fleet",
                  "tp4.needle", "tp4.profile"),
    "tp4.doctor": ("tp4.cli", "tp4.serve", "tp4.deploy", "tp4.fleet", "tp4.needle"),
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


def _type_checking_only(node: ast.AST) -> bool:
    """`if TYPE_CHECKING:` (or `typing.TYPE_CHECKING`)."""
    test = node.test if isinstance(node, ast.If) else None
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _import_nodes(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement anywhere in the module (functions, classes, try, if), except the
    body of an `if TYPE_CHECKING:` block (its `else` runs, and counts)."""
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        children = node.orelse if _type_checking_only(node) else ast.iter_child_nodes(node)  # type: ignore[attr-defined]
        stack.extend(children)


def runtime_imports(path: Path, name: str, known: set[str]) -> set[str]:
    """The modules of `known` that the module `name` (at `path`) imports when it runs: absolute and
    relative imports, `from pkg import sub` as the submodule pkg.sub."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()

    def nearest(target: str) -> str | None:
        while target and target not in known:
            target = target.rpartition(".")[0]
        return target or None

    for node in _import_nodes(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        else:
            base = node.module or ""
            if node.level:
                package = name.split(".") if is_package else name.split(".")[:-1]
                package = package[:len(package) - (node.level - 1)]
                base = ".".join([*package, base] if base else package)
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        found |= {t for t in map(nearest, targets) if t is not None and t != name}
    return found


def import_graph(root: Path) -> dict[str, set[str]]:
    """module -> the modules of the same package tree it imports at run time."""
    paths = {".".join(p.relative_to(root.parent).with_suffix("").parts).removesuffix(".__init__"): p
             for p in sorted(root.rglob("*.py"))}
    known = set(paths)
    return {name: runtime_imports(path, name, known) for name, path in paths.items()}


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (a -> b -> ... -> a) through every strongly connected group of modules (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.add(w)
                if w == v:
                    break
            if len(group) > 1 or v in graph[v]:
                groups.append(group)

    for v in sorted(graph):
        if v not in index:
            visit(v)

    def path_back(group: set[str]) -> list[str]:
        start = min(group)
        seen = {start: [start]}
        todo = [start]
        while todo:  # breadth first: the shortest cycle through `start`
            v = todo.pop(0)
            for w in sorted(graph[v] & group):
                if w == start:
                    return [*seen[v], start]
                if w not in seen:
                    seen[w] = [*seen[v], w]
                    todo.append(w)
        raise AssertionError(group)

    return [path_back(g) for g in groups]


def test_no_import_cycles():
    cycles = import_cycles(import_graph(PACKAGE))
    assert not cycles, "import cycles in python/tp4:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_the_cycle_check_sees_a_cycle_through_a_lazy_import(tmp_path):
    pkg = tmp_path / "p"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from p.sub import b\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from .. import c\n")
    (pkg / "c.py").write_text("try:\n    import p.a\nexcept ImportError:\n    pass\n")
    assert import_cycles(import_graph(pkg)) == [["p.a", "p.sub.b", "p.c", "p.a"]]


def test_the_cycle_check_leaves_out_type_checking_imports_only(tmp_path):
    pkg = tmp_path / "p"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from p import b\n")
    (pkg / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from p import a\n")
    assert import_cycles(import_graph(pkg)) == []
    (pkg / "b.py").write_text("import typing\nif typing.TYPE_CHECKING:\n    pass\nelse:\n    from p import a\n")
    assert import_cycles(import_graph(pkg)) == [["p.a", "p.b", "p.a"]]


def test_the_renderer_reads_no_preset_file_and_the_validator_renders_nothing():
    """Parse, render, check: the loader reads the preset files and records the preset's gates on
    the Profile; the renderer (tp4.plan) reads them there; the validator checks what the loader
    rendered and never calls the renderer."""
    graph = import_graph(PACKAGE)
    assert "tp4.profile.load" not in graph["tp4.plan"]
    assert "tp4.plan" not in graph["tp4.profile.validate"]
    assert "tp4.serve" not in graph["tp4.doctor"] and "tp4.serve" not in graph["tp4.nodes"]
