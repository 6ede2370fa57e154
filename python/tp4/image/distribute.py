"""`tp4 distribute`: copy the image built on the head to the workers, in parallel.

The image is built once (`tp4 build`) and copied, instead of every node running its own build.
For each worker, in parallel:

1. ask its container runtime for the image id under the image's reference; the same id as on the
   head means the node already has it: skipped;
2. otherwise copy it, by one of two methods:

   * ``registry`` (the default): the worker pulls the image by its manifest digest from the
     head's image store (:mod:`tp4.image.imagestore`, a registry bound to 127.0.0.1 on the head;
     the workers reach its read-only pull endpoint, with a pull credential made for this
     distribution, handed to the node on stdin into an auth file removed after the pull),
     through a reverse tunnel of the ssh connection that runs the pull
     (``ssh -o RemoteForward=<port> 127.0.0.1:<endpoint port>``, for the length of the pull only):
     ``<runtime> pull localhost:<port>/<repo>@sha256:<digest>``, then tagged as the line's
     reference. The runtime fetches only the layers the node lacks and checks each blob against
     its digest. podman needs ``--tls-verify=false`` for the loopback registry (it is plain
     HTTP, reachable only through the tunnel); docker allows a loopback registry by itself;
   * ``archive``: stream the whole image archive into ``<runtime> load`` over ssh, for a head
     without the image store. The archive is written once per image id on the head
     (``<runtime> save``) and then read by all copies at once.

3. ask again: the node must now report the head's image id and the head's RootFS layers, or its
   copy differs (named with what differs).
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import re
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from tp4.core import process

from tp4.image import imagestore, runtime_cli
from tp4.image.build import Echo
from tp4.core.errors import Tp4Error


@dataclass(frozen=True)
class Outcome:
    node: str
    status: str  # "present", "copied", "differs", "missing", "failed"
    detail: str = ""
    seconds: float = 0.0
    bytes: int = 0  # what the copy moved (archive: its size; registry: the blobs the node lacked)
    layers: int = 0  # layers the copy moved (registry); the archive moves all of them

    @property
    def ok(self) -> bool:
        return self.status in ("present", "copied")


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tp4" / "images"


def archive(runtime: str, ref: str, image_id: str, directory: Path | None = None) -> Path:
    """The image as a docker-archive on the head, written once per image id."""
    directory = directory or cache_dir()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{image_id}.tar"
    if not path.exists():
        partial = path.with_suffix(".tar.partial")
        partial.unlink(missing_ok=True)
        runtime_cli.save(runtime, ref, partial)
        partial.rename(path)
    return path


def remote_id(runtime: str, ref: str, remote: process.Remote) -> str | None:
    found = runtime_cli.inspect(runtime, ref, remote=remote)
    return found[0] if found else None


def send(path: Path, runtime: str, remote: process.Remote) -> None:
    """Stream the archive into `<runtime> load` on the node, over a connection of its own: the
    shared one would make every other command to the node wait behind the image's bytes."""
    with open(path, "rb") as stream:
        process.run([runtime, "load"], remote=dataclasses.replace(remote, share_connection=False), stdin=stream)


def check(ref: str, image_id: str, nodes: Sequence[process.Remote], runtime: str) -> list[Outcome]:
    """Which nodes have the image (same id), a different one, or none; copies nothing."""

    def one(remote: process.Remote) -> Outcome:
        try:
            found = remote_id(runtime, ref, remote)
        except Tp4Error as exc:
            return Outcome(remote.host, "failed", str(exc))
        if found == image_id:
            return Outcome(remote.host, "present", image_id)
        if found is None:
            return Outcome(remote.host, "missing", f"no image {ref}")
        return Outcome(remote.host, "differs", f"{ref} is {found[:12]}, the head has {image_id[:12]}")

    with ThreadPoolExecutor(max_workers=max(1, len(nodes))) as pool:
        return list(pool.map(one, nodes))


METHODS = ("registry", "archive")


def distribute(
    ref: str,
    image_id: str,
    nodes: Sequence[process.Remote],
    runtime: str,
    echo: Echo,
    *,
    method: str = "registry",
    archive_dir: Path | None = None,
    store: imagestore.Store | None = None,
    digest: str | None = None,
    repo: str = imagestore.DEFAULT_REPO,
) -> list[Outcome]:
    """Copy the image to every node that lacks it, in parallel, and verify each node's copy.

    ``registry``: from the image store (``store``, default: started under its default root),
    by ``digest`` when the store has that manifest, else after pushing the image; ``archive``:
    today's whole-archive stream."""
    if method not in METHODS:
        raise ValueError(f"method {method!r}")
    before = {o.node: o for o in check(ref, image_id, nodes, runtime)}
    for o in before.values():
        if o.status == "present":
            echo(f"{o.node}: has {image_id[:12]}, skipped")
        elif o.status == "differs":
            echo(f"{o.node}: differs ({o.detail}), copying")
    todo = [n for n in nodes if before[n.host].status in ("missing", "differs")]
    if not todo:
        return list(before.values())
    if method == "archive":
        copied = _by_archive(ref, image_id, todo, runtime, echo, archive_dir)
    else:
        copied = _by_registry(ref, image_id, todo, runtime, echo, store, digest, repo)
    for o in copied.values():
        echo(f"{o.node}: {o.status}: {o.detail}")
    return [copied.get(n.host, before[n.host]) for n in nodes]


