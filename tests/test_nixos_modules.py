"""modules/*.nix: every module parses; every NixOS option they set or read is one that
modules/options.toml lists with the nixpkgs file declaring it (nixpkgs cannot be evaluated here,
so the list is the contract a host with network checks); the RDMA check unit's script fails
loudly on a port that is down or lacks its RoCE v2 GID.

How the option paths are found:
* set: each module is called with `lib`'s markers and a fixture `config` (a head, a worker and a
  ring worker of the example line, their settings computed by the real modules/lib) and its
  `config` attrset is walked down to the data file's entries (tests/nixos-modules/walk.nix);
* read: a regular expression over the module sources, every `config.<path>`.

The scripts the units run (RDMA check, weights volume, ring hairpin) run here on a fake sysfs, real
podman and a recording devlink.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import tomllib
import uuid
from pathlib import Path

import pytest

from nix_env import BUSYBOX, empty_flake, locked_flake_copy, nix, stub_inputs
from nixos_helpers import (
    EXAMPLE,
    LIB,
    NVIDIA_KERNEL,
    REPO,
    json_file,
    nix_attrs,
    nix_eval,
    nix_path,
    plan_file,
    systemd_exec_argv,
    toml,
)

from tp4.serving import fleet

MODULES = REPO / "modules"
OPTIONS = MODULES / "options.toml"
WALK = REPO / "tests" / "nixos-modules" / "walk.nix"
STUB_LIB = REPO / "tests" / "nixos-modules" / "lib.nix"
STUB_UTILS = REPO / "tests" / "nixos-modules" / "utils.nix"
MODULE_FILES = ("spark-host.nix", "tp4-line.nix", "common.nix", "tp4-router.nix")
RDMA_CHECK = MODULES / "rdma-check.sh"

# pkgs as the modules use it: packages they only interpolate, as placeholder store paths; runtimeShell
# is a string in nixpkgs ("${bash}/bin/bash", pkgs/top-level/all-packages.nix), here /bin/sh so the
# scripts' argv can be run as it is; writeShellScript and runCommand return their output's path
# (trivial-builders), here a name under /nix/store
PKGS = (
    '{ rdma-core = "/nix/store/rdma-core"; coreutils = "/nix/store/coreutils"; iproute2 = "/nix/store/iproute2"; runtimeShell = "/bin/sh"; gnugrep = "/nix/store/gnugrep"; gnused = "/nix/store/gnused"; '
    'writeShellScript = name: text: "/nix/store/script-${name}"; runCommand = name: env: script: "/nix/store/${name}"; }'
)


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("nixos-modules")


@pytest.fixture(scope="module")
def data():
    return tomllib.loads(OPTIONS.read_text())


@pytest.fixture(scope="module")
def lines(work):
    """(profile, plan) of the example line and of the same line as a ring."""
    switched = EXAMPLE / "profile.toml"
    text = switched.read_text().replace(
        'hcas = ["rocep1s0f0", "roceP2p1s0f0"]',
        'hcas = ["rocep1s0f0", "roceP2p1s0f0"]\nmode = "ring"\n\n[fabric.nccl]\nmount = "overlay"',
    )
    text = (
        text.replace("[nfs]", "[nfs]\nshare = false")
        + '\n[gates]\nDSV41_ROCE_RING = "1"\nSGLANG_ROCE_MAX_SIZE = "262144"\nDSV41_ROCE_GATHER = "262144"\nDSV41_ENGRAM_DRM_NODE = "/dev/dri/card0"\n'
    )
    ring = work / "ring.toml"
    ring.write_text(text)
    return {
        "switched": (switched, plan_file(switched, work / "switched.json")),
        "ring": (ring, plan_file(ring, work / "ring.json")),
        "fleet": fleet_plan(work, service="unit"),
    }


def fleet_plan(work: Path, *, service: str, python: str = "/opt/tp4/.venv/bin/python") -> Path:
    """`tp4 fleet plan --json` of the example fleet (examples/fleet), its router run as `service`."""
    d = work / f"fleet-{service}"
    d.mkdir(exist_ok=True)
    shutil.copy(REPO / "examples" / "fleet" / "profile.toml", d / "profile.toml")
    text = (REPO / "examples" / "fleet" / "fleet.toml").read_text()
    text = text.replace('python = "/opt/tp4/.venv/bin/python"', f'python = "{python}"\nservice = "{service}"')
    (d / "fleet.toml").write_text(text)
    proc = subprocess.run(
        [sys.executable, "-m", "tp4", "fleet", "plan", "--json", "-f", str(d / "fleet.toml")],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO / "python")},
    )
    assert proc.returncode == 0, proc.stderr
    (d / "plan.json").write_text(proc.stdout)
    return d / "plan.json"


def declared_default(module: Path, option: str) -> object:
    """The default a module declares for one of its options (read from the module, not restated)."""
    expr = (
        f"(import {nix_path(module)} {{ config = {{ }}; lib = import {nix_path(STUB_LIB)}; utils = import {nix_path(STUB_UTILS)}; pkgs = {PKGS}; options = {{ }}; }})"
        f".options.{option}.default"
    )
    value, err = nix_eval(expr, Path(os.environ.get("TMPDIR", "/tmp")) / f"tp4-default-{os.getpid()}")
    assert err == "", err
    return value


# The kernel command line a host of the line ends up with (boot.kernelParams is a list: the
# definitions concatenated, ours last by mkAfter):
# * nixos-dgx-spark: "console=tty1", "module_blacklist=algif_aead,esp4,esp6,rxrpc", and with
#   useNvidiaKernel and cppcAutonomousMode (both default true) "cppc_cpufreq.auto_sel_mode=1"
#   (modules/dgx-spark.nix lines 127-147 at f1ebf94);
# * nixpkgs' nvidia module with hardware.nvidia.modesetting.enable and open = true (dgx-spark.nix
#   lines 156-158): "nvidia-drm.modeset=1", "nvidia-drm.fbdev=1" for a driver >= 545, and
#   "nvidia.NVreg_OpenRmEnableUnsupportedGpus=1" for the open modules (nixos/modules/hardware/video/
#   nvidia.nix, `boot.kernelParams = lib.optional cfg.modesetting.enable "nvidia-drm.modeset=1" ++ ...`;
#   read in a stored copy whose commit the index does not name); `ibt=off` is not added, as open
#   modules count as IBT-capable there;
# * modules/spark-host.nix: the display reservation's parameters (modules/lib/kernel.nix).
DGX_SPARK_PARAMS = '[ "console=tty1" "module_blacklist=algif_aead,esp4,esp6,rxrpc" "cppc_cpufreq.auto_sel_mode=1" ]'
NVIDIA_PARAMS = '[ "nvidia-drm.modeset=1" "nvidia-drm.fbdev=1" "nvidia.NVreg_OpenRmEnableUnsupportedGpus=1" ]'
KERNEL_PARAMS = f"({DGX_SPARK_PARAMS} ++ {NVIDIA_PARAMS} ++ (import {nix_path(LIB)}).kernel.displayReservationParams)"


def fixture_config(
    plan: Path,
    name: str,
    *,
    ring: bool,
    router: Path | None = None,
    kernel: dict[str, str] = NVIDIA_KERNEL,
    kernel_params: str = KERNEL_PARAMS,
    image: str = "{ layout = null; stream = null; file = null; }",
) -> str:
    """The `config` a module reads on host `name`. tp4.* are the options as the example line sets
    them (examples/spark-line) or the modules' own defaults; the NixOS values are the real ones
    (sources beside NVIDIA_KERNEL and KERNEL_PARAMS). Store paths (/nix/store/podman, ...) stand
    for packages whose path the modules only interpolate: virtualisation.podman.package
    (podman/default.nix's internal option), hardware.nvidia.package (nixos-dgx-spark's
    nvidiaPackages.production, dgx-spark.nix lines 165-173) and its `bin` output, where nvidia-smi
    is. services.xserver, displayManager, gdm and gnome are off: their nixpkgs defaults, which the
    example's configuration.nix leaves; users.users.tp4 is the example's cluster.user, which its
    configuration.nix declares."""
    hosts = EXAMPLE / "hosts.toml"
    local = '"/var/lib/tp4/model"' if ring else "null"
    mesh = '"/etc/tp4/mesh-up.sh"' if ring else "null"
    marker = '"/nix/store/marker"' if ring else "null"
    settings = (
        f"(import {nix_path(LIB)}).host {{ plan = {json_file(plan)}; hostsFile = {toml(hosts)}; "
        f"name = {json.dumps(name)}; localWeights = {local}; }}"
    )
    return f"""{{
      tp4 = {{
        settings = {settings};
        planFile = {nix_path(plan)}; hostsFile = {nix_path(hosts)}; node = {json.dumps(name)}; package = "/nix/store/tp4";
        host = {{
          enable = true; displayReservation.enable = true; firewall.enable = true;
          weights = {{ mountPoint = "/var/lib/tp4/weights"; localDir = {local}; }};
          ring = {{ meshUp = {mesh}; meshDown = {mesh}; marker = {{ package = {marker}; program = "mlx5-rdma-tx-rewrite-probe"; }}; }};
          kernel = {{ version = {json.dumps(declared_default(MODULES / "spark-host.nix", "tp4.host.kernel.version"))}; allowOther = false; }};
        }};
        line = {{ enable = true; image = {image}; autoStart = false; watch = {{ enable = {"true" if name == "spark1" else "false"}; profile = {nix_path(EXAMPLE / "profile.toml")}; metricsPort = {declared_default(MODULES / "tp4-line.nix", "tp4.line.watch.metricsPort")}; extraArgs = [ ]; }}; }};
        router = {{ enable = {"true" if router else "false"}; fleetPlan = {nix_path(router) if router else "null"}; fleet = null; package = null; python = null; openFirewall = true; }};
      }};
      boot = {{ kernelParams = {kernel_params}; kernelPackages.kernel = {nix_attrs(kernel)}; }};
      services = {{ xserver.enable = false; displayManager = {{ enable = false; gdm.enable = false; }}; desktopManager.gnome.enable = false; prometheus.enable = true; }};
      users.users.tp4 = {{ }};
      virtualisation.podman.package = "/nix/store/podman";
      hardware.nvidia.package.bin = "/nix/store/nvidia-bin";
      networking.hostName = {json.dumps(name)};
    }}"""


def walk(module: Path, config: str, work: Path, pkgs: str = PKGS) -> dict:
    expr = f"import {nix_path(WALK)} {{ module = {nix_path(module)}; optionsFile = {nix_path(OPTIONS)}; config = {config}; pkgs = {pkgs}; }}"
    value, err = nix_eval(expr, work / "nix")
    assert value is not None, err
    assert isinstance(value, dict)
    return value


@pytest.fixture(scope="module")
def walks(work, lines):
    """Every module on a head, a worker and a ring worker: {(module, host): walk}."""
    hosts = {"head": ("switched", "spark1"), "worker": ("switched", "spark2"), "ring worker": ("ring", "spark3")}
    out = {}
    for module in MODULE_FILES:
        for host, (line, name) in hosts.items():
            profile, plan = lines[line]
            out[(module, host)] = walk(
                MODULES / module, fixture_config(plan, name, ring=line == "ring", router=lines["fleet"]), work
            )
    return out


def test_every_module_and_lib_file_parses(work):
    files = sorted(MODULES.glob("*.nix")) + sorted(LIB.glob("*.nix")) + [WALK]
    assert {f.name for f in files} >= {
        *MODULE_FILES,
        "default.nix",
        "hosts.nix",
        "weights.nix",
        "rank.nix",
        "kernel.nix",
        "util.nix",
    }
    for f in files:
        proc = subprocess.run(["nix-instantiate", "--parse", str(f)], capture_output=True, text=True)
        assert proc.returncode == 0, f"{f}: {proc.stderr}"


def test_the_modules_set_only_options_the_data_file_lists(walks):
    unknown = sorted({(module, s["path"]) for (module, _), w in walks.items() for s in w["set"] if s["entry"] is None})
    assert unknown == []


def test_every_listed_option_is_set_by_a_module(walks, data):
    used = {s["entry"] for w in walks.values() for s in w["set"]}
    assert sorted(set(data["set"]) - used) == []
    assert (
        sorted(
            set(data["own"])
            - used
            - {"tp4.host", "tp4.line", "tp4.planFile", "tp4.hostsFile", "tp4.node", "tp4.package", "tp4.router"}
        )
        == []
    )


def test_what_each_host_gets(walks):
    def paths(module: str, host: str) -> set[str]:
        return {s["path"] for s in walks[(module, host)]["set"]}

    head, worker, ring = (paths("spark-host.nix", h) for h in ("head", "worker", "ring worker"))
    assert {
        "services.nfs.server.exports",
        "networking.firewall.allowedTCPPorts",
        "systemd.settings.Manager",
        "boot.kernelParams",
        "hardware.dgx-spark.enable",
    } <= head
    assert not any(p.startswith("fileSystems.") for p in head)
    assert {"fileSystems./var/lib/tp4/weights.options", "systemd.services.tp4-weights-volume.unitConfig"} <= worker
    assert "services.nfs.server.exports" not in worker
    assert "systemd.services.tp4-mesh.serviceConfig" in ring and not any(p.startswith("fileSystems.") for p in ring)
    assert {
        "networking.interfaces.enp1s0f0np0.mtu",
        "networking.interfaces.enP2p1s0f0np0.ipv4.addresses",
        "systemd.services.tp4-rdma-check.serviceConfig",
        "boot.kernelModules",
        "environment.systemPackages",
    } <= worker
    line = paths("tp4-line.nix", "worker")
    assert {
        "virtualisation.oci-containers.containers.dsv41-worker.image",
        "systemd.services.podman-dsv41-worker.serviceConfig",
        "systemd.services.podman-dsv41-worker.requires",
        "systemd.tmpfiles.rules",
    } <= line
    assert walks[("spark-host.nix", "head")]["imports"] == ["common.nix"] == walks[("tp4-line.nix", "head")]["imports"]


def test_an_option_nixpkgs_does_not_declare_fails(work, lines):
    module = work / "typo.nix"
    module.write_text(
        "{ config, lib, ... }: { config = lib.mkMerge [ { networking.interfaces.eth0.mtu = 9000; } "
        '(lib.mkIf true { services.nfs.server.export = "/srv"; }) ]; }\n'
    )
    profile, plan = lines["switched"]
    got = [
        {k: s[k] for k in ("path", "entry")}
        for s in walk(module, fixture_config(plan, "spark1", ring=False), work)["set"]
    ]
    assert got == [
        {"path": "networking.interfaces.eth0.mtu", "entry": "networking.interfaces.<name>.mtu"},
        {"path": "services.nfs.server.export", "entry": None},
    ]


_READ = re.compile(r"\bconfig\.([A-Za-z_][A-Za-z0-9_'-]*(?:\.[A-Za-z_][A-Za-z0-9_'-]*)*)")


def _covered(path: str, entries: list[str]) -> bool:
    parts = path.split(".")
    for entry in entries:
        want = entry.split(".")
        if len(want) <= len(parts) and all(w in ("<name>", p) for w, p in zip(want, parts[: len(want)], strict=True)):
            return True
    return False


def test_the_modules_read_only_options_the_data_file_lists(data):
    entries = [*data["set"], *data["read"], *data["own"]]
    reads = {(f, m) for f in MODULE_FILES for m in _READ.findall((MODULES / f).read_text())}
    assert reads, "no config reads found: the expression is broken"
    # our own namespace may be read whole (cfg = config.tp4)
    own = [m for _, m in reads if any(e.startswith(m + ".") for e in data["own"])]
    assert sorted((f, m) for f, m in reads if not _covered(m, entries) and m not in own) == []
    assert ("spark-host.nix", "boot.kernelPackages.kernel.version") in reads


def test_every_entry_names_the_file_that_declares_it(data):
    assert data["schema"] == 1
    for kind in ("set", "read", "vm-test"):
        for path, file in data[kind].items():
            assert re.fullmatch(
                r"nixos/(modules|lib)/[a-z0-9/_.-]+\.nix|[A-Za-z0-9-]+/[A-Za-z0-9._-]+:[A-Za-z0-9/_.-]+\.nix", file
            ), (path, file)
    for path, file in data["own"].items():
        text = (REPO / file).read_text()
        leaf = path.rsplit(".", 1)[-1]
        assert f"options.{path} = " in text or f"{leaf} = mkOption" in text, (path, file)


def test_the_gpu_clock_is_capped_at_boot_and_again_by_a_timer(walks):
    """Upstream's numbers were measured with the SM clock capped at 2200 MHz, re-applied by a timer."""
    for host in ("head", "worker", "ring worker"):
        w = walks[("spark-host.nix", host)]
        service = value(w, "systemd.services.tp4-gpu-clock.serviceConfig")
        assert service["Type"] == "oneshot"
        assert systemd_exec_argv(service["ExecStart"]) == ["/nix/store/nvidia-bin/bin/nvidia-smi", "-lgc", "0,2200"]
        assert value(w, "systemd.timers.tp4-gpu-clock.wantedBy") == ["timers.target"]
        assert value(w, "systemd.timers.tp4-gpu-clock.timerConfig") == {"OnBootSec": "30s", "OnUnitActiveSec": "10min"}


