"""`tp4 download`: the profile's pinned checkpoint revision (`model.hf_repo` at `model.hf_revision`)
into the head's `model.dir`, every file checked against the Hub's own hashes, then the
`model.common_link` symlink (upstream `start.sh` download: `hf download $HF_REPO --revision
$HF_REVISION --local-dir $MODEL_DIR`, then `ln -sfn $MODEL_DIR $COMMON_MODEL`).

- The file list and hashes come from the Hub's file metadata (`HfApi.model_info(...,
  files_metadata=True)`): the sha256 of an LFS file, the git blob sha1 of a small file.
- Bytes go to `<model.dir>/.tp4-download/<name>.partial` with huggingface_hub's `http_get`; a
  later run resumes a partial file with a Range request (huggingface_hub's own `hf_hub_download`
  resumes only within one call: it deletes its temporary file when the call fails). A file is
  renamed into place only after its hash matched.
- Verification results are cached in `<model.dir>/.tp4-verified.json`, keyed by file name, size
  and mtime, so a second run neither hashes 476 GiB again nor asks the Hub anything: the
  directory is complete when the cache lists the revision's every file as matched (with
  config.json and `model.expected_shards` shards among them) and each still has its size and mtime.

The endpoint is huggingface_hub's (`HF_ENDPOINT` overrides it), the token its own (`HF_TOKEN` or
`hf auth login`); neither is written here.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import shlex
import stat
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, TypedDict
from urllib.parse import quote

from tp4.core.errors import InvalidInput, Tp4Error
from tp4.core.privatefiles import replace_file

if TYPE_CHECKING:
    from tp4.line.profile.models import Profile

CACHE_NAME = ".tp4-verified.json"
PARTIAL_DIR = ".tp4-download"
SCHEMA = "tp4.download/1"
SHARD_GLOB = "model-*-of-*.safetensors"
# files fetched at once: shards are ~10 GiB each, one stream rarely fills the head's link
PARALLEL = 4
_CHUNK = 8 << 20


@dataclass(frozen=True)
class RemoteFile:
    """One file of the revision, as the Hub lists it."""

    name: str
    size: int
    algo: str  # "sha256" (an LFS file) or "git-sha1" (a small file: its git blob id)
    digest: str


class Entry(TypedDict):
    size: int
    mtime_ns: int
    algo: str
    digest: str


class Cache(TypedDict):
    schema: str
    repo: str
    revision: str
    # the revision's file names when every one of them matched, else empty
    complete: list[str]
    files: dict[str, Entry]


Say = Callable[[str], None]


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def hash_file(path: Path, algo: str, size: int) -> str:
    """The file's sha256, or its git blob id (sha1 of `blob <size>\\0` and the bytes)."""
    h = hashlib.sha256() if algo == "sha256" else hashlib.sha1(f"blob {size}\0".encode())
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _human(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISREG, "a file"),
        (stat.S_ISLNK, "a symlink"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def paths_of(profile: Profile) -> tuple[Path, Path]:
    """model.dir and model.common_link on the head, `~` as the plan expands it."""
    from tp4.line.plan import expand, home_of

    home = home_of(profile.cluster.head, profile.cluster)
    return Path(expand(profile.model.dir, home)), Path(expand(profile.model.common_link, home))


def shard_count(model_dir: Path) -> int:
    try:
        names = os.listdir(model_dir)
    except OSError:
        return 0
    return sum(1 for n in names if fnmatch.fnmatchcase(n, SHARD_GLOB) and (model_dir / n).is_file())


# -- the verification cache ------------------------------------------------------------------


def load_cache(model_dir: Path, repo: str, revision: str) -> Cache:
    empty: Cache = {"schema": SCHEMA, "repo": repo, "revision": revision, "complete": [], "files": {}}
    from tp4.core.errors import InvalidInput
    from tp4.core.userfiles import read_input

    try:
        # a regular file of bounded size: a FIFO or a device put there is not waited on or read
        data = json.loads(read_input(model_dir / CACHE_NAME, "verification cache"))
    except (InvalidInput, ValueError, RecursionError):
        return empty
    if (
        not isinstance(data, dict)
        or data.get("schema") != SCHEMA
        or data.get("repo") != repo
        or data.get("revision") != revision
    ):
        return empty
    files: dict[str, Entry] = {}
    raw = data.get("files")
    for name, e in raw.items() if isinstance(raw, dict) else ():
        if (
            isinstance(e, dict)
            and isinstance(e.get("size"), int)
            and isinstance(e.get("mtime_ns"), int)
            and isinstance(e.get("algo"), str)
            and isinstance(e.get("digest"), str)
        ):
            files[name] = {"size": e["size"], "mtime_ns": e["mtime_ns"], "algo": e["algo"], "digest": e["digest"]}
    complete = data.get("complete")
    names = [n for n in complete if isinstance(n, str)] if isinstance(complete, list) else []
    return {"schema": SCHEMA, "repo": repo, "revision": revision, "complete": names, "files": files}


def save_cache(model_dir: Path, cache: Cache) -> None:
    replace_file(model_dir / CACHE_NAME, json.dumps(cache, indent=1, sort_keys=True) + "\n")


def _still_matches(path: Path, entry: Entry | None) -> bool:
    if entry is None:
        return False
    try:
        st = os.stat(path)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_size == entry["size"] and st.st_mtime_ns == entry["mtime_ns"]


def verified_complete(model_dir: Path, cache: Cache, expected_shards: int) -> bool:
    """The cache says every file of the revision matched, and each is still as it was hashed."""
    names = cache["complete"]
    if "config.json" not in names or sum(1 for n in names if fnmatch.fnmatchcase(n, SHARD_GLOB)) < expected_shards:
        return False
    return all(_still_matches(model_dir / n, cache["files"].get(n)) for n in names)


# -- the model directory and the link ----------------------------------------------------------


def prepare_dir(model_dir: Path) -> None:
    """model.dir exists (made if missing) as a directory tp4 can write into, or the user is told why not."""
    try:
        st = os.stat(model_dir)
    except FileNotFoundError:
        try:
            model_dir.mkdir(parents=True)
        except OSError as exc:
            raise InvalidInput(
                f"model.dir: cannot create {model_dir}: {exc.strerror}; fix: create it (writable by "
                f"this user) or set model.dir to a directory on the head's model disk"
            ) from None
        st = os.stat(model_dir)
    except OSError as exc:
        raise InvalidInput(
            f"model.dir: {model_dir}: {exc.strerror}; fix: set model.dir to a directory on the head's model disk"
        ) from None
    if not stat.S_ISDIR(st.st_mode):
        raise InvalidInput(
            f"model.dir: {model_dir} is {_kind(st.st_mode)}, not a directory; fix: move it away or set "
            "model.dir to a directory for the checkpoint (~476 GiB)"
        )
    probe = model_dir / f".tp4-write-probe.{os.getpid()}"
    try:
        probe.touch()
        probe.unlink()
    except OSError as exc:
        raise InvalidInput(
            f"model.dir: cannot write into {model_dir} ({exc.strerror}); fix: make it writable by this "
            f"user (chown/chmod u+w), or set model.dir to a writable directory"
        ) from None


def link(model_dir: Path, common: Path, say: Say) -> None:
    """`ln -sfn MODEL_DIR COMMON_MODEL`, for a link only: a symbolic link at common_link that
    points to a directory (a model's, as tp4 makes it) or to nothing (a model removed since) is
    replaced; anything else there (a regular file, a directory, a link to a file) is refused,
    never replaced (a file is someone's data; ln would put the link inside a directory)."""
    target = os.path.abspath(model_dir)
    try:
        if os.readlink(common) == target:
            return
    except OSError:
        pass
    if common.is_symlink():
        if common.exists() and not common.is_dir():
            raise InvalidInput(
                f"model.common_link: {common} is a link to {os.readlink(common)!r}, which is no model directory; "
                "fix: remove the link if it is not needed, or set model.common_link to a free path"
            )
    elif os.path.lexists(common):
        what = "a directory" if common.is_dir() else "a regular file" if common.is_file() else "not a link"
        raise InvalidInput(
            f"model.common_link: {common} is {what}, not a link tp4 made; fix: move it away, or set "
            "model.common_link to a free path"
        )
    tmp = common.with_name(f".{common.name}.tp4-link.{os.getpid()}")
    try:
        tmp.unlink(missing_ok=True)
        os.symlink(target, tmp)
        os.replace(tmp, common)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise InvalidInput(
            f"model.common_link: cannot make {common} -> {target} ({exc.strerror}); fix: create "
            f"{common.parent} writable by this user, or set model.common_link elsewhere"
        ) from None
    say(f"download: {common} -> {target}")


# -- the Hub -------------------------------------------------------------------------------------


def _endpoint() -> str:
    from huggingface_hub import constants

    return constants.ENDPOINT


def _hub_error(exc: Exception, what: str, repo: str, revision: str) -> Tp4Error:
    from huggingface_hub import errors

    where = f"the Hub at {_endpoint()}"
    if isinstance(exc, errors.GatedRepoError):
        return Tp4Error(
            f"{what}: {repo} is gated at {where}; fix: accept its terms on the repository's page, then "
            "`hf auth login` or export HF_TOKEN"
        )
    if isinstance(exc, errors.RepositoryNotFoundError):
        return InvalidInput(
            f"model.hf_repo: {repo} is not a repository at {where} (or needs a token); fix: correct "
            "model.hf_repo, or `hf auth login` / export HF_TOKEN for a private one"
        )
    if isinstance(exc, errors.RevisionNotFoundError):
        return InvalidInput(
            f"model.hf_revision: {revision} is not a commit of {repo} at {where}; fix: set "
            "model.hf_revision to a full commit id of the repository"
        )
    if isinstance(exc, errors.OfflineModeIsEnabled):
        return Tp4Error(f"{what}: HF_HUB_OFFLINE is set; fix: unset HF_HUB_OFFLINE to download")
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return Tp4Error(
        f"{what}: {where} failed: {text[:300]}; fix: check the head's network (or HF_ENDPOINT), then "
        "rerun `tp4 download` (it resumes)"
    )


def remote_files(repo: str, revision: str) -> list[RemoteFile]:
    """The revision's files with their sizes and hashes, from one model_info call."""
    from huggingface_hub import HfApi

    try:
        info = HfApi().model_info(repo, revision=revision, files_metadata=True)
    except Exception as exc:  # every failure of the Hub call becomes a plain error
        raise _hub_error(exc, "download", repo, revision) from None
    if info.sha is not None and info.sha != revision:
        raise Tp4Error(
            f"download: {_endpoint()} answered for commit {info.sha}, not the pinned {revision}; fix: "
            "point HF_ENDPOINT at a Hub (or mirror) that serves commit ids"
        )
    if not info.siblings:
        raise Tp4Error(
            f"download: {_endpoint()} lists no files for {repo}@{revision}; fix: check model.hf_repo, "
            "model.hf_revision and HF_ENDPOINT"
        )
    files = []
    for s in info.siblings:
        name = s.rfilename
        parts = PurePosixPath(name).parts
        if (
            not name
            or name.startswith("/")
            or "\\" in name
            or any(p in ("..", ".") for p in parts)
            or parts[0] in (PARTIAL_DIR, CACHE_NAME, ".cache")
        ):
            raise Tp4Error(
                f"download: the Hub lists a file named {name[:120]!r}, which would land outside "
                "model.dir or on tp4's own files; fix: check HF_ENDPOINT (refusing to download)"
            )
        if s.lfs is not None:
            files.append(RemoteFile(name, int(s.lfs.size), "sha256", s.lfs.sha256))
        elif s.blob_id is not None and s.size is not None:
            files.append(RemoteFile(name, int(s.size), "git-sha1", s.blob_id))
        else:
            raise Tp4Error(
                f"download: the Hub gave no hash for {name}, so it cannot be verified; fix: check "
                "HF_ENDPOINT (it must answer files metadata with blobs=true)"
            )
    return files


# -- fetching --------------------------------------------------------------------------------------


class Mismatch(Exception):
    def __init__(self, name: str, algo: str, got: str, want: str) -> None:
        super().__init__(name)
        self.name, self.algo, self.got, self.want = name, algo, got, want


def partial_path(model_dir: Path, name: str) -> Path:
    return model_dir / PARTIAL_DIR / (quote(name, safe="") + ".partial")


def fetch(model_dir: Path, repo: str, revision: str, f: RemoteFile, progress: bool, say: Say) -> Entry:
    """One file: resume its partial file, hash the whole, rename into place; its cache entry."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_url
    from huggingface_hub.file_download import http_get
    from huggingface_hub.utils._headers import build_hf_headers  # (utils re-exports it lazily, unseen by mypy)

    part = partial_path(model_dir, f.name)
    part.parent.mkdir(exist_ok=True)
    try:
        st = os.lstat(part)
        if not stat.S_ISREG(st.st_mode):
            raise InvalidInput(f"download: {part} is {_kind(st.st_mode)}; fix: remove it (rm -r {part}) and rerun")
        have = st.st_size if st.st_size <= f.size else 0
    except FileNotFoundError:
        have = 0
    url = hf_hub_url(repo, f.name, revision=revision)
    headers = build_hf_headers()
    headers["Accept-Encoding"] = "identity"
    meta = get_hf_file_metadata(url, headers=headers)
    if meta.commit_hash is not None and meta.commit_hash != revision:
        raise Tp4Error(
            f"download: {f.name}: the endpoint served commit {meta.commit_hash}, not {revision}; fix: check HF_ENDPOINT"
        )
    if not progress:
        say(f"download: {f.name} ({_human(f.size)})" + (f", resuming at {_human(have)}" if have else ""))
    with open(part, "r+b" if have else "wb") as out:
        out.truncate(have)
        out.seek(have)
        http_get(meta.location, out, resume_size=have, headers=headers, expected_size=f.size, displayed_filename=f.name)
    got = hash_file(part, f.algo, f.size)
    if got != f.digest:
        part.unlink(missing_ok=True)
        raise Mismatch(f.name, f.algo, got, f.digest)
    dest = model_dir / f.name
    dest.parent.mkdir(parents=True, exist_ok=True)
    os.replace(part, dest)
    st = os.stat(dest)
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "algo": f.algo, "digest": f.digest}


@dataclass
class Result:
    fetched: list[str]
    errors: list[str]
    mismatches: list[Mismatch]


def fetch_all(
    model_dir: Path, repo: str, revision: str, todo: list[RemoteFile], cache: Cache, progress: bool, say: Say
) -> Result:
    """Fetch `todo`, PARALLEL at a time, in daemon threads (Ctrl-C stops tp4 at once; the
    partial files stay for the next run). The cache is saved after every verified file."""
    result = Result([], [], [])
    lock = threading.Lock()
    queue = list(reversed(todo))
    invalid: list[InvalidInput] = []

    def worker() -> None:
        while True:
            with lock:
                if not queue:
                    return
                f = queue.pop()
            try:
                entry = fetch(model_dir, repo, revision, f, progress, say)
            except Mismatch as m:
                with lock:
                    result.mismatches.append(m)
                continue
            except InvalidInput as exc:
                with lock:
                    invalid.append(exc)
                continue
            except Exception as exc:  # a network or disk failure of this file; the others go on
                err = _hub_error(exc, f"download: {f.name}", repo, revision)
                with lock:
                    result.errors.append(err.message)
                continue
            with lock:
                cache["files"][f.name] = entry
                save_cache(model_dir, cache)
                result.fetched.append(f.name)
                done = len(result.fetched)
            if not progress:
                say(f"download: {f.name} verified ({f.algo} {f.digest[:12]}; {done}/{len(todo)})")

    threads = [
        threading.Thread(target=worker, name=f"tp4-download-{i}", daemon=True) for i in range(min(PARALLEL, len(todo)))
    ]
    for t in threads:
        t.start()
    for t in threads:
        while t.is_alive():
            t.join(0.2)  # short waits, so Ctrl-C reaches the main thread
    if invalid:
        raise invalid[0]
    return result


def _without_userinfo(url: str) -> str:
    """An endpoint as shown: a user:password@ in it (HF_ENDPOINT) is never printed."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2])) if "@" in parts.netloc else url


def rehearse(profile: Profile) -> list[str]:
    """`tp4 download --dry-run`: what download does on the head (this machine), from the profile
    alone: neither the Hub nor the directory is asked, so which files it fetches is said to depend
    on what model.dir holds. The token is never shown (huggingface_hub sends it as a header)."""
    m = profile.model
    model_dir, common = paths_of(profile)
    where = "head (this machine)"
    return [
        f"{where}: (skipped when {model_dir}/.tp4-verified.json lists every file of {m.hf_repo}@{m.hf_revision} as "
        "verified and each is unchanged: depends on the directory, not read in a dry run)",
        f"{where}: ask {_without_userinfo(_endpoint())} for the files of {m.hf_repo} at {m.hf_revision} with their hashes "
        f"(config.json and {m.expected_shards} {SHARD_GLOB} shards expected)",
        f"{where}: fetch into {model_dir} the files it lacks or whose hash differs, {PARALLEL} at once, each "
        "through .tp4-download/<name>.partial (resumed) and checked against the Hub's sha256 (git sha1 for a "
        "small file) before it is renamed into place (which files: depends on the directory)",
        f"{where}: {shlex.join(['ln', '-sfn', str(model_dir), str(common)])}  (a link only; anything else there is "
        "refused)",
    ]


def download(profile: Profile, say: Say = _say, progress: bool | None = None) -> int:
    """The whole command; returns the number of files fetched (0 when the directory was complete)."""
    m = profile.model
    model_dir, common = paths_of(profile)
    if progress is None:
        progress = sys.stderr.isatty()
    try:
        st = os.stat(model_dir)
        if not stat.S_ISDIR(st.st_mode):
            prepare_dir(model_dir)  # says what it is
    except FileNotFoundError:
        pass
    cache = load_cache(model_dir, m.hf_repo, m.hf_revision)
    if verified_complete(model_dir, cache, m.expected_shards):
        say(
            f"download: {model_dir} holds {m.hf_repo}@{m.hf_revision[:12]} ({len(cache['complete'])} files, "
            "each verified against the Hub's hash); nothing to fetch"
        )
        link(model_dir, common, say)
        return 0
    prepare_dir(model_dir)
    files = remote_files(m.hf_repo, m.hf_revision)
    names = [f.name for f in files]
    shards = sum(1 for n in names if fnmatch.fnmatchcase(n, SHARD_GLOB))
    if "config.json" not in names or shards < m.expected_shards:
        raise InvalidInput(
            f"model.expected_shards: {m.hf_repo}@{m.hf_revision[:12]} has "
            f"{'config.json and ' if 'config.json' in names else 'no config.json and '}{shards} "
            f"{SHARD_GLOB} shards, the profile expects {m.expected_shards}; fix: set model.expected_shards "
            "to the revision's shard count, or model.hf_revision to the checkpoint's commit"
        )
    from huggingface_hub.utils.tqdm import disable_progress_bars

    if not progress:
        disable_progress_bars()
    todo: list[RemoteFile] = []
    cache["complete"] = []
    for f in files:
        path = model_dir / f.name
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            todo.append(f)
            continue
        if stat.S_ISLNK(st.st_mode) or not stat.S_ISREG(st.st_mode):
            raise InvalidInput(
                f"model.dir: {path} is {'a symlink' if stat.S_ISLNK(st.st_mode) else _kind(st.st_mode)}, "
                f"not the file {f.name} of the checkpoint; fix: remove it (rm {path}) and rerun `tp4 download`"
            )
        entry = cache["files"].get(f.name)
        if (
            entry is not None
            and entry["algo"] == f.algo
            and entry["digest"] == f.digest
            and _still_matches(path, entry)
        ):
            continue
        if st.st_size == f.size:
            if not progress:
                say(f"download: checking {f.name} ({_human(f.size)})")
            got = hash_file(path, f.algo, f.size)
            if got == f.digest:
                cache["files"][f.name] = {
                    "size": st.st_size,
                    "mtime_ns": st.st_mtime_ns,
                    "algo": f.algo,
                    "digest": f.digest,
                }
                continue
            say(
                f"download: {f.name} does not match the Hub's {f.algo} ({got[:12]}, want {f.digest[:12]}); removed, fetching it again"
            )
        else:
            say(f"download: {f.name} has {st.st_size} bytes, the Hub's has {f.size}; removed, fetching it again")
        path.unlink()
        cache["files"].pop(f.name, None)
        todo.append(f)
    save_cache(model_dir, cache)
    if todo:
        total = sum(f.size for f in todo)
        say(
            f"download: {len(todo)} of {len(files)} files ({_human(total)}) of {m.hf_repo}@{m.hf_revision[:12]} "
            f"from {_endpoint()} into {model_dir}"
        )
    started = time.monotonic()
    result = fetch_all(model_dir, m.hf_repo, m.hf_revision, todo, cache, progress, say)
    problems = [
        f"{x.name} does not match the Hub's {x.algo} (got {x.got}, want {x.want}); removed" for x in result.mismatches
    ]
    problems += result.errors
    if problems:
        raise Tp4Error(
            "download: "
            + ("1 file" if len(problems) == 1 else f"{len(problems)} files")
            + " failed:\n"
            + "\n".join(f"  - {p}" for p in problems)
            + "\nfix: rerun `tp4 download`: it keeps every verified file and resumes partial ones; a file "
            "that fails its hash again is corrupt at the endpoint (the Hub, or the mirror HF_ENDPOINT names)"
        )
    cache["complete"] = names
    save_cache(model_dir, cache)
    if todo:
        say(f"download: {len(todo)} files fetched and verified in {time.monotonic() - started:.0f} s")
    else:
        say(f"download: {model_dir} holds {m.hf_repo}@{m.hf_revision[:12]} ({len(names)} files, verified)")
    link(model_dir, common, say)
    try:
        (model_dir / PARTIAL_DIR).rmdir()
    except OSError:
        pass
    return len(todo)
