"""`tp4 doctor` on the test cluster (tests/doctor_hosts.py: four hosts with real sshd, podman, ip,
ping, ss; each host's RDMA sysfs tree and its nvidia-smi, uname and date are laid per host): every
check passes on good hosts, and each check fails (or warns) with its fix when one host is broken
the way real Sparks break. The evidence JSON, the CLI's exit codes, and that no profile value
changes the remote command (one constant script, its arguments quoted once)."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from doctor_hosts import BOOTSTRAP, SYSFS, ZERO_GID, DoctorCluster
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tp4.core import process

from tp4.hosts import doctor
from tp4.hosts.doctor import CHECKS, FACTS_SCRIPT, Limits, Result
from tp4.hosts.nodes import nodes_of
from tp4.line.plan import Plan, build_plan
from tp4.line.profile import load_file

REPO = Path(__file__).resolve().parent.parent
HCA0, HCA1 = "rocep1s0f0", "roceP2p1s0f0"  # the production preset's fabric.hcas
# small thresholds: this machine has neither 50 GiB free per host nor 100 GiB of memory
LIMITS = Limits(sysfs=SYSFS, interval=0.5, image_free_gib=1, engram_free_gib=1, memory_gib=0.5, volume_kind="local")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DoctorCluster]:
    with DoctorCluster(tmp_path_factory.mktemp("doctor")) as c:
        yield c


@pytest.fixture
def good(cluster: DoctorCluster) -> DoctorCluster:
    cluster.reset()
    return cluster


def run(cluster: DoctorCluster, limits: Limits = LIMITS, plan: Plan | None = None) -> dict[tuple[str, str], Result]:
    p = plan or cluster.plan
    report = doctor.doctor(p, nodes_of(p), limits)
    return {(r.check, r.node): r for r in report.results}


def not_ok(results: dict[tuple[str, str], Result]) -> dict[tuple[str, str], str]:
    return {k: r.status for k, r in results.items() if r.status not in ("ok", "n/a")}


# the one warning of good hosts here: the plan's memlock is this machine's hard limit (not unlimited)
MEMLOCK_WARN = {("RDMA.MEMLOCK", f"node{i}"): "warn" for i in range(1, 5)}


def tp4(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tp4", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": str(REPO / "python")},
    )


# --- good hosts ------------------------------------------------------------------------------------


def test_good_hosts_pass_every_check_in_one_command_per_node(
    good: DoctorCluster, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="tp4.core.process")
    began = time.monotonic()
    results = run(good)
    wall = time.monotonic() - began
    print(f"tp4 doctor on {len(good.plan.nodes)} nodes: {wall:.2f} s wall (counter interval {LIMITS.interval} s)")
    assert not_ok(results) == MEMLOCK_WARN
    assert {c.id for c in CHECKS} == {k[0] for k in results}
    assert all((c.id, n.name) in results for c in CHECKS for n in good.plan.nodes)
    assert results[("RDMA.GID_SAME_INDEX", "node2")].detail == "index 3 on every node"
    assert results[("RDMA.GID", "node1")].detail == f"{HCA0} index 3, {HCA1} index 3"
    # switched: every node pings every other node, through the fabric port its route leaves by
    veth = good.veth(good.hosts[3])
    assert results[("RDMA.JUMBO_PING", "node4")].detail == (
        "8972+28 bytes with don't-fragment reach "
        + ", ".join(f"node{i} ({good.hosts[i - 1].address}) via {veth}" for i in (1, 2, 3))
    )
    assert (
        results[("RDMA.LINK_SPEED", "node2")].detail
        == f"{HCA0}/{good.veth(good.hosts[1])}, {HCA1}/{good.veth(good.hosts[1])} at 200000 Mb/s"
    )
    assert (
        results[("NET.BOOTSTRAP_IFACE", "node3")].detail
        == "NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME=tp4boot0: tp4boot0 198.18.0.4"
    )
    head = good.hosts[0].address
    assert results[("NET.RENDEZVOUS_ROUTE", "node1")].detail == f"the dist init address {head} is the head's own"
    assert results[("NET.RENDEZVOUS_ROUTE", "node2")].detail == f"{head} via {good.veth(good.hosts[1])}"
    assert (
        results[("PEER.CONTROL_CHANNEL", "node2")].detail
        == f"{head}:20000 answers (connection refused: nothing listens before serve)"
    )
    assert results[("PEER.CONTROL_CHANNEL", "node1")].status == "n/a"
    assert {results[(c, "node2")].status for c in ("RING.ROUTES", "RING.IP_FORWARD")} == {"n/a"}
    assert results[("RING.NCCL", "node1")].status == "n/a"
    assert results[("HOST.HEADLESS", "node3")].detail == "multi-user.target, display-manager.service inactive"
    assert results[("WEIGHTS.SHARD_FILES", "node1")].detail.startswith("48 shards, ")
    assert results[("IMAGE.ARCH", "node2")].status == "ok"
    assert results[("GPU.CLOCK_CAP", "node4")].status == "ok"
    # one remote command per node, the facts script, nothing else
    logged = [r.getMessage() for r in caplog.records if r.getMessage().startswith("$ ")]
    # besides the facts script only `ssh -G` (ssh's own configuration, read locally for the host key check)
    commands = [c for c in logged if " -G -- " not in c]
    assert len(commands) == 4 and all("tp4-doctor" in c for c in commands), commands
    for host in good.hosts:
        assert sum(f"-- root@{host.address} " in c for c in commands) == 1
    assert doctor.blocking_failures(good.plan, good.nodes(), LIMITS) == []
    assert wall < 10


def test_cli_table_json_evidence_and_exit_codes(good: DoctorCluster, tmp_path: Path) -> None:
    evidence = tmp_path / "doctor.json"
    proc = tp4("doctor", "--profile", str(good.profile), "-o", str(evidence), "--sysfs", SYSFS, "--interval", "0.5")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].split() == ["check", "node1", "node2", "node3", "node4"]
    assert lines[1].split() == ["SSH.REACHABLE", "ok", "ok", "ok", "ok"]
    assert "warn node1 RDMA.MEMLOCK: the plan limits memlock" in proc.stdout
    assert "     fix: set cluster.memlock" in proc.stdout
    assert proc.stdout.splitlines()[-1].startswith("doctor: 4 nodes in ") and proc.stdout.rstrip().endswith("ready")
    data = json.loads(evidence.read_text())
    assert data["schema"] == "tp4.doctor/1"
    assert sorted(data["nodes"]) == ["node1", "node2", "node3", "node4"]
    node = data["nodes"]["node2"]
    assert node["error"] is None and f"gids {HCA0}" in node["sections"] and "ip" in node["sections"]
    assert {c["id"] for c in data["checks"]} == {c.id for c in CHECKS}
    assert len(data["checks"]) == len(CHECKS) * 4
    for c in data["checks"]:
        assert set(c) == {"id", "node", "status", "detail", "fix", "blocking"}
        assert c["status"] in ("ok", "warn", "fail", "n/a")
        assert (c["fix"] is None) == (c["status"] in ("ok", "n/a"))
    # a blocking failure: exit 1, the evidence still written
    (good.port(good.hosts[1], HCA1) / "state").write_text("1: DOWN\n")
    proc = tp4("doctor", "--profile", str(good.profile), "-o", str(evidence), "--sysfs", SYSFS, "--interval", "0.5")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"FAIL node2 RDMA.PORT_ACTIVE (blocking): {HCA1} port 1 is 1: DOWN" in proc.stdout
    assert proc.stdout.rstrip().endswith("1 blocking failure(s)")
    assert "Traceback" not in proc.stderr
    failed = [c for c in json.loads(evidence.read_text())["checks"] if c["status"] == "fail"]
    assert [(c["id"], c["node"]) for c in failed] == [("RDMA.PORT_ACTIVE", "node2")]


def test_cli_bad_json_path_is_a_user_error(good: DoctorCluster, tmp_path: Path) -> None:
    proc = tp4(
        "doctor",
        "--profile",
        str(good.profile),
        "-o",
        str(tmp_path / "no" / "dir" / "x.json"),
        "--sysfs",
        SYSFS,
        "--interval",
        "0",
    )
    assert (
        proc.returncode == 2 and "--output" in proc.stderr and "fix:" in proc.stderr and "Traceback" not in proc.stderr
    )


# --- RDMA --------------------------------------------------------------------------------------------


def test_port_down(good: DoctorCluster) -> None:
    (good.port(good.hosts[1], HCA1) / "state").write_text("1: DOWN\n")
    results = run(good)
    r = results[("RDMA.PORT_ACTIVE", "node2")]
    assert (r.status, r.blocking) == ("fail", True)
    assert r.detail == f"{HCA1} port 1 is 1: DOWN"
    assert r.fix is not None and "ip link set <netdev> up" in r.fix
    assert not_ok(results) == {**MEMLOCK_WARN, ("RDMA.PORT_ACTIVE", "node2"): "fail"}


def test_link_layer_infiniband(good: DoctorCluster) -> None:
    (good.port(good.hosts[2], HCA0) / "link_layer").write_text("InfiniBand\n")
    results = run(good)
    r = results[("RDMA.LINK_LAYER", "node3")]
    assert r.status == "fail" and r.detail == f"{HCA0} is InfiniBand (RoCE needs Ethernet)"
    assert r.fix is not None and "LINK_TYPE_P1=2" in r.fix
    assert not_ok(results) == {**MEMLOCK_WARN, ("RDMA.LINK_LAYER", "node3"): "fail"}


def test_missing_hca_and_device_dir(good: DoctorCluster) -> None:
    import shutil

    shutil.rmtree(good.sysfs(good.hosts[3]) / "class" / "infiniband" / HCA1)
    results = run(good)
    r = results[("RDMA.DEVICES", "node4")]
    assert r.status == "fail" and f"no RDMA device {HCA1} under {SYSFS}/class/infiniband (there: {HCA0})" in r.detail
    assert r.fix is not None and "fabric.hcas" in r.fix


def test_netdev_without_ipv4(good: DoctorCluster) -> None:
    host = good.hosts[1]
    process.run(
        [
            "ip",
            "netns",
            "exec",
            host.namespace,
            "ip",
            "link",
            "add",
            "tp4dummy0",
            "type",
            "veth",
            "peer",
            "name",
            "tp4dummy1",
        ]
    )
    try:
        net = good.sysfs(host) / "class" / "infiniband" / HCA1 / "device" / "net"
        (net / good.veth(host)).rmdir()
        (net / "tp4dummy0").mkdir()
        results = run(good)
    finally:
        process.run(["ip", "netns", "exec", host.namespace, "ip", "link", "del", "tp4dummy0"])
    r = results[("RDMA.IPV4", "node2")]
    assert r.status == "fail" and r.detail == f"{HCA1} (tp4dummy0) has no IPv4 address"
    assert r.fix is not None and "IPv4 address" in r.fix
    assert results[("RDMA.GID", "node2")].status == "fail"


def test_a_second_ipv4_on_a_fabric_netdev_is_a_warning(good: DoctorCluster) -> None:
    host = good.hosts[2]
    dev = good.veth(host)
    process.run(["ip", "netns", "exec", host.namespace, "ip", "addr", "add", "192.0.2.7/32", "dev", dev])
    try:
        results = run(good)
    finally:
        process.run(["ip", "netns", "exec", host.namespace, "ip", "addr", "del", "192.0.2.7/32", "dev", dev])
    r = results[("RDMA.ONE_IPV4", "node3")]
    assert r.status == "warn" and r.blocking is False
    assert r.detail.startswith(f"{dev} has 2 IPv4 addresses ({host.address}, 192.0.2.7)") or r.detail.startswith(
        f"{dev} has 2 IPv4 addresses (192.0.2.7, {host.address})"
    ), r.detail
    assert r.fix is not None and "ip addr del" in r.fix
    assert results[("RDMA.ONE_IPV4", "node2")].status == "ok"
    assert results[("RDMA.IPV4", "node3")].status == "ok"


def test_mtu_1500_on_one_node(good: DoctorCluster) -> None:
    good.set_mtu(1500, [good.hosts[3]])
    results = run(good)
    r = results[("RDMA.MTU", "node4")]
    assert r.status == "fail" and r.blocking is False and f"{HCA0}/{good.veth(good.hosts[3])} has MTU 1500" in r.detail
    assert r.fix is not None and "mtu 9000" in r.fix
    same = results[("RDMA.MTU_SAME", "node4")]
    assert same.status == "fail" and same.blocking and same.detail == "MTU 1500 where the other nodes have 9000"
    assert results[("RDMA.MTU_SAME", "node1")].status == "ok"
    ping = results[("RDMA.JUMBO_PING", "node4")]
    assert ping.status == "fail" and "ping -M do -s 8972 -c 3 -W 2" in ping.detail
    assert all(
        f"node{i} ({good.hosts[i - 1].address}) via {good.veth(good.hosts[3])}: ping: local error: message too long"
        in ping.detail
        for i in (1, 2, 3)
    ), ping.detail
    assert ping.fix is not None and "MTU 9000 on both nodes" in ping.fix
    # every other node pings node4 too: its reply does not fit node4's 1500 bytes
    other = results[("RDMA.JUMBO_PING", "node2")]
    assert (
        other.status == "fail"
        and f"node4 ({good.hosts[3].address}) via {good.veth(good.hosts[1])}: no reply to 3 packets within 2 s"
        in other.detail
    )
    assert f"(reached: node1 ({good.hosts[0].address}) via {good.veth(good.hosts[1])}, node3" in other.detail


def test_bridge_at_1500_fails_the_jumbo_ping_everywhere(good: DoctorCluster) -> None:
    good.set_mtu(1500)
    results = run(good)
    for i in range(1, 5):
        assert results[("RDMA.JUMBO_PING", f"node{i}")].status == "fail"
        assert results[("RDMA.MTU", f"node{i}")].status == "fail"
        assert results[("RDMA.MTU_SAME", f"node{i}")].status == "ok"  # the same (too small) MTU everywhere
    assert (
        "message too long" in results[("RDMA.JUMBO_PING", "node1")].detail.lower()
        or "mtu" in results[("RDMA.JUMBO_PING", "node1")].detail.lower()
    )
    assert doctor.blocking_failures(good.plan, good.nodes(), LIMITS) == []  # slower, not broken


def test_gid_at_another_index_on_one_node(good: DoctorCluster) -> None:
    host = good.hosts[1]
    for hca in (HCA0, HCA1):
        good.set_gid(host, hca, 3, ZERO_GID, "")
        good.set_gid(host, hca, 5, doctor.mapped_gid(host.address), "RoCE v2")
    results = run(good)
    assert results[("RDMA.GID", "node2")].status == "ok"
    assert results[("RDMA.GID", "node2")].detail == f"{HCA0} index 5, {HCA1} index 5"
    r = results[("RDMA.GID_SAME_INDEX", "node2")]
    # serve (as upstream's launcher) gives each rank its own index: a warning, not a stop
    assert r.status == "warn" and r.blocking and r.detail == "index 5 where the other nodes have 3"
    assert r.fix is not None and "its own NCCL_IB_GID_INDEX (5)" in r.fix
    assert results[("RDMA.GID_SAME_INDEX", "node1")].detail == "index 3 on every node"
    assert not_ok(results) == {**MEMLOCK_WARN, ("RDMA.GID_SAME_INDEX", "node2"): "warn"}
    assert doctor.blocking_failures(good.plan, good.nodes(), LIMITS) == []


def test_gid_at_another_index_where_the_plan_pins_one_index_blocks(good: DoctorCluster, tmp_path: Path) -> None:
    host = good.hosts[1]
    for hca in (HCA0, HCA1):
        good.set_gid(host, hca, 3, ZERO_GID, "")
        good.set_gid(host, hca, 5, doctor.mapped_gid(host.address), "RoCE v2")
    text = good.profile.read_text()
    for i in range(1, 5):  # one index pinned on every node
        text = text.replace(f'name = "node{i}"', f'name = "node{i}"\ngid_index = 3', 1)
    profile = tmp_path / "pinned.toml"
    profile.write_text(text)
    plan = build_plan(load_file(profile))
    assert all(r.gid.pinned_by for r in plan.nodes)
    results = run(good, plan=plan)
    r = results[("RDMA.GID_SAME_INDEX", "node2")]
    assert (
        r.status == "fail" and r.blocking and r.detail == "cluster.workers[0].gid_index pins index 3, the GID is at 5"
    )
    assert [x.node for x in doctor.blocking_failures(plan, good.nodes(), LIMITS)] == ["node2"]


def test_gid_only_roce_v1_fails(good: DoctorCluster) -> None:
    host = good.hosts[2]
    good.set_gid(host, HCA0, 3, ZERO_GID, "")  # index 2 (v1) remains
    results = run(good)
    r = results[("RDMA.GID", "node3")]
    assert r.status == "fail" and f"{HCA0}: no RoCE v2 GID ::ffff:<its IPv4>" in r.detail
    assert r.fix is not None and "show_gids" in r.fix


def test_pinned_gid_index_that_does_not_match(good: DoctorCluster, tmp_path: Path) -> None:
    text = good.profile.read_text().replace('name = "node3"', 'name = "node3"\ngid_index = 4', 1)
    profile = tmp_path / "pinned.toml"
    profile.write_text(text)
    plan = build_plan(load_file(profile))
    results = run(good, plan=plan)
    r = results[("RDMA.GID_SAME_INDEX", "node3")]
    assert r.status == "fail" and r.detail == "cluster.workers[1].gid_index pins index 4, the GID is at 3"
    assert r.fix is not None and "set it to 3" in r.fix


def test_memlock_limited_for_the_runtime(good: DoctorCluster) -> None:
    host = good.hosts[2]
    assert host.sshd is not None
    process.run(["prlimit", "--pid", str(host.sshd.pid), "--memlock=4194304:4194304"])
    try:
        good.hosts.close_connections()  # new sessions, from the limited sshd
        results = run(good)
    finally:
        good.hosts._stop_sshd(host)
        good.hosts._start_sshd(host)
        good.hosts.wait_for_sshd(host)
        good.hosts.close_connections()
    r = results[("RDMA.MEMLOCK", "node3")]
    assert (r.status, r.blocking) == ("fail", True)
    assert (
        "the plan asks memlock 8192 KiB; the hard limit of root's sessions (podman runs as root) is 4096 KiB"
        in r.detail
    )
    assert r.fix is not None and "memlock unlimited" in r.fix
    assert results[("RDMA.MEMLOCK", "node2")].status == "warn"


def test_rising_counters_warn(good: DoctorCluster) -> None:
    counter = good.port(good.hosts[3], HCA0) / "hw_counters" / "packet_seq_err"
    stop = threading.Event()

    def bump() -> None:
        n = 7
        while not stop.is_set():
            n += 1
            # replaced whole, as a sysfs read never sees a counter half written (a truncated file
            # read as empty made the first or second read miss the counter now and then)
            tmp = counter.with_name(counter.name + ".tmp")
            tmp.write_text(f"{n}\n")
            tmp.replace(counter)
            time.sleep(0.05)

    t = threading.Thread(target=bump)
    t.start()
    try:
        results = run(good)
    finally:
        stop.set()
        t.join()
    r = results[("RDMA.COUNTERS", "node4")]
    assert r.status == "warn" and r.blocking is False and f"{HCA0} packet_seq_err +" in r.detail
    assert r.fix is not None and "PFC/ECN" in r.fix
    assert results[("RDMA.COUNTERS", "node1")].detail == "6 counters steady"


def test_servers_limits_skip_the_ping_and_the_counter_interval(good: DoctorCluster) -> None:
    """serve acts on the blocking checks only: without the ping and the interval, those two
    non-blocking checks are n/a (not "ok" from two reads 0 s apart) and every blocking one runs."""
    import dataclasses

    limits = dataclasses.replace(LIMITS, interval=0.0, ping=False)
    peers = 9  # FACTS_SCRIPT's argument: the addresses the jumbo ping goes to ("": none)
    assert doctor.remote_args(good.plan, good.plan.nodes[0], LIMITS)[peers] == " ".join(
        r.host for r in good.plan.nodes[1:]
    )
    assert doctor.remote_args(good.plan, good.plan.nodes[0], limits)[peers] == ""
    report = doctor.doctor(good.plan, good.nodes(), limits)
    results = {(x.check, x.node): x for x in report.results}
    for name in ("node1", "node4"):
        assert results[("RDMA.JUMBO_PING", name)].status == "n/a"
        assert results[("RDMA.COUNTERS", name)].status == "n/a"
    assert {k for k, x in results.items() if x.status not in ("ok", "n/a")} == set(MEMLOCK_WARN)
    assert report.blocking == []


def test_no_counters_warn(good: DoctorCluster) -> None:
    import shutil

    for hca in (HCA0, HCA1):
        shutil.rmtree(good.port(good.hosts[0], hca) / "hw_counters")
    r = run(good)[("RDMA.COUNTERS", "node1")]
    assert r.status == "warn" and "no RoCE counters" in r.detail


# --- kernel, GPU, runtime --------------------------------------------------------------------------


def test_known_bad_kernel(good: DoctorCluster) -> None:
    good.fake(good.hosts[0], "kernel").write_text("7.0.0-1019-nvidia\n")
    results = run(good)
    r = results[("KERNEL.KNOWN_BAD", "node1")]
    assert (r.status, r.blocking) == ("fail", True)
    assert r.detail == (
        "kernel 7.0.0-1019-nvidia: NCCL over RoCE fails to register memory: ibv_reg_mr iova2 ENOMEM "
        "(eugr/spark-vllm-docker#392)"
    )
    assert r.fix is not None and "6.17.0-1032-nvidia" in r.fix
    assert results[("KERNEL.KNOWN_BAD", "node2")].status == "ok"
    assert not_ok(results) == {**MEMLOCK_WARN, ("KERNEL.KNOWN_BAD", "node1"): "fail"}


def test_foreign_gpu_apps_and_driver(good: DoctorCluster) -> None:
    good.fake(good.hosts[1], "apps.csv").write_text("4242, python3, 20480 MiB\n")
    good.fake(good.hosts[2], "gpus.csv").write_text("NVIDIA GB10, 595.84\n")
    results = run(good)
    r = results[("GPU.NO_FOREIGN_APPS", "node2")]
    assert (r.status, r.blocking) == (
        "fail",
        True,
    ) and r.detail == "1 compute app(s) on the GPU: 4242, python3, 20480 MiB"
    assert r.fix is not None and "stop the other stack" in r.fix
    d = results[("GPU.DRIVER", "node3")]
    assert (d.status, d.blocking) == ("warn", False) and d.detail.startswith("driver 595.84: the display reservation")
    assert results[("GPU.PRESENT", "node3")].detail == "1 GPU: NVIDIA GB10"
    assert not_ok(results) == {
        **MEMLOCK_WARN,
        ("GPU.NO_FOREIGN_APPS", "node2"): "fail",
        ("GPU.DRIVER", "node3"): "warn",
    }


def test_no_nvidia_smi(good: DoctorCluster) -> None:
    stub = good.hosts[3].dir / "bin" / "nvidia-smi"
    stub.rename(stub.with_suffix(".off"))
    try:
        results = run(good)
    finally:
        stub.with_suffix(".off").rename(stub)
    r = results[("GPU.PRESENT", "node4")]
    assert r.status == "fail" and r.detail == "nvidia-smi is not on the PATH" and r.fix is not None and "580" in r.fix


def test_runtime_without_gpu_access(good: DoctorCluster) -> None:
    host = good.hosts[1]
    spec = host.run("cat", "/etc/cdi/nvidia.com-gpu.json").stdout
    host.run("rm", "/etc/cdi/nvidia.com-gpu.json")
    try:
        results = run(good)
    finally:
        process.run(["sh", "-c", "cat > /etc/cdi/nvidia.com-gpu.json"], remote=host.remote, input=spec)
    r = results[("RUNTIME.USABLE", "node2")]
    assert r.status == "fail" and "no CDI spec for nvidia.com/gpu" in r.detail
    assert r.fix is not None and "nvidia-ctk cdi generate" in r.fix


# --- the host state the NixOS module sets, the head's shard files, the image's arch and pin, the
# ring's NCCL sha256 ---------------------------------------------------------------------------------

DRM = '\n[gates]\nDSV41_ENGRAM_DRM_NODE = "/dev/dri/card0"\n'


def test_nvidia_drm_parameters_where_the_plan_uses_the_display_reservation(good: DoctorCluster, tmp_path: Path) -> None:
    profile = tmp_path / "drm.toml"
    profile.write_text(good.profile.read_text() + DRM)
    plan = build_plan(load_file(profile))
    assert plan.nodes[1].env["DSV41_ENGRAM_DRM_NODE"] == "/dev/dri/card0"
    params = [good.sysfs(h) / "module" / "nvidia_drm" / "parameters" for h in good.hosts]
    (params[1] / "fbdev").write_text("Y\n")  # the nvidia module's nvidia-drm.fbdev=1 won
    (params[2] / "modeset").write_text("N\n")
    shutil.rmtree(good.sysfs(good.hosts[3]) / "module")  # nvidia_drm not loaded
    results = run(good, plan=plan)
    assert results[("GPU.NVIDIA_DRM", "node1")].status == "ok"
    assert results[("GPU.NVIDIA_DRM", "node1")].detail == "nvidia_drm modeset=Y, fbdev=N"
    fbdev = results[("GPU.NVIDIA_DRM", "node2")]
    assert (fbdev.status, fbdev.blocking) == ("fail", True)
    assert (
        fbdev.detail
        == "nvidia_drm modeset=Y, fbdev=Y: the display reservation (/dev/dri/card0) is not free (it needs modeset=1 fbdev=0)"
    )
    assert (
        fbdev.fix is not None
        and "nvidia-drm.fbdev=0" in fbdev.fix
        and "tp4.host.displayReservation.enable" in fbdev.fix
    )
    assert (
        results[("GPU.NVIDIA_DRM", "node3")].status == "fail"
        and "modeset=N" in results[("GPU.NVIDIA_DRM", "node3")].detail
    )
    absent = results[("GPU.NVIDIA_DRM", "node4")]
    assert absent.status == "fail" and absent.detail.startswith(
        f"nvidia_drm is not loaded ({SYSFS}/module/nvidia_drm is absent)"
    )
    # the parameters' files are root's only (mode 0400): a user's session reads /proc/cmdline instead
    os.chmod(params[0] / "modeset", 0o400)
    (params[0] / "modeset").unlink()
    (params[0] / "fbdev").unlink()
    results = run(good, plan=plan)
    unknown = results[("GPU.NVIDIA_DRM", "node1")]
    assert unknown.status == "warn" and "modeset unknown" in unknown.detail and "no fbdev parameter" in unknown.detail
    # without the reservation in the plan the parameters do not matter
    assert run(good)[("GPU.NVIDIA_DRM", "node2")].status == "n/a"


def test_nvidia_drm_from_the_kernel_command_line() -> None:
    """A user's session cannot read the 0400 parameter files: the command line's last word wins,
    '-' and '_' alike (as modules/lib/kernel.nix's moduleParam)."""
    line = "ro nvidia-drm.modeset=1 nvidia-drm.fbdev=1 quiet nvidia_drm.fbdev=0"
    assert doctor.module_param(line, "nvidia-drm", "modeset") == "1"
    assert doctor.module_param(line, "nvidia-drm", "fbdev") == "0"
    assert doctor.module_param(line, "nvidia", "modeset") is None
    assert doctor.module_param("nvidia-drm.modeset", "nvidia-drm", "modeset") is None


def test_headless_boot(good: DoctorCluster, tmp_path: Path) -> None:
    good.fake(good.hosts[0], "default-target").write_text("graphical.target\n")
    good.fake(good.hosts[2], "unit-state.display-manager.service").write_text("active\n")
    results = run(good)
    r = results[("HOST.HEADLESS", "node1")]
    assert (r.status, r.blocking) == ("fail", False)
    assert r.detail == "boots to graphical.target: a desktop takes memory from the engine"
    assert r.fix is not None and "systemctl set-default multi-user.target" in r.fix
    dm = results[("HOST.HEADLESS", "node3")]
    assert dm.status == "fail" and dm.detail.startswith("display-manager.service is active")
    assert results[("HOST.HEADLESS", "node2")].detail == "multi-user.target, display-manager.service inactive"
    assert not_ok(results) == {**MEMLOCK_WARN, ("HOST.HEADLESS", "node1"): "fail", ("HOST.HEADLESS", "node3"): "fail"}
    profile = tmp_path / "drm.toml"
    profile.write_text(good.profile.read_text() + DRM)
    r = run(good, plan=build_plan(load_file(profile)))[("HOST.HEADLESS", "node1")]
    assert r.detail == "boots to graphical.target: a desktop takes the display reservation /dev/dri/card0 and memory"


def test_sm_clock_cap(good: DoctorCluster) -> None:
    clocks = {0: "2600, 3000, Not Active\n", 1: "1000, 3000, Not Active\n", 2: "2100, 2200, Not Active\n"}
    for i, text in clocks.items():
        good.fake(good.hosts[i], "clocks.csv").write_text(text)
    results = run(good)
    over = results[("GPU.CLOCK_CAP", "node1")]
    assert (over.status, over.blocking) == ("fail", False)
    assert over.detail.startswith("the SM clock runs at 2600 MHz, above the cap of 2200 MHz")
    assert over.fix is not None and "nvidia-smi -lgc 0,2200" in over.fix and "cluster.gpu_clock_mhz" in over.fix
    unseen = results[("GPU.CLOCK_CAP", "node2")]
    assert unseen.status == "warn" and "nothing shows a cap" in unseen.detail
    assert (
        results[("GPU.CLOCK_CAP", "node3")].detail == "SM clock 2100 MHz, the GPU's maximum 2200 MHz is within 2200 MHz"
    )
    assert results[("GPU.CLOCK_CAP", "node4")].status == "ok"
    assert "applications_clocks_setting Active" in results[("GPU.CLOCK_CAP", "node4")].detail
    # a NixOS host: tp4-gpu-clock.timer (the module applies the plan's line.gpu_clock_mhz) must be active
    good.fake(good.hosts[1], "unit-state.tp4-gpu-clock.timer").write_text("active\n")
    nixos = good.plan._replace(
        nodes=tuple(r._replace(service=r.service._replace(kind="nixos")) for r in good.plan.nodes)
    )
    results = {
        (x.check, x.node): x for x in doctor.evaluate(nixos, doctor.gather(good.plan, good.nodes(), LIMITS), LIMITS)
    }
    assert results[("GPU.CLOCK_CAP", "node2")].detail == "SM clock 1000 MHz (max 3000); tp4-gpu-clock.timer is active"
    stopped = results[("GPU.CLOCK_CAP", "node4")]
    assert stopped.status == "fail" and stopped.detail.startswith(
        "tp4-gpu-clock.timer is inactive: nothing caps the SM clock"
    )
    assert results[("GPU.CLOCK_CAP", "node3")].status == "ok"  # the GPU cannot pass the cap
    # the cap is the plan's (the profile's cluster.gpu_clock_mhz): 2000 fails node3's 2100 MHz, 0 asks for none
    lower = run(good, plan=good.plan._replace(line=good.plan.line._replace(gpu_clock_mhz=2000)))
    assert lower[("GPU.CLOCK_CAP", "node3")].detail.startswith(
        "the SM clock runs at 2100 MHz, above the cap of 2000 MHz"
    )
    off = run(good, plan=good.plan._replace(line=good.plan.line._replace(gpu_clock_mhz=None)))[
        ("GPU.CLOCK_CAP", "node1")
    ]
    assert (off.status, off.detail) == ("n/a", "no cap asked (cluster.gpu_clock_mhz = 0)")


def test_shard_files_on_the_head(good: DoctorCluster) -> None:
    results = run(good)
    ok = results[("WEIGHTS.SHARD_FILES", "node1")]
    assert (
        ok.status == "ok" and ok.detail.startswith("48 shards, ") and ok.detail.endswith("each readable and non-empty")
    )
    assert results[("WEIGHTS.SHARD_FILES", "node2")].status == "n/a"
    (good.model_dir / "model-00005-of-00048.safetensors").write_bytes(b"")
    (good.model_dir / "model-00007-of-00048.safetensors").chmod(0)
    results = run(good)
    r = results[("WEIGHTS.SHARD_FILES", "node1")]
    assert (r.status, r.blocking) == ("fail", True)
    assert r.detail == (
        "model-00005-of-00048.safetensors is empty (0 bytes); model-00007-of-00048.safetensors is not readable (mode 0)"
    )
    assert r.fix is not None and "tp4 download" in r.fix and "chmod a+r" in r.fix
    assert results[("WEIGHTS.HEAD", "node1")].status == "ok"  # it counts the names only
    assert not_ok(results) == {**MEMLOCK_WARN, ("WEIGHTS.SHARD_FILES", "node1"): "fail"}
    # a shard of another checkpoint, a dangling link and a directory
    good.reset()
    (good.model_dir / "model-00001-of-00049.safetensors").write_bytes(b"x")
    (good.model_dir / "model-00002-of-00048.safetensors").unlink()
    (good.model_dir / "model-00002-of-00048.safetensors").symlink_to(good.model_dir / "gone")
    (good.model_dir / "model-00003-of-00048.safetensors").unlink()
    (good.model_dir / "model-00003-of-00048.safetensors").mkdir()
    try:
        r = run(good)[("WEIGHTS.SHARD_FILES", "node1")]
    finally:
        (good.model_dir / "model-00003-of-00048.safetensors").rmdir()
        (good.model_dir / "model-00002-of-00048.safetensors").unlink()
    assert r.status == "fail"
    assert r.detail == (
        "names say -of-49, not -of-48; 49 shard files, the checkpoint has 48 (model.expected_shards); "
        "model-00002-of-00048.safetensors is a dangling link; model-00003-of-00048.safetensors is a directory"
    )


def run_with_other_image(
    cluster: DoctorCluster, tmp_path: Path, *import_args: str
) -> tuple[dict[tuple[str, str], Result], str]:
    """Doctor's results while node3 holds another image (`podman import` of one file, with
    ``import_args``) under the plan's tag, and the id the tag had before (put back after)."""
    host = cluster.hosts[2]
    tag = cluster.plan.image.tag
    original = host.run("podman", "image", "inspect", "--format", "{{.Id}}", tag).stdout.strip()
    (tmp_path / "hello").write_text("another image\n")
    with tarfile.open(tmp_path / "other.tar", "w") as tar:
        tar.add(tmp_path / "hello", arcname="hello")
    host.run("podman", "import", "-q", *import_args, str(tmp_path / "other.tar"), tag)
    try:
        return run(cluster), original
    finally:
        host.run("podman", "tag", original, tag)


def test_image_of_another_architecture(good: DoctorCluster, tmp_path: Path) -> None:
    """An image whose config names another architecture than `uname -m` (podman holds it without
    running it): IMAGE.ARCH fails on that node."""
    machine = os.uname().machine
    own = doctor.ARCH[machine]
    other = "amd64" if own == "arm64" else "arm64"
    tag = good.plan.image.tag
    results, _ = run_with_other_image(good, tmp_path, "--arch", other)
    r = results[("IMAGE.ARCH", "node3")]
    assert (r.status, r.blocking) == ("fail", True)
    assert r.detail == f"{tag} is a {other} image, the host is {machine} ({own}): it cannot run here"
    assert r.fix is not None and "aarch64-linux" in r.fix
    assert results[("IMAGE.ARCH", "node2")].detail == f"{own} image on an {machine} host"
    assert not_ok(results) == {**MEMLOCK_WARN, ("IMAGE.ARCH", "node3"): "fail", ("IMAGE.SAME", "node3"): "fail"}


def test_image_against_the_recorded_build_and_the_tags_digest(good: DoctorCluster, tmp_path: Path) -> None:
    import copy

    tag = good.plan.image.tag
    head_id = good.hosts[0].run("podman", "image", "inspect", "--format", "{{.Id}}", tag).stdout.strip()
    assert run(good)[("IMAGE.DIGEST", "node1")].status == "n/a"  # nothing pins it
    results = run(good, dataclasses.replace(LIMITS, image_id=head_id))
    assert {results[("IMAGE.DIGEST", f"node{i}")].status for i in range(1, 5)} == {"ok"}
    assert results[("IMAGE.DIGEST", "node2")].detail == f"id {head_id[:12]} as `tp4 build` recorded"
    other = "1" * 64
    r = run(good, dataclasses.replace(LIMITS, image_id=other))[("IMAGE.DIGEST", "node4")]
    assert (r.status, r.blocking) == ("fail", True)
    assert r.detail == f"{tag}: id {head_id[:12]}, `tp4 build` recorded {other[:12]} for {tag}"
    assert r.fix is not None and "tp4 distribute" in r.fix
    # a tag pinned by digest: the node's repo digests must hold it
    facts = doctor.gather(good.plan, good.nodes(), LIMITS)
    digest = "sha256:" + "ab" * 32
    pinned = good.plan._replace(image=good.plan.image._replace(tag=f"{tag}@{digest}"))
    f = copy.deepcopy(facts)
    f["node2"].sections["image_config"] = [f'{own_arch()} ["localhost/x@{digest}"]', "rc 0"]
    results = {(x.check, x.node): x for x in doctor.evaluate(pinned, f, LIMITS)}
    assert results[("IMAGE.DIGEST", "node2")].detail == f"digest {digest[:19]}"
    assert results[("IMAGE.DIGEST", "node3")].status == "fail"
    assert "are not the tag's sha256:abababababab" in results[("IMAGE.DIGEST", "node3")].detail


def own_arch() -> str:
    return doctor.ARCH[os.uname().machine]


def test_the_recorded_build_id(tmp_path: Path) -> None:
    """Limits.of_profile takes the id `tp4 build` recorded next to the flake's out-link, for the
    plan's tag only."""
    from tp4.image import build

    (tmp_path / "flake.nix").write_text("{ }\n")
    attr = build.image_attr("canary-roce")
    build.Built("/nix/store/x", "dsv41-3x-spark:local", "sha256:" + "c" * 64).save(build.record_path(tmp_path, attr))
    assert doctor.built_image_id("canary-roce", "dsv41-3x-spark:local", str(tmp_path)) == "c" * 64
    assert doctor.built_image_id("canary-roce", "other:tag", str(tmp_path)) is None
    assert doctor.built_image_id("base", "dsv41-3x-spark:local", str(tmp_path)) is None  # no record of that variant
    empty = tmp_path / "empty"  # a flake without a build
    empty.mkdir()
    (empty / "flake.nix").write_text("{ }\n")
    assert doctor.built_image_id("canary-roce", "dsv41-3x-spark:local", str(empty)) is None


def test_ring_nccl_sha256_against_the_pin_and_the_head(good: DoctorCluster, tmp_path: Path) -> None:
    import hashlib

    plan = ring_plan(good, tmp_path)
    libs = [Path(next(m.source for m in r.run.mounts if m.source.endswith("/libnccl.so.2"))) for r in plan.nodes]
    build = b"\x7fELF...NCCL_SWITCHLESS_RING_ONLY\0..."
    for rank, lib in enumerate(libs):
        lib.parent.mkdir(parents=True, exist_ok=True)
        lib.write_bytes(build + (b"another build" if rank == 2 else b""))
        good.fake(good.hosts[rank], "unit-state").write_text("active\n")
    sha = hashlib.sha256(build).hexdigest()
    try:
        unpinned = run(good, plan=plan)
        pinned = run(good, plan=plan._replace(line=plan.line._replace(nccl_sha256=sha)))
        wrong = run(good, plan=plan._replace(line=plan.line._replace(nccl_sha256="0" * 64)))
    finally:
        for lib in libs:
            lib.unlink(missing_ok=True)
    r = unpinned[("ARTIFACT.SHA256", "node1")]
    assert (
        r.status == "ok"
        and r.detail == f'{libs[0]}: sha256 {sha[:16]}..., the head\'s (not pinned: set fabric.nccl.sha256 = "{sha}")'
    )
    odd = unpinned[("ARTIFACT.SHA256", "node3")]
    assert (odd.status, odd.blocking) == ("fail", True) and f"the head's is {sha[:16]}..." in odd.detail
    assert odd.fix is not None and "fabric.nccl.sha256" in odd.fix
    assert unpinned[("RING.NCCL", "node3")].status == "ok"  # the string is there: only the hash tells the builds apart
    assert pinned[("ARTIFACT.SHA256", "node2")].detail == f"{libs[1]}: sha256 {sha[:16]}... as pinned"
    assert pinned[("ARTIFACT.SHA256", "node3")].status == "fail"
    assert {wrong[("ARTIFACT.SHA256", f"node{i}")].status for i in range(1, 5)} == {"fail"}
    assert "fabric.nccl.sha256 pins 0000000000000000..." in wrong[("ARTIFACT.SHA256", "node1")].detail
    assert run(good)[("ARTIFACT.SHA256", "node1")].detail == "no host NCCL on this rank"  # switched


def test_the_nccl_pin_is_a_profile_field(tmp_path: Path) -> None:
    from tp4.core.errors import Tp4Error
    from tp4.line.profile import load_text

    text = (
        'preset = "production"\n[cluster]\nuser = "tp4"\n[cluster.head]\nname = "h"\nip = "10.0.0.1"\n'
        + "".join(f'[[cluster.workers]]\nname = "w{i}"\nip = "10.0.0.{i + 1}"\n' for i in (1, 2, 3))
        + '[fabric.nccl]\nsha256 = "%s"\n'
    )
    loaded = load_text(text % ("e" * 64), "t")
    assert build_plan(loaded).line.nccl_sha256 == "e" * 64
    with pytest.raises(Tp4Error) as exc:
        load_text(text % "E0", "t")
    assert "fabric.nccl.sha256" in exc.value.message and "64 lower-case hex digits" in exc.value.message


# --- weights, engram, image, disk, ports, clock, memory ----------------------------------------------


def _volume_config(cluster: DoctorCluster, rank: int) -> Path:
    host = cluster.hosts[rank]
    mp = host.run("podman", "volume", "inspect", "--format", "{{.Mountpoint}}", "dsv41-weights").stdout.strip()
    return Path(mp) / "config.json"


def test_missing_weights(good: DoctorCluster) -> None:
    (good.model_dir / "config.json").unlink()
    (good.model_dir / "model-00048-of-00048.safetensors").unlink()
    config = _volume_config(good, 2)
    saved = config.read_text()
    config.unlink()
    try:
        results = run(good)
    finally:
        config.write_text(saved)
    h = results[("WEIGHTS.HEAD", "node1")]
    assert (h.status, h.blocking) == ("fail", True) and h.detail == f"{good.model_dir}: no config.json, 47 of 48 shards"
    assert h.fix is not None and "tp4 download" in h.fix
    w = results[("WEIGHTS.WORKER", "node3")]
    assert w.status == "fail" and "the volume dsv41-weights" in w.detail and "holds no config.json" in w.detail
    assert w.fix is not None and "tp4 share" in w.fix
    assert results[("WEIGHTS.WORKER", "node2")].status == "ok"


def test_worker_volume_of_the_wrong_kind(good: DoctorCluster) -> None:
    results = run(good, Limits(**{**LIMITS.__dict__, "volume_kind": "nfs"}))
    r = results[("WEIGHTS.WORKER", "node2")]
    assert r.status == "fail" and r.detail == "the volume dsv41-weights is local, the profile says nfs (nfs.share)"
    assert r.fix is not None and "tp4 share" in r.fix


def test_missing_worker_volume(good: DoctorCluster, tmp_path: Path) -> None:
    profile = tmp_path / "vol.toml"
    profile.write_text(
        good.profile.read_text().replace("share = false", 'share = false\nvolume = "tp4-no-such-volume"')
    )
    r = run(good, plan=build_plan(load_file(profile)))[("WEIGHTS.WORKER", "node4")]
    assert r.status == "fail" and r.detail.startswith("the volume tp4-no-such-volume does not exist")


def test_engram_shards(good: DoctorCluster) -> None:
    shard = good.engram_dir(1) / doctor.engram_files(good.plan, good.plan.nodes[1])[1]
    with shard.open("r+b") as f:
        f.truncate(60)
    (good.engram_dir(2) / doctor.engram_files(good.plan, good.plan.nodes[2])[0]).unlink()
    results = run(good)
    r = results[("ENGRAM.SHARDS", "node2")]
    assert r.status == "warn" and f"{shard.name} is incomplete (60 of 112 bytes)" in r.detail and r.fix == "tp4 pack"
    assert "engram-l1-r2of4.bin missing" in results[("ENGRAM.SHARDS", "node3")].detail
    assert results[("ENGRAM.SHARDS", "node1")].detail == "engram-l1-r0of4.bin, engram-l14-r0of4.bin"
    no_room = run(good, Limits(**{**LIMITS.__dict__, "engram_free_gib": 1e9}))[("ENGRAM.SHARDS", "node2")]
    assert (no_room.status, no_room.blocking) == ("fail", True) and "to pack them" in no_room.detail
    assert no_room.fix is not None and no_room.fix.startswith("free disk")


def test_image_differs(good: DoctorCluster, tmp_path: Path) -> None:
    results, original = run_with_other_image(good, tmp_path)
    r = results[("IMAGE.SAME", "node3")]
    assert (r.status, r.blocking) == ("fail", True) and f"the head's is {original[:12]} (the id differ)" in r.detail
    assert r.fix is not None and "tp4 distribute" in r.fix
    assert results[("IMAGE.SAME", "node2")].status == "ok"
    assert not_ok(results) == {**MEMLOCK_WARN, ("IMAGE.SAME", "node3"): "fail"}


def test_thresholds_disk_and_memory(good: DoctorCluster) -> None:
    results = run(good, Limits(**{**LIMITS.__dict__, "image_free_gib": 1e9, "memory_gib": 1e9}))
    d = results[("DISK.FREE", "node2")]
    assert d.status == "warn" and "(the image store)" in d.detail and d.fix is not None and "prune" in d.fix
    m = results[("MEMORY.FREE", "node2")]
    assert m.status == "warn" and "GiB available, less than" in m.detail


def test_port_in_use(good: DoctorCluster) -> None:
    head = good.hosts[0]
    port = int(good.plan.line.api.rsplit(":", 1)[1])
    code = (
        "import socket, time\ns = socket.socket()\ns.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
        f"s.bind(('0.0.0.0', {port}))\ns.listen()\nprint('listening', flush=True)\ntime.sleep(60)\n"
    )
    listener = subprocess.Popen(
        ["nsenter", f"--net=/run/netns/{head.namespace}", sys.executable, "-c", code], stdout=subprocess.PIPE, text=True
    )
    try:
        assert listener.stdout is not None and listener.stdout.readline().strip() == "listening"
        results = run(good)
    finally:
        listener.kill()
        listener.wait()
    r = results[("PORTS.FREE", "node1")]
    assert (r.status, r.blocking) == ("fail", True) and r.detail == f"the API port {port} is in use"
    assert r.fix is not None and "ss -ltnp" in r.fix
    assert results[("PORTS.FREE", "node2")].status == "n/a"


def test_the_image_stores_port_taken_on_the_head(good: DoctorCluster, tmp_path: Path) -> None:
    """The head's image store starts on its last port again (tp4.image.imagestore): something else
    listening there fails PORTS.FREE; a store that runs, or never ran, has no port to check."""
    import dataclasses

    from tp4.image import imagestore

    root = tmp_path / "registry"
    assert imagestore.port_in_waiting(root) is None  # never started: it takes a free port
    root.mkdir()
    (root / "config.yml").write_text(imagestore.config_text(root, 47123))
    assert imagestore.port_in_waiting(root) == 47123  # not running: its last port
    head = good.hosts[0]
    code = (
        "import socket, time\ns = socket.socket()\ns.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
        "s.bind(('127.0.0.1', 47123))\ns.listen()\nprint('listening', flush=True)\ntime.sleep(60)\n"
    )
    listener = subprocess.Popen(
        ["nsenter", f"--net=/run/netns/{head.namespace}", sys.executable, "-c", code], stdout=subprocess.PIPE, text=True
    )
    try:
        assert listener.stdout is not None and listener.stdout.readline().strip() == "listening"
        taken = run(good, dataclasses.replace(LIMITS, registry_port=47123))
        free = run(good, dataclasses.replace(LIMITS, registry_port=47124))
    finally:
        listener.kill()
        listener.wait()
    r = taken[("PORTS.FREE", "node1")]
    assert (r.status, r.detail) == ("fail", "the image store port 47123 is in use")
    assert r.fix is not None and "tp4 image-store start --port N" in r.fix and "cluster.port" not in r.fix
    assert free[("PORTS.FREE", "node1")].detail == "API, dist init and image store ports free"


def test_clock_skew(good: DoctorCluster) -> None:
    good.fake(good.hosts[2], "clock_offset").write_text("5\n")
    results = run(good)
    r = results[("CLOCK.SKEW", "node3")]
    assert (r.status, r.blocking) == ("warn", False) and r.detail.startswith("the clock is +")
    assert r.fix is not None and "NTP" in r.fix
    assert results[("CLOCK.SKEW", "node1")].status == "ok"


def test_unreachable_node(good: DoctorCluster, tmp_path: Path) -> None:
    address = good.hosts.unreachable()
    profile = tmp_path / "down.toml"
    profile.write_text(good.profile.read_text().replace(f'ssh = "{good.hosts[3].address}"', f'ssh = "{address}"'))
    plan = build_plan(load_file(profile))
    results = run(good, Limits(**{**LIMITS.__dict__, "timeout": 20}), plan=plan)
    r = results[("SSH.REACHABLE", "node4")]
    assert (r.status, r.blocking) == ("fail", True) and r.fix is not None and address in r.fix
    assert results[("IMAGE.SAME", "node4")].status == "n/a"
    assert results[("IMAGE.SAME", "node4")].detail == "not checked: the node is unreachable"
    assert [(r.check, r.node) for r in results.values() if r.status == "fail"] == [("SSH.REACHABLE", "node4")]
    assert results[("SSH.REACHABLE", "node1")].status == "ok"
    assert results[("RDMA.JUMBO_PING", "node3")].status == "ok"  # the fabric address still answers


def test_changed_host_key(good: DoctorCluster) -> None:
    from tp4.core import knownhosts

    good.hosts.new_host_key(1)
    host = good.hosts[1]
    try:
        results = run(good)
    finally:
        knownhosts.update([host.address], [(host.address, *good.hosts.host_key(host))], good.hosts.known_hosts)
        process.host_key_failures.clear()
    r = results[("SSH.REACHABLE", "node2")]
    assert (
        r.status == "fail"
        and r.detail.startswith(f"the host key of {host.address} changed")
        and "tp4 hosts trust" in r.detail
    )
    assert r.fix is not None and "fingerprint" in r.fix
    assert results[("SSH.REACHABLE", "node3")].status == "ok"


RING = """
[fabric]
mode = "ring"
[fabric.nccl]
mount = "overlay"
[gates]
DSV41_ROCE_RING = "1"
SGLANG_ROCE_MAX_SIZE = "262144"
DSV41_ROCE_GATHER = "262144"
"""


def test_ring_nccl_and_mesh_unit(good: DoctorCluster, tmp_path: Path) -> None:
    plan = ring_plan(good, tmp_path)
    libs = [Path(next(m.source for m in r.run.mounts if m.source.endswith("/libnccl.so.2"))) for r in plan.nodes]
    for rank, lib in enumerate(libs):
        lib.parent.mkdir(parents=True, exist_ok=True)
        lib.write_bytes(b"\x7fELF..." + (b"" if rank == 1 else b"NCCL_SWITCHLESS_RING_ONLY\0") + b"...")
        if rank != 3:
            good.fake(good.hosts[rank], "unit-state").write_text("active\n")
    libs[2].unlink()
    try:
        results = run(good, plan=plan)
    finally:
        for lib in libs:
            lib.unlink(missing_ok=True)
    assert results[("RING.NCCL", "node1")].status == "ok"
    assert results[("RING.NCCL", "node1")].detail == "patched NCCL, dsv41-mesh.service active"
    stock = results[("RING.NCCL", "node2")]
    assert stock.status == "fail" and "lacks SWITCHLESS_RING_ONLY" in stock.detail and stock.fix is not None
    missing = results[("RING.NCCL", "node3")]
    assert missing.status == "fail" and "the patched NCCL library is missing" in missing.detail
    mesh = results[("RING.NCCL", "node4")]
    assert mesh.status == "fail" and mesh.detail == "dsv41-mesh.service is inactive"
    assert mesh.fix is not None and "systemctl start dsv41-mesh.service" in mesh.fix


def test_the_mesh_unit_is_the_plans_for_each_kind_of_host(tmp_path: Path) -> None:
    """RING.NCCL asks for the unit the plan names: upstream's dsv41-mesh.service on a plain host,
    spark-host's tp4-mesh.service on a NixOS one (a NixOS ring node once failed a blocking check
    for a unit it does not have); a switched line names none."""
    from tp4.line.profile import load_text

    ring = (
        'preset = "production"\n[cluster]\nuser = "tp4"\n'
        '[cluster.head]\nname = "h"\nip = "10.0.0.1"\nkind = "nixos"\n'
        '[[cluster.workers]]\nname = "w1"\nip = "10.0.0.2"\n'
        '[[cluster.workers]]\nname = "w2"\nip = "10.0.0.3"\n[[cluster.workers]]\nname = "w3"\nip = "10.0.0.4"\n'
        + "[nfs]\nshare = false\n"
        + RING
    )
    plan = build_plan(load_text(ring, "t"))
    assert [r.service.mesh_unit for r in plan.nodes] == ["tp4-mesh.service"] + ["dsv41-mesh.service"] * 3
    limits = Limits()
    assert "tp4-mesh.service" in doctor.remote_args(plan, plan.nodes[0], limits)
    assert "dsv41-mesh.service" in doctor.remote_args(plan, plan.nodes[1], limits)
    switched = build_plan(load_text(ring.replace(RING, ""), "t"))
    assert {r.service.mesh_unit for r in switched.nodes} == {None}


def ring_plan(cluster: DoctorCluster, tmp_path: Path) -> Plan:
    """The cluster's line as a ring (RING in the cluster profile's [fabric] table)."""
    text = cluster.profile.read_text()
    assert "\n[fabric]\n" in text
    text = text.replace("\n[fabric]\n", '\n[fabric]\nmode = "ring"\n', 1) + RING.replace(
        '\n[fabric]\nmode = "ring"\n', "\n", 1
    )
    profile = tmp_path / "ring.toml"
    profile.write_text(text)
    plan = build_plan(load_file(profile))
    assert plan.line.fabric == "ring"
    return plan


# --- the network: peers, link speed, routes, bootstrap interface, rendezvous ---------------------


def test_a_route_to_a_peer_through_another_interface_fails_the_jumbo_ping(good: DoctorCluster) -> None:
    """The ping goes out the netdev the node's route to the peer leaves by (-I), which must be an
    RDMA device's: a route to node4 through another interface (a management LAN, a default route)
    fails for that peer alone, though the ping itself gets through."""
    host, peer = good.hosts[1], good.hosts[3]
    good.netns(host, "ip", "link", "add", "tp4side0", "type", "veth", "peer", "name", "tp4side1")
    try:
        for dev in ("tp4side0", "tp4side1"):
            good.netns(host, "ip", "link", "set", dev, "up", "mtu", "9000")
        good.netns(host, "ip", "route", "add", f"{peer.address}/32", "dev", "tp4side0")
        results = run(good)
    finally:
        good.netns(host, "ip", "link", "del", "tp4side0")
    r = results[("RDMA.JUMBO_PING", "node2")]
    assert (r.status, r.blocking) == ("fail", False)
    assert (
        f"node4 ({peer.address}): the route leaves through tp4side0, not a fabric port ({good.veth(host)})" in r.detail
    )
    assert (
        f"(reached: node1 ({good.hosts[0].address}) via {good.veth(host)}, node3 ({good.hosts[2].address}) via"
        in r.detail
    )
    assert r.fix is not None and "through a fabric port" in r.fix
    assert results[("RDMA.JUMBO_PING", "node1")].status == "ok"
    # node4's pings reach node2, whose replies take that route: node4 hears nothing back
    back = results[("RDMA.JUMBO_PING", "node4")]
    assert f"node2 ({host.address}) via {good.veth(peer)}: no reply to 3 packets within 2 s" in back.detail
    assert not_ok(results) == {
        **MEMLOCK_WARN,
        ("RDMA.JUMBO_PING", "node2"): "fail",
        ("RDMA.JUMBO_PING", "node4"): "fail",
    }


def test_link_speed_below_200_gbe(good: DoctorCluster) -> None:
    speed = good.sysfs(good.hosts[2]) / "class" / "net" / good.veth(good.hosts[2]) / "speed"
    speed.write_text("100000\n")
    (good.sysfs(good.hosts[3]) / "class" / "net" / good.veth(good.hosts[3]) / "speed").write_text("-1\n")
    results = run(good)
    r = results[("RDMA.LINK_SPEED", "node3")]
    veth = good.veth(good.hosts[2])
    assert (r.status, r.blocking) == ("fail", False)
    assert r.detail == f"{HCA0}/{veth} at 100000 Mb/s, {HCA1}/{veth} at 100000 Mb/s, not 200000 Mb/s"
    assert r.fix is not None and "ethtool" in r.fix
    assert "speed unknown (-1: the link is down?)" in results[("RDMA.LINK_SPEED", "node4")].detail
    assert not_ok(results) == {
        **MEMLOCK_WARN,
        ("RDMA.LINK_SPEED", "node3"): "fail",
        ("RDMA.LINK_SPEED", "node4"): "fail",
    }
    assert doctor.blocking_failures(good.plan, good.nodes(), LIMITS) == []  # slower, not broken


def test_bootstrap_interface_absent_unaddressed_or_down(good: DoctorCluster) -> None:
    good.set_bootstrap(good.hosts[1], address=False)
    good.set_bootstrap(good.hosts[2], up=False)
    good.netns(good.hosts[3], "ip", "link", "del", BOOTSTRAP)
    results = run(good)
    what = "NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME=tp4boot0"
    unaddressed = results[("NET.BOOTSTRAP_IFACE", "node2")]
    assert (unaddressed.status, unaddressed.blocking) == ("fail", True)
    assert unaddressed.detail == f"{what}: tp4boot0 has no IPv4 address" and unaddressed.fix is not None
    assert results[("NET.BOOTSTRAP_IFACE", "node3")].detail == f"{what}: tp4boot0 is down"
    absent = results[("NET.BOOTSTRAP_IFACE", "node4")]
    assert absent.detail.startswith(f"{what}: no such interface (there: ") and good.veth(good.hosts[3]) in absent.detail
    assert absent.fix is not None and "fabric.socket_ifname" in absent.fix
    assert results[("NET.BOOTSTRAP_IFACE", "node1")].status == "ok"
    assert sorted(x.node for x in doctor.blocking_failures(good.plan, good.nodes(), LIMITS)) == [
        "node2",
        "node3",
        "node4",
    ]


def test_a_worker_without_a_route_to_the_rendezvous(good: DoctorCluster) -> None:
    host, head = good.hosts[2], good.hosts[0].address
    good.netns(host, "ip", "route", "add", "unreachable", f"{head}/32")
    try:
        results = run(good)
    finally:
        good.netns(host, "ip", "route", "del", "unreachable", f"{head}/32")
    r = results[("NET.RENDEZVOUS_ROUTE", "node3")]
    assert (r.status, r.blocking) == (
        "fail",
        True,
    ) and r.detail == f"no route to the dist init address {head}: No route to host"
    assert r.fix is not None and f"route the head's address {head}" in r.fix
    c = results[("PEER.CONTROL_CHANNEL", "node3")]
    assert c.status == "fail" and c.detail == f"TCP to the dist init port {head}:20000: No route to host"
    assert results[("NET.RENDEZVOUS_ROUTE", "node2")].status == "ok"


def test_a_firewall_dropping_the_dist_init_port_fails_the_control_channel(good: DoctorCluster) -> None:
    """A worker's TCP connection to the head's dist init port must be answered: refused (nothing
    listens before serve) passes, silence (a firewall drops it) fails, and blocks serve."""
    head, worker = good.hosts[0], good.hosts[3]
    rule = ["INPUT", "-p", "tcp", "--dport", "20000", "-s", worker.address, "-j", "DROP"]
    good.netns(head, "iptables", "-A", *rule)
    try:
        results = run(good)
    finally:
        good.netns(head, "iptables", "-D", *rule)
    r = results[("PEER.CONTROL_CHANNEL", "node4")]
    assert (r.status, r.blocking) == ("fail", True)
    assert r.detail == f"TCP to the dist init port {head.address}:20000: no answer within 3 s"
    assert r.fix is not None and "let TCP port 20000 through to the head" in r.fix
    assert results[("PEER.CONTROL_CHANNEL", "node2")].status == "ok"
    assert results[("NET.RENDEZVOUS_ROUTE", "node4")].status == "ok"  # routed, but dropped
    assert not_ok(results) == {**MEMLOCK_WARN, ("PEER.CONTROL_CHANNEL", "node4"): "fail"}


def test_ring_pings_its_neighbours_and_checks_routes_and_relays(good: DoctorCluster, tmp_path: Path) -> None:
    """On a ring a node pings its two neighbours only; every other node's fabric IP must be routed
    through a fabric port, via another node's address where it is not adjacent, and a node such a
    route goes through must forward IPv4 (net.ipv4.ip_forward is per network namespace)."""
    plan = ring_plan(good, tmp_path)
    h = good.hosts
    relay = ["ip", "route", "add", f"{h[2].address}/32", "via", h[1].address, "dev", good.veth(h[0])]
    missing = ["ip", "route", "add", "unreachable", f"{h[0].address}/32"]
    stranger = ["ip", "route", "add", f"{h[1].address}/32", "via", f"{good.hosts.subnet}.99", "dev", good.veth(h[3])]
    good.netns(h[0], *relay)
    try:
        for host in h:
            good.netns(host, "sysctl", "-qw", "net.ipv4.ip_forward=1")
        forwarding = run(good, plan=plan)
        good.netns(h[1], "sysctl", "-qw", "net.ipv4.ip_forward=0")
        good.netns(h[2], *missing)
        good.netns(h[3], *stranger)
        broken = run(good, plan=plan)
    finally:
        good.netns(h[0], "ip", "route", "del", f"{h[2].address}/32")
        good.netns(h[2], "ip", "route", "del", "unreachable", f"{h[0].address}/32")
        good.netns(h[3], "ip", "route", "del", f"{h[1].address}/32")
        good.netns(h[1], "sysctl", "-qw", "net.ipv4.ip_forward=1")
    ping = forwarding[("RDMA.JUMBO_PING", "node1")]
    assert ping.status == "ok" and ping.detail == (
        f"8972+28 bytes with don't-fragment reach node2 ({h[1].address}) via "
        f"{good.veth(h[0])}, node4 ({h[3].address}) via {good.veth(h[0])}"
    )
    routes = forwarding[("RING.ROUTES", "node1")]
    assert (
        routes.status == "ok"
        and routes.detail == f"node2 on {good.veth(h[0])}, node3 via node2, node4 on {good.veth(h[0])}"
    )
    assert forwarding[("RING.IP_FORWARD", "node2")].detail == f"forwards the routes node1's to node3 ({h[2].address})"
    assert forwarding[("RING.IP_FORWARD", "node3")].detail == "no node's route goes through it (net.ipv4.ip_forward=1)"
    off = broken[("RING.IP_FORWARD", "node2")]
    assert (off.status, off.blocking) == ("fail", True)
    assert off.detail == f"net.ipv4.ip_forward is 0, and the routes node1's to node3 ({h[2].address}) go through it"
    assert off.fix is not None and "sysctl -w net.ipv4.ip_forward=1" in off.fix
    gone = broken[("RING.ROUTES", "node3")]
    assert (gone.status, gone.blocking) == (
        "fail",
        True,
    ) and gone.detail == f"no route to node1 ({h[0].address}): No route to host"
    assert gone.fix is not None and "mesh" in gone.fix
    odd = broken[("RING.ROUTES", "node4")]
    assert (
        odd.status == "fail"
        and odd.detail == f"node2 ({h[1].address}) goes via {good.hosts.subnet}.99, no node's address"
    )
    assert broken[("RING.ROUTES", "node2")].status == "ok"
    assert broken[("NET.RENDEZVOUS_ROUTE", "node3")].status == "fail"  # the head is node1


# --- the remote command is constant ----------------------------------------------------------------

HOSTILE = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"), min_size=1, max_size=40
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(workdir=HOSTILE, image=HOSTILE, source=HOSTILE, host=HOSTILE, hca=HOSTILE, interval=st.floats(0, 60))
def test_no_profile_value_changes_the_remote_command(
    workdir: str, image: str, source: str, host: str, hca: str, interval: float
) -> None:
    from tp4.line.profile import load_default

    plan = build_plan(load_default())
    rank = plan.nodes[1]
    mounts = tuple(m._replace(source=source) for m in rank.run.mounts)
    rank = rank._replace(
        host=host,
        run=rank.run._replace(workdir=workdir, image=image, mounts=mounts),
        gid=rank.gid._replace(hcas=(hca, "x")),
    )
    nodes = list(plan.nodes)
    nodes[1] = rank
    nodes[2] = nodes[2]._replace(host=host)
    plan = plan._replace(nodes=tuple(nodes))
    argv = doctor.facts_argv(plan, rank, Limits(interval=interval))
    assert argv[:4] == ["sh", "-c", FACTS_SCRIPT, "tp4-doctor"]
    assert len(argv) == 4 + 16 + 3  # the fixed arguments, then the directories df reads
    for value in (workdir, image, source):
        assert value in argv[4:]
    assert any(host in a for a in argv[4:])  # in the lists of peers and of route targets
    # quoted once: the remote shell gets exactly these words back
    remote = process.Remote(host="spark2", user="u")
    command = process.full_argv(argv, remote)[-1]
    assert shlex.split(command) == argv


def test_facts_script_is_a_constant() -> None:
    from tp4.line.profile import load_default

    plan = build_plan(load_default())
    scripts = {doctor.facts_argv(plan, r, Limits(sysfs=s))[2] for r in plan.nodes for s in ("/sys", "/x y")}
    assert scripts == {FACTS_SCRIPT}
    proc = subprocess.run(["sh", "-n", "-c", FACTS_SCRIPT], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    # the figures the checks report are the ones the script uses
    assert f"ping -M do -s {doctor.JUMBO_PAYLOAD} -c {doctor.PING_COUNT} -W {doctor.PING_WAIT} -I" in FACTS_SCRIPT
    assert f"timeout {doctor.CONTROL_WAIT} bash" in FACTS_SCRIPT


def test_docs_list_every_check(repo: Path) -> None:
    text = (repo / "docs" / "doctor.md").read_text()
    section = text[text.index(doctor.REFERENCE_BEGIN) : text.index(doctor.REFERENCE_END) + len(doctor.REFERENCE_END)]
    assert section == doctor.reference(), "docs/doctor.md's check table is stale: paste tp4.hosts.doctor.reference()"


def test_memlock_of_a_unit_and_of_dockerd(good: DoctorCluster) -> None:
    """The limit the container gets: a NixOS unit's LimitMEMLOCK, dockerd's own limit (facts as the
    script prints them: `systemctl show -p LimitMEMLOCK --value`, /proc/<dockerd>/limits)."""
    import copy

    facts = doctor.gather(good.plan, good.nodes(), LIMITS)
    unlimited = good.plan._replace(
        nodes=tuple(
            r._replace(run=r.run._replace(ulimits=r.run.ulimits._replace(memlock="-1:-1"))) for r in good.plan.nodes
        )
    )
    nixos = unlimited._replace(
        nodes=tuple(
            r._replace(service=r.service._replace(kind="nixos", unit=f"podman-{r.run.container}.service"))
            for r in unlimited.nodes
        )
    )
    cases = {"8388608": "fail", "infinity": "ok"}
    for value, status in cases.items():
        f = copy.deepcopy(facts)
        f["node2"].sections["memlock_unit"] = [value]
        r = {(x.check, x.node): x for x in doctor.evaluate(nixos, f, LIMITS)}[("RDMA.MEMLOCK", "node2")]
        assert r.status == status, r
        if status == "fail":
            assert "LimitMEMLOCK of podman-dsv41-worker.service is 8192 KiB" in r.detail
            assert r.fix == "LimitMEMLOCK=infinity for podman-dsv41-worker.service"
    docker = unlimited._replace(
        nodes=tuple(r._replace(service=r.service._replace(runtime="docker")) for r in unlimited.nodes)
    )
    f = copy.deepcopy(facts)
    f["node3"].sections["memlock_runtime"] = [
        "Max locked memory         8388608              8388608              bytes"
    ]
    r = {(x.check, x.node): x for x in doctor.evaluate(docker, f, LIMITS)}[("RDMA.MEMLOCK", "node3")]
    # dockerd runs as root: it gives the container the plan's --ulimit memlock=-1:-1 whatever its own limit
    assert r.status == "ok" and "dockerd's limit: 8192 KiB, raised by the runtime" in r.detail
    # unlimited in the plan and no limit in the way: ok
    r = {(x.check, x.node): x for x in doctor.evaluate(unlimited, facts, LIMITS)}[("RDMA.MEMLOCK", "node1")]
    assert (
        r.status == "fail" and "the plan asks memlock unlimited" in r.detail
    )  # the sessions' hard limit here is 8 MiB


def test_parallel_is_faster_than_node_after_node(good: DoctorCluster) -> None:
    nodes = good.nodes()
    began = time.monotonic()
    for node in nodes:
        doctor.gather_one(good.plan, doctor._target(node), LIMITS)
    sequential = time.monotonic() - began
    began = time.monotonic()
    doctor.gather(good.plan, nodes, LIMITS)
    parallel = time.monotonic() - began
    print(
        f"tp4 doctor facts of 4 nodes: {parallel:.2f} s in parallel, {sequential:.2f} s node after node "
        f"({parallel / sequential:.2f}x)"
    )
    assert parallel < sequential


def test_facts_script_takes_its_arguments_as_data(tmp_path: Path) -> None:
    """Run here with hostile arguments: an HCA list of `*` and `$(...)` is neither globbed nor run."""
    sysfs = tmp_path / "sys"
    (sysfs / "class" / "infiniband" / "decoy").mkdir(parents=True)
    (tmp_path / "cwdfile").touch()
    marker = tmp_path / "ran"
    args = [
        str(sysfs),
        "0",
        "tp4-no-such-runtime",
        f"$(touch {marker})",
        f"* $(touch {marker})",
        "",
        "",
        str(tmp_path / "engram"),
        "*",
        f"$(touch {marker})",
        "",
        "",
        "",
        f"* $(touch {marker})",
        f"$(touch {marker})",
        "1",
        str(tmp_path),
    ]
    proc = subprocess.run(
        ["sh", "-c", FACTS_SCRIPT, "tp4-doctor", *args], capture_output=True, text=True, cwd=tmp_path, timeout=60
    )
    sections = doctor.parse(proc.stdout)
    assert "date" in sections, proc.stderr
    assert not marker.exists()
    assert not any(name.startswith("hca ") for name in sections)  # `*` is no HCA, and not the decoy
    assert sections["engram"] == ["* absent"]
    assert sections["runtime"] == ["absent"]


# sparkring's preflight ids (scripts/preflight.py at 4aa030a, CHECK_DESCRIPTIONS, lines 74-115)
SPARKRING_IDS = (
    "SSH.REACHABLE",
    "MGMT.ADDRESS_PRESENT",
    "MGMT.INTERFACE_MATCH",
    "RING.LINK_UP",
    "RING.MTU",
    "RING.LINK_SPEED",
    "RING.ADDRESS",
    "RING.RDMA_PORT_ACTIVE",
    "RING.RDMA_LINK_LAYER",
    "RING.ROCE_GID",
    "RING.JUMBO_PING",
    "PEER.CONTROL_CHANNEL",
    "ARTIFACT.PRESENT",
    "ARTIFACT.SHA256",
    "ARTIFACT.EXECUTABLE",
    "PORT.FREE",
    "DISK.PATH_PRESENT",
    "DISK.FREE",
    "IMAGE.PRESENT",
    "IMAGE.DIGEST",
)


def test_the_sparkring_parity_table_names_every_id_of_theirs_and_only_checks_of_ours(repo: Path) -> None:
    text = (repo / "docs" / "doctor.md").read_text()
    section = text[text.index("## Beside sparkring's preflight") : text.index("## Example")]
    rows = [line.split(" | ") for line in section.splitlines() if line.startswith("| `")]
    assert [r[0].strip("| `") for r in rows] == list(SPARKRING_IDS)
    for r in rows:
        ours = re.findall(r"`([A-Z]+\.[A-Z0-9_]+)`", r[2])
        assert all(o in doctor.BY_ID for o in ours), r
        assert ours or r[2] == "none", r
    # every check of ours is either beside one of theirs or named as ours only
    beside = {o for r in rows for o in re.findall(r"`([A-Z]+\.[A-Z0-9_]+)`", r[2])}
    only = set(re.findall(r"`([A-Z]+\.[A-Z0-9_]+)`", section.split("without a sparkring preflight id", 1)[1]))
    assert {c.id for c in CHECKS} <= beside | only, {c.id for c in CHECKS} - beside - only
