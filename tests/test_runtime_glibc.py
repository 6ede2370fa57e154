"""tp4-runtime refuses a librow_store.so that needs a newer glibc than the base image's.

* the base image's glibc is data of its row of sources.manifest (`glibc=MAJOR.MINOR`, required);
* the flake passes that value to pkgs/runtime.nix, whose build runs `python3 -m tp4.image.elf
  check-glibc` on the library (evaluated against the nixpkgs stand-in);
* pkgs/runtime.nix's build phase runs for real: a stand-in stdenv (busybox sh as builder, the
  host's g++ as $CXX, the test's python3, `--option sandbox false` as in test_flake_transforms)
  compiles a row_store.cpp with upstream's flags and the check passes or fails the build.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest

from nix_env import busybox_dir, empty_flake, locked_flake_copy, nix, nix_config, stub_inputs
from tp4.core import process
from tp4.image import elf
from tp4.image.sources import companion
from tp4.image.sources import manifest as mf

REPO = Path(__file__).resolve().parent.parent
DIGEST = "sha256:" + "3" * 64
IMAGE_ROW = f"img  {DIGEST}  {'a' * 64}  docker://lmsysorg/sglang:dev-dsv41@{DIGEST}\n    arch=arm64"


# --- the manifest ---------------------------------------------------------------------------------


def test_the_base_image_row_states_its_glibc(repo):
    row = mf.load(repo / "sources.manifest").by_name["base-image"]
    assert row.attrs["glibc"] == "2.39"
    assert mf.validate(mf.load(repo / "sources.manifest")).errors == []


@pytest.mark.parametrize(
    ("attrs", "error"),
    [
        ("", "needs glibc=MAJOR.MINOR"),
        (" glibc=2.39.1", "needs glibc=MAJOR.MINOR"),
        (" glibc=2.x", "needs glibc=MAJOR.MINOR"),
        (" glibc=2.39", None),
    ],
)
def test_an_image_row_needs_glibc_major_minor(attrs, error):
    errors = mf.validate(mf.parse(IMAGE_ROW + attrs + "\n")).errors
    if error is None:
        assert errors == []
    else:
        assert len(errors) == 1 and error in errors[0] and "row 'img' (line 1)" in errors[0], errors


def test_glibc_is_an_attribute_of_image_rows_only():
    row = "x  " + "a" * 40 + "  " + "b" * 64 + "  https://github.com/o/r/archive/" + "a" * 40 + ".tar.gz  glibc=2.39"
    errors = mf.validate(mf.parse(row)).errors
    assert len(errors) == 1 and "unknown attribute 'glibc'" in errors[0]


# --- the flake, against the nixpkgs stand-in ------------------------------------------------------


RUNTIME = "r: { inherit (r.stub.args) buildPhase; }"


def evaluate(work: Path, flake: Path, *, ok: bool = True):
    argv = [
        "eval",
        "--json",
        f"path:{flake}#packages.aarch64-linux.tp4-runtime",
        *stub_inputs(REPO, empty_flake(work / "empty")),
        "--apply",
        RUNTIME,
    ]
    proc = nix(argv, work)
    assert (proc.returncode == 0) == ok, proc.stderr
    return json.loads(proc.stdout) if ok else proc.stderr


def flake_with_base_attrs(work: Path, name: str, attrs: str) -> Path:
    flake = locked_flake_copy(REPO, work / name)
    manifest = (flake / "sources.manifest").resolve()
    text, n = re.subn(r"(?m)^    arch=arm64  glibc=2\.39(?=  |$)", f"    {attrs}", manifest.read_text())
    assert n == 1
    companion.write(manifest, text)  # and the JSON copy Nix reads
    return flake


CHECK = re.compile(
    r"PYTHONPATH=(/nix/store/[a-z0-9]{32}-tp4-elf)/python PYTHONDONTWRITEBYTECODE=1 (\S+) -m tp4\.image\.elf"
    r" \\\n\s+check-glibc --max ([0-9.]+) adapter/librow_store\.so\n"
)  # a version is a safe word: unquoted


def test_the_build_checks_the_library_against_the_manifests_glibc(tmp_path):
    rt = evaluate(tmp_path, locked_flake_copy(REPO, tmp_path / "locked"))
    m = CHECK.search(rt["buildPhase"])
    assert m, rt["buildPhase"]
    pick, python, glibc = m.groups()
    assert glibc == mf.load(REPO / "sources.manifest").by_name["base-image"].attrs["glibc"]
    assert python.endswith("-python3-3.14.6/bin/python3")
    # after the compile and patchelf, so it checks the file that goes into the image
    assert rt["buildPhase"].index("patchelf --remove-rpath") < m.start()
    files = sorted(str(p.relative_to(pick)) for p in Path(pick).rglob("*") if p.is_file())
    assert files == [
        "python/tp4/__init__.py",
        "python/tp4/core/__init__.py",
        "python/tp4/core/errors.py",
        "python/tp4/image/__init__.py",
        "python/tp4/image/elf.py",
    ]

    other = evaluate(tmp_path, flake_with_base_attrs(tmp_path, "older", "arch=arm64  glibc=2.17"))
    assert CHECK.search(other["buildPhase"])[3] == "2.17"


def test_a_base_row_without_glibc_is_refused_at_evaluation(tmp_path):
    err = evaluate(tmp_path, flake_with_base_attrs(tmp_path, "none", "arch=arm64"), ok=False)
    assert "the base image's row 'base-image' needs glibc=MAJOR.MINOR" in err


# --- pkgs/runtime.nix's build phase, for real -----------------------------------------------------


ROW_STORE = r"""#include <cstdlib>
#include <pthread.h>

