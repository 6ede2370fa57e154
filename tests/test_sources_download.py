"""Downloads, retries, interruption and tampering against a loopback server; lock and
verify --download end to end (GitHub API and mirror served locally)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from sources_helpers.build import sha256, tar_gz
from sources_helpers.server import FileServer
from tp4.core.errors import Tp4Error
from tp4.image.sources import companion, download
from tp4.image.sources import manifest as mf

pytestmark = pytest.mark.unit

DATA = os.urandom(3 * (1 << 20) + 123)
C40 = "0123456789abcdef0123456789abcdef01234567"
C40B = "89abcdef0123456789abcdef0123456789abcdef"


@pytest.fixture(autouse=True)
def fast_retries(monkeypatch, tmp_path):
    monkeypatch.setenv("TP4_SOURCES_BACKOFF", "0.01")
    monkeypatch.setenv("TP4_SOURCES_RETRIES", "3")
    monkeypatch.setenv("TP4_SOURCES_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("TP4_SOURCES_MIRROR", raising=False)


@pytest.fixture
def server():
    with FileServer() as s:
        yield s


def tree_sha256_of(data: bytes, work: Path) -> str:
    """lock.tree_sha256 of an archive given as bytes (written under ``work``)."""
    from tp4.image.sources import lock

    archive = work / "tree-of.tar.gz"
    archive.write_bytes(data)
    return lock.tree_sha256(archive)


def leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir()) if directory.exists() else []


def test_download_writes_only_after_the_hash_matches(server: FileServer, tmp_path: Path) -> None:
    url = server.add("/f.bin", DATA)
    dest = tmp_path / "d" / "f.bin"
    assert download.download(url, dest, sha256(DATA), label="f", quiet=True) == sha256(DATA)
    assert dest.read_bytes() == DATA and leftovers(dest.parent) == ["f.bin"]


def test_retries_after_503(server: FileServer, tmp_path: Path) -> None:
    url = server.add("/f.bin", DATA, fail_first=2)
    dest = tmp_path / "f.bin"
    download.download(url, dest, sha256(DATA), label="f", quiet=True)
    assert server.hits["/f.bin"] == 3 and dest.read_bytes() == DATA


def test_retries_after_a_cut_connection(server: FileServer, tmp_path: Path) -> None:
    url = server.add("/f.bin", DATA, cut_at=1 << 20, cut_times=2)
    dest = tmp_path / "f.bin"
    download.download(url, dest, sha256(DATA), label="f", quiet=True)
    assert server.hits["/f.bin"] == 3 and dest.read_bytes() == DATA


def test_interrupted_download_leaves_nothing(server: FileServer, tmp_path: Path) -> None:
    url = server.add("/f.bin", DATA, cut_at=1000)
    dest = tmp_path / "d" / "f.bin"
    with pytest.raises(Tp4Error, match="failed after 4 attempts"):
        download.download(url, dest, sha256(DATA), label="f", quiet=True)
    assert leftovers(dest.parent) == []


def test_tampered_download_leaves_nothing(server: FileServer, tmp_path: Path) -> None:
    url = server.add("/f.bin", DATA, tamper=True)
    dest = tmp_path / "d" / "f.bin"
    with pytest.raises(Tp4Error, match="sha256 mismatch") as info:
        download.download(url, dest, sha256(DATA), label="f", quiet=True)
    assert "pin is unchanged" in str(info.value)
    assert leftovers(dest.parent) == [] and server.hits["/f.bin"] == 1


def test_404_is_not_retried(server: FileServer, tmp_path: Path) -> None:
    with pytest.raises(Tp4Error, match="HTTP 404"):
        download.download(server.url("/missing"), tmp_path / "x", None, label="x", quiet=True)
    assert server.hits["/missing"] == 1


def test_progress_lines_when_not_a_tty(server: FileServer, tmp_path: Path, capsys) -> None:
    url = server.add("/f.bin", DATA, fail_first=1)
    download.download(url, tmp_path / "f", sha256(DATA), label="thing")
    err = capsys.readouterr().err
    assert "fetching thing (attempt 2)" in err and "thing: 3.0 MiB" in err and "sha256 ok" in err
    assert "\r" not in err


def make_manifest(server: FileServer, tmp_path: Path, *, sha: str | None = None, commit: str = C40) -> Path:
    """A GitHub-style row served through the mirror (TP4_SOURCES_MIRROR)."""
    archive = tar_gz({"r-x/python/a.py": "print('a')\n", "r-x/other": "o"})
    server.add(f"/m/github.com/o/r/archive/{C40}.tar.gz", archive)
    text = (
        f"r  {commit}  {sha or sha256(archive)}  https://github.com/o/r/archive/{commit}.tar.gz  strip=1\n"
        "tree py  from=r  keep=python\n"
    )
    path = tmp_path / "sources.manifest"
    path.write_text(text)
    return path


def test_fetch_through_a_mirror_and_cache(server: FileServer, tmp_path: Path, tp4_cli, monkeypatch) -> None:
    monkeypatch.setenv("TP4_SOURCES_MIRROR", server.url("/m"))
    manifest = make_manifest(server, tmp_path)
    code, out, err = tp4_cli("sources", "fetch", "py", "--to", tmp_path / "out", "--manifest", manifest)
    assert code == 0, err
    assert (tmp_path / "out/python/a.py").read_text() == "print('a')\n"
    code, _, err = tp4_cli("sources", "fetch", "r", "--to", tmp_path / "raw", "--manifest", manifest)
    assert code == 0, err
    assert sorted(p.name for p in (tmp_path / "raw").iterdir()) == ["other", "python"]
    assert server.hits[f"/m/github.com/o/r/archive/{C40}.tar.gz"] == 1  # second fetch from the cache


def test_fetch_of_a_tampered_source_leaves_nothing(server: FileServer, tmp_path: Path, tp4_cli, monkeypatch) -> None:
    monkeypatch.setenv("TP4_SOURCES_MIRROR", server.url("/m"))
    manifest = make_manifest(server, tmp_path, sha="e" * 64)
    code, _, err = tp4_cli("sources", "fetch", "py", "--to", tmp_path / "out", "--manifest", manifest)
    assert code == 1 and "sha256 mismatch" in err
    assert not (tmp_path / "out").exists() and leftovers(tmp_path / "cache") == []


def test_verify_download(server: FileServer, tmp_path: Path, tp4_cli, monkeypatch) -> None:
    monkeypatch.setenv("TP4_SOURCES_MIRROR", server.url("/m"))
    manifest = make_manifest(server, tmp_path)
    code, out, err = tp4_cli("sources", "verify", "--download", "--manifest", manifest)
    assert code == 0 and "downloaded and hash-checked" in out, err
    manifest.write_text(manifest.read_text().replace(manifest.read_text().split()[2], "d" * 64))
    code, out, err = tp4_cli("sources", "verify", "--download", "--manifest", manifest)
    assert code == 1 and "sha256 mismatch: pinned " + "d" * 64 in err


def test_lock_resolves_a_branch_and_fills_the_hash(server: FileServer, tmp_path: Path, tp4_cli, monkeypatch) -> None:
    monkeypatch.setenv("TP4_SOURCES_MIRROR", server.url("/m"))
    monkeypatch.setenv("TP4_GITHUB_API", server.url(""))
    server.add_ref("o", "r", "dsv4.1", C40)
    manifest = make_manifest(server, tmp_path, sha="unlocked", commit="dsv4.1")
    manifest.write_text("# keep this comment\n" + manifest.read_text())
    code, out, err = tp4_cli("sources", "lock", "--manifest", manifest)
    assert code == 0, err
    assert f"commit dsv4.1 -> {C40}" in out
    m = mf.load(manifest)
    row = m.by_name["r"]
    assert row.commit == C40 and row.url == f"https://github.com/o/r/archive/{C40}.tar.gz" and row.locked
    assert manifest.read_text().startswith("# keep this comment\n") and mf.validate(m).errors == []
    # the JSON copy Nix reads is rewritten with the manifest, and is its parse
    assert companion.stale(manifest) is None
    assert json.loads((tmp_path / "sources.manifest.json").read_text())["rows"][0]["commit"] == C40


def test_lock_writes_the_manifest_and_its_json_copy_or_neither(
    server: FileServer, tmp_path: Path, tp4_cli, monkeypatch
) -> None:
    """The manifest's rename fails after the JSON copy's: the copy is put back, so neither file
    changes, and no temporary file is left."""
    monkeypatch.setenv("TP4_SOURCES_MIRROR", server.url("/m"))
    manifest = make_manifest(server, tmp_path, sha="unlocked")
    companion.write(manifest, manifest.read_text())
    twin = tmp_path / "sources.manifest.json"
    before = (manifest.read_text(), twin.read_text())
    real_replace = os.replace

    def replace(src, dst):
        if Path(dst) == manifest:
            raise OSError(28, "No space left on device")
        real_replace(src, dst)

    monkeypatch.setattr(companion.os, "replace", replace)
    code, _, err = tp4_cli("sources", "lock", "--manifest", manifest)
    assert code == 1 and "No space left on device; neither was changed" in err and "Traceback" not in err, err
    assert (manifest.read_text(), twin.read_text()) == before
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []
    monkeypatch.setattr(companion.os, "replace", real_replace)
    code, _, err = tp4_cli("sources", "lock", "--manifest", manifest)
    assert code == 0 and companion.stale(manifest) is None and mf.load(manifest).by_name["r"].locked, err


def recompressed(files: dict[str, str], modes: dict[str, int] | None = None) -> bytes:
    """The same files as tar_gz(files), in other bytes: GNU tar format, gzip level 1, another
    mtime in the gzip header (what a change on GitHub's side looks like)."""
    import gzip
    import io
    import tarfile

    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for d in sorted({str(p) for name in files for p in Path(name).parents if str(p) != "."}):
            info = tarfile.TarInfo(d)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, 12345
            tar.addfile(info)
        for name, text in sorted(files.items()):
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), (modes or {}).get(name, 0o644), 12345
            tar.addfile(info, io.BytesIO(data))
    return gzip.compress(raw.getvalue(), compresslevel=1, mtime=777)


