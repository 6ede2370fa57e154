"""tp4.serving.api against the stand-in engine (tests/standin/engine.py) as rank 0: started as the line's
entrypoint (`engine.py run`) with the default profile's rank-0 env, on this host's loopback (one
node: NNODES=1, HOST=127.0.0.1 and a free port, no warm-up), so it needs no root. Also against a
plain HTTP file server (Python's http.server), which is what an address that answers HTTP but is
no engine looks like; and the key file checks on real files, a FIFO, a directory and /dev/null."""

from __future__ import annotations

import functools
import http.server
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tp4.core import apikey

from tp4.serving import api
from tp4.serving.api import ApiError, Endpoint, Load, Secret
from tp4.serving.linestate import classify
from tp4.line.container import IMAGE, MOUNTS
from tp4.core.errors import InvalidInput
from tp4.line.plan import build_plan
from tp4.line.profile.load import load_default

pytestmark = pytest.mark.unit

ENGINE = Path(__file__).resolve().parent / "standin" / "engine.py"
KEY = "sk-apitest-7f3c9e21b04d4a8f"
MODEL = "deepseek-v4.1-flash"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Head:
    """Rank 0 of a one-node line, started like its container: the plan's env and command."""

    def __init__(self, root: Path, extra: dict[str, str]) -> None:
        plan = build_plan(load_default())
        self.port = free_port()
        self.root = root
        model = root / MOUNTS.model.lstrip("/")
        model.mkdir(parents=True, exist_ok=True)
        (model / "config.json").write_text("{}\n")
        stamps = root / IMAGE.b12x_next.lstrip("/") / "b12x_next"
        stamps.mkdir(parents=True, exist_ok=True)
        (stamps / "SOURCE_COMMIT").write_text("0123456789abcdef0123456789abcdef01234567\n")
        (stamps / "SOURCE_PATCH").write_text("0123456789abcdef\n")
        env = {
            **plan.nodes[0].env,
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "TP4_STANDIN_ROOT": str(root),
            "TP4_STANDIN_PACE": "0.02",
            "NNODES": "1",
            "HOST": "127.0.0.1",
            "SERVER_PORT": str(self.port),
            "API_KEY": KEY,
            "WARMUP": "0",
            **extra,
        }
        self.log = root / "rank0.log"
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-u", str(ENGINE), *plan.nodes[0].run.command],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.url = f"http://127.0.0.1:{self.port}"
        self.ep = Endpoint.of(self.url, plan.nodes[0].env["SERVED_MODEL_NAME"], Secret(KEY))
        deadline = time.monotonic() + 30
        while "Ready: API on port" not in self.text():
            assert self.proc.poll() is None and time.monotonic() < deadline, self.text()[-3000:]
            time.sleep(0.02)

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        """KILL boot.py; the engine (its own session) dies with it: wait until the port is closed."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
            except OSError:
                return
            time.sleep(0.02)
        raise AssertionError(f"the engine of port {self.port} outlived boot.py")


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Callable[..., Head]]:
    heads: list[Head] = []

    def go(**extra: str) -> Head:
        head = Head(tmp_path / f"head{len(heads)}", extra)
        heads.append(head)
        return head

    try:
        yield go
    finally:
        for head in heads:
            head.stop()


@pytest.fixture(scope="module")
def healthy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Head]:
    head = Head(tmp_path_factory.mktemp("healthy"), {})
    try:
        yield head
    finally:
        head.stop()


@pytest.fixture
def files_server(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A plain HTTP file server over a directory: an address that answers, but no engine."""
    root = tmp_path / "www"
    root.mkdir()

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            del format, args

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", root
    finally:
        server.shutdown()
        server.server_close()


# --- completions -------------------------------------------------------------------------------------


