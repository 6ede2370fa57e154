"""`tp4 fleet`: two lines of two stand-in nodes each on the four netns hosts of
tests/doctor_hosts.py (real sshd, real podman, doctor's checks), behind the real router
(sglang-router from the lock's router group, run on line a's head through tp4.core.process): requests
spread over both lines; a wedged line is taken out by the router's generating health check and
comes back when it recovers; a line that never boots leaves the fleet serving on the other (or,
with --all, nothing running); stop leaves nothing. Then the fleet file's validation with hostile
values, and a property: no fleet value changes the router's argv except in its own field.

The router's Python: $TP4_ROUTER_PYTHON, else the one running the tests (python/setup.sh --test
installs the router group there)."""

from __future__ import annotations

import json
import os
import re
import struct
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from doctor_hosts import BOOTSTRAP, SYSFS, DoctorCluster
from hypothesis import given, settings
from hypothesis import strategies as st
from line_cluster import _q, memlock
from netns_hosts import Host

from tp4.core import process

from tp4.serving import fleet, serve
from tp4.core.apikey import Secret
from tp4.hosts.doctor import engram_files
from tp4.core.errors import InvalidInput, Tp4Error
from tp4.hosts.nodes import nodes_of
from tp4.line.plan import Plan

REPO = Path(__file__).resolve().parent.parent
ROUTER_PYTHON = os.environ.get("TP4_ROUTER_PYTHON") or sys.executable
# the lines' own generating probe (SGLang's SGLANG_HEALTH_CHECK_TIMEOUT) and the router's, short
OWN_PROBE = 3
ROUTER_HEALTH = {"timeout": 6, "interval": 1, "failure_threshold": 1, "success_threshold": 1}
QUESTION = "What is 19 + 23? Reply only with the number."


def _router_installed() -> bool:
    return (
        subprocess.run([ROUTER_PYTHON, "-c", "import sglang_router.launch_router"], capture_output=True).returncode == 0
    )


# --- the two lines on the four hosts ------------------------------------------------------------


def line_profile(cluster: DoctorCluster, hosts: list[Host], extra: str = "", key_file: Path | None = None) -> str:
    """A two-node line on ``hosts`` (head first), as tests/line_cluster.py writes its profile."""
    nodes = []
    for i, host in enumerate(hosts):
        table = "[cluster.head]" if i == 0 else "[[cluster.workers]]"
        nodes.append(
            f"{table}\nname = {_q(host.name)}\nip = {_q(host.address)}\nssh = {_q(host.address)}\n"
            f'user = "root"\nidentity = {_q(str(cluster.hosts.key))}\nssh_port = 22\n'
            f"home = {_q(str(host.dir / 'home'))}\nworkdir = {_q(str(host.dir / 'work'))}\n"
            'kind = "plain"\nruntime = "podman"\n'
        )
    return (
        'preset = "production"\n\n'
        f'[cluster]\nuser = "root"\nidentity = {_q(str(cluster.hosts.key))}\nmemlock = {_q(memlock())}\n\n'
        + "\n".join(nodes)
        + f"\n[model]\ndir = {_q(str(cluster.model_dir))}\n\n[nfs]\nshare = false\n\n[engine]\ntp = {len(hosts)}\n\n"
        + f"[fabric]\nsocket_ifname = {_q(BOOTSTRAP)}\n\n"
        + (f"[api]\nkey_file = {_q(str(key_file))}\n\n" if key_file else "")
        + f'[env]\nSGLANG_HEALTH_CHECK_TIMEOUT = "{OWN_PROBE}"\n'
        + extra
    )


def lay_engram(plan: Plan) -> None:
    """Both packed Engram shards of every rank of the line, with a valid header (doctor reads it)."""
    for rank in plan.nodes:
        d = Path(next(m.source for m in rank.run.mounts if m.target == "/engram"))
        d.mkdir(parents=True, exist_ok=True)
        for name in engram_files(plan, rank):
            rows, row_bytes = 4, 16
            (d / name).write_bytes(
                struct.pack("<6Q", 0x4D41524745, 1, 0, rows, rows, row_bytes) + b"\0" * rows * row_bytes
            )


def fleet_text(cluster: DoctorCluster, workdir: Path, **router: object) -> str:
    head = cluster.hosts[0]
    values: dict[str, object] = {
        "host": head.address,
        "user": "root",
        "identity": str(cluster.hosts.key),
        "python": ROUTER_PYTHON,
        "state_dir": str(workdir / "router"),
        "port": 30000,
        "ready_timeout": 90,
        "stop_grace": 3,
        **router,
    }
    lines = "".join(f"{k} = {json.dumps(v)}\n" for k, v in values.items())
    health = "".join(f"{k} = {json.dumps(v)}\n" for k, v in ROUTER_HEALTH.items())
    return (
        '[[lines]]\nname = "a"\nprofile = "a.toml"\n\n[[lines]]\nname = "b"\nprofile = "b.toml"\n\n'
        f"[router]\n{lines}\n[router.health]\n{health}"
    )


