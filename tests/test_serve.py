"""`tp4 serve | stop | status | logs | smoke` on four netns hosts (real sshd, real podman running
each rank's plan argv, the stand-in engine in the image; tests/line_cluster.py), each host laid
out as a good Spark for doctor's checks, which serve runs (tests/doctor_hosts.py: the RDMA sysfs
tree at SYSFS, a stub nvidia-smi). Each scenario asserts the exit code, the message (node and
cause) and that nothing of the line is left on any host afterwards."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from doctor_hosts import SYSFS, DoctorCluster
from line_cluster import LineCluster

from tp4.serving import serve
from tp4.core.apikey import read_key
from tp4.hosts.nodes import nodes_of

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DoctorCluster]:
    with DoctorCluster(tmp_path_factory.mktemp("serve")) as c:
        c.reset()
        yield c


@pytest.fixture
def line(cluster: LineCluster, tmp_path: Path) -> Iterator[LineCluster]:
    """The cluster, clean before and after each scenario (what a failed assertion left goes too)."""
    yield cluster
    for host in cluster.hosts:
        host.run("podman", "rm", "-f", "-a", "-t", "0", check=False)


def argv(*args: str) -> list[str]:
    """`python -m tp4 ARGS`; a serve reads the hosts' RDMA sysfs tree at SYSFS (doctor's checks)."""
    return [sys.executable, "-m", "tp4", *args, *(["--sysfs", SYSFS] if "serve" in args else [])]


def tp4(*args: str, env: dict[str, str] | None = None, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv(*args),
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": str(REPO / "python"), **(env or {})},
    )


def profile_with(cluster: LineCluster, tmp_path: Path, extra: str) -> str:
    path = tmp_path / "profile.toml"
    path.write_text(cluster.profile.read_text() + "\n" + extra)
    return str(path)


def fault(cluster: LineCluster, tmp_path: Path, mode: str, rank: int | str = 0, **more: str) -> str:
    env = {"TP4_STANDIN_FAULT": mode, "TP4_STANDIN_FAULT_RANK": str(rank), **more}
    return profile_with(cluster, tmp_path, "[env]\n" + "".join(f'{k} = "{v}"\n' for k, v in env.items()))


def assert_nothing_left(cluster: LineCluster) -> None:
    deadline = time.monotonic() + 10
    left = cluster.leftovers()
    while left and time.monotonic() < deadline:
        time.sleep(0.5)
        left = cluster.leftovers()
    assert left == []


def test_a_clean_serve_is_ready_and_a_clean_stop_leaves_nothing(line: LineCluster, tmp_path: Path) -> None:
    profile = str(line.profile)
    proc = tp4("serve", "--profile", profile)
    assert proc.returncode == 0, proc.stderr
    assert f"ready: {line.api()} after " in proc.stdout and "4 boot logs checked" in proc.stdout
    assert "phase: weights" in proc.stderr and "phase: ready" in proc.stderr
    # every rank runs, from the env file of mode 0600 (never argv)
    for node, host in zip(line.nodes(), line.hosts, strict=True):
        mode = host.run("stat", "-c", "%a", node.rank.service.env_file).stdout.strip()
        assert mode == "600"
        assert serve.container_state(node) == "running"

    status = tp4("status", "--profile", profile, "--json")
    assert status.returncode == 0, status.stderr
    data = json.loads(status.stdout)
    assert data["liveness"]["state"] == "alive" and data["state"] == "ready"
    assert [n["state"] for n in data["nodes"]] == ["running"] * 4
    assert data["boot"]["ok"] is True and data["boot"]["signature"]["warmup_tps_median"] > 0

    human = tp4("status", "--profile", profile)
    assert human.returncode == 0 and "line http://" in human.stdout and ": alive" in human.stdout

    logs = tp4("logs", "--profile", profile, "--rank", "2", "--tail", "5")
    assert logs.returncode == 0 and logs.stdout.strip()

    smoke = tp4("smoke", "--profile", profile, "--full")
    assert smoke.returncode == 0, smoke.stdout + smoke.stderr
    assert "ok   arithmetic" in smoke.stdout and "ok   tool_call" in smoke.stdout

    stop = tp4("stop", "--profile", profile)
    assert stop.returncode == 0, stop.stderr
    assert "stopped: no rank of the line runs on 4 nodes, the API is down" in stop.stdout
    assert_nothing_left(line)
    # idempotent
    again = tp4("stop", "--profile", profile)
    assert again.returncode == 0, again.stderr
    down = tp4("status", "--profile", profile)
    assert down.returncode == 1 and ": down" in down.stdout


def test_an_unreachable_worker_fails_the_checks_and_nothing_starts(line: LineCluster, tmp_path: Path) -> None:
    gone = line.hosts.unreachable()
    text = line.profile.read_text()
    worker = line.hosts[2].address
    path = tmp_path / "profile.toml"
    path.write_text(text.replace(f'ssh = "{worker}"', f'ssh = "{gone}"'))
    proc = tp4("serve", "--profile", str(path))
    assert proc.returncode == 1
    name = line.plan.nodes[2].name
    assert f"serve refused: 1 blocking check(s) failed on {name}: SSH.REACHABLE; nothing was started" in proc.stderr
    assert re.search(rf"^FAIL {name} SSH.REACHABLE \(blocking\): .*{re.escape(gone)}", proc.stderr, re.M), proc.stderr
    assert re.search(r"^SSH\.REACHABLE +ok +ok +FAIL +ok$", proc.stderr, re.M), proc.stderr  # doctor's table
    assert "Traceback" not in proc.stderr
    assert_nothing_left(line)


def test_doctors_blocking_checks_refuse_serve_and_force_overrides_only_foreign_gpu_apps(
    line: DoctorCluster, tmp_path: Path
) -> None:
    """serve runs doctor's blocking checks: a port down on one worker refuses it with doctor's
    table and its fix; another stack's compute apps on a GPU refuse it unless --force."""
    worker = line.plan.nodes[3]
    state = line.port(line.hosts[3], worker.gid.hcas[0]) / "state"
    apps = line.fake(line.head, "apps.csv")
    try:
        state.write_text("1: DOWN\n")
        apps.write_text("4242, python3, 9000 MiB\n")
        proc = tp4("serve", "--profile", str(line.profile), "--force")
        assert proc.returncode == 1
        assert f"failed on {worker.name}: RDMA.PORT_ACTIVE; nothing was started" in proc.stderr, proc.stderr
        assert f"FAIL {worker.name} RDMA.PORT_ACTIVE (blocking)" in proc.stderr and "     fix: " in proc.stderr
        assert_nothing_left(line)
        state.write_text("4: ACTIVE\n")
        proc = tp4("serve", "--profile", str(line.profile))
        assert proc.returncode == 1
        assert f"failed on {line.plan.nodes[0].name}: GPU.NO_FOREIGN_APPS; nothing was started" in proc.stderr, (
            proc.stderr
        )
        assert "4242" in proc.stderr
        assert_nothing_left(line)
        proc = tp4("serve", "--profile", str(line.profile), "--force")
        assert proc.returncode == 0, proc.stderr
        assert re.search(
            rf"^warning: {line.plan.nodes[0].name}: .*4242.* \(--force: serving anyway\)$", proc.stderr, re.M
        ), proc.stderr
        assert tp4("stop", "--profile", str(line.profile)).returncode == 0
    finally:
        state.write_text("4: ACTIVE\n")
        apps.write_text("")
    assert_nothing_left(line)


