"""tp4.image.elf: the symbol versions a library needs, against readelf/objdump, and `check-glibc`.

The libraries are compiled here with gcc; a version script gives a test library versions named
like glibc's (GLIBC_2.99, GLIBC_2.10, GLIBC_PRIVATE, GLIBC_ABI_DT_RELR), so a library linked
against it needs them exactly as a library built on a newer glibc needs that glibc's.
"""

from __future__ import annotations

import os
import re
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from tp4.image import elf
from tp4.core.errors import InvalidInput

REPO = Path(__file__).resolve().parent.parent


def run(argv: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, check=False)


def gcc(tmp: Path, name: str, code: str, *flags: str, cc: str = "gcc", suffix: str = ".c") -> Path:
    (tmp / f"{name}{suffix}").write_text(code)
    out = tmp / f"lib{name}.so"
    proc = run(
        [
            cc,
            "-shared",
            "-fPIC",
            "-Wall",
            "-Werror",
            f"-Wl,-soname,lib{name}.so",
            f"{name}{suffix}",
            "-o",
            out.name,
            *flags,
        ],
        cwd=tmp,
    )
    assert proc.returncode == 0, proc.stderr
    return out


# A stand-in for a newer glibc: symbols under glibc-like version names.
NEW_C = (
    "#include <string.h>\nunsigned long length(const char *s) { return strlen(s); }\n"
    "int f(void) { return 1; }\nint ten(void) { return 10; }\nint four(void) { return 4; }\n"
    "int priv(void) { return 0; }\nint relr(void) { return 0; }\n"
)
NEW_MAP = """GLIBC_2.4 { global: four; local: *; };
GLIBC_2.10 { global: ten; } GLIBC_2.4;
GLIBC_2.99 { global: f; } GLIBC_2.10;
GLIBC_PRIVATE { global: priv; };
GLIBC_ABI_DT_RELR { global: relr; };
"""