def test_a_completion(healthy: Head) -> None:
    out = api.complete(healthy.ep, api.QUESTION, max_tokens=32, timeout=10, chat_template_kwargs={"thinking": False})
    assert (out.content, out.finish_reason) == ("42", "stop")
    assert (
        out.usage is not None
        and out.usage.completion_tokens == 2
        and out.usage.total_tokens == out.usage.prompt_tokens + 2
    )
    assert 0 < out.seconds < 10 and out.tool_calls == ()
    one = api.complete(healthy.ep, [{"role": "user", "content": api.QUESTION}], max_tokens=1, timeout=10)
    assert one.finish_reason == "length" and one.usage is not None and one.usage.completion_tokens == 1


def test_a_streamed_completion(healthy: Head) -> None:
    out = api.stream(healthy.ep, api.QUESTION, max_tokens=32, timeout=10)
    # the role chunk, "42", the finish chunk (with usage); then [DONE]
    assert (out.content, out.finish_reason, out.chunks) == ("42", "stop", 3)
    assert out.first_token_seconds is not None and 0 < out.first_token_seconds <= out.seconds
    prose = api.stream(healthy.ep, "Say something.", max_tokens=5, timeout=10)
    # the role chunk, 3 + 2 tokens (the stand-in's three tokens per event, as the line sends), the finish chunk
    assert prose.finish_reason == "length" and prose.chunks == 4 and len(prose.content.split()) == 5


def test_a_request_whose_answer_was_read_is_no_longer_running(healthy: Head) -> None:
    """As SGLang's scheduler drops a finished request before its last chunk is written, a client
    that has read an answer never finds it still running (a watchdog or bench would count it)."""
    for _ in range(40):
        api.stream(healthy.ep, "Say something.", max_tokens=2, timeout=10)
        assert api.load(healthy.ep, timeout=5) == Load(0, 0)
        api.complete(healthy.ep, "Say something.", max_tokens=2, timeout=10)
        assert api.load(healthy.ep, timeout=5) == Load(0, 0)


def test_load_and_health(healthy: Head) -> None:
    assert api.load(healthy.ep, timeout=5) == Load(0, 0)
    assert api.health(healthy.ep, timeout=5) == 200
    # /health needs no key; the load does
    assert api.health(healthy.ep._replace(key=None), timeout=5) == 200
    with pytest.raises(ApiError, match="none was sent") as err:
        api.load(healthy.ep._replace(key=None), timeout=5)
    assert err.value.kind == "auth" and err.value.status == 401


@pytest.mark.parametrize(
    ("doc", "found"),
    [
        # SGLang's /v1/loads over two DP ranks: summed
        (
            {
                "timestamp": "t",
                "dp_rank_count": 2,
                "loads": [
                    {"dp_rank": 0, "num_running_reqs": 3, "num_waiting_reqs": 1},
                    {"dp_rank": 1, "num_running_reqs": 2, "num_waiting_reqs": 4},
                ],
            },
            Load(5, 5),
        ),
        # /get_load: a list per DP rank, num_reqs counting running and waiting
        (
            [
                {"dp_rank": 0, "num_reqs": 4, "num_waiting_reqs": 1, "num_tokens": 9},
                {"dp_rank": 1, "num_reqs": 0, "num_waiting_reqs": 0},
            ],
            Load(3, 1),
        ),
        ({"num_reqs": 2, "num_waiting_reqs": 0}, Load(2, 0)),
        ({"loads": []}, Load(0, 0)),
        ({"loads": [{"num_running_reqs": 1}]}, None),
        ([{"num_reqs": "many", "num_waiting_reqs": 0}], None),
        ([{"num_reqs": True, "num_waiting_reqs": 0}], None),
        ("busy", None),
    ],
)
def test_load_shapes(doc: api.Json, found: Load | None) -> None:
    assert api._sum_load(doc) == found


