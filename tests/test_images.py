"""`tp4 images` and `tp4 images prune` on a head (this process's own podman store) and two netns
workers with real sshd, each with its own podman store. The images are real: small tarballs
imported with `podman import`, each carrying the labels pkgs/image.nix gives (tp4.line.ref, the
flake revision, a pin), or none (an image tp4 must never touch)."""

from __future__ import annotations

import json
import os
import re
import shutil
import tarfile
import tempfile
import time
from pathlib import Path

import pytest

from netns_hosts import NetnsHosts, storage_conf
from tp4.core import process
from tp4.image import runtime_cli

LINE = "tp4-img:line"
PIN = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    with NetnsHosts(tmp_path_factory.mktemp("netns"), count=2) as hosts:
        yield hosts


@pytest.fixture
def head(tmp_path, monkeypatch, hosts):
    """An empty podman store for the head (short path: see tests/test_build.py), empty worker
    stores, no registry state (XDG_STATE_HOME), and a small tarball to import images from."""
    store = Path(tempfile.mkdtemp(prefix="tp4i-", dir="/tmp"))
    monkeypatch.setenv("CONTAINERS_STORAGE_CONF", str(storage_conf(store)))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    conf = tmp_path / "runtime_cli.conf"  # this sandbox's hard limits: see tests/test_build.py
    conf.write_text('[containers]\ndefault_ulimits = ["nofile=1024:1024", "nproc=4096:4096"]\n')
    monkeypatch.setenv("CONTAINERS_CONF", str(conf))
    root = tmp_path / "root"
    (root / "opt").mkdir(parents=True)
    (root / "opt" / "data").write_bytes(os.urandom(256 * 1024))
    tarball = tmp_path / "rootfs.tar"
    with tarfile.open(tarball, "w") as tar:
        tar.add(root / "opt", arcname="opt")
    wipe(hosts)
    yield tarball
    process.run(["podman", "rm", "-a", "-f"], check=False)
    process.run(["podman", "rmi", "-a", "-f"], check=False)
    shutil.rmtree(store, ignore_errors=True)
    wipe(hosts)


def wipe(hosts) -> None:
    for h in hosts:
        h.run("podman", "rm", "-a", "-f", check=False)
        h.run("podman", "rmi", "-a", "-f", check=False)


def podman(*argv: str, host=None) -> str:
    return process.run(["podman", *argv], remote=host.remote if host else None).stdout


_clock = [time.time() - 3600.0]


def make_image(tarball: Path, rev: str, tag: str | None = None, *, host=None, tp4: bool = True) -> str:
    """Import the tarball as an image (labels as pkgs/image.nix gives them; none without tp4);
    its id. `podman import` dates the image by the tarball's mtime: each import gets one a
    minute later than the one before, so a later image is newer."""
    labels = [f"tp4.line.ref={LINE}", f"tp4.flake.rev={rev}", f"tp4.pin.demo={PIN}"] if tp4 else [f"other.rev={rev}"]
    _clock[0] += 60
    os.utime(tarball, (_clock[0], _clock[0]))
    changes = [arg for label in labels for arg in ("--change", f"LABEL {label}")]
    out = podman("import", "-q", *changes, str(tarball), *([tag] if tag else []), host=host)
    return runtime_cli.normalize_id(out.strip().splitlines()[-1])


def exists(image_id: str, host=None) -> bool:
    return (
        process.run(
            ["podman", "image", "exists", image_id], remote=host.remote if host else None, check=False
        ).returncode
        == 0
    )


def copy_to(host, image_id: str, tmp_path: Path) -> None:
    """The head's image into the worker's store, the same id (the hosts share the filesystem)."""
    archive = tmp_path / f"{image_id[:12]}.tar"
    if not archive.exists():
        podman("save", "-o", str(archive), image_id)
    host.run("podman", "load", "-q", "-i", str(archive))
    host.run("podman", "tag", image_id, LINE)


def node_args(hosts, workers=None) -> list[str]:
    args = ["--runtime", "podman", "--user", "root", "--identity", str(hosts.key)]
    for opt in hosts[0].remote.options:
        args += ["--ssh-option", opt]
    for h in hosts if workers is None else workers:
        args += ["--worker", h.address]
    return args


