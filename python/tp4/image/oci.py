"""The line's image as an OCI image layout whose layers are store paths of their own.

dockerTools.streamLayeredImage writes every layer into one stream on every build, so loading a
rebuild re-reads and re-tars the whole closure (the ~33 GB base included). Here each layer is a
derivation of its own, so Nix keeps an unchanged layer between builds, and the image is a small
OCI layout (https://github.com/opencontainers/image-spec/blob/main/image-layout.md) whose blobs
are links to those layers. ``skopeo copy oci:<layout>:<ref> containers-storage:<ref>`` (or into
the head's image store) then skips every layer the destination has by its digest, without
reading it.

The steps run inside Nix builds (pkgs/oci.nix) as ``python3 -m tp4.image.oci <step>``, so this module
uses the standard library only:

``base --archive A --out D``
    a docker-archive (what dockerTools.pullImage fetches) as one blob per layer
    (``D/blobs/sha256/<diff id>``, each checked against the archive's config), its config
    (``D/config.json``), its layer list (``D/layers.json``) and what its site-packages
    directories hold once its layers are stacked (``D/site-packages.json``: each directory's
    top-level entries, and the top-level entries each ``*.dist-info``'s RECORD names).
``layer --graph G [--below G ...] --out D``
    the store paths of the closure in ``G`` (an ``exportReferencesGraph`` file), less those of
    the closures ``--below`` (the layers under it), as one tar: ``D/layer.tar``, ``D/layer.json``.
``links --link PATH=TARGET ... [--install TREE --base D] --out D``
    the top layer: a symlink at each PATH to TARGET (a store path), with its parent directories.
    ``--install TREE`` (a tree of wheels installed as a site-packages directory) installs it into
    the base's site-packages as ``pip install`` would: a symlink there for each of the tree's
    top-level entries, and a whiteout (``.wh.<name>``) for each dist-info of the base that
    pip would uninstall (the same distribution, any version) or whose files the tree replaces,
    with the top-level entries only that dist-info's RECORD names (``D`` is the base step's
    output, whose ``site-packages.json`` says what the base holds).
``image --base D --layer D ... --name N --out D``
    the OCI layout: the config (``$TP4_OCI_CONFIG``: architecture, config, and created: an ISO
    time or seconds since the epoch, the flake's commit time, so that builds sort by it; the base's
    Env stays under the image's, as streamLayeredImage keeps it), the manifest and an index
    whose one entry is named ``N:<tag>``, the tag derived from the config (so two different
    images never share a reference, and loading one never moves the line's tag).

Every tar is written the way stream_layered_image.py writes its layers: ``/nix`` and
``/nix/store`` first, then each store path and everything below it in sorted order, owner
root:root (0:0), mtime 1, hard links stored as files.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import io
import json
import os
import posixpath
import re
import sys
import tarfile
from datetime import datetime, timezone
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import IO, BinaryIO, NamedTuple, cast

MTIME = 1
CREATED = "1970-01-01T00:00:01+00:00"
STORE = "/nix/store"
LAYER_TYPE = "application/vnd.oci.image.layer.v1.tar"
CONFIG_TYPE = "application/vnd.oci.image.config.v1+json"
MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
INDEX_TYPE = "application/vnd.oci.image.index.v1+json"
REF_NAME = "org.opencontainers.image.ref.name"
CHUNK = 1 << 20


class OciError(Exception):
    """A step cannot produce its output; the message says which input is wrong."""


class Blob(NamedTuple):
    digest: str  # sha256:<hex>
    size: int


class Layout(NamedTuple):
    """What tp4 needs of a built image layout."""

    path: str
    ref: str  # name:tag, the index entry's reference
    manifest: Blob
    config: Blob  # its digest is the image id
    diff_ids: tuple[str, ...]
    labels: dict[str, str]


# --- reading ----------------------------------------------------------------------------------


def is_layout(path: str | os.PathLike[str]) -> bool:
    return os.path.isfile(os.path.join(path, "oci-layout")) and os.path.isfile(os.path.join(path, "index.json"))


def blob_path(layout: str | os.PathLike[str], digest: str) -> Path:
    algo, _, hexdigest = digest.partition(":")
    if algo != "sha256" or len(hexdigest) != 64 or not all(c in "0123456789abcdef" for c in hexdigest):
        raise OciError(f"{layout}: {digest!r} is not a sha256 digest")
    return Path(layout) / "blobs" / "sha256" / hexdigest


def _json_blob(layout: str | os.PathLike[str], digest: str) -> object:
    path = blob_path(layout, digest)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise OciError(f"{layout}: blob {digest} cannot be read ({exc.strerror})") from None
    if "sha256:" + hashlib.sha256(data).hexdigest() != digest:
        raise OciError(f"{layout}: blob {digest} does not match its digest")
    try:
        return json.loads(data)
    except ValueError as exc:
        raise OciError(f"{layout}: blob {digest} is not JSON ({exc})") from None


def _obj(value: object, what: str) -> dict[str, object]:
    if not isinstance(value, dict):
        raise OciError(f"{what} is not a JSON object")
    return {str(k): v for k, v in value.items()}


def read_layout(path: str | os.PathLike[str]) -> Layout:
    """The one image of a layout this module wrote: its reference, manifest, config and layers."""
    try:
        index = _obj(json.loads(Path(path, "index.json").read_text()), f"{path}/index.json")
    except (OSError, ValueError) as exc:
        raise OciError(f"{path}/index.json cannot be read ({exc})") from None
    entries = index.get("manifests")
    if not isinstance(entries, list) or len(entries) != 1:
        raise OciError(f"{path}/index.json must list exactly one manifest")
    entry = _obj(entries[0], f"{path}/index.json manifests[0]")
    annotations = _obj(entry.get("annotations", {}), "the index entry's annotations")
    ref = annotations.get(REF_NAME)
    digest, size = entry.get("digest"), entry.get("size")
    if not isinstance(ref, str) or not isinstance(digest, str) or not isinstance(size, int):
        raise OciError(f"{path}/index.json: the manifest entry needs digest, size and {REF_NAME}")
    manifest = _obj(_json_blob(path, digest), f"manifest {digest}")
    config_entry = _obj(manifest.get("config"), "the manifest's config")
    config_digest, config_size = config_entry.get("digest"), config_entry.get("size")
    if not isinstance(config_digest, str) or not isinstance(config_size, int):
        raise OciError(f"{path}: manifest {digest} has no config digest")
    config = _obj(_json_blob(path, config_digest), f"config {config_digest}")
    rootfs = _obj(config.get("rootfs"), "the config's rootfs")
    diff_ids = rootfs.get("diff_ids")
    if not isinstance(diff_ids, list) or not all(isinstance(d, str) for d in diff_ids):
        raise OciError(f"{path}: config {config_digest} has no rootfs.diff_ids")
    labels = _obj(_obj(config.get("config", {}), "the image config").get("Labels") or {}, "Labels")
    return Layout(
        str(path),
        ref,
        Blob(digest, size),
        Blob(config_digest, config_size),
        tuple(str(d) for d in diff_ids),
        {k: str(v) for k, v in labels.items()},
    )


# --- writing ----------------------------------------------------------------------------------


class _Hashing:
    """A write-only stream that hashes and counts what goes through it into ``out``."""

    def __init__(self, out: BinaryIO) -> None:
        self.out = out
        self.hash = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes) -> int:
        self.hash.update(data)
        self.size += len(data)
        return self.out.write(data)

    def blob(self) -> Blob:
        return Blob("sha256:" + self.hash.hexdigest(), self.size)


def _root_entry(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.mtime = MTIME
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info


def _directory(name: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE
    info.mode = 0o755
    return _root_entry(info)


def _files(path: Path) -> list[Path]:
    if path.is_symlink() or not path.is_dir():
        return [path]
    return sorted([path, *path.rglob("*")])


def write_store_tar(out: BinaryIO, paths: Iterable[str]) -> None:
    """The store paths as a tar, in the order and with the attributes streamLayeredImage uses."""
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        tar.addfile(_directory("/nix"))
        tar.addfile(_directory(STORE))
        for store_path in paths:
            for name in _files(Path(store_path)):
                info = tar.gettarinfo(str(name))
                info.name = "/" + info.name
                if info.islnk():  # a hard link is stored as the file it links
                    info.type = tarfile.REGTYPE
                    info.linkname = ""
                    info.size = name.stat().st_size
                _root_entry(info)
                if info.isfile():
                    with open(name, "rb") as f:
                        tar.addfile(info, f)
                else:
                    tar.addfile(info)


def write_links_tar(out: BinaryIO, links: Sequence[tuple[str, str]], whiteouts: Sequence[str] = ()) -> None:
    """A tar of symlinks (path -> target) and OCI whiteouts (an empty file ``.wh.<name>`` beside
    each path to hide from the layers below), each after its parent directories (mode 0755)."""
    seen: set[str] = set()
    entries: list[tuple[str, str | None]] = [(path, target) for path, target in links]
    entries += [(posixpath.join(posixpath.dirname(p), ".wh." + posixpath.basename(p)), None) for p in whiteouts]
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        for path, target in sorted(entries):
            parts = Path(path).parts[1:-1]
            for i in range(len(parts)):
                parent = "/" + "/".join(parts[: i + 1])
                if parent not in seen:
                    seen.add(parent)
                    tar.addfile(_directory(parent))
            info = tarfile.TarInfo(path)
            if target is None:
                info.mode = 0o644
            else:
                info.type = tarfile.SYMTYPE
                info.linkname = target
                info.mode = 0o777
            tar.addfile(_root_entry(info))


def read_graph(path: str | os.PathLike[str]) -> list[str]:
    """The store paths of an ``exportReferencesGraph`` file (per path: the path, its deriver
    line, the number of references, then that many references), sorted."""
    lines = Path(path).read_text().split("\n")
    paths, i = [], 0
    while i < len(lines) and lines[i]:
        if i + 2 >= len(lines) or not lines[i].startswith(STORE + "/") or not lines[i + 2].isdigit():
            raise OciError(f"{path}: line {i + 1} is not a reference graph entry")
        refs = lines[i + 3 : i + 3 + int(lines[i + 2])]
        if len(refs) != int(lines[i + 2]) or not all(r.startswith(STORE + "/") for r in refs):
            raise OciError(f"{path}: line {i + 1}: the entry's references are cut short")
        paths.append(lines[i])
        i += 3 + len(refs)
    if not paths:
        raise OciError(f"{path}: the reference graph is empty")
    return sorted(set(paths))


def _write_tar_blob(out: Path, write: Callable[[BinaryIO], None], meta: dict[str, object]) -> Blob:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "layer.tar", "wb") as f:
        hashing = _Hashing(f)
        write(cast(BinaryIO, hashing))
    blob = hashing.blob()
    (out / "layer.json").write_text(json.dumps({"digest": blob.digest, "size": blob.size, **meta}, indent=1) + "\n")
    return blob


def store_layer(graph: str, below: Sequence[str], out: Path) -> Blob:
    lower: set[str] = set()
    for g in below:
        lower |= set(read_graph(g))
    paths = [p for p in read_graph(graph) if p not in lower]
    return _write_tar_blob(out, lambda f: write_store_tar(f, paths), {"paths": paths})


def links_layer(links: Sequence[str], out: Path, installs: Sequence[str] = (), base: Path | None = None) -> Blob:
    pairs = []
    for link in links:
        path, sep, target = link.partition("=")
        if not sep or not path.startswith("/") or not target:
            raise OciError(f"--link {link!r}: expected /PATH=TARGET")
        pairs.append((os.path.normpath(path), target))
    whiteouts: list[str] = []
    if installs:
        if base is None:
            raise OciError("--install needs --base: the tree goes into the base image's site-packages")
        index = json.loads((base / SITE_INDEX).read_text())
        for tree in installs:
            more, hidden = site_install(tree, index)
            pairs += more
            whiteouts += hidden
    paths = [p for p, _ in pairs]
    if len(set(paths)) != len(paths) or set(paths) & set(whiteouts):
        raise OciError(f"links: a path is linked twice or linked and hidden at once: {sorted(paths)}, {whiteouts}")
    meta: dict[str, object] = {"links": dict(pairs)}
    if whiteouts:
        meta["whiteouts"] = sorted(whiteouts)
    return _write_tar_blob(out, lambda f: write_links_tar(f, pairs, whiteouts), meta)


# --- site-packages: what the base holds, and installing a tree of wheels into it ------------------

SITE_INDEX = "site-packages.json"
_SITE_DIR = re.compile(r"^(/(?:.+?/)?(?:site|dist)-packages)(?:/(.*))?$")
WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"


def normalize_dist(name: str) -> str:
    """A distribution's name as PyPA compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def dist_info_name(entry: str) -> str | None:
    """The distribution of a ``<name>-<version>.dist-info`` directory (normalized), or None."""
    if not entry.endswith(".dist-info"):
        return None
    return normalize_dist(entry[: -len(".dist-info")].split("-", 1)[0])