def test_an_address_that_is_no_engine(files_server: tuple[str, Path]) -> None:
    url, root = files_server
    ep = Endpoint.of(url, MODEL, Secret(KEY))
    assert api.load(ep, timeout=5) is None  # neither load endpoint: 404
    assert api.health(ep, timeout=5) == 404
    with pytest.raises(ApiError) as err:
        api.complete(ep, "hi", max_tokens=1, timeout=5)
    assert err.value.kind == "http" and err.value.status == 501
    assert "/v1/chat/completions: HTTP 501: " in err.value.message and "Unsupported method" in err.value.message
    assert api.probe(ep, timeout=5).state == "error"
    # a load endpoint that answers with something that is not JSON
    (root / "v1").mkdir()
    (root / "v1" / "loads").write_text("<html>not a load</html>\n")
    with pytest.raises(ApiError, match=r"/v1/loads: the answer is not JSON") as err:
        api.load(ep, timeout=5)
    assert err.value.kind == "malformed"
    (root / "v1" / "loads").write_text('{"loads": [{"queue": 3}]}')
    with pytest.raises(ApiError, match="not a load report"):
        api.load(ep, timeout=5)


@pytest.mark.parametrize(
    ("doc", "what"),
    [
        ({"choices": []}, "no choices[0]"),
        ({"object": "list"}, "no choices[0]"),
        ([1, 2], "no choices[0]"),
        ({"choices": [{"text": "42"}]}, "no choices[0].message"),
        ({"choices": [{"message": {"content": 42}}]}, "content is not text"),
        (
            {"choices": [{"message": {"content": "x", "tool_calls": [{"function": {}}]}}]},
            "a tool call without a function name",
        ),
    ],
)
def test_an_answer_that_is_no_completion(doc: api.Json, what: str) -> None:
    with pytest.raises(ApiError, match="is not a chat completion") as err:
        api._completion("http://h:1/v1/chat/completions", doc, 0.1)
    assert err.value.kind == "malformed" and what in err.value.message


def test_down_and_timeouts(start: Callable[..., Head]) -> None:
    head = start(TP4_STANDIN_FAULT="wedge")
    with pytest.raises(ApiError) as err:
        api.complete(head.ep, "hi", max_tokens=1, timeout=0.5)
    assert (
        err.value.kind == "timeout" and err.value.message == f"{head.url}/v1/chat/completions: no answer within 0.5 s"
    )
    with pytest.raises(ApiError) as err:
        api.stream(head.ep, "hi", max_tokens=1, timeout=0.5)
    assert err.value.kind == "timeout" and "no answer within 0.5 s" in err.value.message
    head.stop()
    for call in (
        lambda: api.complete(head.ep, "hi", max_tokens=1, timeout=2),
        lambda: api.load(head.ep, timeout=2),
        lambda: api.stream(head.ep, "hi", max_tokens=1, timeout=2),
    ):
        with pytest.raises(ApiError) as err:
            call()
        assert err.value.kind == "down"
        assert err.value.message.startswith(
            f"{head.url}: API down (connection refused); fix: start the line with `tp4 serve`"
        )
    assert api.health(head.ep, timeout=2) is None


def test_a_refused_key(healthy: Head) -> None:
    wrong = "sk-wrong-0000000000000000"
    with pytest.raises(ApiError) as err:
        api.complete(healthy.ep._replace(key=Secret(wrong)), "hi", max_tokens=1, timeout=5)
    assert err.value.kind == "auth" and err.value.status == 401
    assert "the API key was refused (HTTP 401); fix: check api.key_file" in err.value.message
    assert wrong not in err.value.message and KEY not in err.value.message
    with pytest.raises(ApiError, match="the API key was refused"):
        api.stream(healthy.ep._replace(key=Secret(wrong)), "hi", max_tokens=1, timeout=5)
    with pytest.raises(ApiError, match=r"the API wants a key and none was sent \(HTTP 401\); fix: set api.key_file"):
        api.complete(healthy.ep._replace(key=None), "hi", max_tokens=1, timeout=5)
    assert api.probe(healthy.ep._replace(key=Secret(wrong)), timeout=5).state == "error"


# --- the probe ---------------------------------------------------------------------------------------


