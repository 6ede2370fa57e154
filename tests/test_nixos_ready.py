"""The rank unit's readiness (`tp4 bootlog wait`, run by tp4-rank-ready.service): tp4 serve's
boot-log check on the node's own container log, reading the committed plan. The CLI runs here
against a recording stand-in for the runtime's CLI (`<runtime> logs`, `<runtime> container
inspect`) that serves a log file; the plan is the example line's (the head waits for `Ready: API
on port <PORT>` and checks the plan's required boot lines; a worker waits for `Load weight end.`),
and the logs are real boots of the stand-in engine (the four ranks, as tests/test_bootlog.py boots
them)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from nixos_helpers import EXAMPLE, REPO, hosts_expr, nix_eval, plan_file
from test_bootlog import Boot, run_line
from tp4.line.plan import build_plan
from tp4.line.profile.load import load_file
from tp4.serving.serve import DEFAULT_TIMEOUTS

PROFILE = EXAMPLE / "profile.toml"
HOSTS = EXAMPLE / "hosts.toml"

# `<runtime> logs CTN` prints $TP4_FAKE_LOG; `<runtime> container inspect --format F CTN` prints
# $TP4_FAKE_STATE's content, or fails as for a container that does not exist ("gone"); every call
# is recorded
FAKE_RUNTIME = r"""#!/bin/sh
echo "$*" >> "$TP4_FAKE_CALLS"
case "$1 $2" in
  "logs "*) cat "$TP4_FAKE_LOG" ;;
  "container inspect")
    s=$(cat "$TP4_FAKE_STATE")
    [ "$s" != gone ] || { echo "Error: no such container $5" >&2; exit 125; }
    echo "$s" ;;
  *) echo "fake runtime: unexpected $*" >&2; exit 2 ;;
