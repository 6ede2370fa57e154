"""The head's image store: a real OCI registry (the Distribution registry 2.8, Debian's
``docker-registry``) run by tp4, from which the workers pull the line's image by digest.

* State lives under :func:`default_root` (``$XDG_STATE_HOME/tp4/registry``): ``config.yml``
  (written by tp4), ``data/`` (the blob and manifest storage), ``access.log`` (the registry's
  output: access lines and its own log) and ``pid`` (``<pid> <port>`` of the running registry).
* It listens on 127.0.0.1 only, without TLS or auth: nothing on the fabric can reach it. A worker
  reaches it through the ssh connection tp4 opens to it anyway, with a reverse tunnel for the
  length of one pull (:mod:`tp4.image.distribute`).
* :func:`push` copies an image from the head's runtime into it; a blob the registry already has
  is not uploaded again (skopeo asks the registry first; `docker push` does the same).
* Manifest deletion is on (``storage.delete.enabled``), so old builds can be deleted and their
  blobs garbage-collected (:func:`delete`, :func:`garbage_collect`).

Every command goes through :mod:`tp4.core.process`; the registry's own HTTP API is asked with urllib
on 127.0.0.1 (no proxy).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import signal
import socket
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from tp4.core import dirs, process
from tp4.core.errors import InvalidInput, Tp4Error, clip

REGISTRY = "docker-registry"
DEFAULT_REPO = "dsv41-4x-spark"
START_TIMEOUT = 15.0
# a start moves a larger access log aside to access.log.1 (served_bytes reads the current one)
ACCESS_LOG_MAX = 64 * 2**20
# an access line of a blob served: "GET /v2/<repo>/blobs/sha256:<hex> HTTP/1.1" 200 <bytes>
_BLOB_GET = re.compile(r'"GET /v2/\S+/blobs/sha256:[0-9a-f]{64} HTTP/[0-9.]+" (?:200|206) (\d+)')
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


@dataclass(frozen=True)
class Store:
    """A running registry: its state directory and its port on 127.0.0.1."""

    root: Path
    port: int

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def config(self) -> Path:
        return self.root / "config.yml"

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def access_log(self) -> Path:
        return self.root / "access.log"


def default_root() -> Path:
    return dirs.state_dir() / "registry"


def _pidfile(root: Path) -> Path:
    return root / "pid"


def yaml_path(path: Path) -> str:
    """path as a YAML double-quoted scalar (JSON's string form, which YAML reads the same), so a
    '#', ': ' or a quote in $XDG_STATE_HOME is part of the path. A character YAML cannot carry
    literally or folds (a control character, a line or paragraph separator, an undecodable byte)
    is refused: the registry would store its data somewhere else."""
    text = str(path)
    bad = next((c for c in text if not c.isprintable()), None)
    if bad is not None:
        raise InvalidInput(
            f"image store directory {clip(text)} holds the character {bad!r}, which its config.yml cannot carry; "
            "fix: set XDG_STATE_HOME to a path of printable characters (or unset it for ~/.local/state)"
        )
    return json.dumps(text, ensure_ascii=False)


def config_text(root: Path, port: int) -> str:
    """The registry's config.yml: filesystem storage under ``root/data``, deletes allowed, HTTP
    on 127.0.0.1:<port> only, access log on (to its output, which goes to access.log)."""
    return (
        "# written by tp4 (python/tp4/image/imagestore.py); tp4 rewrites it on each start\n"
        "version: 0.1\n"
        "log:\n"
        "  level: warn\n"
        "  formatter: text\n"
        "  accesslog:\n"
        "    disabled: false\n"
        "storage:\n"
        "  filesystem:\n"
        f"    rootdirectory: {yaml_path(root / 'data')}\n"
        "  delete:\n"
        "    enabled: true\n"
        "  maintenance:\n"
        "    uploadpurging:\n"
        "      enabled: false\n"
        "http:\n"
        f"  addr: 127.0.0.1:{port}\n"
        "  headers:\n"
        "    X-Content-Type-Options: [nosniff]\n"
    )


def _configured_port(root: Path) -> int | None:
    try:
        found = re.search(r"^\s*addr:\s*127\.0\.0\.1:(\d+)\s*$", (root / "config.yml").read_text(), re.M)
    except OSError:
        return None
    return int(found.group(1)) if found else None


def port_in_waiting(root: Path | None = None) -> int | None:
    """The port the image store will start on (its last start's) while it is not running; None
    when it runs (the port is its own) or has never started (it takes a free one)."""
    root = root or default_root()
    if running(root) is not None:
        return None
    return _configured_port(root)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


_opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # 127.0.0.1: never a proxy


def _request(
    store: Store, method: str, path: str, *, headers: dict[str, str] | None = None, timeout: float = 10.0
) -> tuple[int, bytes]:
    req = urllib.request.Request(f"http://{store.url}{path}", method=method, headers=headers or {})
    try:
        with _opener.open(req, timeout=timeout) as resp:
            status: int = resp.status
            return status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _answers(store: Store) -> bool:
    try:
        return _request(store, "GET", "/v2/", timeout=2.0)[0] == 200
    except OSError:
        return False


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (our own child that exited) is not alive
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return True


def _read_pid(root: Path) -> tuple[int, int] | None:
    try:
        pid, port = _pidfile(root).read_text().split()
        return int(pid), int(port)
    except (OSError, ValueError):
        return None


def running(root: Path | None = None) -> Store | None:
    """The registry tp4 started under ``root``, when its process lives and /v2/ answers."""
    root = root or default_root()
    found = _read_pid(root)
    if found is None or not _alive(found[0]):
        return None
    store = Store(root, found[1])
    return store if _answers(store) else None


def start(root: Path | None = None, port: int | None = None) -> Store:
    """Start the registry under ``root`` on 127.0.0.1:``port`` (default: the port of its last
    start, else a free one) and wait until it answers; a running one is reused."""
    root = (root or default_root()).absolute()
    yaml_path(root / "data")  # a path config.yml cannot carry is refused before anything is made
    try:
        root.mkdir(parents=True, exist_ok=True)
        lock = open(root / "lock", "a")
    except OSError as exc:
        raise Tp4Error(
            f"the image store's directory {root}: {exc.strerror or exc}; fix: make it writable, "
            "or set XDG_STATE_HOME to a writable directory"
        ) from None
    with lock:
        # two tp4 commands starting the store at once: the second waits, then finds it running
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _start_locked(root, port)


def _start_locked(root: Path, port: int | None) -> Store:
    current = running(root)
    if current is not None:
        if port is not None and port != current.port:
            raise Tp4Error(
                f"the image store under {root} already runs on port {current.port}, not {port}: "
                "stop it first (`tp4 image-store stop`), or leave the port out"
            )
        return current
    port = port or _configured_port(root) or _free_port()
    store = Store(root, port)
    try:
        (root / "data").mkdir(parents=True, exist_ok=True)
        tmp = store.config.with_name("config.yml.tmp")
        tmp.write_text(config_text(root, port))
        tmp.replace(store.config)
        # the access log grows with every pull: a start keeps one older generation
        if store.access_log.exists() and store.access_log.stat().st_size > ACCESS_LOG_MAX:
            store.access_log.replace(store.access_log.with_name("access.log.1"))
        log = open(store.access_log, "ab")
    except OSError as exc:
        raise Tp4Error(
            f"the image store's directory {root}: {exc.strerror or exc}; fix: make it writable, "
            "or set XDG_STATE_HOME to a writable directory"
        ) from None
    with log:
        # detached: the store outlives the command that started it, Ctrl-C of that command included
        child = process.start([REGISTRY, "serve", str(store.config)], stdout=log, stderr=process.STDOUT, detached=True)
    _pidfile(root).write_text(f"{child.pid} {port}\n")
    deadline = time.monotonic() + START_TIMEOUT
    while not _answers(store):
        if child.poll() is not None or time.monotonic() > deadline:
            process.stop(child)
            _pidfile(root).unlink(missing_ok=True)
            tail = "\n".join(store.access_log.read_text(errors="replace").strip().splitlines()[-10:])
            raise Tp4Error(
                f"the image store ({REGISTRY} serve {store.config}) did not answer on {store.url}"
                f"{' (it exited)' if child.poll() is not None else ''}:\n{tail}\n"
                "fix: is the port taken? pass another one (`tp4 image-store start --port N`)"
            )
        time.sleep(0.05)
    return store


def stop(root: Path | None = None) -> bool:
    """Stop the registry running under ``root``; False when none was running."""
    root = root or default_root()
    found = _read_pid(root)
    _pidfile(root).unlink(missing_ok=True)
    if found is None or not _alive(found[0]):
        return False
    pid = found[0]
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + process.GRACE * 2
    while _alive(pid) and time.monotonic() < deadline:
        _reap(pid)
        time.sleep(0.05)
    if _alive(pid):
        os.kill(pid, signal.SIGKILL)
    _reap(pid)
    return True


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def push(runtime: str, ref: str, store: Store, repo: str = DEFAULT_REPO, *, tag: str | None = None) -> str:
    """Copy the image ``ref`` (a name or an image id) of the head's runtime into the registry as
    ``<repo>:<tag>`` (default tag: the image id); returns its manifest digest ``sha256:<hex>``.
    Blobs the registry has are not uploaded again.

    podman: ``skopeo copy containers-storage:<ref> docker://127.0.0.1:<port>/<repo>:<tag>``;
    docker: ``docker tag`` + ``docker push`` (docker allows a loopback registry without TLS)."""
    from tp4.image import runtime_cli

    found = runtime_cli.inspect(runtime, ref)
    if found is None:
        raise Tp4Error(f"the head's {runtime} has no image {ref}: run `tp4 build` first")
    image_id = found[0]
    tag = tag or image_id
    dest = f"{store.url}/{repo}:{tag}"
    if runtime == "docker":
        process.run(["docker", "tag", image_id, dest])
        try:
            out = process.run(["docker", "push", dest]).stdout
        finally:
            process.run(["docker", "rmi", dest], check=False)
        digests = re.findall(r"digest: (sha256:[0-9a-f]{64})", out)
        if not digests:
            raise Tp4Error(f"`docker push {dest}` printed no digest:\n{out.strip()}")
        return str(digests[-1])
    return _skopeo_copy(f"containers-storage:{image_id}", dest)


def _skopeo_copy(source: str, dest: str, *, echo: process.Echo | None = None) -> str:
    """``skopeo copy`` into the store as ``dest`` (``127.0.0.1:<port>/<repo>:<tag>``); returns the
    manifest digest it wrote. Blobs the store has are not uploaded (nor read from the source)."""
    with tempfile.TemporaryDirectory(prefix="tp4-push-") as tmp:
        digestfile = Path(tmp) / "digest"
        # the store listens on 127.0.0.1 without TLS (never on the fabric): hence --dest-tls-verify=false
        process.run(
            [
                "skopeo",
                "copy",
                "--quiet",
                "--dest-tls-verify=false",
                "--digestfile",
                str(digestfile),
                source,
                f"docker://{dest}",
            ],
            echo=echo,
        )
        digest = digestfile.read_text().strip()
    if not _DIGEST.fullmatch(digest):
        raise Tp4Error(f"skopeo wrote no manifest digest for {dest} (got {digest!r})")
    return digest


def load_layout_into_docker(
    layout: str, store: Store, repo: str = DEFAULT_REPO, *, echo: process.Echo | None = None
) -> str:
    """Load an OCI layout (pkgs/oci.nix) into the head's docker without re-reading the layers it
    has: skopeo pushes the layout into the store (the store's blobs are skipped, unread), docker
    pulls it back by digest (docker's layers are skipped), and it is tagged with the layout's
    own reference, which is returned. docker's daemon API (`docker load`, skopeo's docker-daemon:)
    takes only a whole archive, so this is the route that moves only what changed."""
    from tp4.image import runtime_cli

    ref = runtime_cli.layout_ref(layout)
    digest = _skopeo_copy(runtime_cli.oci_source(layout, ref), f"{store.url}/{repo}:{ref.rsplit(':', 1)[1]}", echo=echo)
    pulled = f"{store.url}/{repo}@{digest}"
    # docker allows a registry on 127.0.0.0/8 without TLS
    process.run(["docker", "pull", "--quiet", pulled], echo=echo)
    process.run(["docker", "tag", pulled, ref])
    process.run(["docker", "rmi", pulled], check=False)
    return ref


def has_manifest(store: Store, repo: str, digest: str) -> bool:
    accept = ", ".join(MANIFEST_TYPES)
    return _request(store, "HEAD", f"/v2/{repo}/manifests/{digest}", headers={"Accept": accept})[0] == 200


MANIFEST_TYPES = (
    "application/vnd.docker.distribution.manifest.v2+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.oci.image.index.v1+json",
)


def manifest(store: Store, repo: str, digest: str) -> dict[str, object] | None:
    """The manifest ``repo@digest`` as JSON, or None when the store has none."""
    import json

    status, body = _request(
        store, "GET", f"/v2/{repo}/manifests/{digest}", headers={"Accept": ", ".join(MANIFEST_TYPES)}
    )
    if status != 200:
        return None
    data = json.loads(body)
    return data if isinstance(data, dict) else None


def served_bytes(store: Store) -> int:
    """Bytes of blobs the registry served so far (its access lines of blob GETs)."""
    try:
        text = store.access_log.read_text(errors="replace")
    except FileNotFoundError:
        return 0
    return sum(int(n) for n in _BLOB_GET.findall(text))


def delete(store: Store, repo: str, digest: str) -> None:
    """Delete a manifest (its blobs go at the next :func:`garbage_collect`)."""
    status, body = _request(store, "DELETE", f"/v2/{repo}/manifests/{digest}")
    if status not in (202, 404):
        raise Tp4Error(
            f"the image store refused to delete {repo}@{digest}: HTTP {status} {body.decode(errors='replace')[:200]}"
        )


def garbage_collect(store: Store, *, untagged: bool = False) -> None:
    """Remove the blobs no manifest references (``docker-registry garbage-collect``); with
    ``untagged`` also the manifests no tag names."""
    argv = [REGISTRY, "garbage-collect", str(store.config)]
    if untagged:
        argv.append("--delete-untagged")
    process.run(argv)


def manifests(store: Store, repo: str) -> list[str]:
    """Digests of the manifests stored for ``repo`` (read from the storage: the API lists tags only)."""
    revisions = (
        store.data / "docker" / "registry" / "v2" / "repositories" / repo / "_manifests" / "revisions" / "sha256"
    )
    try:
        names = sorted(os.listdir(revisions))
    except FileNotFoundError:
        return []
    return [f"sha256:{n}" for n in names if (revisions / n / "link").exists()]


def blob_path(store: Store, digest: str) -> Path:
    """Where the registry keeps a blob's bytes (for tests: corrupting one)."""
    hexa = digest.removeprefix("sha256:")
    return store.data / "docker" / "registry" / "v2" / "blobs" / "sha256" / hexa[:2] / hexa / "data"
