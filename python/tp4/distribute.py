"""`tp4 distribute`: copy the image built on the head to the workers, in parallel.

The image is built once (`tp4 build`) and copied, instead of every node running its own build.
For each worker, in parallel:

1. ask its container runtime for the image id under the image's reference; the same id as on the
   head means the node already has it: skipped;
2. otherwise stream the image archive into ``<runtime> load`` over ssh;
3. ask again: the node must now report the head's image id, or its copy differs.

The archive is written once per image id on the head (``<runtime> save``) and then read by all
copies at once; only nodes that need the image cause it to be written.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from tp4 import containers, process
from tp4.build import Echo
from tp4.errors import Tp4Error


@dataclass(frozen=True)
class Outcome:
    node: str
    status: str  # "present", "copied", "differs", "missing", "failed"
    detail: str = ""
    seconds: float = 0.0

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
        containers.save(runtime, ref, partial)
        partial.rename(path)
    return path


def remote_id(runtime: str, ref: str, remote: process.Remote) -> str | None:
    found = containers.inspect(runtime, ref, remote=remote)
    return found[0] if found else None


def send(path: Path, runtime: str, remote: process.Remote) -> None:
    """Stream the archive into `<runtime> load` on the node."""
    with open(path, "rb") as stream:
        process.run([runtime, "load"], remote=remote, stdin=stream)


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


def distribute(
    ref: str,
    image_id: str,
    nodes: Sequence[process.Remote],
    runtime: str,
    echo: Echo,
    *,
    archive_dir: Path | None = None,
) -> list[Outcome]:
    """Copy the image to every node that lacks it, in parallel, and verify each node's copy."""
    before = {o.node: o for o in check(ref, image_id, nodes, runtime)}
    for o in before.values():
        if o.status == "present":
            echo(f"{o.node}: has {image_id[:12]}, skipped")
        elif o.status == "differs":
            echo(f"{o.node}: differs ({o.detail}), copying")
    todo = [n for n in nodes if before[n.host].status in ("missing", "differs")]
    if not todo:
        return list(before.values())
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
            return Outcome(remote.host, "differs",
                           f"after the copy {ref} is {(found or 'missing')[:12]}, the head has {image_id[:12]}",
                           seconds)
        return Outcome(remote.host, "copied", f"{size / 2**20:.0f} MiB in {seconds:.1f} s", seconds)

    echo(f"copying {path.name} ({size / 2**20:.0f} MiB) to {', '.join(n.host for n in todo)}")
    with ThreadPoolExecutor(max_workers=len(todo)) as pool:
        copied = {o.node: o for o in pool.map(copy, todo)}
    for o in copied.values():
        echo(f"{o.node}: {o.status}: {o.detail}")
    return [copied.get(n.host, before[n.host]) for n in nodes]