def _by_archive(
    ref: str, image_id: str, todo: Sequence[process.Remote], runtime: str, echo: Echo, archive_dir: Path | None
) -> dict[str, Outcome]:
    path = archive(ref=ref, image_id=image_id, runtime=runtime, directory=archive_dir)
    size = path.stat().st_size

    def copy(remote: process.Remote) -> Outcome:
        start = time.monotonic()
        try:
            send(path, runtime, remote)
            found = remote_id(runtime, ref, remote)
        except Tp4Error as exc:
            return Outcome(remote.host, "failed", str(exc), time.monotonic() - start)
        seconds = time.monotonic() - start
        if found != image_id:
            return Outcome(
                remote.host,
                "differs",
                f"after the copy {ref} is {(found or 'missing')[:12]}, the head has {image_id[:12]}",
                seconds,
            )
        return Outcome(remote.host, "copied", f"{size / 2**20:.0f} MiB in {seconds:.1f} s", seconds, bytes=size)

    echo(f"copying {path.name} ({size / 2**20:.0f} MiB) to {', '.join(n.host for n in todo)}")
    with ThreadPoolExecutor(max_workers=len(todo)) as pool:
        return {o.node: o for o in pool.map(copy, todo)}


# --- by registry ----------------------------------------------------------------------------------


def ensure_pushed(
    runtime: str, image_id: str, store: imagestore.Store, digest: str | None, repo: str, echo: Echo
) -> str:
    """The manifest digest of the image in the store: ``digest`` when the store has it, else
    the digest of a fresh push (which uploads only the blobs the store lacks)."""
    if digest and imagestore.has_manifest(store, repo, digest):
        return digest
    echo(f"pushing {image_id[:12]} to the image store {store.url}/{repo}")
    return imagestore.push(runtime, image_id, store, repo)


def layer_sizes(store: imagestore.Store, repo: str, digest: str) -> list[int]:
    """The sizes of the manifest's layer blobs, base first (what a pull of each one moves)."""
    found = imagestore.manifest(store, repo, digest)
    if found is None:
        raise Tp4Error(f"the image store has no manifest {repo}@{digest}: run `tp4 build` again")
    layers = found.get("layers")
    return [int(layer["size"]) for layer in layers if isinstance(layer, dict)] if isinstance(layers, list) else []


def _node_layer_lists(runtime: str, remote: process.Remote) -> list[tuple[str, ...]]:
    """The RootFS layer lists of every image on the node."""
    ids = process.run([runtime, "images", "-q", "--no-trunc"], remote=remote).stdout.split()
    if not ids:
        return []
    out = process.run(
        [runtime, "image", "inspect", "--format", "{{json .RootFS.Layers}}", *sorted(set(ids))],
        remote=remote,
        check=False,
    ).stdout
    return [tuple(json.loads(line) or ()) for line in out.splitlines() if line.strip().startswith("[")]


def missing_layers(head: Sequence[str], node: Sequence[Sequence[str]]) -> int:
    """How many of the head's layers (from the top) a node must fetch: a runtime reuses a layer
    only with all below it (layers are stacked by chain), so the longest common prefix stays."""
    keep = 0
    for layers in node:
        n = 0
        while n < min(len(head), len(layers)) and head[n] == layers[n]:
            n += 1
        keep = max(keep, n)
    return len(head) - keep


def pull_argv(runtime: str, source: str) -> list[str]:
    # podman: the store is plain HTTP on the head's loopback, reached only through the tunnel
    return [runtime, "pull", "--tls-verify=false", source] if runtime == "podman" else [runtime, "pull", source]


# Runs a pull on the node with the pull credential from stdin in an auth file of a private
# temporary directory, removed when the pull ends (a kill of the pull included): podman reads it
# as REGISTRY_AUTH_FILE, docker as DOCKER_CONFIG/config.json. Never in argv.
_WITH_AUTH = (
    'umask 077; d=$(mktemp -d "${TMPDIR:-/tmp}/tp4-pull.XXXXXXXX") || exit 1; '
    "trap 'rm -rf -- \"$d\"' EXIT; trap 'exit 129' HUP; trap 'exit 130' INT; trap 'exit 143' TERM; "
    'cat > "$d/config.json" || exit 1; DOCKER_CONFIG=$d REGISTRY_AUTH_FILE=$d/config.json "$@"'
)


