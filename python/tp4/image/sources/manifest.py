"""``sources.manifest``: the pins (rows) and what they become (trees). Pure parsing and validation.

This is the one parser of the manifest. Nix does not read the grammar: ``pkgs/sources.nix`` reads
``sources.manifest.json``, the parse as JSON (:meth:`Manifest.to_json`), which
:mod:`tp4.image.sources.companion` writes beside the manifest (``tp4 sources json``; ``tp4 sources lock``
rewrites both) and Nix refuses while it is not the parse of the manifest's current bytes.

Format:

* Lines are split on ``\\n``; tokens are separated by spaces, tabs or ``\\r``.
* A line whose first non-blank character is ``#`` is a comment; blank lines are ignored.
* A line starting with a space or a tab continues the entry above it (comments and blank lines
  in between are skipped); any other line starts an entry.
* A row is ``component commit sha256 url [key=value ...]`` (upstream's four columns; an upstream
  row, including ``local  path  sha256  -``, reads as-is). ``sha256`` is the sha256 of the
  downloaded file as 64 hex digits, or the word ``unlocked`` when it is not known yet.
* A tree is ``tree NAME key=value ...``: what the image contains, built from rows by the
  transforms (see :mod:`tp4.image.sources.transforms`).
* ``key`` is ``[a-z][a-z0-9-]*``; a value has no blanks; lists are comma-separated.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, TypedDict

from tp4.core.errors import InvalidInput, Tp4Error

UNLOCKED = "unlocked"
MANIFEST_NAME = "sources.manifest"

_BLANK = re.compile(r"[ \t\r]+")
_ATTR = re.compile(r"([a-z][a-z0-9-]*)=(.+)")
_HEX40 = re.compile(r"[0-9a-f]{40}")
_HEX64 = re.compile(r"[0-9a-f]{64}")
_REF = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/+-]*")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+/-]*")
_VERSION = re.compile(r"[0-9][0-9A-Za-z.+!_-]*")
_WHEEL = re.compile(
    r"(?P<pname>[A-Za-z0-9_.]+)-(?P<version>[^-]+)-(?P<python>[^-]+)-(?P<abi>[^-]+)-(?P<platform>[^-]+)\.whl"
)
_IMAGE = re.compile(r"docker://(?P<name>[a-z0-9._/-]+)(?::(?P<tag>[A-Za-z0-9._-]+))?@(?P<digest>sha256:[0-9a-f]{64})")
ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar.xz", ".tar.bz2", ".tar")
PATCH_SUFFIXES = (".patch", ".diff")

KINDS = ("archive", "file", "patch", "wheel", "image", "git", "local")
_ROW_ATTRS: dict[str, frozenset[str]] = {
    "archive": frozenset({"kind", "strip", "tree-sha256"}),
    "file": frozenset({"kind", "eol", "mode", "root"}),
    "patch": frozenset({"kind", "p", "fuzz", "dir"}),
    "wheel": frozenset(),
    "image": frozenset({"arch", "glibc", "python", "gcc", "verbs", "packages"}),
    "git": frozenset(),
    "local": frozenset(),
}
# size=: how much `tp4 sources lock` / the fetch downloads (informational, e.g. ~33GB), any kind
ROW_ATTRS: dict[str, frozenset[str]] = {kind: attrs | {"size"} for kind, attrs in _ROW_ATTRS.items()}
_SIZE = re.compile(r"~?[0-9]+(\.[0-9]+)?(kB|MB|GB)")
TREE_ATTRS = frozenset({"from", "keep", "require", "add", "rename", "patches", "run", "drop", "stamp", "expect-patch"})
INT_ATTRS = frozenset({"strip", "p", "fuzz"})
MAX_INT_ATTR_DIGITS = 3  # strip=, p= and fuzz= are small counts
DEFAULT_ARCH = "arm64"


class WheelJson(TypedDict):
    """A wheel file name's fields (what nixpkgs' fetchPypi takes)."""

    pname: str
    version: str
    python: str
    abi: str
    platform: str


class ImageJson(TypedDict):
    name: str
    tag: str
    digest: str
    arch: str


class GitJson(TypedDict):
    url: str
    rev: str


class RowJson(TypedDict):
    """A row in :meth:`Manifest.to_json` (and in ``pkgs/sources.nix``'s ``rows``). ``wheel``,
    ``image`` and ``git`` are set on rows of that kind whose URL has the form (else null:
    validation says why)."""

    component: str
    commit: str
    sha256: str
    url: str
    attrs: dict[str, str]
    name: str
    kind: str
    locked: bool
    line: int
    file_name: str
    wheel: WheelJson | None
    image: ImageJson | None
    git: GitJson | None


class TreeJson(TypedDict):
    """A tree in :meth:`Manifest.to_json` (and in ``pkgs/sources.nix``'s ``trees``)."""

    name: str
    attrs: dict[str, str]
    line: int
    inputs: list[str]


class ManifestJson(TypedDict):
    rows: list[RowJson]
    trees: list[TreeJson]


@dataclass(frozen=True)
class _Entry:
    """What rows and trees share: extension attributes (read-only) and where they were written."""

    attrs: Mapping[str, str] = field(default_factory=dict, kw_only=True)
    line: int = field(default=0, compare=False, kw_only=True)
    end_line: int = field(default=0, compare=False, kw_only=True)

    def __post_init__(self) -> None:
        object.__setattr__(self, "attrs", MappingProxyType(dict(self.attrs)))


@dataclass(frozen=True)
class Row(_Entry):
    """One pin: upstream's four columns plus extension attributes."""

    component: str
    commit: str
    sha256: str
    url: str

    @property
    def name(self) -> str:
        """Unique key: the component, or ``local:<path>`` for upstream's ``local`` rows."""
        return f"local:{self.commit}" if self.component == "local" else self.component

    @property
    def kind(self) -> str:
        return row_kind(self.component, self.url, self.attrs)

    @property
    def locked(self) -> bool:
        return self.sha256 != UNLOCKED

    @property
    def file_name(self) -> str:
        """The name of the downloaded file (last URL path segment; the wheel's file name)."""
        if self.kind == "wheel":
            return self.url.split(":", 1)[1]
        return self.url.rstrip("/").rsplit("/", 1)[-1].split("?", 1)[0]

    @property
    def tree_sha256(self) -> str | None:
        """``tree-sha256=`` of an archive row: the NAR hash (hex) of the unpacked tree, its one
        top-level directory as the root (what nixpkgs' fetchzip with stripRoot checks, and
        builtins.fetchTarball); the row is then fetched by its tree, whatever the archive's bytes."""
        return self.attrs.get("tree-sha256")

    def int_attr(self, key: str, default: int) -> int:
        return int(self.attrs.get(key, default))

    def wheel(self) -> dict[str, str]:
        """pname/version/python/abi/platform of a wheel row (what nixpkgs' fetchPypi takes)."""
        m = _WHEEL.fullmatch(self.file_name)
        if not m:
            raise InvalidInput(f"{self.where}: {self.file_name!r} is not a wheel file name")
        return m.groupdict()

    @property
    def arch(self) -> str:
        """``arch=`` of an image row: the platform pulled (skopeo's --override-arch)."""
        return self.attrs.get("arch", DEFAULT_ARCH)

    @property
    def git_remote(self) -> str:
        """A git row's repository: its URL without ``git+`` and ``@<commit>``."""
        return git_remote(self.url)

    def image(self) -> dict[str, str]:
        m = _IMAGE.fullmatch(self.url)
        if not m:
            raise InvalidInput(f"{self.where}: {self.url!r} is not docker://NAME[:TAG]@sha256:DIGEST")
        return {"name": m["name"], "tag": m["tag"] or "latest", "digest": m["digest"]}

    @property
    def where(self) -> str:
        return f"row {self.name!r}" + (f" (line {self.line})" if self.line else "")

    def require_locked(self) -> None:
        if not self.locked:
            raise Tp4Error(unlocked_message(self.name, self.line))

    def render(self) -> str:
        head = f"{self.component}  {self.commit}  {self.sha256}  {self.url}"
        if not self.attrs:
            return head
        return head + "\n    " + " ".join(f"{k}={v}" for k, v in self.attrs.items())


def git_remote(url: str) -> str:
    """``git+https://host/repo@ref`` -> ``https://host/repo`` (pip style)."""
    return url.removeprefix("git+").rsplit("@", 1)[0]


def unlocked_message(name: str, line: int = 0) -> str:
    where = f" (line {line})" if line else ""
    return (
        f"source row {name!r}{where} is not locked: its sha256 is not known yet; "
        f"run `tp4 sources lock {name}` on a machine with network access and commit the manifest"
    )


def row_kind(component: str, url: str, attrs: Mapping[str, str]) -> str:
    if component == "local":
        return "local"
    if url.startswith("pypi:"):
        return "wheel"
    if url.startswith("docker://"):
        return "image"
    if url.startswith("git+"):
        return "git"
    if "kind" in attrs:
        return attrs["kind"]
    path = url.split("?", 1)[0]
    if path.endswith(ARCHIVE_SUFFIXES):
        return "archive"
    if path.endswith(PATCH_SUFFIXES):
        return "patch"
    return "file"


def split_list(value: str | None) -> list[str]:
    return [v for v in (value or "").split(",") if v]


@dataclass(frozen=True)
class Tree(_Entry):
    """``tree NAME ...``: a transformed tree, exactly as the image will contain it."""

    name: str

    @property
    def source(self) -> str:
        return self.attrs.get("from", "")

    @property
    def patches(self) -> list[str]:
        return split_list(self.attrs.get("patches"))

    @property
    def runs(self) -> list[str]:
        """Pinned Python scripts run in the tree after the patches (upstream's roce_tp4_adapt.py)."""
        return split_list(self.attrs.get("run"))

    def additions(self) -> list[tuple[str, str]]:
        """(source, destination) pairs of ``add=``; a source ending in ``/*`` names a row group."""
        pairs = []
        for item in split_list(self.attrs.get("add")):
            src, _, dest = item.partition(":")
            pairs.append((src, dest))
        return pairs

    def render(self) -> str:
        return f"tree {self.name}" + "".join(f"\n    {k}={v}" for k, v in self.attrs.items())


@dataclass(frozen=True)
class Manifest:
    rows: tuple[Row, ...]
    trees: tuple[Tree, ...] = ()
    path: Path | None = field(default=None, compare=False)
    text: str = field(default="", compare=False)

    @property
    def by_name(self) -> dict[str, Row]:
        return {row.name: row for row in self.rows}

    @property
    def tree_by_name(self) -> dict[str, Tree]:
        return {tree.name: tree for tree in self.trees}

    @property
    def label(self) -> str:
        return str(self.path) if self.path else "manifest"

    def row(self, name: str) -> Row:
        try:
            return self.by_name[name]
        except KeyError:
            raise InvalidInput(f"{self.label}: no row named {name!r}{_suggest(name, self.by_name)}") from None

    def group(self, prefix: str) -> list[Row]:
        """Rows whose component starts with ``prefix`` (``roce-ring/`` for ``roce-ring/*``)."""
        return [row for row in self.rows if row.component.startswith(prefix)]

    def expand(self, source: str) -> list[tuple[Row, str]]:
        """Rows named by an ``add=`` source, each with its name inside the group."""
        if source.endswith("/*"):
            prefix = source[:-1]
            return [(row, row.component[len(prefix) :]) for row in self.group(prefix)]
        row = self.row(source)
        return [(row, row.file_name)]

    def inputs(self, name: str) -> list[Row]:
        """Every row whose bytes ``fetch name`` needs, in manifest order."""
        tree = self.tree_by_name.get(name)
        if tree is None:
            return [self.row(name)]
        wanted = {tree.source, *tree.patches, *tree.runs}
        for source, _ in tree.additions():
            if source.endswith("/*"):
                wanted.update(row.name for row in self.group(source[:-1]))
            else:
                wanted.add(source)
        return [row for row in self.rows if row.name in wanted]

    def to_json(self) -> ManifestJson:
        """The parse as plain data: what ``sources.manifest.json`` holds and ``pkgs/sources.nix``
        yields as ``rows`` and ``trees``."""
        return {
            "rows": [
                {
                    "component": r.component,
                    "commit": r.commit,
                    "sha256": r.sha256,
                    "url": r.url,
                    "attrs": dict(r.attrs),
                    "name": r.name,
                    "kind": r.kind,
                    "locked": r.locked,
                    "line": r.line,
                    "file_name": r.file_name,
                    "wheel": _or_none(r.wheel) if r.kind == "wheel" else None,
                    "image": _image_json(r) if r.kind == "image" else None,
                    "git": {"url": r.git_remote, "rev": r.commit} if r.kind == "git" else None,
                }
                for r in self.rows
            ],
            "trees": [
                {
                    "name": t.name,
                    "attrs": dict(t.attrs),
                    "line": t.line,
                    "inputs": [r.name for r in self.inputs(t.name)],
                }
                for t in self.trees
            ],
        }

    def render(self) -> str:
        """Canonical text: rows, then trees (comments are not kept; see :func:`replace_rows`)."""
        parts = [r.render() for r in self.rows] + [t.render() for t in self.trees]
        return "\n".join(parts) + ("\n" if parts else "")


def _or_none(parse: Callable[[], dict[str, str]]) -> Any:
    try:
        return parse()
    except InvalidInput:
        return None


def _image_json(row: Row) -> ImageJson | None:
    image = _or_none(row.image)
    if image is None:
        return None
    return {"name": image["name"], "tag": image["tag"], "digest": image["digest"], "arch": row.arch}


def _suggest(name: str, names: Mapping[str, object]) -> str:
    import difflib

    close = difflib.get_close_matches(name, list(names), n=3)
    return f" (did you mean {', '.join(close)}?)" if close else ""


@dataclass
class _Logical:
    tokens: list[str]
    line: int
    end_line: int


def _entries(text: str) -> Iterator[_Logical]:
    current: _Logical | None = None
    for number, raw in enumerate(text.split("\n"), start=1):
        tokens = [t for t in _BLANK.split(raw) if t]
        if not tokens or tokens[0].startswith("#"):
            continue
        if raw[0] in " \t":
            if current is None:
                raise InvalidInput(f"line {number}: a continuation line (starting with a blank) with no entry above it")
            current.tokens += tokens
            current.end_line = number
            continue
        if current is not None:
            yield current
        current = _Logical(tokens, number, number)
    if current is not None:
        yield current


def _attrs(tokens: list[str], line: int) -> dict[str, str]:
    attrs: dict[str, str] = {}
    for token in tokens:
        m = _ATTR.fullmatch(token)
        if not m:
            raise InvalidInput(f"line {line}: {token!r} is not key=value (an extension attribute)")
        if m[1] in attrs:
            raise InvalidInput(f"line {line}: attribute {m[1]!r} given twice")
        attrs[m[1]] = m[2]
    return attrs


# Characters no field may hold: control characters (C0, DEL, C1) and every other kind of blank or
# invisible separator. Only space, tab and CR separate tokens; anything else stayed inside a token,
# where a URL ending in "\v" read as a file instead of an archive, or a name looked like another.
_UNSEEN = re.compile(r"[\x00-\x1f\x7f-\xa0\u1680\u180e\u2000-\u200f\u2028-\u202f\u205f-\u2064\u3000\ufeff]")


def _check_tokens(entry: _Logical) -> None:
    for token in entry.tokens:
        m = _UNSEEN.search(token)
        if m:
            shown = token if len(token) <= 80 else token[:77] + "..."
            raise InvalidInput(
                f"line {entry.line}: {shown!r} holds the control or blank character {m[0]!r} (U+{ord(m[0]):04X}); "
                "fix: remove it (a field is printable text without blanks)"
            )


def parse(text: str, path: Path | None = None) -> Manifest:
    """Parse manifest text. Raises InvalidInput on syntax errors (not on semantic ones: see validate)."""
    rows: list[Row] = []
    trees: list[Tree] = []
    label = f"{path}: " if path else ""
    try:
        for entry in _entries(text):
            _check_tokens(entry)
            t = entry.tokens
            if t[0] == "tree":
                if len(t) < 2:
                    raise InvalidInput(f"line {entry.line}: `tree` needs a name")
                trees.append(Tree(t[1], attrs=_attrs(t[2:], entry.line), line=entry.line, end_line=entry.end_line))
                continue
            if len(t) < 4:
                raise InvalidInput(
                    f"line {entry.line}: a row needs four columns `component commit sha256 url`, got {len(t)}"
                )
            rows.append(
                Row(t[0], t[1], t[2], t[3], attrs=_attrs(t[4:], entry.line), line=entry.line, end_line=entry.end_line)
            )
    except InvalidInput as exc:
        raise InvalidInput(label + exc.message) from None
    return Manifest(tuple(rows), tuple(trees), path, text)


def load(path: str | Path) -> Manifest:
    """Only a regular file, of a bounded size (a device or a FIFO is refused, not read)."""
    from tp4.core.userfiles import read_input

    return parse(read_input(path, "manifest", "pass --manifest FILE"), Path(path))


# The manifest ships inside the package (the repository's sources.manifest links here), so an
# installed tp4 (a wheel, `nix run`) has the pins it was built with.
PACKAGED = Path(__file__).resolve().parents[2] / "data" / MANIFEST_NAME


def default_path() -> Path:
    """The tp4 repository's ``sources.manifest``: in the working directory or its nearest parent
    holding a flake.nix beside it (a checkout being edited), else the one shipped in the package."""
    here = Path.cwd()
    for d in (here, *here.parents):
        if (d / MANIFEST_NAME).is_file() and (d / "flake.nix").is_file():
            return d / MANIFEST_NAME
    return PACKAGED


def chosen_path(value: str | None) -> Path:
    """The manifest a command reads: ``--manifest``, else $TP4_SOURCES_MANIFEST, else :func:`default_path`."""
    import os

    if value is not None:
        return Path(value) if value else _empty()
    env = os.environ.get("TP4_SOURCES_MANIFEST")
    if env:
        return Path(env)
    default = default_path()
    return default if default.exists() else Path(MANIFEST_NAME)


def _empty() -> Path:
    raise InvalidInput("--manifest: the path is empty; fix: pass --manifest FILE, or leave it out for the repository's")


def replace_rows(manifest: Manifest, new: Mapping[str, Row]) -> str:
    """The manifest text with the rows named in ``new`` rewritten and everything else verbatim."""
    lines = manifest.text.split("\n")
    for row in sorted((r for r in manifest.rows if r.name in new), key=lambda r: -r.line):
        lines[row.line - 1 : row.end_line] = new[row.name].render().split("\n")
    return "\n".join(lines)


# --- validation ---------------------------------------------------------------------------------


@dataclass
class Report:
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def _rel_path_ok(path: str) -> bool:
    parts = path.strip("/").split("/")
    return bool(path) and not path.startswith("/") and all(p not in ("", ".", "..") for p in parts)


def _check_commit_url(row: Row, problems: list[str]) -> None:
    kind, where = row.kind, row.where
    if kind == "local":
        if row.url != "-" or not _rel_path_ok(row.commit):
            problems.append(f"{where}: a local row is `local  <relative path>  <sha256>  -`")
        return
    if kind == "wheel":
        m = _WHEEL.fullmatch(row.file_name)
        if not m:
            problems.append(f"{where}: {row.url!r} must be pypi:<name>-<version>-<python>-<abi>-<platform>.whl")
        elif m["version"] != row.commit or not _VERSION.fullmatch(row.commit):
            problems.append(
                f"{where}: the version column {row.commit!r} must equal the wheel's version {m['version']!r}"
            )
        return
    if kind == "image":
        m = _IMAGE.fullmatch(row.url)
        if not m:
            problems.append(f"{where}: {row.url!r} must be docker://NAME[:TAG]@sha256:<64 hex>")
        elif m["digest"] != row.commit:
            problems.append(f"{where}: the digest column {row.commit!r} must equal the URL's digest {m['digest']!r}")
        return
    if _HEX40.fullmatch(row.commit):
        pass
    elif not row.locked and _REF.fullmatch(row.commit):
        pass  # a branch or tag that `tp4 sources lock` resolves to a commit
    else:
        problems.append(f"{where}: commit {row.commit!r} is not 40 lowercase hex digits")
    if kind == "git":
        if not re.match(r"git\+(https|ssh|file)://", row.url) or not row.url.endswith("@" + row.commit):
            problems.append(f"{where}: a git row's URL is git+https://...@<commit> (pip style) and names its commit")
        return
    if not row.url.startswith("https://"):
        problems.append(f"{where}: URL {row.url!r} must start with https://")
    if row.commit not in row.url:
        problems.append(f"{where}: URL does not name the commit {row.commit}")


def _check_attrs(row: Row, problems: list[str]) -> None:
    kind = row.kind
    if kind not in KINDS:
        problems.append(f"{row.where}: kind={kind!r} is not one of {', '.join(KINDS)}")
        return
    allowed = ROW_ATTRS[kind]
    for key, value in row.attrs.items():
        if key not in allowed:
            hint = f" (allowed for {kind} rows: {', '.join(sorted(allowed))})" if allowed else ""
            problems.append(f"{row.where}: unknown attribute {key!r}{hint}")
        elif key in INT_ATTRS and not value.isdigit():
            problems.append(f"{row.where}: {key}={value!r} is not a non-negative integer")
        elif key in INT_ATTRS and len(value) > MAX_INT_ATTR_DIGITS:  # int() of 4,300+ digits raises
            problems.append(
                f"{row.where}: {key}={value[:12]}... has {len(value)} digits; {key} counts path components "
                f"or lines, at most {'9' * MAX_INT_ATTR_DIGITS}; fix: write the small number meant (strip=1)"
            )
    if "size" in row.attrs and not _SIZE.fullmatch(row.attrs["size"]):
        problems.append(f"{row.where}: size={row.attrs['size']!r} is a size such as ~33GB, 120MB or 8kB")
    if "tree-sha256" in row.attrs:
        if not _HEX64.fullmatch(row.attrs["tree-sha256"]):
            problems.append(
                f"{row.where}: tree-sha256= is 64 lowercase hex digits (`tp4 sources lock --tree {row.name}`)"
            )
        if row.attrs.get("strip") != "1":
            problems.append(
                f"{row.where}: tree-sha256= hashes the archive's one top directory, so the row needs strip=1"
            )
    if row.attrs.get("eol", "lf") != "lf":
        problems.append(f"{row.where}: eol= only takes lf (CRLF to LF)")
    if row.attrs.get("mode", "644") not in ("644", "755"):
        problems.append(f"{row.where}: mode= is 644 or 755")
    if "dir" in row.attrs and not (row.attrs["dir"] == "." or _rel_path_ok(row.attrs["dir"])):
        problems.append(f"{row.where}: dir={row.attrs['dir']!r} is not a relative path inside the tree")
    if "root" in row.attrs and not re.fullmatch(r"(/[A-Za-z0-9._-]+)+", row.attrs["root"]):
        problems.append(
            f"{row.where}: root={row.attrs['root']!r} is not an absolute path (letters, digits, '.', '_', "
            "'-' between slashes): the tree root the script assumes, e.g. /sgl-workspace/sglang"
        )
    # what `tp4 build` reads from the image before building on it (tp4/image/baseimage.py)
    if kind == "image" and "python" in row.attrs and not re.fullmatch(r"[0-9]+\.[0-9]+", row.attrs["python"]):
        problems.append(f"{row.where}: python= is MAJOR.MINOR, the image's python3 (e.g. 3.12)")
    if kind == "image" and "gcc" in row.attrs and not re.fullmatch(r"[0-9]+(\.[0-9]+){0,2}", row.attrs["gcc"]):
        problems.append(f"{row.where}: gcc= is the image's gcc version or its leading part (e.g. 13 or 13.3)")
    if kind == "image" and row.attrs.get("verbs", "yes") not in ("yes", "no"):
        problems.append(f"{row.where}: verbs= is yes (the image has verbs.h and libibverbs.so) or no")
    if (
        kind == "image"
        and "packages" in row.attrs
        and not all(
            re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*(==[A-Za-z0-9.+!_-]+)?", item)
            for item in row.attrs["packages"].split(",")
        )
    ):
        problems.append(f"{row.where}: packages= is a comma-separated list of NAME or NAME==VERSION (pip's names)")
    if kind == "image" and not re.fullmatch(r"[0-9]+\.[0-9]+", row.attrs.get("glibc", "")):
        problems.append(
            f"{row.where}: an image row needs glibc=MAJOR.MINOR, the glibc of the image (what "
            f"`ldd --version` prints in it; tp4-runtime's library is checked against it)"
        )


def _check_tree(tree: Tree, m: Manifest, problems: list[str]) -> None:
    where = f"tree {tree.name!r}" + (f" (line {tree.line})" if tree.line else "")
    for key in tree.attrs:
        if key not in TREE_ATTRS:
            problems.append(f"{where}: unknown attribute {key!r} (allowed: {', '.join(sorted(TREE_ATTRS))})")
    rows = m.by_name
    src = rows.get(tree.source)
    if src is None:
        problems.append(f"{where}: from={tree.source!r} names no row")
    elif src.kind not in ("archive", "file", "git"):
        problems.append(
            f"{where}: from={tree.source!r} is a {src.kind} row; a tree starts from an archive, file or git row"
        )
    for key in ("keep", "require", "drop"):
        for p in split_list(tree.attrs.get(key)):
            if not _rel_path_ok(p):
                problems.append(f"{where}: {key}= path {p!r} is not relative inside the tree")
    if "stamp" in tree.attrs and not (tree.attrs["stamp"] == "." or _rel_path_ok(tree.attrs["stamp"])):
        problems.append(f"{where}: stamp={tree.attrs['stamp']!r} is not a directory inside the tree")
    for source, dest in tree.additions():
        if not dest or not (_rel_path_ok(dest.rstrip("/"))):
            problems.append(f"{where}: add={source}:{dest!r}: the destination is not a relative path")
        if source.endswith("/*"):
            group = m.group(source[:-1])
            if not group:
                problems.append(f"{where}: add={source}: no row's component starts with {source[:-1]!r}")
            if not dest.endswith("/"):
                problems.append(f"{where}: add={source}: a group goes into a directory (end the destination with /)")
            for row in group:
                if row.kind != "file":
                    problems.append(f"{where}: add={source}: {row.name!r} is a {row.kind} row, not a file")
        elif source not in rows:
            problems.append(f"{where}: add= source {source!r} names no row")
        elif rows[source].kind != "file":
            problems.append(f"{where}: add= source {source!r} is a {rows[source].kind} row, not a file")
    seen: set[str] = set()
    for name in tree.patches:
        if name in seen:
            problems.append(f"{where}: patch {name!r} listed twice")
        seen.add(name)
        if name not in rows:
            problems.append(f"{where}: patch {name!r} names no row")
        elif rows[name].kind != "patch":
            problems.append(f"{where}: patches= entry {name!r} is a {rows[name].kind} row, not a patch")
    rename = tree.attrs.get("rename")
    if rename is not None and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*:[A-Za-z_][A-Za-z0-9_]*", rename):
        problems.append(f"{where}: rename={rename!r} is OLD:NEW (two Python identifiers)")
    expect = tree.attrs.get("expect-patch")
    if expect is not None:
        if not re.fullmatch(r"[0-9a-f]{16}", expect):
            problems.append(f"{where}: expect-patch={expect!r} is 16 hex digits")
        if not tree.patches or "stamp" not in tree.attrs:
            problems.append(f"{where}: expect-patch= needs patches= and stamp=")


def validate(m: Manifest) -> Report:
    """Every row and tree checked; errors make the manifest unusable, warnings do not."""
    report = Report()
    problems = report.errors
    seen: dict[str, int] = {}
    for row in m.rows:
        if row.name in seen:
            problems.append(f"{row.where}: duplicate component (first on line {seen[row.name]})")
        seen.setdefault(row.name, row.line)
        if not _NAME.fullmatch(row.component):
            problems.append(f"{row.where}: component names are [A-Za-z0-9._+/-] and start with a letter or digit")
        if row.sha256 == UNLOCKED:
            report.warnings.append(f"{row.where}: unlocked (fill it in with `tp4 sources lock {row.name}`)")
        elif not _HEX64.fullmatch(row.sha256):
            problems.append(f"{row.where}: sha256 {row.sha256!r} is neither 64 lowercase hex digits nor `unlocked`")
        _check_commit_url(row, problems)
        _check_attrs(row, problems)
    for tree in m.trees:
        if tree.name in seen:
            problems.append(
                f"tree {tree.name!r} (line {tree.line}): the name is already used on line {seen[tree.name]}"
            )
        seen.setdefault(tree.name, tree.line)
        if not _NAME.fullmatch(tree.name):
            problems.append(f"tree {tree.name!r} (line {tree.line}): not a valid name")
        _check_tree(tree, m, problems)
    used: dict[str, str] = {}
    for tree in m.trees:
        for name in tree.patches:
            if name in used and used[name] != tree.name:
                problems.append(f"patch {name!r} is applied by both tree {used[name]!r} and tree {tree.name!r}")
            used.setdefault(name, tree.name)
    for row in m.rows:
        if row.kind == "patch" and m.trees and row.name not in used:
            problems.append(f"{row.where}: patch row is in no tree's patches= list (the patch order is incomplete)")
    return report


def check(m: Manifest) -> Report:
    """validate(), raising InvalidInput listing every error."""
    report = validate(m)
    if report.errors:
        raise InvalidInput(f"{m.label}: {len(report.errors)} problem(s)", report.errors)
    return report
