"""The stand-in engine (tests/standin/engine.py) against the plan it stands in for: the embedded
default profile's rendered plan, its env and argv verbatim. The four ranks run on this host in a
network namespace whose loopback holds the head's fabric IP (10.0.0.1: the dist init address and
the API port are the plan's, and nothing collides with the host's ports); one test runs rank 0 in
podman from the stand-in test image (tests/standin/image.py) in that namespace's network.
Needs root and iproute2 (and podman, runc for the image test)."""

from __future__ import annotations

import ctypes
import json
import os
import re
import signal
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from netns_hosts import storage_conf
from standin import image
from test_bench import MODEL, Standin
from standin.engine import B12X_NEXT, FAULTS, QUESTION

from tp4.core import process
from tp4.line.container import IMAGE, MOUNTS
from tp4.line.plan import Plan, build_plan
from tp4.line.profile.load import load_default
from tp4.serving.serve import env_file_text

ENGINE = Path(__file__).resolve().parent / "standin" / "engine.py"
PYTHON = "/usr/bin/python3"
KEY = "sk-standin-0123456789"
CLONE_NEWNET = 0x40000000


@pytest.fixture(scope="module")
def plan() -> Plan:
    return build_plan(load_default())


@pytest.fixture(scope="module")
def netns(plan: Plan) -> Iterator[str]:
    name = f"tp4s{os.getpid() % 100000}"
    process.run(["ip", "netns", "add", name])
    try:
        process.run(["ip", "netns", "exec", name, "ip", "link", "set", "lo", "up"])
        for node in plan.nodes[:1]:
            process.run(["ip", "netns", "exec", name, "ip", "addr", "add", f"{node.host}/32", "dev", "lo"])
        yield name
    finally:
        process.run(["ip", "netns", "del", name], check=False)


def in_netns(ns: str, fn: Callable[[], Any]) -> Any:
    """fn() in a thread that joined the namespace (setns moves only the calling thread)."""
    libc = ctypes.CDLL(None, use_errno=True)
    out: dict[str, Any] = {}

    def run() -> None:
        fd = os.open(f"/run/netns/{ns}", os.O_RDONLY)
        try:
            if libc.setns(fd, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "setns")
        finally:
            os.close(fd)
        try:
            out["value"] = fn()
        except BaseException as exc:  # re-raised in the caller
            out["error"] = exc

    t = threading.Thread(target=run)
    t.start()
    t.join()
    if "error" in out:
        raise out["error"]
    return out.get("value")


class Rank:
    def __init__(self, rank: int, proc: subprocess.Popen[bytes], log: Path) -> None:
        self.rank, self.proc, self.log = rank, proc, log

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, needle: str, timeout: float = 10) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if needle in self.text():
                return True
            if self.proc.poll() is not None:
                return needle in self.text()
            time.sleep(0.02)
        return False


