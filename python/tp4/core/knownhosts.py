"""The known_hosts file tp4's ssh trusts, and nothing else does.

Every ssh tp4 starts checks host keys strictly against this one file (:mod:`tp4.core.process`); the
user's ``~/.ssh/known_hosts`` and the system's file are not consulted, so a key is trusted only
after `tp4 hosts trust` showed its fingerprint. The file is ``$TP4_KNOWN_HOSTS`` when set, else
``known_hosts`` in tp4's state directory (:func:`tp4.core.dirs.state_dir`). Its format is OpenSSH's
(``sshd(8)``, SSH_KNOWN_HOSTS FILE FORMAT): ``host[,host…] keytype base64 [comment]``, a host on
a port other than 22 written ``[host]:port``; hashed names (``|1|salt|hash``), wildcards
(``*``, ``?``, ``!``) and the ``@cert-authority`` / ``@revoked`` markers are read too. tp4 writes
plain names, one host and one key a line.

This module reads and writes the file only; fetching keys is :mod:`tp4.hosts.trust`.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import fcntl
import hashlib
import hmac
import os
import re
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from tp4.core import dirs
from tp4.core.errors import InvalidInput, Tp4Error

ENV = "TP4_KNOWN_HOSTS"

# what `ssh-keygen -l` calls each key type
_KIND = {
    "ssh-ed25519": "ED25519",
    "ssh-rsa": "RSA",
    "ssh-dss": "DSA",
    "sk-ssh-ed25519@openssh.com": "ED25519-SK",
    "sk-ecdsa-sha2-nistp256@openssh.com": "ECDSA-SK",
}


def path() -> Path:
    """The file: ``$TP4_KNOWN_HOSTS``, else ``<state dir>/known_hosts``."""
    return Path(os.environ.get(ENV) or dirs.state_dir() / "known_hosts")


def host_name(host: str, port: int | None) -> str:
    """The name ssh looks a host up by: ``host``, or ``[host]:port`` for a port other than 22."""
    return f"[{host}]:{port}" if port and port != 22 else host


# a host name, an IPv4 or an IPv6 address: the profile's rule (tp4.line.profile.models._HOST, which
# tests/test_hosts.py holds equal to this; the profile does not import this module, for start-up time)
HOST = re.compile(r"[A-Za-z0-9:][A-Za-z0-9._:-]{0,252}")


def host_problem(host: str) -> str | None:
    """Why ``host`` cannot be an ssh host name or address (None: it can). Checked before any ssh
    or ssh-keyscan runs, and before a name is written into the file (a newline would add a line)."""
    if HOST.fullmatch(host):
        return None
    if not host:
        return "it is empty"
    if host.startswith("-"):
        return "it starts with '-', so ssh would read it as an option"
    if len(host) > 253:
        return "it is longer than a host name can be (253 characters)"
    bad = next((c for c in host if not (c.isascii() and (c.isalnum() or c in "._:-"))), host[0])
    return f"it contains {bad!r}; a host name or address has only letters, digits, '.', '-' and ':'"


def check_host(host: str, field: str) -> str:
    """``host`` when usable, else InvalidInput naming ``field``."""
    problem = host_problem(host)
    if problem:
        raise InvalidInput(
            f"{field}: {host[:80]!r} is not a host name or address: {problem}; fix: pass the node's ssh name or address"
        )
    return host


def fingerprint(key: str) -> str:
    """``SHA256:<base64>`` of a base64 public key blob, as ``ssh-keygen -l`` prints it."""
    blob = base64.b64decode(key, validate=True)
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


def kind(keytype: str) -> str:
    """ED25519, RSA, ECDSA…: the name ``ssh-keygen -l`` gives a key type."""
    return _KIND.get(keytype) or ("ECDSA" if keytype.startswith("ecdsa-") else keytype)


def _wildcard(pattern: str) -> re.Pattern[str]:
    return re.compile("".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern), re.I)


def _hashed_matches(pattern: str, name: str) -> bool:
    parts = pattern.split("|")  # "|1|salt|hash"
    if len(parts) != 4 or parts[1] != "1":
        return False
    try:
        salt, digest = base64.b64decode(parts[2]), base64.b64decode(parts[3])
    except (binascii.Error, ValueError):
        return False
    return hmac.compare_digest(hmac.new(salt, name.encode(), hashlib.sha1).digest(), digest)


@dataclass(frozen=True)
class Entry:
    """One key line of the file."""

    names: str  # the comma-separated patterns (or one hashed name)
    keytype: str
    key: str  # base64
    marker: str = ""  # "@cert-authority", "@revoked" or ""
    line: int = 0

    @property
    def hashed(self) -> bool:
        return self.names.startswith("|")

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.key)

    def matches(self, name: str) -> bool:
        """Whether ssh would use this line for ``name`` (``host`` or ``[host]:port``)."""
        if self.hashed:
            return _hashed_matches(self.names, name)
        hit = False
        for pattern in self.names.split(","):
            negated = pattern.startswith("!")
            if _wildcard(pattern[1:] if negated else pattern).fullmatch(name):
                if negated:
                    return False
                hit = True
        return hit

    def lists(self, name: str) -> bool:
        """Whether the line names ``name`` itself (hashed or among its names), not by a wildcard."""
        return _hashed_matches(self.names, name) if self.hashed else name.lower() in self.names.lower().split(",")


def parse(text: str) -> list[Entry]:
    """The key lines of a known_hosts text; comments, blank and unreadable lines are skipped."""
    entries = []
    for n, raw in enumerate(text.splitlines(), 1):
        fields = raw.split()
        if not fields or fields[0].startswith("#"):
            continue
        marker = fields.pop(0) if fields[0].startswith("@") else ""
        if len(fields) < 3:
            continue
        try:
            base64.b64decode(fields[2], validate=True)
        except (binascii.Error, ValueError):
            continue
        entries.append(Entry(fields[0], fields[1], fields[2], marker, n))
    return entries


def _text(file: Path) -> str:
    """The file's text, "" when there is none; a FIFO, a device (`TP4_KNOWN_HOSTS=/dev/zero`) or
    a directory is refused without being read, a file past tp4's input size cap too."""
    from tp4.core.userfiles import read_input

    if not os.path.exists(file):
        return ""
    return read_input(
        file,
        "tp4's known hosts",
        f"point {ENV} at a regular file (or unset it: {dirs.state_dir() / 'known_hosts'})",
        errors="replace",
    )


