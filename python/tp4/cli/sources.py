"""``tp4 sources``: list, verify, lock, fetch, diff and hash the pinned sources."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

import click

from tp4.core import schemas
from tp4.core.errors import InvalidInput, Tp4Error
from tp4.image.sources import manifest as mf


manifest_option = click.option(
    "--manifest",
    "manifest_file",
    metavar="FILE",
    help="Manifest to read (default: $TP4_SOURCES_MANIFEST, else the repository's sources.manifest).",
)


def _read(path: str | Path) -> mf.Manifest:
    """A manifest the user named: a regular file of bounded size, never a device or a FIFO."""
    from tp4.core.userfiles import read_input

    return mf.parse(read_input(path, "manifest", "pass --manifest FILE naming a sources.manifest"), Path(path))


def _load(manifest_file: str | None, *, strict: bool = True) -> mf.Manifest:
    m = _read(mf.chosen_path(manifest_file))
    if strict:
        mf.check(m)
    return m


@click.group()
def sources() -> None:
    """Pinned sources: every input of the image, hash-checked, from sources.manifest."""


@sources.command("list")
@manifest_option
@click.option("--json", "as_json", is_flag=True, help="The parse as JSON (what sources.manifest.json holds).")
def list_cmd(manifest_file: str | None, as_json: bool) -> None:
    """List rows (name, kind, lock state, commit) and trees (with the rows they need)."""
    m = _load(manifest_file, strict=False)
    if as_json:
        import json

        click.echo(json.dumps(m.to_json(), indent=2))
        return
    width = max((len(r.name) for r in m.rows), default=4)
    for row in m.rows:
        state = "locked" if row.locked else "UNLOCKED"
        commit = row.commit if len(row.commit) < 20 else row.commit[:12]
        click.echo(f"{row.name:<{width}}  {row.kind:<7}  {state:<8}  {commit}")
    for tree in m.trees:
        needs = ", ".join(r.name for r in m.inputs(tree.name))
        click.echo(f"tree {tree.name}: from {tree.source}; needs {needs}")


@sources.command()
@manifest_option
@click.option("--download", is_flag=True, help="Also download every locked row and check its sha256.")
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help=f"The check as one JSON object on stdout (schema {schemas.SOURCES_VERIFY}), also when it fails.",
)
@click.argument("names", nargs=-1)
def verify(manifest_file: str | None, download: bool, as_json: bool, names: tuple[str, ...]) -> None:
    """Check the manifest: columns, hashes, URLs naming their commit, no duplicates, every patch in
    a tree's order. Unlocked rows are reported as warnings. Exit 2 on a problem of the manifest,
    1 when a downloaded row does not match its hash."""
    from tp4.core.contracts.sources_report import SourcesVerify

    m = _load(manifest_file, strict=False)
    report = mf.validate(m)
    for warning in report.warnings:
        click.echo(f"warning: {warning}", err=True)
    rows: list[mf.Row] = []

    def emit(problems: list[str]) -> None:
        if as_json:  # the document first; the error (stderr) and exit as without --json
            doc = SourcesVerify(
                manifest=str(m.label),
                ok=not problems,
                rows=len(rows),
                unlocked=sum(not r.locked for r in rows),
                trees=len(m.trees),
                downloaded=download and not problems,
                warnings=list(report.warnings),
                problems=problems,
            )
            click.echo(json.dumps(doc.model_dump(mode="json", by_alias=True), indent=2))

    if report.errors:
        emit(list(report.errors))
        raise InvalidInput(f"{m.label}: {len(report.errors)} problem(s)", report.errors)
    try:
        rows = [m.row(n) for n in names] if names else list(m.rows)
        if download:
            _verify_downloads(rows)
    except Tp4Error as exc:
        emit(exc.message.splitlines())
        raise
    unlocked = sum(not r.locked for r in rows)
    if as_json:
        emit([])
        return
    checked = "downloaded and hash-checked" if download else "checked"
    click.echo(f"{m.label}: {len(rows)} rows {checked} ({unlocked} unlocked), {len(m.trees)} trees: ok")


def _verify_downloads(rows: list[mf.Row]) -> None:
    import tempfile

    from tp4.image.sources import download, fetch, nar

    failures = []
    for row in rows:
        if not row.locked or row.kind in ("image", "local"):
            why = (
                "unlocked"
                if not row.locked
                else f"{row.kind} row, checked by Nix"
                if row.kind == "image"
                else "local row"
            )
            click.echo(f"skip {row.name}: {why}", err=True)
            continue
        try:
            if row.kind == "wheel":
                with tempfile.TemporaryDirectory(prefix="tp4-verify-") as tmp:
                    actual = download.sha256_file(fetch.pip_download(row, Path(tmp)))
            elif row.kind == "git":
                with tempfile.TemporaryDirectory(prefix="tp4-verify-") as tmp:
                    fetch.git_checkout(row.url, row.commit, Path(tmp) / "tree")
                    actual = nar.nar_sha256(Path(tmp) / "tree").hex()
            elif row.kind == "archive" and row.tree_sha256:
                # pinned by its tree: the archive's bytes may have changed, its files must not
                with tempfile.TemporaryDirectory(prefix="tp4-verify-") as tmp:
                    _, unpacked = fetch.download_tree(row, row.url, Path(tmp))
                    tree = nar.nar_sha256(unpacked).hex()
                if tree != row.tree_sha256:
                    failures.append(f"{row.name}: tree-sha256 mismatch: pinned {row.tree_sha256}, downloaded {tree}")
                continue
            else:
                actual, _ = download.hash_url(row.url, label=row.name)
        except Tp4Error as exc:
            failures.append(f"{row.name}: {exc.message}")
            continue
        if actual != row.sha256:
            failures.append(f"{row.name}: sha256 mismatch: pinned {row.sha256}, downloaded {actual}")
    if failures:
        raise Tp4Error(f"{len(failures)} row(s) failed the download check:\n" + "\n".join(f"  - {f}" for f in failures))


@sources.command()
@manifest_option
@click.option("--ref", help="Move the named row to the head of this branch or tag.")
@click.option(
    "--tree",
    is_flag=True,
    help="Also record the hash of each named archive row's unpacked tree (tree-sha256=): Nix then "
    "fetches the row by its tree, so a re-compressed archive with the same files still fetches.",
)
@click.argument("names", nargs=-1)
def lock(manifest_file: str | None, ref: str | None, tree: bool, names: tuple[str, ...]) -> None:
    """Fill in (or refresh) pins: every unlocked row, or the rows named.

    Branches and tags in the commit column (or --ref) are resolved to commits; the hash is taken
    from a fresh download. The manifest is rewritten in place, once, after every row succeeded.
    """
    from tp4.image.sources import lock as locking

    m = _load(manifest_file, strict=False)
    changes = locking.lock(m, list(names), ref=ref, tree=tree)
    if not changes:
        click.echo("nothing to lock: every row has its sha256")
    for change in changes:
        click.echo(change.describe())


@sources.command("json")
@manifest_option
@click.option("--check", is_flag=True, help="Write nothing; fail if the JSON copy is not the manifest's parse.")
def json_cmd(manifest_file: str | None, check: bool) -> None:
    """Write sources.manifest.json beside the manifest: its parse, which pkgs/sources.nix reads
    (run it after editing the manifest by hand and commit both; `tp4 sources lock` writes both)."""
    from tp4.image.sources import companion

    m = _load(manifest_file)
    if check:
        why = companion.stale(m.path or "")
        if why:
            raise Tp4Error(why)
        click.echo(f"{companion.path_of(m.path or '')}: current")
        return
    with companion.locked(m.path or ""):  # a `tp4 sources lock` running now writes before or after, never between
        m = _read(m.path or "")
        mf.check(m)
        companion.write(m.path or "", m.text)
    click.echo(f"wrote {companion.path_of(m.path or '')}")


@sources.command()
@manifest_option
@click.argument("name")
@click.option("--to", "to", required=True, metavar="DIR", help="Where the tree goes (must not exist, or be empty).")
@click.option(
    "--input",
    "inputs",
    multiple=True,
    metavar="COMPONENT=PATH",
    help="An already fetched file for a row: hash-checked and used instead of a download.",
)
@click.option("--offline", is_flag=True, help="Never download (the default inside a Nix build).")
@click.option("-q", "--quiet", is_flag=True, help="No progress or step lines.")
def fetch(manifest_file: str | None, name: str, to: str, inputs: tuple[str, ...], offline: bool, quiet: bool) -> None:
    """Produce NAME (a tree, or a single row) at DIR exactly as the image contains it; prints the
    tree's NAR hash (sha256 SRI, as `nix hash path`)."""
    from tp4.image.sources import fetch as fetching

    for line in fetching.fetch_named(_load(manifest_file), name, Path(to), list(inputs), offline=offline, quiet=quiet):
        click.echo(line)


