"""The rank unit's readiness (modules/rank-ready.sh, run by tp4-rank-ready.service): tp4 serve's
boot-log check on the node's own container log. The script runs here with real sh against a
recording stand-in for the runtime's CLI (`<runtime> logs`, `<runtime> container inspect`) that
serves a log file; its arguments are the ones modules/lib computes from the example line's plan
(the head waits for `Ready: API on port <PORT>` and checks the plan's required boot lines; a worker
waits for `Load weight end.`), and the logs are real boots of the stand-in engine (the four ranks,
as tests/test_bootlog.py boots them)."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from pathlib import Path

import pytest

from nixos_helpers import EXAMPLE, LIB, REPO, hosts_expr, nix_eval, nix_path, plan_file
from test_bootlog import Boot, run_line
from tp4.plan import build_plan
from tp4.profile.load import load_file
from tp4.serve import DEFAULT_TIMEOUTS

READY = REPO / "modules" / "rank-ready.sh"
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
def readiness(work) -> dict[str, dict]:
    """Each host's rankUnit.readiness, as modules/lib computes it from the example line."""
    plan = plan_file(PROFILE, work / "plan.json")
    value, err = nix_eval(f"builtins.mapAttrs (_: h: h.rankUnit.readiness) ({hosts_expr(PROFILE, plan, HOSTS)})", work / "nix")
    assert isinstance(value, dict), err
    return value


@pytest.fixture(scope="module")
def boots(tmp_path_factory):
    """Boots of the example line on the stand-in engine, by scenario (shared by the tests)."""
    plan = build_plan(load_file(PROFILE))
    scenarios = {"clean": {}, "omit": {"TP4_STANDIN_FAULT": "omit-line"},
                 "forbidden": {"TP4_STANDIN_FAULT": "forbidden", "TP4_STANDIN_FAULT_RANK": "2"}}
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

    def run(self, *args: str, poll: str = "0.05") -> subprocess.CompletedProcess[str]:
        env = {"PATH": f"{self.bin}:/usr/bin:/bin", "TP4_READY_POLL": poll, "TP4_FAKE_LOG": str(self.log),
               "TP4_FAKE_STATE": str(self.state), "TP4_FAKE_CALLS": str(self.calls)}
        return subprocess.run(["sh", str(READY), *args], capture_output=True, text=True, env=env, timeout=60)


def with_port(args: list[str], port: int) -> list[str]:
    """The head's arguments with the port of a stand-in boot in the Ready pattern (the boot
    serves on a free port, the example line on its API port 8888)."""
    assert args[3] == "^Ready: API on port 8888([^0-9]|$)"
    return [*args[:3], f"^Ready: API on port {port}([^0-9]|$)", *args[4:]]


def test_the_arguments_are_the_plans(readiness):
    plan = build_plan(load_file(PROFILE))
    head, worker = readiness["spark1"], readiness["spark2"]
    assert head["unit"] == worker["unit"] == "tp4-rank-ready.service"
    assert head["args"][:4] == ["podman", "dsv41-head", "9000", "^Ready: API on port 8888([^0-9]|$)"]
    assert worker["args"][:4] == ["podman", "dsv41-worker", "4200", r"Load weight end\."]
    required = [b.text for b in plan.boot_lines if b.required]
    assert required and head["args"][6::3][:len(required)] == required
    assert head["args"][4::3][:len(required)] == ["require"] * len(required)
    forbid = [a for i, a in enumerate(head["args"]) if i and head["args"][i - 1] == "forbid"]
    assert forbid == list(plan.forbidden_lines) == [a for i, a in enumerate(worker["args"]) if i and worker["args"][i - 1] == "forbid"]
    assert "require" not in worker["args"]


def test_the_bounds_are_serves_boot_phase_timeouts(readiness):
    assert int(readiness["spark1"]["timeout"]) == sum(DEFAULT_TIMEOUTS[p] for p in ("start", "weights", "graphs", "smoke", "warmup", "ready"))
    assert int(readiness["spark2"]["timeout"]) == sum(DEFAULT_TIMEOUTS[p] for p in ("start", "weights"))
    assert readiness["spark1"]["args"][2] == str(readiness["spark1"]["timeout"])


def test_a_clean_boot_is_ready_on_every_rank(readiness, boots, tmp_path):
    boot = boots("clean")
    for rank, name in enumerate(("spark1", "spark2", "spark3", "spark4")):
        args = readiness[name]["args"]
        rt = Runtime(tmp_path / name, boot.logs[rank])
        proc = rt.run(*(with_port(args, boot.port) if rank == 0 else args))
        assert proc.returncode == 0, proc.stderr
        want = f"Ready: API on port {boot.port} (rank 0)" if rank == 0 else "Load weight end. type="
        assert proc.stdout.startswith(f"tp4-rank-ready: {args[1]}: ready: ") and want in proc.stdout
        assert f"logs {args[1]}" in rt.calls.read_text().splitlines()