def test_the_gpu_clock_cap_is_the_plans(work, lines):
    """The cap is the plan's line.gpu_clock_mhz (the profile's cluster.gpu_clock_mhz, which doctor
    checks too): another value reaches nvidia-smi, 0 leaves the clock alone (no service, no timer)."""
    profile, _ = lines["switched"]
    for mhz, expected in ((1800, ["/nix/store/nvidia-bin/bin/nvidia-smi", "-lgc", "0,1800"]), (0, None)):
        changed = work / f"clock-{mhz}.toml"
        changed.write_text(profile.read_text().replace("[cluster]\n", f"[cluster]\ngpu_clock_mhz = {mhz}\n", 1))
        plan = plan_file(changed, work / f"clock-{mhz}.json")
        assert json.loads(plan.read_text())["line"]["gpu_clock_mhz"] == (mhz or None)
        w = walk(MODULES / "spark-host.nix", fixture_config(plan, "spark2", ring=False), work)
        paths = {x["path"] for x in w["set"]}
        if expected is None:
            assert any(p.startswith("systemd.services.tp4-rdma-check") for p in paths), sorted(paths)
            assert not any("tp4-gpu-clock" in p for p in paths), sorted(p for p in paths if "clock" in p)
        else:
            assert systemd_exec_argv(value(w, "systemd.services.tp4-gpu-clock.serviceConfig")["ExecStart"]) == expected


