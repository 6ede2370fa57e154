"""`tp4 report`: result files written here by hand (sparkDash's own result.json, and ours with the
`tp4` keys of the bench contract), their numbers computed here with sparkDash's formulas; the
tables, the JSON, the regression threshold, the PNG charts and hostile inputs."""

from __future__ import annotations

import copy
import io
import json
import os
import re
import statistics
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from tp4.measuring import report
from tp4.core.errors import InvalidInput

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parent.parent
LEVELS = [1, 2, 4, 8, 16]
PROMPTS = ["prose", "code", "structured", "json"]
# the seed's published v2.1 tables (K README v2.1, Results), typed in again here: the shipped
# reference must hold exactly these
SEED_AGGREGATE = {
    "prose": [87.7, 120.4, 163.6, 237.6, 342.7],
    "code": [124.8, 175.0, 246.8, 309.8, 438.3],
    "structured": [152.4, 177.6, 240.4, 295.5, 572.2],
    "json": [118.9, 174.2, 301.7, 471.5, 659.9],
}
SEED_PER_STREAM = {
    "prose": [None, 61.9, 41.4, 30.8, 22.2],
    "code": [None, 88.4, 63.2, 41.4, 29.3],
    "structured": [None, 103.3, 70.4, 44.2, 44.4],
    "json": [None, 89.8, 76.2, 60.2, 42.7],
}
SEED_PREFILL = {
    4096: (4119, 4840),
    16384: (5891, 5846),
    32768: (5893, 5868),
    65536: (5936, 5903),
    131072: (5793, 5761),
    262144: (5355, 5360),
}
INTERNAL = ("Traceback", "internal error")


# ------------------------------------------------------------------------------------------
# result files as sparkDash writes them: streams from set timings, levels from the streams


def stream(index: int, t0: float, t_first: float, t_last: float, completion: int, prompt_tokens: int = 40) -> dict:
    decode_ms = t_last - t_first
    ttft = t_first - t0
    return {
        "index": index,
        "ttftContentMs": ttft,
        "reasoningChunks": 0,
        "ttftMs": ttft,
        "decodeTps": (completion - 1) / decode_ms * 1000,
        "decodeTokens": completion - 1,
        "completionTokens": completion,
        "prefillTps": prompt_tokens / ttft * 1000,
        "prefillTokens": prompt_tokens,
        "totalMs": t_last - t0,
        "error": None,
        "prompt": "Explain how a hash map works.",
        "http": {
            "url": "http://spark1:8888/v1/chat/completions",
            "status": 200,
            "headers": {},
            "completionId": "0" * 32,
            "finishReason": "length",
            "sseEventCount": 87,
            "firstSseDataPreview": "{}",
            "request": {
                "model": "deepseek-v41-flash",
                "maxTokens": 256,
                "temperature": 0,
                "stream": True,
                "promptChars": 29,
            },
        },
        "usage": {
            "promptTokens": prompt_tokens,
            "completionTokens": completion,
            "totalTokens": prompt_tokens + completion,
        },
        "contentPreview": {"first": "A hash map", "last": "buckets.", "chars": 1000},
        "decodeMs": decode_ms,
        "_t0": t0,
        "_tFirst": t_first,
        "_tLast": t_last,
    }


def level(concurrency: int, streams: list[dict], tp4: dict | None = None) -> dict:
    """A wave, with sparkDash's formulas (field notes of the bench contract)."""
    ok = [s for s in streams if not s["error"] and s["decodeTokens"] > 0]
    span = max(s["_tLast"] for s in ok) - min(s["_tFirst"] for s in ok)
    prefill_span = max(s["_tFirst"] for s in ok) - min(s["_t0"] for s in ok)
    tps = [s["decodeTps"] for s in ok]
    ttfts = [s["ttftMs"] for s in ok]
    out = {
        "concurrency": concurrency,
        "streamsOk": len(ok),
        "streamsFailed": len(streams) - len(ok),
        "meanDecodeTps": statistics.mean(tps),
        "medianDecodeTps": statistics.median(tps),
        "minDecodeTps": min(tps),
        "maxDecodeTps": max(tps),
        "meanTtftMs": statistics.mean(ttfts),
        "medianTtftMs": statistics.median(ttfts),
        "aggregateDecodeTps": sum(s["decodeTokens"] for s in ok) / span * 1000,
        "meanPrefillTps": statistics.mean(s["prefillTps"] for s in ok),
        "medianPrefillTps": statistics.median(s["prefillTps"] for s in ok),
        "aggregatePrefillTps": sum(s["prefillTokens"] for s in ok) / prefill_span * 1000,
        "totalPrefillTokens": sum(s["prefillTokens"] for s in ok),
        "totalDecodeTokens": sum(s["decodeTokens"] for s in ok),
        "totalCompletionTokens": sum(s["completionTokens"] for s in ok),
        "durationMs": span,
        "error": None,
        "streams": [{k: v for k, v in s.items() if not k.startswith("_")} for s in streams],
        "model": "deepseek-v41-flash",
        "hardwareSamples": [],
    }
    if tp4 is not None:
        out["tp4"] = tp4
    return out


def wave(concurrency: int, step_ms: float, ttft_ms: float, seed: int) -> list[dict]:
    """`concurrency` streams of 256 tokens, stream i a little slower than stream i-1."""
    return [
        stream(i, 0.0, ttft_ms + 3 * i, ttft_ms + 3 * i + 255 * (step_ms + 0.01 * (seed + i)), 256)
        for i in range(concurrency)
    ]


def job(prompt_type: str, levels: list[dict]) -> dict:
    return {
        "benchId": f"bench-{prompt_type}",
        "sparkId": "comparison",
        "status": "completed",
        "startedAt": "2026-09-26T10:00:00.000Z",
        "completedAt": "2026-09-26T10:05:00.000Z",
        "config": {
            "port": 8888,
            "modelId": "deepseek-v41-flash",
            "concurrencies": [lv["concurrency"] for lv in levels],
            "maxTokens": 256,
            "promptType": prompt_type,
            "debug": True,
        },
        "progress": {
            "currentConcurrency": None,
            "completedLevels": len(levels),
            "totalLevels": len(levels),
            "message": "done",
        },
        "results": levels,
    }