def test_a_missing_required_line_fails_the_head(readiness, boots, tmp_path):
    boot = boots("omit")
    plan = build_plan(load_file(PROFILE))
    first = next(b for b in plan.boot_lines if b.required and b.adapter != "engine")
    proc = Runtime(tmp_path, boot.logs[0]).run(*with_port(readiness["spark1"]["args"], boot.port))
    assert proc.returncode == 1
    assert f"tp4-rank-ready: dsv41-head: ready, but the boot lines the plan arms are not in its log: `{first.text}`; fix: check that the image carries the adapters" in proc.stderr


def test_a_forbidden_line_fails_at_once_naming_the_line(readiness, boots, tmp_path):
    boot = boots("forbidden")
    proc = Runtime(tmp_path, boot.logs[2]).run(*readiness["spark3"]["args"])
    assert proc.returncode == 1
    n = next(i for i, line in enumerate(boot.logs[2].splitlines(), 1) if "MISMATCH" in line)
    assert f"tp4-rank-ready: dsv41-worker: line {n} of its log has `MISMATCH`: " in proc.stderr
    assert "[l2_prefetch] plan MISMATCH at layer 3; fix: read the whole log (tp4 logs)" in proc.stderr
    assert "last lines of the log of dsv41-worker:\n  | " in proc.stderr


def test_the_head_waits_for_ready_and_only_on_its_port(tmp_path):
    rt = Runtime(tmp_path, "Load weight end. type=X\nReady: API on port 88880 (rank 0), no API key.\n")
    args = ["podman", "dsv41-head", "30", "^Ready: API on port 8888([^0-9]|$)", "forbid", "Traceback"]

    def later() -> None:
        time.sleep(0.5)
        with open(rt.log, "a") as fh:
            fh.write("\x1b[32mINFO\x1b[0m Warm-up done in 3s\r\nReady: API on port 8888 (rank 0). Key is in /state/api-key.\r\n")

    t = threading.Thread(target=later)
    started = time.monotonic()
    t.start()
    proc = rt.run(*args)
    t.join()
    assert proc.returncode == 0, proc.stderr
    assert time.monotonic() - started >= 0.5
    assert proc.stdout == "tp4-rank-ready: dsv41-head: ready: Ready: API on port 8888 (rank 0). Key is in /state/api-key.\n"
    assert len([c for c in rt.calls.read_text().splitlines() if c.startswith("logs ")]) >= 2


def test_it_gives_up_after_its_bound(tmp_path):
    rt = Runtime(tmp_path, "Load weight begin. avail mem=112.40 GB\n")
    started = time.monotonic()
    proc = rt.run("podman", "dsv41-head", "1", "^Ready: API on port 8888([^0-9]|$)", poll="0.2")
    assert proc.returncode == 1
    assert time.monotonic() - started < 10
    assert "tp4-rank-ready: dsv41-head: not ready after 1s: no line matching '^Ready: API on port 8888([^0-9]|$)' in its log; fix: " in proc.stderr
    assert "  | Load weight begin. avail mem=112.40 GB" in proc.stderr


@pytest.mark.parametrize("state", ["exited", "gone"])
def test_a_container_that_stopped_before_ready_fails(tmp_path, state):
    rt = Runtime(tmp_path, "boot: OFFLOAD_MODE='x' is not nvme or ram\n", state=state)
    proc = rt.run("docker", "dsv41-worker", "600", r"Load weight end\.")
    assert proc.returncode == 1
    assert f"tp4-rank-ready: dsv41-worker: the container is {state} and its log never showed it ready" in proc.stderr
    assert "container inspect --format {{.State.Status}} dsv41-worker" in rt.calls.read_text()


@pytest.mark.parametrize("args", [["podman", "c", "1"], ["podman", "c", "1", "x", "require", "ere"], ["podman", "c", "1", "x", "other", "y"]])
def test_bad_arguments_are_usage_errors(tmp_path, args):
    proc = Runtime(tmp_path).run(*args)
    assert proc.returncode == 2 and proc.stderr.startswith("tp4-rank-ready: ")


def test_the_boot_line_patterns_are_posix_eres_of_the_registry_lines(work):
    """bootLineEre escapes what ERE gives a meaning and lets `...` stand for any text."""
    texts = ["DSV41 shared-expert padding K: ... (5120, 576) -> (5120, 640)", "[moe_b12x_next] armed: routed MoE on b12x_next a7d7d29b ...",
             "a.b ^ $ | * + ? {2} \\ end ..."]
    eres, err = nix_eval(f"map (import {nix_path(LIB / 'rank.nix')}).bootLineEre {json_list(texts)}", work / "nix")
    assert isinstance(eres, list), err
    for text, ere in zip(texts, eres, strict=True):
        filled = text.replace("...", "anything at all")
        assert subprocess.run(["grep", "-E", "-q", "--", ere], input=f"[TP0] {filled}\n", text=True).returncode == 0, (text, ere)
        # a changed character outside the "..." does not match
        broken = filled.replace(filled[1], "#", 1)
        assert subprocess.run(["grep", "-E", "-q", "--", ere], input=broken + "\n", text=True).returncode == 1, (text, ere)
    assert os.access(READY, os.R_OK)


def json_list(items: list[str]) -> str:
    return "[ " + " ".join(json.dumps(i) for i in items) + " ]"
