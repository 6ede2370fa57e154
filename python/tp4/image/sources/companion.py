"""``sources.manifest.json``: the parse of ``sources.manifest`` as JSON, committed beside it.

Nix reads this file (``pkgs/sources.nix``, with ``builtins.fromJSON``) and never the manifest's
grammar: every row and tree exactly as :func:`tp4.image.sources.manifest.parse` produced them, with
what Nix would otherwise re-derive (the wheel's name fields, the image's name, tag, digest and
architecture, a git row's remote, each tree's input rows). ``source_sha256`` is the sha256 of
the manifest's bytes; Nix compares it with the manifest it is given and refuses a stale copy,
naming :data:`REGENERATE`.

One write path: :func:`write` writes the manifest and its companion together (``tp4 sources
lock`` and ``tp4 sources json`` both go through it), each through a temporary file renamed into
place; if the second rename fails the first is undone, so both change or neither does. A run
that rewrites the manifest reads it again and writes it inside :func:`locked`, so two runs at
once (two `tp4 sources lock` of different rows) both land, one after the other.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tp4.core.errors import Tp4Error
from tp4.image.sources.manifest import Manifest, parse

SUFFIX = ".json"
REGENERATE = "tp4 sources json"
GENERATED = (
    f"the parse of the manifest beside it, written by `{REGENERATE}` (and by `tp4 sources lock`); "
    "pkgs/sources.nix reads it and refuses it while source_sha256 is not the manifest's sha256"
)


def path_of(manifest_path: str | os.PathLike[str]) -> Path:
    """The companion of a manifest: beside the real file (the repository's ``sources.manifest`` is
    a link into ``python/tp4/data``), its name with ``.json`` appended."""
    real = Path(manifest_path).resolve()
    return real.with_name(real.name + SUFFIX)


def document(m: Manifest) -> dict[str, Any]:
    """What the companion holds: the digest of the text parsed, then the parse."""
    return {"generated": GENERATED, "source_sha256": hashlib.sha256(m.text.encode()).hexdigest(), **m.to_json()}


def text(m: Manifest) -> str:
    return json.dumps(document(m), indent=1, ensure_ascii=False) + "\n"


def stale(manifest_path: str | os.PathLike[str]) -> str | None:
    """Why the companion of the manifest at ``manifest_path`` is not its current parse, or None."""
    from tp4.image.sources.manifest import load

    want = text(load(Path(manifest_path)))
    twin = path_of(manifest_path)
    try:
        have = twin.read_text(encoding="utf-8")
    except FileNotFoundError:
        return f"{twin} does not exist; fix: run `{REGENERATE}` and commit it beside the manifest"
    except OSError as exc:
        return f"cannot read {twin}: {exc.strerror}"
    if have == want:
        return None
    return f"{twin} is not the parse of {manifest_path}; fix: run `{REGENERATE}` and commit both files"


@contextlib.contextmanager
def locked(manifest_path: str | os.PathLike[str]) -> Iterator[None]:
    """An exclusive flock(2) on the manifest file itself (the real file behind a link), held
    while the caller reads it again and rewrites it. A rewrite renames a new file into place,
    so a lock won on a file that is no longer the manifest is let go and taken on the new one:
    whoever holds it holds the file at the path. Nothing is created beside the manifest."""
    real = Path(manifest_path).resolve()
    while True:
        try:
            fd = os.open(real, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
        except OSError as exc:
            raise Tp4Error(f"cannot open {real} to lock it: {exc.strerror}; nothing was changed") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            held = os.fstat(fd)
            try:
                now = os.stat(real)
            except FileNotFoundError:
                now = None
        except OSError as exc:
            os.close(fd)
            raise Tp4Error(f"cannot lock {real}: {exc.strerror}; nothing was changed") from None
        if now is not None and (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino):
            break
        os.close(fd)  # replaced (or removed) while we waited: lock what is there now
    try:
        yield
    finally:
        os.close(fd)  # closing the last descriptor releases the lock


def _temp_beside(path: Path, content: str) -> str:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(content)
            f.flush()
            os.fsync(f.fileno())
        if path.exists():
            os.chmod(tmp, path.stat().st_mode & 0o7777)
        else:
            os.chmod(tmp, 0o644)
    except BaseException:
        os.unlink(tmp)
        raise
    return tmp


def write(manifest_path: str | os.PathLike[str], manifest_text: str) -> Manifest:
    """Write ``manifest_text`` to the manifest and its parse to the companion: both or neither.

    The text is parsed first (a syntax error writes nothing). The companion is renamed into place
    first, then the manifest; if that fails the companion is put back as it was. A crash between
    the two renames leaves a companion whose ``source_sha256`` is not the manifest's, which Nix
    and the tests refuse naming :data:`REGENERATE`: never a silent mismatch."""
    real = Path(manifest_path).resolve()
    m = parse(manifest_text, real)
    twin = path_of(real)
    try:
        old_twin = twin.read_bytes() if twin.exists() else None
        tmp_manifest = _temp_beside(real, manifest_text)
    except OSError as exc:
        raise Tp4Error(f"cannot write {real}: {exc.strerror or exc}; nothing was changed") from None
    tmp_twin = None
    try:
        tmp_twin = _temp_beside(twin, text(m))
        os.replace(tmp_twin, twin)
        try:
            os.replace(tmp_manifest, real)
        except OSError:
            if old_twin is None:
                twin.unlink(missing_ok=True)
            else:
                restore = _temp_beside(twin, old_twin.decode("utf-8"))
                os.replace(restore, twin)
            raise
    except OSError as exc:
        raise Tp4Error(f"cannot write {real} and {twin.name}: {exc.strerror or exc}; neither was changed") from None
    finally:
        for tmp in (tmp_manifest, tmp_twin):
            if tmp is not None and os.path.exists(tmp):
                os.unlink(tmp)
    return m
