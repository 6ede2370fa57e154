"""`tp4 build` reads the base image before it builds anything on it (tp4/image/baseimage.py).

Real podman: a tiny base (Debian's python3 with its libc, the host's getconf, site-packages with
torch and an older sglang-kernel, and optionally a gcc and the verbs header and library) under an
image made by pkgs/oci.nix, whose baseFacts are a row's attributes. When the base bears them out
the build goes on; when one differs, the build stops naming the attribute and the fix, and nothing
but the base has been built.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest

from nix_env import image_flake
from test_build import commands, env, line_id  # noqa: F401  (env and commands are fixtures)
from test_image_site_packages import base_archive
from tp4.image import baseimage
from tp4.core.errors import Tp4Error

HOST_GLIBC = os.confstr("CS_GNU_LIBC_VERSION").split()[-1]  # what the copied libc is
DEBIAN_PYTHON = subprocess.run(
    ["/usr/bin/python3", "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
    capture_output=True,
    text=True,
    check=True,
).stdout.strip()
ROW = {
    "arch": "arm64",
    "glibc": HOST_GLIBC,
    "python": DEBIAN_PYTHON,
    "gcc": "13",
    "verbs": "yes",
    "packages": "torch==2.9.0,sglang-kernel",
    "size": "~1MB",
}


def toolchain(tmp: Path, *, gcc: bool = True, verbs: bool = True) -> dict[str, Path | bytes | str]:
    """getconf (glibc's own, against the base's libc); a gcc that says 13.2.0; verbs.h and libibverbs.so."""
    files: dict[str, Path | bytes | str] = {"/usr/bin/getconf": Path("/usr/bin/getconf").resolve()}
    if gcc:
        stub = tmp / "gcc"
        stub.write_text("#!/bin/sh\necho 13.2.0\n")
        stub.chmod(0o755)
        files["/usr/bin/gcc"] = stub
    if verbs:
        files["/usr/include/infiniband/verbs.h"] = b"/* verbs */\n"
        files["/usr/lib/aarch64-linux-gnu/libibverbs.so"] = "libibverbs.so.1"
        files["/usr/lib/aarch64-linux-gnu/libibverbs.so.1"] = b""
    return files


@pytest.mark.parametrize("case", ["as-the-row-says", "older-glibc-in-the-row", "no-gcc-no-verbs"])
def test_build_reads_the_base_first_and_stops_on_a_difference(env, tp4_cli, commands, case):  # noqa: F811
    bare = case == "no-gcc-no-verbs"
    archive = base_archive(env, toolchain(env, gcc=not bare, verbs=not bare))
    attrs = dict(ROW, glibc="2.39" if case == "older-glibc-in-the-row" and HOST_GLIBC != "2.39" else ROW["glibc"])
    if case == "older-glibc-in-the-row" and HOST_GLIBC == "2.39":
        attrs["glibc"] = "2.35"
    flake = image_flake(
        env / "flake",
        ref="tp4-test:line",
        label=f"probe-{case}-{os.urandom(4).hex()}",
        checks="",
        base_archive=archive,
        base_facts={"row": "base-image", "attrs": attrs},
    )

    code, stdout, stderr = tp4_cli("build", "--flake", flake, "--runtime", "podman")

    assert "reading the base image " in stderr, stdout + stderr
    reading = stderr.index("reading the base image ")
    # one throwaway container without network, the one constant script, through tp4's funnel
    probes = [c for c in commands() if c.startswith("$ podman run ") and "tp4-base-probe-" in c]
    assert len(probes) == 1
    assert probes[0].startswith(
        f"$ podman run --rm --network none --name tp4-base-probe-{os.getpid()} --entrypoint /bin/sh "
    )
    if case == "as-the-row-says":
        assert code == 0, stderr
        said = f"base image: glibc {HOST_GLIBC}, Python {DEBIAN_PYTHON}."
        assert said in stderr and "gcc 13.2.0, verbs yes" in stderr and "as its row says" in stderr
        # the base was read before anything was built on it
        assert reading < stderr.index("-tp4-test-layer-")
        assert line_id() is not None
        return
    assert code == 1
    assert "the base image differs from its row 'base-image' of sources.manifest" in stderr
    assert "so nothing was built on it" in stderr and "Traceback" not in stderr
    # nothing but the base: no layer, no image
    assert "-tp4-test-layer-" not in stderr[reading:] and not (flake / "result-image").exists()
    assert line_id() is None
    if case == "older-glibc-in-the-row":
        assert (
            f"  glibc={attrs['glibc']}: the base has glibc {HOST_GLIBC} (glibc {HOST_GLIBC}); fix: set it on the row "
            "'base-image' of sources.manifest" in stderr
        )
        assert "python=" not in stderr and "gcc=" not in stderr and "verbs=" not in stderr
    else:
        assert "  gcc=13: the base has no gcc; b12x's RoCE proxy compiles itself with gcc at first use" in stderr
        assert (
            "  verbs=yes: the base lacks /usr/include/infiniband/verbs.h and libibverbs.so (what -libverbs links)"
            in stderr
        )
        assert "glibc=" not in stderr


def test_the_probe_output_is_compared_attribute_by_attribute():
    out = (
        "glibc=ldd (Ubuntu GLIBC 2.39-0ubuntu8.4) 2.39\ngcc=13.3.0\nverbs.h=/usr/include/infiniband/verbs.h\n"
        "libibverbs.so=/usr/lib/aarch64-linux-gnu/libibverbs.so\npython=3.12.3\npackage=torch==2.9.1\n"
        "package=flashinfer_python==0.6.18\nend=1\n"
    )
    facts = baseimage.parse(out)
    assert (facts.glibc, facts.python, facts.gcc) == ("2.39", "3.12.3", "13.3.0")
    row = {
        "glibc": "2.39",
        "python": "3.12",
        "gcc": "13",
        "verbs": "yes",
        "packages": "torch,flashinfer-python==0.6.18",
    }
    assert baseimage.differences(facts, "base-image", row) == []
    bad = baseimage.differences(
        facts, "base-image", dict(row, python="3.11", gcc="13.2", packages="torch==2.8.0,triton")
    )
    assert [p.split(":")[0] for p in bad] == [
        "python=3.11",
        "gcc=13.2",
        "packages=...torch==2.8.0...",
        "packages=...triton...",
    ]
    assert "the base holds torch 2.9.1" in bad[2] and "the base holds no triton" in bad[3]
    with pytest.raises(Tp4Error, match="stopped before it finished"):
        baseimage.parse("glibc=2.39\n")


def test_dry_run_shows_the_base_read_first(env, tp4_cli):  # noqa: F811
    flake = image_flake(
        env / "flake",
        ref="tp4-test:line",
        label=f"probe-dry-{os.urandom(4).hex()}",
        checks="",
        base_archive=base_archive(env),
        base_facts={"row": "base-image", "attrs": ROW},
    )
    code, stdout, stderr = tp4_cli("build", "--dry-run", "--flake", flake, "--runtime", "podman")
    assert code == 0, stderr
    lines = stdout.splitlines()
    base = next(i for i, line in enumerate(lines) if f"build {shlex.quote(f'{flake}#image.base')} --json" in line)
    probe = next(i for i, line in enumerate(lines) if "--name 'tp4-base-probe-<pid>' --entrypoint /bin/sh" in line)
    image = next(i for i, line in enumerate(lines) if f"build {shlex.quote(f'{flake}#image')} --json" in line)
    assert base < probe < image
    assert "podman run --rm --network none" in lines[probe]
    assert not (flake / "result-image-base").exists()


IMAGE_ROW = (
    "img  sha256:"
    + "3" * 64
    + "  "
    + "a" * 64
    + "  docker://lmsysorg/sglang:dev-dsv41@sha256:"
    + "3" * 64
    + "\n    arch=arm64  glibc=2.39"
)


@pytest.mark.parametrize(
    ("attrs", "error"),
    [
        ("  python=3.12  gcc=13  verbs=yes  packages=torch,flashinfer-python==0.6.18", None),
        ("  python=3", "python= is MAJOR.MINOR"),
        ("  gcc=thirteen", "gcc= is the image's gcc version"),
        ("  verbs=maybe", "verbs= is yes"),
        ("  packages=torch,,x", "packages= is a comma-separated list"),
    ],
)
def test_the_base_rows_attributes_are_validated(attrs, error):
    from tp4.image.sources import manifest as mf

    errors = mf.validate(mf.parse(IMAGE_ROW + attrs + "\n")).errors
    assert errors == [] if error is None else (len(errors) == 1 and error in errors[0]), errors


def test_the_committed_base_row_states_what_the_build_relies_on():
    from tp4.image.sources import manifest as mf

    row = mf.load(Path(__file__).resolve().parent.parent / "sources.manifest").by_name["base-image"]
    assert {k: row.attrs[k] for k in baseimage.ATTRS} == {
        "glibc": "2.39",
        "python": "3.12",
        "gcc": "13",
        "verbs": "yes",
        "packages": "torch,flashinfer-python==0.6.18",
    }
