"""The tp4 images on each node: list them (provenance) and prune the old builds.

A tp4 image is one that carries the label ``tp4.line.ref`` (pkgs/image.nix); every other image
in a node's runtime is never touched. For each node (the head: the local runtime; the workers:
the same runtime over ssh) :func:`node_images` asks the runtime for

* the tp4 images (``<runtime> images --filter label=tp4.line.ref``, then one ``image inspect``):
  id, tags, manifest digests, created time, size, labels (flake revision and pins) and layers;
* the containers, running or stopped (``ps -a``, then one ``container inspect``), so that an
  image a container was created from is known to be in use.

:func:`plan_prune` decides, per line reference, what goes: every tp4 image except those a
container uses, the one the line's tag names, and the newest ``keep`` by created time.
:func:`prune` removes them by their tags (or id, for an untagged one) without ``--force``, so
the runtime itself still refuses an image a container started using meanwhile, and reports the
bytes freed as the runtime's own image disk usage before minus after (``system df``; docker
gives it rounded to 3 digits). :func:`prune_store` deletes the head's registry manifests of
images no node keeps and garbage-collects the registry's blobs (tp4.image.imagestore).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from types import ModuleType
from typing import Protocol

from tp4.core import process

from tp4.image import runtime_cli
from tp4.image.build import FLAKE_REV_LABEL, LINE_REF_LABEL, PIN_PREFIX
from tp4.core.errors import Tp4Error
from tp4.image.imagestore import DEFAULT_REPO

# the repository the head's registry holds the line's images in
STORE_REPO = DEFAULT_REPO
HEAD = "head"
_EPOCH = datetime.fromtimestamp(0, timezone.utc)


@dataclass(frozen=True)
class Image:
    """One tp4 image in a node's runtime."""

    id: str
    tags: tuple[str, ...]
    digests: tuple[str, ...]  # RepoDigests: `name@sha256:…` the runtime knows the image by
    created: datetime
    size: int
    labels: Mapping[str, str]
    layers: tuple[str, ...]
    containers: tuple[str, ...] = ()  # names of the containers (any state) created from it

    @property
    def line_ref(self) -> str:
        return self.labels.get(LINE_REF_LABEL, "")

    @property
    def flake_rev(self) -> str | None:
        return self.labels.get(FLAKE_REV_LABEL)

    @property
    def pins(self) -> dict[str, str]:
        return {k[len(PIN_PREFIX) :]: v for k, v in sorted(self.labels.items()) if k.startswith(PIN_PREFIX)}

    @property
    def is_line(self) -> bool:
        """The line's tag names this image."""
        return any(runtime_cli.same_ref(t, self.line_ref) for t in self.tags)

    def digest(self, repo: str = STORE_REPO) -> str | None:
        """The manifest digest it was pulled by from the head's registry (a RepoDigest of ``repo``)."""
        for d in self.digests:
            name, _, digest = d.partition("@")
            if name.rsplit("/", 1)[-1] == repo and digest:
                return digest
        return None


@dataclass(frozen=True)
class NodeImages:
    """What a node's runtime holds; ``error`` when it could not be asked (unreachable)."""

    name: str
    remote: process.Remote | None
    images: tuple[Image, ...] = ()
    error: str | None = None

    def line_ids(self) -> dict[str, str]:
        """Line reference -> id of the image its tag names on this node."""
        return {i.line_ref: i.id for i in self.images if i.is_line}


def node_name(remote: process.Remote | None) -> str:
    return HEAD if remote is None else remote.host


def _created(text: str) -> datetime:
    """RFC 3339 time of `image inspect` (nanoseconds cut to microseconds); the epoch if unreadable."""
    text = re.sub(r"(\.\d{6})\d+", r"\1", text.strip()).replace("Z", "+00:00")
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        return _EPOCH
    return when if when.tzinfo else when.replace(tzinfo=timezone.utc)


def _run(argv: list[str], remote: process.Remote | None) -> str:
    proc = process.run(argv, remote=remote, check=False)
    if proc.returncode != 0:
        if remote is not None and proc.returncode == 255:
            raise Tp4Error(f"cannot reach {remote.destination} over ssh:\n{proc.stderr.strip()}")
        raise Tp4Error(
            f"`{' '.join(argv)}` failed on {node_name(remote)} with exit code {proc.returncode}:\n{proc.stderr.strip()}"
        )
    return proc.stdout


