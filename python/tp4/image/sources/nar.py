"""The Nix archive (NAR) format, its hash, and Nix's hash encodings, in pure Python.

``nar_hash(path)`` equals ``nix hash path`` byte for byte: regular files (executable or not),
symlinks (target stored, never followed) and directories (entries sorted by their byte names).
Only stdlib, so it runs inside a Nix build sandbox.
"""

from __future__ import annotations

import base64
import hashlib
import os
import stat
from pathlib import Path
from typing import Protocol

# Nix's base32 alphabet: no e, o, u, t (avoids words); digits are read in reverse bit order.
NIX32_ALPHABET = "0123456789abcdfghijklmnpqrsvwxyz"
STORE_DIR = "/nix/store"
_CHUNK = 1 << 20
_PAD = b"\0" * 8


def _str(data: bytes) -> bytes:
    """A NAR string: little-endian u64 length, the bytes, zero padding to a multiple of 8."""
    return len(data).to_bytes(8, "little") + data + _PAD[: (-len(data)) % 8]


_MAGIC = _str(b"nix-archive-1")
_OPEN, _CLOSE = _str(b"("), _str(b")")
_TYPE = _str(b"type")
_REGULAR = _OPEN + _TYPE + _str(b"regular")
_EXECUTABLE = _str(b"executable") + _str(b"")
_CONTENTS = _str(b"contents")
_SYMLINK = _OPEN + _TYPE + _str(b"symlink") + _str(b"target")
_DIRECTORY = _OPEN + _TYPE + _str(b"directory")
_ENTRY = _str(b"entry") + _OPEN + _str(b"name")
_NODE = _str(b"node")


class Hasher(Protocol):
    """What the NAR is fed into: a hashlib object, or anything else with ``update``."""

    def update(self, data: bytes | memoryview, /) -> None: ...


class _Sink:
    """Feeds a hash with small NAR tokens batched together and file contents in big chunks."""

    __slots__ = ("h", "buf", "buffer", "view")

    def __init__(self, h: Hasher) -> None:
        self.h = h
        self.buf: list[bytes] = []
        self.buffer = bytearray(_CHUNK)
        self.view = memoryview(self.buffer)

    def put(self, data: bytes) -> None:
        self.buf.append(data)

    def flush(self) -> None:
        if self.buf:
            self.h.update(b"".join(self.buf))
            self.buf.clear()

    def file(self, path: bytes, size: int) -> None:
        self.put(size.to_bytes(8, "little"))
        self.flush()
        remaining = size
        # lstat said a regular file; if a FIFO or a device took its place since, opening it must
        # not wait for a writer, and it is refused on the descriptor, never read
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0))
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise OSError(f"{os.fsdecode(path)} is no longer a regular file")
            while remaining > 0:
                n = os.readv(fd, [self.view])
                if n <= 0:
                    raise OSError(f"{os.fsdecode(path)} shrank while being hashed")
                n = min(n, remaining)
                self.h.update(self.view[:n])
                remaining -= n
        finally:
            os.close(fd)
        self.put(_PAD[: (-size) % 8])


def _dump(sink: _Sink, path: bytes, st: os.stat_result) -> None:
    mode = st.st_mode
    if stat.S_ISREG(mode):
        sink.put(_REGULAR)
        if mode & stat.S_IXUSR:
            sink.put(_EXECUTABLE)
        sink.put(_CONTENTS)
        sink.file(path, st.st_size)
        sink.put(_CLOSE)
    elif stat.S_ISLNK(mode):
        sink.put(_SYMLINK + _str(os.readlink(path)) + _CLOSE)
    elif stat.S_ISDIR(mode):
        sink.put(_DIRECTORY)
        with os.scandir(path) as it:
            entries = sorted(it, key=lambda e: e.name)
        for entry in entries:
            name = entry.name
            sink.put(_ENTRY + _str(name) + _NODE)
            _dump(sink, entry.path, entry.stat(follow_symlinks=False))
            sink.put(_CLOSE)
        sink.put(_CLOSE)
    else:
        raise ValueError(f"{os.fsdecode(path)}: not a regular file, symlink or directory; NAR cannot hold it")


def nar_dump(path: str | os.PathLike[str], h: Hasher) -> None:
    """Feed the NAR serialisation of ``path`` into ``h`` (anything with ``update(bytes)``)."""
    raw = os.fsencode(path)
    sink = _Sink(h)
    sink.put(_MAGIC)
    _dump(sink, raw, os.lstat(raw))
    sink.flush()


def nar_bytes(path: str | os.PathLike[str]) -> bytes:
    """The whole NAR of ``path`` (for tests and small trees)."""

    class _Collect:
        def __init__(self) -> None:
            self.parts: list[bytes] = []

        def update(self, data: bytes | memoryview, /) -> None:
            self.parts.append(bytes(data))

    c = _Collect()
    nar_dump(path, c)
    return b"".join(c.parts)