def test_listing_shows_provenance_and_marks_the_worker_whose_line_image_differs(hosts, head, tp4_cli, tmp_path):
    line_id = make_image(head, "rev-line", LINE)
    other_id = make_image(head, "rev-other", "tp4-img:other")
    foreign = make_image(head, "x", "not-tp4:latest", tp4=False)
    podman("create", "--name", "uses-other", other_id, "/bin/true")
    copy_to(hosts[0], line_id, tmp_path)
    stale = make_image(head, "rev-stale", LINE, host=hosts[1])  # node2: another image under the line's tag
    assert stale != line_id

    code, out, err = tp4_cli("images", *node_args(hosts))
    assert code == 0, err
    blocks = {b.split(":", 1)[0]: b for b in out.strip().split("\n\n")}
    assert set(blocks) == {"head", hosts[0].address, hosts[1].address}, out
    assert f"{LINE} is {line_id[:12]}" in blocks["head"]
    assert "DIFFERS" not in blocks["head"] and "DIFFERS" not in blocks[hosts[0].address]
    assert f"{hosts[0].address}: 1 tp4 images; {LINE} is {line_id[:12]}\n" in out
    assert f"DIFFERS from the head: {LINE} is {stale[:12]}, the head has {line_id[:12]}" in blocks[hosts[1].address]
    # provenance from the labels, the container that uses an image, no foreign image
    assert re.search(
        rf"{other_id[:12]} .*tp4-img:other  used by uses-other\n +flake +rev-other\n +demo +{PIN}\n", blocks["head"]
    ), blocks["head"]
    assert foreign[:12] not in out and "not-tp4" not in out

    code, out, err = tp4_cli("images", "--json", *node_args(hosts))
    assert code == 0, err
    nodes = {n["node"]: n for n in json.loads(out)["nodes"]}
    assert nodes["head"]["line"] == {LINE: line_id} and nodes["head"]["differs"] == []
    assert nodes[hosts[0].address]["differs"] == []
    assert nodes[hosts[1].address]["differs"] == [f"{LINE} is {stale[:12]}, the head has {line_id[:12]}"]
    other = next(i for i in nodes["head"]["images"] if i["id"] == other_id)
    assert other["flake_rev"] == "rev-other" and other["pins"] == {"demo": PIN}
    assert other["containers"] == ["uses-other"] and other["line"] is False
    assert {i["id"] for i in nodes["head"]["images"]} == {line_id, other_id}


def test_a_worker_that_cannot_be_reached_is_named_and_the_others_still_listed(hosts, head, tp4_cli):
    line_id = make_image(head, "rev-line", LINE)
    nobody = hosts.unreachable()
    code, out, err = tp4_cli(
        "images", *node_args(hosts, [hosts[0]]), "--worker", nobody, "--ssh-option", "ConnectTimeout=3"
    )
    assert code == 1
    assert f"{nobody}: cannot list its images (the reason is in the error below)" in out
    assert "cannot reach" in err and "cannot reach" not in out  # said once
    assert f"{LINE} is {line_id[:12]}" in out and f"{hosts[0].address}: 0 tp4 images; no line image" in out
    assert f"could not list the images of {nobody}" in err and "Traceback" not in err


