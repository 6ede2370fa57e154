"""The example line (examples/spark-line, the spark-line template: its flake's
nixosConfigurations.spark1..4) cannot make a Spark unbootable or unreachable. As nixos-dgx-spark's
templates/dgx-spark (at f1ebf94), each host's disks and boot modules come from its own
hardware-configuration.nix, which nixos-generate-config writes on that Spark; until
hardware/<host>/hardware-configuration.nix exists the host fails evaluation saying how to make
it. The node user's SSH key is asked for the same way (authorized_keys). The flake's checks
evaluate the hosts on an explicit test hardware module and key instead, so they pass on a fresh
clone. Evaluated against the nixpkgs stand-in (tests/nixpkgs-stub), whose nixosSystem records
its modules."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from nix_env import empty_flake, locked_flake_copy, nix, stub_inputs
from nixos_helpers import EXAMPLE, REPO, nix_eval, nix_path

HOSTS = [f"spark{i}" for i in range(1, 5)]
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOZ1c2VyLWtleS1vZi10aGUtdGVzdC1ub3QtcmVhbA deployer@laptop"


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("nixos-example")


@pytest.fixture(scope="module")
def copy(work):
    return locked_flake_copy(REPO, work / "flake")


def evaluate(work: Path, flake: Path, attr: str, apply: str, extra: list[str] | None = None):
    inputs = extra if extra is not None else stub_inputs(REPO, empty_flake(work / "empty"))
    return nix(["eval", "--json", f"path:{flake}#{attr}", "--apply", apply, *inputs], work)


def template_line(work: Path, copy: Path, dest: Path) -> tuple[Path, list[str]]:
    """What `nix flake init -t <tp4>#spark-line` makes in dest, and the inputs that point its tp4
    at this checkout (its nixpkgs at the stand-in)."""
    dest.mkdir(parents=True)
    for f in ("configuration.nix", "flake.nix", "hosts.toml", "plan.json", "profile.toml"):
        shutil.copy(EXAMPLE / f, dest / f)
    return dest, [
        "--override-input",
        "tp4",
        f"path:{copy}",
        "--override-input",
        "tp4/nixpkgs",
        f"path:{REPO / 'tests' / 'nixpkgs-stub'}",
        "--override-input",
        "tp4/nixos-dgx-spark",
        f"path:{empty_flake(work / 'empty')}",
        "--no-write-lock-file",
    ]


def test_the_example_does_not_mount_disks_of_its_own():
    """The by-label disks it used to mount (nixos, boot) are not what nixos-dgx-spark's installer
    layout makes: disks come only from each host's generated hardware-configuration.nix."""
    text = (EXAMPLE / "configuration.nix").read_text()
    assert "fileSystems" not in text and "/dev/disk" not in text
    assert not (EXAMPLE / "hardware").exists()


@pytest.mark.parametrize("host", HOSTS)
def test_a_host_without_its_hardware_configuration_says_how_to_generate_it(work, copy, host, tmp_path):
    line, inputs = template_line(work, copy, tmp_path / "line")
    proc = evaluate(work, line, f"nixosConfigurations.{host}", "c: c.stub.args.modules", inputs)
    assert proc.returncode != 0
    assert (
        f"error: {host}: hardware/{host}/hardware-configuration.nix does not exist: it holds this Spark's "
        "disks and boot modules."
    ) in proc.stderr
    assert "`nixos-generate-config --show-hardware-config > hardware-configuration.nix`" in proc.stderr
    assert (
        f"copy the file to hardware/{host}/hardware-configuration.nix next to flake.nix and `git add` it" in proc.stderr
    )


def test_each_host_takes_its_own_hardware_configuration(work, copy, tmp_path):
    line, inputs = template_line(work, copy, tmp_path / "line")
    for host in HOSTS:
        hw = line / "hardware" / host / "hardware-configuration.nix"
        hw.parent.mkdir(parents=True)
        hw.write_text(f'{{ fileSystems."/".device = "/dev/disk/by-uuid/{host}"; }}\n')
    proc = evaluate(
        work,
        line,
        "nixosConfigurations",
        """cs: builtins.mapAttrs (n: c: let ms = c.stub.args.modules; in {
      hw = (import (builtins.elemAt ms 2)).fileSystems."/".device;
      rest = map (p: baseNameOf (toString p)) (builtins.tail (builtins.tail ms)); }) cs""",
        inputs,
    )
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert got == {
        h: {"hw": f"/dev/disk/by-uuid/{h}", "rest": ["hardware-configuration.nix", "configuration.nix"]} for h in HOSTS
    }