def authed_pull_argv(runtime: str, source: str) -> list[str]:
    """:func:`pull_argv` under the wrapper that takes the credential on stdin (_WITH_AUTH)."""
    return ["sh", "-c", _WITH_AUTH, "sh", *pull_argv(runtime, source)]


def tunneled(remote: process.Remote, port: int, store: imagestore.Store | imagestore.PullEndpoint) -> process.Remote:
    """The node's ssh with a reverse tunnel: its 127.0.0.1:<port> reaches the store on the head;
    the connection fails when the port cannot be forwarded. A connection of its own, not the
    shared one: a forward asked through that would stay open as long as it does."""
    return _with_forward(remote, str(port), store.url)


def _with_forward(remote: process.Remote, port: str, url: str) -> process.Remote:
    return dataclasses.replace(
        remote,
        share_connection=False,
        options=(*remote.options, f"RemoteForward={port} {url}", "ExitOnForwardFailure=yes"),
    )


def pull(
    runtime: str,
    remote: process.Remote,
    store: imagestore.Store,
    repo: str,
    digest: str,
    endpoint: imagestore.PullEndpoint,
) -> None:
    """``<runtime> pull localhost:<port>/<repo>@<digest>`` on the node through a reverse tunnel to
    the store's pull endpoint, open for the length of the pull, with the pull credential (an auth
    file on the node for the length of the pull). The node's end of the tunnel is the store's port
    (so the image keeps one name), else a random one when that is taken there."""
    ports = [store.port, *random.sample(range(20000, 60000), 3)]
    cred = endpoint.credential
    for n, port in enumerate(ports):
        proc = process.run(
            authed_pull_argv(runtime, f"localhost:{port}/{repo}@{digest}"),
            remote=tunneled(remote, port, endpoint),
            input=cred.auth_json(f"localhost:{port}"),
            secrets=cred.secrets,
            check=False,
        )
        if proc.returncode == 0:
            return
        taken = proc.returncode == 255 and "remote port forwarding failed" in proc.stderr
        if not taken or n == len(ports) - 1:
            raise Tp4Error(pull_failure(runtime, remote, store, repo, digest, proc.returncode, proc.stderr))


_MISMATCH = re.compile(r"[Dd]igest did not match, expected (sha256:[0-9a-f]{64}), got (sha256:[0-9a-f]{64})")


def pull_failure(
    runtime: str, remote: process.Remote, store: imagestore.Store, repo: str, digest: str, code: int, stderr: str
) -> str:
    """Why a pull failed, from its exit and output, and what to do."""
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith(("Error", "error"))]
    shown = "\n".join(errors[-3:] or lines[-6:])
    what = f"`{runtime} pull` of {repo}@{digest[:19]} through the ssh tunnel"
    mismatch = _MISMATCH.search(stderr)
    if mismatch:
        blob = mismatch.group(1)
        return (
            f"{what} refused the blob {blob[:19]}: its bytes do not match its digest (got {mismatch.group(2)[:19]}), "
            f"so the image store's copy is damaged:\n{shown}\n"
            f"fix: remove {imagestore.blob_path(store, blob)} and run `tp4 build` again (it uploads what the store "
            "lacks), then `tp4 distribute`"
        )
    if code < 0 or code == 255:
        how = f"killed by signal {-code}" if code < 0 else "exit code 255"
        return (
            f"{what} broke: the ssh connection to {remote.destination} (and so its tunnel) ended ({how}):\n"
            f"{shown}\nfix: run `tp4 distribute` again; the layers the node already has are not fetched again"
        )
    return f"{what} failed with exit code {code}:\n{shown}"


