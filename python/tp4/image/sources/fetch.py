"""Getting the bytes of rows (given with --input, from the cache, or downloaded) and fetching
trees. Every byte used is checked against its row's sha256 first."""

from __future__ import annotations

import os
import re
import shutil
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

from tp4.core import process
from tp4.core.errors import InvalidInput, Tp4Error
from tp4.image.sources import download, nar, transforms
from tp4.image.sources.manifest import Manifest, Row, git_remote


def cache_dir() -> Path:
    explicit = os.environ.get("TP4_SOURCES_CACHE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tp4" / "sources"


def in_nix_build() -> bool:
    """Inside a Nix build there is no network: fetch never tries to download there."""
    return bool(os.environ.get("NIX_BUILD_TOP"))


def _not_a_file(path: str) -> str | None:
    """What a path is when it is neither a regular file nor a directory (following links)."""
    import stat

    from tp4.core.userfiles import file_kind

    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        return f"cannot be read ({exc.strerror})"
    return None if stat.S_ISREG(mode) or stat.S_ISDIR(mode) else f"is {file_kind(mode)}, not a regular file"


def parse_inputs(values: list[str], manifest: Manifest) -> dict[str, Path]:
    inputs: dict[str, Path] = {}
    problems = []
    for value in values:
        name, sep, path = value.partition("=")
        if not sep or not name or not path:
            problems.append(f"--input {value!r} is not COMPONENT=PATH")
        elif name not in manifest.by_name:
            problems.append(f"--input {name}: no such row in {manifest.label}")
        elif not os.path.lexists(path):
            problems.append(f"--input {name}={path}: no such file")
        elif (kind := _not_a_file(path)) is not None:  # /dev/zero would be hashed for ever, a FIFO waited on
            problems.append(f"--input {name}={path}: {kind}; fix: name the file (or tree) the row was fetched as")
        else:
            inputs[name] = Path(path)
    if problems:
        raise InvalidInput("bad --input", problems)
    return inputs


def check_bytes(row: Row, path: Path, origin: str) -> None:
    """``path`` holds exactly the row's bytes (a file's sha256, a git checkout's NAR hash)."""
    row.require_locked()
    if row.kind == "archive" and row.tree_sha256 and path.is_dir():
        # the unpacked tree (Nix's builtins.fetchTarball of a row with tree-sha256=)
        actual = nar.nar_sha256(path).hex()
        if actual != row.tree_sha256:
            raise Tp4Error(
                f"{origin} for {row.name}: {path} does not match the pin\n"
                f"  expected tree-sha256 {row.tree_sha256}\n  got                  {actual}"
            )
        return
    if row.kind == "git":
        actual = nar.nar_sha256(path).hex()
    elif path.is_dir():
        raise Tp4Error(f"{origin} for {row.name}: {path} is a directory; the row is a {row.kind} (a file)")
    else:
        actual = download.sha256_file(path)
    if actual != row.sha256:
        raise Tp4Error(
            f"{origin} for {row.name}: {path} does not match the pin\n  expected sha256 {row.sha256}\n"
            f"  got             {actual}"
        )


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._+-]", "_", name)


IMAGE_PYTHON = "3.12"  # the base image's interpreter (the base image of upstream `Dockerfile.canary-roce`)


def wheel_pip_args(row: Row) -> list[str]:
    """pip flags that select exactly this wheel file whatever the host (--platform etc.): the
    image's CPython, the wheel's ABI and platform tags."""
    w = row.wheel()
    m = re.fullmatch(r"cp(\d)(\d+)", w["python"])
    version = f"{m[1]}.{m[2]}" if m and w["abi"] not in ("abi3", "none") else IMAGE_PYTHON
    args = [
        "--only-binary=:all:",
        "--no-deps",
        "--python-version",
        version,
        "--implementation",
        "cp",
        "--abi",
        w["abi"],
    ]
    for plat in w["platform"].split("."):
        args += ["--platform", plat]
    return [*args, f"{row.component}=={row.commit}"]


