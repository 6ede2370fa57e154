"""tp4.serving.bootlog against the logs of real boots of the stand-in engine (tests/standin/engine.py): the
four ranks of the default profile's plan, each with its plan env verbatim except where the line
listens (the dist init address, the API host and port: free loopback ports, so no namespace and no
root are needed), started as the container starts them (`boot.py run`), their output captured as
`<runtime> logs` gives it. Fault modes of the stand-in make the bad boots."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from tp4.serving.bootlog import (
    PHASES,
    BootSignature,
    Finding,
    LogProblem,
    boot_signature,
    check_boot_logs,
    judge,
    log_lines,
    phase_of,
    pin_of,
    ready_port,
    review_boot_logs,
    source_stamps,
    Verdict,
)
from tp4.line.container import IMAGE, MOUNTS
from tp4.line.plan import Plan, build_plan
from tp4.line.profile.load import load_default

pytestmark = pytest.mark.unit

ENGINE = Path(__file__).resolve().parent / "standin" / "engine.py"
MANIFEST = Path(__file__).resolve().parent.parent / "python" / "tp4" / "data" / "sources.manifest"
TPS = re.compile(r"input throughput \(token/s\): ([0-9.]+)")


@pytest.fixture(scope="module")
def plan() -> Plan:
    return build_plan(load_default())


def b12x_next_stamps() -> tuple[str, str]:
    """(SOURCE_COMMIT, SOURCE_PATCH) of the b12x_next tree as sources.manifest pins them (what
    tests/standin/image.py puts in the test image; that module pulls in the nix test helpers)."""
    text = MANIFEST.read_text()
    commit = re.search(r"^b12x-main\s+([0-9a-f]{40})\s", text, re.M)
    patch = re.search(r"^tree b12x-next\s.*?expect-patch=([0-9a-f]{16})", text, re.M | re.S)
    assert commit and patch, "sources.manifest: no b12x-main row or b12x-next tree"
    return commit[1], patch[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Boot:
    def __init__(self, logs: dict[int, str], port: int) -> None:
        self.logs, self.port = logs, port

    @property
    def head(self) -> str:
        return self.logs[0]


def run_line(plan: Plan, root: Path, controls: dict[str, str], timeout: float = 60) -> Boot:
    """Boot the plan's four ranks; return their logs once rank 0 is Ready and every worker waits
    in the dist group (then the line is killed)."""
    model = root / MOUNTS.model.lstrip("/")
    model.mkdir(parents=True)
    (model / "config.json").write_text("{}\n")
    commit, patch = b12x_next_stamps()
    stamps = root / IMAGE.b12x_next.lstrip("/") / "b12x_next"
    stamps.mkdir(parents=True)
    (stamps / "SOURCE_COMMIT").write_text(commit + "\n")
    (stamps / "SOURCE_PATCH").write_text(patch + "\n")
    dist, port = free_port(), free_port()
    procs: list[tuple[subprocess.Popen[bytes], Path]] = []
    try:
        for node in plan.nodes:
            rroot = root / f"rank{node.rank}"
            rroot.mkdir()
            for part in ("models", "opt"):
                (rroot / part).symlink_to(root / part)
            env = {
                **node.env,
                "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                "TP4_STANDIN_ROOT": str(rroot),
                "TP4_STANDIN_PACE": "0.02",
                "TP4_STANDIN_COLOCATED": "1",
                "DIST_INIT_ADDR": f"127.0.0.1:{dist}",
                "HOST": "127.0.0.1",
                "SERVER_PORT": str(port),
                **controls,
            }
            log = root / f"rank{node.rank}.log"
            with open(log, "wb") as out:
                proc = subprocess.Popen(
                    [sys.executable, "-u", str(ENGINE), *node.run.command],
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            procs.append((proc, log))
        deadline = time.monotonic() + timeout
        for rank, (proc, log) in enumerate(procs):
            needle = "Ready: API on port" if rank == 0 else "Scheduler ready"
            while needle not in log.read_text(errors="replace"):
                assert proc.poll() is None and time.monotonic() < deadline, log.read_text(errors="replace")[-3000:]
                time.sleep(0.02)
        return Boot({rank: log.read_text(errors="replace") for rank, (_, log) in enumerate(procs)}, port)
    finally:
        for proc, _ in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.fixture(scope="module")
def boots(plan: Plan, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[str], Boot]]:
    """One boot per scenario, shared by the tests of the module."""
    scenarios = {
        "clean": {},
        "omit": {"TP4_STANDIN_FAULT": "omit-line"},
        "omit-optional": {"TP4_STANDIN_FAULT": "omit-line", "TP4_STANDIN_OMIT": "Exact nvme Engram"},
        "forbidden": {"TP4_STANDIN_FAULT": "forbidden", "TP4_STANDIN_FAULT_RANK": "2"},
        "commit": {"TP4_STANDIN_FAULT": "commit"},
        "slow": {"TP4_STANDIN_FAULT": "slow,retune"},
        "pool-near": {"TP4_STANDIN_KV_POOL": "8400000"},
        "pool-below": {"TP4_STANDIN_KV_POOL": "7500000"},
    }
    done: dict[str, Boot] = {}

    def get(name: str) -> Boot:
        if name not in done:
            done[name] = run_line(plan, tmp_path_factory.mktemp(f"boot-{name}"), scenarios[name])
        return done[name]

    yield get


def only(problems: list[LogProblem]) -> LogProblem:
    assert len(problems) == 1, problems
    return problems[0]


# --- the check -------------------------------------------------------------------------------------


def test_a_clean_boot_passes(plan: Plan, boots: Callable[[str], Boot]) -> None:
    review = review_boot_logs(plan, boots("clean").logs)
    assert review.problems == () and review.notes == ()
    assert check_boot_logs(plan, boots("clean").logs) == []
    # the stamps were there to compare: both files and the adapter's commit, on every rank
    commit, patch = b12x_next_stamps()
    for log in boots("clean").logs.values():
        found = {k: s.value for k, s in source_stamps(log_lines(log)).items()}
        assert found == {
            "SOURCE_COMMIT b12x_next": commit,
            "SOURCE_PATCH b12x_next": patch,
            "[moe_b12x_next] armed commit of b12x_next": commit[:8],
        }


def test_a_missing_required_line_is_a_problem_of_rank_0(plan: Plan, boots: Callable[[str], Boot]) -> None:
    first = next(bl for bl in plan.boot_lines if bl.required and bl.adapter != "engine")
    p = only(check_boot_logs(plan, boots("omit").logs))
    assert (p.rank, p.node, p.check) == (0, "spark1", "missing-line")
    assert f"`{first.text}` ({first.adapter})" in p.detail and "fix:" in p.detail
    assert p.text().startswith("spark1 (rank 0): missing-line: ")


def test_a_missing_optional_line_is_a_note(plan: Plan, boots: Callable[[str], Boot]) -> None:
    review = review_boot_logs(plan, boots("omit-optional").logs)
    assert review.problems == ()
    note = only(list(review.notes))
    assert (note.rank, note.check) == (
        0,
        "missing-optional-line",
    ) and "Exact nvme Engram ... packed=True" in note.detail


def test_a_forbidden_line_names_the_rank_node_and_line(plan: Plan, boots: Callable[[str], Boot]) -> None:
    p = only(check_boot_logs(plan, boots("forbidden").logs))
    assert (p.rank, p.node, p.check) == (2, "spark3", "forbidden-line")
    assert "`MISMATCH`" in p.detail and "[l2_prefetch] plan MISMATCH at layer 3" in p.detail
    n = int(re.search(r"line (\d+)", p.detail)[1])  # type: ignore[index]
    assert "MISMATCH" in boots("forbidden").logs[2].splitlines()[n - 1]


def test_a_rank_with_another_commit_is_named_with_both_values(plan: Plan, boots: Callable[[str], Boot]) -> None:
    commit, _ = b12x_next_stamps()
    other = "f" * 8 + commit[8:]
    problems = check_boot_logs(plan, boots("commit").logs)
    assert {(p.rank, p.node, p.check) for p in problems} == {(3, "spark4", "source-differs")}
    by = {p.detail.split("`")[1]: p.detail for p in problems}
    assert set(by) == {"SOURCE_COMMIT b12x_next", "[moe_b12x_next] armed commit of b12x_next"}
    assert f"is {other} here, {commit} on ranks 0, 1, 2" in by["SOURCE_COMMIT b12x_next"]
    assert f"is {other[:8]} here, {commit[:8]} on ranks 0, 1, 2" in by["[moe_b12x_next] armed commit of b12x_next"]


def test_the_odd_rank_is_named_even_when_it_is_rank_0(plan: Plan, boots: Callable[[str], Boot]) -> None:
    _, patch = b12x_next_stamps()
    logs = dict(boots("clean").logs)
    logs[0] = logs[0].replace(f"SOURCE_PATCH b12x_next {patch}", "SOURCE_PATCH b12x_next 0123456789abcdef")
    p = only(check_boot_logs(plan, logs))
    assert (p.rank, p.check) == (0, "source-differs")
    assert f"is 0123456789abcdef here, {patch} on ranks 1, 2, 3" in p.detail


def test_a_rank_without_stamps_or_log(plan: Plan, boots: Callable[[str], Boot]) -> None:
    logs = dict(boots("clean").logs)
    logs[1] = "\n".join(line for line in logs[1].splitlines() if "SOURCE_PATCH" not in line)
    del logs[2]
    problems = check_boot_logs(plan, logs)
    assert [(p.rank, p.node, p.check) for p in problems] == [(2, "spark3", "no-log"), (1, "spark2", "source-missing")]
    assert "prints no `SOURCE_PATCH b12x_next`; ranks 0, 3 print" in problems[1].detail
    with pytest.raises(ValueError, match=r"logs of ranks \[7\]"):
        check_boot_logs(plan, {**logs, 7: ""})


def test_the_armed_commit_must_be_the_images(plan: Plan, boots: Callable[[str], Boot]) -> None:
    commit, _ = b12x_next_stamps()
    logs = {
        r: log.replace(f"on b12x_next {commit[:8]}", "on b12x_next 00000000") for r, log in boots("clean").logs.items()
    }
    problems = check_boot_logs(plan, logs)
    # rank 0 also lacks the registry's line (it names the pinned commit); every rank is inconsistent in itself
    assert [(p.rank, p.check) for p in problems if p.check != "missing-line"] == [
        (r, "source-differs") for r in range(4)
    ]
    assert f"runs b12x_next 00000000, the image's SOURCE_COMMIT is {commit}" in problems[-1].detail


def with_runtime_prefix(log: str, start: datetime, step: float = 0.01) -> str:
    """The log as `docker logs --timestamps` shows it, with CRLF line ends and colour codes."""
    out = []
    for i, line in enumerate(log.splitlines()):
        ts = (start + timedelta(seconds=i * step)).strftime("%Y-%m-%dT%H:%M:%S.%f") + "123Z"
        out.append(f"{ts} \x1b[32m{line}\x1b[0m\r\n")
    return "".join(out)


def test_runtime_prefixes_change_nothing(plan: Plan, boots: Callable[[str], Boot]) -> None:
    start = datetime(2026, 9, 16, 8, 0, 0, tzinfo=timezone.utc)
    logs = {r: with_runtime_prefix(log, start) for r, log in boots("clean").logs.items()}
    assert check_boot_logs(plan, logs) == []
    bad = {r: with_runtime_prefix(log, start) for r, log in boots("forbidden").logs.items()}
    assert [(p.rank, p.check) for p in check_boot_logs(plan, bad)] == [(2, "forbidden-line")]
    head = logs[0]
    plain = boot_signature(boots("clean").head, pin=pin_of(plan), ready_seconds=None)
    stamped = boot_signature(head, pin=pin_of(plan), ready_seconds=None)
    ready_index = next(i for i, line in enumerate(boots("clean").head.splitlines()) if line.startswith("Ready:"))
    assert stamped.ready_seconds == pytest.approx(ready_index * 0.01, abs=1e-6)
    assert stamped._replace(ready_seconds=None) == plain
    # from the boot's start when the caller knows it (podman's offset form too)
    podman = head.replace("123Z ", "+00:00 ")
    assert boot_signature(
        podman, pin=None, ready_seconds=None, started=start - timedelta(seconds=5)
    ).ready_seconds == pytest.approx(5 + ready_index * 0.01, abs=1e-6)
    assert plain.ready_seconds is None  # the engine's own timestamps are not the boot's start
    assert boot_signature(head, pin=None, ready_seconds=42.5).ready_seconds == 42.5


# --- phases ----------------------------------------------------------------------------------------


def test_phases_of_a_boot_in_order(boots: Callable[[str], Boot]) -> None:
    seen = [p for p in map(phase_of, boots("clean").head.splitlines()) if p is not None]
    assert seen == list(PHASES)
    ready = [ready_port(line) for line in boots("clean").head.splitlines() if ready_port(line) is not None]
    assert ready == [boots("clean").port]


def test_phases_of_upstream_lines() -> None:
    assert phase_of("[2026-09-16 08:00:01 TP0] Load weight begin. avail mem=112.40 GB") == "weights"
    assert (
        phase_of(
            "[2026-09-16 08:03:01 TP0] Capture cuda graph begin. This can take up to several minutes. avail mem=12.10 GB"
        )
        == "graphs"
    )
    assert phase_of("[2026-09-16 08:04:01] The server is fired up and ready to roll!") == "smoke"
    assert phase_of("Fresh inference passed: 19 + 23 = 42") == "warmup"
    assert phase_of("2026-09-16T08:05:00.1Z Ready: API on port 8888 (rank 0), no API key.") == "ready"
    assert ready_port("Ready: API on port 30001 (rank 0). Key is in /state/api-key.") == 30001
    assert ready_port("echo 'Ready: API on port 8888'") is None
    assert phase_of("Capture cuda graph end. Time elapsed: 11.05 s.") is None


# --- the signature ---------------------------------------------------------------------------------


def printed(pattern: str, log: str) -> str:
    m = re.search(pattern, log)
    assert m, pattern
    return m[1]


def test_signature_numbers_are_what_the_engine_printed(plan: Plan, boots: Callable[[str], Boot]) -> None:
    head = boots("clean").head
    sig = boot_signature(head, pin=pin_of(plan), ready_seconds=12.5)
    window = head.split("The server is fired up and ready to roll!")[1].split("Warm-up done in")[0]
    rates = [float(x) for x in TPS.findall(window)]
    # boot.py's smoke, four warm-up prompts and one batch of MAX_RUNNING_REQUESTS (16)
    assert len(rates) == 1 + 4 + 16 == sig.warmup_batches
    assert sig.warmup_tps_median == statistics.median(rates) and 500 < sig.warmup_tps_median < 600
    assert sig.graph_capture_s == float(printed(r"Capture cuda graph end\. Time elapsed: ([0-9.]+) s", head))
    assert sig.verify_graph_capture_s == float(
        printed(r"Capture target verify CUDA graph end\. elapsed=([0-9.]+)s", head)
    )
    # the stand-in adds 11 s and 7.5 s to the time its (paced) capture took
    assert 11 <= sig.graph_capture_s < 14 and 7.5 <= sig.verify_graph_capture_s < 10
    assert (sig.kv_pool, sig.max_total_num_tokens, sig.pin) == (9_000_000, 8_000_000, 8_000_000)
    assert pin_of(plan) == int(plan.nodes[0].env["MAX_TOTAL_TOKENS"])
    assert (sig.retuned, sig.ready_seconds, sig.ready_port) == (False, 12.5, boots("clean").port)
    verdict = judge(sig, last_good=sig, floor=None)
    assert not verdict.slow and verdict.threshold == sig.warmup_tps_median / 2 and verdict.findings == ()
    # only the warm-up's batches count: none before the server is up, none after `Warm-up done in`
    outside = "[2026-09-16 08:00:00 TP0] Prefill batch. #new-seq: 1, input throughput (token/s): 1.00"
    noisy = re.sub(r"^(Warm-up done in.*)$", lambda m: f"{m[1]}\n{outside}", head, flags=re.M)
    noisy = noisy.replace("The server is fired up", f"{outside}\n[x] The server is fired up")
    assert noisy.count("token/s): 1.00") == 2
    again = boot_signature(noisy, pin=None, ready_seconds=None)
    assert (again.warmup_tps_median, again.warmup_batches) == (sig.warmup_tps_median, sig.warmup_batches)


def test_signature_round_trips_through_json(boots: Callable[[str], Boot]) -> None:
    sig = boot_signature(boots("clean").head, pin=8_000_000, ready_seconds=None)
    data = json.loads(json.dumps(sig.to_json()))
    assert data["schema"] == "tp4.bootsig/1" and data["ready_seconds"] is None
    assert BootSignature.from_json(data) == sig
    with pytest.raises(ValueError, match="boot signature: retuned: 'yes' is not true or false"):
        BootSignature.from_json({**data, "retuned": "yes"})
    with pytest.raises(ValueError, match="boot signature: kv_pool: missing"):
        BootSignature.from_json({k: v for k, v in data.items() if k != "kv_pool"})
    with pytest.raises(ValueError, match="schema is 'tp4.bootsig/0'"):
        BootSignature.from_json({**data, "schema": "tp4.bootsig/0"})


def test_a_slow_retuned_boot(plan: Plan, boots: Callable[[str], Boot]) -> None:
    good = boot_signature(boots("clean").head, pin=pin_of(plan), ready_seconds=None)
    sig = boot_signature(boots("slow").head, pin=pin_of(plan), ready_seconds=None)
    assert sig.retuned and not good.retuned
    assert sig.warmup_tps_median is not None and good.warmup_tps_median is not None
    assert sig.warmup_tps_median == pytest.approx(good.warmup_tps_median / 20, rel=0.01)
    verdict = judge(sig, last_good=good, floor=None)
    assert verdict.slow and [f.check for f in verdict.findings] == ["slow-boot", "retuned"]
    slow = verdict.findings[0].text
    assert f"{sig.warmup_tps_median:.1f} tok/s" in slow and f"below {good.warmup_tps_median / 2:.1f}" in slow
    assert "restart the line with the config unchanged" in slow
    assert "tuning from scratch" in verdict.findings[1].text and verdict.warnings == (verdict.findings[1],)


def sig_of(median: float | None = 500.0, **changes: object) -> BootSignature:
    base = BootSignature(
        warmup_tps_median=median,
        warmup_batches=21,
        graph_capture_s=11.0,
        verify_graph_capture_s=7.5,
        retuned=False,
        ready_seconds=None,
        ready_port=8888,
        kv_pool=None,
        max_total_num_tokens=None,
        pin=None,
    )
    return base._replace(**changes)


def test_judge_thresholds() -> None:
    good = sig_of(600.0)
    assert not judge(sig_of(300.0), last_good=good, floor=None).slow  # exactly half is not below
    assert judge(sig_of(299.9), last_good=good, floor=None).slow
    # a floor is the threshold when given, whatever the last good boot did
    v = judge(sig_of(299.9), last_good=good, floor=250.0)
    assert (v.slow, v.threshold, v.findings) == (False, 250.0, ())
    v = judge(sig_of(450.0), last_good=good, floor=500.0)
    assert v.slow and "(the profile's floor)" in v.findings[0].text
    # nothing to compare with: not judged, and said so
    v = judge(sig_of(5.0), last_good=None, floor=None)
    assert (v.slow, v.threshold, [f.check for f in v.findings]) == (False, None, ["not-judged"])
    assert "not judged" in v.findings[0].text
    v = judge(sig_of(None), last_good=good, floor=100.0)
    assert (v.slow, v.threshold, [f.level for f in v.findings]) == (False, None, ["note"])
    # a last good boot without a warm-up is no basis either
    assert [f.check for f in judge(sig_of(5.0), last_good=sig_of(None), floor=None).findings] == ["not-judged"]


def test_graph_capture_over_10_s_is_a_warning_only() -> None:
    v = judge(sig_of(verify_graph_capture_s=30.2), last_good=None, floor=400.0)
    assert not v.slow and [(f.level, f.check) for f in v.findings] == [("warning", "graph-capture")]
    assert "30.2 s" in v.findings[0].text
    assert judge(sig_of(verify_graph_capture_s=10.0), last_good=None, floor=400.0).findings == ()


@pytest.mark.parametrize(
    ("pin", "check"),
    [
        (951_000, "pin-near-pool"),  # 4.9 % below the pool
        (949_000, None),  # 5.1 % below
        (1_000_000, "pin-near-pool"),  # equal
        (1_000_001, "pin-above-pool"),
        (0, None),
        (None, None),  # no pin
    ],
)
def test_pin_against_the_pool(pin: int | None, check: str | None) -> None:
    v = judge(
        sig_of(kv_pool=1_000_000, max_total_num_tokens=min(pin or 1_000_000, 1_000_000), pin=pin or None),
        last_good=None,
        floor=1.0,
    )
    assert [f.check for f in v.findings] == ([check] if check else [])
    if check:
        assert f"pin {pin}" in v.findings[0].text and "full_token=1000000" in v.findings[0].text
        assert v.findings[0].level == "warning" and not v.slow


def test_pin_warnings_from_real_boots(plan: Plan, boots: Callable[[str], Boot]) -> None:
    near = boot_signature(boots("pool-near").head, pin=pin_of(plan), ready_seconds=None)
    assert (near.kv_pool, near.max_total_num_tokens) == (8_400_000, 8_000_000)
    finding = only_finding(judge(near, last_good=None, floor=1.0))
    assert finding.check == "pin-near-pool" and "4.8 % below" in finding.text
    below = boot_signature(boots("pool-below").head, pin=pin_of(plan), ready_seconds=None)
    assert (below.kv_pool, below.max_total_num_tokens) == (7_500_000, 7_500_000)
    finding = only_finding(judge(below, last_good=None, floor=1.0))
    assert finding.check == "pin-above-pool"
    assert "pin 8000000 is above the KV pool this boot computed (full_token=7500000)" in finding.text
    assert "max_total_num_tokens=7500000" in finding.text and "silently clamped" in finding.text
    # without the memory-calculation line the clamp still shows
    clamped = below._replace(kv_pool=None)
    assert only_finding(judge(clamped, last_good=None, floor=1.0)).check == "pin-above-pool"


def only_finding(v: Verdict) -> Finding:
    assert len(v.findings) == 1, v.findings
    return v.findings[0]
