"""The line's image route on the head, for real: a layout built by nix with pkgs/oci.nix (the
test image flake, with a base docker-archive), loaded into podman with skopeo; a rebuild that
changes one tree keeps every other layer's store path, and loads without reading the layers
podman already has (their blobs are made unreachable, and the load still succeeds, where a
fresh store fails on them)."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from netns_hosts import podman_store, storage_conf
from nix_env import image_flake, image_nix_config
from tp4.core import process
from tp4.image import oci, runtime_cli
from tp4.core.errors import Tp4Error

RUN = ["--ulimit", "nofile=1024:1024", "--ulimit", "nproc=4096:4096", "--network", "none"]


@pytest.fixture
def store(monkeypatch):
    yield from podman_store(monkeypatch, "tp4o-")


def build(flake: Path, work: Path) -> str:
    proc = process.run(
        ["nix", "build", "--json", "--no-link", f"path:{flake}#image"],
        env={"NIX_CONFIG": image_nix_config(work / "nix")},
    )
    return json.loads(proc.stdout)[0]["outputs"]["out"]


def layer_targets(out: str) -> dict[str, str]:
    """diff id -> the store file its blob links to."""
    got = oci.read_layout(out)
    return {d: os.readlink(oci.blob_path(out, d)) for d in got.diff_ids}


def podman(*argv: str) -> str:
    return process.run(["podman", *argv]).stdout


def test_a_layout_loads_runs_and_a_rebuild_reads_only_its_new_layers(tmp_path, store):
    flake = image_flake(tmp_path / "flake", ref="tp4-test:line", label="one", size_mb=1, base_layers_mb=(4,))
    first = build(flake, tmp_path)
    layout = oci.read_layout(first)
    assert runtime_cli.image_kind(first) == "oci"

    ref = runtime_cli.load(first, "podman")
    assert ref == f"localhost/{layout.ref}"
    image_id, labels = runtime_cli.inspect("podman", ref)
    assert image_id == layout.config.digest.removeprefix("sha256:")
    assert labels["tp4.flake.rev"] == "one"
    assert runtime_cli.layers("podman", ref) == layout.diff_ids
    # the links put each tree where it belongs, and the base's Env stays under the image's own
    out = podman(
        "run",
        "--rm",
        *RUN,
        "--entrypoint",
        "/bin/sh",
        ref,
        "-c",
        "cat /opt/data/label; sh /opt/dsv41/tests/test_pass.py; echo base=$TP4_TEST_BASE path=$PATH",
    )
    assert out.split() == ["one", "checking", "something", "3/3", "PASS", "base=1", "path=/bin"]

    # a rebuild that changes the data tree: the base, tools and runtime layers are the same
    # store paths (nix kept them); only the data layer and the links are new
    image_flake(flake, ref="tp4-test:line", label="two", size_mb=1, base_layers_mb=(4,))
    second = build(flake, tmp_path)
    old, new = layer_targets(first), layer_targets(second)
    kept = [d for d in new if d in old]
    assert len(kept) == len(new) - 2 and all(new[d] == old[d] for d in kept)
    assert list(new)[: len(kept)] == kept

    # the rebuild loads with the blobs of the layers podman has made unreachable: skopeo skips
    # them by digest without opening them
    blind = tmp_path / "blind"
    shutil.copytree(second, blind, symlinks=True)
    for d in kept:
        link = oci.blob_path(blind, d)
        os.unlink(link)
        os.symlink(f"/nonexistent/{d}", link)
    ref2 = runtime_cli.load(str(blind), "podman")
    image_id2, labels2 = runtime_cli.inspect("podman", ref2)
    assert image_id2 == oci.read_layout(second).config.digest.removeprefix("sha256:") != image_id
    assert labels2["tp4.flake.rev"] == "two"
    assert podman("run", "--rm", *RUN, "--entrypoint", "/bin/sh", ref2, "-c", "cat /opt/data/label").strip() == "two"

    # a store without those layers does need them: the same copy fails there, naming the blob
    other = Path(tempfile.mkdtemp(prefix="tp4o-", dir="/tmp"))
    try:
        os.environ["CONTAINERS_STORAGE_CONF"] = str(storage_conf(other))
        with pytest.raises(Tp4Error, match="reading blob sha256:") as err:
            runtime_cli.load(str(blind), "podman")
        assert err.value.message.split("reading blob ")[1][:71] in kept
    finally:
        os.environ["CONTAINERS_STORAGE_CONF"] = str(store / "storage.conf")
        shutil.rmtree(other, ignore_errors=True)


def test_a_real_docker_archive_from_skopeo_splits_into_its_layers(tmp_path, store):
    """The base step reads what skopeo's docker-archive writer (dockerTools.pullImage) writes."""
    flake = image_flake(tmp_path / "flake", ref="tp4-test:line", label="arch", size_mb=1, base_layers_mb=(1, 1))
    ref = runtime_cli.load(build(flake, tmp_path), "podman")
    archive = tmp_path / "image.tar"
    process.run(["skopeo", "copy", "--quiet", f"containers-storage:{ref}", f"docker-archive:{archive}:base:1"])
    blobs = oci.base_layers(str(archive), tmp_path / "out")
    assert tuple(b.digest for b in blobs) == runtime_cli.layers("podman", ref)
