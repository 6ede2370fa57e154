"""The symbol versions a shared library needs, read from its ELF file (standard library only).

``librow_store.so`` is compiled with nixpkgs' toolchain but ``dlopen``ed inside the base image,
whose glibc is older: a symbol version only the newer glibc has (``__isoc23_strtol@GLIBC_2.38``,
which glibc >= 2.38 headers emit for ``strtol`` in C++) would fail only at boot on the Sparks.
``python3 -m tp4.image.elf check-glibc --max 2.39 FILE...`` refuses such a file at build time
(pkgs/runtime.nix runs it, with the ``glibc=`` of the base image's row of sources.manifest).

The reader takes ELF64 little-endian files (aarch64, x86_64) and reads what ``readelf -V`` shows
as ``.gnu.version_r`` (the versions needed, per library) and ``.gnu.version`` with ``.dynsym``
(which undefined symbol needs which of them), found through the section headers.
"""

from __future__ import annotations

import argparse
import re
import struct
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from tp4.core.errors import InvalidInput, Tp4Error

SHT_DYNSYM = 11
SHT_GNU_VERNEED = 0x6FFFFFFE
SHT_GNU_VERSYM = 0x6FFFFFFF
VER_FLG_WEAK = 0x2

# integers only (the header's e_ident is read as bytes apart), so unpack() gives ints
_EHDR = struct.Struct("<16xHHIQQQIHHHHHH")
_SHDR = struct.Struct("<IIQQQQIIQQ")
_SYM = struct.Struct("<IBBHQQ")
_VERNEED = struct.Struct("<HHIII")
_VERNAUX = struct.Struct("<IHHII")
_VERSYM = struct.Struct("<H")

_NUMBERED = re.compile(r"GLIBC_([0-9]+(?:\.[0-9]+)+)")
_MAX = re.compile(r"[0-9]+\.[0-9]+")
# glibc's version names that are not a release number, with the release that introduced them
_NAMED = {"GLIBC_ABI_DT_RELR": (2, 36)}


@dataclass(frozen=True)
class VersionNeed:
    """One entry of ``.gnu.version_r``: a version needed from a library, and who needs it."""

    library: str  # vn_file, e.g. libc.so.6
    version: str  # e.g. GLIBC_2.38
    weak: bool
    symbols: tuple[str, ...]  # the undefined dynamic symbols bound to this version, in file order


@dataclass(frozen=True)
class _Section:
    type: int
    offset: int
    size: int
    link: int
    info: int
    entsize: int


class _Reader:
    def __init__(self, path: Path, data: bytes) -> None:
        self.path = path
        self.data = data

    def fail(self, why: str) -> InvalidInput:
        return InvalidInput(f"{self.path}: {why}")

    def unpack(self, fmt: struct.Struct, offset: int) -> tuple[int, ...]:
        if offset < 0 or offset + fmt.size > len(self.data):
            raise self.fail(
                f"truncated or corrupt ELF file (a {fmt.size}-byte record at offset {offset} "
                f"lies past its end, {len(self.data)} bytes)"
            )
        return fmt.unpack_from(self.data, offset)

    def string(self, table: _Section, index: int) -> str:
        start = table.offset + index
        end = self.data.find(b"\0", start, table.offset + table.size) if index < table.size else -1
        if end < 0:
            raise self.fail(f"corrupt ELF file (string {index} runs past its string table)")
        return self.data[start:end].decode("utf-8", "replace")

    def sections(self) -> list[_Section]:
        ident = self.data[:16]
        if len(ident) < 16 or ident[:4] != b"\x7fELF":
            raise self.fail("not an ELF file")
        if ident[4] != 2 or ident[5] != 1:
            raise self.fail("not a 64-bit little-endian ELF file (the line's libraries are aarch64 ELF64)")
        header = self.unpack(_EHDR, 0)
        shoff, shentsize, shnum = header[5], header[10], header[11]
        if shoff == 0:
            raise self.fail(
                "has no section headers, so its symbol versions cannot be read; "
                "do not strip the section headers (sstrip) of a library the line checks"
            )
        if shentsize != _SHDR.size:
            raise self.fail(f"corrupt ELF file (section header size {shentsize}, expected {_SHDR.size})")
        if shnum == 0:  # more than 0xff00 sections: the count is in section 0's sh_size
            shnum = self.unpack(_SHDR, shoff)[5]
        out = []
        for i in range(shnum):
            _, type_, _, _, offset, size, link, info, _, entsize = self.unpack(_SHDR, shoff + i * _SHDR.size)
            out.append(_Section(type_, offset, size, link, info, entsize))
        return out

    def linked(self, sections: list[_Section], section: _Section) -> _Section:
        if section.link >= len(sections):
            raise self.fail(f"corrupt ELF file (section link {section.link} names no section)")
        return sections[section.link]