def test_lock_tree_records_the_unpacked_tree_and_fetch_survives_new_archive_bytes(
    server: FileServer, tmp_path: Path, tp4_cli, monkeypatch
) -> None:
    """`lock --tree ROW` records tree-sha256= (the NAR hash of the archive's one top directory);
    a fetch then accepts an archive in other bytes with the same files, and refuses other files."""
    from tp4.image.sources import lock, nar

    monkeypatch.setenv("TP4_SOURCES_MIRROR", server.url("/m"))
    files = {"r-x/python/a.py": "print('a')\n", "r-x/other": "o"}
    manifest = make_manifest(server, tmp_path)
    archive = tmp_path / "a.tar.gz"
    archive.write_bytes(tar_gz(files))
    code, out, err = tp4_cli("sources", "lock", "--tree", "r", "--manifest", manifest)
    assert code == 0, err
    row = mf.load(manifest).by_name["r"]
    expected = tmp_path / "expected"
    (expected / "python").mkdir(parents=True)
    (expected / "python" / "a.py").write_text("print('a')\n")
    (expected / "other").write_text("o")
    assert row.tree_sha256 == nar.nar_sha256(expected).hex() == lock.tree_sha256(archive)
    assert row.sha256 == sha256(tar_gz(files)) and f"tree-sha256 (none) -> {row.tree_sha256}" in out
    assert mf.validate(mf.load(manifest)).errors == []
    # what the Nix tree derivation passes: the fetched tree itself (builtins.fetchTarball's output)
    code, _, err = tp4_cli(
        "sources",
        "fetch",
        "py",
        "--to",
        tmp_path / "from-nix",
        "--offline",
        "--input",
        f"r={expected}",
        "--manifest",
        manifest,
    )
    assert code == 0, err
    assert (tmp_path / "from-nix/python/a.py").read_text() == "print('a')\n"
    (expected / "other").write_text("not o")
    code, _, err = tp4_cli(
        "sources",
        "fetch",
        "py",
        "--to",
        tmp_path / "from-nix2",
        "--offline",
        "--input",
        f"r={expected}",
        "--manifest",
        manifest,
    )
    assert code == 1 and "expected tree-sha256" in err and not (tmp_path / "from-nix2").exists()
    # GitHub re-compresses: other bytes, the same tree
    other = recompressed(files)
    assert other != tar_gz(files) and tree_sha256_of(other, tmp_path) == row.tree_sha256
    server.add(f"/m/github.com/o/r/archive/{C40}.tar.gz", other)
    code, _, err = tp4_cli("sources", "fetch", "py", "--to", tmp_path / "out", "--manifest", manifest)
    assert code == 0, err
    assert (tmp_path / "out/python/a.py").read_text() == "print('a')\n"
    code, out, err = tp4_cli("sources", "verify", "--download", "r", "--manifest", manifest)
    assert code == 0 and "downloaded and hash-checked" in out, err
    # other files: refused, nothing left
    monkeypatch.setenv("TP4_SOURCES_CACHE", str(tmp_path / "cache2"))
    server.add(f"/m/github.com/o/r/archive/{C40}.tar.gz", recompressed({**files, "r-x/other": "changed"}))
    code, _, err = tp4_cli("sources", "fetch", "py", "--to", tmp_path / "out2", "--manifest", manifest)
    assert code == 1 and "expected tree-sha256 " + row.tree_sha256 in err
    code, _, err = tp4_cli("sources", "verify", "--download", "r", "--manifest", manifest)
    assert code == 1 and f"r: tree-sha256 mismatch: pinned {row.tree_sha256}" in err
    assert not (tmp_path / "out2").exists() and leftovers(tmp_path / "cache2") == []