def prefill_row(trial: int, tokens: int, tps: float, tp4: dict | None = None) -> dict:
    ttft = tokens / tps * 1000
    request = {
        "ttftMs": ttft,
        "prefillTps": tps,
        "prefillTokens": tokens,
        "completionTokens": 1,
        "error": None,
        "usage": {"promptTokens": tokens, "completionTokens": 1, "totalTokens": tokens + 1},
    }
    row = {
        "trial": trial,
        "targetTokens": tokens,
        "salt": f"salt-{trial}-{tokens}",
        "promptChars": tokens * 4,
        "promptSha256": "ab" * 32,
        "request": request,
    }
    if tp4 is not None:
        row["tp4"] = tp4
    return row


def sparkdash_result() -> dict:
    """What rhys101's run.mjs writes around sparkDash 1.8.8: prose decode per trial, prefill C1."""
    decode = [
        {"trial": t, "job": job("prose", [level(c, wave(c, 11.0 + 0.9 * c, 90.0 + 7 * c, t)) for c in (1, 2, 4, 8)])}
        for t in (1, 2)
    ]
    prefill = [
        prefill_row(t, n, tps)
        for t in (1, 2)
        for n, tps in (
            (4096, 4300.0 + 40 * t),
            (16384, 5600.0 + 10 * t),
            (32768, 5700.0 + 20 * t),
            (65536, 5750.0),
            (131072, 5650.0 - 5 * t),
        )
    ]
    return {
        "status": "PASS",
        "label": "sparkdash-tp4-20261201",
        "started": "2026-12-01T10:00:00.000Z",
        "finished": "2026-12-01T10:30:00.000Z",
        "source": {
            "repo": "MiaAI-Lab/sparkDash",
            "commit": "754f40a7",
            "files_sha256": {"src/shared/llmPrompts.js": "00" * 32},
            "unchanged_upstream_files": True,
            "source_version_is_known_tweet_version": False,
            "release": "1.8.8",
        },
        "node": "spark1",
        "config": {
            "base": "http://spark1:8888/v1",
            "model": "deepseek-v41-flash",
            "trials": 2,
            "sizes": [4096, 16384, 32768, 65536, 131072],
            "levels": [1, 2, 4, 8],
        },
        "prefill": prefill,
        "decode": decode,
        "method": "sparkDash decode and prefill benches via run.mjs",
    }


def tp4_result(
    scale: float = 1.0, invalid: tuple[str, int] | None = ("code", 8), ttft: float = 120.0, corpus: str | None = None
) -> dict:
    """Our result.json: sparkDash's fields plus exactly the contract's `tp4` keys; two trials per
    prompt type, c1 with a third trial (c1 is the median of several runs)."""
    decode = []
    for p, prompt_type in enumerate(PROMPTS):
        for trial in (1, 2, 3):
            levels = []
            for c in LEVELS if trial < 3 else [1]:
                bad = invalid == (prompt_type, c)
                extra = {
                    "invalid": "foreign traffic: 19 requests running at c8" if bad else None,
                    "maxRunning": 19 if bad else c,
                    "samePrompts": True,
                    "salted": True,
                }
                step = (8.0 + 2 * p + 1.1 * c + 0.2 * trial) / scale
                levels.append(level(c, wave(c, step, ttft + 5 * c + trial, trial), extra))
            decode.append({"trial": trial, "job": job(prompt_type, levels)})
    prefill = [
        prefill_row(t, n, (ref + 37.0 * t) * scale, {"corpus": corpus, "invalid": None})
        for t in (1, 2)
        for n, ref in ((4096, 4400.0), (16384, 5800.0), (65536, 5900.0))
    ]
    return {
        "status": "PASS",
        "label": f"tp4-x{scale}",
        "started": "2026-12-01T10:00:00Z",
        "finished": "2026-12-01T11:00:00Z",
        "source": {"repo": "tp4", "commit": "0.1.0", "release": "0.1.0"},
        "node": "10.0.0.1",
        "config": {
            "base": "http://10.0.0.1:8888/v1",
            "model": "deepseek-v41-flash",
            "trials": 2,
            "levels": LEVELS,
            "sizes": [4096, 16384, 65536],
            "maxTokens": 256,
            "promptTypes": PROMPTS,
        },
        "prefill": prefill,
        "decode": decode,
        "method": "tp4 bench: sparkDash's method with one prompt set and salted streams",
        "tp4": {
            "version": "0.1.0",
            "kind": "decode",
            "plan_digest": "sha256:" + "1" * 64,
            "image": "dsv41-4x-spark:canary-roce",
            "pins": {},
            "samePrompts": True,
            "salted": True,
            "corpus": corpus,
            "levels_done": [
                f"{e['job']['config']['promptType']}/{e['trial']}/{lv['concurrency']}"
                for e in decode
                for lv in e["job"]["results"]
            ],
            "interrupted": False,
        },
    }


def write(tmp_path: Path, name: str, doc: dict | str) -> Path:
    d = tmp_path / name
    d.mkdir()
    (d / "result.json").write_text(doc if isinstance(doc, str) else json.dumps(doc, indent=1))
    return d / "result.json"


def expected(doc: dict) -> dict[tuple[str, str, int], float]:
    """The report's values, computed here: per (metric, prompt type, concurrency), the median over
    the trials that are not invalid (all of them when none is valid)."""
    groups: dict[tuple[str, int], list[dict]] = {}
    for entry in doc["decode"]:
        for lv in entry["job"]["results"]:
            groups.setdefault((entry["job"]["config"]["promptType"], lv["concurrency"]), []).append(lv)
    out = {}
    for (pt, c), lvs in groups.items():
        valid = [lv for lv in lvs if not (lv.get("tp4") or {}).get("invalid")] or lvs
        for metric, key in (
            ("aggregate", "aggregateDecodeTps"),
            ("perStream", "medianDecodeTps"),
            ("ttft", "medianTtftMs"),
        ):
            out[(metric, pt, c)] = statistics.median(lv[key] for lv in valid)
    return out