def test_every_option_of_the_modules_is_documented(walks):
    declared = {o["path"]: o for (_, host), w in walks.items() if host == "head" for o in w["options"]}
    assert {
        "tp4.host.enable",
        "tp4.host.displayReservation.enable",
        "tp4.host.weights.localDir",
        "tp4.line.enable",
        "tp4.line.image.stream",
        "tp4.line.image.layout",
        "tp4.planFile",
        "tp4.node",
    } <= set(declared)
    for path, o in declared.items():
        assert o["hasType"] and o["description"], path


# --- the rank unit's hardening and readiness: the values the module sets ----------------------

# the serviceConfig settings of nixpkgs' ollama module (nixos/modules/services/misc/ollama.nix),
# which the rank unit is hardened after: each is applied or docs/nixos.md says why not
OLLAMA = (
    "CapabilityBoundingSet",
    "DeviceAllow",
    "DevicePolicy",
    "DynamicUser",
    "LockPersonality",
    "MemoryDenyWriteExecute",
    "NoNewPrivileges",
    "PrivateDevices",
    "PrivateTmp",
    "PrivateUsers",
    "ProcSubset",
    "ProtectClock",
    "ProtectControlGroups",
    "ProtectHome",
    "ProtectHostname",
    "ProtectKernelLogs",
    "ProtectKernelModules",
    "ProtectKernelTunables",
    "ProtectProc",
    "ProtectSystem",
    "ReadWritePaths",
    "RemoveIPC",
    "RestrictAddressFamilies",
    "RestrictNamespaces",
    "RestrictRealtime",
    "RestrictSUIDSGID",
    "StateDirectory",
    "SupplementaryGroups",
    "SystemCallArchitectures",
    "SystemCallFilter",
    "UMask",
)
HARDENING = {
    "NoNewPrivileges": True,
    "LockPersonality": True,
    "RestrictRealtime": True,
    "SystemCallArchitectures": "native",
    "RestrictAddressFamilies": ["AF_UNIX", "AF_INET", "AF_INET6", "AF_NETLINK"],
}
LIMITS = {
    "LimitMEMLOCK": "infinity",
    "Restart": "on-failure",
    "RestartSec": "10s",
    "RestartSteps": 5,
    "RestartMaxDelaySec": "5min",
}
RANK_UNITS = {"head": "podman-dsv41-head", "worker": "podman-dsv41-worker", "ring worker": "podman-dsv41-worker"}


def value(w: dict, path: str):
    found = [s["value"] for s in w["set"] if s["path"] == path]
    assert len(found) == 1, (path, [s["path"] for s in w["set"]])
    return found[0]


def test_the_rank_unit_carries_the_plans_digest(walks, lines):
    """The running line carries the plan's digest: the container's tp4.line.plan label and the unit's
    environment (TP4_PLAN), both the digest of the committed plan file the host reads."""
    for host, unit in RANK_UNITS.items():
        line = "ring" if host == "ring worker" else "switched"
        digest = json.loads(Path(lines[line][1]).read_text())["digest"]
        w = walks[("tp4-line.nix", host)]
        assert value(w, f"systemd.services.{unit}.environment") == {"TP4_PLAN": digest}
        container = unit.removeprefix("podman-")
        assert value(w, f"virtualisation.oci-containers.containers.{container}.labels")["tp4.plan"] == digest


def test_the_rank_unit_is_hardened_as_far_as_its_runtime_allows(walks):
    for host, unit in RANK_UNITS.items():
        assert value(walks[("tp4-line.nix", host)], f"systemd.services.{unit}.serviceConfig") == {**HARDENING, **LIMITS}
    assert set(HARDENING) <= set(OLLAMA)
    # every other setting of ollama's is named in the docs with why the rank unit does without it
    docs = (REPO / "docs" / "nixos.md").read_text()
    section = docs.split("## Hardening of the rank unit", 1)[1].split("\n## ", 1)[0]
    rows = {m.group(1): m.group(2) for m in re.finditer(r"^\| `([A-Za-z]+)` \| (applied|left out) \|", section, re.M)}
    assert rows == {k: "applied" if k in HARDENING else "left out" for k in OLLAMA}


def test_the_watchdog_runs_on_the_head_hardened_like_the_rank_with_its_scrape_jobs(walks, lines):
    """tp4.line.watch.enable on the head: tp4-watch.service runs `tp4 watch` on the profile with
    the rank unit's hardening, restarted on failure but not after it gave up (exit 3), and
    services.prometheus (enabled in the fixture) gets a job for the watchdog's loopback metrics
    and one for the head's SGLang /metrics on the line's API port."""
    head = walks[("tp4-line.nix", "head")]
    sc = value(head, "systemd.services.tp4-watch.serviceConfig")
    assert {k: sc[k] for k in HARDENING} == HARDENING
    assert sc["Restart"] == "on-failure" and sc["RestartPreventExitStatus"] == 3
    assert sc["StateDirectory"] == "tp4-watch"
    exec_start = sc["ExecStart"]
    assert exec_start.startswith('"/nix/store/tp4/bin/tp4" "watch" "--profile" ')
    assert '"--metrics" "127.0.0.1:9478"' in exec_start
    api_port = json.loads(lines["switched"][1].read_text())["line"]["api_port"]
    jobs = value(head, "services.prometheus.scrapeConfigs")
    assert [j["job_name"] for j in jobs] == ["tp4-watch", "tp4-sglang"]
    assert jobs[0]["static_configs"] == [{"targets": ["127.0.0.1:9478"]}]
    assert jobs[1]["static_configs"] == [{"targets": [f"127.0.0.1:{api_port}"]}]
    worker = walks[("tp4-line.nix", "worker")]
    assert not [s for s in worker["set"] if s["path"].startswith(("systemd.services.tp4-watch", "services.prometheus"))]


