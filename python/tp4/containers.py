"""The container runtime of a node (docker on DGX OS, or podman): detect it, load an image into
it, inspect, tag, save and remove images, locally or over ssh. Every call goes through
:mod:`tp4.process`; build, distribute and serve use these and nothing else of the runtime's CLI."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
from pathlib import Path

from tp4 import process
from tp4.errors import Tp4Error

# how each runtime hands the node's GPUs to a container (podman through CDI)
GPU_FLAGS = {"docker": ["--gpus", "all"], "podman": ["--device", "nvidia.com/gpu=all"]}


def detect(preferred: str | None = None, *, required: bool = True) -> str:
    """The container runtime: the one asked for, else docker (DGX OS), else podman.

    Without ``required`` (a dry run) a host with neither gets ``docker`` in the printed commands.
    """
    if preferred:
        return preferred
    for name in ("docker", "podman"):
        if shutil.which(name):
            return name
    if not required:
        return "docker"
    raise Tp4Error("neither docker nor podman is installed on this host: install one, or pass --runtime")


def is_stream(out_path: str) -> bool:
    """A dockerTools stream script (executable, `stream-<name>`), not an image tarball; decided by
    name for a path that is not built yet (a dry run)."""
    if os.path.exists(out_path):
        return os.access(out_path, os.X_OK) and not os.path.isdir(out_path)
    return Path(out_path).name.split("-", 1)[-1].startswith("stream-")


def load_argv(out_path: str, runtime: str) -> tuple[list[str] | None, list[str]]:
    """(producer, loader): a stream script is piped into `<runtime> load`, a tarball loaded with -i."""
    if is_stream(out_path):
        return [out_path], [runtime, "load"]
    return None, [runtime, "load", "-i", out_path]


def describe_load(out_path: str, runtime: str) -> str:
    producer, loader = load_argv(out_path, runtime)
    return f"{shlex.join(producer)} | {shlex.join(loader)}" if producer else shlex.join(loader)


def load(out_path: str, runtime: str, *, echo: process.Echo | None = None) -> str:
    """Load the image into the runtime; returns the reference the runtime printed. ``echo``
    shows the command (`$ stream | <runtime> load`) as progress."""
    producer, loader = load_argv(out_path, runtime)
    if producer is None:
        out = process.run(loader, echo=echo).stdout
    else:
        out = process.pipe([producer, loader], echo=echo).stdout
    return loaded_ref(out)


def loaded_ref(output: str) -> str:
    """The image named in `podman load` / `docker load` output."""
    refs: list[str] = re.findall(r"Loaded image(?:\(s\))?(?: ID)?:\s*(\S+)", output)
    if not refs:
        raise Tp4Error(f"could not find the loaded image in the runtime's output:\n{output.strip()}")
    return refs[-1].split(",")[0]


def inspect(runtime: str, ref: str, *, remote: process.Remote | None = None) -> tuple[str, dict[str, str]] | None:
    """(image id, labels) of an image in the runtime, or None when it has no such image."""
    proc = process.run([runtime, "image", "inspect", "--format", "{{.Id}} {{json .Config.Labels}}", ref],
                       remote=remote, check=False)
    if proc.returncode != 0:
        if remote is not None and proc.returncode == 255:
            raise Tp4Error(f"cannot reach {remote.destination} over ssh:\n{proc.stderr.strip()}")
        return None
    image_id, _, labels = proc.stdout.strip().partition(" ")
    return normalize_id(image_id), json.loads(labels or "null") or {}


def layers(runtime: str, ref: str, *, remote: process.Remote | None = None) -> tuple[str, ...]:
    """The image's RootFS layers (diff ids, ``sha256:<hex>``, base first); () when the runtime
    has no such image."""
    proc = process.run([runtime, "image", "inspect", "--format", "{{json .RootFS.Layers}}", ref],
                       remote=remote, check=False)
    if proc.returncode != 0:
        if remote is not None and proc.returncode == 255:
            raise Tp4Error(f"cannot reach {remote.destination} over ssh:\n{proc.stderr.strip()}")
        return ()
    return tuple(json.loads(proc.stdout.strip() or "null") or ())


def normalize_id(image_id: str) -> str:
    return image_id.removeprefix("sha256:")


def same_ref(a: str, b: str) -> bool:
    """Two references naming the same image name in a local store (podman adds localhost/)."""
    def norm(ref: str) -> str:
        ref = ref.removeprefix("localhost/").removeprefix("docker.io/").removeprefix("library/")
        return ref if ":" in ref.rsplit("/", 1)[-1] else ref + ":latest"
    return norm(a) == norm(b)


def tag(runtime: str, image: str, ref: str) -> None:
    process.run([runtime, "tag", image, ref])


def remove(runtime: str, ref: str) -> str | None:
    """Untag ``ref`` (the image goes with its last tag); the runtime's complaint, or None."""
    proc = process.run([runtime, "rmi", ref], check=False)
    return proc.stderr.strip() if proc.returncode != 0 else None


def save(runtime: str, ref: str, path: Path) -> None:
    """The image as a docker-archive at ``path``."""
    process.run([runtime, "save", "-o", str(path), ref])


def remove_container(runtime: str, name: str) -> None:
    """Kill and remove a container, if it exists (SIGKILL first: `rm -f` alone gives a PID 1 that
    ignores SIGTERM 10 s)."""
    process.run([runtime, "kill", name], check=False)
    process.run([runtime, "rm", "-f", name], check=False)
