"""`tp4 bench needle --profile ... --watch-memory` end to end: the head is a netns host with its own
sshd (tests/netns_hosts.py), the stand-in engine serves the API in the head's network namespace
on the profile's port, and tp4 reads the head's MemAvailable over ssh as `tp4 status` reaches the
node. Needs root, iproute2, util-linux and openssh-server (not a unit test)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from netns_hosts import NetnsHosts
from test_needle import KEY, MODEL, RUNNER, free_port

from tp4.serving import api

REPO = Path(__file__).resolve().parent.parent
ENGINE = REPO / "tests" / "standin" / "engine.py"


@pytest.fixture(scope="module")
def head(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[NetnsHosts, int]]:
    workdir = tmp_path_factory.mktemp("needle-head")
    with NetnsHosts(workdir / "hosts", count=1) as hosts:
        port = free_port()
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "TP4_STANDIN_PACE": "0",
            "TP4_STANDIN_API_KEY": KEY,
            "TP4_STANDIN_FAULT": "busy",
            "TP4_STANDIN_BUSY_SECONDS": "1.5",
        }
        with open(workdir / "engine.log", "wb") as out:
            engine = subprocess.Popen(
                [
                    "nsenter",
                    f"--net=/run/netns/{hosts[0].namespace}",
                    sys.executable,
                    "-u",
                    str(ENGINE),
                    "python",
                    "-m",
                    "sglang.launch_server",
                    "--model-path",
                    "/models/DeepSeek-V4.1-Flash",
                    "--served-model-name",
                    MODEL,
                    "--host",
                    "0.0.0.0",
                    "--port",
                    str(port),
                ],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            deadline = time.monotonic() + 20
            while api.health(api.Endpoint.of(f"http://{hosts[0].address}:{port}", MODEL), 1) != 200:
                assert engine.poll() is None and time.monotonic() < deadline, (workdir / "engine.log").read_text()[
                    -2000:
                ]
                time.sleep(0.05)
            yield hosts, port
        finally:
            os.killpg(engine.pid, signal.SIGKILL)
            engine.wait()


def test_watch_memory_reads_the_head_over_ssh(head: tuple[NetnsHosts, int], tmp_path: Path) -> None:
    hosts, port = head
    key = tmp_path / "api-key"
    key.write_text(KEY + "\n")
    key.chmod(0o600)
    host = hosts[0]
    profile = tmp_path / "profile.toml"
    profile.write_text(
        f'preset = "production"\n[cluster]\nuser = "root"\nidentity = "{hosts.key}"\nport = {port}\n'
        f'[cluster.head]\nname = "spark1"\nip = "{host.address}"\nssh = "{host.address}"\n'
        # the workers are never reached: the needle talks to the head's API and reads the head
        + "".join(f'[[cluster.workers]]\nname = "spark{i}"\nip = "{hosts.subnet}.{200 + i}"\n' for i in (2, 3, 4))
        + f'[api]\nkey_file = "{key}"\n'
    )
    out = tmp_path / "needle.json"
    verbose = RUNNER.replace('main(["', 'main(["-v", "')  # every command as `$ ...` on stderr
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            verbose,
            "--profile",
            str(profile),
            "--lengths",
            "3k",
            "--seed",
            "4",
            "--watch-memory",
            "--memory-interval",
            "0.25",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO / "python")},
    )
    assert proc.returncode == 0, proc.stderr
    header, row = proc.stdout.splitlines()
    assert "low-water" in header
    assert row.split()[6] == "PASS" and row.split()[8] == "GiB"  # the low-water column
    doc = json.loads(out.read_text())
    assert doc["config"]["watchMemory"] is True and doc["config"]["memoryInterval"] == 0.25
    assert doc["node"] == host.address and doc["tp4"]["plan_digest"].startswith("sha256:")
    memory = doc["results"][0]["memory"]
    assert memory["error"] is None and memory["samples"] >= 4  # 1.5 s at 0.25 s, the first and the last
    assert 0 < memory["lowWaterBytes"] <= memory["beforeBytes"]  # the first read counts too
    reads = [
        line for line in proc.stderr.splitlines() if line.startswith("$ ssh ") and line.endswith(" 'cat /proc/meminfo'")
    ]
    assert len(reads) >= memory["samples"] + 1, proc.stderr[-3000:]  # the check before the run, then every sample
    assert all(f"root@{host.address} " in line for line in reads)  # over ssh to the head
    assert KEY not in proc.stdout + proc.stderr + out.read_text()