def record_tops(text: str) -> list[str]:
    """The top-level entries (of its site-packages) a RECORD names: files outside it
    (``../../bin/x``) are left out."""
    tops = set()
    for row in csv.reader(io.StringIO(text)):
        if row and row[0] and not row[0].startswith(("/", "..")):
            tops.add(row[0].split("/", 1)[0])
    return sorted(tops)


def _site_split(path: str) -> tuple[str, str] | None:
    m = _SITE_DIR.match(path)
    if not m:
        return None
    return m[1], m[2] or ""


def site_packages_index(layers: Sequence[Path]) -> dict[str, dict[str, object]]:
    """Every site-/dist-packages directory of the stacked layers (bottom to top, each a tar):
    ``{dir: {"entries": [top-level names], "records": {dist-info: [top-level names its RECORD
    names]}}}``. A layer's whiteouts and opaque markers hide what the layers below it hold
    (OCI image-spec, layer.md "Whiteouts"), never what it holds itself."""
    state: dict[str, dict[str, list[str] | None]] = {}  # dir -> entry -> RECORD tops of a dist-info
    symlinks: set[str] = set()  # every symlink of the stacked layers (a site-packages behind one is refused)

    def hide(path: str, below_only: bool) -> None:
        for sp in list(state):
            if sp == path or sp.startswith(path + "/"):
                if below_only and sp == path:
                    state[sp] = {}
                else:
                    del state[sp]
            elif path.startswith(sp + "/"):
                rel = path[len(sp) + 1 :]
                top, _, rest = rel.partition("/")
                if not rest:
                    if below_only:
                        if state[sp].get(top) is not None:
                            state[sp][top] = []
                    else:
                        state[sp].pop(top, None)
                elif rest == "RECORD" and top in state[sp]:
                    state[sp][top] = []

    for layer in layers:
        hides: list[tuple[str, bool]] = []
        adds: list[tuple[str, str, str | None]] = []
        try:
            tar = tarfile.open(layer)
        except (OSError, tarfile.TarError) as exc:
            raise OciError(f"{layer} is not a readable layer ({exc})") from None
        with tar:
            for member in tar:
                path = posixpath.normpath("/" + member.name)
                name, parent = posixpath.basename(path), posixpath.dirname(path)
                if member.issym():
                    symlinks.add(path)
                else:
                    symlinks.discard(path)
                if name == OPAQUE:
                    hides.append((parent, True))
                    continue
                if name.startswith(WHITEOUT):
                    hides.append((posixpath.join(parent, name[len(WHITEOUT) :]), False))
                    continue
                split = _site_split(path)
                if split is None:
                    continue
                sp, rel = split
                record = None
                top, _, rest = rel.partition("/")
                if rest == "RECORD" and top.endswith(".dist-info") and member.isfile():
                    f = tar.extractfile(member)
                    record = f.read().decode("utf-8", "replace") if f else ""
                adds.append((sp, rel, record))
        for path, below_only in hides:
            hide(path, below_only)
        for sp, rel, record in adds:
            entries = state.setdefault(sp, {})
            if not rel:
                continue
            top = rel.split("/", 1)[0]
            if record is not None:
                entries[top] = record_tops(record)
            elif top not in entries or entries[top] is None:
                entries[top] = [] if top.endswith(".dist-info") else None

    def behind_link(sp: str) -> list[str]:
        parts = sp.split("/")
        return [a for a in ("/".join(parts[:i]) for i in range(2, len(parts) + 1)) if a in symlinks]

    return {
        sp: {
            "entries": sorted(entries),
            "records": {e: tops for e, tops in sorted(entries.items()) if tops is not None},
            "links": behind_link(sp),
        }
        for sp, entries in sorted(state.items())
    }