def _inspect_json(
    runtime: str, kind: str, ids: Sequence[str], remote: process.Remote | None
) -> list[dict[str, object]]:
    if not ids:
        return []
    out = _run([runtime, kind, "inspect", *ids], remote)
    try:
        data = json.loads(out or "[]")
    except ValueError as exc:
        raise Tp4Error(f"`{runtime} {kind} inspect` on {node_name(remote)} did not print JSON ({exc})") from None
    return [d for d in data if isinstance(d, dict)] if isinstance(data, list) else []


def _strs(value: object) -> tuple[str, ...]:
    return tuple(v for v in value if isinstance(v, str)) if isinstance(value, list) else ()


def _dict(value: object) -> dict[str, object]:
    return {str(k): v for k, v in value.items()} if isinstance(value, dict) else {}


def used_images(runtime: str, remote: process.Remote | None = None) -> dict[str, tuple[str, ...]]:
    """Image id -> names of the containers (running or stopped) created from it."""
    ids = _run([runtime, "ps", "-a", "-q", "--no-trunc"], remote).split()
    used: dict[str, list[str]] = {}
    for c in _inspect_json(runtime, "container", ids, remote):
        image, name = c.get("Image"), c.get("Name")
        if isinstance(image, str) and image:
            used.setdefault(runtime_cli.normalize_id(image), []).append(str(name or c.get("Id", "?")).lstrip("/"))
    return {k: tuple(sorted(v)) for k, v in used.items()}


def list_images(runtime: str, remote: process.Remote | None = None) -> list[Image]:
    """The tp4 images of a node's runtime, newest first, each with the containers using it."""
    ids = sorted(
        set(_run([runtime, "images", "-q", "--no-trunc", "--filter", f"label={LINE_REF_LABEL}"], remote).split())
    )
    found = _inspect_json(runtime, "image", ids, remote)
    used = used_images(runtime, remote) if found else {}
    images = []
    for d in found:
        config = _dict(d.get("Config"))
        labels = {str(k): str(v) for k, v in _dict(config.get("Labels") or d.get("Labels")).items()}
        if LINE_REF_LABEL not in labels:
            continue
        image_id = runtime_cli.normalize_id(str(d.get("Id", "")))
        size = d.get("Size")
        images.append(
            Image(
                id=image_id,
                tags=_strs(d.get("RepoTags")),
                digests=_strs(d.get("RepoDigests")),
                created=_created(str(d.get("Created", ""))),
                size=size if isinstance(size, int) else 0,
                labels=labels,
                layers=_strs(_dict(d.get("RootFS")).get("Layers")),
                containers=used.get(image_id, ()),
            )
        )
    return sorted(images, key=lambda i: (i.created, i.id), reverse=True)


def node_images(runtime: str, remote: process.Remote | None = None) -> NodeImages:
    try:
        return NodeImages(node_name(remote), remote, tuple(list_images(runtime, remote)))
    except Tp4Error as exc:
        return NodeImages(node_name(remote), remote, error=exc.message)


def inventory(runtime: str, workers: Sequence[process.Remote]) -> list[NodeImages]:
    """The head (local runtime) and every worker, asked in parallel."""
    targets: list[process.Remote | None] = [None, *workers]
    with ThreadPoolExecutor(max_workers=len(targets)) as pool:
        return list(pool.map(lambda r: node_images(runtime, r), targets))


def differences(head: NodeImages, node: NodeImages) -> list[str]:
    """How a node's line images differ from the head's (empty: the same, or nothing to compare)."""
    if head.error or node.error or node is head:
        return []
    mine, theirs = head.line_ids(), node.line_ids()
    out = []
    for ref, image_id in sorted(mine.items()):
        other = theirs.get(ref)
        if other is None:
            out.append(f"no image {ref}; the head has {image_id[:12]}")
        elif other != image_id:
            out.append(f"{ref} is {other[:12]}, the head has {image_id[:12]}")
    return out


# --- prune ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Decision:
    image: Image
    remove: bool
    reason: str  # why it stays ("line", "in use by c1", "newest 2") or goes ("old build")


