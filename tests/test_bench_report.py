"""tp4 bench's result files through tp4 report, end to end against the stand-in engine: a run
compared with itself judges nothing as changed; a run at half the decode rate regresses against
the first (exit 1 with --fail-on-regression, naming the levels), and the charts are real PNGs."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from test_bench import Standin, load, tp4

from tp4.measuring import report

pytestmark = pytest.mark.unit


@pytest.fixture
def standins(tmp_path: Path):
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


def bench(s: Standin, out: Path) -> dict:
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
        "prose,code",
        "--c1-runs",
        "1",
        "--warmup",
        "0",
        "--out",
        out,
    )
    assert proc.returncode == 0, proc.stderr
    return load(out)


def test_a_bench_run_reads_back_through_report_and_a_slower_one_regresses(
    standins: Callable[..., Standin], tmp_path: Path
) -> None:
    fast = bench(standins(TP4_STANDIN_DECODE_TPS="200", TP4_STANDIN_TOKENS_PER_EVENT="3"), tmp_path / "fast")
    slow = bench(standins(TP4_STANDIN_DECODE_TPS="100", TP4_STANDIN_TOKENS_PER_EVENT="3"), tmp_path / "slow")

    # the reader takes the writer's file: per (type, concurrency) the level's aggregate
    run = report.read_result(str(tmp_path / "fast"))
    for entry in fast["decode"]:
        for lv in entry["job"]["results"]:
            got = run.decode["aggregate"][(entry["job"]["config"]["promptType"], lv["concurrency"])]
            assert got.status == "ok" and got.value is not None
            assert float(got.value) == pytest.approx(lv["aggregateDecodeTps"], rel=1e-9)

    same = tp4(
        "report",
        tmp_path / "fast",
        "--reference",
        tmp_path / "fast" / "result.json",
        "--fail-on-regression",
        "0",
        "--out",
        tmp_path / "charts-same",
        "--json",
    )
    assert same.returncode == 0, same.stderr
    doc = json.loads(same.stdout)
    assert "REGRESSED" not in same.stdout and doc

    worse = tp4(
        "report",
        tmp_path / "slow",
        "--reference",
        tmp_path / "fast",
        "--fail-on-regression",
        "20",
        "--out",
        tmp_path / "charts",
    )
    assert worse.returncode == 1, worse.stdout + worse.stderr
    regressed = [line for line in worse.stdout.splitlines() if "REGRESSED" in line]
    assert regressed, worse.stdout
    # half the per-stream rate: about -50 % on every decode row, far past 20 %
    assert any(line.split()[0] in ("prose", "code") for line in regressed)
    assert "regress" in worse.stderr.lower()
    slow_c1 = next(
        lv["aggregateDecodeTps"]
        for e in slow["decode"]
        for lv in e["job"]["results"]
        if e["job"]["config"]["promptType"] == "prose" and lv["concurrency"] == 1
    )
    fast_c1 = next(
        lv["aggregateDecodeTps"]
        for e in fast["decode"]
        for lv in e["job"]["results"]
        if e["job"]["config"]["promptType"] == "prose" and lv["concurrency"] == 1
    )
    assert slow_c1 / fast_c1 == pytest.approx(0.5, rel=0.15)

    from PIL import Image

    png = tmp_path / "charts" / "report-decode.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with Image.open(png) as im:
        im.load()
        assert im.size[0] >= 600 and im.size[1] >= 300
        assert len(im.convert("RGB").getcolors(maxcolors=1 << 20) or []) > 50  # lines, labels, not one colour