def site_install(tree: str, index: dict[str, dict[str, object]]) -> tuple[list[tuple[str, str]], list[str]]:
    """Where ``tree`` (a site-packages directory of installed wheels) goes in the base, as pip
    would install it there: (links, whiteouts). The directory is the one site-packages of the
    base that already holds a distribution of the tree (pip would upgrade it there), else the one
    that holds torch (the engine's); anything else is an error naming what was found."""
    try:
        own = sorted(e for e in os.listdir(tree) if e != "__pycache__")
    except OSError as exc:
        raise OciError(f"--install {tree}: {exc.strerror}") from None
    dists = {d for d in map(dist_info_name, own) if d}
    if not dists:
        raise OciError(f"--install {tree}: no *.dist-info in it, so it holds no installed wheel")

    def dist_infos(sp: str) -> dict[str, list[str]]:
        return {str(k): [str(t) for t in v] for k, v in dict(index[sp]["records"]).items()}  # type: ignore[call-overload]

    holding = [sp for sp in index if {dist_info_name(e) for e in dist_infos(sp)} & dists]
    torch = [sp for sp in index if "torch" in list(index[sp]["entries"])]  # type: ignore[call-overload]
    candidates = holding or torch
    if len(candidates) != 1:
        found = ", ".join(sorted(index)) or "none"
        raise OciError(
            f"--install {tree}: cannot tell which site-packages of the base image to install "
            f"{', '.join(sorted(dists))} into: {len(holding)} hold one of them, {len(torch)} hold torch "
            f"(its site-packages directories: {found})"
        )
    sp = candidates[0]
    if index[sp].get("links"):
        raise OciError(
            f"--install {tree}: the base's site-packages {sp} is reached through a symlink "
            f"({index[sp]['links']}): the links layer would put a directory in place of that link and hide "
            "all it points to, so tp4.image.oci cannot install into this base as it stands"
        )
    entries = set(index[sp]["entries"])  # type: ignore[call-overload]
    infos = dist_infos(sp)
    replaced = set(own)
    # pip uninstalls the installed versions of the same distributions; a dist-info whose files
    # the tree replaces describes files that are gone: both are hidden, with what they own alone
    gone = {
        e for e, tops in infos.items() if e not in replaced and (dist_info_name(e) in dists or set(tops) & replaced)
    }
    kept = {e: tops for e, tops in infos.items() if e not in gone}
    claimed = {t for tops in kept.values() for t in tops}
    hidden = set(gone)
    for e in gone:
        hidden |= {t for t in infos[e] if t in entries and t not in replaced and t not in claimed and t != e}
    links = [(posixpath.join(sp, e), posixpath.join(tree, e)) for e in own]
    return links, [posixpath.join(sp, e) for e in sorted(hidden)]