class Fleet:
    """The fleet's files in a directory: a.toml (nodes 1-2), b.toml (nodes 3-4), fleet.toml."""

    def __init__(self, cluster: DoctorCluster, workdir: Path, *, b_extra: str = "", key: str | None = None) -> None:
        self.cluster, self.dir = cluster, workdir
        hosts = list(cluster.hosts)
        key_file = None
        if key is not None:
            key_file = workdir / "api-key"
            key_file.write_text(key + "\n")
            key_file.chmod(0o600)
        (workdir / "a.toml").write_text(line_profile(cluster, hosts[:2], key_file=key_file))
        (workdir / "b.toml").write_text(line_profile(cluster, hosts[2:], b_extra, key_file=key_file))
        self.path = workdir / "fleet.toml"
        self.path.write_text(fleet_text(cluster, workdir))
        self.fleet = fleet.load(self.path)
        for line in self.fleet.lines:
            lay_engram(line.plan)

    def line(self, name: str) -> fleet.Line:
        return next(line for line in self.fleet.lines if line.name == name)

    def answered(self, name: str) -> int:
        """Completions the line's engine answered (its head's `Prefill batch.` log lines)."""
        head = nodes_of(self.line(name).plan)[0]
        return serve.full_log(head).count("Prefill batch.")

    def router_processes(self) -> list[str]:
        return [f"{pid} {cmd}" for pid, cmd in router_pids(self.cluster).items()]


def tp4(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "tp4", *args, *(["--sysfs", SYSFS] if "serve" in args else [])]
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=timeout, env={**os.environ, "PYTHONPATH": str(REPO / "python")}
    )


def ask(url: str, timeout: float = 15, key: str | None = None) -> str:
    body = json.dumps(
        {"model": "deepseek-v4.1-flash", "messages": [{"role": "user", "content": QUESTION}], "max_tokens": 4}
    )
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    req = urllib.request.Request(f"{url}/v1/chat/completions", data=body.encode(), headers=headers)
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return str(json.loads(resp.read())["choices"][0]["message"]["content"])


def set_wedged(line: fleet.Line, value: bool | None) -> None:
    req = urllib.request.Request(f"{line.api}/standin/wedge", data=json.dumps({"wedged": value}).encode())
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert json.loads(resp.read())["wedged"] is bool(value)


def health_of(f: Fleet, key: str | None = None) -> dict[str, bool]:
    seen = fleet.workers(f.fleet, Secret(key) if key else None)
    assert seen is not None, "the router does not answer"
    return {w.url: w.healthy for w in seen}


def wait_for(what: str, cond: object, seconds: float) -> None:
    assert callable(cond)
    deadline = time.monotonic() + seconds
    while not cond():
        assert time.monotonic() < deadline, f"not within {seconds} s: {what}"
        time.sleep(0.5)


def assert_nothing_left(f: Fleet) -> None:
    deadline = time.monotonic() + 15
    while (f.cluster.leftovers() or f.router_processes()) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert f.cluster.leftovers() == [] and f.router_processes() == []


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DoctorCluster]:
    if not _router_installed():
        pytest.fail(
            f"{ROUTER_PYTHON} has no sglang_router: run `bash python/setup.sh --test` (the router group), "
            "or point TP4_ROUTER_PYTHON at a Python with it"
        )
    with DoctorCluster(tmp_path_factory.mktemp("fleet")) as c:
        c.reset()
        yield c


def router_pids(cluster: DoctorCluster) -> dict[int, str]:
    """The router processes in the head's namespace (its title, or the launcher's argv): pid -> cmdline."""
    host = cluster.hosts[0]
    found = {}
    for pid in process.run(["ip", "netns", "pids", host.namespace], check=False).stdout.split():
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "::router" in cmdline or "fleet router launcher" in cmdline:
            found[int(pid)] = cmdline.strip()[:120]
    return found


@pytest.fixture
def hosts(cluster: DoctorCluster, tmp_path: Path) -> Iterator[DoctorCluster]:
    """The cluster, clean after each scenario (what a failed assertion left goes too)."""
    yield cluster
    for host in cluster.hosts:
        host.run("podman", "rm", "-f", "-a", "-t", "0", check=False)
    for pid in router_pids(cluster):  # the routers these tests started
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass


# --- serving --------------------------------------------------------------------------------------


