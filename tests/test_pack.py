"""`tp4 pack` and `tp4 prepare` on four netns hosts (tests/doctor_hosts.py: tests/line_cluster.py's,
laid out as good Sparks for the doctor checks serve and prepare run) whose real podman runs
the stand-in image's packer (tests/standin/pack_engram.py at /opt/dsv41/scripts/pack_engram.py):
every node packs at once, complete shards are skipped, a short one is packed again, a failing
packer is named; the packer's controls (TP4_STANDIN_PACK_SECONDS, TP4_STANDIN_PACK_FAIL) reach
its container through the host's containers.conf (``[containers] env``), never through tp4."""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from doctor_hosts import SYSFS, DoctorCluster
from line_cluster import LineCluster, containers_conf

from tp4.hosts.doctor import engram_files
from tp4.hosts.pack import Shard, engram_dir, line_problems, packer_argv, shard_problem
from tp4.line.plan import Plan, build_plan
from tp4.line.profile.load import load_default

REPO = Path(__file__).resolve().parent.parent
MAGIC = 0x4D41524745  # the stand-in packer's


def tp4(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tp4", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": str(REPO / "python")},
    )


@pytest.fixture(scope="module")
def cluster() -> Iterator[DoctorCluster]:
    # overlay, as the nodes use (vfs copies the image's tree per container), and a short path: under
    # pytest's deep temporary directory every attached `podman run --rm` took 20 s more here (the
    # store's run root is in the hosts' dirs; a unix socket path has at most 107 bytes)
    work = Path(tempfile.mkdtemp(prefix="tp4-pack-", dir="/tmp"))
    try:
        with DoctorCluster(work, storage_driver="overlay") as c:
            c.reset()
            yield c
    finally:
        shutil.rmtree(work, ignore_errors=True)


def packer_env(cluster: LineCluster, env: dict[int, dict[str, str]]) -> None:
    """Each host's containers get the env given for its index (none for the others)."""
    for i, host in enumerate(cluster.hosts):
        conf = containers_conf(host)
        pairs = [f"{k}={v}" for k, v in env.get(i, {}).items()]
        if pairs:
            conf.write_text(conf.read_text().replace("[containers]\n", f"[containers]\nenv = {json.dumps(pairs)}\n", 1))


@pytest.fixture
def line(cluster: LineCluster) -> Iterator[LineCluster]:
    """The cluster with no shards and no packer controls, before and after each test."""

    def clean() -> None:
        packer_env(cluster, {})
        for rank in cluster.plan.nodes:
            shutil.rmtree(engram_dir(rank), ignore_errors=True)

    clean()
    yield cluster
    clean()


def headers(cluster: LineCluster) -> dict[str, list[tuple[int, ...]]]:
    """Every node's two shards: header words, each checked against its size."""
    out = {}
    for rank in cluster.plan.nodes:
        found = []
        for name in engram_files(cluster.plan, rank):
            data = (Path(engram_dir(rank)) / name).read_bytes()
            header = struct.unpack("<6Q", data[:48])
            assert len(data) == 48 + header[4] * header[5], f"{rank.name}: {name}: {len(data)} bytes, header {header}"
            found.append(header)
        out[rank.name] = found
    return out


def assert_valid(cluster: LineCluster) -> None:
    tp = cluster.plan.line.tp
    for rank in cluster.plan.nodes:
        for (magic, layer, lo, hi, rows, row_bytes), want in zip(headers(cluster)[rank.name], (1, 14), strict=True):
            total = 1000
            assert (magic, layer, lo, hi, rows) == (
                MAGIC,
                want,
                total * rank.rank // tp,
                total * (rank.rank + 1) // tp,
                hi - lo,
            )
            assert row_bytes > 0
        assert not list(Path(engram_dir(rank)).glob("*.partial"))