class Line:
    """The plan's ranks, started like containers (the rank's env and `run`, nothing else), in ns."""

    def __init__(self, plan: Plan, ns: str, root: Path) -> None:
        self.plan, self.ns, self.root = plan, ns, root
        self.ranks: list[Rank] = []
        model = root / MOUNTS.model.lstrip("/")
        model.mkdir(parents=True, exist_ok=True)
        (model / "config.json").write_text("{}\n")
        commit, patch = image.b12x_next_stamps()
        stamps = root / IMAGE.b12x_next.lstrip("/") / "b12x_next"
        stamps.mkdir(parents=True, exist_ok=True)
        (stamps / "SOURCE_COMMIT").write_text(commit + "\n")
        (stamps / "SOURCE_PATCH").write_text(patch + "\n")

    def controls(self, rank: int) -> dict[str, str]:
        return {
            "PATH": "/usr/bin:/bin",
            "TP4_STANDIN_ROOT": str(self.root / f"rank{rank}"),
            "TP4_STANDIN_PACE": "0.05",
            "TP4_STANDIN_COLOCATED": "1",
        }

    def start(self, rank: int, extra: dict[str, str] | None = None, drop: tuple[str, ...] = ()) -> Rank:
        env = {**self.plan.nodes[rank].env, **self.controls(rank), **(extra or {})}
        for key in drop:
            env.pop(key)
        rroot = Path(env["TP4_STANDIN_ROOT"])
        if not rroot.exists():
            rroot.mkdir(parents=True)
            for part in ("models", "opt"):
                (rroot / part).symlink_to(self.root / part)
        log = self.root / f"rank{rank}.log"
        out = open(log, "wb")
        proc = subprocess.Popen(
            ["ip", "netns", "exec", self.ns, PYTHON, "-u", str(ENGINE), *self.plan.nodes[rank].run.command],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        out.close()
        r = Rank(rank, proc, log)
        self.ranks.append(r)
        return r

    def start_all(self, extra: dict[str, str] | None = None, head: dict[str, str] | None = None) -> list[Rank]:
        return [self.start(i, {**(extra or {}), **(head or {} if i == 0 else {})}) for i in range(len(self.plan.nodes))]

    def stop(self) -> None:
        for r in self.ranks:
            if r.proc.poll() is None:
                os.killpg(r.proc.pid, signal.SIGKILL)
            r.proc.wait()


@pytest.fixture
def line(plan: Plan, netns: str) -> Iterator[Line]:
    root = Path(tempfile.mkdtemp(prefix="tp4-standin-root-"))
    ln = Line(plan, netns, root)
    try:
        yield ln
    finally:
        ln.stop()
        subprocess.run(["rm", "-rf", str(root)], check=False)


def request(
    ns: str, path: str, body: dict[str, Any] | None = None, key: str | None = KEY, timeout: float = 5, port: int = 8888
) -> tuple[int, bytes]:
    def go() -> tuple[int, bytes]:
        headers = {"Content-Type": "application/json"}
        if key:
            headers["Authorization"] = f"Bearer {key}"
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(f"http://10.0.0.1:{port}{path}", data=data, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    return in_netns(ns, go)


def ask(
    ns: str, max_tokens: int = 32, stream: bool = False, key: str | None = KEY, timeout: float = 5
) -> tuple[int, bytes]:
    return request(
        ns,
        "/v1/chat/completions",
        {
            "model": "deepseek-v4.1-flash",
            "messages": [{"role": "user", "content": QUESTION}],
            "temperature": 0,
            "max_tokens": max_tokens,
            "stream": stream,
        },
        key,
        timeout,
    )


def missing(plan: Plan, log: str, required_only: bool = True) -> list[str]:
    return [bl.text for bl in plan.boot_lines if (bl.required or not required_only) and not re.search(bl.pattern, log)]


def forbidden(plan: Plan, log: str) -> list[str]:
    return [f for f in plan.forbidden_lines if f in log]


def ready(r: Rank, timeout: float = 15) -> None:
    assert r.wait_for("Ready: API on port", timeout), r.text()[-3000:]


# --- the healthy line -------------------------------------------------------------------------------


def test_boot_log_matches_the_plan_and_the_api_answers(plan: Plan, line: Line) -> None:
    ranks = line.start_all(head={"API_KEY": KEY})
    ready(ranks[0])
    head = ranks[0].text()
    assert missing(plan, head, required_only=False) == []
    assert re.search(r"^Ready: API on port 8888 \(rank 0\)\. Key is in /state/api-key\.$", head, re.M)
    commits = set()
    for r in ranks:
        assert r.wait_for("Scheduler ready" if r.rank else "Ready:"), r.text()
        log = r.text()
        assert forbidden(plan, log) == [] and KEY not in log
        commits.add(tuple(re.findall(r"SOURCE_(?:COMMIT|PATCH) b12x_next \S+", log)))
        # boot.py's argv, rebuilt by the stand-in from the env alone, is the plan's argv
        launch = json.loads((Path(line.controls(r.rank)["TP4_STANDIN_ROOT"]) / "state" / "launch.json").read_text())
        assert launch["args"] == list(plan.nodes[r.rank].argv) and KEY not in json.dumps(launch)
    assert len(commits) == 1 and len(next(iter(commits))) == 2
    # warm-up: every request a prefill batch with an input throughput, then Warm-up done
    warm = head.split("The server is fired up and ready to roll!")[1].split("Warm-up done in")[0]
    rates = [float(x) for x in re.findall(r"input throughput \(token/s\): ([0-9.]+)", warm)]
    assert len(rates) >= 5 and 300 < sorted(rates)[len(rates) // 2] < 800
    assert re.search(r"max_total_num_tokens=8000000, chunked_prefill_size=4096, .* max_running_requests=16", head)
    assert "full_token=9000000" in head

    ns = line.ns
    assert request(ns, "/health", key=None)[0] == 200
    assert request(ns, "/v1/models", key=None)[0] == 401
    assert request(ns, "/v1/models", key="wrong")[0] == 401
    assert ask(ns, key=None)[0] == 401
    status, body = request(ns, "/v1/models")
    assert status == 200 and json.loads(body)["data"][0]["id"] == "deepseek-v4.1-flash"
    status, body = request(ns, "/get_load")
    assert status == 200 and json.loads(body)[0]["num_waiting_reqs"] == 0
    status, body = request(ns, "/v1/loads")
    assert json.loads(body)["loads"][0]["num_running_reqs"] == 0
    status, body = ask(ns)
    out = json.loads(body)
    assert (
        status == 200
        and out["choices"][0]["message"]["content"] == "42"
        and out["choices"][0]["finish_reason"] == "stop"
    )
    out = json.loads(ask(ns, max_tokens=1)[1])
    assert out["usage"]["completion_tokens"] == 1 and out["choices"][0]["finish_reason"] == "length"
    status, body = ask(ns, stream=True)
    events = [e.removeprefix("data: ") for e in body.decode().split("\n\n") if e]
    assert status == 200 and events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == "42"
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    # TERM: every rank exits promptly
    started = time.monotonic()
    for r in ranks:
        os.killpg(r.proc.pid, signal.SIGTERM)
    for r in ranks:
        r.proc.wait(timeout=5)
    assert time.monotonic() - started < 3


def test_a_gate_missing_from_a_ranks_env_is_a_missing_line(plan: Plan, line: Line) -> None:
    """The lines come from the env the rank got: a plan that fails to arm a gate shows."""
    ranks = [line.start(0, drop=("DSV41_HC_FUSED",)), *(line.start(i) for i in range(1, 4))]
    ready(ranks[0])
    assert missing(plan, ranks[0].text()) == ["DSV41 hc_fused: first call (4096 rows) bit-identical to stock"]


def test_without_the_tp4_launcher_its_adapters_stay_silent(plan: Plan, line: Line) -> None:
    ranks = [line.start(0, drop=("DSV41_LAUNCHER",)), *(line.start(i) for i in range(1, 4))]
    ready(ranks[0])
    gone = missing(plan, ranks[0].text())
    assert "DSV41 shared-expert padding K: ... (5120, 576) -> (5120, 640)" in gone
    assert "Initialized DSpark draft runner. ... gamma=5, verify_num_draft_tokens=6" not in gone


# --- what the engine refuses ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "code", "message"),
    [
        (
            {"EXTRA_SGLANG_ARGS": "--sleep-on-idle --bogus-flag 1"},
            2,
            "launch_server.py: error: unrecognized arguments: --bogus-flag 1",
        ),
        ({"MEM_FRACTION_STATIC": ""}, 2, "argument --mem-fraction-static: invalid float value: ''"),
        ({"CONTEXT_LENGTH": "2048"}, 1, "CONTEXT_LENGTH=2048 is outside 4096..1048576"),
        ({"NODE_RANK": "4"}, 1, "NODE_RANK=4 is not a rank of NNODES=4"),
        ({"DIST_INIT_ADDR": ""}, 1, "NNODES=4 needs DIST_INIT_ADDR"),
        ({"OFFLOAD_MODE": "disk"}, 1, "OFFLOAD_MODE='disk' is not nvme or ram"),
        ({"TP4_STANDIN_FAULT": "explode"}, 2, "TP4_STANDIN_FAULT: unknown fault explode"),
    ],
)
def test_bad_env_or_argv_is_refused_like_the_engine(
    line: Line, change: dict[str, str], code: int, message: str
) -> None:
    r = line.start(0, change)
    assert r.proc.wait(timeout=10) == code
    assert message in r.text()
    assert "Ready:" not in r.text()


def test_without_the_checkpoint_boot_refuses(plan: Plan, line: Line) -> None:
    (line.root / MOUNTS.model.lstrip("/") / "config.json").unlink()
    r = line.start(1)
    assert r.proc.wait(timeout=10) == 1
    assert f"{MOUNTS.model}/config.json not found" in r.text()


def test_usage_of_the_entrypoint() -> None:
    proc = subprocess.run([PYTHON, str(ENGINE), "launch"], capture_output=True, text=True, check=False)
    assert proc.returncode == 2 and "usage: boot.py {run,prepare,health,smoke}" in proc.stderr


# --- fault modes ------------------------------------------------------------------------------------


def test_the_engine_reads_the_image_paths_of_the_line() -> None:
    assert B12X_NEXT == IMAGE.b12x_next
    files = image._files()
    assert files[IMAGE.boot] == ENGINE and IMAGE.boot.startswith(IMAGE.runtime + "/")
    assert f"{IMAGE.b12x_next}/b12x_next/SOURCE_COMMIT" in files


def test_faults_are_documented() -> None:
    doc = ENGINE.read_text().split('"""')[1]
    for fault in FAULTS:
        assert re.search(rf"^  {re.escape(fault)}\s", doc, re.M), fault


def test_omit_line(plan: Plan, line: Line) -> None:
    ranks = line.start_all({"TP4_STANDIN_FAULT": "omit-line"})
    ready(ranks[0])
    first = next(bl.text for bl in plan.boot_lines if bl.required and bl.adapter != "engine")
    assert missing(plan, ranks[0].text()) == [first]


def test_forbidden_line(plan: Plan, line: Line) -> None:
    ranks = line.start_all({"TP4_STANDIN_FAULT": "forbidden", "TP4_STANDIN_FAULT_RANK": "2"})
    ready(ranks[0])
    assert ranks[2].wait_for("Scheduler ready")
    assert forbidden(plan, ranks[2].text()) == ["MISMATCH"]
    assert forbidden(plan, ranks[0].text()) == []


def test_crash_of_the_head(line: Line) -> None:
    ranks = line.start_all({"TP4_STANDIN_FAULT": "crash"})
    assert ranks[0].proc.wait(timeout=10) == 1
    assert "Traceback" in ranks[0].text() and "Ready:" not in ranks[0].text()
    # the workers lose their group and go down too
    for r in ranks[1:]:
        assert r.proc.wait(timeout=10) == 1 and "NCCL communicator was aborted" in r.text()


def test_crash_of_a_worker_takes_the_head_down(line: Line) -> None:
    ranks = line.start_all({"TP4_STANDIN_FAULT": "crash", "TP4_STANDIN_FAULT_RANK": "3"})
    assert ranks[3].proc.wait(timeout=10) == 1
    assert ranks[0].proc.wait(timeout=10) == 1
    assert "Traceback" in ranks[0].text() and "Ready:" not in ranks[0].text()


def test_hang_before_ready(line: Line) -> None:
    ranks = line.start_all({"TP4_STANDIN_FAULT": "hang"})
    assert ranks[0].wait_for("max_total_num_tokens=")
    time.sleep(0.5)
    assert ranks[0].proc.poll() is None and "Ready:" not in ranks[0].text()
    with pytest.raises(OSError):
        request(line.ns, "/health", key=None, timeout=1)
    os.killpg(ranks[0].proc.pid, signal.SIGTERM)
    ranks[0].proc.wait(timeout=5)


def test_wedge_health_200_while_completions_hang(line: Line) -> None:
    ranks = line.start_all({"TP4_STANDIN_FAULT": "wedge"})
    ready(ranks[0])  # boot.py's own smoke and warm-up went through
    assert request(line.ns, "/health", key=None)[0] == 200
    with pytest.raises(OSError):  # a timeout
        ask(line.ns, max_tokens=1, timeout=1)
    load = json.loads(request(line.ns, "/v1/loads")[1])["loads"][0]
    assert (load["num_running_reqs"], load["num_waiting_reqs"]) == (0, 0)


def test_busy_is_not_wedged(line: Line) -> None:
    ranks = line.start_all({"TP4_STANDIN_FAULT": "busy", "TP4_STANDIN_BUSY_SECONDS": "1.5"})
    ready(ranks[0])
    load = json.loads(request(line.ns, "/v1/loads")[1])["loads"][0]
    assert load["num_running_reqs"] >= 3 and load["num_waiting_reqs"] == 1
    started = time.monotonic()
    assert json.loads(ask(line.ns, max_tokens=1)[1])["choices"][0]["message"]["content"] == "42"
    assert time.monotonic() - started >= 1.4


def test_slow_boot_and_retune(line: Line) -> None:
    ranks = line.start_all({"TP4_STANDIN_FAULT": "slow,retune"})
    ready(ranks[0])
    head = ranks[0].text()
    rates = [float(x) for x in re.findall(r"input throughput \(token/s\): ([0-9.]+)", head)]
    assert rates and max(rates) < 50
    assert "tuning from scratch" in head


def test_one_rank_differs_in_its_commit_line(plan: Plan, line: Line) -> None:
    ranks = line.start_all({"TP4_STANDIN_FAULT": "commit"})
    ready(ranks[0])
    assert ranks[3].wait_for("Scheduler ready")
    commit = [re.findall(r"SOURCE_COMMIT b12x_next (\S+)", r.text()) for r in ranks]
    assert commit[0] == commit[1] == commit[2] != commit[3]
    armed = next(bl for bl in plan.boot_lines if bl.text.startswith("[moe_b12x_next] armed"))
    assert re.search(armed.pattern, ranks[0].text()) and not re.search(armed.pattern, ranks[3].text())


def test_ignore_term_needs_kill(line: Line) -> None:
    ranks = line.start_all({"TP4_STANDIN_FAULT": "ignore-term", "TP4_STANDIN_FAULT_RANK": "1"})
    ready(ranks[0])
    os.killpg(ranks[1].proc.pid, signal.SIGTERM)
    time.sleep(0.7)
    assert ranks[1].proc.poll() is None
    os.killpg(ranks[1].proc.pid, signal.SIGKILL)
    assert ranks[1].proc.wait(timeout=5) == -signal.SIGKILL
    assert ranks[0].proc.wait(timeout=5) == 1  # the head loses its group


# --- in podman, from the test image -----------------------------------------------------------------


def test_in_podman_from_the_test_image(plan: Plan, line: Line, tmp_path: Path) -> None:
    store = Path(tempfile.mkdtemp(prefix="tp4s-", dir="/tmp"))
    conf = tmp_path / "containers.conf"
    conf.write_text('[containers]\ndefault_ulimits = ["nofile=1024:1024", "nproc=4096:4096"]\n')
    env = {"CONTAINERS_STORAGE_CONF": str(storage_conf(store)), "CONTAINERS_CONF": str(conf)}
    name = f"tp4-standin-{os.getpid()}"
    try:
        ref = image.load(env, tag=plan.image.tag)
        state = tmp_path / "state"
        state.mkdir()
        (state / "api-key").write_text(KEY + "\n")
        (tmp_path / "rank0.env").write_text(
            env_file_text(plan.nodes[0]._replace(env={**plan.nodes[0].env, "TP4_STANDIN_PACE": "0.05"}), {})
        )
        os.chmod(tmp_path / "rank0.env", 0o600)
        model = line.root / MOUNTS.model.lstrip("/")
        log = open(tmp_path / "podman.log", "wb")
        # the namespace's network as the container's (the line's --network host, on this test's
        # host): `ip netns exec podman` would remount /sys, where runc finds the cgroups
        proc = subprocess.Popen(
            [
                "podman",
                "run",
                "--rm",
                "--name",
                name,
                "--network",
                f"ns:/run/netns/{line.ns}",
                "--env-file",
                str(tmp_path / "rank0.env"),
                "-v",
                f"{model}:{MOUNTS.model}:ro",
                "-v",
                f"{state}:{MOUNTS.state}",
                ref,
                *plan.nodes[0].run.command,
            ],
            env={**os.environ, **env},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        head = Rank(0, proc, tmp_path / "podman.log")
        line.ranks.append(head)
        for i in range(1, 4):
            line.start(i)
        ready(head, timeout=60)
        assert missing(plan, head.text()) == []
        assert request(line.ns, "/health", key=None)[0] == 200
        out = json.loads(ask(line.ns)[1])
        assert out["choices"][0]["message"]["content"] == "42"
        assert json.loads((state / "launch.json").read_text())["args"] == list(plan.nodes[0].argv)
        process.run(["podman", "stop", "-t", "5", name], env=env)
        assert proc.wait(timeout=15) in (0, 143)
    finally:
        process.run(["podman", "rm", "-f", name], env=env, check=False)
        process.run(["podman", "rmi", "-a", "-f"], env=env, check=False)
        subprocess.run(["rm", "-rf", str(store)], check=False)


# --- the engine's API boundary, as clients (tp4 bench, SGLang's bench_serving) meet it -------------------------


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Callable[..., Standin]]:
    started: list[Standin] = []

    def go(*extra: str, **env: str) -> Standin:
        started.append(Standin(tmp_path, env, extra))
        return started[-1]

    try:
        yield go
    finally:
        for e in started:
            e.stop()


def post(conn: Any, path: str, body: dict[str, Any]) -> tuple[Any, list[tuple[float, dict[str, Any]]] | dict[str, Any]]:
    """POST on an open http.client connection: (response, its SSE events with their arrival times,
    or its JSON body)."""
    started = time.monotonic()
    conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if not body.get("stream"):
        return resp, json.loads(resp.read())
    events: list[tuple[float, dict[str, Any]]] = []
    while line := resp.readline():
        text = line.decode().strip()
        if text.startswith("data: ") and text != "data: [DONE]":
            events.append((time.monotonic() - started, json.loads(text[6:])))
    return resp, events


def chat(prompt: str = "Say something.", **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": prompt}], **extra}


def test_max_completion_tokens_is_the_limit_as_sglang_reads_it(engine: Callable[..., Standin]) -> None:
    import http.client

    e = engine()
    conn = http.client.HTTPConnection("127.0.0.1", e.port, timeout=10)
    # SGLang's bench_serving asks max_completion_tokens with ignore_eos: exactly that many
    _, out = post(conn, "/v1/chat/completions", chat(max_completion_tokens=10, ignore_eos=True))
    assert isinstance(out, dict) and out["usage"]["completion_tokens"] == 10
    assert out["choices"][0]["finish_reason"] == "length"
    # without ignore_eos the answer is cut at it; it wins over max_tokens
    _, out = post(conn, "/v1/chat/completions", chat(max_completion_tokens=4, max_tokens=100))
    assert isinstance(out, dict) and out["usage"]["completion_tokens"] == 4
    assert len(out["choices"][0]["message"]["content"].split()) == 4
    _, out = post(conn, "/v1/chat/completions", chat(max_tokens=3))
    assert isinstance(out, dict) and out["usage"]["completion_tokens"] == 3


def test_completions_api_plain_and_streamed(engine: Callable[..., Standin]) -> None:
    import http.client

    e = engine()
    conn = http.client.HTTPConnection("127.0.0.1", e.port, timeout=10)
    resp, out = post(conn, "/v1/completions", {"model": MODEL, "prompt": QUESTION, "max_tokens": 8})
    assert resp.status == 200 and isinstance(out, dict)
    assert out["object"] == "text_completion" and out["choices"][0]["text"].strip() == "42"
    assert out["choices"][0]["finish_reason"] == "stop" and out["usage"]["completion_tokens"] == 2
    body = {"model": MODEL, "prompt": ["Tell", "me"], "max_tokens": 7, "ignore_eos": True, "stream": True}
    body["stream_options"] = {"include_usage": True}
    resp, events = post(conn, "/v1/completions", body)
    assert resp.status == 200 and isinstance(events, list)
    docs = [d for _, d in events]
    assert {d["object"] for d in docs} == {"text_completion"}
    assert all("delta" not in d["choices"][0] for d in docs)
    assert len("".join(d["choices"][0]["text"] for d in docs).split()) == 7
    assert docs[-1]["choices"][0]["finish_reason"] == "length" and docs[-1]["usage"]["completion_tokens"] == 7
    assert post(conn, "/v1/embeddings", {"input": "x"})[0].status == 404


def test_every_streamed_request_is_paced_on_a_kept_alive_connection(engine: Callable[..., Standin]) -> None:
    import http.client

    e = engine(TP4_STANDIN_DECODE_TPS="60", TP4_STANDIN_TOKENS_PER_EVENT="3", TP4_STANDIN_TTFT_SECONDS="0.2")
    conn = http.client.HTTPConnection("127.0.0.1", e.port, timeout=10)
    sockets = []
    # a plain request (neither ignore_eos nor min_tokens) is paced as a benchmark's is
    for extra in ({}, {"ignore_eos": True}):
        resp, events = post(conn, "/v1/chat/completions", chat(max_tokens=12, stream=True, **extra))
        assert resp.status == 200 and resp.getheader("Transfer-Encoding") == "chunked"
        assert resp.getheader("Connection") != "close" and not resp.will_close
        sockets.append(conn.sock)
        assert isinstance(events, list)
        content = [
            (t, d["choices"][0]["delta"]["content"]) for t, d in events if d["choices"][0]["delta"].get("content")
        ]
        assert [len(c.split()) for _, c in content] == [3, 3, 3, 3]
        first, last = content[0][0], content[-1][0]
        assert first >= 0.19, first  # the TTFT floor
        assert last - first >= 3 * 3 / 60 - 0.02, (first, last)  # three gaps of 3 tokens at 60 tok/s
    assert sockets[0] is sockets[1]  # the second request went on the same connection


def test_requests_beyond_max_running_requests_wait_first_in_first_out(engine: Callable[..., Standin]) -> None:
    """As SGLang's scheduler: at most --max-running-requests run; the next wait in the queue, counted
    waiting on /v1/loads, /get_load and /metrics, and run in their order as running ones finish; a
    waiting request whose client leaves never runs."""
    import http.client
    import socket

    e = engine("--max-running-requests", "2", "--enable-metrics", TP4_STANDIN_DECODE_TPS="30")

    def loads() -> tuple[int, int, int, str]:
        with urllib.request.urlopen(f"http://127.0.0.1:{e.port}/v1/loads", timeout=5) as resp:
            load = json.loads(resp.read())["loads"][0]
        with urllib.request.urlopen(f"http://127.0.0.1:{e.port}/get_load", timeout=5) as resp:
            waiting = json.loads(resp.read())[0]["num_waiting_reqs"]
        with urllib.request.urlopen(f"http://127.0.0.1:{e.port}/metrics", timeout=5) as resp:
            metrics = resp.read().decode()
        assert load["max_running_requests"] == 2
        return load["num_running_reqs"], load["num_waiting_reqs"], waiting, metrics

    def until(want: tuple[int, int]) -> str:
        deadline = time.monotonic() + 20
        while True:
            running, waiting, waiting2, metrics = loads()
            if (running, waiting) == want:
                assert waiting2 == waiting
                return metrics
            assert time.monotonic() < deadline, (running, waiting, want)
            time.sleep(0.02)

    order: list[str] = []
    lock = threading.Lock()

    def stream(name: str, tokens: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", e.port, timeout=30)
        conn.request("POST", "/v1/chat/completions", json.dumps(chat(max_tokens=tokens, ignore_eos=True, stream=True)))
        resp = conn.getresponse()
        resp.readline()  # the first event: the request runs
        with lock:
            order.append(name)
        resp.read()
        conn.close()

    # two long ones fill the batch: 3 s and 10 s at 30 tokens/s
    threads = [threading.Thread(target=stream, args=(f"long {n}", n)) for n in (90, 300)]
    for t in threads:
        t.start()
    until((2, 0))
    # a waiting request whose client goes away leaves the queue
    body = json.dumps(chat(max_tokens=3)).encode()
    gone = socket.create_connection(("127.0.0.1", e.port))
    gone.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    )
    metrics = until((2, 1))
    assert re.search(r"^sglang:num_queue_reqs\{.*\} 1\.0$", metrics, re.M), metrics
    assert re.search(r"^sglang:num_running_reqs\{.*\} 2\.0$", metrics, re.M), metrics
    gone.close()
    until((2, 0))
    # two more wait, and run one after the other in their order as the shorter long one finishes
    for name in ("first", "second"):
        threads.append(threading.Thread(target=stream, args=(name, 3)))
        threads[-1].start()
        until((2, 1 if name == "first" else 2))
    with lock:
        assert sorted(order) == ["long 300", "long 90"]
    for t in threads:
        t.join(30)
    assert order[2:] == ["first", "second"]
    until((0, 0))
