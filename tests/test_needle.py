"""`tp4 bench needle` (tp4.measuring.needle, tp4.cli.needle) against the stand-in engine (tests/standin/engine.py)
run as a plain process on this host's loopback: its engine role (`engine.py python -m
sglang.launch_server ...`, rank 0 of one node) serving the API with a key. The stand-in counts a
prompt's words as its tokens (about 5.7 characters each in the filler, where a real tokenizer
gives about 4): the sizing must come from usage, not from an assumed ratio. The head whose
memory --watch-memory reads is this machine (`nodes_of(plan, local_head=True)`).

The command runs through tp4's real entry point (tp4.cli.main) in a subprocess: as `tp4 bench
needle` once the bench group is there, else registered as `tp4 needle` for the run."""

from __future__ import annotations

import collections
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
import pytest

from tp4.core import apikey

from tp4.measuring import needle

from tp4.serving import api, serve
from tp4.cli import SUBCOMMANDS
from tp4.core.errors import Tp4Error
from tp4.hosts.nodes import Node, nodes_of
from tp4.line.plan import build_plan
from tp4.line.profile.load import load_default

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parent.parent
ENGINE = REPO / "tests" / "standin" / "engine.py"
KEY = "sk-needle-5be0c6a1d2f94e37"
MODEL = "deepseek-v4.1-flash"
# tp4 bench needle through the real entry point; `tp4 needle` until the bench group exists
RUNNER = """import sys
from tp4.cli import SUBCOMMANDS, main
if "bench" in SUBCOMMANDS:
    main(["bench", "needle", *sys.argv[1:]])
SUBCOMMANDS["needle"] = ("tp4.cli.needle", "needle", "")
main(["needle", *sys.argv[1:]])
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Engine:
    """The stand-in's engine role on a free loopback port, with the API key and test controls."""

    def __init__(self, root: Path, extra: dict[str, str]) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = root / f"engine-{self.port}.log"
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "TP4_STANDIN_PACE": "0",
            "TP4_STANDIN_API_KEY": KEY,
            "TP4_STANDIN_ROOT": str(root),
            **extra,
        }
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-u",
                    str(ENGINE),
                    "python",
                    "-m",
                    "sglang.launch_server",
                    "--model-path",
                    "/models/DeepSeek-V4.1-Flash",
                    "--served-model-name",
                    MODEL,
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(self.port),
                ],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + 20
        while api.health(api.Endpoint.of(self.url, MODEL), 1) != 200:
            assert self.proc.poll() is None and time.monotonic() < deadline, self.log.read_text()[-2000:]
            time.sleep(0.05)
        self.ep = api.Endpoint.of(self.url, MODEL, apikey.Secret(KEY))

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Callable[..., Engine]]:
    engines: list[Engine] = []

    def go(**extra: str) -> Engine:
        engines.append(Engine(tmp_path, extra))
        return engines[-1]

    try:
        yield go
    finally:
        for e in engines:
            e.stop()


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    e = Engine(tmp_path_factory.mktemp("needle"), {})
    try:
        yield e
    finally:
        e.stop()


@pytest.fixture
def key_file(tmp_path: Path) -> str:
    path = tmp_path / "api-key"
    path.write_text(KEY + "\n")
    path.chmod(0o600)
    return str(path)


def tp4_needle(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", RUNNER, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": str(REPO / "python")},
    )


