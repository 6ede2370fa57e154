"""Code and docs cite only what a reader of this repository can open: an upstream repository
path (`start.sh`, `Dockerfile.canary-roce`), or a file of ours such as docs/upstream.md."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

# the seed specification the project was started from; it is not part of the repository
SEED_SPEC = "upstream-" + "line"


# what is not the repository's own text: caches, build results, virtual environments
SKIP_DIRS = {".git", ".venv", ".hypothesis", ".pytest_cache", ".ruff_cache", ".mypy_cache", "__pycache__", "dist"}


def _files(repo: Path) -> list[str]:
    """The repository's files (walked, not `git ls-files`: the Nix unit check runs without git)."""
    out = []
    for root, dirs, files in os.walk(repo):
        dirs[:] = [
            d
            for d in dirs
            if d not in SKIP_DIRS
            and not d.endswith(".egg-info")
            and not (Path(root) == repo and d.startswith("result"))
        ]
        for name in files:
            path = Path(root) / name
            if path.is_file() and not path.is_symlink():
                out.append(str(path.relative_to(repo)))
    return sorted(out)


def test_no_file_cites_the_seed_specification(repo):
    citing = []
    for name in _files(repo):
        try:
            text = (repo / name).read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        citing += [f"{name}:{n}" for n, line in enumerate(text.splitlines(), 1) if SEED_SPEC in line]
    assert citing == [], "cite the upstream repository path or docs/upstream.md instead"


def test_every_docs_page_the_code_and_docs_name_exists(repo):
    """`docs/x.md` in our code and docs is ours; an upstream one is written `K docs/...` or `M docs/...`."""
    missing = []
    for name in _files(repo):
        if not (name.startswith(("python/", "pkgs/", "docs/", "adapters/")) or name in ("README.md", "flake.nix")):
            continue
        text = (repo / name).read_text(encoding="utf-8", errors="replace")
        for doc in set(re.findall(r"(?<![KM] `)(?<![\w/.-])docs/[A-Za-z0-9_-]+\.md\b", text)):
            if not (repo / doc).is_file():
                missing.append(f"{name}: {doc}")
    assert missing == []


def test_docs_upstream_names_the_repositories_and_files_the_code_cites(repo):
    text = (repo / "docs" / "upstream.md").read_text()
    for name in (
        "MiaAI-Lab/DeepSeek-v4.1-Flash-DGX-Sparks",
        "knapcio/DeepSeek-V4.1-Flash-4x-DGX-Spark-TP4",
        "`start.sh`",
        "`start-tp4.sh`",
        "`files/nccl.sh`",
        "`.env.tp4.example`",
        "`boot.py`",
        "`Dockerfile.canary-roce`",
        "`runtime/sources.manifest`",
        "`adapter/sitecustomize.py`",
    ):
        assert name in text, name