def table(out: str, title: str) -> list[list[str]]:
    """The rows of one table of the text report, split on runs of two or more spaces."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(title))
    rows = []
    for line in lines[start + 2 :]:
        if not line.strip():
            break
        rows.append(re.split(r"\s{2,}", line.strip()))
    return rows


def row_of(rows: list[list[str]], *key: str) -> list[str]:
    found = [r for r in rows if r[: len(key)] == list(key)]
    assert len(found) == 1, (key, rows)
    return found[0]


def pct(value: float, ref: float) -> float:
    return (value - ref) / ref * 100


# ------------------------------------------------------------------------------------------
# the shipped reference


def test_the_shipped_reference_holds_the_published_tables_and_names_its_source():
    ref = report.read_reference("v2.1")
    for pt in PROMPTS:
        for i, c in enumerate(LEVELS):
            assert float(ref.decode["aggregate"][(pt, c)].value) == SEED_AGGREGATE[pt][i]
            # c1: no per-stream value published; one stream's rate is the aggregate
            assert float(ref.decode["perStream"][(pt, c)].value) == (SEED_PER_STREAM[pt][i] or SEED_AGGREGATE[pt][i])
    assert {t: tuple(float(v) for v in cell.samples) for t, cell in ref.prefill.items()} == SEED_PREFILL
    assert float(ref.prefill[4096].value) == (4119 + 4840) / 2  # the median of the two passes
    assert ref.decode["ttft"] == {}
    assert ref.prefill_filler == report.REPEATED_TOKEN
    src = ref.source
    assert src["measured"] == "2026-09-25" and src["tool"] == "sparkDash 1.8.8"
    assert src["raw"] == ["results/tp4/validation-20260925-v2.txt", "results/tp4/validation-20260925-v21.txt"]
    assert "Four Sparks (TP4): the production line" in src["document"] and "Results" in src["document"]
    assert report.shipped_references() == ["v2.1"]
    text = (REPO / "python" / "tp4" / "data" / "reference-v2.1.json").read_text()
    assert "one repeated token" in text  # the prefill caveat travels with the numbers


# ------------------------------------------------------------------------------------------
# sparkDash's own result.json


def test_a_sparkdash_result_parses_back(tmp_path):
    doc = sparkdash_result()
    run = report.read_result(str(write(tmp_path, "sd", doc).parent))  # the directory holding result.json
    want = expected(doc)
    assert (
        run.kind == "sparkdash" and run.name == "sparkdash-tp4-20261201" and run.prefill_filler == report.REPEATED_TOKEN
    )
    assert set(run.decode["aggregate"]) == {("prose", c) for c in (1, 2, 4, 8)}
    for (metric, pt, c), value in want.items():
        assert float(run.decode[metric][(pt, c)].value) == pytest.approx(value, rel=1e-12)
    # the level's aggregate is sparkDash's: sum of decode tokens over (max t_last - min t_first)
    first = doc["decode"][0]["job"]["results"][1]
    streams = first["streams"]
    span = max(s["ttftMs"] + s["decodeMs"] for s in streams) - min(s["ttftMs"] for s in streams)
    assert first["aggregateDecodeTps"] == pytest.approx(2 * 255 / span * 1000)
    assert float(run.prefill[4096].value) == pytest.approx((4340.0 + 4380.0) / 2)
    assert [float(v) for v in run.prefill[4096].samples] == [4340.0, 4380.0]


def test_a_bare_sparkdash_job_and_a_job_without_prompt_type(tmp_path):
    bare = job("code", [level(c, wave(c, 9.0, 80.0, 1)) for c in (1, 2)])
    run = report.read_result(str(write(tmp_path, "bare", bare)))
    assert float(run.decode["aggregate"][("code", 2)].value) == pytest.approx(bare["results"][1]["aggregateDecodeTps"])
    old = sparkdash_result()
    for entry in old["decode"]:
        del entry["job"]["config"]["promptType"]
        del entry["trial"]
    for row in old["prefill"]:  # sparkDash's prefill bench history keeps the rate on the row
        row["prefillTps"] = row.pop("request")["prefillTps"]
    run = report.read_result(str(write(tmp_path, "old", old)))
    assert ("prose", 8) in run.decode["aggregate"] and any("taken as prose" in n for n in run.notes)
    assert float(run.prefill[65536].value) == 5750.0


def test_job_times_in_epoch_milliseconds_as_sparkdash_writes_them_and_iso_as_earlier_tp4_did(tmp_path):
    doc = sparkdash_result()
    first, second = (entry["job"] for entry in doc["decode"])
    first.update(startedAt=1764849600000, completedAt=1764849900000, durationMs=300000, error=None, owner=None)
    second.update(startedAt="2026-09-26T10:00:00.000Z")  # a tp4 result of an earlier version
    run = report.read_result(str(write(tmp_path, "ms", doc)))
    assert ("prose", 8) in run.decode["aggregate"]
    first["startedAt"] = -1
    with pytest.raises(InvalidInput, match="startedAt"):
        report.read_result(str(write(tmp_path, "bad", doc)))


def test_a_run_that_is_not_pass_is_told_with_the_files_own_cause(tmp_path):
    failed = sparkdash_result()
    failed["status"] = "FAIL"
    failed["error"] = "stream 3 at c8: no usage in the final SSE event"
    run = report.read_result(str(write(tmp_path, "failed", failed)))
    assert "the run's status is FAIL: stream 3 at c8: no usage in the final SSE event" in run.notes
    assert not any("a stream lacked usage" in n for n in run.notes)  # no fixed reason any more
    interrupted = job("code", [level(c, wave(c, 9.0, 80.0, 1)) for c in (1, 2)])
    interrupted["status"] = "running"
    interrupted["progress"].update(currentConcurrency=4, message="Running c4")
    run = report.read_result(str(write(tmp_path, "interrupted", interrupted)))
    assert run.notes[-1] == (
        "the run's status is running: a decode job was left running: the run was interrupted at c4 (Running c4)"
    )
    silent = sparkdash_result()
    silent["status"] = "FAIL"
    run = report.read_result(str(write(tmp_path, "silent", silent)))
    assert "the run's status is FAIL: the file records no cause" in run.notes


def test_sparkdash_result_against_the_published_line(tmp_path, tp4_cli):
    doc = sparkdash_result()
    path = write(tmp_path, "sd", doc)
    code, out, err = tp4_cli("report", path, "--no-charts")
    assert code == 0, err
    want = expected(doc)
    rows = table(out, "decode: aggregate tok/s")
    assert [r[:2] for r in rows] == [["prose", f"c{c}"] for c in (1, 2, 4, 8)]
    for i, c in enumerate((1, 2, 4, 8)):
        ref = SEED_AGGREGATE["prose"][i]
        value = want[("aggregate", "prose", c)]
        r = row_of(rows, "prose", f"c{c}")
        assert r[2] == f"{ref:.1f}"
        assert float(r[3]) == pytest.approx(value, abs=0.051)
        assert float(r[4].removesuffix(" %")) == pytest.approx(pct(value, ref), abs=0.051)
        assert (r[-1] == "!") == (abs(pct(value, ref)) > 5)
    per_stream = table(out, "decode: per-stream tok/s")
    r = row_of(per_stream, "prose", "c4")
    assert r[2] == "41.4" and float(r[3]) == pytest.approx(want[("perStream", "prose", 4)], abs=0.051)
    # TTFT: values, no published reference
    r = row_of(table(out, "TTFT"), "prose", "c2")
    assert r[2] == "-" and float(r[3]) == pytest.approx(want[("ttft", "prose", 2)], abs=0.051)
    # prefill: both sparkDash 1.8.8 (one repeated token), so judged, with the caveat said
    prefill = table(out, "prefill: tok/s by prompt length")
    r = row_of(prefill, "4096 (4k)")
    assert r[1] == "4479.5" and r[2] == "4360.0" and r[3] == f"{pct(4360.0, 4479.5):+.1f} %"
    assert "one repeated token" in out and "not comparable" in out and "#21" in out
    assert "262144" not in "\n".join(" ".join(r) for r in prefill)  # only the lengths the run measured
    assert "validation-20260925-v21.txt" in out and "sparkDash 1.8.8" in out


# ------------------------------------------------------------------------------------------
# our result.json, invalid levels, several runs


def test_our_result_with_tp4_keys_and_an_invalid_level(tmp_path, tp4_cli):
    doc = tp4_result(scale=0.5)  # half the speed of the published line: every judged value regresses
    path = write(tmp_path, "ours", doc)
    code, out, err = tp4_cli("report", path, "--no-charts", "--fail-on-regression", "10")
    assert code == 1, out + err
    want = expected(doc)
    assert "left out" not in out  # every trial of the invalid level is invalid
    rows = table(out, "decode: aggregate tok/s")
    assert len(rows) == 20
    r = row_of(rows, "code", "c8")
    assert r[-1] == "invalid" and float(r[3]) == pytest.approx(want[("aggregate", "code", 8)], abs=0.051)
    assert "invalid: tp4-x0.5 decode aggregate code c8: foreign traffic: 19 requests running at c8" in out
    # c1 ran three trials: the median of the three
    c1 = [
        lv["aggregateDecodeTps"]
        for e in doc["decode"]
        if e["job"]["config"]["promptType"] == "json"
        for lv in e["job"]["results"]
        if lv["concurrency"] == 1
    ]
    assert len(c1) == 3 and want[("aggregate", "json", 1)] == statistics.median(c1)
    r = row_of(rows, "json", "c1")
    assert float(r[3]) == pytest.approx(statistics.median(c1), abs=0.051) and r[-1] == "REGRESSED"
    regressed = [line for line in out.splitlines() if line.startswith("  tp4-x0.5: ")]
    # computed here: every valid decode value more than 10 % below its reference; prefill is not
    # comparable (another filler) and the invalid level is not judged
    seed = {"aggregate": SEED_AGGREGATE, "perStream": SEED_PER_STREAM}
    worse = sorted(
        f"{'decode aggregate' if m == 'aggregate' else 'decode per-stream'} {pt} c{c}"
        for (m, pt, c), v in want.items()
        if m in seed and (pt, c) != ("code", 8) and pct(v, seed[m][pt][LEVELS.index(c)] or SEED_AGGREGATE[pt][0]) < -10
    )
    assert len(worse) > 30
    assert sorted(line.split(": ")[1] for line in regressed) == worse
    assert "prefill not judged" in out and "varied words (tp4 bench's default filler)" in out
    assert f"regression: {len(worse)} value(s)" in err


def test_an_invalid_trial_is_left_out_of_the_median(tmp_path, tp4_cli):
    doc = tp4_result(invalid=None)
    code_jobs = [e for e in doc["decode"] if e["job"]["config"]["promptType"] == "code"]
    code_jobs[1]["job"]["results"][3]["tp4"]["invalid"] = "foreign traffic: 9 requests running at c8"
    code_jobs[1]["job"]["results"][3]["aggregateDecodeTps"] = 1.0
    path = write(tmp_path, "one", doc)
    code, out, err = tp4_cli("report", path, "--no-charts")
    assert code == 0, err
    r = row_of(table(out, "decode: aggregate tok/s"), "code", "c8")
    assert float(r[3]) == pytest.approx(code_jobs[0]["job"]["results"][3]["aggregateDecodeTps"], abs=0.051)
    assert (
        "left out: tp4-x1.0 decode aggregate code c8: 1 trial(s) (invalid: foreign traffic: 9 requests running at c8); "
        "the median of the 1 valid one(s) is shown"
    ) in out


def test_a_real_text_corpus_is_never_judged_against_the_repeated_token_filler(tmp_path, tp4_cli):
    path = write(tmp_path, "corpus", tp4_result(scale=0.5, corpus="docs-and-code"))
    code, out, err = tp4_cli("report", path, "--no-charts", "--json", "--fail-on-regression", "10")
    doc = json.loads(out)
    assert doc["runs"][0]["prefillFiller"] == "corpus:docs-and-code"
    rows = doc["tables"]["prefill"]
    assert all(r["runs"][0]["judged"] is False and r["runs"][0]["notJudged"] == "not comparable (filler)" for r in rows)
    assert not any(r["table"] == "prefill" for r in doc["regressions"])
    assert any("real text (corpus docs-and-code)" in n for n in doc["notes"])


def test_two_runs_against_a_result_as_reference(tmp_path, tp4_cli):
    base = tp4_result(scale=1.0, invalid=None, ttft=100.0)
    fast = tp4_result(scale=1.25, invalid=None, ttft=100.0)
    slow = tp4_result(scale=0.8, invalid=("prose", 4), ttft=150.0)
    ref_path, fast_path, slow_path = (
        write(tmp_path, "base", base),
        write(tmp_path, "fast", fast),
        write(tmp_path, "slow", slow),
    )
    code, out, err = tp4_cli("report", fast_path, slow_path, "--reference", ref_path, "--no-charts", "--json")
    assert code == 0, err  # no --fail-on-regression: slower is reported, not failed
    doc = json.loads(out)
    assert [r["name"] for r in doc["runs"]] == ["tp4-x1.25", "tp4-x0.8"] and doc["reference"]["name"] == "tp4-x1.0"
    want_ref, want_fast, want_slow = expected(base), expected(fast), expected(slow)
    for metric, name in (("aggregate", "decodeAggregate"), ("perStream", "decodePerStream"), ("ttft", "ttft")):
        for row in doc["tables"][name]:
            key = (metric, row["promptType"], row["concurrency"])
            assert row["reference"]["value"] == pytest.approx(want_ref[key], rel=1e-12)
            got_fast, got_slow = row["runs"]
            assert got_fast["value"] == pytest.approx(want_fast[key], rel=1e-12)
            assert got_fast["diffPct"] == pytest.approx(pct(want_fast[key], want_ref[key]), rel=1e-9)
            assert got_fast["judged"] and got_fast["flagged"] == (abs(got_fast["diffPct"]) > 5)
            if key[1:] == ("prose", 4):
                assert got_slow["status"] == "invalid" and not got_slow["judged"]
            else:
                assert got_slow["diffPct"] == pytest.approx(pct(want_slow[key], want_ref[key]), rel=1e-9)
    # prefill: the same filler (tp4 bench's default) in all three, so judged
    assert all(r["runs"][0]["judged"] for r in doc["tables"]["prefill"])
    # with a threshold: the slow run regresses (and its TTFT, 50 % longer, too); the fast one not
    code, out, err = tp4_cli(
        "report", fast_path, slow_path, "--reference", ref_path, "--no-charts", "--fail-on-regression", "10"
    )
    assert code == 1
    regressed = [line for line in out.splitlines() if line.startswith("  tp4-")]
    assert regressed and all(line.startswith("  tp4-x0.8: ") for line in regressed)
    assert any(" TTFT prose c1: " in line for line in regressed)
    assert any(" prefill 4096: " in line for line in regressed)  # the same filler: judged
    # one column group per run: its name above, its value, difference and mark below
    lines = out.splitlines()
    title = next(i for i, line in enumerate(lines) if line.startswith("decode: aggregate tok/s"))
    assert re.split(r"\s{2,}", lines[title + 1].strip()) == ["run 1", "run 2"] and lines[title + 2].split() == [
        "prompt",
        "c",
        "ref",
        "tok/s",
        "diff",
        "tok/s",
        "diff",
    ]
    r = row_of(table(out, "decode: aggregate tok/s")[1:], "prose", "c4")
    assert r[-1] == "invalid" and r[4].endswith(" %") and r[5] == "!"
    assert "run 1: tp4-x1.25 (" in out and "run 2: tp4-x0.8 (" in out


# ------------------------------------------------------------------------------------------
# the threshold, exactly


def threshold_result(value: float | str, ttft: float | str = 100) -> str:
    """One prose c1 level whose aggregate (and per-stream rate) is `value`, written as typed."""
    lv = level(1, wave(1, 10.0, 100.0, 1))
    lv["aggregateDecodeTps"] = lv["medianDecodeTps"] = "@V@"
    lv["medianTtftMs"] = "@T@"
    doc = json.dumps({"status": "PASS", "decode": [{"trial": 1, "job": job("prose", [lv])}], "prefill": []})
    return doc.replace('"@V@"', str(value)).replace('"@T@"', str(ttft))


@pytest.mark.parametrize(
    ("value", "pct_arg", "regressed"),
    [
        ("83.315", "5", False),  # 87.7 x 0.95: exactly 5 % below
        ("83.31499999", "5", True),  # just past it
        ("83.315", "4.999999", True),  # the threshold just under 5 %
        ("87.7", "0", False),  # equal is never a regression
        ("87.69999", "0", True),
        ("200", "0", False),  # faster is not a regression
    ],
)
def test_regression_exactly_at_the_threshold(tmp_path, tp4_cli, value, pct_arg, regressed):
    path = write(tmp_path, "t", threshold_result(value))
    code, out, err = tp4_cli("report", path, "--no-charts", "--fail-on-regression", pct_arg)
    assert code == (1 if regressed else 0), out + err
    assert ("prose c1" in "\n".join(line for line in out.splitlines() if line.startswith("  "))) == regressed
    assert ("regression:" in err) == regressed


@pytest.mark.parametrize(("ttft", "regressed"), [("110", False), ("110.0000001", True), ("50", False)])
def test_ttft_regresses_upwards_exactly_past_the_threshold(tmp_path, tp4_cli, ttft, regressed):
    ref = write(tmp_path, "ref", threshold_result("87.7", "100"))
    run = write(tmp_path, "run", threshold_result("87.7", ttft))
    code, out, err = tp4_cli("report", run, "--reference", ref, "--no-charts", "--fail-on-regression", "10", "--json")
    assert code == (1 if regressed else 0), err
    doc = json.loads(out)
    assert [r["table"] for r in doc["regressions"]] == (["TTFT"] if regressed else [])


def test_tolerance_flags_both_directions(tmp_path, tp4_cli):
    path = write(tmp_path, "t", threshold_result("92.085"))  # exactly 5 % above 87.7
    code, out, _ = tp4_cli("report", path, "--no-charts", "--json")
    got = json.loads(out)["tables"]["decodeAggregate"][0]["runs"][0]
    assert got["diffPct"] == pytest.approx(5.0) and got["flagged"] is False
    code, out, _ = tp4_cli("report", path, "--no-charts", "--json", "--tolerance", "4.9")
    assert json.loads(out)["tables"]["decodeAggregate"][0]["runs"][0]["flagged"] is True


# ------------------------------------------------------------------------------------------
# charts


def png(path: Path) -> Image.Image:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    Image.open(io.BytesIO(data)).verify()
    return Image.open(io.BytesIO(data)).convert("RGB")


def test_charts_are_valid_pngs_of_the_expected_size_and_not_blank(tmp_path, tp4_cli, monkeypatch):
    path = write(tmp_path, "ours", tp4_result(scale=0.9))
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    code, out, err = tp4_cli("report", path)
    assert code == 0, err
    decode, prefill = cwd / "report-decode.png", cwd / "report-prefill.png"  # the current directory
    assert not list(path.parent.glob("*.png"))  # never beside the result (an archive, the checkout)
    assert "chart: report-decode.png" in out and "chart: report-prefill.png" in out
    img = png(decode)
    assert img.size == (800, 600)  # 2 x 2 panels, one per prompt type
    colours = img.getcolors(maxcolors=1 << 20)
    assert len(colours) > 50  # lines, markers and text, antialiased: not one colour
    assert max(n for n, _ in colours) < 0.97 * 800 * 600  # the background is not everything
    assert (31, 119, 180) in {c for _, c in colours}  # the run's line (matplotlib's first colour)
    img = png(prefill)
    assert img.size == (800, 400) and len(img.getcolors(maxcolors=1 << 20)) > 50
    # the same report draws the same bytes (no timestamp, no version in the PNG)
    first = decode.read_bytes()
    out_dir = tmp_path / "charts" / "new"
    code, out, err = tp4_cli("report", path, "--out", out_dir)
    assert code == 0, err
    assert (out_dir / "report-decode.png").read_bytes() == first
    assert b"Software" not in first and b"matplotlib" not in first.lower()


def test_charts_label_the_decode_axis_list_only_runs_with_data_and_draw_the_reference_on_top(tmp_path):
    from tp4.measuring import charts

    ref_doc = sparkdash_result()
    same = copy.deepcopy(ref_doc)
    same["label"] = "same-as-reference"
    decode_only = tp4_result(invalid=None)
    decode_only["prefill"] = []
    prefill_only = sparkdash_result()
    prefill_only["label"] = "prefill-only"
    prefill_only["decode"] = []
    runs = [
        report.read_result(str(write(tmp_path, n, d)))
        for n, d in (("s", same), ("d", decode_only), ("p", prefill_only))
    ]
    ref = report.read_result(str(write(tmp_path, "ref", ref_doc)))
    rep = report.compare(runs, ref, Fraction(5), None)

    fig = charts.decode_figure(rep)
    panels = [ax for ax in fig.axes if ax.get_visible()]
    assert len(panels) == 4
    assert [ax.get_xlabel() for ax in panels[2:]] == ["concurrency (streams)"] * 2  # the bottom row says what x is
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend == ["reference sparkdash-tp4-20261201", "same-as-reference", "tp4-x1.0"]  # no "prefill-only"
    prose = next(ax for ax in panels if ax.get_title() == "prose")
    ref_line = next(ln for ln in prose.get_lines() if ln.get_label().startswith("reference"))
    twin = next(ln for ln in prose.get_lines() if ln.get_label() == "same-as-reference")
    assert list(twin.get_ydata()) == list(ref_line.get_ydata())  # the run lies exactly on the reference ...
    assert ref_line.get_visible() and ref_line.get_linestyle() == "--"
    assert ref_line.get_zorder() > max(
        ln.get_zorder() for ln in prose.get_lines() if ln is not ref_line
    )  # ... under it

    fig = charts.prefill_figure(rep)
    (ax,) = fig.axes
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert [t.split(" (")[0] for t in legend] == [
        "reference sparkdash-tp4-20261201",
        "same-as-reference",
        "prefill-only",
    ]
    ref_line = ax.get_lines()[0]
    assert ref_line.get_zorder() > max(ln.get_zorder() for ln in ax.get_lines()[2:])


def test_one_prompt_type_gives_one_panel_and_no_prefill_chart(tmp_path, tp4_cli):
    doc = sparkdash_result()
    doc["prefill"] = []
    path = write(tmp_path, "sd", doc)
    code, out, err = tp4_cli("report", path, "--out", tmp_path / "o", "--json")
    assert code == 0, err
    charts = json.loads(out)["charts"]
    assert charts == [str(tmp_path / "o" / "report-decode.png")]
    assert png(Path(charts[0])).size == (800, 300)


def test_report_imports_matplotlib_only_for_charts(tmp_path):
    path = write(tmp_path, "sd", sparkdash_result())
    probe = (
        "import sys\nfrom tp4.cli import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit as e:\n"
        "    print('matplotlib' in sys.modules, e.code, file=sys.stderr)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO / "python"))
    for args, imported in (
        (["report", "--help"], False),
        (["report", str(path), "--no-charts"], False),
        (["report", str(path), "--out", str(tmp_path / "c")], True),
    ):
        proc = subprocess.run(
            [sys.executable, "-c", probe, *args], capture_output=True, text=True, env=env, timeout=120
        )
        assert proc.stderr.strip().splitlines()[-1] == f"{imported} 0", proc.stderr


def test_report_is_listed_in_the_help(tp4_cli):
    code, out, _ = tp4_cli("--help")
    assert code == 0 and re.search(r"^\s+report\s+Bench results", out, re.M)


# ------------------------------------------------------------------------------------------
# hostile input: exit 2, the file and the field named, a fix, no traceback


def refused(tp4_cli, *args: object) -> str:
    code, out, err = tp4_cli("report", *args, "--no-charts")
    assert code == 2, (out, err)
    assert out == "" and not any(m in err for m in INTERNAL), err
    return err


def good_level_doc() -> dict:
    return json.loads(threshold_result("87.7"))


def with_value(path: str, raw: str) -> str:
    """The threshold document with one field's value replaced by raw JSON text."""
    doc = good_level_doc()
    cur = doc
    keys = path.split(".")
    for k in keys[:-1]:
        cur = cur[int(k)] if isinstance(cur, list) else cur[k]
    cur[keys[-1]] = "@X@"
    return json.dumps(doc).replace('"@X@"', raw)


