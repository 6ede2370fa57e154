"""`tp4 share` on four netns hosts (tests/line_cluster.py): the head has no kernel NFS server
here, so share exports the checkpoint with a real NFS-Ganesha (VFS backend) in the head's
network namespace, and each worker reads it with a real user-space client (libnfs's nfs-cat).
No kernel client can mount here: the worker volume's kernel mount options are asserted as data
(`podman volume inspect`)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from line_cluster import LineCluster

from tp4.hosts import share
from tp4.hosts.nodes import nodes_of
from tp4.line.plan import build_plan
from tp4.line.profile import load_file

REPO = Path(__file__).resolve().parent.parent
OPTIONS = "nfsvers=4.2,ro,nconnect=8,rsize=1048576,wsize=1048576,hard,timeo=600"

pytestmark = pytest.mark.skipif(
    shutil.which("ganesha.nfsd") is None or shutil.which("nfs-cat") is None,
    reason="needs nfs-ganesha, nfs-ganesha-vfs and libnfs-utils (python/setup.sh --test)",
)


def tp4(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tp4", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": str(REPO / "python")},
    )


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LineCluster]:
    with LineCluster(tmp_path_factory.mktemp("share")) as c:
        # one server address for all workers (nfs.server_ips): the head's bridge address
        c.profile.write_text(c.profile.read_text() + f'\n[nfs]\nserver_ips = ["{c.head.address}"]\n')
        try:
            yield c
        finally:
            head = nodes_of(build_plan(load_file(c.profile)))[0]
            share.stop_ganesha(head, ganesha_dir(c))


def ganesha_dir(c: LineCluster) -> str:
    return f"{c.head.dir / 'work'}/{share.GANESHA_DIR}"


def ganesha_state(c: LineCluster) -> tuple[str, str | None]:
    """(the config's bytes, the pid of the running server)."""
    head = nodes_of(c.plan)[0]
    return (Path(ganesha_dir(c), "ganesha.conf").read_text(), share.ganesha_pid(head, ganesha_dir(c)))


def volumes(c: LineCluster) -> dict[str, str]:
    return {
        h.name: h.run(
            "podman",
            "volume",
            "inspect",
            "--format",
            "{{.Driver}} {{json .Options}} {{.CreatedAt}}",
            "--",
            "dsv41-weights",
        ).stdout
        for h in c.hosts.hosts[1:]
    }


def read(c: LineCluster, where: int | None, export: str) -> subprocess.CompletedProcess[str]:
    """nfs-cat of config.json from a host's namespace (None: the bridge address, outside the plan)."""
    argv = ["nfs-cat", share.nfs_url(c.head.address, export)]
    if where is None:
        return subprocess.run(argv, capture_output=True, text=True, timeout=60)
    return subprocess.run(
        ["ip", "netns", "exec", c.hosts[where].namespace, *argv], capture_output=True, text=True, timeout=60
    )


def test_share_exports_to_exactly_the_workers_and_is_idempotent(cluster: LineCluster, tmp_path: Path) -> None:
    export = str(cluster.model_dir)
    first = tp4("share", "--profile", str(cluster.profile))
    assert first.returncode == 0, first.stderr
    assert "(NFS-Ganesha): written, started" in first.stdout
    assert first.stdout.count("volume dsv41-weights") == 3 and "replaced" in first.stdout  # the cluster's plain volumes
    conf, pid = ganesha_state(cluster)
    assert pid is not None
    workers = [h.address for h in cluster.hosts.hosts[1:]]
    assert f"Clients = {', '.join(sorted(workers))}; Access_Type = RO;" in conf
    assert f'Path = "{export}";' in conf and "Access_Type = None;" in conf
    # the volume each worker's rank mounts: exactly upstream's options, device = an export the head has
    for h in cluster.hosts.hosts[1:]:
        out = h.run(
            "podman", "volume", "inspect", "--format", "{{.Driver}} {{json .Options}}", "--", "dsv41-weights"
        ).stdout
        driver, options = out.strip().split(" ", 1)
        assert driver == "local"
        assert json.loads(options) == {
            "type": "nfs",
            "o": f"addr={cluster.head.address},{OPTIONS}",
            "device": f":{export}",
        }
    # a re-run never points a worker at an export the head does not have: the device is the export's path
    pseudo = re.search(r'Pseudo = "([^"]*)";', conf)
    assert pseudo is not None and pseudo.group(1) == export
    # every worker reads the checkpoint; the bridge address (not a worker) cannot; neither can the head itself
    for i in (1, 2, 3):
        got = read(cluster, i, export)
        assert got.returncode == 0 and "DeepseekV4ForCausalLM" in got.stdout, got.stderr
    outside = read(cluster, None, export)
    assert outside.returncode != 0 and "DeepseekV4ForCausalLM" not in outside.stdout
    assert read(cluster, 0, export).returncode != 0

    before = volumes(cluster)
    second = tp4("share", "--profile", str(cluster.profile))
    assert second.returncode == 0, second.stderr
    assert "(NFS-Ganesha): unchanged" in second.stdout and second.stdout.count(": unchanged;") == 3
    assert ganesha_state(cluster) == (conf, pid)  # same bytes, not restarted
    assert volumes(cluster) == before  # same volumes (creation time included)

    # upstream's bug: stop removed the exporter while workers had it mounted, and pack failed
    # after it. tp4 stop does not touch the export or the volumes.
    stop = tp4("stop", "--profile", str(cluster.profile))
    assert stop.returncode == 0, stop.stderr
    assert ganesha_state(cluster) == (conf, pid)
    assert volumes(cluster) == before
    for i in (1, 2, 3):
        assert read(cluster, i, export).returncode == 0


def test_a_worker_removed_from_the_profile_loses_the_export(cluster: LineCluster, tmp_path: Path) -> None:
    export = str(cluster.model_dir)
    assert tp4("share", "--profile", str(cluster.profile)).returncode == 0
    text = cluster.profile.read_text()
    last = text.rindex("[[cluster.workers]]")
    end = text.index("\n[model]", last)
    smaller = tmp_path / "three.toml"
    smaller.write_text(text[:last] + text[end:] + "\n[engine]\ntp = 3\n")
    proc = tp4("share", "--profile", str(smaller))
    assert proc.returncode == 0, proc.stderr
    assert "(NFS-Ganesha): written, restarted" in proc.stdout
    conf, _ = ganesha_state(cluster)
    kept = sorted(h.address for h in cluster.hosts.hosts[1:3])
    assert f"Clients = {', '.join(kept)};" in conf
    assert read(cluster, 1, export).returncode == 0 and read(cluster, 2, export).returncode == 0
    assert read(cluster, 3, export).returncode != 0
    # back to the whole line
    assert tp4("share", "--profile", str(cluster.profile)).returncode == 0
    assert read(cluster, 3, export).returncode == 0


def test_an_export_path_with_spaces_is_quoted_once(cluster: LineCluster, tmp_path: Path) -> None:
    spaced = cluster.model_dir.parent / "model dir v1"
    spaced.mkdir(exist_ok=True)
    (spaced / "config.json").write_text('{"architectures": ["DeepseekV4ForCausalLM"], "spaced": true}\n')
    profile = tmp_path / "spaced.toml"
    profile.write_text(cluster.profile.read_text().replace(f'dir = "{cluster.model_dir}"', f'dir = "{spaced}"'))
    try:
        proc = tp4("share", "--profile", str(profile))
        assert proc.returncode == 0, proc.stderr
        conf, _ = ganesha_state(cluster)
        assert f'Path = "{spaced}";' in conf and f'Pseudo = "{spaced}";' in conf
        assert (
            share.kernel_exports_text(str(spaced), ["10.0.0.2"]).splitlines()[1]
            == f'"{spaced}" 10.0.0.2(ro,sync,no_subtree_check,no_root_squash,insecure)'
        )
        got = read(cluster, 2, str(spaced))
        assert got.returncode == 0 and '"spaced": true' in got.stdout, got.stderr
        device = (
            cluster.hosts[2]
            .run("podman", "volume", "inspect", "--format", "{{.Options.device}}", "--", "dsv41-weights")
            .stdout
        )
        assert device.strip() == f":{spaced}"
    finally:
        assert tp4("share", "--profile", str(cluster.profile)).returncode == 0


def test_a_missing_model_dir_is_named_and_nothing_changes(cluster: LineCluster, tmp_path: Path) -> None:
    assert tp4("share", "--profile", str(cluster.profile)).returncode == 0
    before = (ganesha_state(cluster), volumes(cluster))
    missing = cluster.model_dir.parent / "no such model"
    profile = tmp_path / "missing.toml"
    profile.write_text(cluster.profile.read_text().replace(f'dir = "{cluster.model_dir}"', f'dir = "{missing}"'))
    proc = tp4("share", "--profile", str(profile))
    assert proc.returncode == 1
    assert f"model.dir: {missing} does not exist on node1; fix: tp4 download" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert (ganesha_state(cluster), volumes(cluster)) == before


def test_a_volume_in_use_with_other_options_is_an_error(cluster: LineCluster, tmp_path: Path) -> None:
    assert tp4("share", "--profile", str(cluster.profile)).returncode == 0
    w = cluster.hosts[3]
    w.run("podman", "volume", "rm", "-f", "--", "dsv41-weights")
    w.run("podman", "volume", "create", "--", "dsv41-weights")
    w.run("podman", "create", "--name", "holder", "-v", "dsv41-weights:/m:ro", cluster.plan.image.tag)
    try:
        proc = tp4("share", "--profile", str(cluster.profile))
        assert proc.returncode == 1
        assert "node4: the volume dsv41-weights has other options ({}) and holder use it; fix: tp4 stop" in proc.stderr
    finally:
        w.run("podman", "rm", "-f", "holder")
    assert tp4("share", "--profile", str(cluster.profile)).returncode == 0


def test_share_off_does_nothing(cluster: LineCluster, tmp_path: Path) -> None:
    assert tp4("share", "--profile", str(cluster.profile)).returncode == 0
    before = (ganesha_state(cluster), volumes(cluster))
    off = tmp_path / "off.toml"
    off.write_text(cluster.profile.read_text().replace("[nfs]\n", "[nfs]\nshare = false\n"))
    proc = tp4("share", "--profile", str(off))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "share: nfs.share = false: the workers use their own weights volume; nothing to share\n"
    assert (ganesha_state(cluster), volumes(cluster)) == before


def test_a_nixos_worker_is_only_checked(cluster: LineCluster, tmp_path: Path) -> None:
    assert tp4("share", "--profile", str(cluster.profile)).returncode == 0
    text = cluster.profile.read_text()
    last = text.rindex('kind = "plain"')
    nixos = tmp_path / "nixos.toml"
    nixos.write_text(text[:last] + 'kind = "nixos"' + text[last + len('kind = "plain"') :])
    proc = tp4("share", "--profile", str(nixos))
    assert proc.returncode == 0, proc.stderr
    assert "node4: volume dsv41-weights" in proc.stdout and "present (NixOS module)" in proc.stdout
    w = cluster.hosts[3]
    w.run("podman", "volume", "rm", "-f", "--", "dsv41-weights")
    try:
        proc = tp4("share", "--profile", str(nixos))
        assert proc.returncode == 1
        assert (
            "node4: the NixOS host's volume dsv41-weights is missing" in proc.stderr
            and "fix: set the module's" in proc.stderr
        )
        # share made nothing on the NixOS host
        assert w.run("podman", "volume", "inspect", "--", "dsv41-weights", check=False).returncode != 0
    finally:
        assert tp4("share", "--profile", str(cluster.profile)).returncode == 0


RING = {
    "preset": "production",
    "fabric": {"mode": "ring", "nccl": {"mount": "overlay", "min_nchannels": 4, "max_nchannels": 4}},
    "nfs": {"share": False},
    "gates": {"DSV41_ROCE_RING": "1", "SGLANG_ROCE_MAX_SIZE": "262144", "DSV41_ROCE_GATHER": "262144"},
    "cluster": {
        "head": {"name": "a", "ip": "10.0.0.1"},
        "workers": [{"name": "b", "ip": "10.0.0.2"}, {"name": "c", "ip": "10.0.0.3"}, {"name": "d", "ip": "10.0.0.4"}],
    },
}


def test_a_ring_has_nothing_to_share_and_reaches_no_node() -> None:
    from tp4.line.profile.load import parse_document

    loaded = parse_document(RING, "ring")
    plan = build_plan(loaded)
    said: list[str] = []
    # the nodes' addresses do not exist here: any command on them would fail
    share.share(loaded.profile, plan, nodes_of(plan), said.append)
    assert said == ["share: ring fabric: every node holds its own copy of the checkpoint; nothing to share"]


def test_export_lines_as_data() -> None:
    text = share.kernel_exports_text("/srv/my model", ["10.0.22.2", "10.0.22.3"])
    opts = "(ro,sync,no_subtree_check,no_root_squash,insecure)"
    assert text.splitlines()[1] == f'"/srv/my model" 10.0.22.2{opts} 10.0.22.3{opts}'
    assert share.kernel_exports_text("/srv/m", ["10.0.22.2"]).splitlines()[1] == f"/srv/m 10.0.22.2{opts}"
    # exportfs -v writes a space as \040; a client missing from the listing is named
    listing = "/srv/my\\040model\n\t\t10.0.22.2(sync,wdelay,hide,no_subtree_check,sec=sys,ro,secure,no_root_squash)\n"
    assert share._exportfs_has(listing, "/srv/my model", ["10.0.22.2", "10.0.22.3"]) == ["10.0.22.3"]
    conf = share.ganesha_config("/srv/my model", ["10.0.22.2", "10.0.22.3"], "/w/nfs-ganesha")
    assert 'Path = "/srv/my model";' in conf and "CLIENT { Clients = 10.0.22.2, 10.0.22.3; Access_Type = RO; }" in conf
    assert "Protocols = 4;" in conf and "Enable_UDP = false;" in conf
    assert share.nfs_url("10.0.22.1", "/srv/my model/") == "nfs://10.0.22.1/srv/my model/config.json?version=4"


@pytest.mark.parametrize("path", ['/srv/a"b', "/srv/a\\b", "/srv/a\tb"])
def test_an_export_path_an_export_line_cannot_carry_is_refused(path: str) -> None:
    from tp4.core.errors import InvalidInput

    with pytest.raises(InvalidInput, match=r"^model\.dir: .* fix: move the checkpoint"):
        share._check_export_path(path)