def nar_sha256(path: str | os.PathLike[str]) -> bytes:
    """The raw sha256 digest of the NAR of ``path``."""
    h = hashlib.sha256()
    nar_dump(path, h)
    return h.digest()


def nix32(digest: bytes) -> str:
    """Nix's base32 (``nix hash to-base32``): its own alphabet, last byte first."""
    size = len(digest)
    length = (size * 8 - 1) // 5 + 1
    out = []
    for n in range(length - 1, -1, -1):
        b = n * 5
        i, j = divmod(b, 8)
        c = digest[i] >> j
        if i + 1 < size:
            c |= digest[i + 1] << (8 - j)
        out.append(NIX32_ALPHABET[c & 0x1F])
    return "".join(out)


def from_nix32(text: str, size: int = 32) -> bytes:
    """Inverse of :func:`nix32`."""
    if len(text) != (size * 8 - 1) // 5 + 1:
        raise ValueError(f"{text!r} is not a nix32 hash of {size} bytes")
    out = bytearray(size)
    for n, ch in enumerate(reversed(text)):
        digit = NIX32_ALPHABET.find(ch)
        if digit < 0:
            raise ValueError(f"{text!r}: {ch!r} is not a nix32 digit")
        b = n * 5
        i, j = divmod(b, 8)
        out[i] |= (digit << j) & 0xFF
        if i + 1 < size:
            out[i + 1] |= digit >> (8 - j)
        elif digit >> (8 - j):
            raise ValueError(f"{text!r} does not fit in {size} bytes")
    return bytes(out)


def sri(digest: bytes, algo: str = "sha256") -> str:
    """SRI form ``sha256-<base64>``, as ``nix hash path`` prints it."""
    return f"{algo}-{base64.b64encode(digest).decode()}"


def parse_hash(text: str) -> bytes:
    """A sha256 given as SRI, ``sha256:<hex|nix32>``, 64 hex digits or 52 nix32 digits."""
    value = text.strip()
    if value.startswith("sha256-"):
        digest = base64.b64decode(value[7:], validate=True)
        if len(digest) != 32:
            raise ValueError(f"{text!r}: not a sha256")
        return digest
    if value.startswith("sha256:"):
        value = value[7:]
    if len(value) == 64:
        return bytes.fromhex(value)
    return from_nix32(value)


def nar_hash(path: str | os.PathLike[str], *, encoding: str = "sri") -> str:
    """``nix hash path`` of a tree: ``sri`` (default), ``nix32``, or ``hex``."""
    digest = nar_sha256(path)
    return encode(digest, encoding)


def encode(digest: bytes, encoding: str) -> str:
    if encoding == "sri":
        return sri(digest)
    if encoding == "nix32":
        return nix32(digest)
    if encoding == "hex":
        return digest.hex()
    raise ValueError(f"unknown hash encoding {encoding!r} (sri, nix32, hex)")


def _compress(digest: bytes, size: int = 20) -> bytes:
    out = bytearray(size)
    for i, byte in enumerate(digest):
        out[i % size] ^= byte
    return bytes(out)


def _make_store_path(kind: str, inner_hex: str, name: str, store_dir: str) -> str:
    fingerprint = f"{kind}:sha256:{inner_hex}:{store_dir}:{name}"
    digest = _compress(hashlib.sha256(fingerprint.encode()).digest())
    return f"{store_dir}/{nix32(digest)}-{name}"


_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789+-._?=")


def check_store_name(name: str) -> None:
    if not name or len(name) > 211 or name.startswith(".") or not set(name) <= _NAME_CHARS:
        raise ValueError(f"{name!r} is not a valid store path name (1-211 of [A-Za-z0-9+-._?=], not starting with '.')")


def store_path(name: str, sha256: bytes, *, recursive: bool = True, store_dir: str = STORE_DIR) -> str:
    """The store path of a fixed-output path with this sha256 (``nix store add-path``/FOD output).

    ``recursive``: ``sha256`` is the NAR hash of a tree (``outputHashMode = "recursive"``,
    ``nix-store --add``); otherwise the flat hash of a single file (``nix-store --add-fixed sha256``).
    """
    check_store_name(name)
    if recursive:
        return _make_store_path("source", sha256.hex(), name, store_dir)
    inner = hashlib.sha256(f"fixed:out:sha256:{sha256.hex()}:".encode()).hexdigest()
    return _make_store_path("output:out", inner, name, store_dir)


def tree_store_path(path: str | os.PathLike[str], name: str | None = None) -> str:
    """Where ``nix store add-path`` would put this tree."""
    return store_path(name or Path(path).name, nar_sha256(path))