def test_two_lines_behind_the_router_round_robin_a_wedged_line_out_and_back_and_stop_leaves_nothing(
    hosts: DoctorCluster, tmp_path: Path
) -> None:
    f = Fleet(hosts, tmp_path)
    a, b = f.line("a"), f.line("b")
    plan = tp4("fleet", "plan", "-f", str(f.path))
    assert plan.returncode == 0, plan.stderr
    assert "--health-check-endpoint /health_generate --health-check-timeout-secs 6" in plan.stdout
    assert f"--worker-urls {a.api} {b.api} --policy round_robin" in plan.stdout

    proc = tp4("fleet", "serve", "-f", str(f.path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"ready: {f.fleet.url} (sglang-router, round_robin) over 2 of 2 lines: a, b" in proc.stdout
    assert "[a] ready: " in proc.stdout and "[b] ready: " in proc.stdout and "2 boot logs checked" in proc.stdout
    status = tp4("fleet", "status", "-f", str(f.path), "--json")
    assert status.returncode == 0, status.stdout + status.stderr
    data = json.loads(status.stdout)
    assert data["router"]["state"] == "running" and [line["router_health"] for line in data["lines"]] == [
        "healthy",
        "healthy",
    ]
    assert [line["status"]["liveness"]["state"] for line in data["lines"]] == ["alive", "alive"]
    # an OpenAI client finds the lines' model at the router
    with urllib.request.urlopen(f"{f.fleet.url}/v1/models", timeout=10) as resp:
        assert "deepseek-v4.1-flash" in [m["id"] for m in json.loads(resp.read())["data"]]
    # the router's metrics are on its host's loopback only
    host = fleet.RouterHost(f.fleet, fleet.router_remote(f.fleet))
    metrics = host.metrics()
    assert metrics is not None and "smg_worker_health" in metrics
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://{hosts.hosts[0].address}:{f.fleet.router.metrics.port}/metrics", timeout=3)

    # round robin: requests through the router reach both lines' engines
    before = {n: f.answered(n) for n in "ab"}
    assert [ask(f.fleet.url) for _ in range(8)] == ["42"] * 8
    got = {n: f.answered(n) - before[n] for n in "ab"}
    assert sum(got.values()) == 8 and min(got.values()) >= 3, got

    # line b wedges (completions hang, /health 200): the generating health check takes it out
    set_wedged(b, True)
    wait_for("the router takes line b out", lambda: health_of(f) == {a.api: True, b.api: False}, 40)
    text = tp4("fleet", "status", "-f", str(f.path))
    assert text.returncode == 1 and f"line b {b.api}: unhealthy" in text.stdout, text.stdout
    before = {n: f.answered(n) for n in "ab"}
    assert [ask(f.fleet.url) for _ in range(4)] == ["42"] * 4
    assert f.answered("a") - before["a"] == 4 and f.answered("b") == before["b"]
    # it recovers: back in the router, and requests reach it again
    set_wedged(b, False)
    wait_for("line b comes back", lambda: health_of(f) == {a.api: True, b.api: True}, 40)
    before = {n: f.answered(n) for n in "ab"}
    assert [ask(f.fleet.url) for _ in range(6)] == ["42"] * 6
    assert f.answered("b") - before["b"] >= 2

    stop = tp4("fleet", "stop", "-f", str(f.path))
    assert stop.returncode == 0, stop.stdout + stop.stderr
    assert f"stopped: the router on {hosts.hosts[0].address} and 2 lines (a, b)" in stop.stdout
    assert_nothing_left(f)
    again = tp4("fleet", "stop", "-f", str(f.path))
    assert again.returncode == 0, again.stderr
    down = tp4("fleet", "status", "-f", str(f.path))
    assert down.returncode == 1 and ": stopped" in down.stdout.splitlines()[0], down.stdout


def test_a_line_wedged_by_the_fault_is_taken_out_by_the_generating_probe_and_comes_back(
    hosts: DoctorCluster, tmp_path: Path
) -> None:
    """The stand-in's `wedge` fault (after serve's own completion, every completion hangs while
    /health stays 200): the router's /health_generate probe takes the line out; the stand-in's
    control lets it recover, and the probe brings it back."""
    f = Fleet(hosts, tmp_path, b_extra='TP4_STANDIN_FAULT = "wedge"\nTP4_STANDIN_WEDGE_AFTER = "1"\n')
    a, b = f.line("a"), f.line("b")
    proc = tp4("fleet", "serve", "-f", str(f.path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    answers = []
    for _ in range(4):  # round robin: one reaches line b and hangs there
        try:
            answers.append(ask(f.fleet.url, timeout=3))
        except (TimeoutError, urllib.error.URLError):
            answers.append("hung")
    assert "hung" in answers and "42" in answers, answers
    wait_for("the router takes line b out", lambda: health_of(f) == {a.api: True, b.api: False}, 40)
    with urllib.request.urlopen(f"{b.api}/health", timeout=5) as resp:
        assert resp.status == 200  # liveness says nothing: only the generating probe saw it
    before = f.answered("a")
    assert [ask(f.fleet.url) for _ in range(4)] == ["42"] * 4
    assert f.answered("a") - before == 4
    set_wedged(b, False)
    wait_for("line b comes back", lambda: health_of(f) == {a.api: True, b.api: True}, 40)
    before = f.answered("b")
    assert [ask(f.fleet.url) for _ in range(4)] == ["42"] * 4
    assert f.answered("b") - before >= 1
    assert tp4("fleet", "stop", "-f", str(f.path)).returncode == 0
    assert_nothing_left(f)


def test_a_line_that_never_boots_leaves_the_fleet_serving_on_the_other(hosts: DoctorCluster, tmp_path: Path) -> None:
    """With an API key too: the router asks it of its clients and gives it to the lines; it is in
    no argv, no log and no command tp4 ran."""
    key = "sk-fleet-9f3c1d7e2b"
    f = Fleet(hosts, tmp_path, b_extra='TP4_STANDIN_FAULT = "crash"\nTP4_STANDIN_FAULT_RANK = "1"\n', key=key)
    a, b = f.line("a"), f.line("b")
    proc = tp4("-v", "fleet", "serve", "-f", str(f.path))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"ready: {f.fleet.url} (sglang-router, round_robin) over 1 of 2 lines: a" in proc.stdout
    assert (
        "error: 1 of 2 lines failed and are left out; the router serves a (`tp4 fleet stop` stops them):" in proc.stderr
    )
    assert re.search(r"line b: node4: rank exited: .*exit code 1", proc.stderr), proc.stderr
    assert "internal error" not in proc.stderr
    # nothing of line b is left; the router serves line a
    assert [c for h in hosts.hosts[2:] for c in hosts.containers(h)] == []
    assert health_of(f, key) == {a.api: True}
    assert ask(f.fleet.url, key=key) == "42"
    with pytest.raises(urllib.error.HTTPError) as denied:
        ask(f.fleet.url)
    assert denied.value.code == 401
    # the key: in the router's key file (mode 0600) only
    state = Path(f.fleet.router.state_dir)
    assert (state / fleet.KEY_FILE).stat().st_mode & 0o777 == 0o600
    assert "$ ssh " in proc.stderr and key not in proc.stdout + proc.stderr
    assert key not in (state / fleet.LOG_FILE).read_text()
    assert router_pids(hosts) and all(
        key not in cmd and key not in Path(f"/proc/{pid}/cmdline").read_text(errors="replace")
        for pid, cmd in router_pids(hosts).items()
    )
    status = tp4("fleet", "status", "-f", str(f.path), "--json")
    data = json.loads(status.stdout)
    assert status.returncode == 1 and [line["in_router"] for line in data["lines"]] == [True, False]
    assert b.api not in {w["url"] for w in data["router"]["workers"]}
    stop = tp4("fleet", "stop", "-f", str(f.path))
    assert stop.returncode == 0, stop.stdout + stop.stderr
    assert_nothing_left(f)
    assert not (state / fleet.KEY_FILE).exists()


def test_all_stops_every_line_when_one_fails(hosts: DoctorCluster, tmp_path: Path) -> None:
    f = Fleet(hosts, tmp_path, b_extra='TP4_STANDIN_FAULT = "crash"\nTP4_STANDIN_FAULT_RANK = "0"\n')
    proc = tp4("fleet", "serve", "-f", str(f.path), "--all")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "error: --all: 1 of 2 lines failed, so every line stops:" in proc.stderr
    assert re.search(r"^  line b: node[34]: ", proc.stderr, re.M), (
        proc.stderr
    )  # the head crashed: it, or the worker it took down
    assert "stopping the 1 lines this serve started" in proc.stderr
    assert "ready: " not in proc.stdout.replace("[a] ready: ", "")
    assert_nothing_left(f)


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_the_router_on_this_machine(hosts: DoctorCluster, tmp_path: Path) -> None:
    """router.host = "local": the router runs here (its own session), on loopback ports."""
    f = Fleet(hosts, tmp_path)
    port, metrics = free_port(), free_port()
    f.path.write_text(
        fleet_text(hosts, tmp_path, host="local", bind="127.0.0.1", port=port).replace(
            "[router.health]", f"[router.metrics]\nport = {metrics}\n\n[router.health]"
        )
    )
    f.fleet = fleet.load(f.path)
    assert f.fleet.url == f"http://127.0.0.1:{port}" and fleet.router_remote(f.fleet) is None
    proc = tp4("fleet", "serve", "-f", str(f.path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    pid = fleet.RouterHost(f.fleet, None).pid()
    assert pid is not None
    try:
        assert os.getsid(pid) == pid  # its own session: it outlives the serve
        assert [ask(f.fleet.url) for _ in range(2)] == ["42"] * 2
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=10) as resp:
            assert b"smg_worker_health" in resp.read()
        stop = tp4("fleet", "stop", "-f", str(f.path))
        assert stop.returncode == 0 and "stopped: the router on this machine and 2 lines (a, b)" in stop.stdout, (
            stop.stderr
        )
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
        assert_nothing_left(f)
    finally:
        if fleet.RouterHost(f.fleet, None).pid() == pid:  # a failed assertion left it: the router this test started
            os.kill(pid, 9)


def test_over_ssh_the_router_hosts_shell_checks_its_state_dir_and_resolves_the_default(
    hosts: DoctorCluster, tmp_path: Path
) -> None:
    """The check runs on the router's host, in the script ssh runs there: a world-writable state
    directory with a planted api-key.tmp link is refused before the key is sent, the victim
    unchanged; the default state directory is the one that host's shell resolves."""
    f = Fleet(hosts, tmp_path, key="sk-remote-topsecret-1")
    state = Path(f.fleet.router.state_dir)
    state.mkdir()
    state.chmod(0o777)
    victim = tmp_path / "victim"
    victim.write_text(VICTIM)
    (state / "api-key.tmp").symlink_to(victim)
    remote = fleet.router_remote(f.fleet)
    assert remote is not None
    with pytest.raises(Tp4Error) as err:
        fleet.RouterHost(f.fleet, remote).start([line.api for line in f.fleet.lines], Secret("sk-remote-topsecret-1"))
    assert "is writable by group or others" in err.value.message and "$ ssh" not in err.value.message
    assert "sk-remote" not in err.value.message and victim.read_text() == VICTIM
    assert sorted(p.name for p in state.iterdir()) == ["api-key.tmp"]
    f.path.write_text(fleet_text(hosts, tmp_path).replace(f"state_dir = {json.dumps(str(state))}\n", ""))
    default = fleet.load(f.path)
    assert default.router.state_dir is None
    home = process.run(["sh", "-c", 'printf "%s" "$HOME"'], remote=remote).stdout
    assert fleet.RouterHost(default, remote).state_dir == f"{home}/.local/state/tp4/router"


def test_a_router_that_does_not_start_stops_every_line(hosts: DoctorCluster, tmp_path: Path) -> None:
    f = Fleet(hosts, tmp_path)
    f.path.write_text(fleet_text(hosts, tmp_path, python=str(tmp_path / "no-such-python")))
    proc = tp4("fleet", "serve", "-f", str(f.path))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"error: the router on {hosts.hosts[0].address} exited before it was ready; its log:" in proc.stderr, (
        proc.stderr
    )
    assert "no-such-python" in proc.stderr.split("exited before it was ready")[1]
    assert "stopping the 2 lines this serve started" in proc.stderr
    assert_nothing_left(f)


def test_ctrl_c_mid_boot_stops_every_line(hosts: DoctorCluster, tmp_path: Path) -> None:
    f = Fleet(hosts, tmp_path, b_extra='TP4_STANDIN_PACE = "3"\n')
    argv = [sys.executable, "-m", "tp4", "fleet", "serve", "-f", str(f.path), "--sysfs", SYSFS]
    child = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO / "python")},
    )
    assert child.stderr is not None
    seen = []
    for text in child.stderr:  # line b is in its weight load (3 s a phase)
        seen.append(text)
        if "[b] phase: weights" in text:
            break
    else:
        pytest.fail("".join(seen))
    child.send_signal(2)
    out, err = child.communicate(timeout=120)
    assert child.returncode == 130, "".join(seen) + err
    assert "interrupted" in err and "Traceback" not in err.replace("head| Traceback", "")
    assert "ready: http" not in out.replace("[a] ready: ", "")
    assert_nothing_left(f)


# --- the fleet file -------------------------------------------------------------------------------


BASE = """preset = "production"
[cluster.head]
name = "s1"
ip = "10.0.0.1"
[[cluster.workers]]
name = "s2"
ip = "10.0.0.2"
[engine]
tp = 2
[nfs]
share = false
"""
LINE_B = """[lines.set.cluster.head]
name = "s3"
ip = "10.0.0.3"
[[lines.set.cluster.workers]]
name = "s4"
ip = "10.0.0.4"
"""


def write_fleet(tmp_path: Path, text: str, base: str = BASE) -> Path:
    (tmp_path / "base.toml").write_text(base)
    path = tmp_path / "fleet.toml"
    path.write_text(text)
    return path


def fleet_of(tmp_path: Path, router: str = "", b: str = LINE_B, top: str = "", base: str = BASE) -> Path:
    return write_fleet(
        tmp_path,
        f'base = "base.toml"\n{top}\n[[lines]]\nname = "a"\n\n[[lines]]\nname = "b"\n{b}\n'
        + (f"[router]\n{router}\n" if router else ""),
        base,
    )


def problems(path: Path) -> list[str]:
    with pytest.raises(InvalidInput) as err:
        fleet.load(path)
    return err.value.problems


def test_a_valid_fleet_of_two_two_node_lines_loads_with_the_default_router(tmp_path: Path) -> None:
    f = fleet.load(fleet_of(tmp_path))
    assert [line.name for line in f.lines] == ["a", "b"] and [len(line.plan.nodes) for line in f.lines] == [2, 2]
    r = f.router
    assert (r.kind, r.policy, r.port, r.metrics.port, r.host) == ("sglang-router", "round_robin", 30000, 29000, "local")
    assert (r.health.endpoint, r.health.timeout) == (
        "/health_generate",
        30,
    ) and r.health.timeout > fleet.SGLANG_HEALTH_TIMEOUT
    argv = fleet.router_argv(f, [line.api for line in f.lines])
    assert argv[4] == "sglang_router.launch_router" and argv[3] == ""
    assert argv[argv.index("--prometheus-host") + 1] == "127.0.0.1"
    assert fleet.load(REPO / "examples" / "fleet" / "fleet.toml").url == "http://10.0.0.1:30000"


@pytest.mark.parametrize(
    "router, b, field",
    [
        (
            "",
            '[lines.set.cluster.head]\nname = "s3"\nip = "10.0.0.3"\n[[lines.set.cluster.workers]]\nname = "s2"\nip = "10.0.0.9"\n',
            "node name 's2' is also in line a",
        ),
        (
            "",
            '[lines.set.cluster.head]\nname = "s3"\nip = "10.0.0.1"\n[[lines.set.cluster.workers]]\nname = "s4"\nip = "10.0.0.4"\n',
            "fabric IP '10.0.0.1' is also in line a",
        ),
        ('host = "10.0.0.1"\nport = 8888\n', LINE_B, "router.port: 8888 is line a's API port on 10.0.0.1"),
        (
            'host = "10.0.0.3"\n[router.metrics]\nport = 20000\n',
            LINE_B,
            "router.metrics.port: 20000 is line b's dist init port on 10.0.0.3",
        ),
        ("port = 29000\n", LINE_B, "router.metrics.port: equals router.port (29000)"),
        (
            "[router.health]\ntimeout = 20\n",
            LINE_B,
            "router.health.timeout: 20 s is not above the lines' own generating probe (20 s",
        ),
        (
            "",
            LINE_B + '[lines.set.image]\ntag = "other:tag"\n',
            "lines: the lines differ in their image (a: dsv41-4x-spark:canary-roce, b: other:tag)",
        ),
        (
            "",
            LINE_B + '[lines.set.model]\nserved_name = "other"\n',
            "lines: the lines differ in their served model name",
        ),
        ("", LINE_B + '[lines.set.api]\nkey_file = "/etc/tp4/key"\n', "lines: the lines have different api.key_file"),
        (
            "",
            LINE_B + "[lines.set.engine]\ntp = 3\n",
            "lines[1] (b): cluster.workers: 2 nodes (head + 1 worker) for engine.tp = 3",
        ),
    ],
)
def test_the_rules_between_lines_name_the_field_and_the_fix(tmp_path: Path, router: str, b: str, field: str) -> None:
    found = problems(fleet_of(tmp_path, router, b))
    assert any(field in p and "; fix: " in p for p in found), found


def test_a_line_may_raise_its_own_probe_and_the_router_must_outwait_it(tmp_path: Path) -> None:
    slow = BASE + '[env]\nSGLANG_HEALTH_CHECK_TIMEOUT = "40"\n'
    found = problems(fleet_of(tmp_path, base=slow))
    assert any(
        p.startswith("router.health.timeout: 30 s is not above the lines' own generating probe (40 s") for p in found
    ), found
    assert fleet.load(fleet_of(tmp_path, "[router.health]\ntimeout = 45\n", base=slow)).router.health.timeout == 45


def test_allowances_and_warnings(tmp_path: Path) -> None:
    mixed = LINE_B + '[lines.set.image]\ntag = "other:tag"\n'
    f = fleet.load(
        fleet_of(
            tmp_path,
            'policy = "cache_aware"\n[router.health]\nendpoint = "/health"\n',
            mixed,
            top="[allow]\nmixed_images = true\n",
        )
    )
    assert any(
        w.startswith("router.policy: cache_aware may send all shared-prefix traffic to one line") for w in f.warnings
    ), f.warnings
    assert any(w.startswith("router.health.endpoint: /health generates only while") for w in f.warnings)
    strict = tp4("fleet", "plan", "-f", str(tmp_path / "fleet.toml"), "--strict")
    assert strict.returncode == 2 and "warning(s), errors under --strict" in strict.stderr


HOSTILE_ROUTER = [
    (
        'host = "-oProxyCommand=touch /tmp/x"',
        "router.host: '-oProxyCommand=touch /tmp/x' is not a host name or IP address",
    ),
    ('host = "a\\nb"', "router.host: 'a\\nb' is not a host name"),
    ('host = "a\\u0000b"', "router.host: 'a\\x00b' is not a host name"),
    ('user = "-l root"', "router.user: '-l root' is not a valid user name"),
    ('identity = "~/.ssh/$(reboot)"', "router.identity:"),
    ('python = "relative/python"', "router.python:"),
    ('state_dir = "/var/tmp/a\\nb"', "router.state_dir:"),
    ("port = 99999999999999999999", "router.port:"),
    ("port = 0", "router.port: 0 is below the minimum 1"),
    ("port = true", "router.port: must be a whole number, got true"),
    ('port = "30000"', "router.port: must be a whole number"),
    ("port = 30000.0", "router.port: must be a whole number"),
    ('policy = "least_load"', "router.policy: 'least_load' is not allowed"),
    ('bind = "0.0.0.0 --api-key x"', "router.bind:"),
    ("[router.health]\ntimeout = false", "router.health.timeout: must be a whole number, got false"),
    ("[router.health]\ninterval = 1e300", "router.health.interval: must be a whole number"),
    ('[router.health]\nendpoint = "/health; rm -rf /"', "router.health.endpoint:"),
    ('api_key = "sk-123"', "router.api_key: unknown field; fix: never put a key in a profile"),
    ('polcy = "round_robin"', "router.polcy: unknown field; fix: did you mean 'policy'?"),
]


@pytest.mark.parametrize("router, expected", HOSTILE_ROUTER)
def test_hostile_router_values_are_refused_with_the_field(tmp_path: Path, router: str, expected: str) -> None:
    found = problems(fleet_of(tmp_path, router))
    assert any(p.startswith(expected) for p in found), found


@pytest.mark.parametrize(
    "lines, expected",
    [
        ('[[lines]]\nname = "-a"\n', "lines[0].name: '-a' is not a line name"),
        ('[[lines]]\nname = "a\\nb"\n', "lines[0].name:"),
        ('[[lines]]\nname = "a"\n[[lines]]\nname = "a"\n', "lines[1].name: 'a' is also the name of lines[0]"),
        ('[[lines]]\nname = "a"\nprofile = "nope.toml"\n', "lines[0] (a): profile"),
        ('[[lines]]\nname = "a"\nprofile = "a\\u0000b"\n', "lines[0].profile:"),
        ("lines = []\n", "lines: has 0 items, fewer than 1"),
        (
            '[[lines]]\nname = "a"\n[lines.set.cluster]\nport = true\n',
            "lines[0] (a): cluster.port: must be a whole number, got true",
        ),
        (
            '[[lines]]\nname = "a"\n[lines.set.cluster.head]\nname = "s1"\nip = "10.0.0.1"\nssh = "-oProxyCommand=x"\n',
            "lines[0] (a): cluster.head.ssh: '-oProxyCommand=x' is not a host name",
        ),
    ],
)
def test_hostile_lines_are_refused_with_the_field(tmp_path: Path, lines: str, expected: str) -> None:
    found = problems(write_fleet(tmp_path, f'base = "base.toml"\n{lines}'))
    assert any(p.startswith(expected) for p in found), found


def test_the_cli_refuses_a_bad_fleet_with_exit_2_and_no_traceback(tmp_path: Path) -> None:
    path = fleet_of(tmp_path, 'host = "-oProxyCommand=x"\nport = true\n')
    for cmd in ("plan", "status", "stop"):
        proc = tp4("fleet", cmd, "-f", str(path))
        assert proc.returncode == 2, proc.stderr
        assert (
            "router.host: '-oProxyCommand=x' is not a host name" in proc.stderr
            and "router.port: must be a whole number" in proc.stderr
        )
        assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr
    (tmp_path / "broken.toml").write_text("[[lines]\n")
    proc = tp4("fleet", "plan", "-f", str(tmp_path / "broken.toml"))
    assert proc.returncode == 2 and "is not valid TOML" in proc.stderr
    proc = tp4("fleet", "plan", "-f", str(tmp_path / "missing.toml"))
    assert proc.returncode == 2 and "fleet file" in proc.stderr and "does not exist" in proc.stderr


def test_plan_shows_no_key_and_json(tmp_path: Path) -> None:
    key = tmp_path / "key"
    key.write_text("sk-very-secret-123\n")
    key.chmod(0o600)
    keyed = BASE + f'[api]\nkey_file = "{key}"\n'
    path = fleet_of(tmp_path, base=keyed)
    f = fleet.load(path)
    argv = fleet.router_argv(f, [line.api for line in f.lines])
    assert argv[3] == f"{fleet.DEFAULT_STATE_DIR}/{fleet.KEY_FILE}" and not any("sk-very" in a for a in argv)
    for extra in ((), ("--json",)):
        proc = tp4("fleet", "plan", "-f", str(path), *extra)
        assert proc.returncode == 0, proc.stderr
        assert "sk-very-secret" not in proc.stdout + proc.stderr and str(key) in proc.stdout
    data = json.loads(tp4("fleet", "plan", "-f", str(path), "--json").stdout)
    assert data["schema"] == "tp4.fleet/1" and [line["name"] for line in data["lines"]] == ["a", "b"]
    assert data["router"]["argv"][2] == "<launcher>"


def test_the_router_as_the_nixos_unit_is_started_and_stopped_with_systemctl(tmp_path: Path) -> None:
    """router.service = "unit": tp4 fleet serve and stop drive nixosModules.tp4-router's
    tp4-router.service (its pid from systemd, its log from the journal), through sudo for a
    user other than root; the plan carries the full command the unit runs, with no key."""
    key = tmp_path / "key"
    key.write_text("sk-unit-secret-9\n")
    key.chmod(0o600)
    path = fleet_of(
        tmp_path,
        router='service = "unit"\nhost = "10.0.0.1"\nuser = "ops"\npython = "/opt/r/bin/python"',
        base=BASE + f'[api]\nkey_file = "{key}"\n',
    )
    f = fleet.load(path)
    assert f.router.service == "unit"
    assert fleet.privileged(f, fleet.unit_start_argv()) == [
        "sudo",
        "-n",
        "systemctl",
        "start",
        "--",
        "tp4-router.service",
    ]
    assert fleet.unit_stop_argv() == ["systemctl", "stop", "--", "tp4-router.service"]
    assert fleet.unit_pid_argv() == ["systemctl", "show", "--property=MainPID", "--value", "--", "tp4-router.service"]
    assert fleet.unit_log_argv(20) == [
        "journalctl",
        "--unit",
        "tp4-router.service",
        "--lines",
        "20",
        "--no-pager",
        "--output",
        "cat",
    ]
    (tmp_path / "root").mkdir()
    root = fleet.load(fleet_of(tmp_path / "root", router='service = "unit"'))
    assert fleet.privileged(root, fleet.unit_stop_argv()) == fleet.unit_stop_argv()
    data = fleet.plan_json(f)
    router = data["router"]
    assert isinstance(router, dict)
    assert router["service"] == "unit" and router["python"] == "/opt/r/bin/python"
    command = router["command"]
    assert command == fleet.router_argv(f, [line.api for line in f.lines]) and command[:3] == [
        "/opt/r/bin/python",
        "-c",
        fleet.LAUNCHER,
    ]
    assert command[3] == f"{fleet.UNIT_STATE_DIR}/{fleet.KEY_FILE}" and "sk-unit-secret" not in json.dumps(data)
    assert router["state_dir"] == "/var/lib/tp4-router"  # the unit's StateDirectory
    with pytest.raises(InvalidInput):
        fleet.load(fleet_of(tmp_path, router='service = "container"'))


# --- the router's argv: a property ----------------------------------------------------------------

WORDS = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=30)
ROUTER_VALUES = st.fixed_dictionaries(
    {},
    optional={
        "kind": st.sampled_from(["sglang-router", "smg"]) | WORDS,
        "host": st.sampled_from(["local", "10.0.0.9", "spark9", "::1"]) | WORDS,
        "bind": st.sampled_from(["0.0.0.0", "::", "10.0.0.9"]) | WORDS,
        "port": st.integers(-5, 70000) | st.booleans() | WORDS,
        "policy": st.sampled_from(["round_robin", "cache_aware", "power_of_two", "random"]) | WORDS,
        "python": st.sampled_from(["/opt/v/bin/python", "/usr/bin/python3"]) | WORDS,
        "state_dir": st.sampled_from(["/var/tmp/r", "/srv/tp4 router"]) | WORDS,
        "stop_grace": st.integers(-1, 4000),
        "health": st.fixed_dictionaries(
            {},
            optional={
                "endpoint": st.sampled_from(["/health_generate", "/health"]) | WORDS,
                "timeout": st.integers(0, 4000),
                "interval": st.integers(0, 4000),
                "failure_threshold": st.integers(0, 1001),
                "success_threshold": st.integers(0, 1001),
            },
        ),
        "metrics": st.fixed_dictionaries({}, optional={"port": st.integers(0, 70000) | st.booleans()}),
    },
)
API_HOSTS = st.sampled_from(["10.0.0.1", "spark1", "fe80::1"]) | st.text(
    st.sampled_from("ab-.:1$ ;\n"), min_size=1, max_size=12
)


@settings(max_examples=200, deadline=None)
@given(
    values=ROUTER_VALUES,
    hosts=st.lists(API_HOSTS, min_size=1, max_size=4),
    port=st.integers(1, 65535),
    key=st.booleans(),
)
def test_no_fleet_value_changes_the_router_argv_except_in_its_own_field(
    values: dict[str, object], hosts: list[str], port: int, key: bool
) -> None:
    from pydantic import ValidationError

    from tp4.line.profile.models import _check_host

    try:
        file = fleet.FleetFile.model_validate({"lines": [{"name": "a"}], "router": values})
    except ValidationError:
        return  # refused: nothing is run
    urls = []
    for host in hosts:
        try:
            urls.append(f"http://{_check_host(host)}:{port}")  # a line's API: its head's checked address
        except ValueError:
            continue
    f = fleet.Fleet("fleet.toml", file, (), (), "/etc/tp4/key" if key else None)
    r, h = f.router, f.router.health
    argv = fleet.router_argv(f, urls)
    expected = [
        r.python or sys.executable,
        "-c",
        fleet.LAUNCHER,
        f"{fleet.state_dir_of(f) or fleet.DEFAULT_STATE_DIR}/api-key" if key else "",
        fleet.ROUTERS[r.kind].module,
        "--host",
        r.bind,
        "--port",
        str(r.port),
        "--worker-urls",
        *urls,
        "--policy",
        r.policy,
        "--health-check-endpoint",
        h.endpoint,
        "--health-check-timeout-secs",
        str(h.timeout),
        "--health-check-interval-secs",
        str(h.interval),
        "--health-failure-threshold",
        str(h.failure_threshold),
        "--health-success-threshold",
        str(h.success_threshold),
        "--prometheus-host",
        "127.0.0.1",
        "--prometheus-port",
        str(r.metrics.port),
        "--shutdown-grace-period-secs",
        str(r.stop_grace),
        "--log-level",
        "info",
    ]
    assert argv == expected
    # every value is one word that is no option of the router: only tp4's flags start with '-'
    flags = [a for a in argv[5:] if a.startswith("-")]
    assert flags == [a for a in expected[5:] if a.startswith("--")]
    assert all("\n" not in a and "\0" not in a for a in argv[3:])


# --- the router's state directory: nobody else's ---------------------------------------------------

VICTIM = "the victim's own file\n"


def local_router(tmp_path: Path, state_dir: Path | None) -> fleet.RouterHost:
    """A router on this machine whose "Python" is true(1): start writes the key file and the log,
    then runs nothing."""
    text = 'host = "local"\npython = "/bin/true"' + (f"\nstate_dir = {json.dumps(str(state_dir))}" if state_dir else "")
    return fleet.RouterHost(fleet.load(fleet_of(tmp_path, router=text)), None)


def test_the_default_state_dir_is_the_router_users_xdg_state_dir_not_var_tmp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    f = fleet.load(fleet_of(tmp_path))
    assert f.router.state_dir is None and fleet.plan_json(f)["router"]["state_dir"] == fleet.DEFAULT_STATE_DIR
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert fleet.RouterHost(f, None).state_dir == f"{tmp_path}/xdg/tp4/router"
    monkeypatch.setenv("XDG_STATE_HOME", "relative")  # not absolute: ignored (XDG base directory spec)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert fleet.RouterHost(f, None).state_dir == f"{tmp_path}/home/.local/state/tp4/router"
    monkeypatch.delenv("XDG_STATE_HOME")
    host = fleet.RouterHost(f, None)
    assert host.pid() is None  # nothing runs; the directory is the home's
    assert host.state_dir == f"{tmp_path}/home/.local/state/tp4/router"


def test_a_world_writable_state_dir_with_a_planted_key_link_is_refused_and_the_victim_never_gets_the_key(
    tmp_path: Path,
) -> None:
    """Another user made the state directory first, world-writable, with api-key.tmp (and
    api-key) symlinks to a file of theirs: the start is refused naming the fix, and the victim
    neither changes nor receives the key."""
    d = tmp_path / "shared"
    d.mkdir()
    d.chmod(0o777)
    victim = tmp_path / "victim"
    victim.write_text(VICTIM)
    (d / "api-key.tmp").symlink_to(victim)
    host = local_router(tmp_path, d)
    with pytest.raises(Tp4Error) as err:
        host.start(["http://10.0.0.1:8888"], Secret("sk-planted-123"))
    assert f"{d} is writable by group or others" in err.value.message and f"chmod go-w -- {d}" in err.value.message
    assert "sk-planted" not in err.value.message
    assert victim.read_text() == VICTIM and sorted(p.name for p in d.iterdir()) == ["api-key.tmp"]
    d.chmod(0o770)  # group-writable: refused as well
    with pytest.raises(Tp4Error, match="writable by group or others"):
        host.start(["http://10.0.0.1:8888"], None)
    assert not (d / "router.log").exists()


def test_a_state_dir_of_another_user_or_a_symlink_is_refused(tmp_path: Path) -> None:
    # giving a directory to another user takes root, as the suite runs (.ci/run, tests/run)
    assert os.geteuid() == 0, "run the suite as root: this test gives a directory to another user"
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, 65534, 65534)
    with pytest.raises(Tp4Error, match="belongs to another user"):
        local_router(tmp_path, theirs).start(["http://10.0.0.1:8888"], Secret("sk-x-1"))
    assert list(theirs.iterdir()) == []
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(mine)
    with pytest.raises(Tp4Error, match="is a symbolic link"):
        local_router(tmp_path, tmp_path / "link").start(["http://10.0.0.1:8888"], Secret("sk-x-1"))
    assert list(mine.iterdir()) == []