def test_lib_line_configurations_wants_hardware(work, copy):
    impure = [*stub_inputs(REPO, empty_flake(work / "empty")), "--impure"]  # the plan is a path of this checkout
    proc = evaluate(
        work,
        copy,
        "lib",
        f"""l: (l.lineConfigurations {{ plan = {nix_path(EXAMPLE / "plan.json")}; }}).spark2.stub.args.modules""",
        impure,
    )
    assert proc.returncode != 0
    assert "tp4.lib.lineConfigurations: spark2: hardware is not set; fix: pass hardware = ./hardware" in proc.stderr
    # a module instead of a directory: every host takes it
    proc = evaluate(
        work,
        copy,
        "lib",
        f"""l: map (c: builtins.elemAt c.stub.args.modules 2) (builtins.attrValues (l.lineConfigurations {{
      plan = {nix_path(EXAMPLE / "plan.json")}; hardware = {{ boot.loader.grub.enable = false; }}; }}))""",
        impure,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == [{"boot": {"loader": {"grub": {"enable": False}}}}] * 4


def configuration_keys(work: Path, line: Path):
    return nix_eval(
        f"(import {nix_path(line / 'configuration.nix')} {{ }}).users.users.tp4.openssh.authorizedKeys.keys",
        work / "nix",
    )


def test_the_node_user_key_is_asked_for(work, tmp_path):
    value, err = configuration_keys(work, EXAMPLE)
    assert value is None
    assert (
        "users.users.tp4.openssh.authorizedKeys.keys: authorized_keys next to configuration.nix has no key, and "
        "tp4 reaches every node over ssh as tp4; fix: `cp ~/.ssh/id_ed25519_tp4.pub authorized_keys`"
    ) in err
    line = tmp_path / "line"
    shutil.copytree(EXAMPLE, line)
    (line / "authorized_keys").write_text("# the deploying user\n\n")
    value, err = configuration_keys(work, line)
    assert value is None and "has no key" in err
    (line / "authorized_keys").write_text(f"# the deploying user\n{KEY}\n\n{KEY} 2\n")
    value, err = configuration_keys(work, line)
    assert value == [KEY, f"{KEY} 2"], err


def test_the_checks_evaluate_the_hosts_on_test_hardware(work, copy):
    """checks.aarch64-linux.nixos-<host> evaluates where the line's nixosConfigurations.<host>
    refuses (the flake itself has none: a fresh clone's `nix flake check` evaluates no host)."""
    proc = evaluate(
        work,
        copy,
        "checks.aarch64-linux",
        """c: map (n: c."nixos-${n}".stub.args.text) [ "spark1" "spark2" "spark3" "spark4" ]""",
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == ["/nix/store/0000000000000000000000000000000a-nixos-system-stand-in.drv"] * 4
    text = (REPO / "pkgs" / "outputs.nix").read_text()
    assert 'device = "/dev/disk/by-label/tp4-check-root";' in text and "hardware = checkHardware;" in text


def test_the_template_gives_the_same_hosts(work, copy, tmp_path):
    """`nix flake init -t <tp4>#spark-line` copies examples/spark-line: its flake, with tp4 as its
    input, refuses a host without hardware the same way and takes it when it is there."""
    proc = evaluate(work, copy, "templates.spark-line", "t: builtins.attrNames (builtins.readDir t.path)")
    assert proc.returncode == 0, proc.stderr
    files = json.loads(proc.stdout)
    assert files == ["configuration.nix", "flake.nix", "hosts.toml", "plan.json", "profile.toml"]
    line, inputs = template_line(work, copy, tmp_path / "line")
    proc = evaluate(work, line, "nixosConfigurations.spark3", "c: c.stub.args.modules", inputs)
    assert proc.returncode != 0
    assert "error: spark3: hardware/spark3/hardware-configuration.nix does not exist" in proc.stderr
    for host in HOSTS:
        (line / "hardware" / host).mkdir(parents=True)
        (line / "hardware" / host / "hardware-configuration.nix").write_text(f'{{ networking.hostId = "{host}"; }}\n')
    proc = evaluate(
        work,
        line,
        "nixosConfigurations",
        """cs: builtins.mapAttrs (n: c: let ms = c.stub.args.modules; in {
      hw = (import (builtins.elemAt ms 2)).networking.hostId; conf = baseNameOf (toString (builtins.elemAt ms 3)); }) cs""",
        inputs,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {h: {"hw": h, "conf": "configuration.nix"} for h in HOSTS}


def test_the_templates_flake_checks_its_plan_file(work, copy, tmp_path):
    """The line's own flake checks that its committed plan.json is what its profile renders:
    `tp4 plan --check` with the tp4 package, on every system (tp4.lib.planChecks)."""
    line, inputs = template_line(work, copy, tmp_path / "line")
    proc = evaluate(
        work,
        line,
        "checks",
        """cs: builtins.mapAttrs (s: c: { names = builtins.attrNames c;
      builder = c.plan-current.stub.builder; cmd = c.plan-current.stub.args.buildCommand; }) cs""",
        inputs,
    )
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert {"x86_64-linux", "aarch64-linux"} <= set(got)
    for c in got.values():
        assert c["names"] == ["plan-current"] and c["builder"] == "runCommand"
        assert "/bin/tp4 plan --check plan.json --profile profile.toml" in c["cmd"]