def plan_prune(images: Iterable[Image], keep: int) -> list[Decision]:
    """Per line reference: keep the images containers use, the line tag's image and the newest
    ``keep`` by created time; every other tp4 image goes."""
    by_line: dict[str, list[Image]] = {}
    for image in images:
        by_line.setdefault(image.line_ref, []).append(image)
    decisions = []
    for group in by_line.values():
        newest = {i.id for i in sorted(group, key=lambda i: (i.created, i.id), reverse=True)[:keep]}
        for image in group:
            reasons = []
            if image.is_line:
                reasons.append("the line's image")
            if image.containers:
                reasons.append("used by " + ", ".join(image.containers))
            if image.id in newest:
                reasons.append(f"among the newest {keep}")
            decisions.append(Decision(image, not reasons, "; ".join(reasons) or "old build"))
    return sorted(decisions, key=lambda d: (d.image.created, d.image.id), reverse=True)


_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "pb": 10**15,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}


def parse_size(value: object) -> int | None:
    """Bytes from `system df`: podman's integer, or docker's `1.988GB`."""
    if isinstance(value, int):
        return value
    m = re.fullmatch(r"\s*([0-9.]+)\s*([A-Za-z]*)\s*", str(value))
    if m is None or m.group(2).lower() not in _UNITS:
        return None
    try:
        return int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    except ValueError:
        return None


def images_disk_usage(runtime: str, remote: process.Remote | None = None) -> int | None:
    """The runtime's own count of the bytes its images take (`system df`), None if it gives none."""
    proc = process.run([runtime, "system", "df", "--format", "{{json .}}"], remote=remote, check=False)
    if proc.returncode != 0:
        return None
    for line in proc.stdout.splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and row.get("Type") == "Images":
            return parse_size(row.get("Size"))
    return None


def remove_argv(runtime: str, image: Image) -> list[str]:
    """`rmi` of every tag (the image goes with its last one), or of the id when it has none;
    never --force (podman's would remove the containers using it)."""
    return [runtime, "rmi", *(image.tags or (image.id,))]


@dataclass(frozen=True)
class Pruned:
    node: str
    decisions: tuple[Decision, ...] = ()
    removed: tuple[Image, ...] = ()
    failed: tuple[tuple[Image, str], ...] = ()  # (image, the runtime's complaint)
    freed: int | None = None  # bytes; None: the runtime does not say (or a dry run)
    error: str | None = None

    @property
    def kept(self) -> tuple[Decision, ...]:
        return tuple(d for d in self.decisions if not d.remove)

    @property
    def ok(self) -> bool:
        return self.error is None and not self.failed


def prune_node(runtime: str, remote: process.Remote | None, keep: int, *, dry_run: bool = False) -> Pruned:
    name = node_name(remote)
    try:
        decisions = tuple(plan_prune(list_images(runtime, remote), keep))
        doomed = [d.image for d in decisions if d.remove]
        if dry_run or not doomed:
            return Pruned(name, decisions, freed=None if dry_run else 0)
        before = images_disk_usage(runtime, remote)
        removed, failed = [], []
        for image in doomed:
            proc = process.run(remove_argv(runtime, image), remote=remote, check=False)
            if proc.returncode == 0:
                removed.append(image)
            elif remote is not None and proc.returncode == 255:
                raise Tp4Error(f"cannot reach {remote.destination} over ssh:\n{proc.stderr.strip()}")
            else:
                failed.append((image, proc.stderr.strip() or f"exit code {proc.returncode}"))
        after = images_disk_usage(runtime, remote)
        freed = before - after if before is not None and after is not None else None
        return Pruned(name, decisions, tuple(removed), tuple(failed), freed)
    except Tp4Error as exc:
        return Pruned(name, error=exc.message)


def prune(runtime: str, workers: Sequence[process.Remote], keep: int, *, dry_run: bool = False) -> list[Pruned]:
    """Prune the head and every worker in parallel."""
    targets: list[process.Remote | None] = [None, *workers]
    with ThreadPoolExecutor(max_workers=len(targets)) as pool:
        return list(pool.map(lambda r: prune_node(runtime, r, keep, dry_run=dry_run), targets))


# --- the head's registry --------------------------------------------------------------------------


class Store(Protocol):
    """What this module reads of a tp4.image.imagestore.Store."""

    @property
    def root(self) -> Path: ...

    @property
    def url(self) -> str: ...