def test_the_readiness_unit_runs_beside_the_rank_and_is_bounded(walks):
    for host, unit in RANK_UNITS.items():
        w = walks[("tp4-line.nix", host)]
        ready = "systemd.services.tp4-rank-ready"
        assert (
            value(w, f"{ready}.wantedBy")
            == value(w, f"{ready}.after")
            == value(w, f"{ready}.bindsTo")
            == [f"{unit}.service"]
        )
        sc = value(w, f"{ready}.serviceConfig")
        bound = 9000 if host == "head" else 4200
        assert {k: sc[k] for k in ("Type", "RemainAfterExit", "TimeoutStartSec")} == {
            "Type": "oneshot",
            "RemainAfterExit": True,
            "TimeoutStartSec": bound + 60,
        }
        # tp4's own boot-log check (the package's CLI) on the committed plan, which evaluation
        # copies to the store as it is: this rank's pattern, bound and lines are the plan's
        argv = systemd_exec_argv(sc["ExecStart"])
        rank = "0" if host == "head" else ("1" if host == "worker" else "2")
        assert argv[:5] == ["/nix/store/tp4/bin/tp4", "bootlog", "wait", "--rank", rank]
        assert (
            argv[5] == "--plan"
            and re.fullmatch(r"/nix/store/[a-z0-9]{32}-(switched|ring)\.json", argv[6])
            and len(argv) == 7
        )
        assert value(w, f"{ready}.path") == ["/nix/store/podman"]
        # the rank's own start waits for nothing of it
        assert "tp4-rank-ready.service" not in value(w, f"systemd.services.{unit}.after") + value(
            w, f"systemd.services.{unit}.requires"
        )


def test_the_rank_unit_gives_podman_the_images_health_check(walks, lines, work):
    """podman reads no health check from the OCI image the rank runs, so the unit passes the plan's
    run.health as flags: the container's extraOptions, which oci-containers.nix puts into the
    unit's `podman run` each through escapeShellArg (nixos/modules/virtualisation/oci-containers.nix,
    mkService's script, read at NixOS/nixpkgs 035a24e7); the shell hands podman these words back
    unchanged, the command one JSON array (podman's exec form). podman.sdnotify is left at
    oci-containers' default, conmon (docs/nixos.md says why)."""
    ranks = {"head": ("switched", 0), "worker": ("switched", 1), "ring worker": ("ring", 2)}
    for host, unit in RANK_UNITS.items():
        w = walks[("tp4-line.nix", host)]
        line, rank = ranks[host]
        h = json.loads(lines[line][1].read_text())["nodes"][rank]["run"]["health"]
        prefix = f"virtualisation.oci-containers.containers.{unit.removeprefix('podman-')}"
        opts = value(w, f"{prefix}.extraOptions")
        assert opts[-5:] == [
            f"--health-cmd={json.dumps(h['cmd'], separators=(',', ':'))}",
            f"--health-interval={h['interval']}s",
            f"--health-timeout={h['timeout']}s",
            f"--health-start-period={h['start_period']}s",
            f"--health-retries={h['retries']}",
        ]
        assert h["cmd"] == ["python3", "-S", "/opt/dsv41/boot.py", "health"]
        escaped, err = nix_eval(
            f"map (import {nix_path(STUB_LIB)}).escapeShellArg (builtins.fromJSON {json.dumps(json.dumps(opts))})",
            work / "nix",
        )
        assert err == "", err
        assert shlex.split(" ".join(escaped)) == opts
        assert not any(s["path"].startswith(f"{prefix}.podman") for s in w["set"])


# --- the RDMA check unit's script ------------------------------------------------------------


def fake_sysfs(
    root: Path, hca: str, *, state: str = "4: ACTIVE", gids: dict[int, tuple[str, str]] | None = None
) -> None:
    port = root / "class" / "infiniband" / hca / "ports" / "1"
    (port / "gids").mkdir(parents=True, exist_ok=True)
    (port / "gid_attrs" / "types").mkdir(parents=True, exist_ok=True)
    (port / "state").write_text(state + "\n")
    for i, (gid, kind) in (gids or {}).items():
        (port / "gids" / str(i)).write_text(gid + "\n")
        (port / "gid_attrs" / "types" / str(i)).write_text(kind + "\n")


MAPPED = "0000:0000:0000:0000:0000:ffff:0a00:0001"  # 10.0.0.1
GIDS = {
    0: ("fe80:0000:0000:0000:0000:00ff:fe00:0001", "IB/RoCE v1"),
    1: ("fe80:0000:0000:0000:0000:00ff:fe00:0001", "RoCE v2"),
    2: (MAPPED, "IB/RoCE v1"),
    3: (MAPPED, "RoCE v2"),
}


def rdma_check(root: Path, *args: str, timeout: int = 0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["sh", str(RDMA_CHECK), str(timeout), str(root / "run" / "gid-index"), *args],
        capture_output=True,
        text=True,
        env={"TP4_SYSFS": str(root), "PATH": "/usr/bin:/bin"},
    )


def test_the_rdma_check_writes_the_roce_v2_gid_index(tmp_path):
    fake_sysfs(tmp_path, "rocep1s0f0", gids=GIDS)
    fake_sysfs(tmp_path, "roceP2p1s0f0", gids={5: ("0000:0000:0000:0000:0000:ffff:0a00:0101", "RoCE v2")})
    proc = rdma_check(
        tmp_path, "-", "rocep1s0f0", "enp1s0f0np0", "10.0.0.1", "roceP2p1s0f0", "enP2p1s0f0np0", "10.0.1.1"
    )
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "run" / "gid-index").read_text() == "rocep1s0f0 3\nroceP2p1s0f0 5\n"
    assert "rocep1s0f0 (enp1s0f0np0 10.0.0.1) ACTIVE, RoCE v2 GID index 3" in proc.stdout
    assert rdma_check(tmp_path, "3", "rocep1s0f0", "enp1s0f0np0", "10.0.0.1").returncode == 0


@pytest.mark.parametrize(
    ("case", "message"),
    [
        (
            "down",
            "tp4-rdma-check: after 0 s: rocep1s0f0 port 1 is '1: DOWN', not ACTIVE; fix: cable and link of enp1s0f0np0",
        ),
        (
            "no gid",
            "tp4-rdma-check: after 0 s: rocep1s0f0 has no RoCE v2 GID for 10.0.0.1 (0000:0000:0000:0000:0000:ffff:0a00:0001); fix: give enp1s0f0np0 the address 10.0.0.1",
        ),
        ("only v1", "tp4-rdma-check: after 0 s: rocep1s0f0 has no RoCE v2 GID for 10.0.0.1"),
        (
            "no device",
            "tp4-rdma-check: after 0 s: rocep1s0f0: no such RDMA device (for enp1s0f0np0 10.0.0.1); fix: load mlx5_ib",
        ),
        (
            "pinned elsewhere",
            "tp4-rdma-check: rocep1s0f0: the RoCE v2 GID of 10.0.0.1 is at index 3, the profile pins 2; fix: set the node's gid_index = 3",
        ),
    ],
)
def test_the_rdma_check_fails_loudly(tmp_path, case, message):
    pinned = "-"
    if case == "down":
        fake_sysfs(tmp_path, "rocep1s0f0", state="1: DOWN", gids=GIDS)
    elif case == "no gid":
        fake_sysfs(tmp_path, "rocep1s0f0", gids={k: v for k, v in GIDS.items() if k < 2})
    elif case == "only v1":
        fake_sysfs(tmp_path, "rocep1s0f0", gids={k: v for k, v in GIDS.items() if k != 3})
    elif case == "pinned elsewhere":
        fake_sysfs(tmp_path, "rocep1s0f0", gids=GIDS)
        pinned = "2"
    (tmp_path / "class" / "infiniband").mkdir(parents=True, exist_ok=True)
    proc = rdma_check(tmp_path, pinned, "rocep1s0f0", "enp1s0f0np0", "10.0.0.1")
    assert proc.returncode == 1
    assert message in proc.stderr
    assert not (tmp_path / "run" / "gid-index").exists()


