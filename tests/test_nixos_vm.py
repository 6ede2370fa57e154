"""checks.<aarch64-linux>.spark-host-vm (pkgs/spark-host-vm) and checks.<aarch64-linux>.nixos-<node>:
the VM test cannot boot here (nixpkgs, the NVIDIA kernel and KVM on aarch64 are needed), so its
parts are checked where they can be:

* the flake's check is a testers.runNixOSTest call the stand-in accepts (tests/nixpkgs-stub checks
  the test module's options as nixos/lib/testing declares them), with the node and script files;
* the node's module sets only NixOS options that modules/options.toml lists (the module walk of
  tests/test_nixos_modules.py, with the [vm-test] entries);
* the test script, rendered from the head's real settings, is Python, and the RDMA check message
  it greps the journal for is what modules/rdma-check.sh prints on a host with no RDMA device
  (run here with the unit's own arguments on an empty sysfs);
* nixos-<node> writes the .drv path of that node's system, without depending on it.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import tomllib
from pathlib import Path

import pytest

from nix_env import empty_flake, locked_flake_copy, nix, stub_inputs
from nixos_helpers import EXAMPLE, LIB, NVIDIA_KERNEL, REPO, json_file, nix_attrs, nix_eval, nix_path, plan_file, toml

VM = REPO / "pkgs" / "spark-host-vm"
WALK = REPO / "tests" / "nixos-modules" / "walk.nix"
OPTIONS = REPO / "modules" / "options.toml"
STUB = REPO / "tests" / "nixpkgs-stub"
RDMA_CHECK = REPO / "modules" / "rdma-check.sh"


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("nixos-vm")


@pytest.fixture(scope="module")
def settings_expr(work) -> str:
    """The head's settings (modules/lib) as a Nix expression."""
    profile = EXAMPLE / "profile.toml"
    plan = plan_file(profile, work / "plan.json")
    return (
        f"(import {nix_path(LIB)}).host {{ plan = {json_file(plan)}; "
        f'hostsFile = {toml(EXAMPLE / "hosts.toml")}; name = "spark1"; }}'
    )


@pytest.fixture(scope="module")
def settings(work, settings_expr) -> dict:
    value, err = nix_eval(settings_expr, work / "nix")
    assert isinstance(value, dict), err
    return value


@pytest.fixture(scope="module")
def script(work, settings_expr) -> str:
    expr = f"import {nix_path(VM / 'script.nix')} {{ nodes.machine = {{ tp4.settings = {settings_expr}; boot.kernelPackages.kernel = {nix_attrs(NVIDIA_KERNEL)}; }}; }}"
    value, err = nix_eval(expr, work / "nix")
    assert isinstance(value, str), err
    return value


def test_the_vm_files_parse():
    for f in sorted(VM.glob("*.nix")):
        proc = subprocess.run(["nix-instantiate", "--parse", str(f)], capture_output=True, text=True)
        assert proc.returncode == 0, f"{f}: {proc.stderr}"


def test_the_test_script_is_python_that_checks_the_heads_settings(script, settings):
    tree = ast.parse(script)
    calls = [
        (n.func.attr, n.args[0].value)
        for n in ast.walk(tree)  # type: ignore[attr-defined]
        if isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and n.args
        and isinstance(n.args[0], ast.Constant)
    ]
    assert all(
        isinstance(n.func.value, ast.Name) and n.func.value.id == "machine"  # type: ignore[attr-defined]
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
    )
    by = {}
    for method, arg in calls:
        by.setdefault(method, []).append(arg)
    assert by["wait_for_unit"] == ["multi-user.target", "nfs-server.service", "podman-tp4-probe.service"]
    assert "systemctl is-failed --quiet tp4-rdma-check.service" in by["wait_until_succeeds"]
    rank = settings["rankUnit"]["unit"]
    assert rank == "podman-dsv41-head.service"
    assert {
        f"systemctl start {rank}",
        f"systemctl is-active --quiet {rank}",
        "systemctl is-active --quiet tp4-rank-ready.service",
        "test -e /run/tp4/gid-index",
    } <= set(by["fail"])
    assert 'test "$(uname -r)" = 6.17.13' in by["succeed"]
    assert 'test -z "$(podman ps --all --quiet --filter name=^dsv41-head$)"' in by["succeed"]
    # every fabric port: its address and MTU; every ARP setting
    for netdev, i in settings["interfaces"].items():
        a = i["ipv4"]["addresses"][0]
        assert f"ip -o link show {netdev} | grep -q ' mtu 9000 '" in by["succeed"]
        assert f"ip -o -4 addr show {netdev} | grep -q ' inet {a['address']}/{a['prefixLength']} '" in by["succeed"]
    # the head's NFS export: the checkpoint, to each worker's address
    path, *clients = settings["nfs"]["exports"].split(" ")
    assert "nfs-server.service" in by["wait_for_unit"]
    assert f"exportfs -v | grep -qF '{path}'" in by["succeed"]
    assert [c.split("(")[0] for c in clients] == ["10.0.0.2", "10.0.0.3", "10.0.0.4"]
    for c in clients:
        assert f"exportfs -v | grep -qF '{c.split('(')[0]}('" in by["succeed"]
    for key, v in settings["sysctl"].items():
        assert f'test "$(sysctl -n {key})" = {v}' in by["succeed"]


