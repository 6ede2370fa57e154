"""`tp4 qeval`: every scorer on a known-good and known-bad answer of every task
(tests/fixtures/qeval-answers.json), the baseline, hostile command lines; then, on netns hosts
with real podman (tests/line_cluster.py: four hosts, the stand-in image in each store), the
sandbox: good and bad code of every code task, hostile "generated code" (network, writes outside
the scratch directory, fork bomb, memory hog, endless loops, a flood of output) stopped and
reported as failures with nothing left behind, and the refusal to run on the head; and the whole
command end to end against a local stand-in engine answering from a script
(TP4_STANDIN_ANSWERS)."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from line_cluster import LineCluster
from test_api import Head

from tp4.serving.api import Endpoint
from tp4.measuring.qeval import checks, suite
from tp4.measuring.qeval.checks import Answer, Code
from tp4.measuring.qeval.sandbox import PREFIX, Limits, Sandbox
from tp4.measuring.qeval.tasks import TASKS, Task, suite_digest

REPO = Path(__file__).resolve().parent.parent
ANSWERS: dict[str, dict[str, object]] = json.loads((REPO / "tests" / "fixtures" / "qeval-answers.json").read_text())
BY_ID = {t.id: t for t in TASKS}
Outcome = checks.Outcome
CODE_TASKS = [t for t in TASKS if isinstance(t.scorer, Code)]
OTHER_TASKS = [t for t in TASKS if not isinstance(t.scorer, Code)]


def good(task: Task) -> str:
    value = ANSWERS[task.id]["good"]
    assert isinstance(value, str)
    return value


def bad(task: Task) -> list[str]:
    value = ANSWERS[task.id]["bad"]
    assert isinstance(value, list) and all(isinstance(v, str) for v in value)
    return value


def tp4(*args: str, env: dict[str, str] | None = None, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tp4", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": str(REPO / "python"), **(env or {})},
    )


# --- the suite and its scorers (no sandbox) ---------------------------------------------------------


def test_the_suite_has_40_tasks_or_more_of_every_kind_each_with_good_and_bad_answers() -> None:
    kinds = Counter(t.kind for t in TASKS)
    assert len(TASKS) >= 40 and set(kinds) == set(checks.KINDS), kinds
    assert all(n >= 5 for n in kinds.values()), kinds
    assert len({t.id for t in TASKS}) == len(TASKS)
    assert set(ANSWERS) == {t.id for t in TASKS}
    for t in TASKS:
        assert good(t) and bad(t), t.id
        assert 0 < t.max_tokens <= 1024 and t.prompt.strip(), t.id


def test_every_json_schema_is_a_valid_schema() -> None:
    from jsonschema import Draft202012Validator

    for t in TASKS:
        if isinstance(t.scorer, checks.JsonAnswer):
            Draft202012Validator.check_schema(t.scorer.schema)


@pytest.mark.parametrize("task", OTHER_TASKS, ids=lambda t: t.id)
def test_a_good_answer_passes_and_every_bad_one_fails(task: Task) -> None:
    assert not isinstance(task.scorer, Code)
    verdict = task.scorer.score(Answer(good(task)))
    assert verdict.passed, verdict.reason
    for answer in bad(task):
        verdict = task.scorer.score(Answer(answer))
        assert not verdict.passed, answer
        assert verdict.reason


@pytest.mark.parametrize("task", [t for t in OTHER_TASKS if t.kind in ("format", "prose")], ids=lambda t: t.id)
def test_an_answer_cut_off_at_max_tokens_is_a_runaway(task: Task) -> None:
    assert not isinstance(task.scorer, Code)
    verdict = task.scorer.score(Answer(good(task), "length"))
    assert not verdict.passed and "run-away" in verdict.reason


def test_degeneration_checks() -> None:
    prose = BY_ID["prose_tcp"].scorer
    assert isinstance(prose, checks.Prose)
    text = good(BY_ID["prose_tcp"])
    assert prose.score(Answer(text)).passed
    # a sentence said twice, a run of one character, too few distinct words
    said_twice = text + " " + text.split(". ")[1] + "."
    assert prose.score(Answer(said_twice)).reason.startswith("the sentence ")
    assert "a run of" in prose.score(Answer(text + " Noooooooooooo!")).reason
    low = checks.Prose(10, 500, distinct=0.5).score(
        Answer(" ".join(f"word{i % 7} filler{i % 5} and" for i in range(40)))
    )
    assert not low.passed


def test_the_code_of_an_answer_and_the_last_number() -> None:
    assert checks.extract_code("Sure:\n```python\ndef f():\n    return 1\n```\nDone.") == "def f():\n    return 1\n"
    assert checks.extract_code("```\nx = 1\n```\n```py\ndef g(): pass\n```") == "def g(): pass\n"
    assert checks.extract_code("def h(): return 2") == "def h(): return 2"
    assert checks.extract_code("```python\ndef cut():\n    return 1") == "def cut():\n    return 1"
    assert checks.last_number("It is 1,157.63 euros.") == 1157.63
    assert checks.last_number("From 3 to -17") == -17
    assert checks.last_number("x2 and v1.2.3") is None
    assert checks.last_number("no digits") is None


def test_the_runner_reads_only_its_own_verdict() -> None:
    code = Code("f", ("assert f() == 1",))
    fake = Outcome(0, 'abc {"passed": true, "reason": "forged"}\nn0nce {"started": true}\n', False, 0.1)
    assert code.verdict(fake, "n0nce", seconds_limit=10, memory_mib=256) == (
        False,
        "the program ended without a verdict (exit code 0)",
    )
    assert not code.verdict(Outcome(None, "", True, 12), "n", seconds_limit=10, memory_mib=256).passed
    assert "memory limit" in code.verdict(Outcome(137, "", False, 1), "n", seconds_limit=10, memory_mib=256).reason
    # the model's code and the asserts are literals in the program, never code text spliced in
    program = code.program("```python\ndef f():\n    return '''\"\"\"'''\n```", "n0nce", 10)
    compile(program, "runner", "exec")


# --- baseline -----------------------------------------------------------------------------------------


def result(id: str, passed: bool) -> suite.TaskResult:
    return suite.TaskResult(id, BY_ID[id].kind, passed, "r", 0.1, "a", "stop", 1)


def test_a_baseline_of_either_form_and_the_diff() -> None:
    small = suite.parse_baseline(
        json.dumps(
            {
                "tp4": {"kind": "qeval-baseline", "suite": "x"},
                "label": "L",
                "results": {"math_gcd": "pass", "math_series": "fail", "code_rle": "pass"},
            }
        ),
        "f",
    )
    assert small.results == {"math_gcd": True, "math_series": False, "code_rle": True}
    diff = suite.compare(
        small,
        [result("math_gcd", False), result("math_series", True), result("code_rle", True), result("math_speed", True)],
    )
    assert (diff.newly_failing, diff.newly_passing, diff.not_in_baseline) == (
        ["math_gcd"],
        ["math_series"],
        ["math_speed"],
    )
    results = [result("math_gcd", True), result("json_sum", False)]
    doc = suite.results_doc(
        results,
        ep=Endpoint("http://h:1", "m"),
        sandbox=None,
        started="s",
        finished="f",
        label="run",
        baseline=None,
        baseline_path=None,
    )
    again = suite.parse_baseline(json.dumps(doc), "results.json")
    assert again.results == {"math_gcd": True, "json_sum": False} and again.suite == suite_digest()


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("not json", "the file: not JSON"),
        ("[]", "the file: not a JSON object"),
        ('{"tp4": {"kind": "bench"}}', "tp4.kind"),
        ('{"tp4": {"kind": "qeval-baseline"}, "results": {"math_gcd": true}}', "results.math_gcd"),
        ('{"tp4": {"kind": "qeval-baseline"}}', "results: missing"),
        ('{"tp4": {"kind": "qeval"}, "tasks": [{"id": 3, "passed": true}]}', "tasks[0]"),
        ('{"tp4": {"kind": "qeval-baseline"}, "label": 7, "results": {}}', "label"),
    ],
)
def test_a_bad_baseline_names_the_field(text: str, field: str) -> None:
    with pytest.raises(suite.InvalidInput) as err:
        suite.parse_baseline(text, "b.json")
    assert f"--baseline b.json: {field}" in err.value.message and "fix:" in err.value.message


def test_the_shipped_baseline_is_the_stand_in_good_answers_and_says_so() -> None:
    doc = json.loads(suite.shipped_baseline().read_text())
    assert "stand-in" in doc["label"] and "not the line" in doc["note"].lower()
    base = suite.load_baseline(str(suite.shipped_baseline()))
    assert base.suite == suite_digest(), "the suite changed: record the baseline again (docs/qeval.md)"
    assert base.results == {t.id: True for t in TASKS}


# --- hostile command lines (exit 2, a message naming the option, no traceback) ------------------------


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--only", "nope"], "--only: no task 'nope'"),
        (["--only", "math_gcd,,x"], "--only"),
        (["--kind", "essay"], "--kind"),
        (["--fail-below", "99999"], "--fail-below 99999: only 47 tasks"),
        (["--fail-below", "-1"], "--fail-below"),
        (["--code-seconds", "0"], "--code-seconds"),
        (["--code-seconds", "nan"], "--code-seconds"),
        (["--timeout", "inf"], "--timeout"),
        (["--baseline", "/nonexistent/b.json"], "--baseline"),
        (["--baseline", "/dev/zero"], "--baseline"),
        (["--baseline", "/tmp"], "--baseline"),
        (["--out", "/nonexistent/dir/out.json"], "--out"),
        (["--url", "http://127.0.0.1:9", "--sandbox-host", "-oProxyCommand=touch /tmp/x"], "--sandbox-host"),
        (["--url", "http://127.0.0.1:9", "--sandbox-host", "a b"], "--sandbox-host"),
        (["--url", "http://127.0.0.1:9", "--sandbox-host", "h:99999"], "--sandbox-host"),
        (["--url", "http://127.0.0.1:9", "--sandbox-host", "h", "--sandbox-image", "x;rm -rf /"], "--sandbox-image"),
        (["--url", "http://127.0.0.1:9", "--sandbox-host", "h"], "--sandbox-image"),
        (["--url", "http://127.0.0.1:9", "--sandbox-node", "node2"], "--sandbox-node"),
        (["--url", "http://127.0.0.1:9", "--kind", "code"], "code tasks need a sandbox"),
        (["--url", "http://127.0.0.1:9", "--sandbox-host", "local", "--sandbox-image", "img"], "is the head"),
        (["--url", "ftp://h:1"], "api:"),
        (["--url", "http://127.0.0.1:9", "--kind", "json", "--api-key-file", "/nonexistent/key"], "api.key_file"),
    ],
)
def test_hostile_input_exits_2(args: list[str], needle: str) -> None:
    proc = tp4("qeval", *args, timeout=60)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert needle in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr


# --- never on the head, never this machine: the sandbox host's addresses -----------------------------

OUTSIDE = "http://192.0.2.10:9"  # an API on no machine (TEST-NET-1): this machine is not its head


def _own_address() -> str:
    """An address of one of this machine's interfaces that is not loopback: the one its route
    out leaves from (stable while netns tests elsewhere add and remove interfaces), which
    /proc/net lists."""
    import socket

    from tp4.measuring.qeval import sandbox as sb

    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("192.0.2.1", 9))
            own = s.getsockname()[0]
    except OSError:  # no route out: any address of its own interfaces that is not loopback
        own = next((str(ip) for ip in sorted(sb._proc_addresses(), key=str) if not ip.is_loopback), "")
        assert own, "this machine has no address but loopback"
    assert sb._ip(own) in sb._proc_addresses()
    return own


@pytest.mark.parametrize(
    "host",
    ["127.0.0.9", "0.0.0.0", "[::1]", "[::ffff:127.0.0.1]", "0", "127.1", "[::]", "localhost", "OWN", "HOSTNAME"],
)
def test_a_sandbox_host_that_is_this_machine_is_refused_however_it_is_spelt(host: str) -> None:
    import socket

    host = {"OWN": _own_address(), "HOSTNAME": socket.gethostname()}.get(host, host)
    proc = tp4("qeval", "--url", OUTSIDE, "--kind", "code", "--sandbox-host", f"root@{host}", "--sandbox-image", "img")
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    # by address, or (its own host name, resolvable here or not) by name
    assert f"--sandbox-host root@{host}: {host.strip('[]')} is this machine (" in proc.stderr, proc.stderr
    assert "never on the head" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    "api", ["http://127.0.0.9:9", "http://0.0.0.0:9", "http://[::1]:9", "http://[::ffff:127.0.0.1]:9"]
)
def test_sandbox_host_local_is_refused_when_the_api_is_this_machine_however_it_is_spelt(api: str) -> None:
    proc = tp4("qeval", "--url", api, "--kind", "code", "--sandbox-host", "local", "--sandbox-image", "img")
    assert proc.returncode == 2 and "this machine serves the API" in proc.stderr, proc.stderr


def test_the_heads_addresses_and_an_unresolvable_name_are_refused() -> None:
    from tp4.core.errors import InvalidInput
    from tp4.measuring.qeval import sandbox as sb

    heads = {"10.0.0.1", "spark1", "192.0.2.7"}
    for where in ("10.0.0.1", "[::ffff:10.0.0.1]", "192.0.2.7", "spark1"):
        with pytest.raises(InvalidInput, match="is the head"):
            sb.refuse_head(where.strip("[]"), heads, f"--sandbox-host {where}")
    with pytest.raises(InvalidInput, match="does not resolve here"):
        sb.refuse_head("no-such-host.invalid", heads, "--sandbox-host no-such-host.invalid")
    sb.refuse_head("192.0.2.8", heads, "--sandbox-host 192.0.2.8")  # another machine: a worker
    assert sb.resolve("0x7f000001") == {sb._ip("127.0.0.1")} and sb.this_machine(sb.resolve("0x7f000001"))
    assert {sb._ip("127.0.0.1"), sb._ip("::1")} <= sb.local_addresses()


def test_list_and_help() -> None:
    proc = tp4("qeval", "--list", "--kind", "numeric")
    assert proc.returncode == 0 and len(proc.stdout.splitlines()) == sum(t.kind == "numeric" for t in TASKS)
    assert "qeval" in tp4("--help").stdout


# --- the sandbox on netns hosts (real sshd, real podman with runc) -----------------------------------


@pytest.fixture(scope="module")
def cluster() -> Iterator[LineCluster]:
    # overlay, as the nodes run: vfs copies the image's tree for every container. A short
    # directory, not pytest's: under /tmp/pytest-of-root/pytest-N/... every `podman run` of
    # podman 4.3 here took 20 s longer to end (0.3 s under /tmp/tp4q...), whatever it ran
    work = Path(tempfile.mkdtemp(prefix="tp4q"))
    try:
        with LineCluster(work, storage_driver="overlay") as c:
            yield c
    finally:
        shutil.rmtree(work, ignore_errors=True)


def worker_sandbox(cluster: LineCluster, limits: Limits | None = None) -> Sandbox:
    node = cluster.nodes()[1]
    return Sandbox(cluster.plan.image.tag, node.name, node.remote, node.runtime, limits or Limits())


def qeval_containers(cluster: LineCluster) -> list[str]:
    return [c for host in cluster.hosts for c in cluster.containers(host) if c.startswith(PREFIX)]


def test_good_code_passes_and_bad_code_fails_in_the_sandbox(cluster: LineCluster) -> None:
    box = worker_sandbox(cluster)
    for task in CODE_TASKS:
        verdict = suite.score(task, Answer(good(task)), box)
        assert verdict.passed, (task.id, verdict.reason)
        assert verdict.reason.endswith("hidden asserts passed")
        for answer in bad(task):
            verdict = suite.score(task, Answer(answer), box)
            assert not verdict.passed, (task.id, answer)
    assert qeval_containers(cluster) == []


PROBE = """\
import json, os, socket
found = {"uid": os.getuid(), "net": {}, "write": {}}
for host, port in %(targets)r:
    try:
        socket.create_connection((host, port), timeout=3).close()
        found["net"][host] = "connected"
    except OSError as exc:
        found["net"][host] = type(exc).__name__ + ": " + str(exc)
