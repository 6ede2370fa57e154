"""`tp4 build`: dry run, a real build + load on a tiny busybox image flake, and the Nix checks."""

from __future__ import annotations

import json
import os
import shlex
import stat
from pathlib import Path

import pytest

from nix_env import image_flake, nix, nix_config
from netns_hosts import storage_conf
from tp4 import build as build_mod
from tp4 import nix as nix_mod
from tp4.errors import Tp4Error


@pytest.fixture
def env(tmp_path, monkeypatch):
    """Offline nix and an isolated podman store for the head."""
    monkeypatch.setenv("NIX_CONFIG", nix_config(tmp_path / "nix"))
    monkeypatch.setenv("CONTAINERS_STORAGE_CONF", str(storage_conf(tmp_path / "head")))
    return tmp_path


def test_dry_run_prints_commands_and_store_paths_without_building(env, tp4_cli):
    flake = image_flake(env / "flake", label=f"dry-{os.urandom(4).hex()}")
    out = nix(["eval", "--raw", f"path:{flake}#image.outPath"], env).stdout
    drv = nix(["path-info", "--derivation", f"path:{flake}#image"], env).stdout.strip()

    code, stdout, stderr = tp4_cli("build", "--dry-run", "--flake", flake, "--runtime", "podman")

    assert code == 0, stderr
    build_cmd = shlex.join(["nix", "--extra-experimental-features", "nix-command flakes", "build",
                            f"{flake}#image", "--json", "--out-link", str(flake / "result-image"),
                            "--log-format", "internal-json", "-v"])
    assert f"$ {build_cmd}" in stdout
    assert f"$ {out} | podman load" in stdout
    assert f"image       {out}" in stdout
    assert f"derivation  {drv}" in stdout
    assert drv in stdout.split("to build")[1]
    assert not Path(out).exists()
    assert not (flake / "result-image").exists()


def test_build_loads_the_image_and_prints_id_and_pins(env, tp4_cli):
    label = f"built-{os.urandom(4).hex()}"  # a new image each run, so nix really builds it
    flake = image_flake(env / "flake", ref="tp4-test:built", label=label)

    code, stdout, stderr = tp4_cli("build", "--flake", flake, "--runtime", "podman")

    assert code == 0, stderr
    found = build_mod.inspect("podman", "tp4-test:built")
    assert found is not None
    image_id, labels = found
    assert f"id    {image_id}" in stdout
    assert "image localhost/tp4-test:built" in stdout
    assert f"flake  {label}" in stdout
    assert "demo   0123456789abcdef0123456789abcdef01234567" in stdout
    assert "building" in stdout  # progress from nix's internal-json log
    record = json.loads((flake / "result-image.json").read_text())
    assert record["id"] == image_id and record["ref"] == "localhost/tp4-test:built"
    assert os.path.realpath(flake / "result-image") == record["out_path"]


def test_missing_nix_is_a_clear_error(env, tp4_cli, monkeypatch):
    monkeypatch.setenv("PATH", str(env / "empty-bin"))
    code, _, stderr = tp4_cli("build", "--dry-run", "--flake", image_flake(env / "flake"))
    assert code == 1
    assert "nix is not installed" in stderr and "Nix >= 2.4" in stderr and "flakes" in stderr
    assert "Traceback" not in stderr


def test_old_nix_is_a_clear_error(env, tp4_cli, monkeypatch):
    fake = env / "old-bin" / "nix"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 'nix (Nix) 2.3.16'\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{fake.parent}:{os.environ['PATH']}")
    code, _, stderr = tp4_cli("build", "--flake", image_flake(env / "flake"), "--runtime", "podman")
    assert code == 1
    assert "nix 2.3.16 is too old" in stderr and "Nix >= 2.4" in stderr


def test_no_flake_is_invalid_input(tmp_path, tp4_cli, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TP4_FLAKE", raising=False)
    code, _, stderr = tp4_cli("build", "--dry-run")
    assert code == 2 and "no flake.nix" in stderr


@pytest.mark.parametrize("text,version", [("nix (Nix) 2.8.0\n", (2, 8, 0)), ("nix (Nix) 2.24.9", (2, 24, 9)),
                                          ("nix (Determinate Nix 3.6.2) 2.29.0", (3, 6, 2))])
def test_parse_version(text, version):
    assert nix_mod.parse_version(text) == version


def test_parse_version_rejects_garbage():
    with pytest.raises(Tp4Error):
        nix_mod.parse_version("no digits")


def test_log_event_reads_internal_json():
    start = '@nix {"action":"start","id":1,"level":3,"type":105,"text":"building \'/nix/store/x-a.drv\'"}'
    assert nix_mod.log_event(start) == ("progress", "building '/nix/store/x-a.drv'")
    error = '@nix {"action":"msg","level":0,"msg":"\\u001b[31;1merror:\\u001b[0m builder failed"}'
    assert nix_mod.log_event(error) == ("detail", "error: builder failed")
    assert nix_mod.log_event('@nix {"action":"result","id":2,"type":101,"fields":["make: ok"]}') == ("detail", "make: ok")
    assert nix_mod.log_event('@nix {"action":"stop","id":1}') is None
    assert nix_mod.log_event("plain stderr\n") == ("detail", "plain stderr")


def test_a_failing_build_shows_nix_errors(env, tp4_cli):
    flake = image_flake(env / "flake", label=f"fail-{os.urandom(4).hex()}")
    text = (flake / "flake.nix").read_text().replace('tar -cf "$out"', 'echo broken-on-purpose >&2; exit 3; tar -cf "$out"')
    (flake / "flake.nix").write_text(text)
    code, _, stderr = tp4_cli("build", "--flake", flake, "--runtime", "podman")
    assert code == 1
    assert "failed with exit code" in stderr and "broken-on-purpose" in stderr
    assert "Traceback" not in stderr


def test_loaded_ref_from_podman_and_docker_output():
    assert build_mod.loaded_ref("Loaded image: localhost/a:b\n") == "localhost/a:b"
    assert build_mod.loaded_ref("Loaded image(s): localhost/a:b\n") == "localhost/a:b"
    assert build_mod.loaded_ref("Loaded image ID: sha256:abc\n") == "sha256:abc"
    with pytest.raises(Tp4Error):
        build_mod.loaded_ref("nothing")


def test_pin_summary_lists_flake_first_then_components():
    lines = build_mod.pin_summary({"tp4.pin.b12x-main": "a7d7", "tp4.flake.rev": "abc", "tp4.pin.x": "1", "other": "y"})
    assert lines == ["flake      abc", "b12x-main  a7d7", "x          1"]


def test_system_option_builds_that_systems_package(env, tp4_cli):
    from nix_env import SYSTEM

    flake = image_flake(env / "flake", label=f"sys-{os.urandom(4).hex()}")
    code, stdout, stderr = tp4_cli("build", "--dry-run", "--flake", flake, "--runtime", "podman", "--system", SYSTEM)
    assert code == 0, stderr
    assert f"build {shlex.quote(f'{flake}#packages.{SYSTEM}.image')} --json" in stdout
    code, _, stderr = tp4_cli("build", "--dry-run", "--flake", flake, "--runtime", "podman", "--system", "riscv64-linux")
    assert code == 1 and "packages.riscv64-linux.image" in stderr