def test_pack_runs_every_node_at_once_and_a_second_pack_skips_every_node(line: LineCluster) -> None:
    packer_env(line, {i: {"TP4_STANDIN_PACK_SECONDS": "2"} for i in range(4)})
    began = time.monotonic()
    r = tp4("pack", "--profile", str(line.profile))
    wall = time.monotonic() - began
    print(f"tp4 pack on 4 nodes, each packer 2 s: {wall:.2f} s wall")
    assert r.returncode == 0, r.stdout + r.stderr
    assert_valid(line)
    for rank in line.plan.nodes:
        assert f"pack: {rank.name}: rank {rank.rank} of 4: started" in r.stdout
        assert re.search(rf"^pack: {rank.name}: done in [2-5] s$", r.stdout, re.M), r.stdout
    assert "8 shards checked on 4 nodes (4 packed, 0 skipped)" in r.stdout
    assert wall < 6, f"{wall:.1f} s: the nodes did not pack at once (4 x 2 s would be 8 s)"

    before = {
        rank.name: [p.stat().st_mtime_ns for p in sorted(Path(engram_dir(rank)).iterdir())] for rank in line.plan.nodes
    }
    again = tp4("pack", "--profile", str(line.profile))
    assert again.returncode == 0, again.stdout + again.stderr
    assert "started" not in again.stdout
    for rank in line.plan.nodes:
        assert (
            f"pack: {rank.name}: skipped (engram-l1-r{rank.rank}of4.bin, engram-l14-r{rank.rank}of4.bin complete)"
            in again.stdout
        )
    assert "(0 packed, 4 skipped)" in again.stdout
    assert before == {
        rank.name: [p.stat().st_mtime_ns for p in sorted(Path(engram_dir(rank)).iterdir())] for rank in line.plan.nodes
    }


def test_a_failing_packer_is_named_and_the_other_nodes_are_packed(line: LineCluster) -> None:
    bad = line.plan.nodes[2].name
    packer_env(line, {2: {"TP4_STANDIN_PACK_FAIL": "1"}})
    r = tp4("pack", "--profile", str(line.profile))
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"pack: {bad}: FAILED" in r.stdout
    assert "failing as asked" in r.stdout  # the last lines of its output
    assert f"pack: 1 of 4 nodes failed:\n  - {bad}: the packer exited 1" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    for rank in line.plan.nodes:
        files = sorted(p.name for p in Path(engram_dir(rank)).iterdir())
        assert files == ([] if rank.name == bad else sorted(engram_files(line.plan, rank)))
    good = [rank for rank in line.plan.nodes if rank.name != bad]
    for rank in good:
        for name in engram_files(line.plan, rank):
            data = (Path(engram_dir(rank)) / name).read_bytes()
            assert len(data) == 48 + struct.unpack("<6Q", data[:48])[4] * struct.unpack("<6Q", data[:48])[5]

    packer_env(line, {})  # fixed: the rerun packs the failed node only
    r = tp4("pack", "--profile", str(line.profile))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "(1 packed, 3 skipped)" in r.stdout and f"pack: {bad}: done" in r.stdout
    assert_valid(line)


def test_a_short_shard_under_its_complete_name_is_packed_again(line: LineCluster) -> None:
    assert tp4("pack", "--profile", str(line.profile)).returncode == 0
    rank = line.plan.nodes[1]
    shard = Path(engram_dir(rank)) / engram_files(line.plan, rank)[1]
    full = shard.stat().st_size
    with open(shard, "r+b") as fh:
        fh.truncate(full - 100)
    r = tp4("pack", "--profile", str(line.profile))
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"pack: {rank.name}: done" in r.stdout and "(1 packed, 3 skipped)" in r.stdout
    assert shard.stat().st_size == full
    assert_valid(line)


def test_pack_after_stop_works(line: LineCluster) -> None:
    # upstream MiaAI-Lab#24: `stop -> pack -> serve` broke; stop must leave what pack needs
    for rank in range(len(line.plan.nodes)):  # a packed line serves (doctor's ENGRAM.SHARDS), whatever the disk
        line.lay_engram(rank)
    served = tp4("serve", "--profile", str(line.profile), "--sysfs", SYSFS)
    assert served.returncode == 0, served.stdout + served.stderr
    s = tp4("stop", "--profile", str(line.profile))
    assert s.returncode == 0, s.stdout + s.stderr
    for rank in line.plan.nodes:  # packed again from nothing
        shutil.rmtree(engram_dir(rank))
    r = tp4("pack", "--profile", str(line.profile))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "(4 packed, 0 skipped)" in r.stdout
    assert_valid(line)


def test_prepare_stops_at_the_first_blocking_doctor_failure(line: DoctorCluster) -> None:
    # no GPU on the head (its nvidia-smi lists none): doctor fails, nothing after it runs
    gpus = line.fake(line.head, "gpus.csv")
    gpus.write_text("")
    try:
        r = tp4("prepare", "--profile", str(line.profile), "--sysfs", SYSFS)
    finally:
        gpus.write_text("NVIDIA GB10, 580.95.05\n")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "prepare: step 1/4: doctor" in r.stdout
    assert "step 2/4" not in r.stdout + r.stderr
    assert "prepare: stopped at step 1/4 (doctor):" in r.stderr
    assert "  - GPU.PRESENT on " in r.stderr
    assert "fix: " in r.stderr and "Traceback" not in r.stderr
    for rank in line.plan.nodes:  # pack did not run
        assert not Path(engram_dir(rank)).exists() or not list(Path(engram_dir(rank)).iterdir())


