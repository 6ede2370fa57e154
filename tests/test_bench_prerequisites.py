"""The benchmark scripts say what a machine lacks instead of ending in a traceback."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


def test_bench_distribute_names_what_is_missing_and_how_to_set_up(repo, tmp_path):
    bare = tmp_path / "bin"
    bare.mkdir()
    (bare / "python3").symlink_to(sys.executable)
    env = {**os.environ, "PATH": str(bare), "TP4_TEST_BUSYBOX": str(tmp_path / "no-busybox")}
    proc = subprocess.run(
        [sys.executable, str(repo / "bench" / "bench_distribute.py"), "--size-mb", "1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "no-busybox" in proc.stderr and "podman" in proc.stderr
    assert "bash python/setup.sh --test" in proc.stderr


def test_bench_distribute_registry_part_names_its_own_tools(repo, tmp_path):
    bare = tmp_path / "bin"
    bare.mkdir()
    (bare / "python3").symlink_to(sys.executable)
    env = {**os.environ, "PATH": str(bare)}
    proc = subprocess.run(
        [sys.executable, str(repo / "bench" / "bench_distribute.py"), "--parts", "registry"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    assert "skopeo" in proc.stderr and "docker-registry" in proc.stderr and "Traceback" not in proc.stderr
    proc = subprocess.run(
        [sys.executable, str(repo / "bench" / "bench_distribute.py"), "--parts", "archive"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "skopeo" not in proc.stderr, proc.stderr


def test_bench_distribute_judges_each_binding_goal(repo, monkeypatch):
    """Every measurement is printed with its goal; a missed binding goal is exit 1, one that
    does not apply (a base under 1 GB) is printed and not judged."""
    monkeypatch.syspath_prepend(str(repo / "bench"))
    import bench_distribute as bench

    lines: list[str] = []
    met = [
        bench.Goal("bytes/layer", 1.04, 1.1),
        bench.Goal("update/archive", 0.3, 0.1, binding=False, note="base 0.01 GB"),
    ]
    assert bench.report(met, lines.append) == 0
    assert lines[0].split() == ["bytes/layer", "1.040", "goal", "<=", "1.1", "ok"]
    assert "not judged" in lines[1] and "(base 0.01 GB)" in lines[1]
    lines.clear()
    assert bench.report([*met, bench.Goal("no change", 2.5, 2.0, " s")], lines.append) == 1
    assert "no change" in lines[2] and "MISSED" in lines[2] and lines[-1] == "missed: no change"


def test_bench_serve_names_what_is_missing_and_how_to_set_up(repo, tmp_path):
    bare = tmp_path / "bin"
    bare.mkdir()
    (bare / "python3").symlink_to(sys.executable)
    env = {**os.environ, "PATH": str(bare), "TP4_TEST_BUSYBOX": str(tmp_path / "no-busybox")}
    proc = subprocess.run(
        [sys.executable, str(repo / "bench" / "bench_serve.py"), "--runs", "1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "no-busybox" in proc.stderr and "podman" in proc.stderr and "runc" in proc.stderr
    assert "bash python/setup.sh --test" in proc.stderr


def test_bench_serve_reads_the_runtimes_timestamps_and_judges_each_goal(repo, monkeypatch):
    """podman's two time formats (inspect, logs -t) give the same instant; the engine's own boot
    runs from the last rank's start to Ready; a missed goal is exit 1."""
    monkeypatch.syspath_prepend(str(repo / "bench"))
    import bench_serve as bench

    inspect = bench.stamp("2026-01-02 03:04:05.123456789 +0000 UTC")
    assert inspect == bench.stamp("2026-01-02T03:04:05.123456789Z") == bench.stamp("2026-01-02T04:04:05.123456+01:00")
    assert bench.stamp("2026-01-02T03:04:06Z") - inspect == pytest.approx(0.876544)
    boot = bench.Boot(started=(10.0, 10.5, 10.25, 11.0), ready=12.5)
    assert boot.engine == pytest.approx(1.5) and boot.engine_from_first == pytest.approx(2.5)
    with pytest.raises(ValueError, match="not a podman timestamp"):
        bench.stamp("yesterday")

    lines: list[str] = []
    assert bench.report([bench.Goal("status", 1.2, 1.5, " s")], lines.append) == 0
    assert lines[0].split()[:2] == ["status", "1.200"] and lines[0].endswith("ok")
    lines.clear()
    assert bench.report([bench.Goal("stop", 4.2, 3.0, " s"), bench.Goal("status", 1.2, 1.5, " s")], lines.append) == 1
    assert "MISSED" in lines[0] and lines[-1] == "missed: stop"


