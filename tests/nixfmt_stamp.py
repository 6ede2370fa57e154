"""Record that every .nix file of the tree is as the real nixfmt leaves it.

No package registry here carries nixfmt, so CI cannot run it; a developer builds the real one
(shared/tools/nixfmt.md) and, after formatting, runs

    python tests/nixfmt_stamp.py [--nixfmt PATH]

which runs `nixfmt --check` over every .nix file and, only when it passes, writes
tests/nixfmt.sha256: nixfmt's version, then one `sha256  path` line per file.
tests/test_nix_format.py holds every .nix file to that list, so an edit made without running
nixfmt again fails CI, and runs nixfmt itself where it is installed.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
STAMP = REPO / "tests" / "nixfmt.sha256"
SKIP_DIRS = {".git", ".venv", ".hypothesis", "__pycache__", ".mypy_cache", "node_modules"}


def nix_files(root: Path = REPO) -> list[Path]:
    """Every .nix file of the tree, as paths relative to it (a build's `result` links left out)."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel = Path(dirpath).relative_to(root)
        dirnames[:] = sorted(
            d for d in dirnames if d not in SKIP_DIRS and not (rel == Path(".") and d.startswith("result"))
        )
        found += [rel / f for f in sorted(filenames) if f.endswith(".nix")]
    return sorted(found)


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def find_nixfmt() -> str | None:
    cached = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "nixfmt/bin/nixfmt"
    return str(cached) if cached.is_file() else shutil.which("nixfmt")


def read_stamp(path: Path = STAMP) -> tuple[str, dict[str, str]]:
    """(nixfmt's version line, {path: sha256})."""
    lines = path.read_text().splitlines()
    version, sums = lines[0].removeprefix("# "), {}
    for line in lines[1:]:
        sha, rel = line.split("  ", 1)
        sums[rel] = sha
    return version, sums


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nixfmt", help="the nixfmt binary (default: ~/.cache/nixfmt/bin/nixfmt, else PATH)")
    args = parser.parse_args()
    nixfmt = args.nixfmt or find_nixfmt()
    if not nixfmt:
        print("error: no nixfmt found; build it as shared/tools/nixfmt.md says, or pass --nixfmt", file=sys.stderr)
        return 2
    files = nix_files()
    check = subprocess.run([nixfmt, "--check", *map(str, files)], cwd=REPO, capture_output=True, text=True)
    if check.returncode != 0:
        print(check.stdout + check.stderr, end="", file=sys.stderr)
        print(f"error: format these with `{nixfmt} FILE...` first; nothing written", file=sys.stderr)
        return 1
    version = subprocess.run([nixfmt, "--version"], capture_output=True, text=True, check=True).stdout.strip()
    text = f"# {version}\n" + "".join(f"{digest(REPO / f)}  {f.as_posix()}\n" for f in files)
    tmp = STAMP.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(STAMP)
    print(f"{STAMP.relative_to(REPO)}: {len(files)} files formatted by {version}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