def test_in_its_own_state_dir_the_key_replaces_planted_links_and_a_linked_log_is_not_truncated(tmp_path: Path) -> None:
    """Links at api-key, api-key.tmp and router.log (as an old, insecure directory may hold):
    the key file replaces its link (the victims unchanged, mode 0600), and a linked log refuses
    the start instead of truncating its target."""
    d = tmp_path / "state"
    d.mkdir(mode=0o700)
    victims = {name: tmp_path / f"victim-{name}" for name in ("api-key", "api-key.tmp", "router.log")}
    for name, victim in victims.items():
        victim.write_text(VICTIM)
        (d / name).symlink_to(victim)
    host = local_router(tmp_path, d)
    with pytest.raises(Tp4Error, match="router.log is a symbolic link"):
        host.start(["http://10.0.0.1:8888"], Secret("sk-mine-42"))
    assert all(v.read_text() == VICTIM for v in victims.values())
    key = d / "api-key"
    assert not key.is_symlink() and key.read_text() == "sk-mine-42" and (key.stat().st_mode & 0o777) == 0o600
    assert sorted(p.name for p in d.iterdir()) == ["api-key", "api-key.tmp", "router.log"]  # no temporary left
    (d / "router.log").unlink()
    assert host.start(["http://10.0.0.1:8888"], None).startswith("started ")
    log = d / "router.log"
    assert not log.is_symlink() and (log.stat().st_mode & 0o777) == 0o600
    assert all(v.read_text() == VICTIM for v in victims.values())


def test_a_missing_state_dir_is_made_private(tmp_path: Path) -> None:
    d = tmp_path / "new" / "state"
    local_router(tmp_path, d).start(["http://10.0.0.1:8888"], Secret("sk-new-7"))
    assert (d.stat().st_mode & 0o777) == 0o700 and (d / "api-key").read_text() == "sk-new-7"
