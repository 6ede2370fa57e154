"""modules/lib: the NixOS hosts' settings, from the profile (builtins.fromTOML), the plan (`tp4
plan --json`) and the hosts file, evaluated with Debian's Nix (builtins only). The golden is the
example line (examples/spark-line): four hosts, exactly these settings; the rank container is
compared flag for flag with what tp4 serve runs on a plain host (one renderer); bad inputs fail
naming the field."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from nixos_helpers import EXAMPLE, LIB, REPO, hosts_expr, json_file, nix_eval, nix_path, plan_file, toml
from tp4.hosts import share
from tp4.core.errors import Tp4Error
from tp4.line.plan import build_plan
from tp4.line.profile.load import load_file
from tp4.serving.serve import line_id, run_argv

GOLDEN = REPO / "tests" / "golden" / "nixos-spark-line.json"
PROFILE = EXAMPLE / "profile.toml"
HOSTS = EXAMPLE / "hosts.toml"


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("nixos-lib")


@pytest.fixture(scope="module")
def plan(work) -> Path:
    return plan_file(PROFILE, work / "plan.json")


@pytest.fixture(scope="module")
def hosts(work, plan):
    value, err = nix_eval(hosts_expr(plan, HOSTS), work / "nix")
    assert value is not None, err
    return value


def evaluate(expr: str, work: Path):
    value, err = nix_eval(expr, work / "nix")
    assert value is not None, err
    return value


def failure(expr: str, work: Path) -> str:
    value, err = nix_eval(expr, work / "nix")
    assert value is None, f"evaluated to {value!r}"
    return err


# --- the golden: four hosts, exactly these settings -------------------------------------------


def test_the_example_line_gives_the_four_hosts_the_golden_settings(hosts):
    if os.environ.get("TP4_UPDATE_GOLDEN") == "1":
        GOLDEN.write_text(json.dumps(hosts, indent=2, sort_keys=True) + "\n")
    assert hosts == json.loads(GOLDEN.read_text())


def test_the_golden_holds_what_the_host_requirements_say(hosts):
    """Independent of the golden file: the facts written out from the host requirements."""
    assert list(hosts) == ["spark1", "spark2", "spark3", "spark4"]
    for i, h in enumerate(hosts.values(), start=1):
        assert h["interfaces"] == {
            "enp1s0f0np0": {"mtu": 9000, "ipv4": {"addresses": [{"address": f"10.0.0.{i}", "prefixLength": 24}]}},
            "enP2p1s0f0np0": {"mtu": 9000, "ipv4": {"addresses": [{"address": f"10.0.1.{i}", "prefixLength": 24}]}},
        }
        assert h["sysctl"] == {
            f"net.ipv4.conf.{n}.{k}": v
            for n in ("enP2p1s0f0np0", "enp1s0f0np0")
            for k, v in (("arp_ignore", 1), ("arp_announce", 2))
        }
        assert h["kernelModules"] == ["mlx5_core", "mlx5_ib"]
        assert h["kernelParams"] == ["nvidia-drm.modeset=1", "nvidia-drm.fbdev=0"]
        assert h["rdmaCheck"]["ports"] == [
            {"hca": "rocep1s0f0", "netdev": "enp1s0f0np0", "address": f"10.0.0.{i}"},
            {"hca": "roceP2p1s0f0", "netdev": "enP2p1s0f0np0", "address": f"10.0.1.{i}"},
        ]
        assert h["rdmaCheck"]["gidIndex"] is None  # not pinned: the check writes what it finds
        unit = h["rankUnit"]
        assert unit["serviceConfig"]["LimitMEMLOCK"] == "infinity"
        # a head's checkpoint directory is bound, not made: the unit asserts it is there
        assert unit["unitConfig"] == {
            "StartLimitIntervalSec": 3600,
            "StartLimitBurst": 3,
            **({"AssertPathExists": ["/home/tp4/NewModels/DeepSeek-V4.1-Flash"]} if h["rank"] == 0 else {}),
        }
        assert unit["ordering"]["after"][:2] == ["network-online.target", "tp4-rdma-check.service"]
    head, workers = hosts["spark1"], [hosts[f"spark{i}"] for i in (2, 3, 4)]
    opts = "ro,sync,no_subtree_check,no_root_squash,insecure"
    assert head["nfs"] == {
        "exports": f"/home/tp4/NewModels/DeepSeek-V4.1-Flash 10.0.0.2({opts}) 10.0.0.3({opts}) 10.0.0.4({opts})",
        "mount": None,
    }
    assert head["weightsVolume"] is None
    assert all(h["ring"] is None for h in hosts.values())
    assert head["firewall"] == {"tcp": [8888, 20000, 2049], "trustedInterfaces": ["enP7s7"]}
    assert head["rankUnit"]["unit"] == "podman-dsv41-head.service"
    for w in workers:
        assert w["nfs"]["exports"] is None
        assert w["nfs"]["mount"] == {
            "mountPoint": "/var/lib/tp4/weights",
            "device": "10.0.0.1:/home/tp4/NewModels/DeepSeek-V4.1-Flash",
            "fsType": "nfs",
            "options": [
                "nfsvers=4.2",
                "ro",
                "nconnect=8",
                "rsize=1048576",
                "wsize=1048576",
                "hard",
                "timeo=600",
                "_netdev",
                "x-systemd.automount",
                "x-systemd.after=network-online.target",
                "x-systemd.requires=network-online.target",
                "x-systemd.mount-timeout=120s",
            ],
        }
        # the volume tp4 share makes on a plain worker; the rank waits for the host's own mount
        assert w["weightsVolume"] == {
            "name": "dsv41-weights",
            "driver": "local",
            "requiresMount": "/var/lib/tp4/weights",
            "unit": "tp4-weights-volume.service",
            "options": {
                "type": "nfs",
                "o": "addr=10.0.0.1,nfsvers=4.2,ro,nconnect=8,rsize=1048576,wsize=1048576,hard,timeo=600",
                "device": ":/home/tp4/NewModels/DeepSeek-V4.1-Flash",
            },
        }
        assert w["firewall"] == {"tcp": [], "trustedInterfaces": ["enP7s7"]}
        assert w["rankUnit"]["unit"] == "podman-dsv41-worker.service"
        assert w["rankUnit"]["ordering"]["requires"] == ["tp4-rdma-check.service", "tp4-weights-volume.service"]


# --- one renderer: the unit runs what serve runs ------------------------------------------------

# flags of `<runtime> run` that take their value as the next word (python/tp4/serving/serve.py run_argv)
_VALUE_FLAGS = {
    "--name",
    "--label",
    "--network",
    "--ipc",
    "--cap-add",
    "--shm-size",
    "--ulimit",
    "--device",
    "-v",
    "--restart",
    "--env-file",
    "--gpus",
    "--health-cmd",
    "--health-interval",
    "--health-timeout",
    "--health-start-period",
    "--health-retries",
}


def serve_flags(argv: list[str], image: str) -> tuple[list[str], list[str]]:
    """run_argv as `flag=value` words (without -d, --name and --restart, which the unit owns), and
    the image with its command."""
    assert argv[1:3] == ["run", "-d"]
    words, i = [], 3
    while argv[i] != image:
        if argv[i] in _VALUE_FLAGS:
            words.append(f"{argv[i]}={argv[i + 1]}")
            i += 2
        else:
            words.append(argv[i])
            i += 1
    words = [w for w in words if not w.startswith(("--name=", "--restart="))]
    return sorted(words), argv[i:]


def oci_flags(c: dict) -> list[str]:
    """The `run` arguments nixpkgs' oci-containers.nix (mkService's script) makes of the options
    the module sets, as `flag=value` words (leaving out what it adds itself: --name, --log-driver,
    --rm, --pull and podman's -d/--replace/--cidfile/--sdnotify)."""
    words = [f"--env-file={f}" for f in c["environmentFiles"]]
    words += [f"-v={v}" for v in c["volumes"]]
    words += [f"--label={k}={v}" for k, v in c["labels"].items()]
    words += ["--privileged"] if c["privileged"] else []
    words += [f"--cap-add={k}" for k, v in c["capabilities"].items() if v is True]
    words += [f"--device={d}" for d in c["devices"]]
    words += [f"--network={n}" for n in dict.fromkeys(c["networks"])]
    words += c["extraOptions"]
    return sorted(words)


def test_the_rank_container_is_the_plan_serve_runs(work):
    runtime = "podman"
    profile = work / f"profile-{runtime}.toml"
    profile.write_text(PROFILE.read_text())
    planned = build_plan(load_file(profile))
    hosts = evaluate(hosts_expr(plan_file(profile, work / f"plan-{runtime}.json"), HOSTS), work)
    for rank in planned.nodes:
        unit = hosts[rank.name]["rankUnit"]
        c = unit["container"]
        words, tail = serve_flags(run_argv(rank, line=line_id(planned), digest=planned.digest), rank.run.image)
        assert oci_flags(c) == words
        # the image's health check, which podman reads from no OCI image: both give it as flags
        h = rank.run.health
        assert {
            f"--health-cmd={json.dumps(list(h.cmd), separators=(',', ':'))}",
            f"--health-interval={h.interval}s",
            f"--health-timeout={h.timeout}s",
            f"--health-start-period={h.start_period}s",
            f"--health-retries={h.retries}",
        } <= set(words)
        assert [c["image"], *c["cmd"]] == tail
        assert unit["backend"] == runtime and unit["unit"] == rank.service.unit == f"{runtime}-{unit['name']}.service"
        assert c["autoStart"] is False and c["pull"] == "never"


def test_a_nixos_node_runs_podman_only(work, tmp_path):
    """nixos-dgx-spark enables podman with dockerCompat and dockerSocket, which nixpkgs' podman
    module refuses beside virtualisation.docker.enable (what a docker rank unit turns on): a
    NixOS node's runtime defaults to podman and docker is refused in the profile (the plan a host
    reads was rendered from a profile that passed)."""
    text = PROFILE.read_text()
    unset = tmp_path / "unset.toml"
    unset.write_text(text.replace('runtime = "podman"\n', ""))
    assert {n.runtime for n in load_file(unset).profile.nodes} == {"podman"}
    docker = tmp_path / "docker.toml"
    docker.write_text(text.replace('runtime = "podman"', 'runtime = "docker"', 1))
    with pytest.raises(
        Tp4Error, match=r"cluster\.head\.runtime: a NixOS node runs its rank with podman.*fix: set runtime = \"podman\""
    ):
        load_file(docker)


def test_a_plan_of_an_older_schema_is_refused(work, tmp_path):
    """A plan file written by an older tp4 lacks fields the hosts read (tp4.plan/1.9): evaluation
    stops naming the option and the command that writes it again."""
    doc = json.loads(plan_file(PROFILE, work / "plan-old.json").read_text())
    doc["schema"] = "tp4.plan/1.8"
    edited = tmp_path / "old-plan.json"
    edited.write_text(json.dumps(doc))
    err = failure(hosts_expr(edited, HOSTS), work)
    assert (
        'tp4.planFile: "tp4.plan/1.8" is not a plan this module reads (tp4.plan/1.9 or later); '
        "fix: write the plan again with this flake's tp4: tp4 plan --json -o plan.json --profile profile.toml"
    ) in err


def test_the_weights_options_are_tp4_shares(work, plan, hosts):
    """The export and client options are the plan's (line.nfs), which tp4 share writes too: the
    head's exports line and a worker's volume are what share makes on a plain host."""
    nfs = json.loads(plan.read_text())["line"]["nfs"]
    assert (
        ",".join(nfs["export_options"]) == share.EXPORT_OPTIONS
        and ",".join(nfs["mount_options"]) == share.MOUNT_OPTIONS
    )
    opts = " ".join(json.dumps(o) for o in nfs["export_options"])
    clients = ["10.0.0.2", "10.0.0.3"]
    nix_clients = " ".join(json.dumps(c) for c in clients)
    for path in ("/srv/model", "/srv/my model"):
        line = evaluate(
            f"(import {nix_path(LIB)}).weights.exportsLine {{ path = {json.dumps(path)}; clients = [ {nix_clients} ]; options = [ {opts} ]; }}",
            work,
        )
        assert line == share.kernel_exports_text(path, clients).splitlines()[1]
    # a worker's volume is the one tp4 share makes (and checks on a NixOS worker)
    w = hosts["spark2"]["weightsVolume"]
    server = nfs["servers"][0]
    assert (
        w["options"]
        == nfs["volumes"][0]
        == {"type": "nfs", "o": f"addr={server},{share.MOUNT_OPTIONS}", "device": f":{nfs['export']}"}
    )
    assert hosts["spark2"]["nfs"]["mount"]["options"][: len(nfs["mount_options"])] == nfs["mount_options"]


# --- other lines ------------------------------------------------------------------------------


def test_a_ring_keeps_local_weights_and_orders_the_rank_after_the_mesh(work):
    text = PROFILE.read_text().replace(
        'hcas = ["rocep1s0f0", "roceP2p1s0f0"]',
        'hcas = ["rocep1s0f0", "roceP2p1s0f0"]\nmode = "ring"\n\n[fabric.nccl]\nmount = "overlay"',
    )
    text = (
        text.replace("[nfs]", "[nfs]\nshare = false")
        + '\n[gates]\nDSV41_ROCE_RING = "1"\nSGLANG_ROCE_MAX_SIZE = "262144"\nDSV41_ROCE_GATHER = "262144"\n'
    )
    profile = work / "ring.toml"
    profile.write_text(text)
    plan = plan_file(profile, work / "ring.json")
    err = failure(hosts_expr(plan, HOSTS), work)
    assert "tp4.host.weights.localDir: spark2 keeps its own copy of the checkpoint (a ring has no NFS share)" in err
    hosts = evaluate(hosts_expr(plan, HOSTS, localWeights='"/var/lib/tp4/model"'), work)
    assert hosts["spark1"]["nfs"] == {"exports": None, "mount": None}
    assert hosts["spark1"]["firewall"]["tcp"] == [8888, 20000]
    w = hosts["spark3"]
    assert w["nfs"] == {"exports": None, "mount": None}
    assert w["weightsVolume"] == {
        "name": "dsv41-weights",
        "driver": "local",
        "requiresMount": "/var/lib/tp4/model",
        "unit": "tp4-weights-volume.service",
        "options": {"type": "none", "o": "bind", "device": "/var/lib/tp4/model"},
    }
    markers = [f"tp4-mesh-marker@{d}.service" for d in ("rocep1s0f0", "rocep1s0f1", "roceP2p1s0f0", "roceP2p1s0f1")]
    # RoCEnante's opposite-node paths (DSV41_ROCE_RING=1): the rank also waits for the four markers
    assert w["rankUnit"]["ordering"]["requires"] == [
        "tp4-rdma-check.service",
        "tp4-weights-volume.service",
        "tp4-mesh.service",
        *markers,
    ]
    assert w["ring"] == {
        "size": 8192,
        "unit": "tp4-mesh.service",
        "functions": ["0000:01:00.0", "0000:01:00.1", "0002:01:00.0", "0002:01:00.1"],
        "links": ["enp1s0f0np0", "enp1s0f1np1", "enP2p1s0f0np0", "enP2p1s0f1np1"],
        "linkTimeout": 120,
        "marker": {
            "devices": ["rocep1s0f0", "rocep1s0f1", "roceP2p1s0f0", "roceP2p1s0f1"],
            "units": markers,
            "sourcePort": 65535,
            "etherType": "0x88b5",
        },
    }
    assert json.loads(plan.read_text())["line"]["ring_hairpin_queue"] == w["ring"]["size"]
    # every node of a ring may relay another's route to the opposite node: IPv4 forwarding on all
    # (tp4 doctor's RING.IP_FORWARD); a switched line's hosts keep the kernel's default
    for h in hosts.values():
        assert h["sysctl"]["net.ipv4.ip_forward"] == 1
    assert (
        "/home/tp4/nccl-2.30.7/libnccl.so.2:/opt/sglang/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2:ro"
        in w["rankUnit"]["container"]["volumes"]
    )
    # the patched NCCL the ring's overlay binds must be there: the unit asserts it before the runtime runs
    assert w["rankUnit"]["unitConfig"] == {
        "StartLimitIntervalSec": 3600,
        "StartLimitBurst": 3,
        "AssertPathExists": ["/home/tp4/nccl-2.30.7/libnccl.so.2"],
    }
    assert hosts["spark1"]["rankUnit"]["unitConfig"]["AssertPathExists"][0] == "/home/tp4/NewModels/DeepSeek-V4.1-Flash"


def test_clients_are_the_workers_addresses_on_the_servers_network(work):
    profile = work / "server-on-port2.toml"
    profile.write_text(PROFILE.read_text().replace('server_ips = ["10.0.0.1"]', 'server_ips = ["10.0.1.1"]'))
    hosts = evaluate(hosts_expr(plan_file(profile, work / "server-on-port2.json"), HOSTS), work)
    assert re.findall(r" (10\.[0-9.]+)\(", hosts["spark1"]["nfs"]["exports"]) == ["10.0.1.2", "10.0.1.3", "10.0.1.4"]
    assert hosts["spark4"]["nfs"]["mount"]["device"].startswith("10.0.1.1:")


def test_a_pinned_gid_index_is_checked_and_the_display_reservation_can_be_off(work):
    profile = work / "pinned.toml"
    profile.write_text(
        PROFILE.read_text().replace(
            'name = "spark3"\nip = "10.0.0.3"', 'name = "spark3"\nip = "10.0.0.3"\ngid_index = 5'
        )
    )
    hosts = evaluate(hosts_expr(plan_file(profile, work / "pinned.json"), HOSTS, displayReservation="false"), work)
    assert [hosts[n]["rdmaCheck"]["gidIndex"] for n in hosts] == [None, None, 5, None]
    assert all(h["kernelParams"] == [] for h in hosts.values())


def test_module_parameters_are_read_as_the_kernel_reads_them(work):
    k = f"(import {nix_path(LIB)}).kernel"
    cases = {
        '[ "nvidia-drm.modeset=1" "nvidia-drm.fbdev=1" "nvidia-drm.fbdev=0" ]': None,
        '[ "nvidia-drm.modeset=1" "nvidia-drm.fbdev=0" "nvidia_drm.fbdev=1" ]': "nvidia-drm.fbdev is 1, not 0",
        '[ "nvidia_drm.modeset=1" "nvidia_drm.fbdev=0" ]': None,
        '[ "nvidia-drm.fbdev=0" ]': "nvidia-drm.modeset is unset, not 1",
        '[ "nvidia-drm.modeset=1" "nvidia-drm.modeset=0" "nvidia-drm.fbdev=0" ]': "nvidia-drm.modeset is 0, not 1",
        '[ "nvidia-drm.modeset=1" ]': "nvidia-drm.fbdev is unset, not 0",
    }
    got = evaluate(f"map {k}.displayReservationProblem [ {' '.join(f'({c})' for c in cases)} ]", work)
    for (params, want), problem in zip(cases.items(), got, strict=True):
        assert (problem is None) if want is None else problem.startswith(want), (params, problem)


def test_the_line_label_is_the_plans(work, plan, hosts):
    """serve's labels are the plan's: line.id and the plan's digest; every rank's container carries them."""
    doc = json.loads(plan.read_text())
    line = doc["line"]["id"]
    assert line == line_id(build_plan(load_file(PROFILE)))
    for rank, h in enumerate(hosts.values()):
        assert h["rankUnit"]["container"]["labels"] == {
            "tp4.line": line,
            "tp4.rank": str(rank),
            "tp4.plan": doc["digest"],
        }


def _replace(text: str, old: str, new: str) -> str:
    assert old in text, old
    return text.replace(old, new, 1)


def test_the_hosts_read_the_plans_nfs_servers_with_tp4s_fallback(work):
    """A profile that writes no nfs.server_ips: tp4 share mounts from its default address, and so
    do the NixOS workers (the plan's line.nfs.servers); no profile is read to find it."""
    profile = work / "no-server-ips.toml"
    profile.write_text(_replace(PROFILE.read_text(), 'server_ips = ["10.0.0.1"]', ""))
    plan = plan_file(profile, work / "no-server-ips.json")
    servers = json.loads(plan.read_text())["line"]["nfs"]["servers"]
    hosts = evaluate(hosts_expr(plan, HOSTS), work)
    assert (
        [hosts[f"spark{i}"]["nfs"]["mount"]["device"].split(":")[0] for i in (2, 3, 4)] == servers == ["10.0.22.1"] * 3
    )


BAD_HOSTS = {
    "a port with another node's address": (
        ('address = "10.0.1.3"', 'address = "10.0.1.2"'),
        "hosts: nodes.spark3.ports.enP2p1s0f0np0: 10.0.1.2 is also hosts: nodes.spark2.ports.enP2p1s0f0np0",
    ),
    "a port with a node's ip": (
        ('address = "10.0.1.4"', 'address = "10.0.0.1"'),
        "hosts: nodes.spark4.ports.enP2p1s0f0np0: 10.0.0.1 is also plan: nodes[0].host",
    ),
    "a node the profile does not have": (
        ("[nodes.spark4.", "[nodes.spark9."),
        "hosts: nodes.spark9: not a node of the plan (spark1 spark2 spark3 spark4)",
    ),
    "no address on a port the line uses": (
        ('[nodes.spark2.ports.enP2p1s0f0np0]\naddress = "10.0.1.2"\n', ""),
        "hosts: nodes.spark2.ports.enP2p1s0f0np0: the line uses roceP2p1s0f0 (fabric.hcas), whose netdev enP2p1s0f0np0 has no address on spark2",
    ),
    "the primary port again": (
        ("[nodes.spark1.ports.enP2p1s0f0np0]", "[nodes.spark1.ports.enp1s0f0np0]"),
        "hosts: nodes.spark1.ports.enp1s0f0np0: enp1s0f0np0 already carries the plan's address of spark1 (plan: nodes[0].host)",
    ),
    "a prefix length out of range": (
        ("prefix_length = 24", "prefix_length = 33"),
        "hosts: fabric.prefix_length: 33 is not a prefix length",
    ),
}


@pytest.mark.parametrize("case", BAD_HOSTS)
def test_a_bad_hosts_file_fails_naming_the_field(work, plan, case):
    (old, new), message = BAD_HOSTS[case]
    hosts = work / f"bad-hosts-{case.replace(' ', '-')}.toml"
    hosts.write_text(_replace(HOSTS.read_text(), old, new))
    assert message in failure(hosts_expr(plan, hosts), work)


def test_a_plain_node_gets_no_unit(work):
    profile = work / "plain.toml"
    profile.write_text(
        _replace(
            PROFILE.read_text(),
            'name = "spark2"\nip = "10.0.0.2"\nkind = "nixos"',
            'name = "spark2"\nip = "10.0.0.2"\nkind = "plain"',
        )
    )
    err = failure(hosts_expr(plan_file(profile, work / "plain.json"), HOSTS), work)
    assert 'cluster.workers[0].kind: spark2 is a "plain" host in the profile' in err


def test_a_host_that_is_not_in_the_plan(work, plan):
    expr = f'(import {nix_path(LIB)}).host {{ plan = {json_file(plan)}; hostsFile = {toml(HOSTS)}; name = "spark7"; }}'
    assert 'tp4.node: "spark7" is not a node of the plan (spark1 spark2 spark3 spark4); fix: set tp4.node' in failure(
        expr, work
    )


def test_a_ring_over_nccl_has_no_markers(work):
    """Without RoCEnante's opposite-node paths the collectives go through NCCL: no marker units."""
    text = PROFILE.read_text().replace(
        'hcas = ["rocep1s0f0", "roceP2p1s0f0"]',
        'hcas = ["rocep1s0f0", "roceP2p1s0f0"]\nmode = "ring"\n\n[fabric.nccl]\nmount = "overlay"',
    )
    text = (
        text.replace("[nfs]", "[nfs]\nshare = false")
        + '\n[gates]\nSGLANG_ROCE_ALLREDUCE = "0"\nDSV41_ROCE_GATHER = ""\nSGLANG_ROCE_MAX_SIZE = ""\n'
    )
    profile = work / "ring-nccl.toml"
    profile.write_text(text)
    plan = plan_file(profile, work / "ring-nccl.json")
    w = evaluate(hosts_expr(plan, HOSTS, localWeights='"/var/lib/tp4/model"'), work)["spark2"]
    assert w["ring"]["marker"] is None
    assert w["rankUnit"]["ordering"]["requires"] == [
        "tp4-rdma-check.service",
        "tp4-weights-volume.service",
        "tp4-mesh.service",
    ]


def test_the_drm_node_of_the_plan_is_handed_to_the_rank(work):
    """DSV41_ENGRAM_DRM_NODE: the rank requires the node's device unit (spark-host tags the card
    for systemd); a value that is no DRM card node names the plan's field."""
    text = PROFILE.read_text() + '\n[gates]\nDSV41_ENGRAM_DRM_NODE = "/dev/dri/card0"\n'
    profile = work / "drm.toml"
    profile.write_text(text)
    plan = plan_file(profile, work / "drm.json")
    hosts = evaluate(hosts_expr(plan, HOSTS), work)
    for h in hosts.values():
        assert h["drmNode"] == {"path": "/dev/dri/card0", "kernel": "card0", "unit": "dev-dri-card0.device"}
        assert h["rankUnit"]["ordering"]["requires"][-1] == "dev-dri-card0.device"
        assert "dev-dri-card0.device" in h["rankUnit"]["ordering"]["after"]
    data = json.loads(plan.read_text())
    data["nodes"][2]["env"]["DSV41_ENGRAM_DRM_NODE"] = "/dev/sda"
    bad = work / "drm-bad.json"
    bad.write_text(json.dumps(data))
    err = failure(hosts_expr(bad, HOSTS), work)
    assert 'plan: nodes[2].env.DSV41_ENGRAM_DRM_NODE: "/dev/sda" is not a DRM card node' in err