@pytest.mark.parametrize(
    "args,complaint",
    [
        (["--tree"], "--tree needs the rows it applies to: tp4 sources lock --tree ROW"),
        (["--tree", "f"], "--tree f: it is a file row; --tree is for archive rows"),
        (["--tree", "flat"], "--tree flat: the row has strip=0; a tree hash is of the archive's one top directory"),
        (["--tree", "r", "nope"], "no row named 'nope'"),
    ],
)
def test_lock_tree_input_errors_exit_2_before_any_download(
    server: FileServer, tmp_path: Path, tp4_cli, monkeypatch, args, complaint
) -> None:
    monkeypatch.setenv("TP4_SOURCES_MIRROR", server.url("/m"))
    manifest = make_manifest(server, tmp_path)
    manifest.write_text(
        manifest.read_text() + f"f  {C40}  {'a' * 64}  https://github.com/o/r/raw/{C40}/f.txt\n"
        f"flat  {C40}  {'a' * 64}  https://github.com/o/r/archive/{C40}.tar.gz  strip=0\n"
    )
    before = manifest.read_text()
    code, _, err = tp4_cli("sources", "lock", *args, "--manifest", manifest)
    assert code == 2 and complaint in err and "Traceback" not in err, err
    assert manifest.read_text() == before and sum(server.hits.values()) == 0