# --- the header checks, on headers as data -------------------------------------------------------


def _shards(plan: Plan, headers: dict[int, tuple[tuple[int, ...], tuple[int, ...]]]) -> dict[str, list[Shard]]:
    out = {}
    for rank in plan.nodes:
        pair = headers[rank.rank]
        out[rank.name] = [
            Shard(name, layer, 48 + h[4] * h[5] if len(h) == 6 else 10, h)
            for name, layer, h in zip(engram_files(plan, rank), (1, 14), pair, strict=True)
        ]
    return out


def _good(r: int, total: int = 1000, magic: int = MAGIC) -> tuple[tuple[int, ...], tuple[int, ...]]:
    lo, hi = total * r // 4, total * (r + 1) // 4
    return (magic, 1, lo, hi, hi - lo, 64), (magic, 14, lo, hi, hi - lo, 64)


def test_the_header_checks_of_a_shard_and_of_the_line() -> None:
    plan = build_plan(load_default())
    shards = _shards(plan, {r: _good(r) for r in range(4)})
    assert all(shard_problem(plan, rank, s) is None for rank in plan.nodes for s in shards[rank.name])
    assert line_problems(plan, shards) == {}
    rank1 = plan.nodes[1]
    s = shards[rank1.name][1]
    assert (
        shard_problem(plan, rank1, s._replace(size=s.size - 1))
        == f"{s.name} is incomplete ({s.size - 1} of {s.size} bytes)"
    )
    assert shard_problem(plan, rank1, s._replace(size=None)) == f"{s.name} missing"
    assert shard_problem(plan, rank1, s._replace(header=s.header[:3])) == f"{s.name} has no header ({s.size} bytes)"
    assert "layer 1, not 14" in str(shard_problem(plan, rank1, s._replace(header=(MAGIC, 1, *s.header[2:]))))
    assert "no magic" in str(shard_problem(plan, rank1, s._replace(header=(0, *s.header[1:]))))
    assert "does not hold its" in str(shard_problem(plan, rank1, s._replace(header=(*s.header[:4], 7, 64))))
    r0 = shards[plan.nodes[0].name][0]
    assert "starts at row 250, not 0" in str(
        shard_problem(plan, plan.nodes[0], r0._replace(header=(MAGIC, 1, 250, 500, 250, 64)))
    )
    # a rank packed for another split (another tp, or another table), and another packer's magic
    wrong = _shards(plan, {**{r: _good(r) for r in range(4)}, 2: _good(2, total=1200)})
    assert list(line_problems(plan, wrong)) == [plan.nodes[2].name]
    other = _shards(plan, {**{r: _good(r) for r in range(4)}, 3: _good(3, magic=MAGIC + 1)})
    assert "another node's shards have" in line_problems(plan, other)[plan.nodes[3].name][0]


def test_the_packer_runs_as_upstream_runs_it() -> None:
    plan = build_plan(load_default())
    head, worker = plan.nodes[0], plan.nodes[2]
    model = next(m.source for m in head.run.mounts if m.target == "/models/DeepSeek-V4.1-Flash")
    assert packer_argv(plan, head) == [
        head.service.runtime,
        "run",
        "--rm",
        "--network",
        "host",
        "-v",
        f"{model}:/models/DeepSeek-V4.1-Flash:ro",
        "-v",
        f"{engram_dir(head)}:/engram",
        "-e",
        "DSV41_SOURCE=/models/DeepSeek-V4.1-Flash",
        "--entrypoint",
        "python3",
        head.run.image,
        "/opt/dsv41/scripts/pack_engram.py",
        "--rank",
        "0",
        "--tp",
        "4",
        "--out",
        "/engram",
    ]
    argv = packer_argv(plan, worker)
    assert (
        argv[argv.index("--rank") + 1] == "2"
        and f"{plan.nodes[2].run.mounts[0].source}:/models/DeepSeek-V4.1-Flash:ro" in argv
    )
    assert argv[6] == f"{worker.run.mounts[0].source}:/models/DeepSeek-V4.1-Flash:ro"