def test_the_rdma_check_waits_for_a_port_that_comes_up_and_gives_up_at_its_deadline(tmp_path):
    """At boot a port becomes ACTIVE seconds after the driver loads: the check retries each second
    until its deadline (the unit's TimeoutStartSec is above it) and passes once the port is up;
    a port that stays down fails after the deadline, naming it; a wrong pin fails at once."""
    fake_sysfs(tmp_path, "rocep1s0f0", state="1: DOWN", gids=GIDS)
    state = tmp_path / "class" / "infiniband" / "rocep1s0f0" / "ports" / "1" / "state"
    proc = subprocess.Popen(
        [
            "sh",
            str(RDMA_CHECK),
            "10",
            str(tmp_path / "run" / "gid-index"),
            "-",
            "rocep1s0f0",
            "enp1s0f0np0",
            "10.0.0.1",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={"TP4_SYSFS": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )
    time.sleep(2.5)
    assert proc.poll() is None  # still waiting
    state.write_text("4: ACTIVE\n")
    out, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    assert "tp4-rdma-check: waiting up to 10 s: rocep1s0f0 port 1 is '1: DOWN'" in out
    assert (tmp_path / "run" / "gid-index").read_text() == "rocep1s0f0 3\n"
    state.write_text("1: DOWN\n")
    began = time.monotonic()
    down = rdma_check(tmp_path, "-", "rocep1s0f0", "enp1s0f0np0", "10.0.0.1", timeout=2)
    assert down.returncode == 1 and time.monotonic() - began >= 2
    assert "tp4-rdma-check: after 2 s: rocep1s0f0 port 1 is '1: DOWN', not ACTIVE" in down.stderr
    state.write_text("4: ACTIVE\n")
    began = time.monotonic()
    pinned = rdma_check(tmp_path, "2", "rocep1s0f0", "enp1s0f0np0", "10.0.0.1", timeout=60)
    assert pinned.returncode == 1 and time.monotonic() - began < 5 and "the profile pins 2" in pinned.stderr


# --- the flake's NixOS outputs (against the stand-in nixpkgs: NixOS cannot be evaluated here) ----


def test_the_flake_has_the_modules_the_example_hosts_and_the_template(tmp_path):
    copy = locked_flake_copy(REPO, tmp_path / "flake")
    inputs = stub_inputs(REPO, empty_flake(tmp_path / "empty"))

    def evaluate(attr: str, apply: str):
        proc = nix(["eval", "--json", f"path:{copy}#{attr}", "--apply", apply, *inputs, "--impure"], tmp_path)
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)

    assert evaluate("nixosModules", "builtins.attrNames") == ["default", "spark-host", "tp4-line", "tp4-router"]
    assert evaluate(
        "nixosModules.spark-host",
        "m: map (p: baseNameOf (toString p)) (builtins.filter (p: !builtins.isFunction p) m.imports)",
    ) == ["dgx-spark.nix", "spark-host.nix"]
    template = evaluate(
        "templates.spark-line", "t: { inherit (t) description; files = builtins.attrNames (builtins.readDir t.path); }"
    )
    assert template["files"] == ["configuration.nix", "flake.nix", "hosts.toml", "plan.json", "profile.toml"]
    assert "TP4 line" in template["description"]
    # the flake's own outputs hold no host (the line's flake does, from the template); the hosts
    # of lib.lineConfigurations on the example, each with its hardware (a directory of
    # <host>/hardware-configuration.nix, as tests/test_nixos_example.py shows)
    absent = nix(["eval", "--json", f"path:{copy}#nixosConfigurations", *inputs], tmp_path)
    assert absent.returncode != 0 and "does not provide attribute" in absent.stderr, absent.stderr
    hw = tmp_path / "hardware"
    for i in range(1, 5):
        (hw / f"spark{i}").mkdir(parents=True)
        (hw / f"spark{i}" / "hardware-configuration.nix").write_text("{ }\n")
    ex = copy / "examples" / "spark-line"
    hosts = evaluate(
        "lib",
        f"""l: builtins.mapAttrs (n: c: let ms = c.stub.args.modules; in {{
      own = builtins.elemAt ms 1;
      rest = map (p: baseNameOf (toString p)) (builtins.tail (builtins.tail ms));
      toplevel = c.config.system.build.toplevel.type; }}) (l.lineConfigurations {{
        plan = {nix_path(ex / "plan.json")}; hostsFile = {nix_path(ex / "hosts.toml")};
        modules = [ {nix_path(ex / "configuration.nix")} ]; hardware = {nix_path(hw)}; }})""",
    )
    assert list(hosts) == ["spark1", "spark2", "spark3", "spark4"]
    for name, h in hosts.items():
        assert h["own"]["networking"] == {"hostName": name}
        assert (
            h["own"]["tp4"]["node"] == name
            and h["own"]["tp4"]["host"] == {"enable": True}
            and h["own"]["tp4"]["line"] == {"enable": True}
        )
        assert h["own"]["tp4"]["planFile"].endswith("-plan.json") and h["own"]["tp4"]["hostsFile"].endswith(
            "-hosts.toml"
        )
        assert "profile" not in h["own"]["tp4"]
        assert h["rest"] == ["hardware-configuration.nix", "configuration.nix"] and h["toplevel"] == "derivation"


# --- the ring's hairpin queues --------------------------------------------------------------

HAIRPIN = MODULES / "ring-hairpin.sh"

# a devlink that keeps each function's driverinit hairpin_queue_size in a file and logs its calls
FAKE_DEVLINK = r"""#!/bin/sh
echo "$*" >> "$TP4_DEVLINK_LOG"
f="$TP4_DEVLINK_STATE/$(echo "$4" | tr '/:' '__')"
if [ "$1 $2 $3" = "dev param show" ]; then
  [ -f "$f" ] || { echo "Error: No such device" >&2; exit 1; }
  printf '%s:\n  name hairpin_queue_size type driver-specific\n    values:\n      cmode driverinit value %s\n' "$4" "$(cat "$f")"
elif [ "$1 $2 $3" = "dev param set" ]; then
  echo "$8" > "$f"
fi
"""


def hairpin(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    bin_dir = tmp / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "devlink").write_text(FAKE_DEVLINK)
    (bin_dir / "devlink").chmod(0o755)
    return subprocess.run(
        ["sh", str(HAIRPIN), *args],
        capture_output=True,
        text=True,
        env={
            "PATH": f"{bin_dir}:/usr/bin:/bin",
            "TP4_DEVLINK_LOG": str(tmp / "log"),
            "TP4_DEVLINK_STATE": str(tmp / "state"),
        },
    )


def test_the_ring_sets_the_hairpin_queue_once(tmp_path):
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "pci_0000_01_00.0").write_text("1024\n")
    (tmp_path / "state" / "pci_0000_01_00.1").write_text("8192\n")
    proc = hairpin(tmp_path, "8192", "0000:01:00.0", "0000:01:00.1")
    assert proc.returncode == 0, proc.stderr
    calls = (tmp_path / "log").read_text().splitlines()
    assert calls == [
        "dev param show pci/0000:01:00.0 name hairpin_queue_size",
        "dev param set pci/0000:01:00.0 name hairpin_queue_size value 8192 cmode driverinit",
        "dev reload pci/0000:01:00.0",
        "dev param show pci/0000:01:00.1 name hairpin_queue_size",
    ]
    assert "pci/0000:01:00.1 hairpin_queue_size is 8192 already" in proc.stdout
    # a second run re-initialises nothing
    (tmp_path / "log").unlink()
    assert hairpin(tmp_path, "8192", "0000:01:00.0", "0000:01:00.1").returncode == 0
    assert not any(c.startswith(("dev param set", "dev reload")) for c in (tmp_path / "log").read_text().splitlines())


def links(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["sh", str(MODULES / "ring-links.sh"), *argv],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "TP4_SYSFS": str(tmp_path / "sys")},
    )


def link(tmp_path: Path, dev: str, state: str, carrier: str) -> None:
    d = tmp_path / "sys" / "class" / "net" / dev
    d.mkdir(parents=True, exist_ok=True)
    (d / "operstate").write_text(state + "\n")
    (d / "carrier").write_text(carrier + "\n")


def test_the_ring_waits_for_its_fabric_links_and_names_those_that_stay_down(tmp_path):
    for dev in ("enp1s0f0np0", "enp1s0f1np1"):
        link(tmp_path, dev, "up", "1")
    ok = links(tmp_path, "120", "enp1s0f0np0", "enp1s0f1np1")
    assert ok.returncode == 0 and "the fabric links are up" in ok.stdout, ok.stderr
    link(tmp_path, "enp1s0f1np1", "down", "0")
    down = links(tmp_path, "1", "enp1s0f0np0", "enp1s0f1np1", "enP2p1s0f0np0")
    assert down.returncode == 1
    assert "fabric links not up after 1 s: enp1s0f1np1(down) enP2p1s0f0np0(absent); fix: check each DAC" in down.stderr
    # a link that comes up while it waits
    link(tmp_path, "enp1s0f1np1", "down", "0")
    waiting = subprocess.Popen(
        ["sh", str(MODULES / "ring-links.sh"), "20", "enp1s0f0np0", "enp1s0f1np1"],
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "TP4_SYSFS": str(tmp_path / "sys")},
    )
    time.sleep(1.5)
    assert waiting.poll() is None
    link(tmp_path, "enp1s0f1np1", "up", "1")
    out, err = waiting.communicate(timeout=10)
    assert waiting.returncode == 0, err
    assert links(tmp_path, "x", "enp1s0f0np0").returncode == 1