def against(e: Engine, key_file: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return tp4_needle("--url", e.url, "--model", MODEL, "--api-key-file", key_file, *args, timeout=timeout)


# --- against the stand-in --------------------------------------------------------------------------


def test_pass_at_several_lengths_sized_from_usage(engine: Engine, key_file: str, tmp_path: Path) -> None:
    out = tmp_path / "needle.json"
    proc = against(engine, key_file, "--lengths", "2k,10000,50k", "--seed", "11", "--json", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert json.loads(out.read_text()) == doc
    assert doc["status"] == "PASS" and doc["config"]["lengths"] == [2000, 10000, 50000] and doc["config"]["seed"] == 11
    assert doc["tp4"]["kind"] == "needle" and doc["tp4"]["plan_digest"] is None
    # the stand-in's words: ~5.7 characters each, which calibration found (a fixed 4 would be 40 % off)
    assert 5.0 < doc["calibration"]["charsPerToken"] < 6.5
    for row, target in zip(doc["results"], (2000, 10000, 50000), strict=True):
        assert row["status"] == "PASS" and row["error"] is None
        assert row["targetTokens"] == target
        assert abs(row["promptTokens"] - target) <= 0.03 * target, row  # the real count (usage), within 3 %
        assert row["passphrase"] in row["answerPreview"]
        assert re.fullmatch(r"[a-z]+-[a-z]+-[0-9]{4}", row["passphrase"])
        assert abs(row["depth"] - 0.37) < 0.01
        assert row["seconds"] is not None and row["memory"] is None
    assert len({row["passphrase"] for row in doc["results"]}) == 3  # one per length
    assert KEY not in proc.stdout + proc.stderr + out.read_text()
    assert "calibrating" in proc.stderr  # progress on stderr, the result alone on stdout


def test_the_table_and_a_million_tokens(engine: Engine, key_file: str) -> None:
    started = time.monotonic()
    proc = against(engine, key_file, "--lengths", "1011084", "--depth", "0.37")
    took = time.monotonic() - started
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].split()[:4] == ["length", "prompt", "tokens", "depth"]
    row = lines[1].split()
    assert row[0] == "1,011,084" and row[6] == "PASS"
    tokens = int(row[1].replace(",", ""))
    # the size was refined by nothing (calibration alone, from a 32,000-character sample of a random
    # filler): within 3 %, as the other lengths (a 1 % bound failed once, at 1.04 %)
    assert abs(tokens - 1_011_084) <= 0.03 * 1_011_084
    assert took < 20, f"the 1M-token run took {took:.1f} s"


def test_usage_of_one_length_sizes_the_next(engine: Engine) -> None:
    """A calibration 20 % off sizes the first length 20 % off; its usage sizes the second."""
    good = needle.calibrate(engine.ep, 5, 30)
    wrong = needle.Calibration(good.fixed_tokens, good.tokens_per_char * 1.25, good.sample_chars, good.sample_tokens)
    run = needle.run(engine.ep, [30000, 30001], seed=5, calibration=wrong)
    first, second = run.results
    assert first.prompt_tokens is not None and second.prompt_tokens is not None
    assert first.deviation is not None and -0.22 < first.deviation < -0.18
    assert second.deviation is not None and abs(second.deviation) < 0.01
    assert run.calibration == wrong and run.status == "PASS"


def test_fail_when_the_needle_is_lost(start: Callable[..., Engine], key_file: str, tmp_path: Path) -> None:
    e = start(TP4_STANDIN_NEEDLE_LOST_BEYOND="20000")
    out = tmp_path / "lost.json"
    proc = against(e, key_file, "--lengths", "5k,40k", "--out", str(out))
    assert proc.returncode == 1, proc.stderr
    assert "error: needle: FAIL at 40,000 tokens" in proc.stderr and "Traceback" not in proc.stderr
    rows = {r[0]: r for r in (line.split() for line in proc.stdout.splitlines()[1:])}
    assert rows["5,000"][6] == "PASS" and rows["40,000"][6] == "FAIL"
    doc = json.loads(out.read_text())
    assert doc["status"] == "FAIL"
    lost = doc["results"][1]
    assert lost["status"] == "FAIL" and lost["passphrase"] not in lost["answerPreview"]
    assert lost["error"] == "the answer does not give the passphrase back" and "could not find" in lost["answerPreview"]


def test_too_long_input_is_reported_and_the_next_length_runs(start: Callable[..., Engine], key_file: str) -> None:
    e = start(TP4_STANDIN_CONTEXT_TOKENS="40000")
    proc = against(e, key_file, "--lengths", "5k,60k,8k", "--json")
    assert proc.returncode == 1
    doc = json.loads(proc.stdout)
    short, refused, after = doc["results"]
    assert short["status"] == "PASS" and after["status"] == "PASS"
    assert refused["status"] == "FAIL" and refused["promptTokens"] is None
    assert refused["error"].startswith("refused as too long: ")
    assert re.search(
        r"HTTP 400: The input \(\d+ tokens\) is longer than the model's context length \(40000 tokens\)\.",
        refused["error"],
    )
    assert "fix: lengths below the line's context length" in refused["error"]
    assert "error: needle: FAIL at 60,000 tokens" in proc.stderr and "Traceback" not in proc.stderr


def test_the_api_down_stops_the_run_with_a_clear_error(key_file: str) -> None:
    proc = tp4_needle("--url", f"http://127.0.0.1:{free_port()}", "--model", MODEL, "--lengths", "2k")
    assert proc.returncode == 1
    assert "API down (connection refused)" in proc.stderr and "Traceback" not in proc.stderr and proc.stdout == ""


def test_a_wrong_key_is_refused_by_name(engine: Engine, tmp_path: Path) -> None:
    bad = tmp_path / "bad-key"
    bad.write_text("sk-wrong\n")
    bad.chmod(0o600)
    proc = against(engine, str(bad), "--lengths", "2k")
    assert (
        proc.returncode == 1 and "the API key was refused (HTTP 401)" in proc.stderr and "sk-wrong" not in proc.stderr
    )


def test_the_profile_names_the_endpoint_plan_and_image(engine: Engine, key_file: str, tmp_path: Path) -> None:
    profile = tmp_path / "profile.toml"
    profile.write_text(
        f'preset = "production"\n[cluster]\nuser = "root"\nport = {engine.port}\n'
        '[cluster.head]\nname = "spark1"\nip = "127.0.0.1"\n'
        + "".join(f'[[cluster.workers]]\nname = "spark{i}"\nip = "127.0.0.{i}"\n' for i in (2, 3, 4))
        + f'[api]\nkey_file = "{key_file}"\n'
    )
    proc = tp4_needle("--profile", str(profile), "--lengths", "3k", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["config"]["base"] == engine.url and doc["node"] == "127.0.0.1"
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", doc["tp4"]["plan_digest"])
    assert doc["tp4"]["image"] and doc["tp4"]["profile"] == str(profile)
    assert doc["results"][0]["status"] == "PASS"


def test_watch_memory_records_the_heads_low_water_mark(
    engine: Engine, start: Callable[..., Engine], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The head is this machine: its /proc/meminfo is read before, every 0.2 s during and after a
    3 s answer, and the low-water mark is the least of those reads. (This machine's MemAvailable
    moves by up to a GiB on its own, so the test checks the reads, not a drop it causes.)"""
    cal = needle.calibrate(engine.ep, 3, 30)  # on a fast engine: only the measured request is slow
    e = start(TP4_STANDIN_FAULT="busy", TP4_STANDIN_BUSY_SECONDS="3")
    head = nodes_of(build_plan(load_default()), local_head=True)[0]
    real = serve.mem_available
    reads: list[tuple[float, int | None]] = []

    def spy(node: Node, *, timeout: float = 20) -> int | None:
        value = real(node, timeout=timeout)
        reads.append((time.monotonic(), value))
        return value

    monkeypatch.setattr(serve, "mem_available", spy)
    started = time.monotonic()
    run = needle.run(e.ep, [4000], seed=3, watch=head, interval=0.2, calibration=cal)
    (result,) = run.results
    assert result.status == "PASS" and result.memory is not None and result.seconds is not None
    mem = result.memory
    during = reads[1:]  # the first: the check before the run
    assert mem.errors == [] and all(value is not None for _, value in reads)
    assert mem.samples == len(during) >= 12  # 3 s at 0.2 s, the first and the last
    values = [value for _, value in during if value is not None]
    assert mem.before == values[0] and mem.low_water == min(values)
    times = [t for t, _ in during]
    assert times[0] - started < 1.0 and times[-1] - times[0] >= result.seconds - 0.1  # before the request to after it
    assert max(b - a for a, b in zip(times, times[1:], strict=False)) < 1.0  # read all along
    with open("/proc/meminfo") as fh:
        total = serve.meminfo(fh.read())["MemTotal"]
    assert 0 < mem.low_water <= mem.before <= total
    assert result.to_json()["memory"] == {
        "beforeBytes": mem.before,
        "lowWaterBytes": mem.low_water,
        "samples": mem.samples,
        "error": None,
    }


def test_watch_memory_is_refused_up_front_when_the_head_cannot_be_read(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    head = nodes_of(build_plan(load_default()), local_head=True)[0]
    asked: list[str] = []

    def unreadable(node: Node, *, timeout: float = 20) -> int | None:
        asked.append(node.name)
        return None

    monkeypatch.setattr(serve, "mem_available", unreadable)
    progress: list[str] = []
    with pytest.raises(
        Tp4Error, match=r"^--watch-memory: spark1: MemAvailable cannot be read from /proc/meminfo; fix: "
    ):
        needle.run(engine.ep, [2000], seed=1, watch=head, progress=progress.append)
    assert asked == ["spark1"] and progress == []  # before any request


def test_meminfo_is_read_in_bytes() -> None:
    head = nodes_of(build_plan(load_default()), local_head=True)[0]
    value = serve.mem_available(head)
    assert value is not None and value > 1 << 20
    assert serve.meminfo("MemTotal:       16384 kB\nMemAvailable:    8192 kB\nHugePages_Total:       4\n") == {
        "MemTotal": 16 << 20,
        "MemAvailable": 8 << 20,
        "HugePages_Total": 4,
    }


# --- the prompt -------------------------------------------------------------------------------------


@pytest.mark.parametrize("depth", [0.0, 0.1, 0.37, 0.5, 0.9, 1.0])
def test_the_needle_is_at_the_depth_asked(depth: float) -> None:
    prompt = needle.build(7, "depth", 240_000, depth)
    sentence = f"The secret passphrase is {prompt.code}."
    assert prompt.text.count(sentence) == 1 and prompt.text.index(sentence) == prompt.offset
    assert abs(prompt.depth - depth) < 0.002
    words = prompt.text.split()
    at = prompt.text[: prompt.offset].split()
    assert abs(len(at) / len(words) - depth) < 0.005  # in the stand-in's tokens too
    assert prompt.text.startswith(needle.INTRO) and prompt.text.endswith(needle.QUESTION)


def test_the_prompt_is_deterministic_from_its_seed_and_stream() -> None:
    a, b = needle.build(9, "length-0-99000", 50_000, 0.37), needle.build(9, "length-0-99000", 50_000, 0.37)
    assert a == b
    other = needle.build(9, "length-1-198000", 50_000, 0.37)
    seed = needle.build(10, "length-0-99000", 50_000, 0.37)
    assert other.code != a.code and seed.code != a.code
    # no shared prefix beyond the intro: neither across lengths nor across seeds
    for c in (other, seed):
        common = os.path.commonprefix([a.text, c.text])
        assert len(common) < len(needle.INTRO) + 40


def test_the_filler_is_varied() -> None:
    sentences = needle.filler(1, "varied", 400_000)
    words = " ".join(sentences).split()
    counts = collections.Counter(words)
    assert len(words) > 60_000
    assert len(counts) > 5_000  # names, words, numbers: not one token
    assert counts.most_common(1)[0][1] / len(words) < 0.15
    assert len(set(sentences)) / len(sentences) > 0.98
    trigrams = collections.Counter(zip(words, words[1:], words[2:], strict=False))
    assert len(trigrams) / (len(words) - 2) > 0.3  # the Engram rows an n-gram hash spreads over
    assert not any("passphrase" in s or "secret" in s for s in sentences)
    assert not set(needle.CODE_WORDS) & {w.strip(".,").lower() for w in counts}


def test_a_prompt_without_filler() -> None:
    prompt = needle.build(1, "bare", 0, 0.37)
    assert prompt.text == needle.INTRO + f"The secret passphrase is {prompt.code}." + needle.QUESTION
    assert prompt.filler_chars == 0


# --- hostile input ------------------------------------------------------------------------------------


@pytest.fixture
def cli(
    tp4_cli: Callable[..., tuple[int, str, str]], monkeypatch: pytest.MonkeyPatch
) -> Callable[..., tuple[int, str, str]]:
    if "bench" in SUBCOMMANDS:
        return lambda *args: tp4_cli("bench", "needle", *args)
    monkeypatch.setitem(SUBCOMMANDS, "needle", ("tp4.cli.needle", "needle", ""))
    return lambda *args: tp4_cli("needle", *args)


URL = ("--url", "http://127.0.0.1:9", "--model", MODEL)


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (("--lengths", "0"), "--lengths '0'"),
        (("--lengths", "-5"), "--lengths '-5'"),
        (("--lengths", "999"), "--lengths '999'"),
        (("--lengths", "99999999999999999999999"), "--lengths '99999999999999999999999'"),
        (("--lengths", "18446744073709551617"), "--lengths '18446744073709551617'"),
        (("--lengths", "9000000"), "--lengths '9000000'"),
        (("--lengths", "9M"), "--lengths '9M'"),
        (("--lengths", "true"), "--lengths 'true'"),
        (("--lengths", "False"), "--lengths 'False'"),
        (("--lengths", ""), "--lengths ''"),
        (("--lengths", "2k,,4k"), "--lengths '2k,,4k'"),
        (("--lengths", "1.5k"), "--lengths '1.5k'"),
        (("--lengths", "2k,2000"), "--lengths '2000'"),
        (("--lengths", "1_000_000"), "--lengths '1_000_000'"),
        (("--lengths", "２０００"), "--lengths '２０００'"),
        (("--lengths", ",".join(str(2000 + i) for i in range(65))), "--lengths: 65 lengths"),
        (("--depth", "-0.1"), "--depth '-0.1'"),
        (("--depth", "1.01"), "--depth '1.01'"),
        (("--depth", "nan"), "--depth 'nan'"),
        (("--depth", "inf"), "--depth 'inf'"),
        (("--depth", "true"), "--depth 'true'"),
        (("--depth", "37%"), "--depth '37%'"),
        (("--seed", "-1"), "--seed '-1'"),
        (("--seed", str(2**64)), f"--seed '{2**64}'"),
        (("--seed", "true"), "--seed 'true'"),
        (("--timeout", "0"), "--timeout '0'"),
        (("--timeout", "nan"), "--timeout 'nan'"),
        (("--timeout", "1e400"), "--timeout '1e400'"),
        (("--max-tokens", "0"), "--max-tokens '0'"),
        (("--max-tokens", "2.5"), "--max-tokens '2.5'"),
        (("--memory-interval", "0"), "--memory-interval '0'"),
        (("--out", "/nonexistent-dir/needle.json"), "--out /nonexistent-dir/needle.json"),
        (("--out", "/tmp"), "--out /tmp"),
        (("--out", "/dev/null"), "--out /dev/null: is not a regular file"),
    ],
)
def test_hostile_input_exits_2_naming_the_field(
    cli: Callable[..., tuple[int, str, str]], args: tuple[str, ...], field: str
) -> None:
    code, out, err = cli(*URL, *args)
    assert code == 2, err
    assert err.startswith(f"error: {field}") and "; fix: " in err, err
    assert "Traceback" not in err and "internal error" not in err and out == ""


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ("--url", "ftp://127.0.0.1:9", "--model", MODEL),
            "error: --url 'ftp://127.0.0.1:9': not an API address of the form http://HOST:PORT; fix:",
        ),
        (
            ("--url", "http://127.0.0.1:9/v1", "--model", MODEL),
            "error: --url 'http://127.0.0.1:9/v1': not an API address",
        ),
        (("--url", "http://127.0.0.1:9"), "error: --model: needed with --url; fix:"),
        (("--model", MODEL), "error: --model: only with --url; fix:"),
        (("--api-key-file", "/nonexistent"), "error: --api-key-file: only with --url; fix:"),
        ((*URL, "--api-key-file", "/nonexistent/key"), "error: api.key_file: /nonexistent/key does not exist; fix:"),
        (
            (*URL, "--watch-memory"),
            "error: --watch-memory: needs the line's head node, which --url does not name; fix:",
        ),
        ((*URL, "--profile", "/nonexistent.toml"), "error: --url: with --profile too; fix:"),
    ],
)
def test_endpoint_options_are_checked(
    cli: Callable[..., tuple[int, str, str]], args: tuple[str, ...], message: str
) -> None:
    code, out, err = cli(*args, "--lengths", "2k")
    assert code == 2 and err.startswith(message), err
    assert out == ""


def test_nothing_is_written_on_bad_input(cli: Callable[..., tuple[int, str, str]], tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    code, _, _ = cli(*URL, "--depth", "2", "--out", str(out))
    assert code == 2 and not out.exists() and list(tmp_path.iterdir()) == []


def test_lengths_accept_k_and_m_suffixes() -> None:
    assert needle.parse_lengths("99k, 198k,746K,1011084,1M") == (99_000, 198_000, 746_000, 1_011_084, 1_000_000)
    assert needle.parse_lengths(",".join(str(n) for n in needle.DEFAULT_LENGTHS)) == needle.DEFAULT_LENGTHS
