"""Imports point down the stages of the line, each a package of python/tp4:

    core -> line -> image -> hosts -> serving -> measuring -> cli

(core: errors, paths, the subprocess funnel, secrets; line: profile, registry, knobs, plan; image:
sources, nix, oci, build, image store, distribution; hosts: nodes, doctor, share, pack, checkpoint
download, deploy; serving: serve, boot log, API, fleet; measuring: bench, report, needle, qeval.)
A module imports modules of its own stage or of stages before it, never a later one, and no two
modules of tp4 import each other through any chain. Only the funnel (tp4.core.process, and
tp4.image.sources.gitrepo for git) starts programs.

Read from the source with ast (function-level imports count too), so a lazy import that points
up fails here as well. The cycle check leaves out imports under `if TYPE_CHECKING:` alone: they
name types for the type checker and never run; the stage check counts them too."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

PACKAGE = Path(__file__).resolve().parent.parent / "python" / "tp4"

# the stages, first to last: the package of each, read from tp4/__init__.py's own list
sys.path.insert(0, str(PACKAGE.parent))
from tp4 import STAGES  # noqa: E402

# finer rules inside a stage: module prefix -> the tp4 modules it must never import
FORBIDDEN = {
    "tp4.core.errors": ("tp4.",),
    # the image steps run inside Nix builds with the standard library alone (pkgs/src.nix `oci`)
    "tp4.image.oci": ("tp4.",),
    # the sources code runs inside Nix builds with core alone (pkgs/src.nix `transforms`)
    "tp4.image.sources": ("tp4.line", "tp4.image.build", "tp4.image.distribute", "tp4.image.runtime_cli"),
    # the glibc check runs inside the runtime's Nix build with errors alone (pkgs/runtime.nix)
    "tp4.image.elf": ("tp4.line", "tp4.image.", "tp4.core.process", "tp4.core.userfiles"),
    "tp4.image.runtime_cli": ("tp4.image.build", "tp4.image.distribute"),
    "tp4.image.nix": ("tp4.image.build", "tp4.image.distribute"),
    # the profile's rules (validate) and its loader (load) share Problem from its own module
    "tp4.line.profile.problem": ("tp4.",),
    "tp4.line.profile.validate": ("tp4.line.profile.load", "tp4.line.plan"),  # it checks what the loader rendered
    # host handles sit below everything that acts on hosts
    "tp4.hosts.nodes": (
        "tp4.hosts.doctor",
        "tp4.hosts.deploy",
        "tp4.hosts.pack",
        "tp4.hosts.share",
        "tp4.line.profile",
    ),
    "tp4.hosts.doctor": ("tp4.hosts.deploy", "tp4.hosts.pack"),
}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    """Every module an import statement of the file names (TYPE_CHECKING ones too), `from a import b`
    as both a and a.b."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            if node.module.split(".")[0] == "tp4":
                found |= {f"{node.module}.{a.name}" for a in node.names}
    return found


def stage(module: str) -> int | None:
    """The index of a tp4 module's stage (None for tp4 itself, tp4.data, tp4.__main__)."""
    parts = module.split(".")
    return STAGES.index(parts[1]) if len(parts) > 1 and parts[1] in STAGES else None


def test_every_module_lies_in_a_stage():
    loose = sorted(module_name(p) for p in PACKAGE.rglob("*.py") if stage(module_name(p)) is None)
    assert loose == ["tp4", "tp4.__main__"]
    assert sorted(p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__") == sorted(
        [*STAGES, "data"]
    )


def test_no_module_imports_a_later_stage():
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = module_name(path)
        own = stage(name)
        if own is None:
            continue
        for m in sorted(imports(path)):
            other = stage(m) if m.startswith("tp4.") else None
            if other is not None and other > own:
                wrong.append(f"{name} ({STAGES[own]}) imports {m} ({STAGES[other]})")
    assert wrong == []