def test_the_ring_fails_on_a_missing_function(tmp_path):
    (tmp_path / "state").mkdir()
    proc = hairpin(tmp_path, "8192", "0002:01:00.0")
    assert proc.returncode == 1
    assert (
        "tp4-mesh: pci/0002:01:00.0 has no hairpin_queue_size" in proc.stderr
        and "fix: check the function" in proc.stderr
    )


# --- the weights volume (real podman) ---------------------------------------------------------

WEIGHTS_VOLUME = MODULES / "weights-volume.sh"


def weights_volume(name: str, *options: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["sh", str(WEIGHTS_VOLUME), "podman", name, *options], capture_output=True, text=True)


def volume_options(name: str) -> dict[str, str]:
    proc = subprocess.run(
        ["podman", "volume", "inspect", "--format", "{{json .Options}}", name],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(proc.stdout)


def test_the_weights_volume_is_made_once_and_replaced_only_when_unused(tmp_path):
    name = f"tp4-test-weights-{uuid.uuid4().hex[:8]}"
    image = f"localhost/{name}:1"
    nfs = ("nfs", "addr=10.0.0.1,nfsvers=4.2,ro,nconnect=8,rsize=1048576,wsize=1048576,hard,timeo=600", ":/srv/model")
    local = tmp_path / "model"
    local.mkdir()
    try:
        assert weights_volume(name, *nfs).stdout == f"tp4-weights-volume: {name} created: {' '.join(nfs)}\n"
        assert volume_options(name) == dict(zip(("type", "o", "device"), nfs, strict=True))
        assert weights_volume(name, *nfs).stdout == f"tp4-weights-volume: {name} is {' '.join(nfs)}\n"
        bind = ("none", "bind", str(local))
        assert weights_volume(name, *bind).stdout == f"tp4-weights-volume: {name} recreated: none bind {local}\n"
        assert volume_options(name) == {"type": "none", "o": "bind", "device": str(local)}
        # a container that uses it keeps it
        root = tmp_path / "root" / "bin"
        root.mkdir(parents=True)
        shutil.copy2(BUSYBOX, root / "sh")
        subprocess.run(["tar", "-C", str(tmp_path / "root"), "-cf", str(tmp_path / "root.tar"), "bin"], check=True)
        subprocess.run(["podman", "import", str(tmp_path / "root.tar"), image], capture_output=True, check=True)
        subprocess.run(
            ["podman", "create", "--name", name, "-v", f"{name}:/w:ro", image, "/bin/sh"],
            capture_output=True,
            check=True,
        )
        proc = weights_volume(name, *nfs)
        assert proc.returncode == 1
        assert (
            f"tp4-weights-volume: {name} is 'none bind {local}', not '{' '.join(nfs)}', and a container uses it; fix: tp4 stop"
            in proc.stderr
        )
        assert volume_options(name)["device"] == str(local)
    finally:
        subprocess.run(["podman", "rm", "-f", name], capture_output=True)
        subprocess.run(["podman", "volume", "rm", "-f", name], capture_output=True)
        subprocess.run(["podman", "rmi", "-f", image], capture_output=True)


def test_the_hosts_evaluate_from_the_committed_plan_with_no_import_from_derivation(tmp_path):
    """The example line's hosts as the flake's lib.lineConfigurations makes them, each host's own
    tp4 settings then evaluated by modules/common.nix and the two modules (walked), with Nix
    refusing any import from a derivation: the plan is a committed file, read as it is, and
    nothing is built to evaluate a host. The template's flake checks that the file is current."""
    copy = locked_flake_copy(REPO, tmp_path / "flake")
    inputs = stub_inputs(REPO, empty_flake(tmp_path / "empty"))
    hw = tmp_path / "hardware"
    for i in range(1, 5):
        (hw / f"spark{i}").mkdir(parents=True)
        (hw / f"spark{i}" / "hardware-configuration.nix").write_text("{ }\n")
    ex = copy / "examples" / "spark-line"
    apply = f"""l: builtins.mapAttrs (n: c: let
        own = (builtins.elemAt c.stub.args.modules 1).tp4;
        config = {{ networking.hostName = n; tp4 = own // {{ package = "/nix/store/tp4"; host = own.host // {{ weights.localDir = null; }}; }}; }};
        common = import {nix_path(copy / "modules" / "common.nix")} {{ inherit config; lib = import {nix_path(STUB_LIB)}; }};
        s = common.config.tp4.settings;
      in {{ inherit (s) name rank; unit = s.rankUnit.unit; ready = s.rankUnit.readiness; exports = s.nfs.exports; }})
      (l.lineConfigurations {{ plan = {nix_path(ex / "plan.json")}; hostsFile = {nix_path(ex / "hosts.toml")};
        modules = [ {nix_path(ex / "configuration.nix")} ]; hardware = {nix_path(hw)}; }})"""
    proc = nix(
        [
            "eval",
            "--json",
            f"path:{copy}#lib",
            "--apply",
            apply,
            *inputs,
            "--impure",
            "--option",
            "allow-import-from-derivation",
            "false",
        ],
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    hosts = json.loads(proc.stdout)
    plan = json.loads((EXAMPLE / "plan.json").read_text())
    assert list(hosts) == [n["name"] for n in plan["nodes"]]
    for node in plan["nodes"]:
        h = hosts[node["name"]]
        assert h["rank"] == node["rank"] and h["unit"] == node["service"]["unit"]
        assert h["ready"]["timeout"] == node["service"]["ready"]["timeout"]
    assert hosts["spark1"]["exports"].startswith(plan["line"]["nfs"]["export"] + " ")
    # the modules no longer take the profile, and nothing in them renders a plan
    for f in ("common.nix", "tp4-line.nix", "spark-host.nix"):
        text = (MODULES / f).read_text()
        assert "runCommand" not in text and "fromTOML (builtins.readFile cfg.profile" not in text, f


def test_the_committed_example_plan_is_current(tp4_cli):
    """examples/spark-line/plan.json is what its profile renders (the flake's plan-current check
    runs the same command)."""
    code, _, err = tp4_cli("plan", "--check", EXAMPLE / "plan.json", "--profile", EXAMPLE / "profile.toml")
    assert code == 0, err


def _assertions(w: dict) -> list[dict]:
    return [a for s in w["set"] if s["path"] == "assertions" for a in s["value"]]


def test_a_ring_with_roce_paths_keeps_a_marker_on_every_fabric_device(walks, work, lines):
    """The ring worker's plan arms DSV41_ROCE_RING=1: one marker unit per fabric RDMA device with
    sparkring's probe argv, bound to the mesh, UDP port 65535 reserved; without the marker's
    package the module asserts with the fix (build the probe, or DSV41_ROCE_RING=0)."""
    w = walks[("spark-host.nix", "ring worker")]
    devices = ("rocep1s0f0", "rocep1s0f1", "roceP2p1s0f0", "roceP2p1s0f1")
    for dev in devices:
        unit = f"systemd.services.tp4-mesh-marker@{dev}"
        assert value(w, f"{unit}.serviceConfig") == {
            "Type": "simple",
            "Restart": "on-failure",
            "RestartSec": "2s",
            "LimitMEMLOCK": "infinity",
            "ExecStart": f'"/nix/store/marker/bin/mlx5-rdma-tx-rewrite-probe" "--device" "{dev}" "--source-port" "65535" '
            '"--replacement-ethertype" "0x88b5" "--attach" "--managed"',
        }
        assert value(w, f"{unit}.bindsTo") == value(w, f"{unit}.after") == ["tp4-mesh.service"]
        assert value(w, f"{unit}.restartIfChanged") is False
    sysctls = [s["value"] for s in w["set"] if s["path"] == "boot.kernel.sysctl"]
    assert {"net.ipv4.ip_local_reserved_ports": "65535"} in sysctls
    marker_checks = [a for a in _assertions(w) if a["message"].startswith("tp4.host.ring.marker")]
    assert len(marker_checks) == 1 and marker_checks[0]["assertion"]
    assert not any(
        s["path"].startswith("systemd.services.tp4-mesh-marker")
        for h in ("head", "worker")
        for s in walks[("spark-host.nix", h)]["set"]
    )
    requires = value(walks[("tp4-line.nix", "ring worker")], "systemd.services.podman-dsv41-worker.requires")
    assert [r for r in requires if r.startswith("tp4-mesh-marker@")] == [
        f"tp4-mesh-marker@{d}.service" for d in devices
    ]

    profile, plan = lines["ring"]
    bare = walk(
        MODULES / "spark-host.nix",
        fixture_config(plan, "spark3", ring=True).replace('"/nix/store/marker"', "null"),
        work,
    )
    failing = [
        a["message"] for a in _assertions(bare) if not a["assertion"] and a["message"].startswith("tp4.host.ring")
    ]
    assert len(failing) == 1 and failing[0].startswith("tp4.host.ring.marker.package: the plan arms DSV41_ROCE_RING=1")
    assert "mlx5_rdma_tx_rewrite_probe.c" in failing[0] and 'gates.DSV41_ROCE_RING = "0"' in failing[0]
    assert not any(s["path"].startswith("systemd.services.tp4-mesh-marker") for s in bare["set"])


def test_every_node_of_a_ring_forwards_ipv4(walks):
    """A ring's mesh routes a node's traffic to the opposite node via a neighbour, which forwards it
    (tp4 doctor's RING.IP_FORWARD): spark-host sets net.ipv4.ip_forward on every node of a ring
    (boot.kernel.sysctl takes an int; nixpkgs nixos/modules/config/sysctl.nix, read at 05924f71,
    writes it to sysctl.d/60-nixos.conf), and leaves it alone on a switched line."""

    def sysctl(host: str) -> dict:
        return {
            k: v
            for s in walks[("spark-host.nix", host)]["set"]
            if s["path"] == "boot.kernel.sysctl"
            for k, v in s["value"].items()
        }

    assert sysctl("ring worker")["net.ipv4.ip_forward"] == 1
    assert "net.ipv4.ip_forward" not in sysctl("head") and "net.ipv4.ip_forward" not in sysctl("worker")


def test_the_drm_node_gets_a_device_unit_and_needs_the_reservation(walks, work, lines):
    w = walks[("spark-host.nix", "ring worker")]
    assert value(w, "services.udev.extraRules") == 'SUBSYSTEM=="drm", KERNEL=="card0", TAG+="systemd"\n'
    assert "dev-dri-card0.device" in value(
        walks[("tp4-line.nix", "ring worker")], "systemd.services.podman-dsv41-worker.requires"
    )
    assert not any(s["path"] == "services.udev.extraRules" for s in walks[("spark-host.nix", "head")]["set"])
    profile, plan = lines["ring"]
    off = walk(
        MODULES / "spark-host.nix",
        fixture_config(plan, "spark3", ring=True).replace(
            "displayReservation.enable = true", "displayReservation.enable = false"
        ),
        work,
    )
    failing = [
        a["message"]
        for a in _assertions(off)
        if not a["assertion"] and a["message"].startswith("tp4.host.displayReservation.enable")
    ]
    assert [
        a["message"]
        for a in _assertions(w)
        if a["message"].startswith("tp4.host.displayReservation.enable") and not a["assertion"]
    ] == []
    assert failing == [
        "tp4.host.displayReservation.enable: the plan hands the engine the display reservation's DRM node (DSV41_ENGRAM_DRM_NODE=/dev/dri/card0), which is only free with the reservation kept; fix: set tp4.host.displayReservation.enable = true, or unset DSV41_ENGRAM_DRM_NODE in the profile"
    ]


def test_the_router_unit_runs_the_fleet_plans_command(walks, work, lines):
    """nixosModules.tp4-router: tp4-router.service runs `tp4 fleet plan --json`'s router command
    as it is (tp4's launcher, the router's arguments over every line), its Python first; not at
    boot (tp4 fleet serve starts it); the API port open, metrics not; a fleet file that runs the
    router as a process, a plan of something else, or no Python are assertions with their fix."""
    w = walks[("tp4-router.nix", "head")]
    doc = json.loads(lines["fleet"].read_text())
    command = doc["router"]["command"]
    assert command[1:3] == ["-c", fleet.LAUNCHER] and command[4] == "sglang_router.launch_router"
    sc = value(w, "systemd.services.tp4-router.serviceConfig")
    assert systemd_exec_argv(sc["ExecStart"]) == ["/opt/tp4/.venv/bin/python", *command[1:]]
    assert "--worker-urls" in command and command[command.index("--worker-urls") + 1 :][:2] == [
        "http://10.0.0.1:8888",
        "http://10.0.0.5:8888",
    ]
    assert {k: sc[k] for k in ("Type", "Restart", "NoNewPrivileges")} == {
        "Type": "simple",
        "Restart": "on-failure",
        "NoNewPrivileges": True,
    }
    assert value(w, "systemd.services.tp4-router.restartIfChanged") is False
    assert not any(s["path"] == "systemd.services.tp4-router.wantedBy" for s in w["set"])
    assert [30000] in [s["value"] for s in w["set"] if s["path"] == "networking.firewall.allowedTCPPorts"]
    # the router's state directory: the unit's own StateDirectory (/var/lib/tp4-router), 0700
    assert (sc["StateDirectory"], sc["StateDirectoryMode"]) == ("tp4-router", "0700")
    assert not any("tp4-router" in rule for rule in value(w, "systemd.tmpfiles.rules"))
    assert all(a["assertion"] for a in _assertions(w)), [a["message"] for a in _assertions(w) if not a["assertion"]]

    profile, plan = lines["switched"]
    process = walk(
        MODULES / "tp4-router.nix",
        fixture_config(plan, "spark1", ring=False, router=fleet_plan(work, service="process")),
        work,
    )
    failing = [a["message"] for a in _assertions(process) if not a["assertion"]]
    assert failing == [
        'tp4.router: the fleet file runs its router as a plain process (router.service = "process"), so tp4 fleet serve would not start this unit; fix: set router.service = "unit" in the fleet file'
    ]
    other = walk(MODULES / "tp4-router.nix", fixture_config(plan, "spark1", ring=False, router=plan), work)
    failing = [a["message"] for a in _assertions(other) if not a["assertion"]]
    assert (
        len(failing) == 3
        and failing[0].startswith("tp4.router.fleetPlan: ")
        and "is not a tp4 fleet plan" in failing[0]
    )
    assert failing[2].startswith("tp4.router.python: no Python with the router: nixpkgs has no sglang-router package")
    off = walk(MODULES / "tp4-router.nix", fixture_config(plan, "spark1", ring=False), work)
    assert off["set"] == [] or all(not s["path"].startswith("systemd.services.tp4-router") for s in off["set"])


def test_the_kernel_check_accepts_nixos_dgx_sparks_kernel_and_no_other(work, lines):
    """With the modules' own default, the kernel nixos-dgx-spark builds passes the assertion; a
    kernel of the same release without its `-nvidia` (a stock linux_6_17 at 6.17.13, what the
    assertion once expected) fails it with the fix; tp4.host.kernel.allowOther lets it pass."""
    profile, plan = lines["switched"]
    kernel_checks = lambda w: [a for a in _assertions(w) if a["message"].startswith("tp4.host: the kernel is")]  # noqa: E731
    nvidia = walk(MODULES / "spark-host.nix", fixture_config(plan, "spark2", ring=False), work)
    assert [a["assertion"] for a in kernel_checks(nvidia)] == [True]
    stock = {"version": NVIDIA_KERNEL["modDirVersion"], "modDirVersion": NVIDIA_KERNEL["modDirVersion"]}
    other = walk(MODULES / "spark-host.nix", fixture_config(plan, "spark2", ring=False, kernel=stock), work)
    [check] = kernel_checks(other)
    assert check["assertion"] is False
    assert check["message"].startswith(
        "tp4.host: the kernel is 6.17.13 (modDirVersion 6.17.13), the line is validated on 6.17.13-nvidia"
    )
    assert "hardware.dgx-spark.useNvidiaKernel = true" in check["message"]
    allowed = walk(
        MODULES / "spark-host.nix",
        fixture_config(plan, "spark2", ring=False, kernel=stock).replace("allowOther = false", "allowOther = true"),
        work,
    )
    assert [a["assertion"] for a in kernel_checks(allowed)] == [True]


def nix_string(s: str) -> str:
    """A Nix string literal of s (JSON's escapes, and `${` kept from interpolating)."""
    return json.dumps(s).replace("${", "\\${")


@pytest.mark.parametrize(
    "arg", ["50%", "%n", "$HOME", "${X}", "two words", "it's", 'say "hi"', "a\\b", "line\nbreak", "\t;", ""]
)
def test_exec_lines_are_escaped_for_systemd_not_for_a_shell(work, arg):
    """Every Exec* line of the modules goes through utils.escapeSystemdExecArgs (systemd expands
    `%` specifiers and `$` variables in arguments and reads C escapes, not a shell's quotes): the
    stand-in's escaping of a hostile argument comes back as that argument from systemd's
    unquoting, and no module writes an Exec* line another way."""
    line, err = nix_eval(
        f'(import {nix_path(STUB_UTILS)}).escapeSystemdExecArgs [ "/bin/x" {nix_string(arg)} ]', work / "nix"
    )
    assert err == "" and isinstance(line, str)
    assert systemd_exec_argv(line) == ["/bin/x", arg]
    if "%" in arg or "'" in arg:
        shell_quoted, _ = nix_eval(f"(import {nix_path(STUB_LIB)}).escapeShellArgs [ {nix_string(arg)} ]", work / "nix")
        with pytest.raises(ValueError):
            systemd_exec_argv(str(shell_quoted))
    for module in MODULE_FILES:
        text = (MODULES / module).read_text()
        # a shell script may quote for the shell; an Exec* line never does (below)
        for m in re.finditer(r"\bExec(Start|StartPre|StartPost|Stop|StopPost|Reload)\s*=\s*(.*)", text):
            value = m.group(2)
            assert value.startswith(("escapeSystemdExecArgs", "[", "if ")), (module, m.group(0))


def test_the_display_reservation_holds_on_the_command_line_a_spark_host_gets(walks, work, lines):
    """On nixos-dgx-spark's and the nvidia module's kernel command line plus ours, every assertion
    of the host module holds; without our parameters the nvidia module's fbdev=1 is refused."""
    for host in ("head", "worker", "ring worker"):
        w = walks[("spark-host.nix", host)]
        assert [a["message"] for a in _assertions(w) if not a["assertion"]] == []
    profile, plan = lines["switched"]
    theirs = walk(
        MODULES / "spark-host.nix",
        fixture_config(plan, "spark1", ring=False, kernel_params=f"({DGX_SPARK_PARAMS} ++ {NVIDIA_PARAMS})"),
        work,
    )
    failing = [a["message"] for a in _assertions(theirs) if not a["assertion"]]
    assert failing == [
        "tp4.host.displayReservation: nvidia-drm.fbdev is 1, not 0 (the nvidia module appends nvidia-drm.fbdev=1 for drivers >= 545) "
        "on the kernel command line; fix: remove the nvidia-drm parameters you add to boot.kernelParams (tp4 appends modeset=1 fbdev=0 last)"
    ]


@pytest.mark.parametrize("stand_in", ["nixos-modules/lib.nix", "nixpkgs-stub/lib.nix"])
def test_the_stand_ins_escape_shell_args_as_nixpkgs_does(work, stand_in):
    """nixpkgs' escapeShellArg (lib/strings.nix lines 1200-1208, nixpkgs.lib @ de42d442) leaves a
    string of safe characters ([[:alnum:],._+:@%/-]) as it is and single-quotes any other."""
    lib = REPO / "tests" / stand_in
    expr = f"(import {nix_path(lib)}).escapeShellArg"
    got, err = nix_eval(f'map ({expr}) [ "a/b:c" "50%" "it\'s" "two words" "x=1" "" 3 ]', work / "nix")
    assert err == "", err
    assert got == ["a/b:c", "50%", "'it'\\''s'", "'two words'", "'x=1'", "''", "3"]


# The types nixpkgs declares for the container options the modules set (nixos/modules/
# virtualisation/oci-containers.nix, containerOptions, read at NixOS/nixpkgs 035a24e7): a value of
# another type fails `nixos-rebuild` at evaluation, so the walk is held to them here.
def _str_list(v: object) -> bool:
    return isinstance(v, list) and all(isinstance(x, str) for x in v)


OCI_CONTAINER_TYPES = {
    "image": lambda v: isinstance(v, str),  # str
    "imageFile": lambda v: v is None or isinstance(v, str),  # nullOr package (a store path here)
    "imageStream": lambda v: v is None or isinstance(v, str),  # nullOr package
    "cmd": _str_list,  # listOf str
    "labels": lambda v: isinstance(v, dict) and all(isinstance(x, str) for x in v.values()),  # attrsOf str
    "environmentFiles": lambda v: _str_list(v) and all(x.startswith("/") for x in v),  # listOf path
    "volumes": _str_list,
    "devices": _str_list,
    "networks": _str_list,
    "extraOptions": _str_list,  # listOf str
    "autoStart": lambda v: isinstance(v, bool),
    "privileged": lambda v: isinstance(v, bool),  # bool
    "pull": lambda v: v in ("always", "missing", "never", "newer"),  # enum
    "capabilities": lambda v: isinstance(v, dict) and all(x is None or isinstance(x, bool) for x in v.values()),
}


def test_the_rank_container_has_the_types_oci_containers_declares(walks):
    for host, unit in RANK_UNITS.items():
        w = walks[("tp4-line.nix", host)]
        prefix = f"virtualisation.oci-containers.containers.{unit.removeprefix('podman-')}."
        set_here = {s["path"].removeprefix(prefix): s["value"] for s in w["set"] if s["path"].startswith(prefix)}
        assert set_here, [s["path"] for s in w["set"]]
        assert set(set_here) <= set(OCI_CONTAINER_TYPES), set(set_here) - set(OCI_CONTAINER_TYPES)
        bad = {k: v for k, v in set_here.items() if not OCI_CONTAINER_TYPES[k](v)}
        assert bad == {}
        # "You can only define one of imageFile and imageStream" (the module's assertion)
        assert set_here.get("imageFile") is None or set_here.get("imageStream") is None


def test_the_host_units_are_declared_by_the_names_the_plan_gives_them(work, lines):
    """The RDMA check, weights volume and readiness units are the plan's service.host_units (tp4
    deploy checks the RDMA check by that name); the rank unit is ordered after them by those names."""
    _, plan = lines["switched"]
    doc = json.loads(plan.read_text())
    for n in doc["nodes"]:
        n["service"]["host_units"] = {
            "rdma_check": "x-rdma.service",
            "weights_volume": None if n["rank"] == 0 else "x-volume.service",
            "ready": "x-ready.service",
        }
    renamed = work / "renamed-units.json"
    renamed.write_text(json.dumps(doc))
    host = walk(MODULES / "spark-host.nix", fixture_config(renamed, "spark2", ring=False), work)
    paths = {x["path"] for x in host["set"]}
    assert {"systemd.services.x-rdma.serviceConfig", "systemd.services.x-volume.serviceConfig"} <= paths
    assert not any("tp4-rdma-check" in p or "tp4-weights-volume" in p for p in paths)
    line = walk(MODULES / "tp4-line.nix", fixture_config(renamed, "spark2", ring=False), work)
    assert value(line, "systemd.services.x-ready.wantedBy") == ["podman-dsv41-worker.service"]
    assert value(line, "systemd.services.podman-dsv41-worker.requires")[:2] == ["x-rdma.service", "x-volume.service"]


def test_the_readiness_needs_the_tp4_package(work, lines):
    """The readiness unit runs the closure's tp4; without the flake's modules (which set it) and
    without tp4.package, evaluation stops naming the option."""
    _, plan = lines["switched"]
    config = fixture_config(plan, "spark1", ring=False).replace('package = "/nix/store/tp4";', "package = null;")
    expr = f"import {nix_path(WALK)} {{ module = {nix_path(MODULES / 'tp4-line.nix')}; optionsFile = {nix_path(OPTIONS)}; config = {config}; pkgs = {PKGS}; }}"
    value, err = nix_eval(expr, work / "nix")
    assert value is None
    assert (
        "tp4.package: the rank's readiness unit runs tp4's boot-log check (tp4 bootlog wait) and no tp4 is set; fix: use the flake's nixosModules"
        in err
    )
