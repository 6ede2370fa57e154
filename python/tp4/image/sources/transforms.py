"""The source transforms: fetched files in, the tree the image contains out.

One implementation serves ``tp4 sources fetch`` and the Nix derivations (which call it offline with
``--input``). Steps of a tree, always in this order (each only if its attribute is set):

1. unpack ``from`` (archive: strip N leading components; file: copied under its name)
2. ``require``: paths that must exist in the unpacked source
3. ``keep``: keep only these paths (a subtree such as SGLang's ``python/``)
4. ``add``: place file rows at paths (``eol=lf`` rows converted CRLF -> LF)
5. ``rename``: package rename OLD -> NEW (directory, whole-word identifiers, OLD_ upper-case
   knobs), ``__pycache__`` removed
6. ``stamp``: ``<stamp>/SOURCE_COMMIT`` = the commit of ``from``
7. ``patches``: applied in order with GNU patch, each with its row's ``p``/``fuzz``/``dir``;
   any rejected hunk, or fuzz beyond the row's ``fuzz``, fails the tree
8. ``drop``: paths removed
9. ``stamp``: ``<stamp>/SOURCE_PATCH`` = first 16 hex of sha256(patches concatenated in order),
   checked against ``expect-patch``
10. after a rename: no unrenamed reference may remain

The tree is built in a temporary directory beside the destination and renamed into place only
when every step succeeded. Needs: python3 (stdlib), GNU patch.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import stat
import tarfile
import tempfile
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from tp4.core import process
from tp4.core.errors import Tp4Error
from tp4.image.sources import nar
from tp4.image.sources.manifest import Manifest, Row, Tree, split_list

RENAME_SUFFIXES = (".py", ".c", ".cpp", ".h")


# --- unpacking ----------------------------------------------------------------------------------


def _strip(name: str, strip: int) -> str | None:
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if len(parts) <= strip:
        return None
    return "/".join(parts[strip:])


def unpack_archive(archive: Path, dest: Path, strip: int = 0) -> None:
    """Extract a tar archive into ``dest`` dropping ``strip`` leading path components.

    Members that would land outside ``dest`` (absolute, ``..``, links leaving the tree), device
    files and the like are refused (tarfile's ``data`` filter).
    """
    dest.mkdir(parents=True, exist_ok=True)
    try:
        with tarfile.open(archive) as tar:
            members = []
            kept: set[str] = set()  # the names extracted so far: what a hard link may point to
            for member in tar:
                if member.type in (tarfile.XGLTYPE, tarfile.XHDTYPE):
                    continue
                name = _strip(member.name, strip)
                if name is None:
                    if member.isdir():
                        continue
                    raise Tp4Error(
                        f"{archive.name}: member {member.name!r} has fewer than {strip + 1} path components; "
                        f"is strip={strip} right for this archive?"
                    )
                member.name = name
                if member.islnk():
                    link = _strip(member.linkname, strip)
                    if link is None:
                        raise Tp4Error(f"{archive.name}: hard link {member.name!r} points outside the stripped tree")
                    if link not in kept:  # tarfile would raise a bare KeyError looking for it
                        raise Tp4Error(
                            f"{archive.name}: hard link {member.name!r} points to {member.linkname!r}, which is not "
                            f"a file earlier in the archive (after strip={strip}); the archive is not what the "
                            "manifest row expects; fix: check the row's URL and strip="
                        )
                    member.linkname = link
                kept.add(name)
                members.append(member)
            if hasattr(tarfile, "data_filter"):
                tar.extractall(dest, members=members, filter="data")
            else:  # Python < 3.11.4 (Debian 12's 3.11.2): the same refusals, checked here
                for member in members:
                    _check_member(member, dest)
                tar.extractall(dest, members=members)
    except (tarfile.TarError, EOFError, OSError) as exc:
        if isinstance(exc, Tp4Error):
            raise
        raise Tp4Error(f"{archive.name}: cannot unpack ({exc})") from exc


def _check_member(member: tarfile.TarInfo, dest: Path) -> None:
    """What tarfile's ``data`` filter refuses: paths or links leaving ``dest``, absolute link
    targets, device files and FIFOs; also drops set-id bits."""

    def inside(rel: str) -> bool:
        path = os.path.normpath(os.path.join(dest, rel))
        return path == str(dest) or path.startswith(str(dest) + os.sep)

    if member.name.startswith("/") or not inside(member.name):
        raise tarfile.TarError(f"member {member.name!r} would land outside the tree")
    if member.ischr() or member.isblk() or member.isfifo() or member.isdev():
        raise tarfile.TarError(f"member {member.name!r} is a special file")
    if member.issym():
        if member.linkname.startswith("/") or not inside(os.path.join(os.path.dirname(member.name), member.linkname)):
            raise tarfile.TarError(f"symlink {member.name!r} points outside the tree ({member.linkname!r})")
    if member.islnk() and (member.linkname.startswith("/") or not inside(member.linkname)):
        raise tarfile.TarError(f"hard link {member.name!r} points outside the tree")
    member.mode &= 0o777


def normalise(root: Path) -> None:
    """Files 0644 (0755 if any execute bit), dirs 0755: the tree's NAR hash depends on nothing else."""
    for dirpath, _, filenames in os.walk(root):
        os.chmod(dirpath, 0o755)
        for name in filenames:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            if stat.S_ISREG(st.st_mode):
                os.chmod(path, 0o755 if st.st_mode & 0o111 else 0o644)


def _inside(root: Path, rel: str) -> Path:
    path = (root / rel).resolve()
    base = root.resolve()
    if path != base and base not in path.parents:
        raise Tp4Error(f"{rel!r} leaves the tree")
    return root / rel


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


# --- steps --------------------------------------------------------------------------------------


def require(root: Path, paths: Iterable[str], what: str) -> None:
    missing = [p for p in paths if not os.path.lexists(_inside(root, p))]
    if missing:
        raise Tp4Error(f"{what}: the source lacks {', '.join(missing)}; is this the right archive or strip level?")


def keep(root: Path, paths: Iterable[str], what: str) -> None:
    """Keep only ``paths`` (and the directories leading to them)."""
    paths = list(paths)
    require(root, paths, what)
    wanted = {Path(p) for p in paths}
    parents = {parent for p in wanted for parent in p.parents}

    def prune(directory: Path, rel: Path) -> None:
        for entry in list(directory.iterdir()):
            sub = rel / entry.name
            if sub in wanted:
                continue
            if sub in parents and entry.is_dir() and not entry.is_symlink():
                prune(entry, sub)
            else:
                _remove(entry)

    prune(root, Path("."))


def add_file(root: Path, source: Path, dest: str, *, eol_lf: bool = False, executable: bool = False) -> None:
    target = _inside(root, dest)
    target.parent.mkdir(parents=True, exist_ok=True)
    data = source.read_bytes()
    if eol_lf:
        data = data.replace(b"\r\n", b"\n")
    if os.path.lexists(target):
        _remove(target)
    target.write_bytes(data)
    os.chmod(target, 0o755 if executable else 0o644)


def _rename_patterns(old: str, new: str) -> list[tuple[re.Pattern[bytes], bytes]]:
    lower_old, lower_new = old.encode(), new.encode()
    upper_old, upper_new = old.upper().encode() + b"_", new.upper().encode() + b"_"
    return [
        # whole word, not followed by '-' (b12x-source stays): b12x.comm -> b12x_next.comm
        (re.compile(rb"\b" + re.escape(lower_old) + rb"\b(?!-)"), lower_new),
        # knobs at a word start: B12X_FOO -> B12X_NEXT_FOO; B12X_NEXT_FOO, _B12X_FOO and
        # VLLM_B12X_FOO stay (upstream's perl: s/\bB12X_(?!NEXT_)/B12X_NEXT_/g)
        (
            re.compile(rb"\b" + re.escape(upper_old) + rb"(?!" + re.escape(upper_new[len(upper_old) :]) + rb")"),
            upper_new,
        ),
    ]


def rename_text(data: bytes, old: str, new: str) -> bytes:
    """The identifier rename on one file's bytes (idempotent)."""
    for pattern, replacement in _rename_patterns(old, new):
        data = pattern.sub(replacement, data)
    return data


def _source_files(root: Path) -> Iterable[Path]:
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            if name.endswith(RENAME_SUFFIXES):
                path = Path(dirpath, name)
                if not path.is_symlink():
                    yield path


def rename_package(root: Path, old: str, new: str) -> None:
    """Rename package ``old`` to ``new``: the top directory, references in .py/.c/.cpp/.h files,
    ``OLD_`` knobs to ``NEW_``; drops ``__pycache__``."""
    for dirpath, dirnames, _ in os.walk(root):
        for name in [d for d in dirnames if d == "__pycache__"]:
            shutil.rmtree(os.path.join(dirpath, name))
            dirnames.remove(name)
    if (root / old).is_dir():
        if os.path.lexists(root / new):
            raise Tp4Error(f"rename {old} -> {new}: {new}/ already exists in the tree")
        (root / old).rename(root / new)
    for path in _source_files(root):
        data = path.read_bytes()
        renamed = rename_text(data, old, new)
        if renamed != data:
            path.write_bytes(renamed)


def unrenamed(root: Path, old: str, new: str) -> list[str]:
    """``file:line`` of every reference the rename would still change."""
    found = []
    patterns = [p for p, _ in _rename_patterns(old, new)]
    for path in sorted(_source_files(root)):
        for number, line in enumerate(path.read_bytes().split(b"\n"), start=1):
            if any(p.search(line) for p in patterns):
                found.append(f"{path.relative_to(root)}:{number}")
    return found


_FUZZ = re.compile(r"with fuzz (\d+)")


def apply_patch(root: Path, patch: Path, *, strip: int = 1, fuzz: int = 0, directory: str = ".", name: str = "") -> str:
    """Apply one patch with GNU patch; fail on any rejected or skipped hunk or on fuzz > ``fuzz``.

    Returns patch's output. No .orig or .rej files are left behind.
    """
    label = name or patch.name
    where = _inside(root, directory) if directory != "." else root
    if not where.is_dir():
        raise Tp4Error(f"patch {label}: directory {directory!r} does not exist in the tree")
    proc = process.run(
        [
            "patch",
            f"-p{strip}",
            f"--fuzz={fuzz}",
            "--no-backup-if-mismatch",
            "--batch",
            "--forward",
            "--reject-file=-",
            "-i",
            str(patch.resolve()),
            "-d",
            str(where),
        ],
        check=False,
    )
    output = (proc.stdout or "") + (proc.stderr or "")
    worst = max((int(f) for f in _FUZZ.findall(output)), default=0)
    escaped = "dangerous file name" in output  # GNU patch skips paths leaving the directory
    if proc.returncode != 0 or worst > fuzz or escaped:
        tail = "\n".join(output.strip().splitlines()[-20:])
        reason = (
            "names a file outside the tree"
            if escaped
            else f"needed fuzz {worst} > {fuzz}"
            if proc.returncode == 0
            else "did not apply cleanly"
        )
        raise Tp4Error(
            f"patch {label} (-p{strip} --fuzz={fuzz} in {directory}) {reason}:\n{tail}\n"
            "the pinned source and the patch disagree; fix the pin or the patch row"
        )
    return output


def drop(root: Path, paths: Iterable[str]) -> None:
    for rel in paths:
        path = _inside(root, rel)
        if os.path.lexists(path):
            _remove(path)


def patch_id(patches: Iterable[bytes]) -> str:
    """SOURCE_PATCH: the first 16 hex digits of sha256 over the patches concatenated in order."""
    h = hashlib.sha256()
    for data in patches:
        h.update(data)
    return h.hexdigest()[:16]


# --- whole trees ------------------------------------------------------------------------------


def _place_source(row: Row, path: Path, work: Path) -> None:
    if row.kind == "archive" and path.is_dir():
        # a row fetched by its tree: already unpacked, its top directory stripped
        shutil.copytree(path, work, symlinks=True, dirs_exist_ok=True)
    elif row.kind == "archive":
        unpack_archive(path, work, row.int_attr("strip", 0))
    elif row.kind == "git":
        shutil.copytree(path, work, symlinks=True, dirs_exist_ok=True)
    else:
        add_file(
            work, path, row.file_name, eol_lf=row.attrs.get("eol") == "lf", executable=row.attrs.get("mode") == "755"
        )


def build_tree(
    manifest: Manifest, tree: Tree, inputs: Mapping[str, Path], work: Path, *, log: Callable[[str], None] | None = None
) -> dict[str, str]:
    """Run a tree's steps in ``work`` (an empty directory); ``inputs`` maps row names to checked
    files. Returns the stamps written (SOURCE_COMMIT/SOURCE_PATCH)."""
    say = log or (lambda _msg: None)
    what = f"tree {tree.name}"
    source = manifest.row(tree.source)
    _place_source(source, inputs[source.name], work)
    normalise(work)
    require(work, split_list(tree.attrs.get("require")), what)
    if "keep" in tree.attrs:
        keep(work, split_list(tree.attrs["keep"]), what)
    for src, dest in tree.additions():
        for row, member in manifest.expand(src):
            target = dest + member if dest.endswith("/") else dest
            say(f"{tree.name}: add {row.name} -> {target}")
            add_file(
                work,
                inputs[row.name],
                target,
                eol_lf=row.attrs.get("eol") == "lf",
                executable=row.attrs.get("mode") == "755",
            )
    rename = tree.attrs.get("rename")
    if rename:
        old, new = rename.split(":", 1)
        say(f"{tree.name}: rename {old} -> {new}")
        rename_package(work, old, new)
    stamps: dict[str, str] = {}
    stamp_dir = tree.attrs.get("stamp")
    if stamp_dir:
        stamp_at = _inside(work, stamp_dir)
        stamp_at.mkdir(parents=True, exist_ok=True)
        (stamp_at / "SOURCE_COMMIT").write_text(source.commit + "\n")
        stamps["SOURCE_COMMIT"] = source.commit
    patch_bytes = []
    for name in tree.patches:
        row = manifest.row(name)
        say(f"{tree.name}: patch {name}")
        apply_patch(
            work,
            inputs[name],
            strip=row.int_attr("p", 1),
            fuzz=row.int_attr("fuzz", 0),
            directory=row.attrs.get("dir", "."),
            name=name,
        )
        patch_bytes.append(inputs[name].read_bytes())
    for name in tree.runs:
        say(f"{tree.name}: run {name}")
        run_script(work, inputs[name], name=name, root=manifest.row(name).attrs.get("root"))
    drop(work, split_list(tree.attrs.get("drop")))
    if stamp_dir and patch_bytes:
        value = patch_id(patch_bytes)
        expected = tree.attrs.get("expect-patch")
        if expected and value != expected:
            raise Tp4Error(
                f"{what}: SOURCE_PATCH is {value}, the manifest expects {expected}: the patches or their order changed"
            )
        (_inside(work, stamp_dir) / "SOURCE_PATCH").write_text(value + "\n")
        stamps["SOURCE_PATCH"] = value
    if rename:
        old, new = rename.split(":", 1)
        left = unrenamed(work, old, new)
        if left:
            shown = ", ".join(left[:10]) + (f" and {len(left) - 10} more" if len(left) > 10 else "")
            raise Tp4Error(f"{what}: unrenamed references to {old} remain after the patches: {shown}")
    normalise(work)
    return stamps


def rooted_script(data: bytes, root: str, work: Path, *, name: str) -> bytes:
    """The script with every use of the absolute tree root it assumes (``root``: upstream's image
    runs it in /sgl-workspace/sglang and it opens files there by absolute path) pointed at ``work``.
    Only whole path components are rewritten (``/sgl-workspace/sglang/python``, not
    ``/sgl-workspace/sglang2``); a script that never names the root is refused, as the row then
    no longer describes it."""
    target = str(work.resolve()).encode()
    if not re.fullmatch(rb"(/[A-Za-z0-9._+-]+)+", target):
        raise Tp4Error(
            f"{name}: the build directory {target.decode(errors='replace')!r} cannot stand in for {root} "
            "in a Python string; fix: build in a directory whose path has no quotes, spaces or escapes"
        )
    pattern = re.compile(re.escape(root.encode()) + rb"(?![A-Za-z0-9._+-])")
    rewritten, count = pattern.subn(lambda _m: target, data)
    if count == 0:
        raise Tp4Error(
            f"{name}: names no path under root={root}; the manifest row no longer matches the script: "
            "drop root= from the row, or check the pinned script"
        )
    return rewritten


def run_script(work: Path, script: Path, *, name: str, root: str | None = None) -> None:
    """Run a pinned Python script with the tree as its working directory (as upstream's Dockerfile
    runs `python3 runtime/roce_tp4_adapt.py` in /sgl-workspace/sglang); it must change the tree.
    With ``root`` (the row's root=), a copy whose absolute paths under that root point at the tree
    runs instead, kept outside the tree."""
    import sys

    from tp4.core import process

    before = nar.nar_sha256(work)
    with tempfile.TemporaryDirectory(prefix="tp4-run-") as tmp:
        if root is not None:
            copy = Path(tmp) / script.name
            copy.write_bytes(rooted_script(script.read_bytes(), root, work, name=name))
            script = copy
        proc = process.run([sys.executable, "-I", str(script)], cwd=work, check=False)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-10:])
        raise Tp4Error(f"{name} failed in the tree (exit code {proc.returncode}):\n{tail}")
    if nar.nar_sha256(work) == before:
        raise Tp4Error(f"{name} ran but changed nothing in the tree: it no longer matches this source")


def build_row(row: Row, path: Path, work: Path) -> None:
    """``fetch ROW`` for a plain row: an archive unpacked (with its strip), a file under its name."""
    _place_source(row, path, work)
    normalise(work)


def check_destination(dest: Path) -> None:
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise Tp4Error(f"{dest} exists and is not an empty directory; remove it or pick another --to")


def publish(work: Path, dest: Path) -> None:
    """Move a finished tree to ``dest`` (which must not exist or be an empty directory)."""
    check_destination(dest)
    if dest.exists():
        dest.rmdir()
    os.chmod(work, 0o755)
    os.replace(work, dest)


def scratch_dir(dest: Path) -> Path:
    """A temporary directory on the same filesystem as ``dest`` (so publish() is a rename)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{dest.name}.", suffix=".partial", dir=dest.parent))