esac
"""


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("nixos-ready")


@pytest.fixture(scope="module")
def plan(work) -> Path:
    return plan_file(PROFILE, work / "plan.json")


@pytest.fixture(scope="module")
def readiness(work, plan) -> dict[str, dict]:
    """Each host's rankUnit.readiness, as modules/lib computes it from the example line's plan."""
    value, err = nix_eval(f"builtins.mapAttrs (_: h: h.rankUnit.readiness) ({hosts_expr(plan, HOSTS)})", work / "nix")
    assert isinstance(value, dict), err
    return value


def with_port(plan: Path, port: int, dest: Path, **ready: object) -> Path:
    """The plan with the head's Ready pattern on the port of a stand-in boot (the boot serves on a
    free port, the example line on its API port 8888), and other service.ready values of the head."""
    doc = json.loads(plan.read_text())
    r = doc["nodes"][0]["service"]["ready"]
    assert r["pattern"] == "^Ready: API on port 8888(?![0-9])"
    r["pattern"] = f"^Ready: API on port {port}(?![0-9])"
    r.update(ready)
    dest.write_text(json.dumps(doc))
    return dest


@pytest.fixture(scope="module")
def boots(tmp_path_factory):
    """Boots of the example line on the stand-in engine, by scenario (shared by the tests)."""
    plan = build_plan(load_file(PROFILE))
    scenarios = {
        "clean": {},
        "omit": {"TP4_STANDIN_FAULT": "omit-line"},
        "forbidden": {"TP4_STANDIN_FAULT": "forbidden", "TP4_STANDIN_FAULT_RANK": "2"},
    }
    done: dict[str, Boot] = {}

    def get(name: str) -> Boot:
        if name not in done:
            done[name] = run_line(plan, tmp_path_factory.mktemp(f"boot-{name}"), scenarios[name])
        return done[name]

    return get


class Runtime:
    """The fake runtime CLI in a directory of its own, with the log and state it serves."""

    def __init__(self, root: Path, log: str = "", state: str = "running") -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.root, self.bin = root, root / "bin"
        self.bin.mkdir(exist_ok=True)
        for name in ("podman", "docker"):
            (self.bin / name).write_text(FAKE_RUNTIME)
            (self.bin / name).chmod(0o755)
        self.log, self.state, self.calls = root / "log", root / "state", root / "calls"
        self.log.write_text(log)
        self.state.write_text(state)
        self.calls.write_text("")

    def run(self, plan: Path, rank: int, poll: str = "0.05") -> subprocess.CompletedProcess[str]:
        env = {
            "PATH": f"{self.bin}:/usr/bin:/bin",
            "PYTHONPATH": str(REPO / "python"),
            "HOME": str(self.root),
            "TP4_FAKE_LOG": str(self.log),
            "TP4_FAKE_STATE": str(self.state),
            "TP4_FAKE_CALLS": str(self.calls),
        }
        return subprocess.run(
            [sys.executable, "-m", "tp4", "bootlog", "wait", "--plan", str(plan), "--rank", str(rank), "--poll", poll],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )


def test_the_unit_runs_tp4s_check_on_its_rank_with_the_plans_bound(readiness, plan):
    doc = json.loads(plan.read_text())
    for rank, name in enumerate(("spark1", "spark2", "spark3", "spark4")):
        r = readiness[name]
        assert r["unit"] == "tp4-rank-ready.service"
        assert r["args"] == ["bootlog", "wait", "--rank", str(rank)]
        assert r["timeout"] == doc["nodes"][rank]["service"]["ready"]["timeout"]
    assert readiness["spark1"]["timeout"] == sum(
        DEFAULT_TIMEOUTS[p] for p in ("start", "weights", "graphs", "smoke", "warmup", "ready")
    )
    assert readiness["spark2"]["timeout"] == sum(DEFAULT_TIMEOUTS[p] for p in ("start", "weights"))


def test_a_clean_boot_is_ready_on_every_rank(plan, boots, tmp_path):
    boot = boots("clean")
    ported = with_port(plan, boot.port, tmp_path / "plan.json")
    for rank, container in enumerate(("dsv41-head", "dsv41-worker", "dsv41-worker", "dsv41-worker")):
        rt = Runtime(tmp_path / str(rank), boot.logs[rank])
        proc = rt.run(ported, rank)
        assert proc.returncode == 0, proc.stderr
        want = f"Ready: API on port {boot.port} (rank 0)" if rank == 0 else "Load weight end. type="
        assert proc.stdout.startswith(f"{container}: ready: ") and want in proc.stdout
        assert f"logs {container}" in rt.calls.read_text().splitlines()


def test_a_missing_required_line_fails_the_head(plan, boots, tmp_path):
    boot = boots("omit")
    planned = build_plan(load_file(PROFILE))
    first = next(b for b in planned.boot_lines if b.required and b.adapter != "engine")
    proc = Runtime(tmp_path, boot.logs[0]).run(with_port(plan, boot.port, tmp_path / "plan.json"), 0)
    assert proc.returncode == 1
    assert (
        f"error: dsv41-head: ready, but the boot lines the plan arms are not in its log: `{first.text}`; fix: check that the image carries the adapters"
        in proc.stderr
    )


def test_a_forbidden_line_fails_at_once_naming_the_line(plan, boots, tmp_path):
    boot = boots("forbidden")
    proc = Runtime(tmp_path, boot.logs[2]).run(plan, 2)
    assert proc.returncode == 1
    n = next(i for i, line in enumerate(boot.logs[2].splitlines(), 1) if "MISMATCH" in line)
    assert f"error: dsv41-worker: line {n} has `MISMATCH`: " in proc.stderr
    assert "[l2_prefetch] plan MISMATCH at layer 3; fix: read the whole log (tp4 logs)" in proc.stderr
    assert "last lines of the log of dsv41-worker:\n  | " in proc.stderr


def test_the_head_waits_for_ready_and_only_on_its_port(plan, tmp_path):
    rt = Runtime(tmp_path, "Load weight end. type=X\nReady: API on port 88880 (rank 0), no API key.\n")
    doc = json.loads(plan.read_text())
    doc["boot_lines"] = []
    bare = tmp_path / "plan.json"
    bare.write_text(json.dumps(doc))

    def later() -> None:
        time.sleep(0.5)
        with open(rt.log, "a") as fh:
            fh.write(
                "\x1b[32mINFO\x1b[0m Warm-up done in 3s\r\nReady: API on port 8888 (rank 0). Key is in /state/api-key.\r\n"
            )

    t = threading.Thread(target=later)
    started = time.monotonic()
    t.start()
    proc = rt.run(bare, 0)
    t.join()
    assert proc.returncode == 0, proc.stderr
    assert time.monotonic() - started >= 0.5
    assert proc.stdout == "dsv41-head: ready: Ready: API on port 8888 (rank 0). Key is in /state/api-key.\n"
    assert len([c for c in rt.calls.read_text().splitlines() if c.startswith("logs ")]) >= 2


def test_it_gives_up_after_its_bound(plan, tmp_path):
    rt = Runtime(tmp_path, "Load weight begin. avail mem=112.40 GB\n")
    short = with_port(plan, 8888, tmp_path / "plan.json", timeout=1)
    started = time.monotonic()
    proc = rt.run(short, 0, poll="0.2")
    assert proc.returncode == 1
    assert time.monotonic() - started < 10
    assert (
        "error: dsv41-head: not ready after 1s: no line matching '^Ready: API on port 8888(?![0-9])' in its log; fix: "
        in proc.stderr
    )
    assert "  | Load weight begin. avail mem=112.40 GB" in proc.stderr


@pytest.mark.parametrize("state", ["exited", "gone"])
def test_a_container_that_stopped_before_ready_fails(plan, tmp_path, state):
    rt = Runtime(tmp_path, "boot: OFFLOAD_MODE='x' is not nvme or ram\n", state=state)
    proc = rt.run(plan, 1)
    assert proc.returncode == 1
    assert f"error: dsv41-worker: the container is {state} and its log never showed it ready" in proc.stderr
    assert "container inspect --format {{.State.Status}} dsv41-worker" in rt.calls.read_text()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--rank", "4"], "--rank 4: the plan has ranks 0..3"),
        (["--rank", "0", "--poll", "0"], "Invalid value for '--poll': 0 is out of range: expected a number above 0"),
    ],
)
def test_bad_arguments_are_usage_errors(plan, tmp_path, args, message):
    rt = Runtime(tmp_path)
    env = {"PATH": f"{rt.bin}:/usr/bin:/bin", "PYTHONPATH": str(REPO / "python"), "HOME": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, "-m", "tp4", "bootlog", "wait", "--plan", str(plan), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr


def test_a_plan_file_of_an_older_schema_is_bad_input(plan, tmp_path):
    doc = json.loads(plan.read_text())
    del doc["nodes"][1]["service"]["ready"]
    old = tmp_path / "old.json"
    old.write_text(json.dumps(doc))
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO / "python"), "HOME": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, "-m", "tp4", "bootlog", "wait", "--plan", str(old), "--rank", "1"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "nodes[1].service: no ready (a plan of an older schema); fix: write it again with this tp4" in proc.stderr
