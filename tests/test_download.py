"""`tp4 download` against a local stand-in of the Hub: the subset of its API huggingface_hub uses
for this (model info with files metadata; HEAD and GET of the resolve endpoint with ETag,
X-Repo-Commit, X-Linked-Etag, X-Linked-Size, Content-Length and Range), on 127.0.0.1, with
HF_ENDPOINT pointed at it. tp4 runs as a subprocess (huggingface_hub reads HF_ENDPOINT when it is
imported), through a probe that counts the hash calls."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

pytestmark = pytest.mark.unit

REPO_ID = "acme/Tiny-Flash"
REV = "0123456789abcdef0123456789abcdef01234567"
CHUNK = 10 * 1024 * 1024  # huggingface_hub's DOWNLOAD_CHUNK_SIZE: what it writes at a time

PROBE = """
import atexit, sys
import tp4.hosts.checkpoint as d
calls = []
real = d.hash_file
def counted(path, algo, size):
    calls.append(str(path))
    return real(path, algo, size)
d.hash_file = counted
atexit.register(lambda: print("HASHED " + repr(calls), file=sys.stderr))
from tp4.cli import main
sys.argv[0] = "tp4"
sys.exit(main())
"""


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class Hub:
    """What the stand-in serves: files (bytes served) and the hashes it advertises."""

    files: dict[str, bytes]
    advertised: dict[str, bytes] = field(default_factory=dict)  # name -> bytes whose hash the metadata gives
    requests: list[tuple[str, str, str | None]] = field(default_factory=list)  # method, path, Range
    served: dict[str, int] = field(default_factory=dict)  # body bytes sent per file
    drop_at: dict[str, int] = field(default_factory=dict)  # close the connection after N bytes, once
    stall_at: dict[str, int] = field(default_factory=dict)  # stop sending after N bytes (until released), once
    stalled: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)
    url: str = ""

    def is_lfs(self, name: str) -> bool:
        return name.endswith(".safetensors")

    def etag(self, name: str) -> str:
        data = self.advertised.get(name, self.files[name])
        return hashlib.sha256(data).hexdigest() if self.is_lfs(name) else git_blob_sha1(data)

    def siblings(self) -> list[dict[str, object]]:
        out: list[dict[str, object]] = []
        for name, served in self.files.items():
            data = self.advertised.get(name, served)
            s: dict[str, object] = {"rfilename": name, "size": len(data), "blobId": git_blob_sha1(data)}
            if self.is_lfs(name):
                s["size"] = len(data)
                s["blobId"] = hashlib.sha1(b"pointer " + name.encode()).hexdigest()
                s["lfs"] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest(), "pointerSize": 134}
            out.append(s)
        return out


def make_handler(hub: Hub) -> type[BaseHTTPRequestHandler]:
    info_path = f"/api/models/{REPO_ID}/revision/{REV}"
    resolve = f"/{REPO_ID}/resolve/{REV}/"

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            pass

        def _file(self) -> str | None:
            path = urlsplit(self.path).path
            if path.startswith(resolve):
                name = unquote(path[len(resolve) :])
                return name if name in hub.files else None
            return None

        def _headers(self, name: str, length: int, status: int, extra: dict[str, str]) -> None:
            self.send_response(status)
            etag = hub.etag(name)
            self.send_header("X-Repo-Commit", REV)
            self.send_header("Accept-Ranges", "bytes")
            if hub.is_lfs(name):
                self.send_header("ETag", f'"{hashlib.sha1(name.encode()).hexdigest()}"')
                self.send_header("X-Linked-Etag", f'"{etag}"')
                self.send_header("X-Linked-Size", str(len(hub.files[name])))
            else:
                self.send_header("ETag", f'"{etag}"')
            self.send_header("Content-Length", str(length))
            for k, v in extra.items():
                self.send_header(k, v)
            self.end_headers()

        def do_HEAD(self) -> None:  # noqa: N802
            hub.requests.append(("HEAD", self.path, self.headers.get("Range")))
            name = self._file()
            if name is None:
                self.send_error(404)
                return
            self._headers(name, len(hub.files[name]), 200, {})

        def do_GET(self) -> None:  # noqa: N802
            hub.requests.append(("GET", self.path, self.headers.get("Range")))
            if urlsplit(self.path).path == info_path:
                body = json.dumps(
                    {"id": REPO_ID, "modelId": REPO_ID, "sha": REV, "private": False, "siblings": hub.siblings()}
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            name = self._file()
            if name is None:
                self.send_error(404)
                return
            data = hub.files[name]
            start = 0
            rng = self.headers.get("Range")
            if rng:
                assert rng.startswith("bytes=") and rng.endswith("-"), rng
                start = int(rng[len("bytes=") : -1])
                self._headers(
                    name, len(data) - start, 206, {"Content-Range": f"bytes {start}-{len(data) - 1}/{len(data)}"}
                )
            else:
                self._headers(name, len(data), 200, {})
            body = data[start:]
            cut = hub.drop_at.pop(name, None)
            stall = hub.stall_at.pop(name, None)
            if cut is not None:
                self.wfile.write(body[:cut])
                hub.served[name] = hub.served.get(name, 0) + cut
                self.wfile.flush()
                self.close_connection = True
                self.connection.shutdown(2)
                return
            if stall is not None:
                self.wfile.write(body[:stall])
                self.wfile.flush()
                hub.served[name] = hub.served.get(name, 0) + stall
                hub.stalled.set()
                hub.release.wait(60)
                self.close_connection = True
                return
            self.wfile.write(body)
            hub.served[name] = hub.served.get(name, 0) + len(body)

    return Handler


@pytest.fixture
def hub():
    shards = {f"model-0000{i}-of-00003.safetensors": os.urandom(1024 * 64 * i) for i in (1, 2, 3)}
    files = {"config.json": b'{"model_type": "tiny"}\n', "tokenizer.json": b'{"v": 1}\n', **shards}
    h = Hub(files)
    server = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(h))
    server.daemon_threads = True
    h.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield h
    h.release.set()
    server.shutdown()
    server.server_close()


@pytest.fixture
def setup(tmp_path, hub):
    model = tmp_path / "models" / "Tiny"
    link = tmp_path / "common"
    profile = tmp_path / "profile.toml"
    profile.write_text(
        f'[engine]\ntp = 1\n[model]\ndir = "{model}"\ncommon_link = "{link}"\nhf_repo = "{REPO_ID}"\n'
        f'hf_revision = "{REV}"\nexpected_shards = 3\n'
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(
        HF_ENDPOINT=hub.url,
        HF_HOME=str(tmp_path / "hf-home"),
        PYTHONPATH=str(Path(__file__).resolve().parent.parent / "python"),
        NO_PROXY="127.0.0.1",
        no_proxy="127.0.0.1",
    )
    return model, link, profile, env


def tp4(profile: Path, env: dict[str, str], *extra: str) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, "download", "--profile", str(profile), *extra],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    hashed: list[str] = []
    for line in proc.stderr.splitlines():
        if line.startswith("HASHED "):
            hashed = eval(line[len("HASHED ") :])  # noqa: S307 (the probe's own repr of a list of str)
    return proc, hashed


def file_gets(hub: Hub) -> list[tuple[str, str | None]]:
    return [(unquote(p.rsplit("/", 1)[1]), r) for m, p, r in hub.requests if m == "GET" and "/resolve/" in p]


def test_fresh_download_then_a_second_run_skips_without_hashing_or_asking(hub, setup):
    model, link, profile, env = setup
    proc, hashed = tp4(profile, env)
    assert proc.returncode == 0, proc.stderr
    for name, data in hub.files.items():
        assert (model / name).read_bytes() == data
    assert os.readlink(link) == str(model)
    assert sorted(n for n, _ in file_gets(hub)) == sorted(hub.files)
    assert len(hashed) == len(hub.files)  # each file hashed once, after its download
    cache = json.loads((model / ".tp4-verified.json").read_text())
    assert cache["revision"] == REV and sorted(cache["complete"]) == sorted(hub.files)
    assert not (model / ".tp4-download").exists()
    assert "5 files fetched and verified" in proc.stderr

    hub.requests.clear()
    proc, hashed = tp4(profile, env)
    assert proc.returncode == 0, proc.stderr
    assert hub.requests == [] and hashed == []
    assert "nothing to fetch" in proc.stderr


def test_changed_file_is_hashed_again_and_refetched(hub, setup):
    model, link, profile, env = setup
    assert tp4(profile, env)[0].returncode == 0
    shard = model / "model-00002-of-00003.safetensors"
    data = bytearray(shard.read_bytes())
    data[100] ^= 0xFF
    shard.write_bytes(bytes(data))  # same size, new mtime: the cache no longer vouches for it
    hub.requests.clear()
    proc, hashed = tp4(profile, env)
    assert proc.returncode == 0, proc.stderr
    assert "model-00002-of-00003.safetensors does not match the Hub's sha256" in proc.stderr
    assert [n for n, _ in file_gets(hub)] == [shard.name]
    assert hashed == [str(shard), str(model / ".tp4-download" / (shard.name + ".partial"))]
    assert shard.read_bytes() == hub.files[shard.name]


def test_corrupt_file_on_the_server_is_refused_by_hash_and_named(hub, setup):
    model, link, profile, env = setup
    name = "model-00003-of-00003.safetensors"
    hub.advertised[name] = hub.files[name]
    bad = bytearray(hub.files[name])
    bad[-1] ^= 0x01
    hub.files[name] = bytes(bad)
    proc, _ = tp4(profile, env)
    assert proc.returncode == 1, proc.stderr
    assert f"{name} does not match the Hub's sha256" in proc.stderr
    assert "fix: rerun `tp4 download`" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (model / name).exists() and not (model / ".tp4-download" / (name + ".partial")).exists()
    assert not link.exists()  # an incomplete checkpoint is not linked
    cache = json.loads((model / ".tp4-verified.json").read_text())
    assert cache["complete"] == [] and name not in cache["files"] and len(cache["files"]) == 4

    hub.files[name] = hub.advertised.pop(name)  # the endpoint fixed: only that file is fetched
    hub.requests.clear()
    proc, hashed = tp4(profile, env)
    assert proc.returncode == 0, proc.stderr
    assert [n for n, _ in file_gets(hub)] == [name] and len(hashed) == 1


def test_dropped_connection_is_resumed_with_a_range_request(hub, setup):
    model, link, profile, env = setup
    name = "model-00003-of-00003.safetensors"
    hub.files[name] = os.urandom(CHUNK + CHUNK // 2)
    hub.drop_at[name] = CHUNK + 4096  # one whole chunk reaches the file before the drop
    proc, _ = tp4(profile, env)
    assert proc.returncode == 0, proc.stderr
    gets = [r for n, r in file_gets(hub) if n == name]
    assert gets == [None, f"bytes={CHUNK}-"]
    assert (model / name).read_bytes() == hub.files[name]


def test_interrupted_download_resumes_where_it_stopped(hub, setup, tmp_path):
    model, link, profile, env = setup
    name = "model-00003-of-00003.safetensors"
    hub.files[name] = os.urandom(CHUNK + CHUNK // 2)
    hub.stall_at[name] = CHUNK + 4096  # one whole chunk reaches the disk, then the server goes quiet
    proc = subprocess.Popen(
        [sys.executable, "-c", PROBE, "download", "--profile", str(profile)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert hub.stalled.wait(60)
    part = model / ".tp4-download" / (name + ".partial")
    deadline = time.monotonic() + 30
    while (not part.exists() or part.stat().st_size < CHUNK) and time.monotonic() < deadline:
        time.sleep(0.05)
    have = part.stat().st_size
    assert have >= CHUNK
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err
    hub.release.set()
    assert not (model / name).exists()

    hub.requests.clear()
    served_before = hub.served.get(name, 0)
    proc2, _ = tp4(profile, env)
    assert proc2.returncode == 0, proc2.stderr
    assert [(n, r) for n, r in file_gets(hub) if n == name] == [(name, f"bytes={have}-")]
    assert hub.served[name] - served_before == len(hub.files[name]) - have
    assert (model / name).read_bytes() == hub.files[name]


def test_model_dir_that_is_a_file_is_refused(hub, setup):
    model, link, profile, env = setup
    model.parent.mkdir(parents=True)
    model.write_text("not a dir")
    proc, _ = tp4(profile, env)
    assert proc.returncode == 2, proc.stderr
    assert f"model.dir: {model} is a file, not a directory; fix:" in proc.stderr
    assert hub.requests == [] and "Traceback" not in proc.stderr
    assert model.read_text() == "not a dir"


FS_IOC_GETFLAGS, FS_IOC_SETFLAGS, FS_IMMUTABLE_FL = 0x80086601, 0x40086602, 0x10


def _immutable(path: Path, on: bool) -> bool:
    """chattr +i / -i (root writes into any mode-0555 directory, not into an immutable one)."""
    import array
    import fcntl

    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        flags = array.array("l", [0])
        fcntl.ioctl(fd, FS_IOC_GETFLAGS, flags, True)
        flags[0] = flags[0] | FS_IMMUTABLE_FL if on else flags[0] & ~FS_IMMUTABLE_FL
        fcntl.ioctl(fd, FS_IOC_SETFLAGS, flags, True)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def test_read_only_model_dir_is_refused(hub, setup):
    model, link, profile, env = setup
    argv = [sys.executable, "-c", PROBE, "download", "--profile", str(profile)]
    model.mkdir(parents=True)
    model.chmod(0o555)
    as_nobody: dict[str, object] = {}
    # root writes anywhere: make the directory immutable, or (a filesystem without the flag) run
    # as nobody, whose interpreter is then in the Nix store
    locked = os.getuid() == 0 and _immutable(model, True)
    if os.getuid() == 0 and not locked:
        os.chmod(model.parent, 0o755)
        as_nobody = {"user": 65534, "group": 65534, "extra_groups": []}
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120, **as_nobody)
        assert proc.returncode == 2, proc.stderr
        assert f"model.dir: cannot write into {model}" in proc.stderr and "fix:" in proc.stderr
        assert "Traceback" not in proc.stderr
        assert os.listdir(model) == []
    finally:
        if locked:
            _immutable(model, False)


def test_fifo_as_a_shard_is_refused_without_opening_it(hub, setup):
    model, link, profile, env = setup
    model.mkdir(parents=True)
    fifo = model / "model-00002-of-00003.safetensors"
    os.mkfifo(fifo)
    proc, hashed = tp4(profile, env)
    assert proc.returncode == 2, proc.stderr
    assert f"model.dir: {fifo} is a FIFO" in proc.stderr and f"fix: remove it (rm {fifo})" in proc.stderr
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and hashed == []


def test_fewer_shards_than_the_profile_expects_is_bad_input(hub, setup):
    model, link, profile, env = setup
    profile.write_text(profile.read_text().replace("expected_shards = 3", "expected_shards = 48"))
    proc, _ = tp4(profile, env)
    assert proc.returncode == 2, proc.stderr
    assert (
        "model.expected_shards:" in proc.stderr
        and "3 model-*-of-*.safetensors shards, the profile expects 48" in proc.stderr
    )
    assert file_gets(hub) == []


def test_unreachable_endpoint_fails_plainly(setup):
    model, link, profile, env = setup
    env = dict(env, HF_ENDPOINT="http://127.0.0.1:9")
    proc, _ = tp4(profile, env)
    assert proc.returncode == 1, proc.stderr
    assert "error: download: the Hub at http://127.0.0.1:9 failed" in proc.stderr and "fix:" in proc.stderr
    assert "Traceback" not in proc.stderr