def needed_versions(path: str | Path) -> list[VersionNeed]:
    """Every version ``path`` needs from the libraries it links, in ``.gnu.version_r`` order
    (what ``readelf -V`` lists under "Version needs section"); [] when it needs none."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise InvalidInput(f"{path}: no such file") from None
    except IsADirectoryError:
        raise InvalidInput(f"{path}: is a directory, not a library") from None
    except OSError as exc:
        raise InvalidInput(f"{path}: cannot be read ({exc.strerror})") from None
    r = _Reader(path, data)
    sections = r.sections()
    verneed = [s for s in sections if s.type == SHT_GNU_VERNEED]
    if not verneed:
        return []

    # version index (vna_other) -> the undefined symbols that need it
    by_index: dict[int, list[str]] = {}
    dynsym = next((s for s in sections if s.type == SHT_DYNSYM), None)
    versym = next((s for s in sections if s.type == SHT_GNU_VERSYM), None)
    if dynsym is not None and versym is not None:
        strtab = r.linked(sections, dynsym)
        entsize = dynsym.entsize or _SYM.size
        for i in range(dynsym.size // entsize):
            name, _, _, shndx, _, _ = r.unpack(_SYM, dynsym.offset + i * entsize)
            (index,) = r.unpack(_VERSYM, versym.offset + 2 * i)
            if shndx == 0 and name:
                by_index.setdefault(index & 0x7FFF, []).append(r.string(strtab, name))

    needs = []
    for section in verneed:
        strtab = r.linked(sections, section)
        offset = section.offset
        for _ in range(section.info):
            _, count, file_, aux, next_ = r.unpack(_VERNEED, offset)
            library = r.string(strtab, file_)
            at = offset + aux
            for _ in range(count):
                _, flags, index, name, next_aux = r.unpack(_VERNAUX, at)
                needs.append(
                    VersionNeed(
                        library, r.string(strtab, name), bool(flags & VER_FLG_WEAK), tuple(by_index.get(index, ()))
                    )
                )
                if next_aux == 0:
                    break
                at += next_aux
            if next_ == 0:
                break
            offset += next_
    return needs


def glibc_release(version: str) -> tuple[int, ...] | None:
    """The glibc release a ``GLIBC_*`` version name first appeared in: GLIBC_2.38 -> (2, 38),
    GLIBC_ABI_DT_RELR -> (2, 36); None for a name that is not tied to a release (GLIBC_PRIVATE)."""
    m = _NUMBERED.fullmatch(version)
    if m:
        return tuple(int(p) for p in m[1].split("."))
    return _NAMED.get(version)


def parse_release(text: str) -> tuple[int, ...]:
    if not _MAX.fullmatch(text):
        raise InvalidInput(f"glibc version {text!r} is not MAJOR.MINOR (e.g. 2.39)")
    return tuple(int(p) for p in text.split("."))


@dataclass(frozen=True)
class TooNew:
    """A glibc version a file needs that a glibc ``max`` does not have, and why."""

    file: Path
    need: VersionNeed
    reason: str

    def describe(self) -> str:
        symbols = ", ".join(self.need.symbols) or "no symbol names it; the version entry alone fails the load"
        return f"{self.file}: needs {self.need.version} from {self.need.library} ({self.reason}): {symbols}"


def too_new(paths: list[Path], max_release: str) -> tuple[list[TooNew], dict[Path, str]]:
    """The glibc versions each file needs beyond release ``max_release``, and for every file the
    newest glibc version it needs ("" when none)."""
    limit = parse_release(max_release)
    problems: list[TooNew] = []
    newest: dict[Path, str] = {}
    for path in paths:
        best: tuple[tuple[int, ...], str] = ((), "")
        for need in needed_versions(path):
            if not need.version.startswith("GLIBC_"):
                continue
            release = glibc_release(need.version)
            if release is None:
                reason = (
                    "private to the glibc it was linked against"
                    if need.version == "GLIBC_PRIVATE"
                    else f"not tied to a glibc release, so glibc {max_release} cannot be shown to have it"
                )
                problems.append(TooNew(path, need, reason))
                continue
            if release > limit:
                problems.append(TooNew(path, need, f"glibc {'.'.join(map(str, release))} > {max_release}"))
            best = max(best, (release, need.version))
        newest[path] = best[1]
    return problems, newest


def check_glibc(paths: list[Path], max_release: str, out: TextIO | None = None) -> None:
    """Print each glibc version the files need that glibc ``max_release`` lacks (with the symbols
    that need it) and raise Tp4Error if there is one; print one line per file that passes."""
    out = out or sys.stdout
    problems, newest = too_new(paths, max_release)
    for problem in problems:
        print(problem.describe(), file=out)
    bad = {p.file for p in problems}
    for path in paths:
        if path not in bad:
            needed = f"needs at most {newest[path]}" if newest[path] else "needs no glibc symbol version"
            print(f"{path}: ok, {needed} (the base image has glibc {max_release})", file=out)
    if problems:
        files = ", ".join(str(p) for p in paths if p in bad)
        raise Tp4Error(
            f"{files} need{'s' if len(bad) == 1 else ''} glibc symbol versions the base image's glibc "
            f"{max_release} does not have (listed above); loaded there it would fail with "
            f'"version `GLIBC_...\' not found" only when the line boots on the Sparks. Build it so it '
            f"does not use those symbols (glibc >= 2.38 headers turn strtol and friends into "
            f"__isoc23_* under _GNU_SOURCE, which g++ always defines), or, if the base image changed, "
            f"set glibc= on its row of sources.manifest to what `ldd --version` prints inside it"
        )


def main(argv: list[str] | None = None) -> None:
    """``python3 -m tp4.image.elf check-glibc --max 2.39 FILE...``: errors as ``error: ...``, no traceback."""
    parser = argparse.ArgumentParser(prog="python3 -m tp4.image.elf", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    check = commands.add_parser("check-glibc", help="Fail if a file needs a glibc symbol version newer than --max.")
    check.add_argument("--max", required=True, metavar="MAJOR.MINOR", help="The glibc the files will run under.")
    check.add_argument("files", nargs="+", type=Path, metavar="FILE")
    args = parser.parse_args(argv)
    try:
        check_glibc(args.files, args.max)
    except Tp4Error as exc:
        sys.stdout.flush()
        print(f"error: {exc.message}", file=sys.stderr)
        sys.exit(exc.exit_code)


if __name__ == "__main__":
    main()
