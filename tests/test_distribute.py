"""`tp4 distribute` to three netns hosts with real sshd, each with its own podman image store.

The default method pulls from the head's image store (a real `docker-registry` on the head's
127.0.0.1, under the test's XDG_STATE_HOME) through reverse ssh tunnels; the workers' network
namespaces have no route to the head's loopback, so the tunnel is their only way to it."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from netns_hosts import NetnsHosts, storage_conf
from nix_env import image_flake, image_nix_config
from tp4.core import process
from tp4.image import build, imagestore, runtime_cli

REF = "tp4-test:dist"
PYTHON = Path(__file__).resolve().parent.parent / "python"


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    with NetnsHosts(tmp_path_factory.mktemp("netns"), count=3) as hosts:
        yield hosts


# below the image's own layer (busybox, its tree, the label: ~1 MiB): a large base and a small one
BASE_LAYERS_MB = (24, 1)


@pytest.fixture
def head(tmp_path, monkeypatch, tp4_cli):
    """A head with the image built by `tp4 build` from a busybox image flake (2 MiB of data on
    top of BASE_LAYERS_MB), pushed into its image store (stopped at the end)."""
    monkeypatch.setenv("NIX_CONFIG", image_nix_config(tmp_path / "nix"))
    monkeypatch.setenv("CONTAINERS_STORAGE_CONF", str(storage_conf(tmp_path / "head")))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    flake = image_flake(
        tmp_path / "flake", ref=REF, label=f"dist-{tmp_path.name}", size_mb=2, base_layers_mb=BASE_LAYERS_MB
    )
    try:
        code, out, err = tp4_cli("build", "--flake", flake, "--runtime", "podman")
        assert code == 0, err
        yield flake
    finally:
        imagestore.stop()


def worker_args(hosts, flake, workers=None, method="registry"):
    args = [
        "distribute",
        "--flake",
        flake,
        "--runtime",
        "podman",
        "--user",
        "root",
        "--identity",
        hosts.key,
        "--method",
        method,
    ]
    for opt in hosts[0].remote.options:
        args += ["--ssh-option", opt]
    for h in workers or hosts:
        args += ["--worker", h.address]
    return args


def node_id(host):
    found = runtime_cli.inspect("podman", REF, remote=host.remote)
    return found[0] if found else None


def reset(hosts):
    """No image at all on these hosts (a pulled image also keeps its `localhost:<port>/…@digest` name)."""
    for h in hosts:
        h.run("podman", "rmi", "-a", "-f", check=False)


@pytest.mark.parametrize("method", ["registry", "archive"])
def test_copies_to_every_worker_then_skips(hosts, head, tp4_cli, method, monkeypatch, caplog):
    reset(hosts)
    head_id = runtime_cli.inspect("podman", REF)[0]
    endpoints = []
    real_endpoint = imagestore.pull_endpoint

    @contextlib.contextmanager
    def recorded(store):
        with real_endpoint(store) as endpoint:
            endpoints.append(endpoint)
            yield endpoint

    monkeypatch.setattr(imagestore, "pull_endpoint", recorded)
    caplog.set_level("DEBUG", logger="tp4.core.process")

    code, out, err = tp4_cli(*worker_args(hosts, head, method=method))
    assert code == 0, err
    if method == "registry":
        # the workers pulled with a credential of this distribution only: in no argv (the funnel's
        # log), no output, no file left on a worker, and the endpoint is gone
        assert len(endpoints) == 1 and "localhost:" in caplog.text
        store = imagestore.running()
        shown = caplog.text + out + err
        assert not any(s in shown for s in (*endpoints[0].credential.secrets, *store.credential.secrets))
        assert all(h.run("sh", "-c", "ls -a /tmp ${TMPDIR:-/tmp}").stdout.count("tp4-pull.") == 0 for h in hosts)
        with socket.socket() as sock, pytest.raises(OSError):
            sock.connect(("127.0.0.1", endpoints[0].port))
    assert all(node_id(h) == head_id for h in hosts)
    assert out.count(": copied: ") == 3
    assert f"all 3 workers have {head_id[:12]}" in out
    assert all(runtime_cli.layers("podman", REF, remote=h.remote) == runtime_cli.layers("podman", REF) for h in hosts)

    code, out, err = tp4_cli(*worker_args(hosts, head, method=method))
    assert code == 0, err
    assert out.count("skipped") == 3 and "copying" not in out


def test_detects_a_worker_whose_image_differs_and_recopies_only_it(hosts, head, tp4_cli, tmp_path):
    reset(hosts)
    code, _, err = tp4_cli(*worker_args(hosts, head))
    assert code == 0, err
    head_id = runtime_cli.inspect("podman", REF)[0]

    # node2 gets another image under the same reference (a stale or tampered copy)
    other = image_flake(tmp_path / "other", ref=REF, label="other")
    code, _, err = tp4_cli("build", "--flake", other, "--runtime", "podman")
    assert code == 0, err
    other_id = runtime_cli.inspect("podman", REF)[0]
    assert other_id != head_id
    code, _, err = tp4_cli(*worker_args(hosts, other, workers=[hosts[1]]))
    assert code == 0, err
    assert node_id(hosts[1]) == other_id
    # the head goes back to the line's image
    code, _, err = tp4_cli("build", "--flake", head, "--runtime", "podman")
    assert code == 0, err

    code, out, err = tp4_cli(*worker_args(hosts, head), "--check")
    assert code == 1
    assert f"{hosts[1].address}: differs" in out and f"{hosts[1].address}: differs" in err
    assert f"{hosts[0].address}: present" in out and f"{hosts[2].address}: present" in out

    code, out, err = tp4_cli(*worker_args(hosts, head))
    assert code == 0, err
    assert f"{hosts[1].address}: differs" in out and out.count(": copied: ") == 1
    assert all(node_id(h) == head_id for h in hosts)


def test_unreachable_worker_fails_naming_it(hosts, head, tp4_cli):
    nobody = hosts.unreachable()
    code, out, err = tp4_cli(*worker_args(hosts, head), "--worker", nobody)
    assert code == 1
    assert f"{nobody}: failed" in err


def test_workers_come_from_the_profile(hosts, head, tp4_cli, tmp_path):
    reset(hosts)
    workers = ",\n".join(f'  {{ name = "{h.name}", ip = "{h.address}" }}' for h in hosts)
    profile = tmp_path / "profile.toml"
    profile.write_text(
        f'[cluster]\nuser = "root"\nidentity = "{hosts.key}"\n'
        f'head = {{ name = "head", ip = "{hosts.head_address}" }}\nworkers = [\n{workers}\n]\n'
    )
    args = ["distribute", "--flake", head, "--runtime", "podman", "--profile", profile]
    for opt in hosts[0].remote.options:
        args += ["--ssh-option", opt]
    code, out, err = tp4_cli(*args)
    assert code == 0, err
    assert out.count(": copied: ") == 3


def test_a_profile_without_workers_is_invalid_input(head, tp4_cli, tmp_path):
    profile = tmp_path / "profile.toml"
    profile.write_text('[cluster]\nhead = { name = "head", ip = "10.77.0.1" }\nworkers = []\n')
    code, _, err = tp4_cli("distribute", "--flake", head, "--runtime", "podman", "--profile", profile)
    assert code == 2 and "cluster.workers" in err


def _archive_loads_on(hosts) -> list[int]:
    """`podman load` processes run over ssh on these hosts (each host's sessions name its store)."""
    confs = {f"CONTAINERS_STORAGE_CONF={h.env['CONTAINERS_STORAGE_CONF']}".encode() for h in hosts}
    found = []
    for entry in os.listdir("/proc"):
        try:
            if not entry.isdigit() or open(f"/proc/{entry}/cmdline", "rb").read() != b"podman\0load\0":
                continue
            if confs & set(open(f"/proc/{entry}/environ", "rb").read().split(b"\0")):
                found.append(int(entry))
        except OSError:
            continue
    return found


def _unlimit(hosts) -> None:
    for i, host in enumerate(hosts):
        process.run(["tc", "qdisc", "del", "dev", f"{hosts.prefix}v{i}", "root"], check=False)
        process.run(
            ["ip", "netns", "exec", host.namespace, "tc", "qdisc", "del", "dev", f"{hosts.prefix}p{i}", "root"],
            check=False,
        )


@pytest.mark.parametrize("method", ["archive", "registry"])
def test_ctrl_c_during_the_copies_stops_them_on_every_worker(hosts, head, method):
    """SIGINT to `tp4 distribute` while slow copies run in its worker threads: exit 130 with
    `interrupted`, no traceback, no `podman load` (`podman pull`) left on a worker."""
    reset(hosts)
    slow = hosts[:2]

    def _loads_on(hosts):
        return _archive_loads_on(hosts) if method == "archive" else [p for h in hosts for p in _pulls_on(h)]

    hosts.rate_limit("1mbit")  # the ~28 MiB image would take minutes per worker
    try:
        tp4 = subprocess.Popen(
            [sys.executable, "-c", "from tp4.cli import main; main()", *worker_args(hosts, head, slow, method=method)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
            env={**os.environ, "PYTHONPATH": str(PYTHON)},
        )
        try:
            deadline = time.monotonic() + 60
            while len(_loads_on(slow)) < 2 and time.monotonic() < deadline and tp4.poll() is None:
                time.sleep(0.1)
            assert len(_loads_on(slow)) == 2, tp4.stderr.read() if tp4.poll() is not None else "no copies started"
            time.sleep(1)
            interrupted = time.monotonic()
            tp4.send_signal(signal.SIGINT)
            out, err = tp4.communicate(timeout=60)
            assert time.monotonic() - interrupted < 8, "tp4 waited for the copies instead of stopping them"
            deadline = time.monotonic() + 5
            while _loads_on(slow) and time.monotonic() < deadline:
                time.sleep(0.1)
            assert _loads_on(slow) == []
        finally:
            if tp4.poll() is None:
                tp4.kill()
            for pid in _loads_on(slow):
                os.kill(pid, signal.SIGKILL)
    finally:
        _unlimit(hosts)
    assert tp4.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err and "internal error" not in err
    assert ": copied: " not in out


# --- the registry method: what moves, and failures ------------------------------------------------


def store_and_digest(flake):
    store = imagestore.running()
    assert store is not None, "tp4 build did not start the image store"
    pushed = build.Pushed.load(build.store_record_path(flake, "image"))
    assert pushed is not None, "tp4 build recorded no manifest digest"
    assert pushed.id == runtime_cli.inspect("podman", REF)[0]
    assert pushed.digest in imagestore.manifests(store, imagestore.DEFAULT_REPO)
    return store, pushed.digest


def blob_sizes(store, digest):
    """(layer sizes base first, config size) of a manifest in the store."""
    manifest = imagestore.manifest(store, imagestore.DEFAULT_REPO, digest)
    return [layer["size"] for layer in manifest["layers"]], manifest["config"]["size"]


def uploads(store) -> int:
    """Blob uploads the store has started (one POST per blob pushed)."""
    return store.access_log.read_text().count(f'"POST /v2/{imagestore.DEFAULT_REPO}/blobs/uploads/ ')


def assert_like_the_head(hosts):
    head_id, head_layers = runtime_cli.inspect("podman", REF)[0], runtime_cli.layers("podman", REF)
    for h in hosts:
        assert node_id(h) == head_id, h.name
        assert runtime_cli.layers("podman", REF, remote=h.remote) == head_layers, h.name


def test_by_digest_a_one_layer_change_moves_only_that_layer_and_no_change_moves_nothing(hosts, head, tp4_cli, tmp_path):
    reset(hosts)
    store, digest = store_and_digest(head)
    sizes, config = blob_sizes(store, digest)
    # the base's layers, one per tree (tools, runtime, data) and the links on top
    assert len(sizes) == len(BASE_LAYERS_MB) + 4 and sizes[0] > 20 * 2**20
    # bound to the head's loopback: not even the head's own bridge address reaches it
    with socket.socket() as sock, pytest.raises(ConnectionRefusedError):
        sock.connect((hosts.head_address, store.port))

    # first distribution: every blob once per worker, in parallel
    served = imagestore.served_bytes(store)
    code, out, err = tp4_cli(*worker_args(hosts, head))
    assert code == 0, err
    assert out.count(": copied: pulled ") == 3 and f"{len(sizes)} of {len(sizes)} layers" in out
    assert_like_the_head(hosts)
    assert imagestore.served_bytes(store) - served == 3 * (sum(sizes) + config)

    # a rebuild that changes one tree (the data layer) only: the push uploads its layer, the
    # links layer on top (a few hundred bytes: one link moved) and the config; the workers
    # fetch those, not the base's layers nor the other trees
    before = runtime_cli.layers("podman", REF)
    posts = uploads(store)
    image_flake(head, ref=REF, label=f"changed-{tmp_path.name}", size_mb=2, base_layers_mb=BASE_LAYERS_MB)
    code, _, err = tp4_cli("build", "--flake", head, "--runtime", "podman")
    assert code == 0, err
    assert uploads(store) - posts == 3
    store, changed = store_and_digest(head)
    assert changed != digest
    after = runtime_cli.layers("podman", REF)
    assert after[:-2] == before[:-2] and after[-2] != before[-2] and after[-1] != before[-1]
    new_sizes, new_config = blob_sizes(store, changed)
    assert new_sizes[-1] < 2048 < 2 * 2**20 / 2 < new_sizes[-2]
    served = imagestore.served_bytes(store)
    code, out, err = tp4_cli(*worker_args(hosts, head))
    assert code == 0, err
    assert out.count(": copied: pulled ") == 3 and f"2 of {len(sizes)} layers" in out
    assert_like_the_head(hosts)
    moved = imagestore.served_bytes(store) - served
    assert moved <= 3 * 1.1 * new_sizes[-2], (moved, new_sizes)
    assert moved >= 3 * new_sizes[-2]

    # nothing changed: nothing moves, quickly
    served = imagestore.served_bytes(store)
    started = time.monotonic()
    code, out, err = tp4_cli(*worker_args(hosts, head))
    seconds = time.monotonic() - started
    assert code == 0, err
    assert out.count("skipped") == 3 and "pulling" not in out
    assert imagestore.served_bytes(store) == served
    assert seconds < 3, seconds


def _local_tunnels(host) -> list[int]:
    """The head's ssh processes that hold a reverse tunnel to this host."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            args = open(f"/proc/{entry}/cmdline", "rb").read().split(b"\0")
        except OSError:
            continue
        if (
            args
            and args[0] == b"ssh"
            and any(a.startswith(b"RemoteForward=") for a in args)
            and f"root@{host.address}".encode() in args
        ):
            found.append(int(entry))
    return found


def _pulls_on(host) -> list[int]:
    conf = f"CONTAINERS_STORAGE_CONF={host.env['CONTAINERS_STORAGE_CONF']}".encode()
    found = []
    for entry in os.listdir("/proc"):
        try:
            if (
                entry.isdigit()
                and open(f"/proc/{entry}/cmdline", "rb").read().startswith(b"podman\0pull\0")
                and conf in open(f"/proc/{entry}/environ", "rb").read().split(b"\0")
            ):
                found.append(int(entry))
        except OSError:
            continue
    return found


def test_a_pull_broken_mid_way_is_reported_and_the_next_run_completes_it(hosts, head, tp4_cli):
    reset(hosts)
    store, _ = store_and_digest(head)
    broken, fine = hosts[0], hosts[1]
    hosts.rate_limit("16mbit")  # ~30 MiB: ~15 s per worker
    try:
        tp4 = subprocess.Popen(
            [sys.executable, "-c", "from tp4.cli import main; main()", *worker_args(hosts, head, [broken, fine])],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
            env={**os.environ, "PYTHONPATH": str(PYTHON)},
        )
        try:
            deadline = time.monotonic() + 60
            while not _pulls_on(broken) and time.monotonic() < deadline and tp4.poll() is None:
                time.sleep(0.1)
            assert _pulls_on(broken), tp4.stderr.read() if tp4.poll() is not None else "no pull started"
            time.sleep(2)
            served = imagestore.served_bytes(store)
            tunnels = _local_tunnels(broken)
            assert len(tunnels) == 1
            os.kill(tunnels[0], signal.SIGKILL)  # the tunnel (and the ssh running the pull) dies
            _unlimit(hosts)
            out, err = tp4.communicate(timeout=120)
        finally:
            if tp4.poll() is None:
                tp4.kill()
    finally:
        _unlimit(hosts)
    assert tp4.returncode == 1, err
    assert f"{broken.address}: failed" in err and f"{fine.address}: copied" in out
    assert f"the ssh connection to root@{broken.address} (and so its tunnel) ended" in err
    assert "Traceback" not in err
    assert node_id(broken) is None
    assert node_id(fine) == runtime_cli.inspect("podman", REF)[0]
    assert served < 2 * 30 * 2**20  # the broken pull had not finished

    code, out, err = tp4_cli(*worker_args(hosts, head, [broken, fine]))
    assert code == 0, err
    assert f"{broken.address}: copied" in out and f"{fine.address}: has" in out
    assert_like_the_head([broken, fine])


def test_a_corrupted_blob_is_refused_by_digest(hosts, head, tp4_cli):
    reset(hosts)
    store, digest = store_and_digest(head)
    manifest = imagestore.manifest(store, imagestore.DEFAULT_REPO, digest)
    top = manifest["layers"][-1]["digest"]
    path = imagestore.blob_path(store, top)
    data = bytearray(path.read_bytes())
    original = bytes(data)
    middle = len(data) // 2
    data[middle : middle + 16] = bytes(b ^ 0xFF for b in data[middle : middle + 16])
    path.write_bytes(bytes(data))
    try:
        code, out, err = tp4_cli(*worker_args(hosts, head, [hosts[2]]))
    finally:
        path.write_bytes(original)
    assert code == 1
    assert f"{hosts[2].address}: failed" in err
    assert f"refused the blob {top[:19]}: its bytes do not match its digest" in err
    assert f"fix: remove {imagestore.blob_path(store, top)}" in err
    assert node_id(hosts[2]) is None

    code, out, err = tp4_cli(*worker_args(hosts, head, [hosts[2]]))
    assert code == 0, err
    assert_like_the_head([hosts[2]])


def test_a_build_the_store_could_not_take_is_pushed_by_distribute(hosts, head, tp4_cli, tmp_path, monkeypatch):
    reset(hosts[:1])
    record = build.store_record_path(head, "image")
    blocked = tmp_path / "not-a-dir"
    blocked.write_text("")
    monkeypatch.setenv("XDG_STATE_HOME", str(blocked))  # no image store can start there
    image_flake(head, ref=REF, label=f"unpushed-{tmp_path.name}", size_mb=2, base_layers_mb=BASE_LAYERS_MB)
    code, out, err = tp4_cli("build", "--flake", head, "--runtime", "podman")
    assert code == 0, err
    assert "warning: the image is not in the head's image store" in err and "--method archive" in err
    assert "digest" not in out and not record.exists()

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    code, out, err = tp4_cli(*worker_args(hosts, head, hosts[:1]))
    assert code == 0, err
    head_id = runtime_cli.inspect("podman", REF)[0]
    assert f"pushing {head_id[:12]} to the image store" in out
    assert_like_the_head(hosts[:1])
