"""The transform derivation script runs for real, on generated sources.

The derivation is built from the same pieces the flake uses: pkgs/sources.nix (with a builtins
fetchurl reading file:// copies of the https URLs), pkgs/src.nix's `transforms` source,
pkgs/transform.nix's script; only the wrapper differs (busybox sh as builder instead of
runCommand, and the test's python3 and GNU patch on PATH). That wrapper needs the host's tools,
so the build runs with `--option sandbox false` (a sandboxed build sees only the store) and
without build users (`build-users-group =`: the test's python may live under /root).
The tree it produces must be the one `tp4 sources fetch` produces from the same inputs.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from nix_env import busybox_dir, nix_config
from sources_helpers.build import b12x_next_patches, b12x_sources, sha256, tar_gz
from tp4.core import process
from tp4.image.sources import companion, nar

REPO = Path(__file__).resolve().parent.parent
COMMIT = "a7d7d29b2ef8869086e0ceaa787321f17544e3c9"
PATCHES_AT = "5" * 40


def write_sources(tmp: Path) -> Path:
    """A mirror of three https URLs (an archive and two -p0 patches) and a manifest naming them."""
    files = {
        f"github.com/example/b12x/archive/{COMMIT}.tar.gz": tar_gz(b12x_sources()),
        **{f"raw.example/{PATCHES_AT}/p{i}.patch": p.encode() for i, p in enumerate(b12x_next_patches())},
    }
    for rel, data in files.items():
        (tmp / "mirror" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp / "mirror" / rel).write_bytes(data)
    rows = [f"b12x-main  {COMMIT}  {sha256(files[next(iter(files))])}  https://{next(iter(files))}\n    strip=1"]
    for i, p in enumerate(b12x_next_patches()):
        rows.append(
            f"patch-{i}  {PATCHES_AT}  {sha256(p.encode())}  https://raw.example/{PATCHES_AT}/p{i}.patch\n    p=0"
        )
    rows.append(
        "tree b12x-next  from=b12x-main  require=b12x,LICENSE  keep=b12x,LICENSE  rename=b12x:b12x_next\n"
        "    patches=patch-0,patch-1  drop=b12x_next/sequence/engram  stamp=b12x_next"
    )
    manifest = tmp / "sources.manifest"
    companion.write(manifest, "\n".join(rows) + "\n")  # with the JSON copy pkgs/sources.nix reads
    return manifest


def derivation_expr(tmp: Path, manifest: Path, bb: Path) -> str:
    tools = ":".join([f"{bb}/bin", os.path.dirname(sys.executable), "/usr/bin", "/bin"])
    return f"""
      let
        mirror = url: "file://{tmp}/mirror/" + builtins.substring 8 (-1) url;
        fetchurl = {{ url, sha256, name }}: builtins.fetchurl {{ url = mirror url; inherit sha256 name; }};
        sources = import {REPO}/pkgs/sources.nix {{ manifest = {manifest}; inherit fetchurl; }};
        transforms = (import {REPO}/pkgs/src.nix {{ root = {REPO}; }}).transforms;
        script = import {REPO}/pkgs/transform.nix {{ target = "b12x-next"; fetchArgs = sources.fetchArgs.b12x-next; }};
      in derivation {{
        name = "b12x-next";
        system = builtins.currentSystem;
        builder = "${{{bb}}}/bin/busybox";
        args = [ "sh" "-c" script ];
        PATH = "{tools}";
        PYTHONPATH = "${{transforms}}/python";
      }}"""


def test_transform_derivation_builds_the_same_tree_as_the_cli(tmp_path, tp4_cli):
    manifest = write_sources(tmp_path)
    bb = busybox_dir(tmp_path / "bb")
    proc = process.run(
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
            derivation_expr(tmp_path, manifest, bb),
        ],
        env={"NIX_CONFIG": nix_config(tmp_path / "nix")},
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = Path(proc.stdout.strip().splitlines()[-1])

    assert (out / "b12x_next" / "__init__.py").read_text().startswith('"""b12x_next: kernels.')
    assert "if n == 576" in (out / "b12x_next" / "moe" / "plan.py").read_text()
    assert (out / "b12x_next" / "SOURCE_COMMIT").read_text().strip() == COMMIT
    assert not (out / "b12x_next" / "sequence" / "engram").exists()
    assert (out / "LICENSE").exists()

    inputs = [f"b12x-main={tmp_path}/mirror/github.com/example/b12x/archive/{COMMIT}.tar.gz"]
    inputs += [f"patch-{i}={tmp_path}/mirror/raw.example/{PATCHES_AT}/p{i}.patch" for i in range(2)]
    args = ["sources", "fetch", "b12x-next", "--manifest", manifest, "--to", tmp_path / "cli", "--offline", "-q"]
    for value in inputs:
        args += ["--input", value]
    code, _, err = tp4_cli(*args)
    assert code == 0, err
    assert nar.nar_hash(out) == nar.nar_hash(tmp_path / "cli")