def test_a_head_whose_container_cannot_be_created_is_named_and_every_rank_stopped(
    line: LineCluster, tmp_path: Path
) -> None:
    """The head's container is created and initialized (`podman container init`: the OCI
    runtime's create) beside the workers' starts; the hosts' runc wrapper refuses that create
    (tests/runc_rlimits.py): serve names the head and stops the workers it started."""
    profile = profile_with(line, tmp_path, '[env]\nTP4_TEST_RUNC_FAIL = "create"\nTP4_TEST_RUNC_FAIL_RANK = "0"\n')
    proc = tp4("serve", "--profile", profile, "--timeout", "start=60")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    head = line.plan.nodes[0].name
    assert f"\nerror: {head}: create: " in proc.stderr, proc.stderr
    assert "refused for rank 0 (TP4_TEST_RUNC_FAIL" in proc.stderr, proc.stderr
    assert "started 3 workers" not in proc.stderr and "started the head" not in proc.stderr
    assert "stopping the 4 ranks this serve started" in proc.stderr and "Traceback" not in proc.stderr
    assert_nothing_left(line)


def test_a_head_whose_container_does_not_start_is_named_and_every_rank_stopped(
    line: LineCluster, tmp_path: Path
) -> None:
    """The head's `podman start --attach` (the start and the follower in one) fails in the OCI
    runtime's start (the hosts' runc wrapper refuses it), after every worker started."""
    profile = profile_with(line, tmp_path, '[env]\nTP4_TEST_RUNC_FAIL = "start"\nTP4_TEST_RUNC_FAIL_RANK = "0"\n')
    proc = tp4("serve", "--profile", profile, "--timeout", "start=60")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    head = line.plan.nodes[0].name
    assert "started 3 workers" in proc.stderr
    assert re.search(
        rf"\nerror: {head}: start: its container did not start \(it is \w+\)\nlast log lines of {head}:\n", proc.stderr
    ), proc.stderr
    assert "refused for rank 0 (TP4_TEST_RUNC_FAIL" in proc.stderr, proc.stderr
    assert "stopping the 4 ranks this serve started" in proc.stderr and "Traceback" not in proc.stderr
    assert_nothing_left(line)