FIELD = "decode.0.job.results.0.aggregateDecodeTps"


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        ("true", "true (a boolean), not a number"),
        ('"87.7"', "the string '87.7', not a number"),
        ("NaN", "NaN is not a number JSON can hold"),
        ("Infinity", "Infinity is not a number JSON can hold"),
        ("-Infinity", "-Infinity is not a number JSON can hold"),
        ("1e400", "beyond the range of a 64-bit number"),
        ("18446744073709551616", "does not fit in 64 bits"),
        ("9" * 5000, "does not fit in 64 bits"),
        ("-3", "-3 is negative"),
        ("[1]", "an array, not a number"),
    ],
)
def test_wrong_values_are_refused_naming_the_file_and_field(tmp_path, tp4_cli, raw, reason):
    path = write(tmp_path, "bad", with_value(FIELD, raw))
    err = refused(tp4_cli, path)
    assert f"{path}: decode[0].job.results[0].aggregateDecodeTps: " in err and reason in err and "; fix: " in err


@pytest.mark.parametrize(
    ("field", "raw", "where", "reason"),
    [
        (
            "decode.0.job.results.0.concurrency",
            "0",
            "decode[0].job.results[0].concurrency",
            "not a positive whole number",
        ),
        (
            "decode.0.job.results.0.concurrency",
            "1.5",
            "decode[0].job.results[0].concurrency",
            "not a positive whole number",
        ),
        ("decode.0.job.results.0.concurrency", "true", "decode[0].job.results[0].concurrency", "not a number"),
        ("decode.0.job.results.0.concurrency", "null", "decode[0].job.results[0].concurrency", "is missing"),
        ("decode.0.job.config.promptType", "3", "decode[0].job.config.promptType", "not a string"),
        ("decode.0.job", "[]", "decode[0].job", "not an object"),
        ("decode.0.job.results", "{}", "decode[0].job.results", "not an array"),
        ("decode", '"x"', "decode", "not an array"),
        ("prefill", '[{"trial": 1}]', "prefill[0].targetTokens", "is missing"),
        (
            "prefill",
            '[{"targetTokens": 4096, "request": {"prefillTps": false}}]',
            "prefill[0].request.prefillTps",
            "not a number",
        ),
    ],
)
def test_wrong_shapes_are_refused(tmp_path, tp4_cli, field, raw, where, reason):
    path = write(tmp_path, "bad", with_value(field, raw))
    err = refused(tp4_cli, path)
    assert f"{path}: {where}: " in err and reason in err and "; fix: " in err


