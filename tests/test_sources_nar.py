"""NAR hashing in pure Python against the real `nix hash path` / `nix store add-path`."""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sources_helpers.build import have_nix, nix, nix_env, write_tree
from tp4.core import process
from tp4.image.sources import nar

# nix is required, never skipped: bash tests/run installs nix-bin
assert have_nix(), "nix is not installed: run bash tests/run (python/setup.sh --test installs nix-bin)"


def nix_hash(path: Path, tmp: Path, *extra: str) -> str:
    return nix(["hash", "path", *extra, str(path)], tmp).stdout.strip()


SPECIAL_TREE = {
    "empty-file": b"",
    "empty-dir": {},
    "exe": ("x", b"#!/bin/sh\necho hi\n"),
    "link-to-file": ("l", "exe"),
    "dangling": ("l", "../nowhere/at/all"),
    "dir-link": ("l", "sub"),
    "sub": {"a": b"a" * 7, "b": b"b" * 8, "c": b"c" * 9, "nested": {"deep": b"\x00\xff" * 5000}},
    "ünïcödé ✓": b"unicode name\n",
    "Zeta": b"upper case sorts before lower",
    "a.b": b"dots",
    "a-b": b"dash",
}


def test_special_tree_matches_nix(tmp_path: Path) -> None:
    root = tmp_path / "tree"
    write_tree(root, SPECIAL_TREE)
    assert nar.nar_hash(root) == nix_hash(root, tmp_path)
    assert nar.nar_hash(root, encoding="nix32") == nix_hash(root, tmp_path, "--base32")
    assert nar.nar_hash(root, encoding="hex") == nix_hash(root, tmp_path, "--base16")


@pytest.mark.parametrize("kind", ["file", "exe", "symlink"])
def test_single_node_matches_nix(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "node"
    if kind == "symlink":
        os.symlink("target/that/does/not/exist", path)
    else:
        path.write_bytes(b"x" * 100_003)
        path.chmod(0o755 if kind == "exe" else 0o644)
    assert nar.nar_hash(path) == nix_hash(path, tmp_path)


def test_nar_bytes_equal_nix_store_dump(tmp_path: Path) -> None:
    root = tmp_path / "tree"
    write_tree(root, SPECIAL_TREE)
    dumped = process.run(["nix-store", "--dump", str(root)], text=False, env=nix_env(tmp_path)).stdout
    assert nar.nar_bytes(root) == dumped
    assert hashlib.sha256(dumped).digest() == nar.nar_sha256(root)


names = st.text(
    alphabet=st.characters(blacklist_categories=("Cs", "Cc"), blacklist_characters="/\0"), min_size=1, max_size=12
).filter(lambda s: s not in (".", "..") and len(s.encode()) < 200)
leaves = st.one_of(
    st.binary(max_size=3000),
    st.tuples(st.just("x"), st.binary(max_size=300)),
    st.tuples(st.just("l"), st.text(alphabet="abc./", min_size=1, max_size=10)),
)
trees = st.recursive(leaves, lambda children: st.dictionaries(names, children, max_size=5), max_leaves=25).filter(
    lambda t: isinstance(t, dict)
)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(spec=trees)
def test_random_trees_match_nix(tmp_path: Path, spec: dict) -> None:
    root = Path(tempfile.mkdtemp(dir=tmp_path)) / "t"
    try:
        write_tree(root, spec)
        assert nar.nar_hash(root) == nix_hash(root, tmp_path)
    finally:
        shutil.rmtree(root.parent)


@given(st.binary(min_size=32, max_size=32))
def test_nix32_round_trip(digest: bytes) -> None:
    text = nar.nix32(digest)
    assert len(text) == 52 and set(text) <= set(nar.NIX32_ALPHABET)
    assert nar.from_nix32(text) == digest
    assert nar.parse_hash(text) == nar.parse_hash(digest.hex()) == nar.parse_hash(nar.sri(digest)) == digest


@given(st.binary(min_size=20, max_size=20))
def test_nix32_of_store_hashes(digest: bytes) -> None:
    assert nar.from_nix32(nar.nix32(digest), 20) == digest


def test_nix32_known_value() -> None:
    # sha256("") as Nix prints it (`nix hash to-base32 sha256-47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=`)
    assert nar.nix32(hashlib.sha256(b"").digest()) == "0mdqa9w1p6cmli6976v4wi0sw9r4p5prkj7lzfd1877wk11c9c73"


def test_nix32_matches_nix_to_base32(tmp_path: Path) -> None:
    digest = hashlib.sha256(b"tp4").digest()
    out = nix(["hash", "to-base32", nar.sri(digest)], tmp_path).stdout.strip()
    assert out == nar.nix32(digest)


def test_store_paths_match_a_scratch_store(tmp_path: Path) -> None:
    root = tmp_path / "some-tree"
    write_tree(root, SPECIAL_TREE)
    store = tmp_path / "store"
    added = nix(["store", "add-path", "--store", str(store), str(root)], tmp_path).stdout.strip()
    assert added == nar.tree_store_path(root)
    flat = tmp_path / "file.txt"
    flat.write_bytes(b"flat file\n")
    added = nix(["store", "add-file", "--store", str(store), str(flat)], tmp_path).stdout.strip()
    assert added == nar.store_path("file.txt", hashlib.sha256(b"flat file\n").digest(), recursive=False)


def test_store_name_rules() -> None:
    digest = bytes(32)
    with pytest.raises(ValueError):
        nar.store_path(".hidden", digest)
    with pytest.raises(ValueError):
        nar.store_path("has space", digest)
    assert nar.store_path("ok-1.0", digest).startswith("/nix/store/")


def test_refuses_special_files(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(ValueError, match="NAR cannot hold it"):
        nar.nar_hash(tmp_path)
