"""The head's image store (tp4.image.imagestore) with the real `docker-registry`, skopeo and podman:
start/stop, push (blobs the store has are not uploaded again), manifests, delete and garbage
collection, the bytes it serves."""

from __future__ import annotations

import hashlib
import io
import json
import os
import socket
import subprocess
import sys
import tarfile
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from netns_hosts import storage_conf
from tp4.core import process
from tp4.image import imagestore, runtime_cli
from tp4.core.errors import Tp4Error

REPO = imagestore.DEFAULT_REPO


def _tar(files: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), 1
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def docker_archive(path: Path, tag: str, layers: list[bytes], label: str) -> str:
    """A docker-archive of these layer tarballs; returns the image id (its config's digest)."""
    diffs = [hashlib.sha256(layer).hexdigest() for layer in layers]
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Labels": {"v": label}},
            "rootfs": {"type": "layers", "diff_ids": [f"sha256:{d}" for d in diffs]},
        }
    ).encode()
    image_id = hashlib.sha256(config).hexdigest()
    manifest = [{"Config": f"{image_id}.json", "RepoTags": [tag], "Layers": [f"{d}/layer.tar" for d in diffs]}]
    path.write_bytes(
        _tar(
            {
                **{f"{d}/layer.tar": layer for d, layer in zip(diffs, layers, strict=True)},
                f"{image_id}.json": config,
                "manifest.json": json.dumps(manifest).encode(),
            }
        )
    )
    return image_id


@pytest.fixture
def podman_store(tmp_path, monkeypatch):
    monkeypatch.setenv("CONTAINERS_STORAGE_CONF", str(storage_conf(tmp_path / "podman")))


@pytest.fixture
def store(tmp_path):
    started = imagestore.start(tmp_path / "registry")
    yield started
    imagestore.stop(started.root)


@pytest.fixture
def images(tmp_path, podman_store):
    """Two images in the head's podman store sharing a 4 MiB base layer; their ids."""
    base = _tar({"base": os.urandom(4 << 20)})
    ids = []
    for name in ("one", "two"):
        path = tmp_path / f"{name}.tar"
        ids.append(
            docker_archive(path, f"localhost/tp4-store:{name}", [base, _tar({"top": name.encode() * 1000})], name)
        )
        process.run(["podman", "load", "-i", str(path)])
    return ids


def uploads(store: imagestore.Store) -> int:
    return store.access_log.read_text().count(f'"POST /v2/{REPO}/blobs/uploads/ ')


def test_start_is_idempotent_binds_loopback_and_stop_stops_it(tmp_path):
    root = tmp_path / "registry"
    store = imagestore.start(root)
    try:
        assert imagestore.start(root) == store
        assert imagestore.running(root) == store
        assert f"addr: 127.0.0.1:{store.port}" in store.config.read_text()
        with socket.socket() as sock:
            sock.connect(("127.0.0.1", store.port))
        with pytest.raises(Tp4Error, match="already runs on port"):
            imagestore.start(root, store.port + 1)
    finally:
        assert imagestore.stop(root) is True
    assert imagestore.running(root) is None
    assert imagestore.stop(root) is False
    # a restart keeps the port of the last start
    again = imagestore.start(root)
    try:
        assert again.port == store.port
    finally:
        imagestore.stop(root)


def test_the_store_outlives_ctrl_c_of_the_command_that_started_it(tmp_path):
    """Started detached: what Ctrl-C does to tp4's children (process.stop_all) leaves it serving,
    and a tp4 process that starts it and is then interrupted leaves it running too."""
    root = tmp_path / "registry"
    store = imagestore.start(root)
    try:
        process.stop_all()
        assert imagestore.running(root) == store
    finally:
        imagestore.stop(root)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent / "python")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "tp4", "image-store", "start", "--root", str(root)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    try:
        found = imagestore.running(root)
        assert found is not None
        pid = json.loads((root / "pid").read_text())["pid"]
        assert os.getsid(pid) == pid  # its own session: the terminal's Ctrl-C never reaches it
    finally:
        imagestore.stop(root)