def _by_registry(
    ref: str,
    image_id: str,
    todo: Sequence[process.Remote],
    runtime: str,
    echo: Echo,
    store: imagestore.Store | None,
    digest: str | None,
    repo: str,
) -> dict[str, Outcome]:
    store = store or imagestore.start()
    digest = ensure_pushed(runtime, image_id, store, digest, repo, echo)
    head_layers = runtime_cli.layers(runtime, image_id)
    sizes = layer_sizes(store, repo, digest)
    if len(sizes) != len(head_layers):
        raise Tp4Error(
            f"the store's manifest {repo}@{digest[:19]} lists {len(sizes)} layers, the head's image "
            f"{image_id[:12]} {len(head_layers)}: run `tp4 build` again"
        )

    def copy(remote: process.Remote) -> Outcome:
        start = time.monotonic()
        try:
            lacking = missing_layers(head_layers, _node_layer_lists(runtime, remote))
            moved = sum(sizes[len(sizes) - lacking :]) if lacking else 0
            pull(runtime, remote, store, repo, digest, endpoint)
            process.run([runtime, "tag", image_id, ref], remote=remote)
            found = remote_id(runtime, ref, remote)
            layers = runtime_cli.layers(runtime, ref, remote=remote)
        except Tp4Error as exc:
            return Outcome(remote.host, "failed", str(exc), time.monotonic() - start)
        seconds = time.monotonic() - start
        if found != image_id:
            return Outcome(
                remote.host,
                "differs",
                f"after the pull {ref} is {(found or 'missing')[:12]}, the head has {image_id[:12]}",
                seconds,
            )
        if layers != head_layers:
            return Outcome(
                remote.host,
                "differs",
                f"its RootFS layers differ from the head's: {layer_diff(head_layers, layers)}",
                seconds,
            )
        return Outcome(
            remote.host,
            "copied",
            f"pulled {digest[:19]}: {lacking} of {len(head_layers)} layers, {moved / 2**20:.1f} MiB in {seconds:.1f} s",
            seconds,
            bytes=moved,
            layers=lacking,
        )

    # the workers pull from a read-only endpoint with a credential that lives as long as this
    # distribution (tp4.image.imagestore.pull_endpoint): never tp4's own, which may push and delete
    with imagestore.pull_endpoint(store) as endpoint:
        echo(
            f"pulling {repo}@{digest[:19]} from {store.url} (read-only, reverse ssh tunnels) to "
            f"{', '.join(n.host for n in todo)}"
        )
        with ThreadPoolExecutor(max_workers=len(todo)) as pool:
            return {o.node: o for o in pool.map(copy, todo)}


def layer_diff(head: Sequence[str], node: Sequence[str]) -> str:
    """Which layers differ, by position (short digests)."""
    if len(head) != len(node):
        return f"{len(node)} layers, the head has {len(head)}"
    bad = [
        f"layer {i + 1} is {b.removeprefix('sha256:')[:12]}, the head's {a.removeprefix('sha256:')[:12]}"
        for i, (a, b) in enumerate(zip(head, node, strict=True))
        if a != b
    ]
    return "; ".join(bad)


# --- dry run --------------------------------------------------------------------------------------


def rehearse(
    ref: str, nodes: Sequence[process.Remote], runtime: str, *, method: str = "registry", digest: str | None = None
) -> list[str]:
    """`tp4 distribute --dry-run`: the commands a copy runs, worker by worker, from the build
    records alone: no worker is asked whether it has the image, so the copy is printed for every
    worker and said to run only where the worker lacks the head's image; the pull credential is
    never shown (it goes on stdin). Ports that the store and its pull endpoint take at run time
    are shown as placeholders."""
    import shlex

    def on(remote: process.Remote | None, argv: Sequence[str], note: str = "") -> str:
        return (
            f"{remote.host if remote else 'head (this machine)'}: {shlex.join(process.full_argv(argv, remote))}{note}"
        )

    inspect = [runtime, "image", "inspect", "--format", "{{.Id}} {{json .Config.Labels}}", ref]
    lines = [on(None, inspect, "  (the head's image id)")]
    if method == "archive":
        lines += [
            on(None, [runtime, "save", "-o", f"{cache_dir()}/<image id>.tar.partial", ref], "  (once per image id)"),
        ]
    else:
        where = digest[:19] if digest else "<digest of the push>"
        lines += [
            "head (this machine): the image store, started when not running (tp4 image-store start)",
            f"head (this machine): the image pushed to the store unless it holds {imagestore.DEFAULT_REPO}@{where} "
            "(only the blobs it lacks move)",
            "head (this machine): a read-only pull endpoint over the store, with a credential made for this run",
        ]
    for remote in nodes:
        lines.append(on(remote, inspect, "  (skipped below when it is the head's image id: depends on the worker)"))
        if method == "archive":
            lines.append(
                on(dataclasses.replace(remote, share_connection=False), [runtime, "load"], "  < the archive on stdin")
            )
        else:
            source = f"localhost:<port>/{imagestore.DEFAULT_REPO}@{digest or '<digest>'}"
            tunnel = _with_forward(remote, "<port>", "127.0.0.1:<pull endpoint port>")
            lines += [
                on(remote, [runtime, "images", "-q", "--no-trunc"], "  (which layers it lacks)"),
                on(tunnel, authed_pull_argv(runtime, source), "  < the pull credential on stdin (never shown)"),
                on(remote, [runtime, "tag", "<image id>", ref]),
            ]
        lines.append(on(remote, inspect, "  (must be the head's image id and RootFS layers)"))
    return lines