def test_prune_keeps_the_line_image_the_used_ones_and_the_newest_and_never_a_foreign_one(hosts, head, tp4_cli):
    foreign = make_image(head, "x", "not-tp4:old", tp4=False)  # the oldest of all
    line = make_image(head, "r1", LINE)
    used = make_image(head, "r2", "tp4-img:used")
    podman("create", "--name", "stopped-one", used, "/bin/true")  # created, never started
    old_a = make_image(head, "r3", "tp4-img:a")
    old_b = make_image(head, "r4")  # untagged, as the line's previous image is once the tag moved
    new_a = make_image(head, "r5", "tp4-img:c")
    new_b = make_image(head, "r6", "tp4-img:d")
    # node1: its own history; the line's image is the newest there, so it is one of the newest 2
    w_old = make_image(head, "w1", "tp4-img:w-old", host=hosts[0])
    w_mid = make_image(head, "w2", "tp4-img:w-mid", host=hosts[0])
    w_new = make_image(head, "w3", "tp4-img:w-new", host=hosts[0])
    w_line = make_image(head, "w4", LINE, host=hosts[0])
    w_foreign = make_image(head, "wx", "not-tp4:w", host=hosts[0], tp4=False)

    code, out, err = tp4_cli("images", "prune", "--dry-run", *node_args(hosts))
    assert code == 0, err
    assert "head: would remove 2 images; kept 4" in out, out
    assert f"{hosts[0].address}: would remove 2 images; kept 2" in out
    assert f"{hosts[1].address}: would remove 0 images; kept 0" in out
    assert all(exists(i) for i in (line, used, old_a, old_b, new_a, new_b))
    assert exists(w_old, hosts[0])

    code, out, err = tp4_cli("images", "prune", *node_args(hosts))
    assert code == 0, err
    assert not exists(old_a) and not exists(old_b)
    assert all(exists(i) for i in (foreign, line, used, new_a, new_b))
    assert [exists(i, hosts[0]) for i in (w_old, w_mid, w_new, w_line, w_foreign)] == [False, False, True, True, True]
    m = re.search(r"^head: removed 2 images, freed ([0-9.]+) MiB; kept 4$", out, re.M)
    assert m and float(m.group(1)) > 0.2, out  # two copies of a 256 KiB layer at least (vfs keeps one per image)
    assert f"kept    {used[:12]}" in out and "used by stopped-one" in out
    assert re.search(rf"kept    {line[:12]} .*the line's image", out)
    assert re.search(rf"{hosts[0].address}: removed 2 images, freed [0-9.]+ MiB; kept 2", out)
    assert "registry: the head's registry is not running" in out or "registry: this tp4 has no image store" in out

    # --keep 0: only the line's image and the used one stay
    code, out, err = tp4_cli("images", "prune", "--keep", "0", *node_args(hosts))
    assert code == 0, err
    assert [exists(i) for i in (line, used, new_a, new_b, foreign)] == [True, True, False, False, True]
    assert [exists(i, hosts[0]) for i in (w_new, w_line, w_foreign)] == [False, True, True]


def test_prune_leaves_an_image_a_running_container_started_from(hosts, head, tp4_cli):
    """A container that uses an image blocks its removal even when it is not the line's: the
    listing sees it, and without --force the runtime refuses too."""
    busybox_root = head.parent / "bb"
    (busybox_root / "bin").mkdir(parents=True)
    shutil.copy2(shutil.which("busybox") or "/bin/busybox", busybox_root / "bin" / "busybox")
    tarball = head.parent / "bb.tar"
    with tarfile.open(tarball, "w") as tar:
        tar.add(busybox_root / "bin", arcname="bin")
    running = make_image(tarball, "run", "tp4-img:running")
    make_image(head, "line", LINE)
    podman("run", "-d", "--name", "serving", "--network", "none", running, "/bin/busybox", "sleep", "300")
    try:
        code, out, err = tp4_cli("images", "prune", "--keep", "0", *node_args(hosts, []), "--worker", hosts[0].address)
        assert code == 0, err
        assert exists(running) and "used by serving" in out
    finally:
        process.run(["podman", "rm", "-f", "-t", "0", "serving"], check=False)


@pytest.mark.parametrize(
    "value, said",
    [
        ("-1", "-1 is out of range"),
        ("true", "'true' is not a whole number"),
        ("99999999999999999999", "99999999999999999999 is out of range"),
        ("2.5", "'2.5' is not a whole number"),
    ],
)
def test_a_bad_keep_is_refused_before_any_node_is_asked(value, said, tp4_cli):
    code, out, err = tp4_cli("images", "prune", "--keep", value, "--worker", "192.0.2.1")
    assert code == 2
    assert f"Invalid value for '--keep': {said}; fix: pass how many of the newest builds to keep, 0 to 1000" in err
    assert "Traceback" not in err and out == ""


def distinct_tarball(tmp_path: Path, name: str) -> Path:
    """A tarball of its own random bytes, so its image's layer is a blob of its own."""
    root = tmp_path / f"root-{name}"
    (root / "opt").mkdir(parents=True)
    (root / "opt" / "data").write_bytes(os.urandom(512 * 1024))
    tarball = tmp_path / f"{name}.tar"
    with tarfile.open(tarball, "w") as tar:
        tar.add(root / "opt", arcname="opt")
    return tarball