def read(file: Path | None = None) -> list[Entry]:
    return parse(_text(file or path()))


def keys_for(name: str, entries: Sequence[Entry]) -> list[Entry]:
    """The plain (not revoked, not CA) keys ssh would accept for ``name``."""
    return [e for e in entries if not e.marker and e.matches(name)]


def trusted(name: str, file: Path | None = None) -> bool:
    """Whether the file has a line ssh could accept ``name``'s key by (a key or a CA)."""
    return any(e.marker != "@revoked" and e.matches(name) for e in read(file))


@contextlib.contextmanager
def _locked(file: Path) -> Iterator[None]:
    file.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    with open(file.parent / f".{file.name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def update(remove: Iterable[str], add: Iterable[tuple[str, str, str]], file: Path | None = None) -> int:
    """Rewrite the file at once (a temporary file renamed over it, under a lock): without the
    lines that list a name of ``remove`` (a line listing other names too keeps those), and with
    ``(name, keytype, key)`` lines added. Returns how many lines were removed."""
    file = file or path()
    drop = list(remove)
    new = list(add)
    for name, keytype, key in new:
        if any(c.isspace() for c in name + keytype + key) or not name or name.startswith(("#", "@")):
            raise ValueError(f"not a known_hosts entry: {name!r} {keytype!r}")  # names were checked: a bug
    _text(file)  # a device or a FIFO is refused before a lock file is made beside it (in /dev)
    try:
        with _locked(file):
            lines = _text(file).splitlines()
            entries = {e.line: e for e in parse("\n".join(lines))}
            kept, removed = [], 0
            for n, line in enumerate(lines, 1):
                entry = entries.get(n)
                if entry is None or entry.marker or not any(entry.lists(d) for d in drop):
                    kept.append(line)
                    continue
                removed += 1
                others = (
                    []
                    if entry.hashed
                    else [p for p in entry.names.split(",") if p.lower() not in {d.lower() for d in drop}]
                )
                if others:
                    kept.append(" ".join([",".join(others), entry.keytype, entry.key]))
            kept += [f"{name} {keytype} {key}" for name, keytype, key in new]
            fd, tmp = tempfile.mkstemp(dir=file.parent, prefix=f".{file.name}.")
            try:
                with os.fdopen(fd, "w") as out:
                    out.write("".join(f"{line}\n" for line in kept))
                os.chmod(tmp, 0o644)
                os.replace(tmp, file)
            except BaseException:
                os.unlink(tmp)
                raise
    except OSError as exc:
        raise Tp4Error(
            f"cannot write tp4's known hosts {file}: {exc.strerror}; nothing was changed; fix: make "
            f"{file.parent} writable, or point {ENV} at another file"
        ) from None
    return removed