def test_probe_alive(healthy: Head) -> None:
    found = api.probe(healthy.ep, timeout=5)
    assert found.state == "alive" and found.detail.startswith("one token in ") and found.seconds < 5


def test_probe_wedged(start: Callable[..., Head]) -> None:
    head = start(TP4_STANDIN_FAULT="wedge")
    started = time.monotonic()
    found = api.probe(head.ep, timeout=1)
    assert found.state == "wedged" and found.health == 200 and found.load == Load(0, 0)
    assert found.detail == "health 200 but no completion within 1 s, and nothing running or waiting"
    assert 1 <= time.monotonic() - started < 3


def test_probe_busy_is_not_wedged(start: Callable[..., Head]) -> None:
    head = start(TP4_STANDIN_FAULT="busy", TP4_STANDIN_BUSY_SECONDS="3")
    found = api.probe(head.ep, timeout=1)
    assert found.state == "busy" and found.load is not None and found.load.running >= 3 and found.load.waiting == 1
    assert found.detail.startswith("no completion within 1 s, ") and found.progress is None
    # without --enable-metrics there is no /metrics (as SGLang): progress unknown, and said so
    assert found.detail.endswith("progress unknown: the engine has no /metrics (it runs without --enable-metrics)")
    assert classify({"a": "running"}, found, own_in_flight=1).state == "busy"  # more in flight than its probe
    # with time enough, the same line answers
    assert api.probe(head.ep, timeout=6).state == "alive"


def metrics_args() -> str:
    """The line's engine args with --enable-metrics added (EXTRA_SGLANG_ARGS)."""
    return build_plan(load_default()).nodes[0].env.get("EXTRA_SGLANG_ARGS", "") + " --enable-metrics"


def scrape(head: Head, key: str | None = None) -> tuple[int, str]:
    req = urllib.request.Request(head.url + "/metrics", headers={"Authorization": f"Bearer {key}"} if key else {})
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, ""


def test_the_standins_metrics_are_sglangs(start: Callable[..., Head]) -> None:
    head = start(EXTRA_SGLANG_ARGS=metrics_args())
    status, text = scrape(head)  # no key: SGLang's key middleware passes /metrics, as /health
    assert status == 200
    for name, kind in (
        ("sglang:num_running_reqs", "gauge"),
        ("sglang:num_queue_reqs", "gauge"),
        ("sglang:realtime_tokens_total", "counter"),
        ("sglang:prompt_tokens_total", "counter"),
        ("sglang:generation_tokens_total", "counter"),
    ):
        assert f"# HELP {name} " in text and f"# TYPE {name} {kind}\n" in text, name
    assert f'model_name="{MODEL}"' in text and 'mode="decode"' in text and 'mode="prefill_compute"' in text
    before = api.tokens(head.ep, 5)
    assert before is not None
    out = api.complete(head.ep, api.QUESTION, max_tokens=8, timeout=10)
    after = api.tokens(head.ep, 5)
    assert after is not None and after.since(before) > 0
    usage = out.usage
    assert usage is not None
    grew = {k: after.counts[k] - before.counts.get(k, 0) for k in after.counts}
    # the tokenizer counts the finished request's prompt and answer; the scheduler at least those
    assert grew["sglang:prompt_tokens_total"] == usage.prompt_tokens
    assert grew["sglang:generation_tokens_total"] == usage.completion_tokens
    assert grew["sglang:realtime_tokens_total"] >= usage.prompt_tokens + usage.completion_tokens
    assert api.probe(head.ep, timeout=5).tokens is not None  # a ready probe keeps its reading


def test_no_metrics_without_enable_metrics(healthy: Head) -> None:
    assert scrape(healthy, KEY)[0] == 404
    assert api.tokens(healthy.ep, 5) is None


