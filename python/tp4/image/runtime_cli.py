"""The container runtime of a node (docker on DGX OS, or podman): detect it, load an image into
it, inspect, tag, save and remove images, locally or over ssh. Every call goes through
:mod:`tp4.core.process`; build, distribute and serve use these and nothing else of the runtime's CLI."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
from pathlib import Path
from typing import Literal

from tp4.core import process

from tp4.image import oci
from tp4.line.container import PODMAN_GPU_DEVICES
from tp4.core.errors import Tp4Error

# how each runtime hands the node's GPUs to a container (podman through CDI)
GPU_FLAGS = {"docker": ["--gpus", "all"], "podman": [w for d in PODMAN_GPU_DEVICES for w in ("--device", d)]}


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


ImageKind = Literal["oci", "stream", "archive"]


def image_kind(out_path: str) -> ImageKind:
    """What a built image is: an OCI layout (pkgs/oci.nix, the line's image), a dockerTools stream
    script (executable, `stream-<name>`) or an image tarball. A path that is not built yet (a dry
    run) is judged by its name: `stream-*` a stream, `*.tar`/`*.tar.gz` a tarball, else a layout."""
    if os.path.exists(out_path):
        if oci.is_layout(out_path):
            return "oci"
        return "stream" if os.access(out_path, os.X_OK) and not os.path.isdir(out_path) else "archive"
    name = Path(out_path).name.split("-", 1)[-1]
    if name.startswith("stream-"):
        return "stream"
    return "archive" if name.endswith((".tar", ".tar.gz", ".tgz")) else "oci"


def layout_ref(out_path: str) -> str:
    """The reference an OCI layout names its image by (``name:<tag from its config>``)."""
    try:
        return oci.read_layout(out_path).ref
    except oci.OciError as exc:
        raise Tp4Error(f"the built image is not a readable OCI layout: {exc}") from None


def oci_source(out_path: str, ref: str) -> str:
    """skopeo's name for the image ``ref`` of the layout at ``out_path`` (a store path: no colon)."""
    if ":" in out_path:
        raise Tp4Error(f"{out_path}: skopeo cannot read an OCI layout whose path has a colon in it")
    return f"oci:{out_path}:{ref}"


def load_argv(out_path: str, runtime: str, ref: str = "<ref>") -> tuple[list[str] | None, list[str]]:
    """(producer, loader): a layout is copied by skopeo (layers the runtime has are skipped by
    digest, unread), a stream script piped into `<runtime> load`, a tarball loaded with -i."""
    kind = image_kind(out_path)
    if kind == "oci":
        if runtime == "podman":
            return None, [
                "skopeo",
                "copy",
                "--quiet",
                oci_source(out_path, ref),
                f"containers-storage:{local_ref(runtime, ref)}",
            ]
        # skopeo does not read DOCKER_HOST (a rootless or remote docker): pass it on
        daemon = ["--dest-daemon-host", os.environ["DOCKER_HOST"]] if os.environ.get("DOCKER_HOST") else []
        return None, ["skopeo", "copy", "--quiet", *daemon, oci_source(out_path, ref), f"docker-daemon:{ref}"]
    if kind == "stream":
        return [out_path], [runtime, "load"]
    return None, [runtime, "load", "-i", out_path]


def local_ref(runtime: str, ref: str) -> str:
    """``ref`` as the runtime names a local image: podman's ``localhost/<name>`` (what its `load`
    gives; skopeo would otherwise file a bare name under docker.io/library/), docker's bare name."""
    first = ref.split("/", 1)[0]
    has_domain = "/" in ref and ("." in first or ":" in first or first == "localhost")
    return f"localhost/{ref}" if runtime == "podman" and not has_domain else ref


def describe_load(out_path: str, runtime: str) -> str:
    ref = layout_ref(out_path) if image_kind(out_path) == "oci" and os.path.exists(out_path) else "<ref>"
    producer, loader = load_argv(out_path, runtime, ref)
    return f"{shlex.join(producer)} | {shlex.join(loader)}" if producer else shlex.join(loader)


def load(out_path: str, runtime: str, *, echo: process.Echo | None = None) -> str:
    """Load the image into the runtime; returns its reference there. ``echo`` shows the command
    (`$ skopeo copy ...`, `$ stream | <runtime> load`) as progress.

    A layout goes in with skopeo: into podman's store directly, into docker through its daemon
    (which takes a whole archive: :func:`tp4.image.build.load_image` routes docker through the head's
    image store instead, where it can)."""
    if image_kind(out_path) == "oci":
        ref = layout_ref(out_path)
        _, loader = load_argv(out_path, runtime, ref)
        process.run(loader, echo=echo)
        return local_ref(runtime, ref)
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
    proc = process.run(
        [runtime, "image", "inspect", "--format", "{{.Id}} {{json .Config.Labels}}", ref], remote=remote, check=False
    )
    if proc.returncode != 0:
        if remote is not None and proc.returncode == 255:
            raise Tp4Error(f"cannot reach {remote.destination} over ssh:\n{proc.stderr.strip()}")
        return None
    image_id, _, labels = proc.stdout.strip().partition(" ")
    return normalize_id(image_id), json.loads(labels or "null") or {}


def layers(runtime: str, ref: str, *, remote: process.Remote | None = None) -> tuple[str, ...]:
    """The image's RootFS layers (diff ids, ``sha256:<hex>``, base first); () when the runtime
    has no such image."""
    proc = process.run(
        [runtime, "image", "inspect", "--format", "{{json .RootFS.Layers}}", ref], remote=remote, check=False
    )
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