def base_layers(archive: str, out: Path) -> list[Blob]:
    """A docker-archive's layers as blobs named by their digest, each checked against the
    archive's config (its diff ids), and the config itself."""
    blobs_dir = out / "blobs" / "sha256"
    blobs_dir.mkdir(parents=True, exist_ok=True)
    try:
        tar = tarfile.open(archive)
    except (OSError, tarfile.TarError) as exc:
        raise OciError(f"{archive} is not a readable docker-archive ({exc})") from None
    with tar:

        def member(name: str) -> IO[bytes]:
            try:
                f = tar.extractfile(name)
            except KeyError:
                f = None
            if f is None:
                raise OciError(f"{archive}: {name} is missing from the archive")
            return f

        with member("manifest.json") as f:
            items = json.load(f)
        if not isinstance(items, list) or len(items) != 1:
            raise OciError(f"{archive}: manifest.json must describe exactly one image")
        item = _obj(items[0], f"{archive}: manifest.json[0]")
        config_name, layer_names = item.get("Config"), item.get("Layers")
        if not isinstance(config_name, str) or not isinstance(layer_names, list):
            raise OciError(f"{archive}: manifest.json has no Config and Layers")
        with member(config_name) as f:
            config_bytes = f.read()
        config = _obj(json.loads(config_bytes), f"{archive}: {config_name}")
        diff_ids = _obj(config.get("rootfs"), "rootfs").get("diff_ids")
        if not isinstance(diff_ids, list) or len(diff_ids) != len(layer_names):
            count = len(diff_ids) if isinstance(diff_ids, list) else 0
            raise OciError(f"{archive}: its config lists {count} layers, its manifest {len(layer_names)}")
        blobs = []
        for name, diff_id in zip(layer_names, diff_ids, strict=True):
            tmp = blobs_dir / ".partial"
            with member(str(name)) as src, open(tmp, "wb") as dst:
                hashing = _Hashing(dst)
                while chunk := src.read(CHUNK):
                    hashing.write(chunk)
            blob = hashing.blob()
            if blob.digest != diff_id:
                raise OciError(
                    f"{archive}: layer {name} has digest {blob.digest}, its config says {diff_id} "
                    "(a compressed or corrupt layer)"
                )
            tmp.replace(blobs_dir / blob.digest.removeprefix("sha256:"))
            blobs.append(blob)
    (out / "config.json").write_bytes(config_bytes)
    (out / "layers.json").write_text(json.dumps([b._asdict() for b in blobs], indent=1) + "\n")
    index = site_packages_index([blobs_dir / b.digest.removeprefix("sha256:") for b in blobs])
    (out / SITE_INDEX).write_text(json.dumps(index, indent=1, sort_keys=True) + "\n")
    return blobs


