"""The head's route with docker (DGX OS's runtime), against a real dockerd of its own: `tp4 build
--runtime docker` loads the layout through the head's image store and `docker pull` (docker's
daemon takes only whole archives), runs the in-image checks in docker, tags the line and pushes
it; a rebuild pulls only its new layers; without the store, docker gets the whole image through
its daemon and a warning says so."""

from __future__ import annotations

import os

import pytest

from dockerd import Dockerd
from nix_env import image_flake, image_nix_config
from tp4.core import process
from tp4.image import build, imagestore, oci, runtime_cli

REF = "tp4-test:docker"
PASS = '[[image_check]]\nname = "pass"\nfile = "tests/test_pass.py"\n'


@pytest.fixture(scope="module")
def daemon():
    with Dockerd() as d:
        yield d


@pytest.fixture
def docker(daemon, monkeypatch, tmp_path):
    monkeypatch.setenv("DOCKER_HOST", daemon.host)
    monkeypatch.setenv("NIX_CONFIG", image_nix_config(tmp_path / "nix"))
    yield daemon
    ids = process.run(["docker", "images", "-q"], check=False).stdout.split()
    if ids:
        process.run(["docker", "rmi", "-f", *sorted(set(ids))], check=False)


def docker_cmd(*argv: str) -> str:
    return process.run(["docker", *argv]).stdout


def test_docker_build_loads_through_the_store_and_a_rebuild_pulls_only_new_layers(docker, tmp_path, tp4_cli):
    flake = image_flake(tmp_path / "flake", ref=REF, label="d1", size_mb=1, base_layers_mb=(4,), checks=PASS)
    code, out, err = tp4_cli("build", "--flake", flake, "--runtime", "docker")
    assert code == 0, err
    layout = oci.read_layout(os.path.realpath(flake / "result-image"))
    image_id, labels = runtime_cli.inspect("docker", REF)
    # docker's image id is the layout's config digest, its layers the layout's
    assert image_id == layout.config.digest.removeprefix("sha256:")
    assert runtime_cli.layers("docker", REF) == layout.diff_ids
    assert labels["tp4.flake.rev"] == "d1"
    assert any(line.startswith("ok   pass ") for line in out.splitlines()), out
    # the route: into the store, docker pull by digest; never a whole `docker load`
    assert "docker://127.0.0.1:" in err and "$ docker pull --quiet 127.0.0.1:" in err and "docker load" not in err
    pushed = build.Pushed.load(build.store_record_path(flake, "image"))
    assert pushed is not None and pushed.id == image_id

    store = imagestore.running()
    assert store is not None
    served = imagestore.served_bytes(store)
    old_blobs = {
        layer["digest"]
        for d in imagestore.manifests(store, imagestore.DEFAULT_REPO)
        for layer in imagestore.manifest(store, imagestore.DEFAULT_REPO, d)["layers"]
    }
    image_flake(flake, ref=REF, label="d2", size_mb=1, base_layers_mb=(4,), checks=PASS)
    code, out, err = tp4_cli("build", "--flake", flake, "--runtime", "docker")
    assert code == 0, err
    second = oci.read_layout(os.path.realpath(flake / "result-image"))
    new_layers = [d for d in second.diff_ids if d not in layout.diff_ids]
    assert len(new_layers) == 2  # the data tree and the links
    # what docker pulled from the store: the layers new to it and the config, nothing else
    pushed = build.Pushed.load(build.store_record_path(flake, "image"))
    manifest = imagestore.manifest(store, imagestore.DEFAULT_REPO, pushed.digest)
    stored = {layer["digest"]: layer["size"] for layer in manifest["layers"]}
    moved = imagestore.served_bytes(store) - served
    fresh = sum(size for digest, size in stored.items() if digest not in old_blobs)
    assert 0 < moved <= fresh + manifest["config"]["size"], (moved, fresh)
    assert moved < 1024 * 1024 + 65536 < sum(stored.values())
    assert runtime_cli.inspect("docker", REF)[0] == second.config.digest.removeprefix("sha256:")


def test_without_the_store_docker_gets_the_whole_image_and_is_told(docker, tmp_path, tp4_cli, monkeypatch):
    # a state directory that cannot be made: the store cannot start
    blocker = tmp_path / "state-is-a-file"
    blocker.write_text("")
    monkeypatch.setenv("XDG_STATE_HOME", str(blocker))
    flake = image_flake(tmp_path / "flake", ref=REF, label="d3", checks=PASS)
    code, out, err = tp4_cli("build", "--flake", flake, "--runtime", "docker")
    assert code == 0, err
    assert "warning: the image store cannot take the image" in err and "through its daemon instead" in err
    assert f"--dest-daemon-host {docker.host}" in err and "docker-daemon:" in err
    layout = oci.read_layout(os.path.realpath(flake / "result-image"))
    assert runtime_cli.inspect("docker", REF)[0] == layout.config.digest.removeprefix("sha256:")
    assert "Traceback" not in err


def test_the_docker_dry_run_shows_the_store_route(docker, tmp_path, tp4_cli):
    flake = image_flake(tmp_path / "flake", ref=REF, label=f"dry-{tmp_path.name}")
    code, out, err = tp4_cli("build", "--dry-run", "--flake", flake, "--runtime", "docker")
    assert code == 0, err
    assert "docker://127.0.0.1:<port>/dsv41-4x-spark:<tag>'    # into the head's image store" in out
    assert "$ docker pull --quiet '127.0.0.1:<port>/dsv41-4x-spark@<digest>'" in out