def test_a_tree_hash_needs_strip_1_and_64_hex() -> None:
    m = mf.parse(f"r  {C40}  {'a' * 64}  https://github.com/o/r/archive/{C40}.tar.gz\n  strip=0 tree-sha256=abc\n")
    errors = " ".join(mf.validate(m).errors)
    assert "tree-sha256= is 64 lowercase hex digits" in errors and "the row needs strip=1" in errors


def test_lock_of_a_bad_download_changes_no_pin(server: FileServer, tmp_path: Path, tp4_cli, monkeypatch) -> None:
    monkeypatch.setenv("TP4_SOURCES_MIRROR", server.url("/m"))
    monkeypatch.setenv("TP4_GITHUB_API", server.url(""))
    server.add_ref("o", "r", "main", C40B)  # the archive of this commit is not served
    manifest = make_manifest(server, tmp_path)
    before = manifest.read_text()
    code, _, err = tp4_cli("sources", "lock", "r", "--ref", "main", "--manifest", manifest)
    assert code == 1 and "HTTP 404" in err
    assert manifest.read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []
    code, _, err = tp4_cli("sources", "lock", "r", "--ref", "nope", "--manifest", manifest)
    assert code == 1 and "HTTP 422" in err and manifest.read_text() == before


@pytest.mark.parametrize(
    "sha", [5, ["a" * 40], {"sha": "a" * 40}, "main"], ids=["number", "list", "object", "branch-name"]
)
def test_lock_refuses_a_github_answer_that_is_no_commit(
    server: FileServer, tmp_path: Path, tp4_cli, monkeypatch, sha: object
) -> None:
    monkeypatch.setenv("TP4_SOURCES_MIRROR", server.url("/m"))
    monkeypatch.setenv("TP4_GITHUB_API", server.url(""))
    server.add_ref("o", "r", "main", sha)  # answered as {"sha": <sha>}
    manifest = make_manifest(server, tmp_path)
    before = manifest.read_text()
    code, _, err = tp4_cli("sources", "lock", "r", "--ref", "main", "--manifest", manifest)
    assert code == 1 and "GitHub API: " in err and "is not a commit" in err and "Traceback" not in err, err
    assert manifest.read_text() == before


