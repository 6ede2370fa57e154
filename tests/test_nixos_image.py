"""The line's image reaches podman on a NixOS node the way the rank unit's pre-start hands it
over. nixpkgs' oci-containers module (nixos/modules/virtualisation/oci-containers.nix, mkService's
preStartScript) runs `<backend> load -i ${imageFile}` or `${imageStream} | <backend> load`; the
container then runs the plan's run.image with pull = "never". The flake's `.#image` is an OCI
layout directory: `podman load -i` of it loads under the store path's name (so the rank would
not start), while tp4.line.image.layout's stream loads it under run.image. The layout here is
built by pkgs/oci.nix with real nix (tests/nix_env.py image_flake), loaded by real podman."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from netns_hosts import podman_store
from nix_env import image_flake, image_nix_config
from nixos_helpers import EXAMPLE, plan_file
from test_nixos_modules import MODULES, PKGS, _assertions, fixture_config, walk
from tp4.core import process

RUN = ["--ulimit", "nofile=1024:1024", "--ulimit", "nproc=4096:4096", "--network", "none", "--runtime", "runc"]
SKOPEO = "/nix/store/0000000000000000000000000000000s-skopeo"
# the walk's pkgs, where writeShellScript gives back the script's text (nixpkgs' writes
# "#!${runtimeShell}" and the text into a store file) and skopeo is a store path to swap
PKGS_TEXT = f'({PKGS} // {{ skopeo = "{SKOPEO}"; writeShellScript = name: text: text; }})'


@pytest.fixture
def store(monkeypatch):
    yield from podman_store(monkeypatch, "tp4n-")


@pytest.fixture(scope="module")
def head(tmp_path_factory):
    work = tmp_path_factory.mktemp("nixos-image")
    profile = EXAMPLE / "profile.toml"
    return work, profile, plan_file(profile, work / "plan.json")


def build(flake: Path, work: Path) -> str:
    proc = process.run(
        ["nix", "build", "--json", "--no-link", f"path:{flake}#image"],
        env={"NIX_CONFIG": image_nix_config(work / "nix")},
    )
    return json.loads(proc.stdout)[0]["outputs"]["out"]


def container(work: Path, profile: Path, plan: Path, image: str) -> dict:
    config = fixture_config(plan, "spark1", ring=False, image=image)
    w = walk(MODULES / "tp4-line.nix", config, work, PKGS_TEXT)
    name = json.loads(plan.read_text())["nodes"][0]["run"]["container"]
    return {
        s["path"].rsplit(".", 1)[1]: s["value"]
        for s in w["set"]
        if s["path"].startswith(f"virtualisation.oci-containers.containers.{name}.")
    }


def test_the_layout_loads_under_the_image_the_unit_runs(head, tmp_path, store):
    work, profile, plan = head
    run_image = json.loads(plan.read_text())["nodes"][0]["run"]["image"]
    flake = image_flake(tmp_path / "flake", ref=run_image, label="nixos", size_mb=1, base_layers_mb=(1,))
    layout = build(flake, tmp_path)
    got = container(work, profile, plan, f'{{ layout = "{layout}"; stream = null; file = null; }}')
    assert got["image"] == run_image and got["pull"] == "never" and got["imageFile"] is None
    script = got["imageStream"]
    assert f"oci:{layout}" in script and f"docker-archive:/dev/stdout:{run_image}" in script
    # the pre-start's line: `${imageStream} | podman load`, with the host's skopeo for nixpkgs'
    script = script.replace(f"{SKOPEO}/bin/skopeo", shutil.which("skopeo"))
    stream = tmp_path / "tp4-image-stream"
    stream.write_text(f"#!/bin/sh\n{script}")  # writeShellScript's file: "#!${runtimeShell}" and the text
    stream.chmod(0o755)
    proc = subprocess.run(
        ["bash", "-c", 'set -o pipefail; "$0" | podman load', str(stream)], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == f"Loaded image: docker.io/library/{run_image}", (
        proc.stdout + proc.stderr
    )
    out = process.run(
        [
            "podman",
            "run",
            "--rm",
            "--pull",
            "never",
            *RUN,
            "--entrypoint",
            "/bin/sh",
            run_image,
            "-c",
            "cat /opt/data/label",
        ]
    ).stdout
    assert out.strip() == "nixos"


def test_a_layout_as_image_file_would_not_be_found(head, tmp_path, store):
    """What the old documentation led to (`imageFile = .#image`): podman load -i takes the layout
    but names it after its store path, and the unit's `podman run --pull never <run.image>` fails."""
    work, profile, plan = head
    run_image = json.loads(plan.read_text())["nodes"][0]["run"]["image"]
    flake = image_flake(tmp_path / "flake", ref=run_image, label="file", size_mb=0)
    layout = build(flake, tmp_path)
    process.run(["podman", "load", "-i", layout])
    proc = subprocess.run(["podman", "image", "exists", run_image])
    assert proc.returncode == 1


def test_only_one_image_source(head):
    work, profile, plan = head
    config = fixture_config(
        plan,
        "spark1",
        ring=False,
        image='{ layout = "/nix/store/x-image"; stream = "/nix/store/y-stream"; file = null; }',
    )
    w = walk(MODULES / "tp4-line.nix", config, work, PKGS_TEXT)
    failed = [a["message"] for a in _assertions(w) if not a["assertion"]]
    assert failed == [
        "tp4.line.image: more than one of layout, stream and file is set; fix: set only one of them "
        "(layout = tp4.packages.aarch64-linux.image)"
    ]