def test_a_rank_that_crashes_during_boot_is_named_and_every_rank_stopped(line: LineCluster, tmp_path: Path) -> None:
    proc = tp4("serve", "--profile", fault(line, tmp_path, "crash", 2))
    assert proc.returncode == 1
    name = line.plan.nodes[2].name
    # the rank that went first is named, not the ones it took down
    assert re.search(
        rf"{name}: rank exited: its container is (exited|stopped) \(exit code 1\) during the boot phase \w+; "
        r"then node\d, node\d, node\d stopped too",
        proc.stderr,
    ), proc.stderr
    assert f"last log lines of {name}:" in proc.stderr and "Traceback" in proc.stderr.split("last log lines")[1]
    assert "stopping the" in proc.stderr
    assert_nothing_left(line)


@pytest.mark.parametrize("mode, check", [("omit-line", "missing-line"), ("forbidden", "forbidden-line")])
def test_a_boot_log_that_fails_the_registry_fails_serve(
    line: LineCluster, tmp_path: Path, mode: str, check: str
) -> None:
    rank = 0 if mode == "omit-line" else 1
    proc = tp4("serve", "--profile", fault(line, tmp_path, mode, rank))
    assert proc.returncode == 1
    assert f"{line.plan.nodes[rank].name}: {check}:" in proc.stderr
    assert_nothing_left(line)


def test_a_head_that_never_gets_ready_times_out_in_its_phase(line: LineCluster, tmp_path: Path) -> None:
    proc = tp4("serve", "--profile", fault(line, tmp_path, "hang", 0), "--timeout", "smoke=4", "--timeout", "graphs=8")
    assert proc.returncode == 1
    assert f"{line.plan.nodes[0].name}: boot phase " in proc.stderr and "did not finish within" in proc.stderr
    assert_nothing_left(line)


def test_a_head_whose_completions_hang_fails_the_ready_check(line: LineCluster, tmp_path: Path) -> None:
    profile = fault(line, tmp_path, "wedge", 0)
    proc = tp4("serve", "--profile", profile, "--timeout", "completion=3")
    # the wedge begins after boot.py's own smoke: serve's own completion finds it already
    assert proc.returncode == 1 and "completion" in proc.stderr
    assert_nothing_left(line)


def test_a_slow_boot_is_reported_and_restarted_once_when_asked(line: LineCluster, tmp_path: Path) -> None:
    profile = fault(line, tmp_path, "slow", 0)
    proc = tp4("serve", "--profile", profile, "--slow-floor", "1000000")
    assert proc.returncode == 0, proc.stderr
    assert "warning: slow boot:" in proc.stdout
    again = tp4("serve", "--profile", profile, "--slow-floor", "1000000", "--on-slow-boot", "restart")
    assert again.returncode == 1 and "already running" in again.stderr  # it runs: stop first
    tp4("stop", "--profile", profile)
    again = tp4("serve", "--profile", profile, "--slow-floor", "1000000", "--on-slow-boot", "restart")
    assert again.returncode == 0, again.stderr
    assert "restarting it once" in again.stderr and "warning: slow boot:" in again.stdout
    assert tp4("stop", "--profile", profile).returncode == 0
    assert_nothing_left(line)


