"""tp4 bench's result.json against a real sparkDash result, field for field.

tests/fixtures/sparkdash-decode-prose.json is MiaAI-Lab/DeepSeek-v4.1-Flash-DGX-Sparks
docs/results/tp8/20260926/decode-prose/result.json at d1afdef3ae741cb59662431139d43b5b81dfd133 (written by
rhys101's run.mjs around sparkDash 1.8.8 @ 754f40a7), cut to its first level (c1) and that level's one
stream; every key and value is the file's own.
"""

from __future__ import annotations

import json
from pathlib import Path
from collections.abc import Iterator
from typing import Any

import pytest
from test_bench import Standin, load, tp4

SPARKDASH = Path(__file__).parent / "fixtures" / "sparkdash-decode-prose.json"
# keys whose objects hold whatever the other side sent: their keys are data, not schema
FREE = ("headers", "files_sha256", "responseHeaders")


@pytest.fixture
def standin(tmp_path: Path) -> Iterator[Standin]:
    s = Standin(tmp_path, {"TP4_STANDIN_DECODE_TPS": "300", "TP4_STANDIN_TOKENS_PER_EVENT": "3"})
    try:
        yield s
    finally:
        s.stop()


def kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    return {str: "string", list: "array", dict: "object"}[type(value)]


def paths(doc: Any, at: str = "") -> dict[str, set[str]]:
    """Field path (list items as []) -> the JSON types seen there."""
    out: dict[str, set[str]] = {}
    out.setdefault(at or ".", set()).add(kind(doc))
    if isinstance(doc, dict) and not at.endswith(FREE):
        for key, value in doc.items():
            for path, kinds in paths(value, f"{at}.{key}").items():
                out.setdefault(path, set()).update(kinds)
    elif isinstance(doc, list):
        for item in doc:
            for path, kinds in paths(item, f"{at}[]").items():
                out.setdefault(path, set()).update(kinds)
    return out


def test_tp4s_fields_are_sparkdashs_where_sparkdash_has_them_and_the_rest_sit_under_tp4(
    standin: Standin, tmp_path: Path
) -> None:
    s = standin
    out = tmp_path / "out"
    proc = tp4(
        "bench", "decode", "--url", s.url, "--levels", "1,2", "--max-tokens", "9",
        "--prompt-types", "prose", "--c1-runs", "1", "--warmup", "0", "--out", out,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    ours, theirs = paths(load(out)), paths(json.loads(SPARKDASH.read_text()))
    shared = sorted(set(ours) & set(theirs))
    assert len(shared) > 100  # the whole decode side: file, config, job, level, stream
    # the same JSON type at every shared path (null stands for a value not known: an error that did not occur)
    differ = [
        f"{p}: tp4 {sorted(ours[p])}, sparkDash {sorted(theirs[p])}"
        for p in shared
        if (ours[p] - {"null"}) and (theirs[p] - {"null"}) and (ours[p] - {"null"}) != (theirs[p] - {"null"})
    ]
    assert differ == []
    # every sparkDash field of a decode run is written by tp4, but run.mjs's checks of the sparkDash files it
    # vendors (their SHA-256 against its lock file): tp4 vendors none
    assert sorted(set(theirs) - set(ours)) == [
        ".source.files_sha256",
        ".source.source_version_is_known_tweet_version",
        ".source.unchanged_upstream_files",
    ]
    # what sparkDash does not have sits under a key named tp4
    own = [p for p in sorted(set(ours) - set(theirs)) if ".tp4" not in p]
    assert own == []
    # the top level and the config hold one tp4 key each for tp4's own additions
    assert {p for p in ours if p.count(".") == 1} - {p for p in theirs if p.count(".") == 1} == {".tp4"}
    assert {p for p in ours if p.startswith(".config.") and p.count(".") == 2} - {
        p for p in theirs if p.startswith(".config.")
    } == {".config.tp4"}


def test_earlier_tp4_configs_and_sparkdashs_are_read_by_the_same_model() -> None:
    from tp4.core.contracts.bench_result import RunConfig

    # earlier tp4 files: tp4's keys at the top of config, numbers and lists (tp4 report still reads them)
    old = RunConfig.model_validate({"base": "http://h:8888", "trials": 2, "levels": [1, 2], "maxTokens": 256})
    assert old.levels == [1, 2] and old.trials == 2 and old.tp4 is None
    theirs = RunConfig.model_validate(json.loads(SPARKDASH.read_text())["config"])
    assert theirs.levels == "1,2,4,8,16" and theirs.decode_only is True and theirs.prompt_type == "prose"
    assert theirs.document() == {**json.loads(SPARKDASH.read_text())["config"], "tp4": None}
