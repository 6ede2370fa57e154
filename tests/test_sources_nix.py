"""pkgs/sources.nix evaluated with the real Nix: it reads the JSON copy of the manifest's parse
(sources.manifest.json, written by tp4) and refuses a stale one; its fixed-output fetches get the
arguments nixpkgs' fetchers take, accept the right hash and reject a wrong one."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sources_helpers.build import have_nix, nix, nix_eval_json, sha256
from tp4.core.errors import Tp4Error
from tp4.image.sources import companion, nar
from tp4.image.sources import manifest as mf

# nix is required, never skipped: bash tests/run installs nix-bin
assert have_nix(), "nix is not installed: run bash tests/run (python/setup.sh --test installs nix-bin)"

SOURCES_NIX = Path(__file__).resolve().parents[1] / "pkgs" / "sources.nix"
FAKE_FETCHERS = (
    'fetchurl = a: a // { outPath = "/fake/${a.name}"; }; fetchPypi = a: { pypi = a; }; pullImage = a: { image = a; };'
)


# the real files the lock rewrote (the root's sources.manifest and .json are links: `git commit
# LINK` would commit the link and leave the pins uncommitted)
COMMIT = "git commit python/tp4/data/sources.manifest python/tp4/data/sources.manifest.json"


def write(path: Path, text: str) -> Path:
    """The manifest and its JSON copy, as `tp4 sources lock` writes them."""
    companion.write(path, text)
    return path


def nix_view(manifest: Path, tmp: Path) -> dict:
    expr = (
        f"let s = import {SOURCES_NIX} {{ manifest = {manifest}; {FAKE_FETCHERS} }}; in "
        "{ inherit (s) rows; trees = map (n: s.trees.${n}) s.treeNames; }"
    )
    return nix_eval_json(expr, tmp)


def test_nix_reads_the_committed_json_copy(repo: Path, tmp_path: Path) -> None:
    """What Nix yields is the parse tp4 wrote, row for row (through the repository's links)."""
    parsed = json.loads((repo / "sources.manifest.json").read_text())
    assert nix_view(repo / "sources.manifest", tmp_path) == {"rows": parsed["rows"], "trees": parsed["trees"]}
    assert parsed["rows"] == mf.load(repo / "sources.manifest").to_json()["rows"]


def test_a_stale_json_copy_is_refused_naming_the_command(tmp_path: Path) -> None:
    """An edit to the manifest without `tp4 sources json` fails every evaluation, not a build
    with the old pins."""
    path = write(tmp_path / "sources.manifest", f"f  {'a' * 40}  {'b' * 64}  https://e.invalid/{'a' * 40}/f\n")
    assert nix_view(path, tmp_path)["rows"][0]["sha256"] == "b" * 64
    path.write_text(path.read_text().replace("b" * 64, "c" * 64))
    with pytest.raises(Tp4Error) as info:
        nix_view(path, tmp_path)
    message = " ".join(str(info.value).split())
    assert f"{path}.json is not the parse of {path}" in message and "run `tp4 sources json`" in message
    companion.write(path, path.read_text())
    assert nix_view(path, tmp_path)["rows"][0]["sha256"] == "c" * 64


@pytest.mark.parametrize("text", ["  x y z w\n", "x y z\n", "x a b c notkeyvalue\n", "x a b c k=1\n  k=2\n", "tree\n"])
def test_a_manifest_that_does_not_parse_is_not_written(tmp_path: Path, text: str) -> None:
    """The one parser refuses it; neither the manifest nor its JSON copy changes."""
    path = write(tmp_path / "m", "")
    with pytest.raises(Tp4Error, match="line 1"):
        companion.write(path, text)
    assert path.read_text() == "" and companion.stale(path) is None


def test_src_of_an_unlocked_row_throws_naming_the_command(repo: Path, tmp_path: Path) -> None:
    expr = f'(import {SOURCES_NIX} {{ manifest = {repo / "sources.manifest"}; {FAKE_FETCHERS} }}).src."base-image"'
    with pytest.raises(Tp4Error) as info:
        nix_eval_json(expr, tmp_path)
    message = " ".join(str(info.value).split())
    assert "source row 'base-image'" in message
    # one command for every unlocked row, what it downloads, and to commit the result
    assert "tp4 sources lock dsv41 dsv41/runtime/roce_tp4_adapt.py base-image" in message
    assert "- dsv41/runtime/roce_tp4_adapt.py: the file https://raw.githubusercontent.com/" in message
    assert f"commit the change ({COMMIT})" in message


def test_fetchers_get_the_right_arguments(repo: Path, tmp_path: Path) -> None:
    expr = (
        f"let s = import {SOURCES_NIX} {{ manifest = {repo / 'sources.manifest'}; {FAKE_FETCHERS} }}; in "
        '{ wheel = s.src."sglang-kernel"; file = removeAttrs s.src."roce-ring/api.py" [ "outPath" ]; args = s.fetchArgs."b12x-next"; }'
    )
    got = nix_eval_json(expr, tmp_path)
    assert got["wheel"]["pypi"] == {
        "pname": "sglang_kernel",
        "version": "0.4.7",
        "format": "wheel",
        "python": "cp310",
        "dist": "cp310",
        "abi": "abi3",
        "platform": "manylinux2014_aarch64",
        "sha256": "c4bb10b1bee183c441b352c4aaf203ce34627c27ed87a5cc4036c98aa557b81e",
    }
    row = mf.load(repo / "sources.manifest").by_name["roce-ring/api.py"]
    assert got["file"] == {"url": row.url, "sha256": row.sha256, "name": "roce-ring-api.py"}
    assert got["args"][0] == "--manifest" and got["args"].count("--input") == 5
    assert got["args"][3] == "b12x-main=/fake/b12x-main"


def test_image_row_goes_to_pull_image(tmp_path: Path) -> None:
    digest = "sha256:" + "3" * 64
    path = tmp_path / "m"
    write(path, f"img  {digest}  {'a' * 64}  docker://lmsysorg/sglang:dev-dsv41@{digest}\n  arch=arm64\n")
    expr = f"(import {SOURCES_NIX} {{ manifest = {path}; {FAKE_FETCHERS} }}).src.img"
    assert nix_eval_json(expr, tmp_path)["image"] == {
        "imageName": "lmsysorg/sglang",
        "imageDigest": digest,
        "finalImageName": "lmsysorg/sglang",
        "finalImageTag": "dev-dsv41",
        "arch": "arm64",
        "sha256": "a" * 64,
    }


@pytest.mark.parametrize(
    "kind,url,form",
    [
        ("wheel", "pypi:not-a-wheel.zip", "pypi:<wheel file name>"),
        ("image", "docker://lmsysorg/sglang:dev", "docker://NAME[:TAG]@sha256:DIGEST"),
    ],
)
def test_a_row_without_its_kinds_form_throws_naming_verify(tmp_path: Path, kind: str, url: str, form: str) -> None:
    """The parse keeps such a row (validation refuses it); Nix says so instead of guessing."""
    path = write(tmp_path / "m", f"x  1  {'a' * 64}  {url}\n")
    assert json.loads((tmp_path / "m.json").read_text())["rows"][0][kind] is None
    with pytest.raises(Tp4Error) as info:
        nix_eval_json(f"(import {SOURCES_NIX} {{ manifest = {path}; {FAKE_FETCHERS} }}).src.x", tmp_path)
    message = " ".join(str(info.value).split())
    assert f"row 'x': {url} is not {form} (`tp4 sources verify` says what is wrong)" in message


def builtins_fetch(manifest: Path, name: str, tmp: Path) -> str:
    expr = f'(import {SOURCES_NIX} {{ manifest = {manifest}; fetchurl = builtins.fetchurl; }}).src."{name}"'
    return json.loads(nix(["eval", "--store", str(tmp / "store"), "--impure", "--json", "--expr", expr], tmp).stdout)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(min_size=0, max_size=5000))