def test_the_stage_check_sees_an_upward_import(tmp_path):
    probe = tmp_path / "m.py"
    probe.write_text("def f():\n    from tp4.serving import serve\n")
    assert "tp4.serving.serve" in imports(probe) and stage("tp4.serving.serve") > stage("tp4.hosts.doctor")


def test_no_module_breaks_a_rule_within_its_stage():
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = module_name(path)
        for prefix, banned in FORBIDDEN.items():
            if name == prefix or name.startswith(prefix + "."):
                wrong += [
                    f"{name} imports {m}"
                    for m in sorted(imports(path))
                    if any(m == b.rstrip(".") or m.startswith(b.rstrip(".") + ".") for b in banned)
                    and not (m == name or m.startswith(name + "."))
                ]
    assert wrong == []


def test_each_stage_says_what_it_owns_and_may_import():
    for i, name in enumerate(STAGES):
        doc = ast.get_docstring(ast.parse((PACKAGE / name / "__init__.py").read_text())) or ""
        assert "Owns:" in doc and "May import:" in doc, name
        allowed = doc.split("May import:", 1)[1]
        assert all(f"tp4.{s}" in allowed for s in STAGES[:i]), name
        assert not any(f"tp4.{s}" in allowed for s in STAGES[i + 1 :]), name


# who may start a program: the funnel, and the git module that runs git through GitPython the same way
RUNS_PROGRAMS = {"subprocess": ("tp4.core.process",), "git": ("tp4.image.sources.gitrepo",)}
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
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == "os"
                and node.attr.startswith(OS_SPAWNERS)
            ):
                wrong.append(f"{name} calls os.{node.attr}")
            if (
                isinstance(node, ast.ImportFrom)
                and node.module in ("os", "pty")
                and any(a.name.startswith(OS_SPAWNERS) for a in node.names)
            ):
                wrong.append(f"{name} imports a spawner from {node.module}")
    assert wrong == []


def test_the_funnel_check_sees_a_lazy_subprocess_import(tmp_path):
    probe = tmp_path / "m.py"
    probe.write_text("def f():\n    import subprocess.run\n    import git\n")
    assert {"subprocess.run", "git"} <= imports(probe)


def test_the_check_sees_lazy_imports(tmp_path):
    probe = tmp_path / "m.py"
    probe.write_text("def f():\n    from tp4.cli import main\n    from tp4.image import build\n")
    assert {"tp4.cli", "tp4.image.build"} <= imports(probe)


def test_python_m_tp4_sources_loads_nothing_of_the_cli(tmp_path):
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "f").write_text("x")
    code = (
        "import runpy, sys; sys.argv = ['tp4.image.sources', 'hash', '--format', 'hex', sys.argv[1]]\n"
        "try:\n    runpy.run_module('tp4.image.sources', run_name='__main__')\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in sys.modules if m.startswith('tp4.cli') or m == 'click'))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "t")],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(PACKAGE.parent)},
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "[]"


def _type_checking_only(node: ast.AST) -> bool:
    """`if TYPE_CHECKING:` (or `typing.TYPE_CHECKING`)."""
    test = node.test if isinstance(node, ast.If) else None
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


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
                package = package[: len(package) - (node.level - 1)]
                base = ".".join([*package, base] if base else package)
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        found |= {t for t in map(nearest, targets) if t is not None and t != name}
    return found


def import_graph(root: Path) -> dict[str, set[str]]:
    """module -> the modules of the same package tree it imports at run time."""
    paths = {
        ".".join(p.relative_to(root.parent).with_suffix("").parts).removesuffix(".__init__"): p
        for p in sorted(root.rglob("*.py"))
    }
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
    the Profile; the renderer (tp4.line.plan) reads them there; the validator checks what the loader
    rendered and never calls the renderer."""
    graph = import_graph(PACKAGE)
    assert "tp4.line.profile.load" not in graph["tp4.line.plan"]
    assert "tp4.line.plan" not in graph["tp4.line.profile.validate"]
    assert "tp4.serving.serve" not in graph["tp4.hosts.doctor"] and "tp4.serving.serve" not in graph["tp4.hosts.nodes"]