def test_ctrl_c_mid_boot_stops_every_rank(line: LineCluster, tmp_path: Path) -> None:
    profile = fault(line, tmp_path, "hang", 0)
    child = subprocess.Popen(
        argv("serve", "--profile", profile),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO / "python")},
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if serve.container_state(line.nodes()[0]) == "running":
                break
            time.sleep(0.3)
        time.sleep(1)
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=90)
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err
    assert_nothing_left(line)


def test_a_second_serve_is_refused_while_one_holds_the_line_and_a_stale_lock_is_taken_over(
    line: LineCluster, tmp_path: Path
) -> None:
    profile = fault(line, tmp_path, "hang", 0)
    first = subprocess.Popen(
        argv("serve", "--profile", profile, "--timeout", "graphs=20"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO / "python")},
    )
    try:
        time.sleep(2)
        second = tp4("serve", "--profile", str(line.profile))
        assert second.returncode == 1
        assert "is busy: tp4 serve (pid " in second.stderr and str(first.pid) in second.stderr
    finally:
        first.send_signal(signal.SIGINT)
        first.communicate(timeout=90)
    assert_nothing_left(line)
    # a lock whose holder died: its content says so, the flock is free, the next serve goes on
    lock = Path(os.environ["XDG_STATE_HOME"]) / "tp4" / "lines" / f"{serve.line_id(line.plan)}.lock"
    lock.write_text("tp4 serve (pid 999999, started 2026-01-01 00:00:00)\n")
    proc = tp4("serve", "--profile", str(line.profile))
    assert proc.returncode == 0, proc.stderr
    assert tp4("stop", "--profile", str(line.profile)).returncode == 0
    assert_nothing_left(line)


def test_a_changed_host_key_is_refused_naming_the_host(line: LineCluster, tmp_path: Path) -> None:
    line.hosts.new_host_key(3)
    try:
        proc = tp4("serve", "--profile", str(line.profile))
        assert proc.returncode == 2
        assert line.hosts[3].address in proc.stderr and "tp4 hosts trust" in proc.stderr
        assert "Traceback" not in proc.stderr
    finally:  # the new key, accepted deliberately, for the scenarios after this one
        trust = tp4("hosts", "trust", "--replace", "--yes", "--host", line.hosts[3].address)
        assert trust.returncode == 0, trust.stderr
    assert_nothing_left(line)


def test_spec_tables_that_cannot_be_the_same_on_a_node_refuse_serve(line: LineCluster, tmp_path: Path) -> None:
    profile = profile_with(line, tmp_path, "")
    text = (
        Path(profile)
        .read_text()
        .replace('preset = "production"', 'preset = "production"\n[engine]\nuse_sts_table = true\n', 1)
    )
    Path(profile).write_text(text)
    plan_head = line.plan.nodes[0]
    state = next(m.source for m in plan_head.run.mounts if m.target == "/state")
    line.head.run("mkdir", "-p", state)
    line.head.run("sh", "-c", 'echo \'{"t": 1}\' > "$1"', "sh", f"{state}/dspark_sts.json")
    worker = line.plan.nodes[1]
    wstate = next(m.source for m in worker.run.mounts if m.target == "/state")
    line.hosts[1].run("mkdir", "-p", f"{wstate}/dspark_sts.json")  # a directory where the table goes
    try:
        proc = tp4("serve", "--profile", profile)
        assert proc.returncode == 1
        assert f"{worker.name}: spec table: dspark_sts.json" in proc.stderr
    finally:
        line.hosts[1].run("rm", "-rf", f"{wstate}/dspark_sts.json")
        line.head.run("rm", "-f", f"{state}/dspark_sts.json")
    assert_nothing_left(line)