def test_builtins_fetchurl_accepts_the_right_hash_and_rejects_a_wrong_one(tmp_path: Path, data: bytes) -> None:
    work = Path(tempfile.mkdtemp(dir=tmp_path))
    try:
        served = work / "served" / "file.bin"
        served.parent.mkdir()
        served.write_bytes(data)
        right, wrong = sha256(data), sha256(data + b"x")
        manifest = work / "m"
        write(manifest, f"good  {'a' * 40}  {right}  file://{served}\nbad  {'a' * 40}  {wrong}  file://{served}\n")
        stored = builtins_fetch(manifest, "good", work)
        assert Path(stored).name.endswith("-good") and stored == nar.store_path(
            "good", bytes.fromhex(right), recursive=False
        )
        with pytest.raises(Tp4Error, match="hash mismatch"):
            builtins_fetch(manifest, "bad", work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def test_git_row_is_checked_by_its_nar_hash(tmp_path: Path, monkeypatch) -> None:
    """The origin lives under /dev/shm, not tmp_path: Nix 2.8 runs git in the mount namespace it
    saved at start (setns), which also resets the root, so inside a chroot (the fresh-machine CI
    runs the suite in one) git sees the host's /tmp, where tmp_path does not exist; /dev is the
    same on both sides. Neither the commit nor Nix's git reads the machine's git configuration."""
    import git

    monkeypatch.setenv("GIT_CONFIG_GLOBAL", "/dev/null")
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    shm = Path(tempfile.mkdtemp(prefix="tp4-git-", dir="/dev/shm"))
    try:
        origin = shm / "origin"
        repo = git.Repo.init(origin, initial_branch="main")
        (origin / "a.py").write_text("a = 1\n")
        repo.index.add(["a.py"])
        who = git.Actor("t", "t@e.invalid")
        commit = repo.index.commit("one", author=who, committer=who).hexsha
        tree = tmp_path / "tree"
        tree.mkdir()
        (tree / "a.py").write_text("a = 1\n")
        right = nar.nar_sha256(tree).hex()
        manifest = tmp_path / "m"
        write(
            manifest,
            f"g  {commit}  {right}  git+file://{origin}@{commit}\n"
            f"h  {commit}  {'0' * 64}  git+file://{origin}@{commit}\n",
        )
        stored = builtins_fetch(manifest, "g", tmp_path)
        assert stored == nar.store_path("g", bytes.fromhex(right))
        with pytest.raises(Tp4Error, match="store path mismatch"):
            builtins_fetch(manifest, "h", tmp_path)
    finally:
        shutil.rmtree(shm, ignore_errors=True)


def test_git_row_pinned_off_the_default_branch_is_fetched(tmp_path: Path, monkeypatch) -> None:
    """builtins.fetchGit with a rev fetches only the default ref of a remote repository unless
    allRefs = true: a commit that is only on another branch is then not found. The origin is a
    real repository with a commit on `master` and one only on `side`, served over loopback HTTP
    (git's dumb protocol): Nix 2.8 reads a file:// repository in place, with every object, so a
    file:// URL finds both commits either way (checked here too) and cannot show the difference."""
    import functools
    import threading
    from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

    import git

    monkeypatch.setenv("GIT_CONFIG_GLOBAL", "/dev/null")
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    shm = Path(tempfile.mkdtemp(prefix="tp4-git-", dir="/dev/shm"))
    who = git.Actor("t", "t@e.invalid")
    try:
        origin = shm / "origin"
        repo = git.Repo.init(origin, initial_branch="master")
        (origin / "a.py").write_text("a = 1\n")
        repo.index.add(["a.py"])
        on_master = repo.index.commit("one", author=who, committer=who).hexsha
        repo.git.checkout("-b", "side")
        (origin / "a.py").write_text("a = 2\n")
        repo.index.add(["a.py"])
        off_default = repo.index.commit("two", author=who, committer=who).hexsha
        repo.git.checkout("master")
        git.Repo.clone_from(origin, shm / "served" / "r.git", bare=True).git.update_server_info()
        hashes = {}
        for commit, text in ((on_master, "a = 1\n"), (off_default, "a = 2\n")):
            tree = tmp_path / commit
            tree.mkdir()
            (tree / "a.py").write_text(text)
            hashes[commit] = nar.nar_sha256(tree).hex()

        class Quiet(SimpleHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

        handler = functools.partial(Quiet, directory=str(shm / "served"))
        server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            http = f"http://127.0.0.1:{server.server_address[1]}/r.git"
            manifest = tmp_path / "m"
            write(
                manifest,
                f"main  {on_master}  {hashes[on_master]}  git+{http}@{on_master}\n"
                f"side  {off_default}  {hashes[off_default]}  git+{http}@{off_default}\n"
                f"on-disk  {off_default}  {hashes[off_default]}  git+file://{origin}@{off_default}\n",
            )
            # a fresh cache of Nix's git fetcher for each run (it keeps its clones there)
            monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
            assert builtins_fetch(manifest, "main", tmp_path) == nar.store_path(
                "main", bytes.fromhex(hashes[on_master])
            )
            assert builtins_fetch(manifest, "side", tmp_path) == nar.store_path(
                "side", bytes.fromhex(hashes[off_default])
            )
            assert builtins_fetch(manifest, "on-disk", tmp_path) == nar.store_path(
                "on-disk", bytes.fromhex(hashes[off_default])
            )
        finally:
            server.shutdown()
    finally:
        shutil.rmtree(shm, ignore_errors=True)


def test_archive_row_with_a_tree_hash_is_fetched_by_its_tree(tmp_path: Path) -> None:
    """A row locked with --tree (tree-sha256=) is fetched with builtins.fetchTarball by that hash:
    from a file:// tarball; from a re-compressed tarball of the same files (other bytes, so the
    sha256 column no longer matches); and a tarball with other files fails with a hash mismatch."""
    from sources_helpers.build import tar_gz
    from test_sources_download import recompressed
    from tp4.image.sources import lock

    files = {"r-abc/python/a.py": "print('a')\n", "r-abc/bin/run": "#!/bin/sh\n", "r-abc/other": "o"}
    served = tmp_path / "served"
    served.mkdir()
    (served / "a.tar.gz").write_bytes(tar_gz(files, modes={"r-abc/bin/run": 0o755}))
    (served / "b.tar.gz").write_bytes(recompressed(files, {"r-abc/bin/run": 0o755}))
    (served / "c.tar.gz").write_bytes(recompressed({**files, "r-abc/other": "changed"}, {"r-abc/bin/run": 0o755}))
    assert (served / "a.tar.gz").read_bytes() != (served / "b.tar.gz").read_bytes()
    tree = lock.tree_sha256(served / "a.tar.gz")
    byte_hash = sha256((served / "a.tar.gz").read_bytes())
    manifest = tmp_path / "m"
    write(
        manifest,
        "".join(
            f"{name}  {'a' * 40}  {byte_hash}  file://{served}/{name}.tar.gz\n  strip=1 tree-sha256={tree}\n"
            for name in ("a", "b", "c")
        ),
    )
    assert builtins_fetch(manifest, "a", tmp_path) == nar.store_path("a", bytes.fromhex(tree))
    stored = Path(builtins_fetch(manifest, "b", tmp_path))
    assert stored.name.endswith("-b") and stored == Path(nar.store_path("b", bytes.fromhex(tree)))
    with pytest.raises(Tp4Error, match="hash mismatch"):
        builtins_fetch(manifest, "c", tmp_path)
