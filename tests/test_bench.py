"""`tp4 bench decode|prefill` against the stand-in engine (tests/standin/engine.py), run as a
plain local process in its engine role on a free loopback port, paced by its bench controls
(TP4_STANDIN_DECODE_TPS, TP4_STANDIN_TOKENS_PER_EVENT, TP4_STANDIN_PREFILL_TPS): real HTTP,
real SSE, the tp4 command as a user runs it (a subprocess). The numbers are checked against
what the rates set make them by hand, and against sparkDash's formulas over the stream times the
result records; foreign traffic is real requests sent meanwhile; resume follows a SIGKILL."""

from __future__ import annotations

import json
import math
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from standin.engine import PROSE

from tp4.measuring.throughput import prompts

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parent.parent
ENGINE = REPO / "tests" / "standin" / "engine.py"
MODEL = "standin-model"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Standin:
    """The stand-in's engine role on 127.0.0.1:<free port> (no network namespace, no boot.py), with
    the given controls (env) and engine arguments (extra)."""

    def __init__(self, tmp: Path, env: dict[str, str], extra: tuple[str, ...] = ()) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tmp / f"engine-{self.port}.log"
        full = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "TP4_STANDIN_PACE": "0", **env}
        argv = [sys.executable, "-u", str(ENGINE), "python", "-m", "sglang.launch_server", "--model-path", "/models/x"]
        argv += ["--served-model-name", MODEL, "--host", "127.0.0.1", "--port", str(self.port), *extra]
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(argv, env=full, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 20
        while "fired up and ready" not in self.log.read_text(errors="replace"):
            assert self.proc.poll() is None and time.monotonic() < deadline, self.log.read_text()[-2000:]
            time.sleep(0.02)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


@pytest.fixture
def standin(tmp_path: Path) -> Iterator[Callable[..., Standin]]:
    started: list[Standin] = []

    def go(**env: str) -> Standin:
        s = Standin(tmp_path, env)
        started.append(s)
        return s

    try:
        yield go
    finally:
        for s in started:
            s.stop()


def tp4_argv(*args: object) -> list[str]:
    return [sys.executable, "-m", "tp4", *map(str, args)]


def tp4_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO / "python")}