def test_the_journal_line_it_greps_for_is_what_the_rdma_check_prints(script, settings, tmp_path):
    """The VM has no RDMA device: the check, run with the unit's own arguments, prints the line."""
    greps = re.findall(r"journalctl -b -u tp4-rdma-check\.service -o cat \| grep -qF '([^']*)'", script)
    assert len(greps) == 1
    check = settings["rdmaCheck"]
    # its deadline 0 here (the unit's is rdmaCheck.timeout): the first pass's message is the last
    args = ["0", check["gidFile"].replace("/run/tp4", str(tmp_path / "run")), "-"]
    args += [x for p in check["ports"] for x in (p["hca"], p["netdev"], p["address"])]
    (tmp_path / "sys" / "class").mkdir(parents=True)  # a sysfs without infiniband devices
    proc = subprocess.run(
        ["sh", str(RDMA_CHECK), *args],
        capture_output=True,
        text=True,
        env={"TP4_SYSFS": str(tmp_path / "sys"), "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 1
    assert proc.stderr.splitlines()[0].startswith(f"tp4-rdma-check: after 0 s: {greps[0]}")
    assert greps[0] == "rocep1s0f0: no such RDMA device (for enp1s0f0np0 10.0.0.1); fix: load mlx5_ib"
    assert check["timeout"] == 120


def walk_machine(work: Path, settings_expr: str, sections: str) -> dict:
    module = (
        f"import {nix_path(VM / 'machine.nix')} {{ nixosModules.default = {{ }}; example = {nix_path(EXAMPLE)}; "
        f"hardening = (import {nix_path(LIB)}).rank.hardening; }}"
    )
    config = f"{{ tp4.settings = {settings_expr}; }}"
    expr = (
        f"import {nix_path(WALK)} {{ module = {module}; optionsFile = {nix_path(OPTIONS)}; config = {config}; "
        f"pkgs = import {nix_path(STUB)} {{ }}; sections = {sections}; }}"
    )
    value, err = nix_eval(expr, work / "nix")
    assert isinstance(value, dict), err
    return value


def test_the_node_sets_only_listed_options(work, settings_expr):
    w = walk_machine(work, settings_expr, '[ "set" "own" "vm-test" ]')
    assert [s["path"] for s in w["set"] if s["entry"] is None] == []
    data = tomllib.loads(OPTIONS.read_text())
    assert sorted(set(data["vm-test"]) - {s["entry"] for s in w["set"]}) == []
    # without the [vm-test] entries the walk names them: the check has teeth
    bare = walk_machine(work, settings_expr, '[ "set" "own" ]')
    assert {s["path"] for s in bare["set"] if s["entry"] is None} >= {
        "virtualisation.memorySize",
        "virtualisation.qemu",
        "hardware.nvidia-container-toolkit.suppressNvidiaDriverAssertion",
    }
    values = {s["path"]: s["value"] for s in w["set"]}
    assert values["hardware.nvidia-container-toolkit.suppressNvidiaDriverAssertion"] is True
    assert values["systemd.network.links.10-enp1s0f0np0.linkConfig"] == {"Name": "enp1s0f0np0"}
    assert values["systemd.network.links.10-enP2p1s0f0np0.matchConfig"] == {"MACAddress": "52:54:00:74:70:11"}
    assert values["virtualisation.qemu.options"] == [
        "-netdev user,id=fabric0,restrict=on",
        "-device virtio-net-pci,netdev=fabric0,mac=52:54:00:74:70:10",
        "-netdev user,id=fabric1,restrict=on",
        "-device virtio-net-pci,netdev=fabric1,mac=52:54:00:74:70:11",
    ]
    # the probe runs under exactly the rank unit's hardening
    hardening, err = nix_eval(f"(import {nix_path(LIB)}).rank.hardening", work / "nix")
    assert values["systemd.services.podman-tp4-probe.serviceConfig"] == hardening and hardening, err
    assert values["virtualisation.oci-containers.containers.tp4-probe.image"].startswith("tp4-probe:1")
    assert w["imports"][1] == "configuration.nix"
    assert values["systemd.tmpfiles.rules"] == [
        "d /var/lib/tp4-probe 0755 root root - -",
        "d /home/tp4/NewModels/DeepSeek-V4.1-Flash 0755 tp4 - - -",
    ]


def test_the_flake_checks(tmp_path):
    copy = locked_flake_copy(REPO, tmp_path / "flake")
    inputs = stub_inputs(REPO, empty_flake(tmp_path / "empty"))

    def evaluate(attr: str, apply: str):
        proc = nix(["eval", "--json", f"path:{copy}#{attr}", "--apply", apply, *inputs], tmp_path)
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)

    vm = evaluate(
        "checks.aarch64-linux.spark-host-vm",
        """t: { inherit (t) name; inherit (t.stub) builder;
      args = builtins.removeAttrs t.stub.args [ "nodes" "testScript" ];
      machine = builtins.isFunction t.stub.args.nodes.machine; script = builtins.isFunction t.stub.args.testScript; }""",
    )
    assert vm == {
        "name": "vm-test-run-tp4-spark-host",
        "builder": "testers.runNixOSTest",
        "machine": True,
        "script": True,
        "args": {"name": "tp4-spark-host", "node": {"pkgsReadOnly": False}, "globalTimeout": 1800},
    }
    checks = evaluate("checks", "c: builtins.mapAttrs (s: builtins.attrNames) c")
    # plan-current: the example's committed plan is the one its profile renders (tp4 plan --check),
    # on every system (a copy of both files under their usual names)
    for system in ("x86_64-linux", "aarch64-linux"):
        pc = evaluate(
            f"checks.{system}.plan-current", "d: { inherit (d.stub) builder; cmd = d.stub.args.buildCommand; }"
        )
        assert pc["builder"] == "runCommand"
        assert "-m tp4 plan --check plan.json --profile profile.toml" in pc["cmd"]
        assert "-profile.toml profile.toml" in pc["cmd"] and "-plan.json plan.json" in pc["cmd"]
    nixos = {f"nixos-spark{i}" for i in range(1, 5)}
    assert nixos | {"spark-host-vm"} <= set(checks["aarch64-linux"])
    assert not any(c.startswith("nixos-") or c == "spark-host-vm" for c in checks["x86_64-linux"])
    # nixos-<node>: the .drv path of the node's toplevel, as text without its context
    got = evaluate(
        "checks.aarch64-linux",
        """c: builtins.mapAttrs (n: d: { inherit (d) name; inherit (d.stub) builder;
      text = d.stub.args.text; context = builtins.hasContext d.stub.args.text; })
      (builtins.removeAttrs c [ "b12x" "b12x-next" "eval" "formatting" "image" "image-canary" "image-local" "sglang-tree" "spark-host-vm" "tp4" "tp4-runtime" "unit" "wheels" "plan-current" ])""",
    )
    # they evaluate on a fresh clone (no hardware/<host>/hardware-configuration.nix, no
    # authorized_keys): the hosts on the checks' explicit test hardware and test key
    assert not (copy / "examples" / "spark-line" / "hardware").exists()
    assert not (copy / "examples" / "spark-line" / "authorized_keys").exists()
    assert set(got) == nixos
    for name, c in got.items():
        node = name.removeprefix("nixos-")
        # the stand-in's toplevel (tests/nixpkgs-stub/flake.nix)
        drv = "/nix/store/0000000000000000000000000000000a-nixos-system-stand-in.drv"
        assert c == {"name": f"tp4-nixos-{node}.drv-path", "builder": "writeText", "text": drv, "context": False}