def test_lock_of_a_git_source(tmp_path: Path, tp4_cli) -> None:
    import git

    origin = tmp_path / "origin"
    repo = git.Repo.init(origin, initial_branch="main")
    (origin / "mod.py").write_text("x = 1\n")
    (origin / "run.sh").write_text("#!/bin/sh\n")
    (origin / "run.sh").chmod(0o755)
    repo.index.add(["mod.py", "run.sh"])
    with repo.config_writer() as cfg:
        cfg.set_value("user", "name", "t").set_value("user", "email", "t@e.invalid")
    commit = repo.index.commit("one").hexsha
    manifest = tmp_path / "sources.manifest"
    manifest.write_text(f"g  main  unlocked  git+file://{origin}@main\n")
    code, out, err = tp4_cli("sources", "lock", "--manifest", manifest)
    assert code == 0, err
    row = mf.load(manifest).by_name["g"]
    assert row.commit == commit and row.url.endswith("@" + commit) and row.locked
    from tp4.image.sources import fetch, nar

    checkout = tmp_path / "co"
    fetch.git_checkout(row.url, row.commit, checkout)
    assert nar.nar_sha256(checkout).hex() == row.sha256


def test_github_urls_move_only_their_ref() -> None:
    from tp4.image.sources.lock import github_repo, with_ref

    raw = "https://raw.githubusercontent.com/o/r/main/main/x.py"
    assert (
        github_repo(raw) == ("o", "r", "main")
        and with_ref(raw, C40) == f"https://raw.githubusercontent.com/o/r/{C40}/main/x.py"
    )
    archive = "https://github.com/o/main/archive/main.tar.gz"
    assert github_repo(archive) == ("o", "main", "main")
    assert with_ref(archive, C40) == f"https://github.com/o/main/archive/{C40}.tar.gz"
    assert github_repo("https://example.invalid/x.tar.gz") is None


def test_unreachable_host_gives_a_short_reason(tmp_path: Path) -> None:
    with FileServer() as s:
        url = s.url("/gone")
    with pytest.raises(Tp4Error, match=r"failed after 4 attempts \(connection to 127.0.0.1:\d+ refused\)"):
        download.download(url, tmp_path / "x", None, label="x", quiet=True)
    assert leftovers(tmp_path) == []


def test_a_name_that_does_not_resolve_is_final(tmp_path: Path, monkeypatch, capsys) -> None:
    """Offline: one attempt, no retries, a message naming the host (retries are for broken transfers)."""
    monkeypatch.setenv("TP4_SOURCES_RETRIES", "4")
    url = f"https://tp4-offline.invalid/o/r/archive/{C40}.tar.gz"
    with pytest.raises(Tp4Error) as info:
        download.download(url, tmp_path / "x", None, label="x")
    assert "cannot resolve tp4-offline.invalid" in str(info.value) and "offline" in str(info.value)
    assert "retrying" not in capsys.readouterr().err
    assert leftovers(tmp_path) == []


def test_pip_with_an_index_that_does_not_resolve_says_offline(tmp_path: Path, monkeypatch) -> None:
    from tp4.image.sources import fetch

    for key, value in {
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_INDEX_URL": "https://tp4-offline.invalid/simple",
        "PIP_FIND_LINKS": "",
        "PIP_EXTRA_INDEX_URL": "",
    }.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("TP4_SOURCES_RETRIES", "4")
    row = mf.parse(
        f"sglang-kernel  0.4.7  {'c' * 64}  pypi:sglang_kernel-0.4.7-cp310-abi3-manylinux2014_aarch64.whl\n"
    ).rows[0]
    with pytest.raises(Tp4Error, match=r"pip download: cannot resolve tp4-offline.invalid: this machine looks offline"):
        fetch.pip_download(row, tmp_path, quiet=True)