def tp4(*args: object, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(tp4_argv(*args), env=tp4_env(), capture_output=True, text=True, timeout=timeout)


def load(out: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((out / "result.json").read_text())
    return doc


def levels(doc: dict[str, Any]) -> list[tuple[str, int, dict[str, Any]]]:
    return [(e["job"]["config"]["promptType"], e["trial"], lv) for e in doc["decode"] for lv in e["job"]["results"]]


def salt_line(prompt: str) -> str:
    return prompt.split("\n", 1)[0]


def body(prompt: str) -> str:
    return prompt.split("\n", 1)[1] if prompt.startswith("[tp4-bench ") else prompt


# --- the numbers ----------------------------------------------------------------------------------


def test_decode_numbers_are_the_rates_set_and_sparkdash_formulas(
    standin: Callable[..., Standin], tmp_path: Path
) -> None:
    """100 tok/s per stream, 3 tokens per SSE event, prefill 500 tok/s: 31 tokens are 11 events
    (the last one 10 x 3 / 100 s = 300 ms after the first), so decode tok/s = 30 / 0.3 s = 100;
    TTFT = prompt tokens / 500; c2's aggregate = 60 decode tokens / ~0.3 s = 200."""
    s = standin(TP4_STANDIN_DECODE_TPS="100", TP4_STANDIN_TOKENS_PER_EVENT="3", TP4_STANDIN_PREFILL_TPS="500")
    out = tmp_path / "out"
    proc = tp4(
        "bench",
        "decode",
        "--url",
        s.url,
        "--levels",
        "1,2",
        "--max-tokens",
        "31",
        "--prompt-types",
        "prose",
        "--c1-runs",
        "2",
        "--warmup",
        "1",
        "--out",
        out,
    )
    assert proc.returncode == 0, proc.stderr
    doc = load(out)
    assert doc["status"] == "PASS" and doc["tp4"]["interrupted"] is False and doc["finished"]
    # sparkDash's names keep sparkDash's meanings: node is its Node.js version, source.commit a git commit
    assert doc["node"] is None and doc["tp4"]["host"] == "127.0.0.1"
    assert doc["source"]["commit"] is None and doc["source"]["release"] == doc["tp4"]["version"]
    # sparkDash's run.mjs flags as it writes them (numbers as the text of its command line), tp4's own under tp4
    config = doc["config"]
    assert config["model"] == MODEL and config["levels"] == "1,2" and config["trials"] == "1"
    assert config["decode-only"] is True and config["prefill-only"] is False and config["extended-concurrency"] is False
    assert config["base"].endswith("/v1") and config["out"] == str(out) and config["sizes"] == ""
    assert config["tp4"]["levels"] == [1, 2] and config["tp4"]["maxTokens"] == 31 and "maxTokens" not in config
    # c1 twice (trials 1 and 2), c2 once: one job per trial, with the levels it ran
    assert [
        (e["trial"], e["job"]["config"]["concurrencies"], [lv["concurrency"] for lv in e["job"]["results"]])
        for e in doc["decode"]
    ] == [(1, [1, 2], [1, 2]), (2, [1], [1])]
    for entry in doc["decode"]:  # a finished job as sparkDash leaves it: epoch-ms times, no level running, "Done"
        job = entry["job"]
        assert job["status"] == "completed" and job["error"] is None and "owner" in job
        assert isinstance(job["startedAt"], int) and isinstance(job["completedAt"], int)
        assert 1_700_000_000_000 < job["startedAt"] <= job["completedAt"]
        assert job["durationMs"] == job["completedAt"] - job["startedAt"]
        assert job["progress"] == {
            "currentConcurrency": None,
            "completedLevels": 2 if entry["trial"] == 1 else 1,
            "totalLevels": 2 if entry["trial"] == 1 else 1,
            "message": "Done",
        }
    for _, _, level in levels(doc):
        c = level["concurrency"]
        assert level["streamsOk"] == c and level["streamsFailed"] == 0 and level["error"] is None
        assert (
            level["tp4"]["invalid"] is None
            and level["tp4"]["maxRunning"] is not None
            and level["tp4"]["maxRunning"] <= c
        )
        for st in level["streams"]:
            # tokens from usage: 31, although the stream had 11 content events (13 with the role and usage chunks)
            assert st["usage"] == {
                "promptTokens": st["prefillTokens"],
                "completionTokens": 31,
                "totalTokens": st["prefillTokens"] + 31,
            }
            assert st["completionTokens"] == 31 and st["decodeTokens"] == 30
            assert st["http"]["sseEventCount"] == 13 and st["http"]["finishReason"] == "length"
            assert st["http"]["url"] == s.url.rstrip("/") + "/v1/chat/completions"  # the full URL, as sparkDash's
            assert math.ceil(st["contentPreview"]["chars"] / 4) != 31  # the text estimate would be wrong here
            # the stand-in's pace, plus what a busy 2-core machine adds
            assert st["decodeMs"] == pytest.approx(300, rel=0.35)
            assert st["decodeTps"] == pytest.approx(100, rel=0.08)
            assert st["decodeTps"] == pytest.approx(30 / (st["decodeMs"] / 1000), rel=1e-3)
            expected_ttft = st["prefillTokens"] / 500 * 1000
            assert expected_ttft <= st["ttftMs"] <= expected_ttft + 40, (st["ttftMs"], expected_ttft)
            assert st["prefillTps"] == pytest.approx(st["prefillTokens"] / (st["ttftMs"] / 1000), rel=1e-3)
            assert st["prefillTps"] == pytest.approx(500, rel=0.25)
        # the level's aggregates by sparkDash's formulas, over the stream times the result keeps
        streams = level["streams"]
        span = max(x["tp4"]["tLastMs"] for x in streams) - min(x["tp4"]["tFirstMs"] for x in streams)
        assert level["aggregateDecodeTps"] == pytest.approx(30 * c / (span / 1000), rel=1e-3)
        assert level["aggregateDecodeTps"] == pytest.approx(100 * c, rel=0.12)
        prefill_span = max(x["tp4"]["tFirstMs"] for x in streams) - min(x["tp4"]["t0Ms"] for x in streams)
        total_prefill = sum(x["prefillTokens"] for x in streams)
        assert level["totalPrefillTokens"] == total_prefill and level["totalDecodeTokens"] == 30 * c
        assert level["totalCompletionTokens"] == 31 * c
        assert level["aggregatePrefillTps"] == pytest.approx(total_prefill / (prefill_span / 1000), rel=1e-3)
        assert level["aggregatePrefillTps"] == pytest.approx(500 * c, rel=0.3)
        tps = sorted(x["decodeTps"] for x in streams)
        assert level["minDecodeTps"] == tps[0] and level["maxDecodeTps"] == tps[-1]
        assert level["meanDecodeTps"] == pytest.approx(sum(tps) / c, abs=1e-3)
    # the summary: c1 is the median of its two runs
    c1 = [lv["aggregateDecodeTps"] for _, _, lv in levels(doc) if lv["concurrency"] == 1]
    row = next(line for line in proc.stdout.splitlines() if line.split()[:3] == ["prose", "1", "2"])
    assert float(row.split()[3]) == pytest.approx(sum(c1) / 2, abs=0.06)


def test_more_tokens_per_event_are_counted_from_usage(standin: Callable[..., Standin], tmp_path: Path) -> None:
    s = standin(TP4_STANDIN_TOKENS_PER_EVENT="5", TP4_STANDIN_DECODE_TPS="500")
    out = tmp_path / "out"
    proc = tp4(
        "bench",
        "decode",
        "--url",
        s.url,
        "--levels",
        "4",
        "--max-tokens",
        "41",
        "--prompt-types",
        "code",
        "--warmup",
        "0",
        "--out",
        out,
    )
    assert proc.returncode == 0, proc.stderr
    ((_, _, level),) = levels(load(out))
    for st in level["streams"]:
        assert st["http"]["sseEventCount"] == 9 + 2 and st["completionTokens"] == 41 and st["decodeTokens"] == 40
        # 9 events, the last 8 x 5 / 500 s = 80 ms after the first
        assert st["decodeMs"] == pytest.approx(80, abs=20)
    assert level["totalDecodeTokens"] == 160


def test_without_usage_the_text_is_estimated_and_a_400_is_retried_plain(
    standin: Callable[..., Standin], tmp_path: Path
) -> None:
    """An engine that refuses min_tokens/ignore_eos (HTTP 400) gets each request again without
    them (sparkDash's retry); the run says so and records it."""
    s = standin(TP4_STANDIN_NO_MIN_TOKENS="1")
    out = tmp_path / "out"
    proc = tp4(
        "bench",
        "decode",
        "--url",
        s.url,
        "--levels",
        "1",
        "--max-tokens",
        "200",
        "--prompt-types",
        "prose",
        "--c1-runs",
        "1",
        "--warmup",
        "0",
        "--out",
        out,
    )
    assert proc.returncode == 0, proc.stderr
    assert "refused min_tokens/ignore_eos/stop" in proc.stderr
    doc = load(out)
    assert doc["tp4"]["fellBack"] is True
    ((_, _, level),) = levels(doc)
    st = level["streams"][0]
    # the stand-in's plain answer: its prose words and EOS, finish_reason stop
    assert st["tp4"]["exact"] is False and st["http"]["finishReason"] == "stop"
    assert st["completionTokens"] == len(PROSE) + 1


# --- foreign traffic --------------------------------------------------------------------------------


def _foreign(url: str, n: int, max_tokens: int, started: threading.Event) -> list[threading.Thread]:
    def one() -> None:
        data = json.dumps(
            {
                "model": MODEL,
                "messages": [{"role": "user", "content": "someone else's request"}],
                "max_tokens": max_tokens,
                "ignore_eos": True,
                "stream": True,
            }
        ).encode()
        req = urllib.request.Request(
            url + "/v1/chat/completions", data=data, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=60) as resp:
            started.set()
            resp.read()

    threads = [threading.Thread(target=one, daemon=True) for _ in range(n)]
    for t in threads:
        t.start()
    return threads


def test_a_level_with_foreign_traffic_is_flagged_and_fails_the_run(
    standin: Callable[..., Standin], tmp_path: Path
) -> None:
    """c1 runs alone; while c2 runs, two foreign streams (4 s each) are in the engine: c2 is
    invalid (4 in the engine, 2 sent), c1 is not, and the command exits 1 saying so."""
    s = standin(TP4_STANDIN_DECODE_TPS="100")
    out = tmp_path / "out"
    proc = subprocess.Popen(
        tp4_argv(
            "bench",
            "decode",
            "--url",
            s.url,
            "--levels",
            "1,2",
            "--max-tokens",
            "61",
            "--prompt-types",
            "json",
            "--c1-runs",
            "1",
            "--warmup",
            "0",
            "--out",
            out,
        ),
        env=tp4_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while True:
        try:
            if load(out)["tp4"]["levels_done"] == ["json/1/1"]:
                break
        except (OSError, ValueError):
            pass
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.01)
    started = threading.Event()
    threads = _foreign(s.url, 2, 400, started)
    stdout, stderr = proc.communicate(timeout=60)
    for t in threads:
        t.join(30)
    assert started.is_set()
    assert proc.returncode == 1, stderr
    doc = load(out)
    assert doc["status"] == "FAIL"
    c1, c2 = (lv for _, _, lv in levels(doc))
    assert c1["tp4"]["invalid"] is None and c1["tp4"]["maxInEngine"] == 1
    assert c2["tp4"]["invalid"] == (
        "foreign traffic: up to 4 requests were in the engine (at most 4 running, 0 waiting) while this level sent 2"
    )
    assert c2["streamsOk"] == 2  # its numbers are kept, marked
    assert "invalid (foreign traffic)" in stdout and "json trial 1 c2: foreign traffic" in stderr
    assert "--allow-foreign" in stderr and "Traceback" not in stderr


def test_allow_foreign_exits_0_and_still_marks_the_level(standin: Callable[..., Standin], tmp_path: Path) -> None:
    """The busy fault: the load endpoint reports three more running and one waiting request."""
    s = standin(TP4_STANDIN_FAULT="busy", TP4_STANDIN_BUSY_SECONDS="0")
    out = tmp_path / "out"
    proc = tp4(
        "bench",
        "decode",
        "--url",
        s.url,
        "--levels",
        "1",
        "--max-tokens",
        "8",
        "--prompt-types",
        "prose",
        "--c1-runs",
        "1",
        "--warmup",
        "0",
        "--out",
        out,
        "--allow-foreign",
    )
    assert proc.returncode == 0, proc.stderr
    ((_, _, level),) = levels(load(out))
    assert level["tp4"]["invalid"] is not None and "while this level sent 1" in level["tp4"]["invalid"]
    assert "warning: 1 level(s) invalid" in proc.stderr


# --- resume -----------------------------------------------------------------------------------------


def test_resume_after_a_kill_keeps_the_finished_levels(standin: Callable[..., Standin], tmp_path: Path) -> None:
    s = standin(TP4_STANDIN_DECODE_TPS="100")
    out = tmp_path / "out"
    args = (
        "bench",
        "decode",
        "--url",
        s.url,
        "--levels",
        "1,2,4",
        "--max-tokens",
        "31",
        "--prompt-types",
        "prose,code",
        "--c1-runs",
        "1",
        "--warmup",
        "0",
        "--out",
        out,
    )
    proc = subprocess.Popen(tp4_argv(*args), env=tp4_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while True:
        try:
            if len(load(out)["tp4"]["levels_done"]) >= 2:
                break
        except (OSError, ValueError):
            pass
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    before = load(out)
    done = before["tp4"]["levels_done"]
    assert before["tp4"]["interrupted"] is True and before["finished"] is None and 2 <= len(done) < 6, done
    kept = [json.dumps(lv) for _, _, lv in levels(before)]
    assert len(kept) == len(done)
    assert not [p for p in out.iterdir() if p.name != "result.json" and not p.name.endswith(".tmp")]

    # another configuration is refused, the run left as it was
    other = tp4(*args[:5], "1,2", *args[6:])
    assert (
        other.returncode == 2
        and "another configuration" in other.stderr
        and "levels [1, 2, 4] -> [1, 2]" in other.stderr
    )
    assert load(out) == before

    again = tp4(*args)
    assert again.returncode == 0, again.stderr
    assert f"resuming {out / 'result.json'}: {len(done)} levels done" in again.stderr
    after = load(out)
    assert after["tp4"]["interrupted"] is False and after["started"] == before["started"]
    assert sorted(after["tp4"]["levels_done"]) == sorted(f"{k}/1/{c}" for k in ("prose", "code") for c in (1, 2, 4))
    assert after["tp4"]["levels_done"][: len(done)] == done
    now = [json.dumps(lv) for _, _, lv in levels(after)]
    assert now[: len(kept)] == kept  # byte-identical
    assert [(k, lv["concurrency"]) for k, _, lv in levels(after)] == [
        (k, c) for k in ("prose", "code") for c in (1, 2, 4)
    ]

    # a finished run is refused, --force runs it again
    finished = tp4(*args)
    assert finished.returncode == 2 and "holds a finished run" in finished.stderr and "--force" in finished.stderr
    forced = tp4(*args, "--force", "--prompt-types", "json", "--levels", "1")
    assert forced.returncode == 0, forced.stderr
    assert load(out)["tp4"]["levels_done"] == ["json/1/1"]


# --- prompts, salts -------------------------------------------------------------------------------


def test_same_prompts_salts_and_shared_prefix(standin: Callable[..., Standin], tmp_path: Path) -> None:
    s = standin()
    common = (
        "bench",
        "decode",
        "--url",
        s.url,
        "--levels",
        "1,2,4",
        "--max-tokens",
        "4",
        "--prompt-types",
        "structured",
        "--c1-runs",
        "1",
        "--warmup",
        "0",
    )

    def prompts_of(out: Path) -> dict[int, list[str]]:
        return {lv["concurrency"]: [st["prompt"] for st in lv["streams"]] for _, _, lv in levels(load(out))}

    # the default: sparkDash's prompt sets (a suffix per stream at N > 1), each with its own salt
    assert tp4(*common, "--out", tmp_path / "a").returncode == 0
    got = prompts_of(tmp_path / "a")
    base = prompts.PROMPTS["structured"]
    assert [body(p) for p in got[1]] == [base]
    assert [body(p) for p in got[4]] == [f"{base} (stream {i}/4)" for i in range(1, 5)]
    salts = [salt_line(p) for ps in got.values() for p in ps]
    assert len(set(salts)) == 7 and all(
        x.startswith("[tp4-bench ") and len(x) == len("[tp4-bench ]") + 12 for x in salts
    )
    doc = load(tmp_path / "a")
    assert doc["config"]["tp4"]["samePrompts"] is False and all(
        lv["tp4"]["salted"] and not lv["tp4"]["samePrompts"] for _, _, lv in levels(doc)
    )

    # --same-prompts: one prompt for every stream of every level, still salted apart
    assert tp4(*common, "--same-prompts", "--out", tmp_path / "b").returncode == 0
    got = prompts_of(tmp_path / "b")
    assert {body(p) for ps in got.values() for p in ps} == {base}
    assert len({salt_line(p) for ps in got.values() for p in ps}) == 7
    assert all(lv["tp4"]["samePrompts"] for _, _, lv in levels(load(tmp_path / "b")))

    # --shared-prefix: no salt at all
    assert tp4(*common, "--same-prompts", "--shared-prefix", "--out", tmp_path / "c").returncode == 0
    got = prompts_of(tmp_path / "c")
    assert [p for ps in got.values() for p in ps] == [base] * 7
    assert not any(lv["tp4"]["salted"] for _, _, lv in levels(load(tmp_path / "c")))


def test_the_four_prompt_types_by_default_and_their_texts() -> None:
    assert prompts.TYPES == ("structured", "prose", "code", "json")
    assert "1 to 200" in prompts.PROMPTS["structured"] and "hash map" in prompts.PROMPTS["prose"]
    assert (
        "clamp_00" in prompts.PROMPTS["code"]
        and "clamp_49" in prompts.PROMPTS["code"]
        and "JSON" in prompts.PROMPTS["json"]
    )


def test_the_filler_is_varied_words_not_one_token() -> None:
    text = prompts.filler(20000, "seed-a")
    words = text.lower().replace(".", "").split()
    assert len(text) == 20000 and len(set(words)) > 150
    top = max(words.count(w) for w in set(words))
    assert top < len(words) * 0.05
    assert prompts.filler(20000, "seed-a") == text and prompts.filler(20000, "seed-b") != text


# --- prefill ----------------------------------------------------------------------------------------


def test_prefill_on_a_corpus(standin: Callable[..., Standin], tmp_path: Path) -> None:
    """Real documents joined to each length (FIFOs, devices, binary files and symlinks skipped,
    never read), a unique salt per request, sized by the calibration to within 20 %; prefill
    tok/s is the rate set."""
    corpus = tmp_path / "corpus"
    (corpus / "sub").mkdir(parents=True)
    (corpus / "a-guide.md").write_text(
        "# The guide\n\n" + "Every node of the line keeps its own state directory. " * 40
    )
    (corpus / "sub" / "b-source.py").write_text(
        "def clamp(x: float, lo: float, hi: float) -> float:\n    return max(lo, min(hi, x))\n" * 30
    )
    (corpus / "c-latin1.txt").write_bytes("caf\xe9 cr\xe8me br\xfbl\xe9e, na\xefve fa\xe7ade. ".encode("latin-1") * 50)
    (corpus / "d-binary.bin").write_bytes(bytes(range(256)) * 8)
    os.mkfifo(corpus / "e-fifo")
    (corpus / "f-zero").symlink_to("/dev/zero")
    s = standin(TP4_STANDIN_PREFILL_TPS="4000")
    out = tmp_path / "out"
    proc = tp4("bench", "prefill", "--url", s.url, "--sizes", "300,1500", "--corpus", corpus, "--out", out, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "3 entries skipped" in proc.stderr
    doc = load(out)
    assert doc["tp4"]["kind"] == "prefill" and doc["tp4"]["corpus"] == "corpus" and doc["config"]["sizes"] == "300,1500"
    assert doc["tp4"]["calibration"]["charsPerToken"] > 1
    rows = doc["prefill"]
    assert [(r["trial"], r["targetTokens"]) for r in rows] == [(1, 300), (1, 1500), (2, 300), (2, 1500)]
    assert len({r["salt"] for r in rows}) == 4 and len({r["promptSha256"] for r in rows}) == 4
    for r in rows:
        req = r["request"]
        assert r["tp4"]["corpus"] == "corpus" and r["tp4"]["invalid"] is None
        assert r["tp4"]["head"].startswith(f"[tp4-prefill {r['salt']}]\n{prompts.PREFILL_HEAD}")
        assert req["prefillTokens"] == pytest.approx(r["targetTokens"], rel=0.2)
        assert req["prefillTps"] == pytest.approx(4000, rel=0.2)
        # the stand-in's prefill pace plus what a busy 2-core machine adds: within a quarter (or 40 ms)
        assert req["ttftMs"] == pytest.approx(req["prefillTokens"] / 4000 * 1000, rel=0.25, abs=40)
        # sparkDash's flat request: the HTTP exchange beside the numbers, its times in epoch ms
        assert "http" not in req and "prompt" not in req and "tp4" not in req
        assert req["httpStatus"] == 200 and req["finishReason"] and req["sseEventCount"] > 0 and req["model"] == MODEL
        assert isinstance(req["responseHeaders"], dict) and req["completionId"] and req["firstSseDataPreview"]
        assert 1_700_000_000_000 < req["t0"] < req["tFirst"] <= req["tLast"]
        assert req["tFirst"] - req["t0"] == pytest.approx(req["ttftMs"], abs=0.01)
    heads = "".join(r["tp4"]["head"] for r in rows)
    assert "The guide" in heads or "def clamp" in heads or "caf\ufffd" in heads
    assert "caf\ufffd" in "".join(prompts.load_corpus(str(corpus)).documents)  # undecodable bytes replaced
    assert doc["status"] == "PASS"
    assert [line.split()[0] for line in proc.stdout.splitlines()[1:3]] == ["300", "1500"]


def test_prefill_without_a_corpus_uses_the_varied_filler(standin: Callable[..., Standin], tmp_path: Path) -> None:
    s = standin(TP4_STANDIN_PREFILL_TPS="8000")
    proc = tp4("bench", "prefill", "--url", s.url, "--sizes", "2000", "--passes", "1", "--out", tmp_path / "out")
    assert proc.returncode == 0, proc.stderr
    (row,) = load(tmp_path / "out")["prefill"]
    assert row["tp4"]["corpus"] is None and row["request"]["prefillTokens"] == pytest.approx(2000, rel=0.1)
    words = row["tp4"]["head"].split("\n", 2)[2].split()
    assert len(set(words)) > len(words) // 2


# --- endpoints, the group ---------------------------------------------------------------------------


def test_the_line_profile_is_the_endpoint_and_the_plan_is_recorded(
    standin: Callable[..., Standin], tmp_path: Path
) -> None:
    s = standin()
    text = (REPO / "python/tp4/data/default-profile.toml").read_text().replace("10.0.0.", "127.0.0.")
    text = text.replace("[cluster]\n", f"[cluster]\nport = {s.port}\n", 1)
    profile = tmp_path / "profile.toml"
    profile.write_text(text)
    proc = tp4(
        "bench",
        "decode",
        "--profile",
        profile,
        "--levels",
        "1",
        "--max-tokens",
        "4",
        "--prompt-types",
        "json",
        "--c1-runs",
        "1",
        "--warmup",
        "0",
        "--out",
        tmp_path / "out",
    )
    assert proc.returncode == 0, proc.stderr
    doc = load(tmp_path / "out")
    plan = json.loads(tp4("plan", "--profile", profile, "--json").stdout)
    assert (
        doc["config"]["base"] == f"http://127.0.0.1:{s.port}/v1"
        and doc["node"] is None
        and doc["tp4"]["host"] == "127.0.0.1"
    )
    assert doc["tp4"]["image"] == plan["image"]["tag"] and doc["tp4"]["plan_digest"] == plan["digest"]
    assert doc["tp4"]["plan"] == plan  # the plan itself, as `tp4 plan --json` prints it
    assert doc["tp4"]["pins"] and all(isinstance(v, str) for v in doc["tp4"]["pins"].values())


def test_an_unreachable_endpoint_is_a_clear_exit_1(tmp_path: Path) -> None:
    port = free_port()
    proc = tp4("bench", "decode", "--url", f"http://127.0.0.1:{port}", "--out", tmp_path / "out")
    assert proc.returncode == 1, proc.stderr
    assert "connection refused" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "out").exists()


def test_the_group_offers_needle_only_when_its_module_is_there() -> None:
    proc = tp4("bench", "--help")
    assert proc.returncode == 0 and "decode" in proc.stdout and "prefill" in proc.stdout
    present = (REPO / "python/tp4/cli/needle.py").exists()
    assert bool(re.search(r"^  needle\s", proc.stdout, re.M)) is present
    if not present:
        proc = tp4("bench", "needle")
        assert proc.returncode == 2 and "No such command 'needle'" in proc.stderr and "Traceback" not in proc.stderr


# --- bad input ---------------------------------------------------------------------------------------


BAD = [
    (("decode", "--levels", "0"), "--levels: 0 is outside 1..256"),
    (("decode", "--levels", "-1"), "--levels: '-1' is not a whole number"),
    (("decode", "--levels", "1e30"), "--levels: '1e30' is not a whole number"),
    (("decode", "--levels", "true"), "--levels: 'true' is not a whole number"),
    (("decode", "--levels", "18446744073709551617"), "--levels: 18446744073709551617... (20 digits) is outside 1..256"),
    (("decode", "--trials", "9" * 5000), "--trials: 99999999999999999999... (5000 digits) is outside 1..1000"),
    (("decode", "--levels", "1,4096"), "--levels: 4096 is outside 1..256"),
    (("decode", "--levels", "１"), "--levels: '１' is not a whole number"),
    (("decode", "--levels", "1,,2"), "--levels: '1,,2' is not a comma-separated list"),
    (("decode", "--levels", "2,2"), "--levels: 2 is given twice"),
    (("decode", "--levels", ""), "--levels: '' is not a comma-separated list"),
    (("decode", "--max-tokens", "1"), "--max-tokens: 1 is outside 2..131072"),
    (("decode", "--max-tokens", "1000000"), "--max-tokens: 1000000 is outside 2..131072"),
    (("decode", "--max-tokens", "2.5"), "--max-tokens: '2.5' is not a whole number"),
    (("decode", "--prompt-types", "poetry"), "--prompt-types: 'poetry' is not a prompt type"),
    (("decode", "--prompt-types", "prose,prose"), "--prompt-types: a type is given twice"),
    (("decode", "--c1-runs", "0"), "--c1-runs: 0 is outside 1..1000"),
    (("decode", "--warmup", "-2"), "--warmup: '-2' is not a whole number"),
    (("decode", "--timeout", "nan"), "--timeout: 'nan' is not a number of seconds"),
    (("decode", "--timeout", "inf"), "--timeout: 'inf' is not a number of seconds"),
    (("prefill", "--sizes", "10"), "--sizes: 10 is outside 64..2097152"),
    (("prefill", "--passes", "0"), "--passes: 0 is outside 1..100"),
    (("decode", "--url", "ftp://127.0.0.1:1"), "is not an API address of the form http://HOST:PORT"),
    (("decode", "--model", "m"), "--model: needs --url"),
    (("decode", "--url", "http://127.0.0.1:1", "--profile", "p.toml"), "--url: given with --profile"),
    (
        ("decode", "--url", "http://127.0.0.1:1", "--api-key-file", "/nonexistent/key"),
        "api.key_file: /nonexistent/key does not exist",
    ),
]


@pytest.mark.parametrize(("args", "message"), BAD, ids=[" ".join(a)[:40] for a, _ in BAD])
def test_bad_values_exit_2_naming_the_field(args: tuple[str, ...], message: str, tmp_path: Path) -> None:
    proc = tp4("bench", *args, "--out", tmp_path / "out")
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and "fix:" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "out").exists()


def test_bad_paths_exit_2(tmp_path: Path) -> None:
    port = free_port()  # nothing listens: every path is refused before the endpoint is asked
    url = ("--url", f"http://127.0.0.1:{port}")
    a_file = tmp_path / "file"
    a_file.write_text("x")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    holds_dir = tmp_path / "holds-dir"
    (holds_dir / "result.json").mkdir(parents=True)
    holds_fifo = tmp_path / "holds-fifo"
    holds_fifo.mkdir()
    os.mkfifo(holds_fifo / "result.json")
    holds_other = tmp_path / "holds-other"
    holds_other.mkdir()
    (holds_other / "result.json").write_text('{"not": "ours"}')
    # a tp4 result damaged by hand: read through its contract, the field named
    holds_broken = tmp_path / "holds-broken"
    holds_broken.mkdir()
    broken = (
        '{"config": {"kind": "decode"}, "decode": [{"trial": 1, "job": {"results": [{"concurrency": 0}]}}],'
        ' "tp4": {"kind": "decode", "levels_done": ["prose/1/1"], "interupted": true}}'
    )
    (holds_broken / "result.json").write_text(broken)
    empty = tmp_path / "empty"
    empty.mkdir()
    only_junk = tmp_path / "junk"
    only_junk.mkdir()
    os.mkfifo(only_junk / "pipe")
    (only_junk / "zero").symlink_to("/dev/zero")
    cases = [
        (("decode", "--out", a_file), "exists and is not a directory"),
        (("decode", "--out", a_file / "sub"), "is not a directory"),
        (("decode", "--out", holds_dir), "result.json is not a regular file"),
        (("decode", "--out", holds_fifo), "result.json is not a regular file"),
        (("decode", "--out", holds_other), "is not a tp4 bench result"),
        (
            ("decode", "--out", holds_broken),
            "result.json: decode[0].job.results[0].concurrency: is the number 0, not a positive whole number "
            "(1 more problem(s) after this one)",
        ),
        (("prefill", "--corpus", tmp_path / "missing"), "--corpus: " + str(tmp_path / "missing") + " does not exist"),
        (("prefill", "--corpus", a_file), "is a regular file, not a directory"),
        (("prefill", "--corpus", fifo), "is a FIFO, not a directory"),
        (("prefill", "--corpus", "/dev/null"), "is a device, not a directory"),
        (("prefill", "--corpus", empty), "holds no files"),
        (("prefill", "--corpus", only_junk), "holds no readable text file"),
    ]
    for args, message in cases:
        proc = tp4("bench", *args, *url, timeout=30)
        assert proc.returncode == 2, (args, proc.stderr)
        assert message in proc.stderr and "fix:" in proc.stderr and "Traceback" not in proc.stderr, (args, proc.stderr)
    assert (holds_other / "result.json").read_text() == '{"not": "ours"}'
    assert (holds_broken / "result.json").read_text() == broken
    assert stat.S_ISFIFO(os.stat(holds_fifo / "result.json").st_mode)


# --- the load generator's own benchmark ---------------------------------------------------------------


def test_bench_loadgen_prints_its_measurements_against_the_goals() -> None:
    """A short run of bench/bench_loadgen.py (its numbers are the script's business, not this
    test's: here it must run, check its counts and print each measurement with its goal)."""
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "bench_loadgen.py"), "--runs", "1", "--events", "300", "--paced", "0"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode in (0, 1), proc.stderr
    assert re.search(r"^burst run 1: 4832 chunks at c16: \d+ chunks/s", proc.stdout, re.M), proc.stdout
    assert re.search(r"^chunks/s +\d+\.\d  goal >= 5000  (ok|MISSED)", proc.stdout, re.M), proc.stdout
    assert re.search(r"^x line c16 .* goal >= 1x  not judged .*= 220 events/s", proc.stdout, re.M), proc.stdout


# --- the SSE splitter, the key ------------------------------------------------------------------------


def test_the_sse_splitter_takes_events_cut_anywhere() -> None:
    from tp4.measuring.throughput.loadgen import SseSplitter

    stream = (
        b'data: {"a": 1}\n\n: a comment\n\nevent: x\ndata: {"b":\ndata: 2}\n\ndata:{"c": 3}\r\n\r\n'
        b"id: 7\r\ndata: [DONE]\r\n\r\n"
    )
    want = [b'{"a": 1}', b'{"b":\n2}', b'{"c": 3}', b"[DONE]"]
    for cut in range(len(stream) + 1):
        for second in range(cut, len(stream) + 1):
            s = SseSplitter()
            got = s.feed(stream[:cut]) + s.feed(stream[cut:second]) + s.feed(stream[second:])
            assert got == want, (cut, second, got)
    s = SseSplitter()
    assert [e for b in stream for e in s.feed(bytes([b]))] == want  # one byte at a time


def test_the_key_goes_in_the_header_only(standin: Callable[..., Standin], tmp_path: Path) -> None:
    key = "sk-bench-7c1e0a9b55d24f3e"
    s = standin(TP4_STANDIN_API_KEY=key)
    key_file = tmp_path / "key"
    key_file.write_text(key + "\n")
    key_file.chmod(0o600)
    out = tmp_path / "out"
    args = (
        "bench",
        "decode",
        "--url",
        s.url + "/v1",
        "--levels",
        "1",
        "--max-tokens",
        "4",
        "--prompt-types",
        "prose",
        "--c1-runs",
        "1",
        "--warmup",
        "1",
    )
    proc = tp4(*args, "--api-key-file", key_file, "--out", out)
    assert proc.returncode == 0, proc.stderr
    assert key not in (out / "result.json").read_text() + proc.stdout + proc.stderr
    assert load(out)["config"]["base"] == s.url + "/v1"
    (tmp_path / "wrong").write_text("sk-wrong-key\n")
    (tmp_path / "wrong").chmod(0o600)
    for extra in (("--api-key-file", tmp_path / "wrong"), ()):
        proc = tp4(*args, *extra)
        assert proc.returncode == 1 and "the API key was refused or is missing (HTTP 401)" in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr


def test_progress_is_one_redrawn_line_on_a_terminal(standin: Callable[..., Standin], tmp_path: Path) -> None:
    import pty

    s = standin(TP4_STANDIN_DECODE_TPS="100")
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        tp4_argv(
            "bench",
            "decode",
            "--url",
            s.url,
            "--levels",
            "1,2",
            "--max-tokens",
            "61",
            "--prompt-types",
            "prose",
            "--c1-runs",
            "1",
            "--warmup",
            "1",
        ),
        env=tp4_env(),
        stdout=subprocess.PIPE,
        stderr=slave,
        text=True,
    )
    os.close(slave)
    seen = b""
    while True:
        try:
            part = os.read(master, 65536)
        except OSError:  # the terminal's other side closed
            break
        if not part:
            break
        seen += part
    os.close(master)
    stdout, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0
    text = seen.decode()
    assert "\r\x1b[Kprose: warm-up 1/1" in text and "\r\x1b[K[1/2] prose trial 1 c1" in text
    assert "reads, " in text  # the live line during a level
    # each finished level is a line of its own, the live line cleared before it
    assert "\r\x1b[K[1/2] prose trial 1 c1: aggregate" in text and "[2/2] prose trial 1 c2: aggregate" in text
    assert "prose" in stdout and "\x1b" not in stdout