def _describe_attrs(old: Mapping[str, str], new: Mapping[str, str]) -> list[str]:
    parts: list[str] = []
    for key in sorted(set(old) | set(new)):
        if old.get(key) != new.get(key):
            parts.append(f"{key}: {old.get(key, '(none)')} -> {new.get(key, '(none)')}")
    return parts


@sources.command()
@manifest_option
@click.argument("old", metavar="OLD_MANIFEST")
@click.argument("new", metavar="[NEW_MANIFEST]", required=False)
@click.option(
    "--json", "as_json", is_flag=True, help=f"The changes as one JSON object on stdout (schema {schemas.SOURCES_DIFF})."
)
def diff(manifest_file: str | None, old: str, new: str | None, as_json: bool) -> None:
    """What changed from OLD_MANIFEST to NEW_MANIFEST (default: --manifest): rows and trees added,
    removed, re-pinned or re-hashed."""
    from tp4.core.contracts.sources_report import SourcesChange, SourcesDiff

    a = _read(old)
    b = _read(new) if new else _load(manifest_file, strict=False)
    changes: list[SourcesChange] = []
    lines = []
    for kind, left, right in (("row", a.by_name, b.by_name), ("tree", a.tree_by_name, b.tree_by_name)):
        for name in left:
            if name not in right:
                lines.append(f"- {kind} {name}")
                changes.append(SourcesChange(change="removed", kind=kind, name=name, details=[]))
        for name, item in right.items():
            if name not in left:
                lines.append(f"+ {kind} {name}")
                changes.append(SourcesChange(change="added", kind=kind, name=name, details=[]))
                continue
            before = left[name]
            parts = []
            if kind == "row":
                for col in ("commit", "sha256", "url"):
                    if getattr(before, col) != getattr(item, col):
                        parts.append(f"{col}: {getattr(before, col)} -> {getattr(item, col)}")
            parts += _describe_attrs(dict(before.attrs), dict(item.attrs))
            if parts:
                lines.append(f"~ {kind} {name}\n" + "\n".join(f"    {p}" for p in parts))
                changes.append(SourcesChange(change="changed", kind=kind, name=name, details=parts))
    if as_json:
        doc = SourcesDiff(old=str(a.label), new=str(b.label), changes=changes)
        click.echo(json.dumps(doc.model_dump(mode="json", by_alias=True), indent=2))
        return
    click.echo("\n".join(lines) if lines else "no changes")


