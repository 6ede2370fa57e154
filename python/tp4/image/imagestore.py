"""The head's image store: a real OCI registry (the Distribution registry 2.8, Debian's
``docker-registry``) run by tp4, from which the workers pull the line's image by digest.

* State lives under :func:`default_root` (``$XDG_STATE_HOME/tp4/registry``): ``config.yml``
  (written by tp4), ``data/`` (the blob and manifest storage), ``access.log`` (the registry's
  output: access lines and its own log) and ``pid`` (the running registry: its pid, start time,
  program and argv, and its port; :mod:`tp4.core.pidfile`). ``stop`` signals that process only
  while it is still that registry: a pid file naming anything else is refused.
* It listens on 127.0.0.1 only, without TLS: nothing on the fabric can reach it. A worker
  reaches it through the ssh connection tp4 opens to it anyway, with a reverse tunnel for the
  length of one pull (:mod:`tp4.image.distribute`).
* Every request needs a password (Distribution's htpasswd auth): the loopback is shared by every
  local process of the head, the rank containers (host networking) included. tp4's own push
  credential is ``credential`` (``tp4:<password>``, 0600) with its bcrypt hash in ``htpasswd``;
  made at the first start, kept across restarts. Commands get it in an auth file (0600, in a
  private temporary directory, removed after), never in argv.
* Workers pull with another credential, from a second, read-only registry over the same storage
  (:func:`pull_endpoint`: ``storage.maintenance.readonly``, its own one-time password) that runs
  only for the length of a distribution. Distribution's htpasswd auth has no per-user rights (any
  user it knows may push and delete): a read-only instance is how a pull-only credential exists.
* :func:`push` copies an image from the head's runtime into it; a blob the registry already has
  is not uploaded again (skopeo asks the registry first; `docker push` does the same).
* Manifest deletion is on (``storage.delete.enabled``) for tp4's credential, so old builds can be
  deleted and their blobs garbage-collected (:func:`delete`, :func:`garbage_collect`); the pull
  endpoint refuses pushes and deletes (HTTP 405).

Every command goes through :mod:`tp4.core.process`; the registry's own HTTP API is asked with urllib
on 127.0.0.1 (no proxy).
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import re
import secrets
import shutil
import socket
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from tp4.core import dirs, pidfile, process
from tp4.core.errors import InvalidInput, Tp4Error, clip

REGISTRY = "docker-registry"
REALM = "tp4-image-store"
PUSH_USER = "tp4"
PULL_USER = "tp4-pull"
CREDENTIAL = "credential"
HTPASSWD = "htpasswd"
DEFAULT_REPO = "dsv41-4x-spark"
WHAT = "image store (docker-registry)"
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

    @property
    def credential(self) -> Credential:
        """tp4's push credential (module doc)."""
        return read_credential(self.root)


@dataclass(frozen=True)
class Credential:
    """A user and password of the store. Never in argv: :meth:`auth_json` goes into an auth file
    (containers-auth.json(5); docker's config.json has the same ``auths``)."""

    user: str
    password: str = field(repr=False)

    @property
    def basic(self) -> str:
        return base64.b64encode(f"{self.user}:{self.password}".encode()).decode()

    @property
    def secrets(self) -> tuple[str, str]:
        """What must never be shown (process.run's ``secrets``)."""
        return self.password, self.basic

    def auth_json(self, *hosts: str) -> str:
        return json.dumps({"auths": {host: {"auth": self.basic} for host in hosts}})


# --- credentials --------------------------------------------------------------------------------


def _bcrypt(password: str) -> str:
    """A bcrypt hash of ``password`` (the only kind Distribution's htpasswd accepts): from the
    ``bcrypt`` package when installed, else from the C library's libcrypt (libxcrypt), which
    every Linux tp4 runs on has."""
    try:
        import bcrypt  # type: ignore[import-not-found,unused-ignore]

        hashed: bytes = bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=10))
        return hashed.decode()
    except ImportError:
        pass
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("crypt") or "libcrypt.so.1"
    try:
        lib = ctypes.CDLL(name)
        gensalt, crypt = lib.crypt_gensalt_rn, lib.crypt_rn
    except (OSError, AttributeError):
        raise Tp4Error(
            "the image store's password hash needs bcrypt: neither the Python package bcrypt nor libcrypt (libxcrypt) "
            "is here; fix: install one of them (Debian: libcrypt1; pip: bcrypt)"
        ) from None
    gensalt.restype = crypt.restype = ctypes.c_char_p
    gensalt.argtypes = [ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
    crypt.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_int]
    random = os.urandom(16)
    setting = ctypes.create_string_buffer(128)
    data = ctypes.create_string_buffer(32768)  # sizeof(struct crypt_data) of libxcrypt
    salt = gensalt(b"$2b$", 10, random, len(random), setting, len(setting))
    hashed_c = crypt(password.encode(), salt, data, len(data)) if salt else None
    if not hashed_c or not hashed_c.startswith(b"$2b$"):
        raise Tp4Error("libcrypt made no bcrypt hash for the image store's password; fix: pip install bcrypt")
    return str(hashed_c.decode())