def test_every_stream_opens_its_own_connection_after_its_t0(
    standin: Callable[..., Standin], monkeypatch: pytest.MonkeyPatch
) -> None:
    """As SGLang's bench_serving (a new aiohttp session per request, its start taken before the
    POST): each stream of a level opens a new connection after its t0, none is reused from an
    earlier level or opened before it, and each is closed once its stream is over; the streams'
    connects are all under way before any request is written (they start together, not in
    turn)."""
    import asyncio

    from tp4.measuring.throughput.loadgen import Client, LoadWatcher, wave

    s = standin(TP4_STANDIN_DECODE_TPS="200")
    marks: list[tuple[str, float]] = []
    writers: list[Any] = []
    waves: list[list[Any]] = []
    open_connection = asyncio.open_connection

    async def connect(*args: Any, **kwargs: Any) -> Any:
        marks.append(("connect", time.perf_counter()))
        reader, writer = await open_connection(*args, **kwargs)
        write = writer.write

        def written(data: bytes) -> None:
            marks.append(("write", time.perf_counter()))
            write(data)

        writer.write = written
        writers.append(writer)
        return reader, writer

    async def go() -> None:
        client = Client(s.url, MODEL, None, timeout=30, connections=4)
        try:
            await client.check()
            watcher = LoadWatcher(client)
            await watcher.probe()
            monkeypatch.setattr(asyncio, "open_connection", connect)
            for _ in range(2):
                streams, _, _, _ = await wave(client, watcher, [f"p{i}" for i in range(4)], 6)
                assert all(r.error is None and r.completion_tokens == 6 for r in streams)
                assert all(w.is_closing() for w in writers)  # none kept for the next level
                waves.append(streams)
        finally:
            await client.close()

    asyncio.run(go())
    connects = [t for kind, t in marks if kind == "connect"]
    assert len(connects) == 8, marks  # 2 levels x 4 streams, each its own connection
    for n, streams in enumerate(waves):
        mine = connects[4 * n : 4 * n + 4]
        assert min(mine) >= min(r.t0 for r in streams)  # opened after the level's first t0
        assert max(r.t0 for r in streams) <= min(r.t_first for r in streams)
        first_write = min(t for kind, t in marks if kind == "write" and t >= min(mine))
        assert max(mine) <= first_write, marks  # all four connects begun before any request is written