def test_files_that_are_not_results_are_refused(tmp_path, tp4_cli):
    (tmp_path / "empty").mkdir()
    assert f"{tmp_path / 'empty'}: the directory holds no result.json; fix: " in refused(tp4_cli, tmp_path / "empty")
    assert "does not exist; fix: " in refused(tp4_cli, tmp_path / "missing.json")
    os.mkfifo(tmp_path / "fifo")
    assert "is a FIFO, not a regular file" in refused(tp4_cli, tmp_path / "fifo")
    assert "is a device, not a regular file" in refused(tp4_cli, "/dev/zero")
    big = tmp_path / "big.json"
    with big.open("wb") as f:
        f.truncate(report.MAX_RESULT_BYTES + 1)
    assert "bytes, more than the" in refused(tp4_cli, big)
    for text, words in (
        ("{", "not valid JSON"),
        ("[]", "the document: is an array, not an object"),
        ('{"foo": 1}', "decode: missing, and so is prefill: this is not a result.json"),
        ("[" * 100000 + "]" * 100000, "not a readable JSON document"),
        ("\xff", "is not UTF-8 text"),
    ):
        p = tmp_path / "x.json"
        p.write_text(text, encoding="latin-1")
        err = refused(tp4_cli, p)
        assert words in err and str(p) in err, err
    shipped = REPO / "python" / "tp4" / "data" / "reference-v2.1.json"
    assert "a reference data file, not a result; fix: pass it with --reference FILE" in refused(tp4_cli, shipped)