def write_private(path: Path, text: str) -> None:
    """``text`` into ``path`` atomically, mode 0600, never through a symlink planted there."""
    tmp = path.with_name(f".{path.name}.{os.urandom(6).hex()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _new_password() -> str:
    return secrets.token_urlsafe(32)


def read_credential(root: Path) -> Credential:
    """tp4's push credential of the store under ``root``."""
    path = root / CREDENTIAL
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        with os.fdopen(fd) as fh:
            user, sep, password = fh.read(4096).strip().partition(":")
    except OSError as exc:
        raise Tp4Error(
            f"the image store's credential {path}: {exc.strerror or exc}; fix: `tp4 image-store start` makes it"
        ) from None
    if not sep or not user or not password:
        raise Tp4Error(
            f"the image store's credential {path} is not user:password; fix: remove it and restart the store"
        )
    return Credential(user, password)


def _ensure_credential(root: Path) -> Credential:
    """tp4's push credential, made (with its htpasswd) when there is none yet."""
    if (root / CREDENTIAL).exists() and (root / HTPASSWD).exists():
        return read_credential(root)
    cred = Credential(PUSH_USER, _new_password())
    write_private(root / HTPASSWD, f"{cred.user}:{_bcrypt(cred.password)}\n")
    write_private(root / CREDENTIAL, f"{cred.user}:{cred.password}\n")
    return cred


@contextmanager
def auth_dir(cred: Credential, *hosts: str) -> Iterator[Path]:
    """A private temporary directory with ``config.json`` (0600) giving ``cred`` for ``hosts``:
    skopeo and podman take it as ``--authfile``/``REGISTRY_AUTH_FILE``, docker as
    ``DOCKER_CONFIG``. Removed on exit."""
    with tempfile.TemporaryDirectory(prefix="tp4-auth-") as tmp:
        write_private(Path(tmp) / "config.json", cred.auth_json(*hosts))
        yield Path(tmp)


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
    on 127.0.0.1:<port> only, access log on (to its output, which goes to access.log), every
    request authenticated against ``root/htpasswd``."""
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
        "auth:\n"
        "  htpasswd:\n"
        f"    realm: {REALM}\n"
        f"    path: {yaml_path(root / HTPASSWD)}\n"
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
    store: Store,
    method: str,
    path: str,
    *,
    headers: dict[str, str] | None = None,
    timeout: float = 10.0,
    credential: Credential | None = None,
) -> tuple[int, bytes]:
    """One request to the store's API, with tp4's credential (``credential``: another one; a
    user "" sends none)."""
    cred = credential or store.credential
    auth = {"Authorization": f"Basic {cred.basic}"} if cred.user else {}
    req = urllib.request.Request(f"http://{store.url}{path}", method=method, headers={**auth, **(headers or {})})
    try:
        with _opener.open(req, timeout=timeout) as resp:
            status: int = resp.status
            return status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _answers(store: Store, credential: Credential | None = None) -> bool:
    try:
        return _request(store, "GET", "/v2/", timeout=2.0, credential=credential)[0] == 200
    except (OSError, Tp4Error):
        return False


def _expect(root: Path) -> pidfile.Expect:
    """The registry tp4 starts under ``root``: ``docker-registry serve <root>/config.yml``."""
    return pidfile.Expect(REGISTRY, ("serve", str(root.absolute() / "config.yml")))


def _record(root: Path) -> pidfile.Record | None:
    """The pid file's record of the registry when that registry still runs (module doc of
    tp4.core.pidfile); :class:`tp4.core.pidfile.Stale` when the file names another process."""
    return pidfile.running(_pidfile(root), _expect(root), WHAT)


def running(root: Path | None = None) -> Store | None:
    """The registry tp4 started under ``root``, when its process lives and /v2/ answers."""
    root = root or default_root()
    try:
        record = _record(root)
    except pidfile.Stale:
        return None  # not tp4's registry: `stop` says so; `start` starts one and records it
    port = record.extra.get("port") if record is not None else None
    if record is None or not isinstance(port, int):
        return None
    store = Store(root, port)
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
        root.chmod(0o700)  # the credential, the storage and the logs: tp4's user's only
        (root / "data").mkdir(parents=True, exist_ok=True)
        _ensure_credential(root)
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
    try:
        pidfile.write(_pidfile(root), child.pid, port=port)
    except (Tp4Error, OSError) as exc:
        process.stop(child)
        raise Tp4Error(f"the image store's pid file {_pidfile(root)}: {exc}; fix: make {root} writable") from None
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
    """Stop the registry tp4 started under ``root``; False when none was running. Only the
    process its pid file records is signalled, and only while it is still that process
    (tp4.core.pidfile): a pid file naming anything else is refused (Tp4Error), nothing signalled."""
    root = (root or default_root()).absolute()
    return pidfile.stop(_pidfile(root), _expect(root), WHAT, grace=process.GRACE * 2)


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
        cred = store.credential
        try:
            with auth_dir(cred, store.url) as auth:  # docker reads config.json of DOCKER_CONFIG
                out = process.run(
                    ["docker", "push", dest], env={"DOCKER_CONFIG": str(auth)}, secrets=cred.secrets
                ).stdout
        finally:
            process.run(["docker", "rmi", dest], check=False)
        digests = re.findall(r"digest: (sha256:[0-9a-f]{64})", out)
        if not digests:
            raise Tp4Error(f"`docker push {dest}` printed no digest:\n{out.strip()}")
        return str(digests[-1])
    return _skopeo_copy(f"containers-storage:{image_id}", dest, store)


def _skopeo_copy(source: str, dest: str, store: Store, *, echo: process.Echo | None = None) -> str:
    """``skopeo copy`` into the store as ``dest`` (``127.0.0.1:<port>/<repo>:<tag>``) with tp4's
    credential (an auth file); returns the manifest digest it wrote. Blobs the store has are not
    uploaded (nor read from the source)."""
    cred = store.credential
    with auth_dir(cred, store.url) as tmp:
        digestfile = tmp / "digest"
        # the store listens on 127.0.0.1 without TLS (never on the fabric): hence --dest-tls-verify=false
        process.run(
            [
                "skopeo",
                "copy",
                "--quiet",
                "--dest-tls-verify=false",
                "--dest-authfile",
                str(tmp / "config.json"),
                "--digestfile",
                str(digestfile),
                source,
                f"docker://{dest}",
            ],
            echo=echo,
            secrets=cred.secrets,
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
    digest = _skopeo_copy(
        runtime_cli.oci_source(layout, ref), f"{store.url}/{repo}:{ref.rsplit(':', 1)[1]}", store, echo=echo
    )
    pulled = f"{store.url}/{repo}@{digest}"
    # docker allows a registry on 127.0.0.0/8 without TLS
    cred = store.credential
    with auth_dir(cred, store.url) as auth:
        process.run(
            ["docker", "pull", "--quiet", pulled], env={"DOCKER_CONFIG": str(auth)}, echo=echo, secrets=cred.secrets
        )
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


# --- the workers' pull endpoint ---------------------------------------------------------------------


@dataclass(frozen=True)
class PullEndpoint:
    """A read-only registry over a store's storage, on 127.0.0.1:``port``, with a credential of
    its own (:func:`pull_endpoint`)."""

    port: int
    credential: Credential

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.port}"


def pull_config_text(data: Path, htpasswd: Path, port: int) -> str:
    """The pull endpoint's config.yml: the store's storage read-only (pushes and deletes get
    HTTP 405), no upload purging (the store's own uploads are not its to purge), its own
    htpasswd."""
    return (
        "# written by tp4 (python/tp4/image/imagestore.py) for one distribution; removed after it\n"
        "version: 0.1\n"
        "log:\n"
        "  level: warn\n"
        "  formatter: text\n"
        "  accesslog:\n"
        "    disabled: false\n"
        "storage:\n"
        "  filesystem:\n"
        f"    rootdirectory: {yaml_path(data)}\n"
        "  delete:\n"
        "    enabled: false\n"
        "  maintenance:\n"
        "    uploadpurging:\n"
        "      enabled: false\n"
        "    readonly:\n"
        "      enabled: true\n"
        "http:\n"
        f"  addr: 127.0.0.1:{port}\n"
        "  headers:\n"
        "    X-Content-Type-Options: [nosniff]\n"
        "auth:\n"
        "  htpasswd:\n"
        f"    realm: {REALM}-pull\n"
        f"    path: {yaml_path(htpasswd)}\n"
    )


@contextmanager
def pull_endpoint(store: Store) -> Iterator[PullEndpoint]:
    """The workers' pull endpoint for the length of the ``with``: a second registry over the
    store's storage, read-only, on a free port of 127.0.0.1, that knows one user, ``tp4-pull``,
    with a password made for this distribution (module doc). Its access lines go to the store's
    access.log (:func:`served_bytes`). It is tp4's child: stopped at the end, by Ctrl-C too, and
    its password (in a private directory under the store's) goes with it."""
    tmp = Path(tempfile.mkdtemp(prefix="pull-", dir=store.root))
    cred = Credential(PULL_USER, _new_password())
    child = None
    try:
        write_private(tmp / HTPASSWD, f"{cred.user}:{_bcrypt(cred.password)}\n")
        for _ in range(3):  # a free port taken between the probe and the bind: another one
            endpoint = PullEndpoint(_free_port(), cred)
            write_private(tmp / "config.yml", pull_config_text(store.data, tmp / HTPASSWD, endpoint.port))
            with open(store.access_log, "ab") as log:
                child = process.start([REGISTRY, "serve", str(tmp / "config.yml")], stdout=log, stderr=process.STDOUT)
            probe = Store(store.root, endpoint.port)
            deadline = time.monotonic() + START_TIMEOUT
            while not _answers(probe, cred) and child.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            if _answers(probe, cred):
                break
            process.stop(child)
            child = None
        else:
            raise Tp4Error(
                f"the image store's pull endpoint ({REGISTRY} serve {tmp / 'config.yml'}) did not answer; "
                f"see {store.access_log}; fix: run the command again"
            )
        yield endpoint
    finally:
        if child is not None:
            process.stop(child)
        shutil.rmtree(tmp, ignore_errors=True)


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