try:
    socket.getaddrinfo("example.com", 80)
    found["dns"] = "resolved"
except OSError as exc:
    found["dns"] = str(exc)
for path in %(paths)r:
    try:
        with open(path, "w") as f:
            f.write("pwned")
        found["write"][path] = "written"
    except OSError as exc:
        found["write"][path] = exc.strerror
try:
    os.mkdir("/qeval-dir-%(nonce)s")
    found["mkdir"] = "made"
except OSError as exc:
    found["mkdir"] = exc.strerror
print(json.dumps(found))
"""


def test_generated_code_has_no_network_and_cannot_write_outside_its_scratch_dir(cluster: LineCluster) -> None:
    box = worker_sandbox(cluster)
    worker, head = cluster.hosts[1], cluster.hosts[0]
    nonce = secrets.token_hex(4)
    home = os.path.expanduser("~")
    outside = [
        "/",
        "/etc",
        "/usr",
        "/var",
        "/root",
        home,
        str(worker.dir),
        str(cluster.workdir),
        "/var/tmp",
        "/run",
        "/dev",
        "/dev/shm",
    ]
    paths = [f"{d.rstrip('/')}/qeval-{nonce}" for d in outside]
    scratch = f"/tmp/qeval-{nonce}"
    targets = [
        (worker.address, 22),
        (head.address, 22),
        (cluster.hosts.head_address, 22),
        ("127.0.0.1", 22),
        ("1.1.1.1", 443),
    ]
    outcome = box.run(PROBE % {"targets": targets, "paths": [*paths, scratch], "nonce": nonce})
    assert outcome.exit_code == 0 and not outcome.timed_out, outcome
    found = json.loads(outcome.stdout.strip().splitlines()[-1])
    assert found["uid"] == 65534  # not root
    assert all(v != "connected" for v in found["net"].values()), found["net"]
    assert found["dns"] != "resolved"
    assert found["write"][scratch] == "written"  # the scratch dir is writable ...
    for path in paths:  # ... and nothing else
        assert found["write"][path] != "written", (path, found["write"][path])
    assert found["mkdir"] != "made"
    # nothing reached the worker's filesystem (seen from the worker, through its own /etc overlay)
    for path in [*paths, scratch, f"/qeval-dir-{nonce}"]:
        assert worker.run("test", "-e", path, check=False).returncode == 1, path
        assert not Path(path).exists(), path
    assert qeval_containers(cluster) == []


HOSTILE = {
    "fork_bomb": (
        "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n",
        ("time limit", "killed", "CPU time"),
    ),
    "memory_hog": ("hog = []\nwhile True:\n    hog.append(bytearray(16 << 20))\n", ("memory limit",)),
    "busy_loop": ("while True:\n    pass\n", ("time limit", "CPU time", "killed")),
    "sleep_loop": ("import time\nwhile True:\n    time.sleep(1)\n", ("time limit",)),
    "signal_dodger": (
        "import signal, time\nfor s in (signal.SIGTERM, signal.SIGXCPU, signal.SIGALRM):\n    signal.signal(s, signal.SIG_IGN)\n"
        "while True:\n    time.sleep(0.1)\n",
        ("time limit",),
    ),
    # the runner's own stdout is one of the open descriptors: written to, it reaches the sandbox's reader
    "output_flood": (
        "import os\nwhile True:\n    for fd in range(1, 10):\n        try:\n            os.write(fd, b'x' * 65536)\n"
        "        except OSError:\n            pass\n",
        ("more output than the sandbox reads",),
    ),
    "exits_early": ("import os\nos._exit(0)\n", ("without a verdict",)),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_code_is_stopped_by_the_limits_and_fails(cluster: LineCluster, name: str) -> None:
    body, reasons = HOSTILE[name]
    task = Task("hostile", "x", 16, Code("solve", ("assert solve() == 1",)))
    box = worker_sandbox(cluster, Limits(seconds=4, memory_mib=128, pids=32))
    started = time.monotonic()
    answer = "```python\n" + body + "def solve():\n    return 1\n```"
    verdict = suite.score(task, Answer(answer), box)
    took = time.monotonic() - started
    assert not verdict.passed, verdict
    assert any(r in verdict.reason for r in reasons), verdict.reason
    assert took < 4 + 30, took
    assert qeval_containers(cluster) == []
    # no process of the container left on the worker (a killed container's go within moments)
    deadline = time.monotonic() + 10
    while (left := sandbox_processes(cluster)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert left == []


def sandbox_processes(cluster: LineCluster) -> list[str]:
    out = cluster.hosts[1].run("sh", "-c", "ps -eo stat,args | grep '[p]ython3 -I -B' || true", check=False).stdout
    return [line for line in out.splitlines() if line.strip() and not line.lstrip().startswith("Z")]


def test_the_sandbox_refuses_the_head(cluster: LineCluster, tmp_path: Path) -> None:
    key = tmp_path / "key"
    key.write_text("sk-qeval\n")
    key.chmod(0o600)
    common = [
        "qeval",
        "--profile",
        str(cluster.profile),
        "--kind",
        "code",
        "--url",
        "http://127.0.0.1:9",
        "--api-key-file",
        str(key),
    ]
    head = cluster.hosts[0]
    for extra, needle in (
        (["--sandbox-node", head.name], f"--sandbox-node {head.name}: {head.name} is the head (rank 0)"),
        (["--sandbox-host", f"root@{head.address}"], f"--sandbox-host root@{head.address}: {head.address} is the head"),
        (["--sandbox-node", "node9"], "--sandbox-node 'node9': no node of that name"),
    ):
        proc = tp4(*common, *extra)
        assert proc.returncode == 2 and needle in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr
    # nothing ran anywhere: no container was ever made on the head
    assert cluster.containers(head) == []


# --- end to end: a local stand-in engine answering from a script -------------------------------------


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Head, Path]]:
    root = tmp_path_factory.mktemp("engine")
    answers = root / "answers.json"
    answers.write_text("[]")
    head = Head(root, {"TP4_STANDIN_ANSWERS": str(answers)})
    try:
        yield head, answers
    finally:
        head.stop()


def script(answers: Path, wrong: frozenset[str] | set[str] = frozenset()) -> None:
    entries = [
        {"contains": t.prompt, "answer": bad(t)[0] if t.id in wrong else good(t)}
        for t in sorted(TASKS, key=lambda t: -len(t.prompt))
    ]
    answers.write_text(json.dumps(entries))


def e2e(cluster: LineCluster, head: Head, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    key = tmp_path / "key"
    key.write_text(head.ep.key.reveal() + "\n" if head.ep.key else "")
    key.chmod(0o600)
    return tp4(
        "qeval",
        "--profile",
        str(cluster.profile),
        "--url",
        head.url,
        "--model",
        head.ep.model,
        "--api-key-file",
        str(key),
        *args,
    )


def test_all_good_answers_score_full_marks(cluster: LineCluster, engine: tuple[Head, Path], tmp_path: Path) -> None:
    head, answers = engine
    script(answers)
    out = tmp_path / "results.json"
    proc = e2e(
        cluster,
        head,
        tmp_path,
        "--json",
        "--out",
        str(out),
        "--fail-below",
        str(len(TASKS)),
        "--baseline",
        str(suite.shipped_baseline()),
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc == json.loads(out.read_text())
    assert doc["score"] == {
        "passed": len(TASKS),
        "total": len(TASKS),
        "by_kind": {k: {"passed": n, "total": n} for k, n in Counter(t.kind for t in TASKS).items()},
    }
    assert [t["id"] for t in doc["tasks"]] == [t.id for t in TASKS]
    assert doc["sandbox"]["node"] == cluster.hosts[1].name and doc["sandbox"]["image"] == cluster.plan.image.tag
    assert doc["baseline"]["newly_failing"] == [] and doc["baseline"]["newly_passing"] == []
    first = doc["tasks"][0]
    assert first["answer"]["first"].startswith("Here is the function") and first["finish_reason"] == "stop"
    assert f"[{len(TASKS)}/{len(TASKS)}]" in proc.stderr  # progress on stderr
    assert qeval_containers(cluster) == []


def test_bad_answers_fail_and_the_baseline_names_them(
    cluster: LineCluster, engine: tuple[Head, Path], tmp_path: Path
) -> None:
    head, answers = engine
    wrong = {"code_rle", "json_escape", "math_gcd", "fmt_csv", "prose_tcp"}
    script(answers, wrong)
    proc = e2e(
        cluster, head, tmp_path, "--baseline", str(suite.shipped_baseline()), "--fail-below", str(len(TASKS) - 4)
    )
    assert proc.returncode == 1, proc.stderr
    assert (
        f"error: qeval: {len(TASKS) - 5} of {len(TASKS)} tasks passed, below --fail-below {len(TASKS) - 4}"
        in proc.stderr
    )
    failed = {line.split()[1] for line in proc.stdout.splitlines() if line.startswith("FAIL ")}
    assert failed == wrong
    assert f"score: {len(TASKS) - 5}/{len(TASKS)} passed" in proc.stdout
    assert "5 newly failing, 0 newly passing" in proc.stdout
    assert {line.split(": ")[1] for line in proc.stdout.splitlines() if "newly failing: " in line} == wrong
    # the same run, only some tasks, against a baseline in which they failed: now they pass
    script(answers)
    base = tmp_path / "base.json"
    base.write_text(
        json.dumps({"tp4": {"kind": "qeval-baseline"}, "label": "old", "results": {i: "fail" for i in wrong}})
    )
    proc = e2e(cluster, head, tmp_path, "--only", ",".join(sorted(wrong)), "--baseline", str(base), "--fail-below", "5")
    assert proc.returncode == 0, proc.stderr
    assert "score: 5/5 passed" in proc.stdout and "0 newly failing, 5 newly passing" in proc.stdout


def test_a_sandbox_that_cannot_run_stops_the_run(
    cluster: LineCluster, engine: tuple[Head, Path], tmp_path: Path
) -> None:
    head, answers = engine
    script(answers)
    proc = e2e(cluster, head, tmp_path, "--kind", "code", "--sandbox-image", "localhost/no-such-image:1")
    assert proc.returncode == 1, proc.stderr
    assert f"sandbox on {cluster.hosts[1].name}" in proc.stderr and "holds the image" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_any_endpoint_with_a_sandbox_host_over_ssh(
    cluster: LineCluster, engine: tuple[Head, Path], tmp_path: Path
) -> None:
    """--url without a profile: the sandbox is the ssh target named, the image named."""
    head, answers = engine
    script(answers, {"code_rle"})
    key = tmp_path / "key"
    key.write_text(head.ep.key.reveal() + "\n" if head.ep.key else "")
    key.chmod(0o600)
    worker = cluster.hosts[2]
    proc = tp4(
        "qeval",
        "--url",
        head.url,
        "--model",
        head.ep.model,
        "--api-key-file",
        str(key),
        "--only",
        "code_rle,code_fizzbuzz",
        "--sandbox-host",
        f"root@{worker.address}",
        "--ssh-option",
        f"IdentityFile={cluster.hosts.key}",
        "--sandbox-image",
        cluster.plan.image.tag,
        "--json",
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["sandbox"]["node"] == f"root@{worker.address}"
    assert {t["id"]: t["passed"] for t in doc["tasks"]} == {"code_fizzbuzz": True, "code_rle": False}
    assert qeval_containers(cluster) == []