def test_status_finds_the_wedge_and_tells_busy_from_wedged(line: LineCluster, tmp_path: Path) -> None:
    """/health stays 200 on a wedged line; only a real completion finds it (and a line with
    running requests and a slow probe is busy, not dead)."""
    wedged = fault(line, tmp_path, "wedge", 0, TP4_STANDIN_WEDGE_AFTER="1")
    proc = tp4("serve", "--profile", wedged)
    assert proc.returncode == 0, proc.stderr
    status = tp4("status", "--profile", wedged, "--json", "--probe-timeout", "2")
    assert status.returncode == 1
    data = json.loads(status.stdout)
    live = data["liveness"]
    assert live["state"] == "wedged" and "health 200" in live["detail"]
    assert data["state"] == "wedged"  # the classification `tp4 watch` acts on (tp4.serving.watch.classify)
    assert tp4("stop", "--profile", wedged).returncode == 0
    assert_nothing_left(line)

    (tmp_path / "busy").mkdir()
    busy = fault(line, tmp_path / "busy", "busy", 0, TP4_STANDIN_BUSY_SECONDS="6")
    proc = tp4("serve", "--profile", busy)
    assert proc.returncode == 0, proc.stderr
    status = tp4("status", "--profile", busy, "--probe-timeout", "2")
    assert status.returncode == 0, status.stdout + status.stderr
    assert ": busy (running " in status.stdout
    assert "state: busy: " in status.stdout
    assert tp4("stop", "--profile", busy).returncode == 0
    assert_nothing_left(line)


def test_stop_names_a_node_it_cannot_reach(line: LineCluster, tmp_path: Path) -> None:
    profile = str(line.profile)
    assert tp4("serve", "--profile", profile).returncode == 0
    gone = line.hosts.unreachable()
    worker = line.hosts[3].address
    cut = tmp_path / "cut.toml"
    cut.write_text(line.profile.read_text().replace(f'ssh = "{worker}"', f'ssh = "{gone}"'))
    proc = tp4("stop", "--profile", str(cut))
    assert proc.returncode == 1
    assert f"{line.plan.nodes[3].name}: could not stop its rank" in proc.stderr
    assert "the GPU there may still be busy" in proc.stderr
    # the reachable ranks are gone; the real stop finishes the job
    assert tp4("stop", "--profile", profile).returncode == 0
    assert_nothing_left(line)


def test_the_api_key_reaches_the_head_in_its_env_file_and_nowhere_else(line: LineCluster, tmp_path: Path) -> None:
    key = "sk-tp4-" + os.urandom(12).hex()
    key_file = tmp_path / "api.key"
    key_file.write_text(key + "\n")
    key_file.chmod(0o600)
    profile = profile_with(line, tmp_path, f'[api]\nkey_file = "{key_file}"\n')
    state = {"XDG_STATE_HOME": str(tmp_path / "state")}  # serve's run records and locks, read below
    outputs = []
    # the plan names the key's file, never the key
    for args in (("plan",), ("plan", "--json")):
        got = tp4(*args, "--profile", profile)
        assert got.returncode == 0 and str(key_file) in got.stdout, (args, got.stderr)
        outputs += [got.stdout, got.stderr]
    # in-process: the key stays a Secret from its file to the env file serve writes
    secret = read_key(key_file)
    secrets = {"API_KEY": secret}
    outputs += [repr(secret), str(secret), f"{secrets}", repr(serve.endpoint(line.plan, secrets))]
    outputs += [" ".join(serve.start_argv(n, line="L")) for n in nodes_of(line.plan)]
    assert f"API_KEY={key}\n" in serve.env_file_text(line.plan.nodes[0], secrets)
    proc = tp4("-v", "serve", "--profile", profile, env=state)  # -v: every command tp4 runs, logged
    outputs += [proc.stdout, proc.stderr]
    assert proc.returncode == 0, proc.stderr
    assert "$ ssh " in proc.stderr and "podman run -d" in proc.stderr
    # the processes on the hosts, the containers' configs: no key in any argv
    for host in line.hosts:
        outputs += line.processes(host)
        outputs.append(host.run("sh", "-c", "cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' '").stdout)
    head_env = line.hosts[0].run("cat", line.plan.nodes[0].service.env_file).stdout
    assert f"API_KEY={key}\n" in head_env
    for node, host in zip(line.plan.nodes[1:], line.hosts[1:], strict=True):
        assert key not in host.run("cat", node.service.env_file).stdout
    for args in (("status", "--json"), ("smoke",), ("logs", "--tail", "50"), ("stop",)):
        got = tp4("-v", *args, "--profile", profile, env=state)
        assert got.returncode == 0, (args, got.stdout, got.stderr)
        outputs += [got.stdout, got.stderr]
    # what serve keeps on this machine (run records, locks)
    records = [f for f in (tmp_path / "state").rglob("*") if f.is_file()]
    assert records, "serve kept no run record"
    outputs += [f.read_text(errors="replace") for f in records]
    assert not [o for o in outputs if key in o]
    assert_nothing_left(line)