def test_registry_prune_deletes_the_manifests_no_node_keeps_and_collects_their_blobs(hosts, head, tp4_cli, tmp_path):
    """The head's registry (the real docker-registry, tp4.image.imagestore) holds three builds: the one
    the head's line tag names, one a worker still has as its line image, and an old one. Prune
    deletes only the old one's manifest and garbage-collects its blobs; the listing shows the
    digest of each pushed image."""
    imagestore = pytest.importorskip(
        "tp4.image.imagestore", reason="the head's registry (tp4.image.imagestore) is another branch of issue 9"
    )
    old = make_image(distinct_tarball(tmp_path, "old"), "r-old", "tp4-img:old")
    worker_line = make_image(distinct_tarball(tmp_path, "worker"), "r-worker", "tp4-img:prev")
    line = make_image(distinct_tarball(tmp_path, "line"), "r-line", LINE)
    copy_to(hosts[0], worker_line, tmp_path)
    store = imagestore.start()
    try:
        digests = {i: imagestore.push("podman", i, store) for i in (old, worker_line, line)}
        assert sorted(imagestore.manifests(store, "dsv41-4x-spark")) == sorted(digests.values())

        code, out, err = tp4_cli("images", *node_args(hosts, [hosts[0]]))
        assert code == 0, err
        for image_id, digest in digests.items():
            assert re.search(rf"^  {image_id[:12]} .*  digest {digest}$", out, re.M), out

        code, out, err = tp4_cli("images", "prune", "--keep", "0", "--dry-run", *node_args(hosts, [hosts[0]]))
        assert code == 0, err
        assert f"registry: would remove 1 manifests; kept 2\n  would remove {digests[old]}\n" in out
        assert len(imagestore.manifests(store, "dsv41-4x-spark")) == 3

        blob = next(d for d in manifest_layer_digests(store, digests[old]))
        assert imagestore.blob_path(store, blob).exists()
        code, out, err = tp4_cli("images", "prune", "--keep", "0", *node_args(hosts, [hosts[0]]))
        assert code == 0, err
        assert not exists(old) and not exists(worker_line) and exists(line) and exists(worker_line, hosts[0])
        assert sorted(imagestore.manifests(store, "dsv41-4x-spark")) == sorted([digests[line], digests[worker_line]])
        m = re.search(r"^registry: removed 1 manifests, freed ([0-9.]+) MiB; kept 2$", out, re.M)
        assert m and float(m.group(1)) >= 0.4, out  # the old build's 512 KiB layer (gzip cannot shrink random bytes)
        assert not imagestore.blob_path(store, blob).exists()
        for digest in (digests[line], digests[worker_line]):  # what is kept still pulls
            skopeo_inspect(store, digest)
    finally:
        imagestore.stop(store.root)


def skopeo_inspect(store, digest: str, *flags: str) -> str:
    """`skopeo inspect` of a manifest in the store, with tp4's credential (the store refuses
    anonymous reads) in an auth file."""
    from tp4.image import imagestore

    with imagestore.auth_dir(store.credential, store.url) as auth:
        return process.run(
            [
                "skopeo",
                "inspect",
                *flags,
                "--tls-verify=false",
                "--authfile",
                str(auth / "config.json"),
                f"docker://{store.url}/dsv41-4x-spark@{digest}",
            ]
        ).stdout


def manifest_layer_digests(store, digest: str) -> list[str]:
    raw = skopeo_inspect(store, digest, "--raw")
    return [layer["digest"] for layer in json.loads(raw)["layers"]]


def test_a_worker_that_pulled_from_the_registry_shows_the_heads_digest(hosts, head, tp4_cli, tmp_path):
    """After `tp4 distribute --method registry` the worker's image carries the manifest digest
    it was pulled by, the one the head's registry lists for the head's image."""
    imagestore = pytest.importorskip(
        "tp4.image.imagestore", reason="the head's registry (tp4.image.imagestore) is another branch of issue 9"
    )
    line = make_image(distinct_tarball(tmp_path, "line"), "r-line", LINE)
    try:
        code, out, err = tp4_cli("distribute", "--method", "registry", "--image", LINE, *node_args(hosts, [hosts[0]]))
        assert code == 0, err
        store = imagestore.running()
        assert store is not None
        (digest,) = imagestore.manifests(store, "dsv41-4x-spark")
        code, out, err = tp4_cli("images", "--json", *node_args(hosts, [hosts[0]]))
        assert code == 0, err
        nodes = {n["node"]: n for n in json.loads(out)["nodes"]}
        assert [(i["id"], i["digest"]) for i in nodes["head"]["images"]] == [(line, digest)]
        assert [(i["id"], i["digest"]) for i in nodes[hosts[0].address]["images"]] == [(line, digest)]
        assert nodes[hosts[0].address]["differs"] == []
    finally:
        imagestore.stop()