def pip_download(row: Row, dest_dir: Path, *, quiet: bool = False) -> Path:
    """The wheel through pip (the ordinary client and its configured index), hash-checked."""
    with tempfile.TemporaryDirectory(prefix="tp4-wheel-", dir=dest_dir) as tmp:
        if not quiet:
            print(f"fetching {row.name}: pip download {row.component}=={row.commit}", file=sys.stderr, flush=True)
        _pip_download(row, tmp)
        got = Path(tmp) / row.file_name
        if not got.exists():
            names = ", ".join(sorted(p.name for p in Path(tmp).iterdir())) or "nothing"
            raise Tp4Error(f"{row.name}: pip downloaded {names}, not {row.file_name}")
        target = dest_dir / row.file_name
        got.replace(target)
        return target


def _pip_download(row: Row, tmp: str) -> None:
    """pip download with tp4's retries instead of pip's: a name that does not resolve fails at once
    (pip would retry it for seconds), a transfer that breaks is tried again."""
    import re
    import time

    from tp4.image.sources import download

    argv = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--disable-pip-version-check",
        "--retries",
        "0",
        "-d",
        tmp,
        *wheel_pip_args(row),
    ]
    retries = download._retries()
    for attempt in range(retries + 1):
        if attempt:
            time.sleep(download._backoff() * 2 ** (attempt - 1))
        proc = process.run(argv, check=False)
        if proc.returncode == 0:
            return
        # pip does not say why an index gave nothing; a name that does not resolve is final
        indexes = re.search(r"Looking in indexes: (.*)", proc.stdout)
        for url in indexes.group(1).split(", ") if indexes else []:
            host = download.host_of(url.strip())
            if "://" in url and not url.startswith("file:") and not _resolves(host):
                raise download.offline_error(
                    host, f"{row.name}: pip download", "give pip a reachable index (PIP_INDEX_URL)"
                ) from None
        if not re.search(
            r"IncompleteRead|ConnectionError|ProtocolError|Read timed out|connection broken", proc.stderr, re.I
        ):
            break  # pip's own answer (no such version, a hash mismatch, ...): final
    tail = "\n".join(proc.stderr.strip().splitlines()[-10:])
    raise Tp4Error(
        f"{row.name}: pip download {row.component}=={row.commit} failed with exit code {proc.returncode}\n{tail}"
    )


def _resolves(host: str) -> bool:
    import socket

    try:
        socket.getaddrinfo(host, 443, type=socket.SOCK_STREAM)
        return True
    except (socket.gaierror, UnicodeError):
        return False


def git_checkout(url: str, commit: str, dest: Path) -> None:
    """Clone a git+ URL at ``commit`` into ``dest`` without .git (what Nix's fetchGit gives)."""
    from tp4.image.sources import gitrepo

    gitrepo.checkout(git_remote(url), commit, dest)
    shutil.rmtree(dest / ".git")


def obtain(row: Row, inputs: Mapping[str, Path], *, offline: bool, quiet: bool = False) -> Path:
    """A path holding the row's checked bytes: its --input, the cache, or a fresh download."""
    row.require_locked()
    if row.name in inputs:
        check_bytes(row, inputs[row.name], "--input")
        return inputs[row.name]
    if row.kind in ("image", "local"):
        raise Tp4Error(
            f"{row.name} is a {row.kind} row: "
            + (
                "Nix gets it with dockerTools.pullImage (or `docker pull` by digest)"
                if row.kind == "image"
                else "it names a file in upstream's repository; give it a URL row"
            )
        )
    if offline:
        raise Tp4Error(
            f"{row.name}: no --input {row.name}=PATH given and downloads are off (offline or in a Nix build)"
        )
    cache = cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    cached = cache / f"{row.sha256[:32]}-{_safe(row.file_name if row.kind != 'git' else row.component)}"
    if _cached(row, cached):
        return cached
    if row.kind == "wheel":
        with tempfile.TemporaryDirectory(prefix=".wheel-", dir=cache) as tmp:
            got = pip_download(row, Path(tmp), quiet=quiet)
            check_bytes(row, got, "pip download")
            got.replace(cached)
        return cached
    if row.kind == "git":
        work = Path(tempfile.mkdtemp(prefix=".git-", dir=cache))
        try:
            git_checkout(row.url, row.commit, work / "tree")
            check_bytes(row, work / "tree", "git clone")
            (work / "tree").rename(cached)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return cached
    if row.kind == "archive" and row.tree_sha256:
        return _obtain_tree(row, cache, quiet=quiet)
    download.download(row.url, cached, row.sha256, label=row.name, quiet=quiet)
    return cached