@sources.command("hash")
@click.argument("path", type=click.Path(exists=True, file_okay=True, dir_okay=True))
@click.option("--format", "fmt", type=click.Choice(["sri", "nix32", "hex"]), default="sri", show_default=True)
@click.option(
    "--store-path", "store_name", metavar="NAME", help="Also print where `nix store add-path --name NAME` puts it."
)
def hash_cmd(path: str, fmt: str, store_name: str | None) -> None:
    """The NAR hash of PATH, as `nix hash path` prints it (the hash a Nix fixed-output tree needs).
    It reads no manifest (it took --manifest and ignored it)."""
    from tp4.image.sources import nar

    if store_name is not None:  # before the hash is printed: a refused name leaves no half answer
        try:
            nar.check_store_name(store_name)
        except ValueError:
            shown = repr(store_name[:60]) + ("..." if len(store_name) > 60 else "")
            raise InvalidInput(
                f"--store-path {shown}: not a valid store path name; fix: 1-211 of [A-Za-z0-9+-._?=], "
                "not starting with '.'"
            ) from None
    try:
        digest = nar.nar_sha256(path)
    except ValueError as exc:  # a FIFO, socket or device inside the tree
        raise InvalidInput(
            f"cannot hash {path}: {exc}", ["fix: hash a tree of regular files, symlinks and directories only"]
        ) from None
    except OSError as exc:
        where = os.fsdecode(exc.filename) if exc.filename is not None else path
        raise InvalidInput(
            f"cannot hash {path}: {where}: {exc.strerror or exc}",
            ["fix: make every file and directory in the tree readable by this user"],
        ) from None
    click.echo(nar.encode(digest, fmt))
    if store_name:
        try:
            click.echo(nar.store_path(store_name, digest))
        except ValueError as exc:
            raise InvalidInput(f"--store-path: {exc}") from None
