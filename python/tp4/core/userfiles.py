"""The files a user names on the command line: read only regular files, of a bounded size, and
write only regular files or new paths, atomically.

A device (`/dev/zero`, `/dev/full`), a FIFO or a directory is never what a profile, an env file
or a manifest is: reading one would block or never end, writing one would replace it.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from tp4.core.errors import InvalidInput

# Profiles, env files and manifests are a few KiB; anything far larger is not one.
MAX_INPUT_BYTES = 16 * 1024 * 1024
# No document tp4 reads nests tables, arrays or objects more than a few levels; this many is
# far beyond any of them and far below where Python's parsers (and the code walking what they
# return) run out of stack.
MAX_DEPTH = 64
# Python refuses to convert a decimal string of more than this many digits to an int
# (sys.get_int_max_str_digits(), CVE-2020-10735); a parser raises a bare ValueError on one.
MAX_INT_DIGITS = 4300


def file_kind(mode: int) -> str:
    """What a path that is not a regular file is, for a message: `{what} is {file_kind(mode)}`."""
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def read_input(
    path: str | os.PathLike[str],
    what: str,
    missing_fix: str = "pass an existing file",
    limit: int = MAX_INPUT_BYTES,
    errors: str = "strict",
) -> str:
    """The UTF-8 text of a regular file the user named, or an InvalidInput saying what is wrong
    (errors="replace": undecodable bytes become U+FFFD instead)."""
    if not os.fspath(path):
        raise InvalidInput(f"{what}: the path is empty; fix: {missing_fix}")
    p = Path(path)
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer; it is refused below
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except FileNotFoundError:
        raise InvalidInput(f"{what} {p} does not exist; fix: {missing_fix}") from None
    except OSError as exc:
        raise InvalidInput(f"cannot read {what} {p}: {exc.strerror}; fix: {missing_fix}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise InvalidInput(f"{what} {p} is {file_kind(st.st_mode)}, not a regular file; fix: {missing_fix}")
        if st.st_size > limit:
            raise InvalidInput(
                f"{what} {p} is {st.st_size} bytes, more than the {limit} a {what} can be; fix: {missing_fix}"
            )
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        raise InvalidInput(f"cannot read {what} {p}: {exc.strerror}") from None
    finally:
        os.close(fd)
    if size > limit:
        raise InvalidInput(f"{what} {p} grew beyond {limit} bytes while being read; fix: {missing_fix}")
    try:
        return b"".join(chunks).decode("utf-8", errors)
    except UnicodeDecodeError as exc:
        raise InvalidInput(f"{what} {p} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def check_output(path: str | os.PathLike[str], what: str, *, force: bool) -> os.stat_result | None:
    """Refuse an output path that is not a new path in an existing directory, or (with force) an
    existing regular file; returns the existing file's stat."""
    if not os.fspath(path):
        raise InvalidInput(f"{what}: the output path is empty; fix: pass -o FILE")
    out = Path(path)
    try:
        st = os.stat(out)
    except FileNotFoundError:
        st = None
        if os.path.lexists(out):  # a symbolic link to nothing: it exists, and is no regular file
            raise InvalidInput(
                f"{what} {out} is a symbolic link to {os.readlink(out)!r}, which does not exist; fix: remove the "
                "link, or choose another -o"
            ) from None
    except OSError as exc:
        raise InvalidInput(f"cannot write {what} {out}: {exc.strerror}") from None
    if st is not None:
        if not stat.S_ISREG(st.st_mode):
            raise InvalidInput(f"{what} {out} is {file_kind(st.st_mode)}; fix: name a regular file or a new path")
        if not force:
            raise InvalidInput(f"{out} exists; fix: choose another -o, or pass --force")
    if not out.parent.is_dir():
        raise InvalidInput(f"cannot write {what} {out}: directory {out.parent} does not exist; fix: create it first")
    return st