def test_a_held_wedge_keeps_its_requests_running_and_counts_nothing(start: Callable[..., Head]) -> None:
    """TP4_STANDIN_WEDGE_LOAD=held: the scheduler stuck in a collective (b12x#313) keeps its hung
    requests (here a foreign one and the probe's) in the load endpoints; no token is counted."""
    head = start(TP4_STANDIN_FAULT="wedge", TP4_STANDIN_WEDGE_LOAD="held", EXTRA_SGLANG_ARGS=metrics_args())
    foreign = threading.Thread(
        target=lambda: pytest.raises(ApiError, api.complete, head.ep, "a long one", max_tokens=64, timeout=6),
        daemon=True,
    )
    foreign.start()
    deadline = time.monotonic() + 5
    while api.load(head.ep, 2) != Load(1, 0):
        assert time.monotonic() < deadline, api.load(head.ep, 2)
        time.sleep(0.05)
    found = api.probe(head.ep, timeout=1.5)
    assert found.state == "busy" and found.load == Load(2, 0)  # the foreign request and the probe
    assert found.progress is False and "no token counted in " in found.detail
    status, text = scrape(head)
    assert status == 200 and "sglang:num_running_reqs{" in text and "} 2.0" in text
    verdict = classify({"a": "running"}, found, own_in_flight=1)
    assert verdict.state == "wedged" and verdict.detail.startswith("requests in flight, but none progresses")
    # the next look, carrying this one's reading, finds nothing counted since either
    again = api.probe(head.ep, timeout=1.5, since=found.tokens)
    assert again.progress is False and again.load is not None and again.load.running == 3
    foreign.join(10)


def test_a_busy_line_with_metrics_progresses(start: Callable[..., Head]) -> None:
    head = start(TP4_STANDIN_FAULT="busy", TP4_STANDIN_BUSY_SECONDS="3", EXTRA_SGLANG_ARGS=metrics_args())
    found = api.probe(head.ep, timeout=1.5)
    assert found.state == "busy" and found.progress is True and "token(s) counted in the last" in found.detail
    assert classify({"a": "running"}, found, own_in_flight=5).state == "busy"


def test_probe_down(start: Callable[..., Head]) -> None:
    head = start()
    assert api.probe(head.ep, timeout=2).state == "alive"
    head.stop()
    found = api.probe(head.ep, timeout=2)
    assert found.state == "down" and "API down (connection refused)" in found.detail and found.seconds < 2


# --- the smoke ---------------------------------------------------------------------------------------


def test_smoke_on_a_healthy_line(healthy: Head) -> None:
    quick = api.smoke(healthy.ep, full=False, timeout=10)
    assert [(r.name, r.ok) for r in quick] == [("arithmetic", True), ("stream", True)]
    assert quick[0].detail == "19 + 23 answered '42' (finish_reason stop)"
    assert quick[1].detail.startswith("3 chunks to [DONE], first token in ")
    full = api.smoke(healthy.ep, full=True, timeout=10)
    assert [(r.name, r.ok) for r in full] == [
        ("arithmetic", True),
        ("stream", True),
        ("json_schema", True),
        ("tool_call", True),
    ], full
    assert full[2].detail == "answered '{\"answer\": 42}'"
    assert full[3].detail == f"called lookup_fixture('tp4-smoke'), then answered {api.FIXTURE_VALUE!r}"
    assert all(0 < r.seconds < 10 for r in full)


def test_smoke_names_the_check_a_wrong_answer_fails(start: Callable[..., Head]) -> None:
    head = start(TP4_STANDIN_FAULT="wrong-answer")  # boot.py's own smoke passed: the line is Ready
    out = {r.name: r for r in api.smoke(head.ep, full=True, timeout=10)}
    assert (
        not out["arithmetic"].ok
        and out["arithmetic"].detail == "19 + 23 answered '41' (finish_reason stop); expected 42 (finish_reason stop)"
    )
    assert (
        not out["json_schema"].ok
        and out["json_schema"].detail == 'answered \'{"answer": 41}\'; expected {"answer": 42}'
    )
    assert out["stream"].ok and out["tool_call"].ok


