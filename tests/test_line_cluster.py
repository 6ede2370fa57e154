"""The serve scenarios' cluster (tests/line_cluster.py): every rank's container started over ssh
with exactly the plan's `podman run` (tp4.serving.serve.run_argv) from the stand-in image on four netns
hosts boots the line (the head prints Ready, answers a completion and passes its health check),
and removing them leaves nothing. Needs root, iproute2, util-linux, openssh-server, podman and runc."""

from __future__ import annotations

import json
import re
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from line_cluster import LineCluster, memlock
from standin.engine import QUESTION

from tp4.serving import serve
from tp4.hosts.nodes import Node
from tp4.line.profile import load_file

LINE = "t"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LineCluster]:
    with LineCluster(tmp_path_factory.mktemp("line")) as c:
        yield c


def wait_for(node: Node, needle: str, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    log = ""
    while time.monotonic() < deadline:
        log = serve.full_log(node)
        if needle in log or serve.container_state(node) not in ("running", "created", "configured"):
            break
        time.sleep(0.5)
    return log


def completion(api: str, timeout: float = 10) -> dict[str, object]:
    body = json.dumps(
        {
            "model": "deepseek-v4.1-flash",
            "messages": [{"role": "user", "content": QUESTION}],
            "temperature": 0,
            "max_tokens": 1,
        }
    ).encode()
    req = urllib.request.Request(f"{api}/v1/chat/completions", data=body, headers={"Content-Type": "application/json"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # the bridge, never a proxy
    with opener.open(req, timeout=timeout) as resp:
        out: dict[str, object] = json.loads(resp.read())
        return out


def test_the_profile_is_the_clusters(cluster: LineCluster) -> None:
    loaded = load_file(cluster.profile)  # raises on a problem; warnings are fine
    assert any(w.startswith("cluster.memlock:") for w in loaded.warnings) == (memlock() != "-1:-1")
    plan = cluster.plan
    assert [n.ssh.host for n in plan.nodes] == [n.host for n in plan.nodes] == [h.address for h in cluster.hosts]
    assert {(n.ssh.user, n.ssh.port, n.service.kind, n.service.runtime) for n in plan.nodes} == {
        ("root", 22, "plain", "podman")
    }
    assert plan.line.dist_init_addr == f"{cluster.head.address}:20000"
    for node in plan.nodes:
        assert node.run.ulimits.memlock == memlock()
        assert all(m.source.startswith(str(cluster.workdir)) for m in node.run.mounts if m.type == "bind"), (
            node.run.mounts
        )


def test_every_rank_runs_the_plans_podman_run_and_the_line_boots(cluster: LineCluster) -> None:
    plan = cluster.plan
    nodes = cluster.nodes()
    assert cluster.leftovers() == []
    for node in nodes:  # what serve's start makes first
        node.run(["mkdir", "-p", *serve.made_dirs(node.rank)])
    started = time.monotonic()
    try:
        for node in [*nodes[1:], nodes[0]]:  # workers, then the head
            argv = serve.run_argv(node.rank, line=LINE)
            assert argv[:3] == ["podman", "run", "-d"] and f"memlock={memlock()}" in argv
            assert "nvidia.com/gpu=all" in argv and "/dev/infiniband:/dev/infiniband" in argv
            serve.write_private(node, node.rank.service.env_file, serve.env_file_text(node.rank, {}))
            node.run(argv, timeout=120)
        head = wait_for(nodes[0], "Ready: API on port", 60)
        port = plan.line.api.rsplit(":", 1)[1]
        assert re.search(rf"^Ready: API on port {port} \(rank 0\), no API key\.$", head, re.M), head[-3000:]
        for node in nodes[1:]:
            log = wait_for(node, "Scheduler ready", 10)
            assert "Scheduler ready" in log and "Traceback" not in log, (node.name, log[-2000:])
            assert serve.container_state(node) == "running"
        # what the plan's flags gave the rank (boot.py, the container's pid 1), read from its host
        # through /proc/<pid> (an exec into the container is not what is tested here): the RDMA
        # device in its root, the CDI GPU's edits in its environment, memlock
        pid = nodes[1].run(["podman", "inspect", "--format", "{{.State.Pid}}", nodes[1].container]).stdout.strip()
        inside = (
            nodes[1]
            .run(
                [
                    "sh",
                    "-c",
                    'test -c "/proc/$1/root/dev/infiniband/uverbs0" && echo ib=yes; '
                    'cat "/proc/$1/limits" "/proc/$1/environ"',
                    "sh",
                    pid,
                ]
            )
            .stdout
        )
        assert "ib=yes" in inside and "NVIDIA_VISIBLE_DEVICES=void" in inside.replace("\0", "\n").splitlines(), inside
        soft, hard = memlock().replace("-1", "unlimited").split(":")
        assert re.search(rf"^Max locked memory\s+{soft}\s+{hard}\s", inside, re.M), inside
        out = completion(plan.line.api)
        assert out["choices"][0]["finish_reason"] == "length"  # type: ignore[index]
        # the image's health check, from the plan's flags (the stand-in image carries none, and
        # podman reads none from the line's OCI image): it passes on the serving head and on
        # every worker (SGLang's ranks above 0 answer /health from a dummy server on --port)
        # (where podman cannot exec at all, as chrooted in the fresh-machine CI, for that reason only:
        # tests/test_podman_health.py, CHROOT_EXEC)
        for node in nodes:
            config = json.loads(
                node.run(
                    ["podman", "container", "inspect", "--format", "{{json .Config.Healthcheck}}", node.container]
                ).stdout
            )
            assert config["Test"] == ["CMD", *node.rank.run.health.cmd], config
            check = node.run(["podman", "healthcheck", "run", node.container], check=False)
            if check.returncode != 0:
                exec_ = node.run(["podman", "exec", node.container, "true"], check=False)
                # (runc's words; the hosts' runc wrapper quotes them in a log line: \" for ")
                said = exec_.stderr.replace('\\"', '"')
                assert 'chdir to cwd ("/opt/dsv41") set in config.json failed' in said, (
                    node.name,
                    check.stdout + check.stderr,
                    exec_.stderr,
                )
        ps = cluster.podman_ps()
        for node in nodes:
            assert node.container in ps[node.name] and " Up " in ps[node.name], ps[node.name]
        assert {p.split(": ")[0] for p in cluster.leftovers() if ": process " in p} == {h.name for h in cluster.hosts}
        print(f"four ranks to Ready in {time.monotonic() - started:.1f} s")
    finally:
        for node in nodes:
            node.run(["podman", "rm", "-f", "-t", "2", node.container], check=False, timeout=60)
    deadline = time.monotonic() + 10
    while cluster.leftovers() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert cluster.leftovers() == []


def test_the_machine_is_untouched(cluster: LineCluster) -> None:
    """The hosts' /dev/infiniband and CDI spec exist in their sshd's mount namespace only."""
    assert cluster.head.run("test", "-c", "/dev/infiniband/uverbs0").returncode == 0
    assert cluster.head.run("test", "-f", "/etc/cdi/nvidia.com-gpu.json").returncode == 0
    assert not Path("/dev/infiniband").exists() and not Path("/etc/cdi/nvidia.com-gpu.json").exists()
