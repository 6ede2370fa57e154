"""``tp4 sources lock``: fill in or refresh pins. Resolves branches and tags to commits (GitHub API
through requests; git+ URLs through GitPython), hashes what the new pin downloads, and rewrites only
the rows it locked, in place. The manifest is written once, after every row succeeded, together
with its JSON companion (:mod:`tp4.image.sources.companion`).

``TP4_GITHUB_API`` overrides the API base (default the public GitHub API); ``GITHUB_TOKEN``, when
set, is sent as a bearer token and never logged.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

from tp4.core import process
from tp4.core.errors import InvalidInput, Tp4Error
from tp4.image.sources import companion, download, fetch, nar
from tp4.image.sources.manifest import UNLOCKED, Manifest, Row, git_remote, replace_rows

GITHUB_API = "https://api.github.com"
_HEX40 = re.compile(r"[0-9a-f]{40}")
_ARCHIVE = re.compile(
    r"https://github\.com/(?P<owner>[^/]+)/(?P<repo>[^/]+)/archive/(?P<ref>.+?)(?P<ext>\.tar\.gz|\.tgz|\.zip)"
)
_RAW = re.compile(r"https://raw\.githubusercontent\.com/(?P<owner>[^/]+)/(?P<repo>[^/]+)/(?P<ref>[^/]+)/(?P<path>.+)")


@dataclass(frozen=True)
class Change:
    name: str
    old: Row
    new: Row

    def describe(self) -> str:
        parts = []
        if self.old.commit != self.new.commit:
            parts.append(f"commit {self.old.commit} -> {self.new.commit}")
        if self.old.sha256 != self.new.sha256:
            parts.append(f"sha256 {self.old.sha256} -> {self.new.sha256}")
        if self.old.tree_sha256 != self.new.tree_sha256:
            parts.append(f"tree-sha256 {self.old.tree_sha256 or '(none)'} -> {self.new.tree_sha256}")
        return f"{self.name}: " + ("; ".join(parts) if parts else "unchanged")


def github_repo(url: str) -> tuple[str, str, str] | None:
    """(owner, repo, ref) of a GitHub archive or raw-file URL."""
    for pattern in (_ARCHIVE, _RAW):
        m = pattern.fullmatch(url)
        if m:
            return m["owner"], m["repo"], m["ref"]
    return None


def with_ref(url: str, ref: str) -> str:
    """The same GitHub URL at another ref (only the ref segment changes)."""
    m = _ARCHIVE.fullmatch(url)
    if m:
        return f"https://github.com/{m['owner']}/{m['repo']}/archive/{ref}{m['ext']}"
    m = _RAW.fullmatch(url)
    if m:
        return f"https://raw.githubusercontent.com/{m['owner']}/{m['repo']}/{ref}/{m['path']}"
    raise InvalidInput(f"{url}: not a GitHub archive or raw URL; cannot move it to another ref")


def resolve_github(owner: str, repo: str, ref: str) -> str:
    import requests

    base = os.environ.get("TP4_GITHUB_API", GITHUB_API).rstrip("/")
    headers = {"Accept": "application/vnd.github+json", "User-Agent": "tp4-sources"}
    token = os.environ.get("GITHUB_TOKEN")
    if token:
        headers["Authorization"] = f"Bearer {token}"
    url = f"{base}/repos/{owner}/{repo}/commits/{ref}"
    try:
        resp = requests.get(url, headers=headers, timeout=30)
    except requests.RequestException as exc:
        what = f"resolving {owner}/{repo}@{ref} through the GitHub API"
        if download.unresolvable(exc):
            raise download.offline_error(download.host_of(url), what) from None
        raise Tp4Error(f"{what}: {download._reason(exc, url)}") from None
    if resp.status_code != 200:
        raise Tp4Error(f"GitHub API: {owner}/{repo}@{ref}: HTTP {resp.status_code} ({resp.text[:200].strip()})")
    try:
        sha = resp.json()["sha"]
    except (ValueError, KeyError, TypeError) as exc:
        raise Tp4Error(f"GitHub API: unexpected answer for {owner}/{repo}@{ref}") from exc
    if not isinstance(sha, str) or not _HEX40.fullmatch(sha):
        raise Tp4Error(f"GitHub API: {sha!r} is not a commit")
    return sha


def resolve_git(url: str, ref: str) -> str:
    """A ref of a git+ URL to a commit, with ``git ls-remote`` (:mod:`tp4.image.sources.gitrepo`)."""
    from tp4.image.sources import gitrepo

    remote = git_remote(url)
    if _HEX40.fullmatch(ref):
        return ref
    out = gitrepo.ls_remote(remote, ref)
    found = None
    for line in out.splitlines():
        sha, _, name = line.partition("\t")
        if name == f"refs/tags/{ref}^{{}}":
            return sha  # the commit an annotated tag points at
        if found is None and name in (ref, f"refs/heads/{ref}", f"refs/tags/{ref}"):
            found = sha
    if found is None:
        raise Tp4Error(f"{remote}: no branch or tag named {ref!r}")
    return found


def _image_hash(row: Row, manifest_path: Path | None) -> str:
    """sha256 (hex) of dockerTools.pullImage's output: a flat hash of the docker-archive skopeo
    writes. It is computed by the nix-prefetch-docker of the nixpkgs the flake pins (the skopeo
    that pullImage uses), not whatever version is on PATH, so the two hashes agree."""
    from tp4.image import nix

    flake = nix.find_flake(manifest_path.parent if manifest_path else None)
    nix.require(flake, what=f"tp4 sources lock {row.name}")
    img = row.image()
    # built, then run here (through the funnel) rather than `nix run`: the same program
    built = process.run(
        [*nix.base(), "build", "--no-link", "--json", "--inputs-from", str(flake), "nixpkgs#nix-prefetch-docker"]
    )
    try:
        tool = Path(json.loads(built.stdout)[0]["outputs"]["out"]) / "bin" / "nix-prefetch-docker"
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise Tp4Error(f"nix build of nixpkgs#nix-prefetch-docker gave no output path: {built.stdout[:200]!r}") from exc
    proc = process.run(
        [
            str(tool),
            "--json",
            "--image-name",
            img["name"],
            "--image-digest",
            img["digest"],
            "--arch",
            row.arch,
            "--os",
            "linux",
            "--final-image-tag",
            img["tag"],
        ]
    )
    try:
        answer = json.loads(proc.stdout)
        value = answer.get("hash") or answer["sha256"]  # newer versions print an SRI `hash`
        return nar.parse_hash(value).hex()
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise Tp4Error(f"nix-prefetch-docker gave no usable hash for {row.name}: {proc.stdout[:200]!r}") from exc


def tree_sha256(archive: Path) -> str:
    """The NAR hash (hex) of :func:`tp4.image.sources.fetch.tree_of_archive`: what ``tree-sha256=`` records."""
    with tempfile.TemporaryDirectory(prefix="tp4-tree-") as tmp:
        return nar.nar_sha256(fetch.tree_of_archive(archive, Path(tmp))).hex()


def check_tree_lockable(row: Row) -> None:
    if row.kind != "archive":
        raise InvalidInput(
            f"--tree {row.name}: it is a {row.kind} row; --tree is for archive rows "
            "(GitHub archive/*.tar.gz), fetched by the hash of their unpacked tree"
        )
    if row.attrs.get("strip") != "1":
        raise InvalidInput(
            f"--tree {row.name}: the row has strip={row.attrs.get('strip', '0')}; a tree hash is of "
            "the archive's one top directory (fetchzip's stripRoot), so the row needs strip=1"
        )


def lock_row(
    row: Row, ref: str | None = None, *, quiet: bool = False, manifest_path: Path | None = None, tree: bool = False
) -> Row:
    """The row with its commit resolved (from ``ref``, or its own commit column if that is a ref)
    and its sha256 computed from a fresh download; with ``tree`` (archive rows) also the NAR hash
    of the unpacked tree, as ``tree-sha256=``."""
    kind = row.kind
    if tree:
        check_tree_lockable(row)
    if kind == "local":
        raise Tp4Error(f"{row.name}: a local row names a file in upstream's repository; replace it with a URL row")
    if kind == "wheel":
        if ref:
            raise InvalidInput(f"{row.name}: --ref is for git sources; edit the wheel's version and file name instead")
        with tempfile.TemporaryDirectory(prefix="tp4-lock-") as tmp:
            got = fetch.pip_download(row, Path(tmp), quiet=quiet)
            return replace(row, sha256=download.sha256_file(got))
    if kind == "image":
        return replace(row, sha256=_image_hash(row, manifest_path))
    if kind == "git":
        commit = resolve_git(row.url, ref or row.commit)
        url = row.url.rsplit("@", 1)[0] + "@" + commit
        with tempfile.TemporaryDirectory(prefix="tp4-lock-") as tmp:
            fetch.git_checkout(url, commit, Path(tmp) / "tree")
            return replace(row, commit=commit, url=url, sha256=nar.nar_sha256(Path(tmp) / "tree").hex())
    commit, url = row.commit, row.url
    wanted = ref or (None if _HEX40.fullmatch(row.commit) else row.commit)
    if wanted:
        gh = github_repo(row.url)
        if gh is None:
            raise Tp4Error(f"{row.name}: {row.url} is not a GitHub URL; cannot resolve {wanted!r} to a commit")
        owner, repo, current = gh
        commit = resolve_github(owner, repo, wanted)
        url = with_ref(row.url, commit)
    if tree or row.tree_sha256:
        with tempfile.TemporaryDirectory(prefix="tp4-lock-") as tmp:
            sha, unpacked = fetch.download_tree(row, url, Path(tmp), quiet=quiet)
            attrs = {**row.attrs, "tree-sha256": nar.nar_sha256(unpacked).hex()}
        return replace(row, commit=commit, url=url, sha256=sha, attrs=attrs)
    sha, _ = download.hash_url(url, label=row.name, quiet=quiet)
    return replace(row, commit=commit, url=url, sha256=sha)


def lock(
    manifest: Manifest, names: list[str], *, ref: str | None = None, quiet: bool = False, tree: bool = False
) -> list[Change]:
    """Lock ``names`` (default: every unlocked row) and rewrite the manifest file once at the end.
    ``tree``: also record each named archive row's tree hash (``tree-sha256=``)."""
    if manifest.path is None:
        raise Tp4Error("lock needs a manifest file")
    if ref and len(names) != 1:
        raise InvalidInput("--ref moves one row: name it (tp4 sources lock NAME --ref BRANCH)")
    if tree and not names:
        raise InvalidInput(
            "--tree needs the rows it applies to: tp4 sources lock --tree ROW [ROW...] "
            "(archive rows with strip=1, e.g. GitHub archive/*.tar.gz)"
        )
    rows = [manifest.row(n) for n in names] if names else [r for r in manifest.rows if r.sha256 == UNLOCKED]
    if tree:
        for row in rows:  # every named row checked before anything is downloaded
            check_tree_lockable(row)
    changes = []
    for row in rows:
        new = lock_row(row, ref, quiet=quiet, manifest_path=manifest.path, tree=tree)
        changes.append(Change(row.name, row, new))
    updated = {c.name: c.new for c in changes if c.new != c.old}
    if updated:
        _write(manifest, updated)
    return changes


def _write(manifest: Manifest, updated: dict[str, Row]) -> None:
    """Put the new rows into the manifest as it is now, under its lock: another run may have
    rewritten it during the downloads, and writing the text read before them would drop its pins.
    A row that run changed too is refused (which pin is meant is the user's call)."""
    from tp4.image.sources.manifest import load

    path = manifest.path
    assert path is not None
    with companion.locked(path):
        current = load(path)
        for name in updated:
            now = current.by_name.get(name)
            if now is None or now.render() != manifest.by_name[name].render():
                raise Tp4Error(
                    f"{name}: the row changed in {path} while this run was locking it (another `tp4 sources lock`?); "
                    f"nothing was written; fix: run `tp4 sources lock {name}` again"
                )
        # the manifest and its JSON companion (what Nix reads), together: both or neither
        companion.write(path, replace_rows(current, updated))