def _imagestore() -> ModuleType | None:
    """tp4.image.imagestore, imported only when the registry is used (None in a tp4 without it)."""
    import importlib

    try:
        return importlib.import_module("tp4.image.imagestore")
    except ModuleNotFoundError as exc:
        if exc.name != "tp4.image.imagestore":
            raise
        return None


@dataclass(frozen=True)
class StorePruned:
    note: str = ""  # why nothing was done ("not running"), else ""
    deleted: tuple[str, ...] = ()  # manifest digests
    kept: tuple[str, ...] = ()
    freed: int | None = None
    errors: tuple[str, ...] = field(default_factory=tuple)


def _tree_bytes(root: Path) -> int:
    total = 0
    for path in root.rglob("*"):
        try:
            if path.is_file() and not path.is_symlink():
                total += path.stat().st_size
        except OSError:
            continue
    return total


def manifest_image_id(store: Store, repo: str, digest: str) -> str | None:
    """The image id (config digest) a manifest in the store names; None for an index or on error."""
    imagestore = _imagestore()
    if imagestore is None:
        return None
    cred = imagestore.read_credential(store.root)
    with imagestore.auth_dir(cred, store.url) as auth:  # tp4's credential in an auth file, never in argv
        proc = process.run(
            [
                "skopeo",
                "inspect",
                "--raw",
                "--tls-verify=false",
                "--authfile",
                str(auth / "config.json"),
                f"docker://{store.url}/{repo}@{digest}",
            ],
            check=False,
            secrets=cred.secrets,
        )
    if proc.returncode != 0:
        return None
    try:
        manifest = json.loads(proc.stdout)
    except ValueError:
        return None
    config = _dict(_dict(manifest).get("config"))
    value = config.get("digest")
    return runtime_cli.normalize_id(value) if isinstance(value, str) else None


def store_manifests(store: Store, repo: str = STORE_REPO) -> dict[str, str | None]:
    """Manifest digest -> the image id it names (None: unreadable, or an index), for every
    manifest of ``repo`` in the store."""
    imagestore = _imagestore()
    if imagestore is None:
        return {}
    return {str(d): manifest_image_id(store, repo, str(d)) for d in imagestore.manifests(store, repo)}


def store_digests(store: Store, repo: str = STORE_REPO) -> dict[str, str]:
    """Image id -> a manifest digest of it in the store."""
    return {image_id: digest for digest, image_id in sorted(store_manifests(store, repo).items()) if image_id}


def running_store() -> tuple[Store | None, str]:
    """The head's registry if it runs, else None and why not."""
    imagestore = _imagestore()
    if imagestore is None:
        return None, "this tp4 has no image store (tp4.image.imagestore)"
    try:
        store: Store | None = imagestore.running()
    except Tp4Error as exc:
        return None, exc.message
    if store is None:
        return None, f"the head's registry is not running (state in {imagestore.default_root()})"
    return store, ""


def prune_store(
    kept_ids: set[str], *, dry_run: bool = False, repo: str = STORE_REPO, progress: Callable[[str], None] | None = None
) -> StorePruned:
    """Delete the store's manifests of images no node keeps, then garbage-collect its blobs
    (a dry run only lists them). A manifest whose image cannot be read stays."""
    store, why = running_store()
    imagestore = _imagestore()
    if store is None or imagestore is None:
        return StorePruned(note=why + "; registry clean-up skipped")
    try:
        found = store_manifests(store, repo)
    except Tp4Error as exc:
        return StorePruned(errors=(exc.message,))
    doomed = sorted(d for d, i in found.items() if i is not None and i not in kept_ids)
    kept = tuple(sorted(d for d in found if d not in doomed))
    if dry_run or not doomed:
        return StorePruned(deleted=tuple(doomed), kept=kept, freed=None if dry_run else 0)
    before = _tree_bytes(store.root / "data")
    deleted, errors = [], []
    for digest in doomed:
        try:
            imagestore.delete(store, repo, digest)
            deleted.append(digest)
        except Tp4Error as exc:
            errors.append(f"{digest[:19]}: {exc.message}")
    try:
        if progress is not None:
            progress("registry: garbage-collecting the blobs of the deleted manifests")
        imagestore.garbage_collect(store)
    except Tp4Error as exc:
        errors.append(f"garbage-collect: {exc.message}")
    return StorePruned(
        deleted=tuple(deleted), kept=kept, freed=before - _tree_bytes(store.root / "data"), errors=tuple(errors)
    )
