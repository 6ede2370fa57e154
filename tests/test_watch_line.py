"""`tp4 watch` on the netns cluster (real sshd, real podman, the stand-in engine; tests/doctor_hosts.py):
a line served by `tp4 serve` is wedged through the stand-in's control (/health stays 200, completions
hang) and then loses a rank; the watchdog confirms each, saves the evidence, restarts the line and
finds it ready again, its events in the JSON-lines file and its counters on the metrics endpoint.
With the engine's --enable-metrics, a wedge that keeps foreign requests running (a scheduler stuck
in a collective) is told from busy by SGLang's token counters and healed, and a busy line whose
foreign requests progress is never restarted. Nor is a line `tp4 stop` stopped: that one is
watched again once `tp4 serve` brings it up."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from doctor_hosts import SYSFS, DoctorCluster

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DoctorCluster]:
    with DoctorCluster(tmp_path_factory.mktemp("watch")) as c:
        c.reset()
        yield c


def env(state: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO / "python"), "XDG_STATE_HOME": str(state)}


def tp4(state: Path, *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tp4", *args], capture_output=True, text=True, timeout=timeout, env=env(state)
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def events(path: Path) -> list[dict[str, object]]:
    try:
        return [json.loads(line) for line in path.read_text().splitlines()]
    except FileNotFoundError:
        return []


def wait_event(path: Path, kind: str, count: int, seconds: float, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if sum(1 for e in events(path) if e["event"] == kind) >= count:
            return
        assert proc.poll() is None, f"watch exited {proc.returncode}: {events(path)}"
        time.sleep(0.5)
    raise AssertionError(f"no {count}x {kind} within {seconds} s: {[(e['event'], e['state']) for e in events(path)]}")


def metrics(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        return resp.read().decode()


def set_wedged(api: str, value: bool) -> None:
    req = urllib.request.Request(f"{api}/standin/wedge", data=json.dumps({"wedged": value}).encode())
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert json.loads(resp.read())["wedged"] is value


METRICS = '\n[engine]\nextra_args = ["--enable-metrics"]\n'


def foreign(api: str, n: int) -> list[threading.Thread]:
    """``n`` completions of another client, left to hang on a wedged engine (each connection ends
    when the line is restarted)."""

    def one() -> None:
        body = {"model": "x", "messages": [{"role": "user", "content": "a long story"}], "max_tokens": 512}
        req = urllib.request.Request(
            f"{api}/v1/chat/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        )
        try:
            urllib.request.urlopen(req, timeout=300).read()
        except (OSError, http.client.HTTPException):
            pass  # the restart ends it

    threads = [threading.Thread(target=one, daemon=True) for _ in range(n)]
    for t in threads:
        t.start()
    return threads


def watch(state: Path, profile: str, log: Path, port: int, *more: str) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "tp4", "watch", "--profile", profile, "--interval", "1", "--probe-timeout", "2"]
    argv += ["--confirm", "2", "--backoff", "1", "--events", str(log), "--metrics", f"127.0.0.1:{port}"]
    argv += ["--sysfs", SYSFS, *more]
    # its output into a file: a restart's serve prints every rank's boot log, more than a pipe holds
    # unread (the watch would block writing it)
    with open(stderr_of(log), "w") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, text=True, env=env(state))


def stderr_of(log: Path) -> Path:
    return log.with_name(log.name + ".stderr")


def stop_watch(proc: subprocess.Popen[str], log: Path) -> str:
    """Ctrl-C to the watch; what it printed."""
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=60)
    return stderr_of(log).read_text()


def test_a_wedge_and_a_lost_rank_are_healed_with_their_evidence(cluster: DoctorCluster, tmp_path: Path) -> None:
    state, profile, log, port = tmp_path / "state", str(cluster.profile), tmp_path / "events.jsonl", free_port()
    served = tp4(state, "serve", "--profile", profile, "--sysfs", SYSFS)
    assert served.returncode == 0, served.stderr
    proc = watch(state, profile, log, port)
    try:
        wait_event(log, "armed", 1, 60, proc)
        assert 'state="ready"} 0' in metrics(port)
        # this line runs without --enable-metrics: the watch says what it cannot tell, and the fix
        warned = [e for e in events(log) if e["event"] == "warning"]
        assert len(warned) == 1 and 'engine.extra_args = ["--enable-metrics"]' in str(warned[0]["detail"]), warned

        set_wedged(cluster.api(), True)  # /health stays 200, completions hang
        wait_event(log, "ready", 1, 240, proc)
        kinds = [(e["event"], e["state"]) for e in events(log)]
        assert ("restart", "wedged") in kinds and kinds.index(("state", "wedged")) < kinds.index(("restart", "wedged"))
        restart = next(e for e in events(log) if e["event"] == "restart")
        bundle = Path(str(restart["evidence"]))
        assert bundle.is_relative_to(state / "tp4" / "runs")
        names = {p.name for p in bundle.iterdir()}
        assert {"probes.jsonl", "status.json", "boot.json", "roce-counters.json"} <= names, names
        assert sum(1 for n in names if n.startswith("log-rank")) == 4
        status = json.loads((bundle / "status.json").read_text())
        assert status["state"] == "wedged", status["state_detail"]
        probes = [json.loads(line) for line in (bundle / "probes.jsonl").read_text().splitlines()]
        assert [p["state"] for p in probes][-2:] == ["wedged", "wedged"]
        assert set(json.loads((bundle / "roce-counters.json").read_text())) == {n.name for n in cluster.plan.nodes}
        text = metrics(port)
        assert 'tp4_line_restarts_total{line="' in text and "tp4_wedges_total" in text
        assert any(line.startswith("tp4_wedges_total") and line.endswith(" 1") for line in text.splitlines()), text
        assert 'state="ready"} 0' in text

        # a rank that goes away: down, healed the same way
        cluster.hosts[2].run("podman", "rm", "-f", "-t", "0", cluster.plan.nodes[2].run.container)
        wait_event(log, "ready", 2, 240, proc)
        down = [e for e in events(log) if e["event"] == "restart"][1]
        assert down["state"] == "down" and f"{cluster.plan.nodes[2].name}: rank absent" in str(down["detail"])
        assert any(
            line.startswith("tp4_line_restarts_total") and line.endswith(" 2") for line in metrics(port).splitlines()
        )
        assert tp4(state, "status", "--profile", profile, "--json").returncode == 0
    finally:
        err = stop_watch(proc, log)
        tp4(state, "stop", "--profile", profile)
    assert "Traceback" not in err, err
    assert "watch: restart: wedged" in err


def test_a_wedge_that_holds_foreign_requests_is_healed(cluster: DoctorCluster, tmp_path: Path) -> None:
    state, log, port = tmp_path / "state", tmp_path / "events.jsonl", free_port()
    profile = tmp_path / "metrics.toml"
    profile.write_text(cluster.profile.read_text() + METRICS)
    served = tp4(state, "serve", "--profile", str(profile), "--sysfs", SYSFS)
    assert served.returncode == 0, served.stderr
    proc = watch(state, str(profile), log, port)
    try:
        wait_event(log, "armed", 1, 60, proc)
        assert not [e for e in events(log) if e["event"] == "warning"]  # the line serves /metrics
        set_wedged(cluster.api(), True)
        held = foreign(cluster.api(), 3)  # they hang, and stay counted as running
        wait_event(log, "ready", 1, 240, proc)
        wedged = next(e for e in events(log) if e["event"] == "state" and e["state"] == "wedged")
        detail = str(wedged["detail"])
        assert detail.startswith("requests in flight, but none progresses: "), detail
        assert "no token counted in " in detail
        running = int(detail.split(" running and ")[0].rsplit(" ", 1)[1])
        assert running >= 3, detail  # the foreign requests held: the old rule called this busy
        kinds = [(e["event"], e["state"]) for e in events(log)]
        assert ("restart", "wedged") in kinds and ("state", "busy") not in kinds, kinds
        status = json.loads(tp4(state, "status", "--profile", str(profile), "--json").stdout)
        assert status["state"] == "ready" and "progress" in status["liveness"]
        for t in held:
            t.join(30)
    finally:
        err = stop_watch(proc, log)
        tp4(state, "stop", "--profile", str(profile))
    assert "Traceback" not in err, err


def test_a_busy_line_is_not_restarted(cluster: DoctorCluster, tmp_path: Path) -> None:
    state, log, port = tmp_path / "state", tmp_path / "events.jsonl", free_port()
    busy = tmp_path / "busy.toml"
    busy.write_text(
        cluster.profile.read_text()
        + METRICS
        + '\n[env]\nTP4_STANDIN_FAULT = "busy"\nTP4_STANDIN_FAULT_RANK = "0"\nTP4_STANDIN_BUSY_SECONDS = "4"\n'
    )
    served = tp4(state, "serve", "--profile", str(busy), "--sysfs", SYSFS)
    assert served.returncode == 0, served.stderr
    proc = watch(state, str(busy), log, port)
    try:
        wait_event(log, "armed", 1, 60, proc)
        time.sleep(12)  # several looks, each probe past its deadline while requests run
        kinds = [(e["event"], e["state"]) for e in events(log)]
        assert ("state", "busy") in kinds, kinds
        assert not any(k in ("restart", "gave-up") for k, _ in kinds), kinds
        busy_event = next(e for e in events(log) if e["state"] == "busy")
        # the foreign requests progress: SGLang's token counters grew while the probe waited
        assert str(busy_event["detail"]).startswith("requests in flight and progressing: "), busy_event
        assert any(
            line.startswith("tp4_line_restarts_total") and line.endswith(" 0") for line in metrics(port).splitlines()
        )
    finally:
        stop_watch(proc, log)
        tp4(state, "stop", "--profile", str(busy))


def test_a_line_stopped_by_tp4_stop_stays_stopped_and_is_healed_again_once_served(
    cluster: DoctorCluster, tmp_path: Path
) -> None:
    state, profile, log, port = tmp_path / "state", str(cluster.profile), tmp_path / "events.jsonl", free_port()
    served = tp4(state, "serve", "--profile", profile, "--sysfs", SYSFS)
    assert served.returncode == 0, served.stderr
    proc = watch(state, profile, log, port, "--backoff", "10")
    try:
        wait_event(log, "armed", 1, 60, proc)
        stopped = tp4(state, "stop", "--profile", profile)
        assert stopped.returncode == 0, stopped.stderr
        wait_event(log, "stopped", 1, 30, proc)
        time.sleep(6)  # six looks at --interval 1, --confirm 2: a down line would have been restarted
        kinds = [(e["event"], e["state"]) for e in events(log)]
        assert not any(k in ("restart", "restart-failed", "gave-up") for k, _ in kinds), kinds
        event = next(e for e in events(log) if e["event"] == "stopped")
        assert str(event["detail"]).startswith("stopped by tp4 stop at ") and "not healed" in str(event["detail"])
        assert 'state="down"} 3' in metrics(port)
        status = tp4(state, "status", "--profile", profile, "--json")
        doc = json.loads(status.stdout)
        assert doc["state"] == "down" and "on purpose" in doc["state_detail"], doc["state_detail"]
        assert isinstance(doc["stopped"], dict) and doc["stopped"]["by"] == "tp4 stop"

        served = tp4(state, "serve", "--profile", profile, "--sysfs", SYSFS)
        assert served.returncode == 0, served.stderr
        wait_event(log, "armed", 2, 60, proc)
        assert json.loads(tp4(state, "status", "--profile", profile, "--json").stdout)["stopped"] is None

        # a rank lost after the serve: healed, and the watch's own stop in its restart is no stop
        # on purpose (the line is served again, no record left)
        cluster.hosts[1].run("podman", "rm", "-f", "-t", "0", cluster.plan.nodes[1].run.container)
        wait_event(log, "ready", 1, 240, proc)
        restart = next(e for e in events(log) if e["event"] == "restart")
        assert restart["state"] == "down" and f"{cluster.plan.nodes[1].name}: rank absent" in str(restart["detail"])
        after = json.loads(tp4(state, "status", "--profile", profile, "--json").stdout)
        assert after["state"] == "ready" and after["stopped"] is None, after["state_detail"]
        assert [e["event"] for e in events(log)].count("stopped") == 1

        # a `tp4 stop` while a restart waits its back-off (the second in the window: --backoff 10)
        # wins: the restart does not serve the line again
        cluster.hosts[1].run("podman", "rm", "-f", "-t", "0", cluster.plan.nodes[1].run.container)
        wait_event(log, "restart", 2, 60, proc)
        assert [e for e in events(log) if e["event"] == "restart"][1]["backoff"] == 10
        stopped = tp4(state, "stop", "--profile", profile)
        assert stopped.returncode == 0, stopped.stderr
        wait_event(log, "stopped", 2, 60, proc)
        kinds = [e["event"] for e in events(log)]
        assert kinds.count("ready") == 1 and kinds[-2:] == ["restart-failed", "stopped"], kinds
        assert "during the restart: not served again" in str(events(log)[-2]["detail"])
        assert json.loads(tp4(state, "status", "--profile", profile, "--json").stdout)["state"] == "down"
    finally:
        err = stop_watch(proc, log)
        tp4(state, "stop", "--profile", profile)
    assert "Traceback" not in err, err
    assert "watch: stopped: down: stopped by tp4 stop at " in err