def test_a_stream_that_cannot_connect_or_is_cut_off_is_its_error_never_raised() -> None:
    """The streams' own connections: a refused connect and an answer cut off mid-way are the
    stream's error (as they were through httpx), and an https endpoint is connected with TLS."""
    import asyncio
    import ssl

    from tp4.measuring.throughput.loadgen import Client

    port = free_port()  # nothing listens there

    async def cut_off(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        writer.write(b'10\r\ndata: {"id": "x"}\n\n')  # half a chunk, then the connection closes
        await writer.drain()
        writer.close()

    async def go() -> tuple[Any, Any, Any]:
        server = await asyncio.start_server(cut_off, "127.0.0.1", 0)
        cut = server.sockets[0].getsockname()[1]
        refused = Client(f"http://127.0.0.1:{port}", MODEL, None, timeout=5, connections=2)
        broken = Client(f"http://127.0.0.1:{cut}", MODEL, None, timeout=5, connections=2)
        tls = Client(f"https://127.0.0.1:{port}", MODEL, None, timeout=5, connections=2)
        try:
            return await refused.stream(0, "p", 4), await broken.stream(0, "p", 4), tls._tls
        finally:
            for c in (refused, broken, tls):
                await c.close()
            server.close()

    no_connection, cut_off_answer, context = asyncio.run(go())
    assert no_connection.error is not None and no_connection.error.startswith("no connection"), no_connection.error
    assert cut_off_answer.error is not None and cut_off_answer.error.startswith("the connection closed mid-answer")
    assert isinstance(context, ssl.SSLContext)
