"""The line's API key: :class:`Secret` (its repr and str never show it) and :func:`read_key`, the
one reader and the one check of the profile's ``api.key_file``. ``tp4 plan`` and ``profile
check`` run the same check on the file's metadata (:func:`key_file_problem`, never reading the
key) and show its findings as warnings; serve, which sends the key, refuses on them.

Standard library and tp4.core.errors only: below the profile's validator and everything that serves."""

from __future__ import annotations

import hmac
import os
import shlex
import stat
from typing import NamedTuple

from tp4.core.errors import InvalidInput
from tp4.core.userfiles import file_kind

_MAX_KEY_FILE = 64 << 10


class Secret:
    """A secret string (the API key). ``repr`` and ``str`` never show it. :meth:`reveal` is called
    where the key must leave tp4 as itself: the Authorization header (tp4.serving.api), the line's env
    file of mode 0600 (tp4.serving.serve.env_file_text) and the fleet router's key file of mode 0600."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        # the header's rules: an invalid value would make http.client raise with the value in
        # its message, so nothing of the kind gets this far
        if not value or not all("!" <= c <= "~" for c in value):
            raise ValueError("a secret must be non-empty printable ASCII without whitespace (value not shown)")
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret('********')"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and hmac.compare_digest(self._value.encode(), other._value.encode())

    def __hash__(self) -> int:
        return hash((Secret, len(self._value)))


class KeyFileProblem(NamedTuple):
    """What is wrong with a key file, and the fix (the message says ``api.key_file: PATH REASON``)."""

    reason: str
    fix: str


def key_file_problem(where: str) -> KeyFileProblem | None:
    """The key file's metadata checked, without reading it: it must exist, be reachable, be a
    regular file, and be of no use to anyone but its owner (mode 600). The one check of
    ``api.key_file``: the profile's loader shows what it finds as a warning; :func:`read_key`
    refuses on the same findings before it opens the file (the mode: a warning, logged)."""
    problem, st = _kind_problem(where)
    if problem is not None or st is None:
        return problem
    return mode_problem(where, stat.S_IMODE(st.st_mode))


def _kind_problem(where: str) -> tuple[KeyFileProblem | None, os.stat_result | None]:
    """The file missing, out of reach or not a regular file; else its stat."""
    try:
        st = os.stat(where)
    except FileNotFoundError:
        return KeyFileProblem(
            "does not exist", f"write the API key to {where} and chmod 600 {shlex.quote(where)}"
        ), None
    except PermissionError:
        return KeyFileProblem("cannot be reached (permission denied)", "name a file this user can read"), None
    except OSError as exc:
        return KeyFileProblem(f"cannot be checked ({exc.strerror})", "name the file holding the API key"), None
    if not stat.S_ISREG(st.st_mode):
        return KeyFileProblem(
            f"is {file_kind(st.st_mode)}, not a regular file", "name the file holding the API key"
        ), None
    return None, st


def mode_problem(where: str, mode: int) -> KeyFileProblem | None:
    """A key file its group or everyone can read, write or use: the key is not private."""
    if not mode & 0o077:
        return None
    bits = 0o044 if mode & 0o044 else 0o022 if mode & 0o022 else 0o011
    how = {0o044: "readable", 0o022: "writable", 0o011: "usable"}[bits]
    group, other = mode & bits & 0o070, mode & bits & 0o007
    who = "its group and everyone" if group and other else "everyone" if other else "its group"
    return KeyFileProblem(f"is {how} by {who} (mode {mode:04o})", f"chmod 600 {shlex.quote(where)}")


def read_key(path: str | os.PathLike[str]) -> Secret:
    """The API key in ``path`` (the profile's ``api.key_file``): a regular file holding one key
    (surrounding whitespace, such as the final newline, is dropped). Anything else is
    :class:`InvalidInput` naming the file and the fix; a file others can use is a warning
    (:func:`key_file_problem`, the same check ``tp4 plan`` shows). The file is opened without
    blocking and checked on its descriptor, so a FIFO or a device put in its place is refused,
    never read."""
    where = os.path.expanduser(os.fspath(path))

    def bad(reason: str, fix: str) -> InvalidInput:
        return InvalidInput(f"api.key_file: {where} {reason}; fix: {fix}")

    found, _ = _kind_problem(where)
    if found is not None:
        raise bad(*found)
    try:
        fd = os.open(where, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except PermissionError:
        raise bad(
            "is not readable by this user (permission denied)",
            f"chmod 600 {shlex.quote(where)} as its owner, or run tp4 as that user",
        ) from None
    except OSError as exc:
        raise bad(f"cannot be opened ({exc.strerror})", "name the file holding the API key") from None
    try:
        st = os.fstat(fd)  # what was opened, not what was there a moment ago
        if not stat.S_ISREG(st.st_mode):
            raise bad(f"is {file_kind(st.st_mode)}, not a regular file", "name the file holding the API key")
        data = b""
        while len(data) <= _MAX_KEY_FILE:
            part = os.read(fd, _MAX_KEY_FILE + 1 - len(data))
            if not part:
                break
            data += part
    except OSError as exc:
        raise bad(f"cannot be read ({exc.strerror})", "name the file holding the API key") from None
    finally:
        os.close(fd)
    if len(data) > _MAX_KEY_FILE:
        raise bad(
            f"is larger than {_MAX_KEY_FILE // 1024} KiB, not one API key", "name the file holding only the API key"
        )
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError as exc:
        raise bad(
            f"holds a byte that is not ASCII (at offset {exc.start})",
            "an API key is printable ASCII: rewrite the file with the key alone",
        ) from None
    key = text.strip(" \t\r\n")
    if not key:
        raise bad("is empty", f"write the API key to {where}")
    for i, c in enumerate(key):
        if c.isspace():
            raise bad(
                f"holds whitespace or a line break inside the key (at character {i + 1})",
                "write the key alone, on one line",
            )
        if not "!" <= c <= "~":
            raise bad(
                f"holds a control character inside the key (at character {i + 1})", "write the key alone, on one line"
            )
    loose = mode_problem(where, stat.S_IMODE(st.st_mode))
    if loose is not None:
        import logging  # only when there is something to say: `tp4 plan` configures no logging

        logging.getLogger("tp4.core.apikey").warning("api.key_file: %s %s; fix: %s", where, loose.reason, loose.fix)
    return Secret(key)