static void *work(void *arg) { return arg; }

extern "C" long row_store_parse(const char *s) {
  pthread_t t;
  if (pthread_create(&t, nullptr, work, nullptr) != 0) return -1;
  pthread_join(t, nullptr);
  return std::strtol(s, nullptr, 10);
}
"""

# the host has no patchelf: a stand-in that accepts only the call runtime.nix makes
PATCHELF = """#!/bin/sh
[ "$#" = 2 ] && [ "$1" = --remove-rpath ] && [ -f "$2" ] || { echo "patchelf stand-in: unexpected $*" >&2; exit 1; }
"""


def runtime_expr(tmp: Path, glibc: str) -> str:
    bb = busybox_dir(tmp / "bb")
    (tmp / "patchelf" / "bin").mkdir(parents=True, exist_ok=True)
    (tmp / "patchelf" / "bin" / "patchelf").write_text(PATCHELF)
    (tmp / "patchelf" / "bin" / "patchelf").chmod(0o755)
    (tmp / "tree" / "adapter").mkdir(parents=True, exist_ok=True)
    (tmp / "tree" / "adapter" / "row_store.cpp").write_text(ROW_STORE)
    (tmp / "tree" / "boot.py").write_text("print('boot')\n")
    tools = ":".join([f"{bb}/bin", os.path.dirname(sys.executable), "/usr/bin", "/bin"])
    return f"""
      let
        bb = {bb};
        lib = import {REPO}/tests/nixpkgs-stub/lib.nix;
        pkgs = {{
          inherit lib;
          patchelf = {tmp}/patchelf;
          python3.interpreter = "{sys.executable}";
          stdenv.mkDerivation = a: derivation {{
            name = "${{a.pname}}-${{a.version}}";
            system = builtins.currentSystem;
            builder = "${{bb}}/bin/busybox";
            args = [ "sh" "-euc" ''
              runHook() {{ :; }}
              cp -r "$src"/. . && chmod -R u+w .
              eval "$buildPhase"
              eval "$installPhase"
            '' ];
            PATH = "${{lib.makeBinPath a.nativeBuildInputs}}:{tools}";
            CXX = "g++";
            inherit (a) src buildPhase installPhase allowedReferences;
          }};
        }};
      in import {REPO}/pkgs/runtime.nix {{
        inherit pkgs;
        src = import {REPO}/pkgs/src.nix {{ root = {REPO}; }};
        tree = builtins.path {{ path = {tmp}/tree; name = "runtime-tree"; }};
        version = "test";
        glibc = "{glibc}";
      }}"""


def build(tmp: Path, glibc: str):
    return process.run(
        [
            "nix-build",
            "--no-out-link",
            "--option",
            "sandbox",
            "false",
            "--option",
            "build-users-group",
            "",
            "-E",
            runtime_expr(tmp, glibc),
        ],
        env={"NIX_CONFIG": nix_config(tmp / "nix")},
        check=False,
    )


def test_a_library_the_base_images_glibc_can_load_is_built(tmp_path):
    proc = build(tmp_path, "2.39")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = Path(proc.stdout.strip().splitlines()[-1])
    lib = out / "adapter" / "librow_store.so"
    assert (out / "boot.py").read_text() == "print('boot')\n"
    needs = {n.version: n.symbols for n in elf.needed_versions(lib) if n.library == "libc.so.6"}
    # what the failing build below relies on: the host's glibc (>= 2.34) gave pthread_create@GLIBC_2.34
    assert "pthread_create" in needs.get("GLIBC_2.34", ()), needs
    assert not any(n.library.startswith("libstdc++") for n in elf.needed_versions(lib))


def test_a_library_needing_a_newer_glibc_fails_the_build(tmp_path):
    proc = build(tmp_path, "2.33")
    assert proc.returncode != 0
    assert re.search(
        r"adapter/librow_store\.so: needs GLIBC_2\.34 from libc\.so\.6 \(glibc 2\.34 > 2\.33\): "
        r"[a-z_, ]*pthread_create",
        proc.stderr,
    ), proc.stderr[-3000:]
    assert "error: adapter/librow_store.so needs glibc symbol versions the base image's glibc 2.33" in proc.stderr
    assert "Traceback" not in proc.stderr