def overlay_env(base: Sequence[str], own: Sequence[str]) -> list[str]:
    """The base image's Env, then the image's own; a later KEY=... replaces an earlier one in
    place (streamLayeredImage's overlay_base_config)."""
    resolved: dict[str, str] = {}
    for entry in [*base, *own]:
        resolved[entry.split("=", 1)[0]] = entry
    return list(resolved.values())


def _created(value: object) -> str:
    """An ISO 8601 time: as given, or from seconds since the epoch (a flake's lastModified)."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise OciError(f"created: {value!r} is neither seconds since the epoch nor an ISO 8601 time")
    if isinstance(value, int):
        return datetime.fromtimestamp(value, tz=timezone.utc).isoformat()
    return value


def _canonical(value: object) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def _put(blobs_dir: Path, data: bytes) -> Blob:
    blob = Blob("sha256:" + hashlib.sha256(data).hexdigest(), len(data))
    (blobs_dir / blob.digest.removeprefix("sha256:")).write_bytes(data)
    return blob


def image_layout(base: Path | None, layers: Sequence[Path], spec: dict[str, object], name: str, out: Path) -> Layout:
    """Assemble the layout: base layers, then ``layers`` (each a directory with layer.tar and
    layer.json), the config from ``spec`` and the base's, one manifest, an index naming it."""
    blobs_dir = out / "blobs" / "sha256"
    blobs_dir.mkdir(parents=True, exist_ok=True)
    entries: list[tuple[Blob, Path, str]] = []  # blob, file it is, what it is (history)
    base_env: list[str] = []
    if base is not None:
        base_config = _obj(json.loads((base / "config.json").read_bytes()), f"{base}/config.json")
        env_list = _obj(base_config.get("config") or {}, "the base's config").get("Env") or []
        base_env = [str(e) for e in env_list] if isinstance(env_list, list) else []
        items = json.loads((base / "layers.json").read_text())
        for item in items if isinstance(items, list) else []:
            blob = Blob(str(item["digest"]), int(item["size"]))
            entries.append((blob, base / "blobs" / "sha256" / blob.digest.removeprefix("sha256:"), "base image layer"))
    for layer in layers:
        meta = _obj(json.loads((layer / "layer.json").read_text()), f"{layer}/layer.json")
        blob = Blob(str(meta["digest"]), int(str(meta["size"])))
        what = f"store paths: {meta['paths']}" if "paths" in meta else f"links: {meta.get('links')}"
        if meta.get("whiteouts"):
            what += f", whiteouts: {meta['whiteouts']}"
        entries.append((blob, layer / "layer.tar", what))
    for blob, file, _ in entries:
        target = blobs_dir / blob.digest.removeprefix("sha256:")
        if not target.exists():
            os.symlink(os.path.abspath(file), target)
    config = dict(_obj(spec.get("config", {}), "TP4_OCI_CONFIG config"))
    own_env = config.get("Env") or []
    env = overlay_env(base_env, [str(e) for e in own_env] if isinstance(own_env, list) else [])
    if env:
        config["Env"] = env
    created = _created(spec.get("created", CREATED))
    image = {
        "created": created,
        "architecture": spec["architecture"],
        "os": "linux",
        "config": config,
        "rootfs": {"type": "layers", "diff_ids": [b.digest for b, _, _ in entries]},
        "history": [{"created": created, "comment": what} for _, _, what in entries],
    }
    config_blob = _put(blobs_dir, _canonical(image))
    manifest = {
        "schemaVersion": 2,
        "mediaType": MANIFEST_TYPE,
        "config": {"mediaType": CONFIG_TYPE, **config_blob._asdict()},
        "layers": [{"mediaType": LAYER_TYPE, **b._asdict()} for b, _, _ in entries],
    }
    manifest_blob = _put(blobs_dir, _canonical(manifest))
    ref = f"{name}:{config_blob.digest.removeprefix('sha256:')[:32]}"
    index = {
        "schemaVersion": 2,
        "mediaType": INDEX_TYPE,
        "manifests": [{"mediaType": MANIFEST_TYPE, **manifest_blob._asdict(), "annotations": {REF_NAME: ref}}],
    }
    (out / "oci-layout").write_text('{"imageLayoutVersion":"1.0.0"}')
    (out / "index.json").write_bytes(_canonical(index))
    return read_layout(out)


