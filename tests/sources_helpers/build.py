"""Builders: tar archives, unified diffs, synthetic b12x-like sources, and nix invocations."""

from __future__ import annotations

import difflib
import gzip
import hashlib
import io
import os
import shutil
import tarfile
from pathlib import Path

from tp4.core import process

NIX_CONFIG = "experimental-features = nix-command flakes\nsubstituters =\nflake-registry = {registry}\n"


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def tar_gz(
    files: dict[str, bytes | str], *, modes: dict[str, int] | None = None, symlinks: dict[str, str] | None = None
) -> bytes:
    """A .tar.gz with fixed metadata, the gzip header's mtime included (tarfile's "w:gz" stamps
    the current second, so two calls a second apart differ); values are bytes, or str (utf-8)."""
    buf = io.BytesIO()
    modes = modes or {}
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        dirs = sorted({str(p) for name in files for p in Path(name).parents if str(p) != "."})
        for d in dirs:
            info = tarfile.TarInfo(d)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
        for name, content in sorted(files.items()):
            data = content.encode() if isinstance(content, str) else content
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), modes.get(name, 0o644)
            tar.addfile(info, io.BytesIO(data))
        for name, target in (symlinks or {}).items():
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
    return gzip.compress(buf.getvalue(), mtime=0)


def unified_diff(path: str, before: str, after: str, *, prefix: str = "") -> str:
    """A unified diff of one file; ``prefix`` is "a/"/"b/" style for -p1 patches."""
    old = f"{prefix and 'a/'}{path}"
    new = f"{prefix and 'b/'}{path}"
    return "".join(difflib.unified_diff(before.splitlines(True), after.splitlines(True), old, new))


B12X_INIT = '''"""b12x: kernels. See b12x-source for provenance."""
import os
from b12x.comm import roce
from b12x import kernels as b12x_kernels

CACHE = os.environ.get("B12X_CACHE_DIR", "/tmp/b12x")
ALREADY = os.environ.get("B12X_NEXT_KNOB", "")
NAME = "b12x"
'''
B12X_KERNEL_C = """/* b12x kernel */
#define B12X_TILE 64
static int b12x_tile(void) { return B12X_TILE; }
int b12x(void) { return b12x_tile(); }
"""
B12X_COMM = """import b12x
def all_gather(x):
    return b12x.ops.gather(x)
"""
B12X_MOE = """def plan(n):
    tiles = [64, 128]
    return tiles
"""
B12X_MOE_PATCHED = """def plan(n):
    tiles = [64, 128]
    if n == 576:
        tiles.insert(0, 32)
    return tiles
"""


def b12x_sources() -> dict[str, bytes | str]:
    """A small b12x-like GitHub archive (top dir b12x-<sha>/)."""
    top = "b12x-0123456"
    return {
        f"{top}/LICENSE": "Apache-2.0\n",
        f"{top}/README.md": "b12x readme, mentions b12x\n",
        f"{top}/b12x/__init__.py": B12X_INIT,
        f"{top}/b12x/comm/__init__.py": B12X_COMM,
        f"{top}/b12x/kernels/tile.c": B12X_KERNEL_C,
        f"{top}/b12x/moe/plan.py": B12X_MOE,
        f"{top}/b12x/sequence/engram/__init__.py": "import b12x\n",
        f"{top}/b12x/__pycache__/x.cpython-312.pyc": b"\x00\x01pyc",
        f"{top}/b12x/docs/notes.txt": "b12x in a txt file is not renamed\n",
    }


def b12x_next_patches() -> list[str]:
    """Two -p0 patches written against the renamed tree, like upstream's b12x_next patches."""
    first = unified_diff("b12x_next/moe/plan.py", B12X_MOE, B12X_MOE_PATCHED)
    comm_before = B12X_COMM.replace("b12x", "b12x_next")
    comm_after = comm_before.replace("return b12x_next.ops.gather(x)", "return b12x_next.ops.gather(x, columns=None)")
    second = unified_diff("b12x_next/comm/__init__.py", comm_before, comm_after)
    return [first, second]


def nix_env(tmp: Path) -> dict[str, str]:
    registry = tmp / "registry.json"
    if not registry.exists():
        registry.write_text('{"flakes":[],"version":2}')
    return {"NIX_CONFIG": NIX_CONFIG.format(registry=registry)}


def have_nix() -> bool:
    return shutil.which("nix-instantiate") is not None and shutil.which("nix") is not None


def nix(args: list[str], tmp: Path, *, check: bool = True):
    return process.run(["nix", *args], env=nix_env(tmp), check=check)


def nix_eval_json(expr: str, tmp: Path):
    import json

    proc = process.run(["nix-instantiate", "--eval", "--strict", "--json", "-E", expr], env=nix_env(tmp))
    return json.loads(proc.stdout)


def write_tree(root: Path, spec: dict) -> None:
    """spec: name -> bytes (file), ("x", bytes) executable, ("l", target) symlink, dict (dir)."""
    root.mkdir(parents=True, exist_ok=True)
    for name, value in spec.items():
        path = root / name
        if isinstance(value, dict):
            write_tree(path, value)
        elif isinstance(value, tuple) and value[0] == "l":
            os.symlink(value[1], path)
        elif isinstance(value, tuple) and value[0] == "x":
            path.write_bytes(value[1])
            path.chmod(0o755)
        else:
            path.write_bytes(value)
            path.chmod(0o644)