def test_concurrent_starts_make_one_store(tmp_path):
    root = tmp_path / "registry"
    with ThreadPoolExecutor(max_workers=4) as pool:
        stores = list(pool.map(lambda _: imagestore.start(root), range(4)))
    try:
        assert len(set(stores)) == 1
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
        serving = []
        for p in pids:
            try:
                cmdline = Path(f"/proc/{p}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if str(stores[0].config).encode() in cmdline:
                serving.append(p)
        assert len(serving) == 1, serving
    finally:
        imagestore.stop(root)


def test_a_start_moves_a_large_access_log_aside(tmp_path):
    root = tmp_path / "registry"
    root.mkdir()
    with open(root / "access.log", "wb") as fh:
        fh.truncate(imagestore.ACCESS_LOG_MAX + 1)  # sparse: no disk used
    imagestore.start(root)
    try:
        assert (root / "access.log.1").stat().st_size == imagestore.ACCESS_LOG_MAX + 1
        assert (root / "access.log").stat().st_size < 2**20
    finally:
        imagestore.stop(root)


def test_a_taken_port_is_a_clear_error(tmp_path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        with pytest.raises(Tp4Error, match="did not answer") as exc:
            imagestore.start(tmp_path / "registry", port)
    assert "address already in use" in str(exc.value) and "--port" in str(exc.value)
    assert imagestore.running(tmp_path / "registry") is None


def test_push_keeps_the_image_id_and_uploads_only_missing_blobs(store, images):
    one, two = images
    digest = imagestore.push("podman", one, store)
    assert digest.startswith("sha256:") and imagestore.manifests(store, REPO) == [digest]
    manifest = imagestore.manifest(store, REPO, digest)
    assert manifest["config"]["digest"] == f"sha256:{one}"  # the id the workers will report
    assert len(manifest["layers"]) == 2
    assert uploads(store) == 3  # two layers and the config

    assert imagestore.push("podman", one, store) == digest  # again: the same manifest, nothing uploaded
    assert uploads(store) == 3
    assert imagestore.has_manifest(store, REPO, digest)

    other = imagestore.push("podman", two, store)
    assert other != digest
    assert uploads(store) == 5  # its top layer and its config; the shared base is not sent again
    assert imagestore.manifest(store, REPO, other)["layers"][0] == manifest["layers"][0]
    assert sorted(imagestore.manifests(store, REPO)) == sorted([digest, other])


def test_push_of_a_missing_image_names_it(store, podman_store):
    with pytest.raises(Tp4Error, match="has no image nothing:here"):
        imagestore.push("podman", "nothing:here", store)


def test_served_bytes_count_the_blobs_pulled(store, images, tmp_path, monkeypatch):
    digest = imagestore.push("podman", images[0], store)
    manifest = imagestore.manifest(store, REPO, digest)
    assert imagestore.served_bytes(store) == 0
    monkeypatch.setenv("CONTAINERS_STORAGE_CONF", str(storage_conf(tmp_path / "puller")))
    with imagestore.auth_dir(store.credential, f"localhost:{store.port}") as auth:
        process.run(
            ["podman", "pull", "--tls-verify=false", f"localhost:{store.port}/{REPO}@{digest}"],
            env={"REGISTRY_AUTH_FILE": str(auth / "config.json")},
        )
    assert runtime_cli.inspect("podman", images[0]) is not None
    blobs = sum(layer["size"] for layer in manifest["layers"]) + manifest["config"]["size"]
    assert imagestore.served_bytes(store) == blobs


def test_delete_and_garbage_collect_remove_the_blobs_of_a_deleted_manifest_only(store, images):
    one, two = images
    first = imagestore.push("podman", one, store)
    second = imagestore.push("podman", two, store)
    top = imagestore.manifest(store, REPO, first)["layers"][1]["digest"]
    base = imagestore.manifest(store, REPO, first)["layers"][0]["digest"]
    assert imagestore.blob_path(store, top).exists()
    imagestore.delete(store, REPO, first)
    assert imagestore.manifests(store, REPO) == [second]
    assert not imagestore.has_manifest(store, REPO, first)
    imagestore.garbage_collect(store)
    assert not imagestore.blob_path(store, top).exists()
    assert not imagestore.blob_path(store, f"sha256:{one}").exists()  # its config
    assert imagestore.blob_path(store, base).exists()  # still the second one's
    assert imagestore.has_manifest(store, REPO, second)


def test_the_cli_starts_reports_and_stops_the_store(tmp_path, tp4_cli, images):
    root = tmp_path / "cli-registry"
    code, out, err = tp4_cli("image-store", "status", "--root", root)
    assert code == 1 and "not running" in err and "tp4 image-store start" in err
    code, out, err = tp4_cli("image-store", "start", "--root", root)
    assert code == 0, err
    store = imagestore.running(root)
    try:
        assert store is not None and f"image store {store.url}" in out
        digest = imagestore.push("podman", images[0], store)
        code, out, err = tp4_cli("image-store", "status", "--root", root)
        assert code == 0 and f"{REPO}@{digest}" in out
    finally:
        code, out, err = tp4_cli("image-store", "stop", "--root", root)
    assert code == 0 and "stopped" in out
    assert imagestore.running(root) is None


# --- authentication -----------------------------------------------------------------------------------


def _anonymous(store, method: str, path: str) -> int:
    """The HTTP status of a request without any credential (as any local process can send)."""
    req = urllib.request.Request(f"http://{store.url}{path}", method=method)
    try:
        with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(req, timeout=10) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def test_the_store_refuses_anonymous_pushes_deletes_and_pulls(store, images, tmp_path, monkeypatch):
    """Any local process (a rank container with host networking) reaches 127.0.0.1: without tp4's
    credential it can neither push, nor delete, nor read."""
    digest = imagestore.push("podman", images[0], store)
    assert _anonymous(store, "POST", f"/v2/{REPO}/blobs/uploads/") == 401
    assert _anonymous(store, "DELETE", f"/v2/{REPO}/manifests/{digest}") == 401
    assert _anonymous(store, "GET", f"/v2/{REPO}/manifests/{digest}") == 401
    assert _anonymous(store, "GET", "/v2/") == 401
    wrong = imagestore.Credential(imagestore.PUSH_USER, "not-the-password")
    assert imagestore._request(store, "DELETE", f"/v2/{REPO}/manifests/{digest}", credential=wrong)[0] == 401
    assert imagestore.has_manifest(store, REPO, digest)
    # a real client without the credential: refused
    proc = process.run(
        [
            "skopeo",
            "copy",
            "--dest-tls-verify=false",
            f"containers-storage:{images[1]}",
            f"docker://{store.url}/{REPO}:x",
        ],
        check=False,
    )
    assert proc.returncode != 0 and ("401" in proc.stderr or "unauthorized" in proc.stderr.lower()), proc.stderr
    monkeypatch.setenv("CONTAINERS_STORAGE_CONF", str(storage_conf(tmp_path / "puller")))
    proc = process.run(["podman", "pull", "--tls-verify=false", f"localhost:{store.port}/{REPO}@{digest}"], check=False)
    assert proc.returncode != 0
    assert imagestore.manifests(store, REPO) == [digest]


def test_the_credential_is_private_bcrypt_and_kept_across_restarts(tmp_path):
    root = tmp_path / "registry"
    store = imagestore.start(root)
    try:
        cred = store.credential
        assert cred.user == imagestore.PUSH_USER and len(cred.password) >= 32
        assert root.stat().st_mode & 0o777 == 0o700
        for name in (imagestore.CREDENTIAL, imagestore.HTPASSWD):
            assert (root / name).stat().st_mode & 0o777 == 0o600
        user, hashed = (root / imagestore.HTPASSWD).read_text().strip().split(":", 1)
        assert user == cred.user and hashed.startswith("$2") and cred.password not in hashed
        assert cred.password not in store.config.read_text()
        assert f"path: {json.dumps(str(root / imagestore.HTPASSWD))}" in store.config.read_text()  # YAML-quoted
    finally:
        imagestore.stop(root)
    again = imagestore.start(root)
    try:
        assert again.credential == cred and imagestore._answers(again)
    finally:
        imagestore.stop(root)


def test_the_pull_endpoint_is_read_only_with_its_own_credential_and_ends_with_its_block(store, images):
    digest = imagestore.push("podman", images[0], store)
    with imagestore.pull_endpoint(store) as endpoint:
        pull = endpoint.credential
        assert pull.user == imagestore.PULL_USER and pull.password != store.credential.password
        probe = imagestore.Store(store.root, endpoint.port)
        ask = imagestore._request
        assert ask(probe, "GET", f"/v2/{REPO}/manifests/{digest}", credential=pull)[0] == 200
        # the pull credential can neither push nor delete; nothing can without a credential
        assert ask(probe, "POST", f"/v2/{REPO}/blobs/uploads/", credential=pull)[0] == 405
        assert ask(probe, "DELETE", f"/v2/{REPO}/manifests/{digest}", credential=pull)[0] == 405
        assert _anonymous(probe, "GET", f"/v2/{REPO}/manifests/{digest}") == 401
        assert _anonymous(probe, "DELETE", f"/v2/{REPO}/manifests/{digest}") == 401
        # nor can tp4's push credential be used there: the endpoint knows only its own user
        assert ask(probe, "GET", "/v2/", credential=store.credential)[0] == 401
        # and the pull credential is nothing to the store itself
        assert ask(store, "GET", "/v2/", credential=pull)[0] == 401
        private = [p for p in store.root.iterdir() if p.name.startswith("pull-")]
        assert len(private) == 1 and private[0].stat().st_mode & 0o777 == 0o700
    assert not any(p.name.startswith("pull-") for p in store.root.iterdir())
    with socket.socket() as sock, pytest.raises(OSError):
        sock.connect(("127.0.0.1", endpoint.port))
    assert imagestore.has_manifest(store, REPO, digest)


def test_no_credential_in_argv_or_the_log(store, images, caplog, capfd):
    """Every command of a push goes through the funnel, which logs its argv: the password is in
    none of them (auth files), nor in anything printed."""
    caplog.set_level("DEBUG", logger="tp4.core.process")
    digest = imagestore.push("podman", images[0], store)
    imagestore.manifests(store, REPO)
    from tp4.image import images as images_module

    assert images_module.manifest_image_id(store, REPO, digest) == images[0]
    cred = store.credential
    logged = caplog.text
    assert "skopeo copy" in logged and "--dest-authfile" in logged
    out, err = capfd.readouterr()
    for secret in cred.secrets:
        assert secret not in logged and secret not in out and secret not in err