@pytest.fixture(scope="module")
def libs(tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("elf")
    (tmp / "new.map").write_text(NEW_MAP)
    gcc(tmp, "new", NEW_C, "-Wl,--version-script=new.map")
    user = gcc(
        tmp,
        "user",
        "#include <string.h>\nint f(void); int ten(void); int four(void);\n"
        "int use(const char *s) { return f() + ten() + four() + (int)strlen(s); }\n",
        "-L.",
        "-lnew",
    )
    private = gcc(
        tmp, "private", "int priv(void); int relr(void);\nint use(void) { return priv() + relr(); }\n", "-L.", "-lnew"
    )
    # only the host's glibc: strlen (an old version) and pthread_create (GLIBC_2.34 since glibc 2.34)
    old = gcc(
        tmp,
        "old",
        "#include <pthread.h>\n#include <string.h>\n"
        "static void *run(void *s) { return (void *)strlen(s); }\n"
        "int use(char *s) { pthread_t t; return pthread_create(&t, 0, run, s); }\n",
        "-pthread",
    )
    # C++ with a static libstdc++, as librow_store.so is built
    cxx = gcc(
        tmp,
        "cxx",
        "#include <string>\n#include <cstdlib>\n"
        'extern "C" long parse(const char *s) { return std::strtol(std::string(s).c_str(), nullptr, 10); }\n',
        "-static-libstdc++",
        "-static-libgcc",
        cc="g++",
        suffix=".cpp",
    )
    bare = gcc(tmp, "bare", "int answer(void) { return 42; }\n", "-nostdlib")
    stdcxx = Path(run(["g++", "-print-file-name=libstdc++.so.6"]).stdout.strip()).resolve()
    assert stdcxx.is_file(), f"g++ names no libstdc++.so.6 ({stdcxx}); install g++"
    return {
        "user": user,
        "private": private,
        "old": old,
        "cxx": cxx,
        "bare": bare,
        "stdcxx": stdcxx,
        "new": tmp / "libnew.so",
    }


def readelf_needs(path: Path) -> list[tuple[str, str, bool]]:
    """(library, version, weak) of each entry of readelf -V's "Version needs section", in order."""
    proc = run(["readelf", "-V", "-W", str(path)])
    assert proc.returncode == 0, proc.stderr
    out, library = [], None
    _, _, needs = proc.stdout.partition("Version needs section")
    for line in needs.splitlines():
        if m := re.search(r"File: (\S+)\s+Cnt:", line):
            library = m[1]
        elif m := re.search(r"Name: (\S+)\s+Flags: (.*?)\s+Version:", line):
            out.append((library, m[1], "WEAK" in m[2]))
    return out


def objdump_versioned_undefined(path: Path) -> set[tuple[str, str]]:
    """(symbol, version) of every undefined dynamic symbol objdump -T shows with a needed version."""
    proc = run(["objdump", "-T", str(path)])
    assert proc.returncode == 0, proc.stderr
    found = set()
    for line in proc.stdout.splitlines():
        if m := re.search(r"\*UND\*\s+[0-9a-f]+\s+\(([^)]+)\)\s+(\S+)$", line):
            found.add((m[2], m[1]))
    return found


@pytest.mark.parametrize("name", ["user", "private", "old", "cxx", "bare", "new", "stdcxx"])
def test_needed_versions_are_what_readelf_and_objdump_show(libs, name):
    needs = elf.needed_versions(libs[name])
    assert [(n.library, n.version, n.weak) for n in needs] == readelf_needs(libs[name])
    assert {(s, n.version) for n in needs for s in n.symbols} == objdump_versioned_undefined(libs[name])


def test_the_test_libraries_need_what_they_were_built_to_need(libs):
    need = {n.version: (n.library, n.symbols) for n in elf.needed_versions(libs["user"])}
    assert need["GLIBC_2.99"] == ("libnew.so", ("f",))
    assert need["GLIBC_2.10"] == ("libnew.so", ("ten",)) and need["GLIBC_2.4"] == ("libnew.so", ("four",))
    assert any(lib == "libc.so.6" and "strlen" in syms for lib, syms in need.values())
    old = {n.version: n.symbols for n in elf.needed_versions(libs["old"])}
    assert old.get("GLIBC_2.34") == ("pthread_create",), (
        f"the host's glibc must be >= 2.34 (pthread_create@GLIBC_2.34); libold.so needs {old}"
    )
    assert elf.needed_versions(libs["bare"]) == []


def check(*args: str | Path) -> subprocess.CompletedProcess:
    """`python3 -m tp4.image.elf ...` as pkgs/runtime.nix runs it."""
    env = {**os.environ, "PYTHONPATH": str(REPO / "python")}
    return subprocess.run(
        [sys.executable, "-m", "tp4.image.elf", *map(str, args)], capture_output=True, text=True, env=env, check=False
    )


def test_a_too_new_version_fails_with_the_symbols_and_what_to_do(libs):
    proc = check("check-glibc", "--max", "2.39", libs["user"])
    assert proc.returncode == 1
    assert proc.stdout.splitlines() == [f"{libs['user']}: needs GLIBC_2.99 from libnew.so (glibc 2.99 > 2.39): f"]
    assert proc.stderr.startswith(f"error: {libs['user']} needs glibc symbol versions the base image's glibc 2.39")
    assert "set glibc= on its row of sources.manifest" in proc.stderr and "Traceback" not in proc.stderr


def test_versions_compare_as_numbers(libs):
    """2.10 is newer than 2.9 (as text it sorts before it); 2.4 is not."""
    proc = check("check-glibc", "--max", "2.9", libs["user"])
    assert proc.returncode == 1
    listed = [line.split(" needs ")[1].split(" ")[0] for line in proc.stdout.splitlines()]
    assert listed == ["GLIBC_2.10", "GLIBC_2.99"]


def test_private_and_named_versions(libs):
    """GLIBC_PRIVATE never passes; GLIBC_ABI_DT_RELR needs glibc 2.36."""
    proc = check("check-glibc", "--max", "2.36", libs["private"])
    assert proc.returncode == 1
    assert proc.stdout.splitlines() == [
        f"{libs['private']}: needs GLIBC_PRIVATE from libnew.so (private to the glibc it was linked against): priv"
    ]
    proc = check("check-glibc", "--max", "2.35", libs["private"])
    assert proc.returncode == 1 and "needs GLIBC_ABI_DT_RELR from libnew.so (glibc 2.36 > 2.35): relr" in proc.stdout


def test_only_glibc_versions_are_checked(libs):
    """libnew.so's own GLIBC_* names are definitions, not needs; libstdc++'s GCC_* needs are not glibc's."""
    proc = check("check-glibc", "--max", "2.0", libs["new"])
    assert proc.returncode == 1 and "GLIBC_2.99" not in proc.stdout and "from libc.so.6" in proc.stdout
    stdcxx = elf.needed_versions(libs["stdcxx"])
    assert any(n.version.startswith("GCC_") for n in stdcxx)
    problems, _ = elf.too_new([libs["stdcxx"]], "99.0")
    assert problems == []


def test_a_library_needing_only_old_versions_passes_up_to_its_newest(libs):
    proc = check("check-glibc", "--max", "2.39", libs["old"], libs["cxx"], libs["bare"])
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == f"{libs['old']}: ok, needs at most GLIBC_2.34 (the base image has glibc 2.39)"
    assert lines[1].startswith(f"{libs['cxx']}: ok, needs at most GLIBC_2.")
    assert lines[2] == f"{libs['bare']}: ok, needs no glibc symbol version (the base image has glibc 2.39)"
    assert proc.stderr == ""
    assert check("check-glibc", "--max", "2.34", libs["old"]).returncode == 0
    proc = check("check-glibc", "--max", "2.33", libs["old"])
    assert proc.returncode == 1
    assert proc.stdout.splitlines() == [
        f"{libs['old']}: needs GLIBC_2.34 from libc.so.6 (glibc 2.34 > 2.33): pthread_create"
    ]


def test_several_files_name_only_the_failing_ones(libs):
    proc = check("check-glibc", "--max", "2.39", libs["old"], libs["user"])
    assert proc.returncode == 1
    assert proc.stdout.splitlines()[0].startswith(f"{libs['user']}: needs GLIBC_2.99")
    assert f"{libs['old']}: ok" in proc.stdout
    assert proc.stderr.startswith(f"error: {libs['user']} needs ")


def corrupt(tmp: Path, name: str, data: bytes) -> Path:
    path = tmp / name
    path.write_bytes(data)
    return path


def test_files_it_cannot_read_are_refused_plainly(libs, tmp_path):
    good = libs["user"].read_bytes()
    shoff = struct.unpack_from("<Q", good, 0x28)[0]
    cases = {
        corrupt(tmp_path, "text", b"#!/bin/sh\necho not a library\n"): "not an ELF file",
        corrupt(tmp_path, "elf32", b"\x7fELF\x01\x01\x01" + bytes(60)): "not a 64-bit little-endian ELF file",
        corrupt(tmp_path, "big-endian", b"\x7fELF\x02\x02\x01" + bytes(60)): "not a 64-bit little-endian ELF file",
        corrupt(tmp_path, "truncated", good[: shoff + 10]): "truncated or corrupt ELF file",
        corrupt(tmp_path, "no-sections", good[:0x28] + bytes(8) + good[0x30:]): "has no section headers",
        tmp_path / "missing.so": "no such file",
        tmp_path: "is a directory",
    }
    for path, message in cases.items():
        with pytest.raises(InvalidInput) as exc:
            elf.needed_versions(path)
        assert exc.value.message.startswith(f"{path}: ") and message in exc.value.message
        proc = check("check-glibc", "--max", "2.39", path)
        assert proc.returncode == 2 and proc.stderr.startswith(f"error: {path}: ") and message in proc.stderr
        assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("value", ["2", "2.39.1", "two.39", "2.", ""])
def test_max_is_major_minor(libs, value):
    proc = check("check-glibc", "--max", value, libs["old"])
    assert proc.returncode == 2
    assert proc.stderr == f"error: glibc version {value!r} is not MAJOR.MINOR (e.g. 2.39)\n"


def test_release_of_a_version_name():
    assert elf.glibc_release("GLIBC_2.38") == (2, 38)
    assert elf.glibc_release("GLIBC_2.2.5") == (2, 2, 5)
    assert elf.glibc_release("GLIBC_ABI_DT_RELR") == (2, 36)
    assert elf.glibc_release("GLIBC_PRIVATE") is None
    assert elf.glibc_release("GLIBC_2") is None