def test_bad_options_are_refused(tmp_path, tp4_cli):
    path = write(tmp_path, "ok", threshold_result("87.7"))
    assert "--reference v3: neither a shipped reference (v2.1) nor a file" in refused(
        tp4_cli, path, "--reference", "v3"
    )
    for value in ("nan", "inf", "-1", "1/2", "5%", ""):
        assert "is not a percentage; fix: " in refused(tp4_cli, path, "--tolerance", value)
        assert "--fail-on-regression: " in refused(tp4_cli, path, "--fail-on-regression", value)
    bad_ref = tmp_path / "ref.json"
    bad_ref.write_text(
        json.dumps(
            {
                "kind": "tp4-report-reference",
                "name": "x",
                "decode": {"concurrency": [1], "aggregate": {"prose": [1, 2]}},
            }
        )
    )
    assert "decode.aggregate.prose: is an array, not an array of 1 values" in refused(
        tp4_cli, path, "--reference", bad_ref
    )
    bad_ref.write_text(json.dumps({"kind": "tp4-report-reference", "colour": "red"}))
    assert f"{bad_ref}: colour: is not a field of a reference" in refused(tp4_cli, path, "--reference", bad_ref)
    # --out naming a file: refused before anything is written
    (tmp_path / "file").write_text("")
    code, out, err = tp4_cli("report", path, "--out", tmp_path / "file")
    assert code == 2 and "--out" in err and "not a directory" in err and "Traceback" not in err
    assert not list(path.parent.glob("*.png"))


