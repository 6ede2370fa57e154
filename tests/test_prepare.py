"""`tp4 prepare` through all four steps on four netns hosts laid out as good Sparks
(tests/doctor_hosts.py: real sshd and podman, an RDMA sysfs tree and a stub nvidia-smi per host),
from nothing: no checkpoint on the head, no Engram shards on any node. doctor passes but for what
the later steps make, download fetches the pinned checkpoint from a local stand-in of the Hub
(tests/test_download.py's), share has nothing to share (the workers' weights volumes are local
podman volumes here: this kernel has no NFS client to mount an export with), pack packs every
rank's shards with the image's packer on every node at once; then `tp4 serve` finds the line
ready. A second prepare skips every step's work; a prepare stopped by doctor names the check."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest
from doctor_hosts import SYSFS, DoctorCluster
from test_download import REPO_ID, REV, Hub, make_handler

from tp4.hosts.doctor import engram_files
from tp4.hosts.pack import engram_dir

REPO = Path(__file__).resolve().parent.parent
SHARDS = 3


@pytest.fixture(scope="module")
def cluster() -> Iterator[DoctorCluster]:
    # overlay and a short path, as tests/test_pack.py has them (the packer runs attached)
    work = Path(tempfile.mkdtemp(prefix="tp4-prep-", dir="/tmp"))
    try:
        with DoctorCluster(work, storage_driver="overlay") as c:
            c.reset()
            yield c
    finally:
        shutil.rmtree(work, ignore_errors=True)


@pytest.fixture(scope="module")
def hub() -> Iterator[Hub]:
    shards = {f"model-{i:05d}-of-{SHARDS:05d}.safetensors": os.urandom(4096 * i) for i in range(1, SHARDS + 1)}
    h = Hub({"config.json": b'{"architectures": ["DeepseekV4ForCausalLM"]}\n', **shards})
    server = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(h))
    server.daemon_threads = True
    h.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield h
    server.shutdown()
    server.server_close()


def profile(cluster: DoctorCluster) -> Path:
    """The cluster's profile with the checkpoint pinned to the stand-in Hub's repo."""
    text = cluster.profile.read_text()
    model = f'[model]\ndir = "{cluster.model_dir}"\n'
    assert model in text
    pinned = (
        model + f'common_link = "{cluster.workdir / "common-model"}"\nhf_repo = "{REPO_ID}"\n'
        f'hf_revision = "{REV}"\nexpected_shards = {SHARDS}\n'
    )
    path = cluster.workdir / "prepare.toml"
    path.write_text(text.replace(model, pinned))
    return path


def stop(path: str) -> None:
    """`tp4 stop` of the line the profile at `path` serves; it must exit 0."""
    stopped = subprocess.run(
        [sys.executable, "-m", "tp4", "stop", "--profile", path],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO / "python")},
    )
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr


def hub_env(hub: Hub, workdir: Path) -> dict[str, str]:
    """This environment with the stand-in Hub for the Hugging Face one (reached without a proxy) and
    its cache under workdir, tp4 from this checkout."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(
        HF_ENDPOINT=hub.url,
        HF_HOME=str(workdir / "hf-home"),
        PYTHONPATH=str(REPO / "python"),
        NO_PROXY="127.0.0.1",
        no_proxy="127.0.0.1",
    )
    return env


def tp4(hub: Hub, cluster: DoctorCluster, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = hub_env(hub, cluster.workdir)
    return subprocess.run(
        [sys.executable, "-m", "tp4", *args, "--sysfs", SYSFS], capture_output=True, text=True, timeout=timeout, env=env
    )


def blank(cluster: DoctorCluster) -> None:
    """A fresh line: no checkpoint on the head, no Engram shard on any node."""
    for child in cluster.model_dir.iterdir():
        child.unlink()
    for rank in cluster.plan.nodes:
        shutil.rmtree(engram_dir(rank), ignore_errors=True)


def test_prepare_runs_every_step_from_nothing_then_skips_them_and_serve_finds_the_line_ready(
    cluster: DoctorCluster, hub: Hub
) -> None:
    blank(cluster)
    path = str(profile(cluster))
    r = tp4(hub, cluster, "prepare", "--profile", path)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    for i, name in enumerate(("doctor", "download", "share", "pack")):
        assert f"prepare: step {i + 1}/4: {name}" in r.stdout
    # doctor found nothing blocking but what download and pack make (the workers' volumes exist;
    # the missing shards pass as "disk to pack them" where a node has 50 GiB free)
    later = re.search(r"^prepare: doctor: no blocking failure but what the next steps make: (.*)$", r.stdout, re.M)
    assert later is not None, out
    assert later[1] in (
        "WEIGHTS.HEAD (download), WEIGHTS.SHARD_FILES (download)",
        "ENGRAM.SHARDS (pack), WEIGHTS.HEAD (download), WEIGHTS.SHARD_FILES (download)",
    ), out
    assert sorted(p.name for p in cluster.model_dir.iterdir() if not p.name.startswith(".tp4-")) == sorted(hub.files)
    for name, data in hub.files.items():
        assert (cluster.model_dir / name).read_bytes() == data
    assert "share: nfs.share = false: the workers use their own weights volume; nothing to share" in r.stdout
    assert "(4 packed, 0 skipped)" in r.stdout, out
    for rank in cluster.plan.nodes:
        assert sorted(p.name for p in Path(engram_dir(rank)).iterdir()) == sorted(engram_files(cluster.plan, rank))
    assert r.stdout.rstrip().endswith("prepare: done: every step passed; next: tp4 serve")

    # resumable: a second run finds every step's work done
    gets = len([q for q in hub.requests if q[0] == "GET" and "/resolve/" in q[1]])
    again = tp4(hub, cluster, "prepare", "--profile", path)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "prepare: doctor: no blocking failure\n" in again.stdout, again.stdout
    assert len([q for q in hub.requests if q[0] == "GET" and "/resolve/" in q[1]]) == gets  # nothing fetched again
    assert "(0 packed, 4 skipped)" in again.stdout

    served = tp4(hub, cluster, "serve", "--profile", path)
    try:
        assert served.returncode == 0, served.stdout + served.stderr
        assert "4 boot logs checked" in served.stdout
    finally:
        stop(path)


def test_prepare_stopped_by_doctor_names_the_check_and_runs_no_later_step(cluster: DoctorCluster, hub: Hub) -> None:
    blank(cluster)
    asked = len(hub.requests)
    port = cluster.port(cluster.hosts[1], cluster.plan.nodes[1].gid.hcas[0]) / "link_layer"
    port.write_text("InfiniBand\n")
    try:
        r = tp4(hub, cluster, "prepare", "--profile", str(profile(cluster)))
    finally:
        port.write_text("Ethernet\n")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "prepare: stopped at step 1/4 (doctor): 1 blocking failure(s):" in r.stderr
    assert f"  - RDMA.LINK_LAYER on {cluster.plan.nodes[1].name}: " in r.stderr and "fix: " in r.stderr
    assert "step 2/4" not in r.stdout and list(cluster.model_dir.iterdir()) == []
    assert len(hub.requests) == asked  # download never ran