# --- the steps (python3 -m tp4.image.oci) -------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python3 -m tp4.image.oci", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="step", required=True)
    s = sub.add_parser("base", help="a docker-archive as one blob per layer")
    s.add_argument("--archive", required=True)
    s.add_argument("--out", required=True, type=Path)
    s = sub.add_parser("layer", help="store paths of a closure as one layer")
    s.add_argument("--graph", required=True)
    s.add_argument("--below", action="append", default=[])
    s.add_argument("--out", required=True, type=Path)
    s = sub.add_parser("links", help="the top layer of symlinks")
    s.add_argument("--link", action="append", default=[])
    s.add_argument("--install", action="append", default=[])
    s.add_argument("--base", type=Path)
    s.add_argument("--out", required=True, type=Path)
    s = sub.add_parser("image", help="the OCI layout")
    s.add_argument("--base", type=Path)
    s.add_argument("--layer", action="append", default=[], type=Path)
    s.add_argument("--name", required=True)
    s.add_argument("--out", required=True, type=Path)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.step == "base":
            blobs = base_layers(args.archive, args.out)
            print(f"base: {len(blobs)} layers, {sum(b.size for b in blobs)} bytes", file=sys.stderr)
        elif args.step == "layer":
            blob = store_layer(args.graph, args.below, args.out)
            print(f"layer {blob.digest}: {blob.size} bytes", file=sys.stderr)
        elif args.step == "links":
            if not args.link and not args.install:
                raise OciError("links: give at least one --link or --install")
            blob = links_layer(args.link, args.out, args.install, args.base)
            print(f"links layer {blob.digest}", file=sys.stderr)
        else:
            spec = _obj(json.loads(os.environ["TP4_OCI_CONFIG"]), "TP4_OCI_CONFIG")
            layout = image_layout(args.base, args.layer, spec, args.name, args.out)
            print(f"image {layout.ref}: config {layout.config.digest}, {len(layout.diff_ids)} layers", file=sys.stderr)
    except (OciError, OSError, ValueError, KeyError) as exc:
        print(f"tp4.image.oci {args.step}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
