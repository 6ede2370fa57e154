"""The watchdog's metrics read back through the real Prometheus (Debian's `prometheus`, which
python/setup.sh --test installs): Prometheus scrapes the watchdog's loopback endpoint and the
stand-in engine's SGLang /metrics (as the NixOS option's scrape jobs tp4-watch and tp4-sglang do),
and its HTTP API (/api/v1/query) answers each series with the values each serves."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

from test_api import Head
from test_api import metrics_args as with_metrics
from test_watch import ALIVE, RUNNING, WEDGED, Fake

from tp4.serving import api

from tp4.serving import watch as w


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def query(port: int, expr: str) -> list[dict[str, object]]:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=5) as resp:
        doc = json.loads(resp.read())
    assert doc["status"] == "success", doc
    return list(doc["data"]["result"])


def wait_value(port: int, expr: str, want: str, seconds: float = 60) -> dict[str, object]:
    deadline = time.monotonic() + seconds
    got: list[dict[str, object]] = []
    while time.monotonic() < deadline:
        try:
            got = query(port, expr)
        except OSError:
            got = []
        for series in got:
            value = series["value"]
            assert isinstance(value, list)
            if value[1] == want:
                return series
        time.sleep(0.5)
    raise AssertionError(f"{expr}: no sample {want} within {seconds} s: {got}")


def test_prometheus_reads_the_watchdogs_series(tmp_path: Path) -> None:
    assert shutil.which("prometheus"), "prometheus (Debian's package) is needed: bash python/setup.sh --test"
    fake = Fake([(RUNNING, ALIVE)] + [(RUNNING, WEDGED)] * 3 + [({"a": "running", "b": "exited"}, ALIVE)])
    dog, _ = fake.dog(tmp_path)
    metrics = w.Metrics(dog.gauges, ("127.0.0.1", 0))
    engine = Head(tmp_path / "head", {"EXTRA_SGLANG_ARGS": with_metrics()})
    prom_port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        "scrape_configs:\n  - job_name: tp4-watch\n"
        f"    static_configs:\n      - targets: ['127.0.0.1:{metrics.port}']\n"
        "  - job_name: tp4-sglang\n"
        f"    static_configs:\n      - targets: ['127.0.0.1:{engine.port}']\n"
    )
    prom = subprocess.Popen(
        [
            "prometheus",
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{prom_port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "prometheus.log").open("w"),
    )
    try:
        dog.run(looks=4)  # ready, then a wedge confirmed on the 3rd look: evidence, restart, ready
        assert fake.restarts == 1
        state = wait_value(prom_port, "tp4_line_state", "0")
        labels = state["metric"]
        assert isinstance(labels, dict)
        assert labels["state"] == "ready" and labels["line"] == "l" and labels["job"] == "tp4-watch"
        wait_value(prom_port, "tp4_line_restarts_total", "1")
        wait_value(prom_port, "tp4_wedges_total", "1")
        wait_value(prom_port, "tp4_probe_ttft_seconds", "0.05")
        wait_value(prom_port, 'tp4_rank_up{node="b"}', "1")
        dog.step()  # a rank gone: down, seen once (not yet acted on)
        wait_value(prom_port, 'tp4_rank_up{node="b"}', "0")
        wait_value(prom_port, 'tp4_line_state{state="down"}', "3")
        wait_value(prom_port, 'up{job="tp4-watch"}', "1")
        # the stand-in's SGLang series, as Prometheus parsed them: a completion's tokens counted
        api.complete(engine.ep, api.QUESTION, max_tokens=8, timeout=10)
        counted = api.tokens(engine.ep, 5)
        assert counted is not None
        want = counted.counts["sglang:generation_tokens_total"]
        wait_value(prom_port, 'up{job="tp4-sglang"}', "1")
        series = wait_value(prom_port, "sum(sglang:generation_tokens_total)", f"{want:g}")
        assert series["metric"] == {}
        found = wait_value(prom_port, 'sglang:num_running_reqs{job="tp4-sglang"}', "0")["metric"]
        assert isinstance(found, dict) and found["model_name"] == engine.ep.model
        modes = {s["metric"]["mode"] for s in query(prom_port, "sglang:realtime_tokens_total")}  # type: ignore[index]
        assert modes == {"prefill_compute", "prefill_cache", "decode"}
    finally:
        prom.terminate()
        prom.wait(30)
        metrics.close()
        engine.stop()