def _cached(row: Row, cached: Path) -> bool:
    """Whether the cache holds ``row`` at ``cached``, matching its pin (a mismatch is removed)."""
    if not os.path.lexists(cached):
        return False
    try:
        check_bytes(row, cached, "cache")
        return True
    except Tp4Error:
        transforms._remove(cached)
        return False


def tree_of_archive(archive: Path, work: Path) -> Path:
    """The unpacked tree of ``archive`` as nixpkgs' fetchzip (stripRoot = true) and
    builtins.fetchTarball make it: the archive must hold exactly one top-level entry, a
    directory, which becomes the root."""
    from tp4.image.sources import transforms

    unpacked = work / "unpacked"
    transforms.unpack_archive(archive, unpacked, 0)
    top = sorted(unpacked.iterdir())
    if len(top) != 1 or not top[0].is_dir() or top[0].is_symlink():
        names = ", ".join(p.name for p in top[:5]) or "nothing"
        raise Tp4Error(
            f"{archive.name}: a tree hash needs one top-level directory (as fetchzip's stripRoot); "
            f"the archive holds {names}"
        )
    return top[0]


def download_tree(row: Row, url: str, work: Path, *, quiet: bool = False) -> tuple[str, Path]:
    """Download the archive row's ``url`` into ``work`` and unpack it as :func:`tree_of_archive`
    does: (the sha256 of the archive's bytes, its tree)."""
    archive = work / row.file_name
    sha = download.download(url, archive, None, label=row.name, quiet=quiet)
    return sha, tree_of_archive(archive, work)


def _obtain_tree(row: Row, cache: Path, *, quiet: bool) -> Path:
    """An archive row pinned by its tree: the archive's bytes may differ from the sha256 column
    (GitHub does not keep archive bytes stable); its unpacked tree must match tree-sha256."""
    cached = cache / f"tree-{(row.tree_sha256 or '')[:32]}-{_safe(row.component)}"
    if _cached(row, cached):
        return cached
    work = Path(tempfile.mkdtemp(prefix=".tree-", dir=cache))
    try:
        _, tree = download_tree(row, row.url, work, quiet=quiet)
        check_bytes(row, tree, "download")
        tree.rename(cached)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return cached


def fetch(
    manifest: Manifest, name: str, to: Path, inputs: Mapping[str, Path], *, offline: bool, quiet: bool = False
) -> dict[str, str]:
    """Produce ``name`` (a tree, or a row) at ``to`` exactly as the image contains it."""
    transforms.check_destination(to)
    tree = manifest.tree_by_name.get(name)
    needed = manifest.inputs(name)
    for row in needed:
        row.require_locked()
    paths = {row.name: obtain(row, inputs, offline=offline, quiet=quiet) for row in needed}
    work = transforms.scratch_dir(to)
    log = None if quiet else (lambda msg: print(msg, file=sys.stderr, flush=True))
    try:
        if tree is None:
            row = needed[0]
            if row.kind == "wheel":
                shutil.copyfile(paths[row.name], work / row.file_name)
                os.chmod(work / row.file_name, 0o644)
            else:
                transforms.build_row(row, paths[row.name], work)
            stamps: dict[str, str] = {}
        else:
            stamps = transforms.build_tree(manifest, tree, paths, work, log=log)
        transforms.publish(work, to)
    finally:
        if work.exists():
            shutil.rmtree(work)
    return stamps


def fetch_named(manifest: Manifest, name: str, to: Path, inputs: list[str], *, offline: bool, quiet: bool) -> list[str]:
    """`tp4 sources fetch NAME`: the tree (or row) at ``to``; the lines it prints (SOURCE_* stamps,
    then the tree's NAR hash)."""
    from tp4.core.errors import InvalidInput
    from tp4.image.sources import manifest as mf
    from tp4.image.sources import nar

    if name not in manifest.tree_by_name and name not in manifest.by_name:
        names = {**manifest.tree_by_name, **manifest.by_name}
        raise InvalidInput(f"{manifest.label}: no tree or row named {name!r}{mf._suggest(name, names)}")
    stamps = fetch(manifest, name, to, parse_inputs(inputs, manifest), offline=offline or in_nix_build(), quiet=quiet)
    return [*(f"{key} {value}" for key, value in stamps.items()), f"{to} {nar.nar_hash(to)}"]