def test_the_real_entry_point_says_error_and_exits_2(tmp_path):
    path = write(tmp_path, "bad", with_value(FIELD, "NaN"))
    env = dict(os.environ, PYTHONPATH=str(REPO / "python"))
    proc = subprocess.run(
        [sys.executable, "-m", "tp4", "report", str(path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        cwd=tmp_path,
    )
    assert proc.returncode == 2 and proc.stdout == ""
    assert (
        proc.stderr.startswith(f"error: {path}: decode[0].job.results[0].aggregateDecodeTps: NaN")
        and "Traceback" not in proc.stderr
    )
    assert not list(path.parent.glob("*.png"))  # nothing written


def test_the_contract_fields_round_trip_through_the_reader(tmp_path):
    """Every field the bench contract names, written as tp4 bench will, reads back unchanged."""
    doc = tp4_result(scale=1.0)
    again = json.loads(json.dumps(doc))
    run_a = report.read_result(str(write(tmp_path, "a", doc)))
    run_b = report.read_result(str(write(tmp_path, "b", copy.deepcopy(again))))
    assert run_a.decode == run_b.decode and run_a.prefill == run_b.prefill
    assert run_a.kind == "tp4" and run_a.decode["aggregate"][("code", 8)].status == "invalid"
    assert run_a.decode["aggregate"][("code", 8)].reason == "foreign traffic: 19 requests running at c8"
    # an interrupted run: what it finished is shown, and said
    doc["tp4"]["interrupted"] = True
    doc["decode"] = doc["decode"][:2]
    run = report.read_result(str(write(tmp_path, "c", doc)))
    assert set(run.decode["aggregate"]) == {("prose", c) for c in LEVELS}
    assert any("interrupted" in n for n in run.notes)


def test_failed_levels_and_hostile_text_are_shown_safely(tmp_path, tp4_cli):
    doc = json.loads(threshold_result("10"))
    doc["label"] = "run\x1b[31m\nred"
    doc["decode"][0]["job"]["results"][0]["error"] = {"message": "HTTP 503\x1b[2J"}
    path = write(tmp_path, "f", doc)
    code, out, err = tp4_cli("report", path, path, "--no-charts")
    assert code == 0, err
    assert "\x1b" not in out and "run\\x1b[31m\\x0ared #1" in out and "run\\x1b[31m\\x0ared #2" in out
    r = row_of(table(out, "decode: aggregate tok/s")[1:], "prose", "c1")
    assert r[-1] == "failed" and r[3] == "10.0"  # shown, no difference computed
    assert 'failed: run\\x1b[31m\\x0ared #1 decode aggregate prose c1: {"message": "HTTP 503\\u001b[2J"}' in out
    # a gate: a level the reference measured and this run could not is a regression
    code, out, err = tp4_cli("report", path, "--no-charts", "--fail-on-regression", "50")
    assert code == 1 and "regression: 2 value(s)" in err  # aggregate and per stream; TTFT has no reference
    assert row_of(table(out, "decode: aggregate tok/s"), "prose", "c1")[-1] == "failed REGRESSED"
    assert "  run\\x1b[31m\\x0ared: decode aggregate prose c1: 10.0 against 87.7 (failed)" in out


def test_the_docs_sample_reads_and_its_charts_are_small_pngs(tmp_path, tp4_cli):
    code, out, err = tp4_cli("report", REPO / "docs" / "report-sample", "--out", tmp_path)
    assert code == 0, err
    assert "invalid: sample (hand-made, not a measurement) decode aggregate code c8: foreign traffic" in out
    for name, size in (("report-decode.png", (800, 600)), ("report-prefill.png", (800, 400))):
        shipped = REPO / "docs" / "img" / name
        assert shipped.stat().st_size < 100_000
        assert png(shipped).size == size == png(tmp_path / name).size
    text = (REPO / "docs" / "report.md").read_text()
    assert "img/report-decode.png" in text and "tp4 report docs/report-sample --out docs/img" in text


def _paths(doc: object, prefix: tuple = ()) -> list[tuple]:
    """Every path into a JSON document (keys and indexes), to put a hostile value at."""
    out = [prefix]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _paths(v, prefix + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc[:2]):
            out += _paths(v, prefix + (i,))
    return out


SMALL = sparkdash_result()
for _entry in SMALL["decode"]:
    for _lv in _entry["job"]["results"]:
        _lv["streams"] = _lv["streams"][:1]
SMALL_PATHS = [p for p in _paths(SMALL) if p]
JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8)
    | st.sampled_from(["NaN", "Infinity", "-Infinity", "1e400", "-0.0", "1e-400"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(path=st.sampled_from(SMALL_PATHS), value=JSON_VALUES)
def test_any_value_anywhere_is_read_or_refused_never_a_crash(tmp_path, path, value):
    doc = copy.deepcopy(SMALL)
    cur = doc
    for k in path[:-1]:
        cur = cur[k]
    cur[path[-1]] = "@X@"
    raw = (
        value
        if isinstance(value, str) and value in ("NaN", "Infinity", "-Infinity", "1e400", "-0.0", "1e-400")
        else json.dumps(value)
    )
    f = tmp_path / "result.json"
    f.write_text(json.dumps(doc).replace('"@X@"', raw))
    try:
        run = report.read_result(str(f))
    except InvalidInput as exc:
        assert exc.exit_code == 2 and str(f) in exc.message and "; fix: " in exc.message
        return
    compared = report.compare([run], report.read_reference("v2.1"), Fraction(5), Fraction(5))
    report.render_text(compared)
    json.loads(report.render_json(compared, []))