def test_the_plan_digest_goes_from_plan_to_status_and_another_plan_is_named_and_refused(
    line: LineCluster, tmp_path: Path
) -> None:
    """`tp4 plan`'s digest is the label of every rank serve starts and what status reports; a
    changed profile is reported with the fields that differ, and serve refuses it unless --replace."""
    profile = str(line.profile)
    digest = json.loads(tp4("plan", "--profile", profile, "--json").stdout)["digest"]
    assert f"digest: {digest}" in tp4("plan", "--profile", profile).stdout
    proc = tp4("serve", "--profile", profile)
    assert proc.returncode == 0, proc.stderr
    said = proc.stderr.splitlines()
    assert said.index(f"profile: {profile} (plan {digest})") < next(
        i for i, x in enumerate(said) if x.startswith("checks:")
    )
    for node, host in zip(line.nodes(), line.hosts, strict=True):
        assert (
            host.run(
                "podman", "inspect", "--format", '{{index .Config.Labels "tp4.plan"}}', node.container
            ).stdout.strip()
            == digest
        )
        stored = serve.running_plan_path(node.rank)
        assert host.run("stat", "-c", "%a", stored).stdout.strip() == "600"
        assert json.loads(host.run("cat", stored).stdout)["digest"] == digest
    status = tp4("status", "--profile", profile, "--json")
    assert status.returncode == 0, status.stderr
    data = json.loads(status.stdout)  # the profile line went to stderr, the JSON is whole
    assert [n["plan"] for n in data["nodes"]] == [digest] * 4
    assert data["plan"]["same"] is True and data["plan"]["fields"] == []
    assert f"profile: {profile} (plan {digest})" in status.stderr.splitlines()
    same = tp4("plan", "--profile", profile, "--against-running")
    assert same.returncode == 0 and f"plan: the line runs this plan ({digest})" in same.stdout

    changed = tmp_path / "changed.toml"
    changed.write_text(line.profile.read_text() + '\n[env]\nTP4_STANDIN_NOTE = "changed"\n')
    new = json.loads(tp4("plan", "--profile", str(changed), "--json").stdout)["digest"]
    assert new != digest
    human = tp4("status", "--profile", str(changed))
    assert human.returncode == 0, human.stderr
    assert f"plan {digest}" in human.stdout and f"from another plan ({digest}), not this plan ({new})" in human.stdout
    assert 'nodes[0].env.TP4_STANDIN_NOTE: running null, this plan "changed"' in human.stdout
    data = json.loads(tp4("status", "--profile", str(changed), "--json").stdout)["plan"]
    assert data["same"] is False and data["running"] == [digest]
    assert {f.split(":")[0] for f in data["fields"]} == {f"nodes[{r}].env.TP4_STANDIN_NOTE" for r in range(4)}
    diff = tp4("plan", "--profile", str(changed), "--against-running")
    assert diff.returncode == 1 and "4 field(s) differ: nodes[0].env.TP4_STANDIN_NOTE" in diff.stdout

    refused = tp4("serve", "--profile", str(changed))
    assert refused.returncode == 1 and "already running" in refused.stderr
    assert f"from another plan ({digest}), not this plan ({new})" in refused.stderr and "--replace" in refused.stderr
    assert [n["plan"] for n in json.loads(tp4("status", "--profile", profile, "--json").stdout)["nodes"]] == [
        digest
    ] * 4

    replaced = tp4("serve", "--profile", str(changed), "--replace")
    assert replaced.returncode == 0, replaced.stderr
    assert f"replacing the line's ranks (plan {digest}) with this plan ({new})" in replaced.stderr
    data = json.loads(tp4("status", "--profile", str(changed), "--json").stdout)
    assert [n["plan"] for n in data["nodes"]] == [new] * 4 and data["plan"]["same"] is True
    assert tp4("stop", "--profile", str(changed)).returncode == 0
    assert_nothing_left(line)