def test_smoke_on_a_line_that_is_down(start: Callable[..., Head]) -> None:
    head = start()
    head.stop()
    out = api.smoke(head.ep, full=True, timeout=2)
    assert [r.ok for r in out] == [False] * 4
    assert all("API down (connection refused)" in r.detail for r in out)


# --- the endpoint ------------------------------------------------------------------------------------


def test_the_endpoint_of_the_plan() -> None:
    plan = build_plan(load_default())
    ep = Endpoint.from_plan(plan.line.api, plan.nodes[0].env, Secret(KEY))
    assert ep.url == "http://10.0.0.1:8888" and ep.model == MODEL
    assert KEY not in repr(ep) and KEY not in str(ep) and KEY not in f"{ep}" and "Secret('********')" in repr(ep)
    assert Endpoint.of("http://[::1]:8888/", MODEL).url == "http://[::1]:8888"


@pytest.mark.parametrize(
    "url",
    [
        "10.0.0.1:8888",
        "https://10.0.0.1:8888",
        "http://10.0.0.1",
        "http://10.0.0.1:8888/v1",
        "http://u:p@10.0.0.1:8888",
        "http://10.0.0.1:99999",
        "http://:8888",
        "http://h:8888?x=1",
        "",
    ],
)
def test_a_bad_api_address(url: str) -> None:
    with pytest.raises(InvalidInput, match="is not an API address of the form http://HOST:PORT; fix: "):
        Endpoint.of(url, MODEL)


def test_a_secret_is_never_shown() -> None:
    s = Secret(KEY)
    assert KEY not in repr(s) and KEY not in str(s) and KEY not in f"{s!r} {s}" and s.reveal() == KEY
    assert s == Secret(KEY) and s != Secret(KEY + "x")
    for bad in ("", "has space", "line\nbreak", "nul\x00", "tab\t", "é"):
        with pytest.raises(ValueError) as err:
            Secret(bad)
        assert bad not in str(err.value) or not bad


# --- the key file ------------------------------------------------------------------------------------


def key_file(tmp_path: Path, data: bytes, mode: int = 0o600) -> Path:
    path = tmp_path / "api-key"
    path.write_bytes(data)
    path.chmod(mode)
    return path


@pytest.mark.parametrize("data", [KEY.encode(), KEY.encode() + b"\n", b"  " + KEY.encode() + b"\r\n\n"])
def test_a_key_file(tmp_path: Path, data: bytes, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    assert apikey.read_key(key_file(tmp_path, data)) == Secret(KEY)
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "api-key")
    assert apikey.read_key(str(link)).reveal() == KEY
    assert caplog.records == []


def test_a_key_file_others_can_read_is_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = key_file(tmp_path, KEY.encode() + b"\n", 0o644)
    with caplog.at_level(logging.WARNING, logger="tp4.core.apikey"):
        assert apikey.read_key(path).reveal() == KEY
    assert [r.getMessage() for r in caplog.records] == [
        f"api.key_file: {path} is readable by its group and everyone (mode 0644); fix: chmod 600 {path}"
    ]
    caplog.clear()
    path.chmod(0o640)
    with caplog.at_level(logging.WARNING, logger="tp4.core.apikey"):
        apikey.read_key(path)
    assert "readable by its group (mode 0640)" in caplog.text and KEY not in caplog.text


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (lambda p: None, "does not exist; fix: write the API key to"),
        (lambda p: p.mkdir(), "is a directory, not a regular file; fix: name the file holding the API key"),
        (lambda p: os.mkfifo(p), "is a FIFO, not a regular file"),
        (lambda p: p.symlink_to("/dev/null"), "is a device, not a regular file"),
        (lambda p: p.write_bytes(b""), "is empty; fix: write the API key to"),
        (lambda p: p.write_bytes(b" \n\n"), "is empty"),
        (
            lambda p: p.write_bytes(b"sk-one\nsk-two\n"),
            "holds whitespace or a line break inside the key (at character 7); fix: write the key alone, on one line",
        ),
        (lambda p: p.write_bytes(b"sk-one two"), "holds whitespace or a line break inside the key (at character 7)"),
        (lambda p: p.write_bytes(b"sk-\x00key"), "holds a control character inside the key (at character 4)"),
        (lambda p: p.write_bytes(b"sk-\x1bkey"), "holds a control character inside the key"),
        (lambda p: p.write_bytes("sk-clé".encode()), "holds a byte that is not ASCII (at offset 5)"),
        (lambda p: p.write_bytes(b"k" * (65 << 10)), "is larger than 64 KiB, not one API key"),
    ],
)
def test_a_bad_key_file(tmp_path: Path, make: Callable[[Path], object], reason: str) -> None:
    path = tmp_path / "api-key"
    make(path)
    if path.exists() and not path.is_symlink() and path.is_file():
        path.chmod(0o600)
    started = time.monotonic()
    with pytest.raises(InvalidInput) as err:
        apikey.read_key(path)
    assert time.monotonic() - started < 2  # a FIFO is refused, never waited on
    assert err.value.exit_code == 2
    assert (
        str(err.value).startswith(f"api.key_file: {path} ") and reason in str(err.value) and "; fix: " in str(err.value)
    )
    assert "sk-one" not in str(err.value) and "sk-" not in str(err.value).replace(str(path), "")


