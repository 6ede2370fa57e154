"""tp4.image.nix before nix runs: the Nix version a flake needs, and inputs that cannot be fetched offline."""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path

import pytest

from nix_env import flake_copy, image_flake, nix_config
from tp4.core import process
from tp4.image import nix
from tp4.core.errors import Tp4Error
from tp4.image.sources import nar


def fake_nix(bin_dir: Path, version: str) -> Path:
    """A `nix` that reports ``version`` and logs every other call (which must not happen)."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    path = bin_dir / "nix"
    path.write_text(
        f'#!/bin/sh\n[ "$1" = --version ] && {{ echo "nix (Nix) {version}"; exit 0; }}\n'
        f'echo "$*" >> {bin_dir}/calls; exit 99\n'
    )
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def test_the_line_flake_needs_nix_2_18_and_says_what_to_install(repo):
    with pytest.raises(Tp4Error) as info:
        nix.require(repo)  # Debian 12's Nix 2.8 is what this machine has
    text = str(info.value)
    assert "is too old" in text and "Nix >= 2.18" in text and "lib/minfeatures.nix" in text
    assert "install Nix 2.18 or newer" in text


def test_a_flake_without_nixpkgs_needs_only_flakes(tmp_path):
    assert nix.required_version(image_flake(tmp_path / "f")) == (nix.MIN_VERSION, nix.WHY_MIN_VERSION)
    assert nix.require(image_flake(tmp_path / "f")) >= (2, 4)


def test_inputs_that_cannot_be_fetched_fail_at_once_naming_the_host(repo, tmp_path, monkeypatch):
    copy = flake_copy(repo, tmp_path / "flake")
    shim = fake_nix(tmp_path / "bin", "2.24.9")
    monkeypatch.setenv("PATH", f"{shim.parent}:{os.environ['PATH']}")
    with pytest.raises(Tp4Error) as info:
        nix.require(copy)
    text = str(info.value)
    assert "cannot resolve api.github.com" in text and "offline" in text
    assert "nixos-dgx-spark, nixpkgs from api.github.com" in text
    assert not (shim.parent / "calls").exists()  # nix itself was never asked to fetch


def test_inputs_in_the_store_are_not_looked_up(tmp_path):
    tree = tmp_path / "src"
    tree.mkdir()
    (tree / "x").write_text(os.urandom(8).hex())
    digest = nar.nar_sha256(tree)
    added = process.run(
        ["nix", "store", "add-path", "--name", "source", str(tree)], env={"NIX_CONFIG": nix_config(tmp_path / "cfg")}
    ).stdout.strip()
    assert added == nar.store_path("source", digest)

    def lock(nar_hash: str) -> Path:
        flake = tmp_path / f"f-{bytes.hex(nar_hash.encode())[-12:]}"  # an SRI hash may hold a '/'
        flake.mkdir()
        node = {
            "locked": {
                "type": "github",
                "host": "tp4-offline.invalid",
                "owner": "o",
                "repo": "r",
                "rev": "a" * 40,
                "narHash": nar_hash,
            },
            "original": {"type": "github", "owner": "o", "repo": "r"},
        }
        (flake / "flake.lock").write_text(
            json.dumps({"nodes": {"dep": node, "root": {"inputs": {"dep": "dep"}}}, "root": "root", "version": 7})
        )
        return flake

    nix.check_fetchable(lock(nar.sri(digest)))  # present: no lookup of the unresolvable host
    with pytest.raises(Tp4Error, match=r"\(dep from tp4-offline.invalid\): cannot resolve tp4-offline.invalid"):
        nix.check_fetchable(lock(nar.sri(bytes(32))))


def test_a_broken_lock_file_is_a_user_error(tmp_path):
    (tmp_path / "flake.lock").write_text("{ not json")
    with pytest.raises(Tp4Error) as info:
        nix.locked_inputs(tmp_path)
    assert info.value.exit_code == 2 and "nix flake lock" in str(info.value)


def test_missing_nix_names_the_version_the_line_needs(repo, tmp_path, monkeypatch):
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    assert shutil.which("nix") is None
    with pytest.raises(Tp4Error, match=r"nix is not installed: tp4 build needs Nix >= 2.18"):
        nix.require(repo)


def test_build_dry_run_offline_says_so_before_nix_fetches(repo, tmp_path, monkeypatch, tp4_cli):
    copy = flake_copy(repo, tmp_path / "flake")
    shim = fake_nix(tmp_path / "bin", "2.24.9")
    monkeypatch.setenv("PATH", f"{shim.parent}:{os.environ['PATH']}")
    code, _, err = tp4_cli("build", "--dry-run", "--system", "aarch64-linux", "--flake", copy, "--runtime", "podman")
    assert code == 1 and "cannot resolve api.github.com" in err and "looks offline" in err
    assert not (shim.parent / "calls").exists()
    monkeypatch.setenv("PATH", os.environ["PATH"].split(":", 1)[1])  # the machine's Nix 2.8
    code, _, err = tp4_cli("build", "--dry-run", "--flake", copy, "--runtime", "podman")
    assert code == 1 and "nix 2.8" in err and "Nix >= 2.18" in err and "Traceback" not in err