def write_output(path: str | os.PathLike[str], text: str, what: str, *, force: bool) -> Path:
    """Write text to a new path, or over an existing regular file with force; atomically (a
    temporary file beside it, renamed into place), so a failed write leaves nothing behind."""
    st = check_output(path, what, force=force)
    out = Path(path)
    parent = out.parent
    import tempfile  # here, not at the top: only writers need it, and `tp4 plan` reads

    try:
        fd, tmp = tempfile.mkstemp(dir=parent, prefix=f".{out.name}.", suffix=".tmp")
    except OSError as exc:
        raise InvalidInput(
            f"cannot write {what} {out}: {exc.strerror} in {parent}; fix: choose a directory you can write to"
        ) from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        if st is not None:
            os.chmod(tmp, stat.S_IMODE(st.st_mode))
        os.replace(tmp, out)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise InvalidInput(f"cannot write {what} {out}: {exc.strerror}") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return out


def _depth_over(value: object, limit: int) -> bool:
    """Whether value nests dicts and lists more than limit levels deep (iteratively: a recursive
    walk is what a too-deep document breaks)."""
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children = list(item.values())
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def _long_number_line(text: str) -> int | None:
    """The line of the first run of more than MAX_INT_DIGITS digits (TOML allows `_` between them)."""
    import re

    m = re.search(r"[0-9](?:_?[0-9]){%d,}" % MAX_INT_DIGITS, text)
    return text.count("\n", 0, m.start()) + 1 if m else None


def _too_deep(what: str, fix: str) -> InvalidInput:
    return InvalidInput(
        f"{what}: tables, arrays or objects nested more than {MAX_DEPTH} levels deep; no tp4 file nests "
        f"more than a few; fix: {fix}"
    )


def _too_long(what: str, text: str, fix: str) -> InvalidInput:
    line = _long_number_line(text)
    at = f" (line {line})" if line else ""
    return InvalidInput(
        f"{what}: a number of more than {MAX_INT_DIGITS} digits{at}; no value tp4 reads is anywhere near "
        f"that long; fix: {fix}"
    )


def parse_toml(text: str, what: str, fix: str = "correct the file") -> dict[str, object]:
    """A TOML document, or an InvalidInput: a syntax error, nesting deeper than MAX_DEPTH, or an
    integer Python will not convert are the user's file, never an internal error."""
    import tomllib

    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InvalidInput(f"{what} is not valid TOML: {exc}") from None
    except RecursionError:
        raise _too_deep(what, fix) from None
    except ValueError:  # not a TOMLDecodeError: int() refusing a number of too many digits
        raise _too_long(what, text, fix) from None
    if _depth_over(doc, MAX_DEPTH):
        raise _too_deep(what, fix)
    return doc


def parse_json(text: str, what: str, fix: str = "correct the file", **hooks: object) -> object:
    """A JSON document (json.loads with hooks), or an InvalidInput naming what and the fix, the
    line and column of a syntax error, nesting deeper than MAX_DEPTH or a number too long."""
    import json

    try:
        doc = json.loads(text, **hooks)  # type: ignore[arg-type]
    except json.JSONDecodeError as exc:
        raise InvalidInput(
            f"{what}: not JSON ({exc.msg} at line {exc.lineno} column {exc.colno}); fix: {fix}"
        ) from None
    except RecursionError:
        raise _too_deep(what, fix) from None
    except ValueError:  # int() refusing a number of too many digits
        raise _too_long(what, text, fix) from None
    if _depth_over(doc, MAX_DEPTH):
        raise _too_deep(what, fix)
    return doc


def read_toml(
    path: str | os.PathLike[str], what: str, missing_fix: str = "pass an existing file", limit: int = MAX_INPUT_BYTES
) -> dict[str, object]:
    """read_input, then parse_toml: `what` and the path name the file in every refusal."""
    return parse_toml(read_input(path, what, missing_fix, limit), f"{what} {os.fspath(path)}", missing_fix)


def read_json(
    path: str | os.PathLike[str], what: str, missing_fix: str = "pass an existing file", limit: int = MAX_INPUT_BYTES
) -> object:
    """read_input, then parse_json: `what` and the path name the file in every refusal."""
    return parse_json(read_input(path, what, missing_fix, limit), f"{what} {os.fspath(path)}", missing_fix)