def test_dev_null_itself(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match=r"^api.key_file: /dev/null is a device, not a regular file; fix: "):
        apikey.read_key("/dev/null")


# --- the key in no message ---------------------------------------------------------------------------


def test_the_key_is_in_no_log_record_or_error(
    start: Callable[..., Head], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    path = key_file(tmp_path, KEY.encode() + b"\n", 0o644)  # a warning is logged too
    key = apikey.read_key(path)
    head = start(TP4_STANDIN_FAULT="wedge")
    ep = head.ep._replace(key=key)
    texts: list[str] = [repr(ep), str(ep), repr(key)]
    texts += [repr(api.probe(ep, timeout=0.5))]
    for call in (
        lambda: api.complete(ep, "hi", max_tokens=1, timeout=0.5),
        lambda: api.stream(ep, "hi", max_tokens=1, timeout=0.5),
        lambda: api.complete(ep._replace(key=Secret(KEY + "x")), "hi", max_tokens=1, timeout=2),
    ):
        with pytest.raises(ApiError) as err:
            call()
        texts += [str(err.value), repr(err.value), repr(err.value.__cause__), repr(err.value.__context__)]
    texts += [repr(api.smoke(ep, full=True, timeout=0.5))]
    head.stop()
    texts += [repr(api.probe(ep, timeout=1)), repr(api.smoke(ep, full=False, timeout=1))]
    records = [r.getMessage() for r in caplog.records]
    assert any("POST " in r for r in records) and any("readable by" in r for r in records)
    for text in [*texts, *records, caplog.text]:
        assert KEY not in text


def test_a_stream_that_stalls(start: Callable[..., Head]) -> None:
    head = start(TP4_STANDIN_FAULT="stall")
    started = time.monotonic()
    with pytest.raises(ApiError) as err:
        api.stream(head.ep, api.QUESTION, max_tokens=32, timeout=0.5)
    assert (
        err.value.kind == "timeout"
        and err.value.message == f"{head.url}/v1/chat/completions: the stream stalled: nothing for 0.5 s"
    )
    assert time.monotonic() - started < 2
    out = {r.name: r for r in api.smoke(head.ep, full=False, timeout=0.5)}
    assert out["arithmetic"].ok and not out["stream"].ok and "the stream stalled" in out["stream"].detail


def test_no_proxy_is_consulted(healthy: Head, monkeypatch: pytest.MonkeyPatch) -> None:
    # a proxy that would refuse everything: requests go to the head's address all the same
    for name in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.setenv(name, "http://127.0.0.1:9")
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    assert api.complete(healthy.ep, api.QUESTION, max_tokens=32, timeout=10).content == "42"
    assert api.probe(healthy.ep, timeout=5).state == "alive"
