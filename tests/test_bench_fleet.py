"""`tp4 bench decode --fleet`: the bench through a fleet's router (the real sglang-router, here on
this machine) over two lines of the stand-in engine (127.0.0.1 and 127.0.0.2), each line's share
of every level from the router's per-worker request counts, and `tp4 report` showing per line and
aggregate."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from test_bench import ENGINE, tp4

from tp4.serving import fleet

REPO = Path(__file__).resolve().parent.parent
ROUTER_PYTHON = os.environ.get("TP4_ROUTER_PYTHON") or sys.executable


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def engine(host: str, port: int, log: Path) -> subprocess.Popen[bytes]:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "TP4_STANDIN_PACE": "0",
        "TP4_STANDIN_DECODE_TPS": "200",
        "TP4_STANDIN_TOKENS_PER_EVENT": "3",
    }
    with open(log, "wb") as out:
        return subprocess.Popen(
            [
                sys.executable,
                "-u",
                str(ENGINE),
                "python",
                "-m",
                "sglang.launch_server",
                "--model-path",
                "/models/x",
                "--served-model-name",
                "deepseek-v4.1-flash",
                "--host",
                host,
                "--port",
                str(port),
            ],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/v1/models", timeout=3) as r:
            return r.status == 200
    except OSError:
        return False


def test_bench_through_the_router_records_each_lines_share_and_report_shows_it(tmp_path: Path) -> None:
    if subprocess.run([ROUTER_PYTHON, "-c", "import sglang_router.launch_router"], capture_output=True).returncode != 0:
        pytest.fail(f"{ROUTER_PYTHON} has no sglang_router: run `bash python/setup.sh --test` (the router group)")
    pa, pb = free_port("127.0.0.1"), free_port("127.0.0.2")
    rport, mport = free_port(), free_port()
    base = f"""preset = "production"
[cluster]
port = {pa}
[cluster.head]
name = "s1"
ip = "127.0.0.1"
[[cluster.workers]]
name = "s2"
ip = "127.0.0.3"
[engine]
tp = 2
[nfs]
share = false
"""
    (tmp_path / "base.toml").write_text(base)
    path = tmp_path / "fleet.toml"
    path.write_text(f'''base = "base.toml"
[[lines]]
name = "a"
[[lines]]
name = "b"
[lines.set.cluster]
port = {pb}
[lines.set.cluster.head]
name = "s3"
ip = "127.0.0.2"
[[lines.set.cluster.workers]]
name = "s4"
ip = "127.0.0.4"
[router]
host = "local"
bind = "127.0.0.1"
port = {rport}
python = "{ROUTER_PYTHON}"
state_dir = "{tmp_path / "router"}"
[router.metrics]
port = {mport}
[router.health]
timeout = 25
interval = 1
failure_threshold = 1
success_threshold = 1
''')
    f = fleet.load(path)
    assert [line.api for line in f.lines] == [f"http://127.0.0.1:{pa}", f"http://127.0.0.2:{pb}"]
    engines = [engine("127.0.0.1", pa, tmp_path / "a.log"), engine("127.0.0.2", pb, tmp_path / "b.log")]
    host = fleet.RouterHost(f, None)
    try:
        deadline = time.monotonic() + 30
        while not all(answers(line.api) for line in f.lines):
            assert time.monotonic() < deadline, "the stand-in engines did not come up"
            time.sleep(0.1)
        assert host.start([line.api for line in f.lines], None).startswith("started")
        deadline = time.monotonic() + 60
        while not (fleet.workers(f, None) or []) or not all(w.healthy for w in fleet.workers(f, None) or []):
            assert time.monotonic() < deadline, host.log_tail()
            time.sleep(0.3)

        out = tmp_path / "run"
        proc = tp4(
            "bench",
            "decode",
            "--fleet",
            path,
            "--levels",
            "1,4",
            "--max-tokens",
            "31",
            "--prompt-types",
            "prose",
            "--c1-runs",
            "1",
            "--warmup",
            "0",
            "--out",
            out,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        doc = json.loads((out / "result.json").read_text())
        assert doc["node"] is None and doc["tp4"]["host"] == "127.0.0.1" and doc["config"]["base"] == f.url + "/v1"
        for entry in doc["decode"]:
            for level in entry["job"]["results"]:
                lines = level["tp4"]["lines"]
                c = level["concurrency"]
                assert set(lines) == {"a", "b"} and level["tp4"]["invalid"] is None
                # round robin: the router sent the level's streams to the two lines, each counted once
                assert sum(v["requests"] for v in lines.values()) == c
                if c == 4:
                    assert lines["a"]["requests"] == lines["b"]["requests"] == 2
                assert sum(v["decodeTokens"] for v in lines.values()) == level["totalDecodeTokens"]
                assert sum(v["decodeTps"] for v in lines.values()) == pytest.approx(
                    level["aggregateDecodeTps"], rel=1e-3
                )
        # the bench's own summary and tp4 report show per line and aggregate
        assert "per line (the router's per-worker request counts" in proc.stdout
        rep = tp4("report", out, "--no-charts")
        assert rep.returncode == 0, rep.stderr
        text = rep.stdout
        head = "decode behind the router, per line and aggregate"
        assert head in text
        table = text[text.index(head) :].splitlines()
        assert table[1].split() == ["prompt", "c", "aggregate", "a", "tok/s", "a", "req", "b", "tok/s", "b", "req"]
        row = next(r.split() for r in table if r.split()[:2] == ["prose", "c4"])
        assert row[4] == "2" and row[6] == "2"
        assert float(row[3]) + float(row[5]) == pytest.approx(float(row[2]), abs=0.2)
        data = json.loads(tp4("report", out, "--no-charts", "--json").stdout)
        assert any(e["concurrency"] == 4 and e["lines"]["a"]["requests"] == 2 for e in data["runs"][0]["lines"])

        # --fleet names the endpoint itself
        bad = tp4("bench", "decode", "--fleet", path, "--url", f.url)
        assert bad.returncode == 2 and "--fleet: given with --url" in bad.stderr
    finally:
        host.stop()
        for e in engines:
            if e.poll() is None:
                os.killpg(e.pid, signal.SIGKILL)
            e.wait()