@pytest.mark.parametrize("script", ["bench_doctor.py", "bench_pack.py"])
def test_bench_doctor_and_pack_name_what_is_missing(repo, tmp_path, script):
    bare = tmp_path / "bin"
    bare.mkdir()
    (bare / "python3").symlink_to(sys.executable)
    env = {**os.environ, "PATH": str(bare), "TP4_TEST_BUSYBOX": str(tmp_path / "no-busybox")}
    proc = subprocess.run(
        [sys.executable, str(repo / "bench" / script), "--runs", "1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert f"{script} needs" in proc.stderr and "podman" in proc.stderr
    assert "bash python/setup.sh --test" in proc.stderr


def _bench_vs_sglang(repo):
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_vs_sglang", repo / "bench" / "bench_vs_sglang.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bench_vs_sglang_tp4_side_reads_tp4_bench_on_the_standin(repo, tmp_path):
    """The tp4 half of bench/bench_vs_sglang.py: `tp4 bench decode` on the stand-in with its TTFT
    floor, one level, read back as median TTFT and aggregate (the SGLang half needs its venv)."""
    import json

    b = _bench_vs_sglang(repo)
    port = b.free_port()
    proc = b.start_engine(port, 100, 200, tmp_path / "engine.log")
    try:
        done = subprocess.run(
            [sys.executable, str(repo / "bench" / "bench_vs_sglang.py"), "--as-client", "tp4"]
            + ["--url", f"http://127.0.0.1:{port}", "--levels", "2", "--max-tokens", "12"],
            env={**os.environ, "PYTHONPATH": str(repo / "python")},
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        b.stop_engine(proc)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert 100 <= got["medianTtftMs"] < 400  # the engine's floor, and the client's share
    assert 0 < got["aggregateDecodeTps"] < 2 * 200 * 1.5


def test_bench_vs_sglang_runs_both_clients_once(repo):
    """The whole comparison, once, where SGLang's client is installed (its venv under ~/.cache,
    made by the script's first run: pip fetches sglang by name, which a test does not do)."""
    b = _bench_vs_sglang(repo)
    venv = os.path.expanduser(f"~/.cache/tp4-bench-sglang/{b.SGLANG}")
    if not os.path.exists(os.path.join(venv, "bin", "python")):
        pytest.skip(f"SGLang's client is not installed in {venv} (run bench/bench_vs_sglang.py once)")
    done = subprocess.run(
        [sys.executable, str(repo / "bench" / "bench_vs_sglang.py"), "--runs", "1", "--levels", "1,2"]
        + ["--max-tokens", "12", "--decode-tps", "200", "--ttft-ms", "100"],
        env={**os.environ, "PYTHONPATH": str(repo / "python")},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert "Traceback" not in done.stderr and done.returncode in (0, 1), done.stderr
    rows = [line.split() for line in done.stdout.splitlines() if line.split()[:1] in (["1"], ["2"])]
    assert [r[0] for r in rows] == ["1", "2"] and all(0.5 < float(r[3]) < 2 and 0.5 < float(r[6]) < 2 for r in rows)
    assert "largest deviation" in done.stdout
