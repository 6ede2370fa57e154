"""pkgs/wheels.nix builds for real, wired as the flake wires it (pkgs/default.nix).

The wheels are small real ones, fetched like nixpkgs' fetchPypi fetches them: the URL ends in
the wheel's file name and the store path is named after it (`<hash>-<file name>`). pkgs/ gets
tests/host-pkgs.nix for nixpkgs (busybox sh as runCommand, the test's Python, which has the
`installer` nixpkgs uses), so the build runs with `--option sandbox false`.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import sys
import zipfile
from pathlib import Path

from nix_env import busybox_dir, nix_config
from sources_helpers.build import sha256
from tp4.core import process
from tp4.image.sources import companion

REPO = Path(__file__).resolve().parent.parent
ARCH = os.uname().machine
# (manifest row, distribution, version, tag): spelt like the manifest's two wheels
WHEELS = [
    ("demo-kernel", "demo_kernel", "0.4.7", f"cp310-abi3-manylinux2014_{ARCH}"),
    ("demo-deep-gemm", "demo_deep_gemm", "0.2.0", f"py3-none-manylinux2014_{ARCH}"),
]


def wheel(dist: str, version: str, tag: str) -> tuple[str, bytes]:
    """A wheel with one module and the dist-info installer checks (WHEEL, METADATA, RECORD)."""
    info = f"{dist}-{version}.dist-info"
    files = {
        f"{dist}/__init__.py": f"VERSION = {version!r}\n".encode(),
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {dist.replace('_', '-')}\nVersion: {version}\n".encode(),
        f"{info}/WHEEL": f"Wheel-Version: 1.0\nGenerator: tp4-tests\nRoot-Is-Purelib: false\nTag: {tag}\n".encode(),
    }
    record = [
        f"{p},sha256={base64.urlsafe_b64encode(hashlib.sha256(d).digest()).rstrip(b'=').decode()},{len(d)}"
        for p, d in files.items()
    ] + [f"{info}/RECORD,,"]
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for path, data in {**files, f"{info}/RECORD": "\n".join(record).encode() + b"\n"}.items():
            z.writestr(path, data)
    return f"{dist}-{version}-{tag}.whl", buf.getvalue()


def write_root(tmp: Path) -> tuple[Path, dict[str, str]]:
    """A repository root whose manifest has the two wheel rows, and the mirror they come from."""
    root, mirror, files = tmp / "root", tmp / "mirror", {}
    mirror.mkdir(parents=True)
    rows = []
    for row, dist, version, tag in WHEELS:
        name, data = wheel(dist, version, tag)
        (mirror / name).write_bytes(data)
        files[row] = name
        rows.append(f"{row}  {version}  {sha256(data)}  pypi:{name}")
    text = "\n".join(rows) + "\n"
    # where pkgs/default.nix reads it, and the repository's link
    for rel in ("python/tp4/data/sources.manifest", "sources.manifest"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        companion.write(root / rel, text)  # with the JSON copy pkgs/sources.nix reads
    return root, files


def expr(tmp: Path, root: Path, bb: Path) -> str:
    venv = Path(sys.executable).parent.parent
    return f"""
      let
        # nixpkgs' fetchPypi for a wheel: its URL ends in the file name, fetchurl names the store
        # path after it; only the host differs
        fetchPypi =
          {{ pname, version, format, sha256, dist, python, abi, platform }}:
          builtins.fetchurl {{
            url = "file://{tmp}/mirror/${{pname}}-${{version}}-${{python}}-${{abi}}-${{platform}}.whl";
            inherit sha256;
          }};
        pkgs = import {REPO}/tests/host-pkgs.nix {{
          busybox = {bb};
          python = "{venv}";
          extra.python3Packages = {{ inherit fetchPypi; }};
        }};
        line = import {REPO}/pkgs/default.nix {{ inherit pkgs; root = {root}; }};
      in
      line"""


def test_wheels_install_from_their_store_paths(tmp_path):
    root, files = write_root(tmp_path)
    bb = busybox_dir(tmp_path / "bb")
    env = {"NIX_CONFIG": nix_config(tmp_path / "nix")}
    built = process.run(
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
            expr(tmp_path, root, bb),
            "-A",
            "wheels",
        ],
        env=env,
        check=False,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    out = Path(built.stdout.strip().splitlines()[-1])
    for _, dist, version, _ in WHEELS:
        assert (out / dist / "__init__.py").read_text() == f"VERSION = {version!r}\n"
        assert (out / f"{dist}-{version}.dist-info" / "RECORD").exists()
    # what it installed from was named as nixpkgs names a fetched wheel, not as the wheel
    fetched = process.run(
        [
            "nix-instantiate",
            "--eval",
            "--strict",
            "--json",
            "-E",
            f"map (w: baseNameOf w.src) ({expr(tmp_path, root, bb)}).wheels.wheels",
        ],
        env=env,
        check=False,
    )
    assert fetched.returncode == 0, fetched.stderr[-2000:]
    names = json.loads(fetched.stdout)
    assert [n[33:] for n in names] == [files[row] for row, *_ in WHEELS]
    assert all(n[32] == "-" for n in names)
