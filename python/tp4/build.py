"""`tp4 build`: build the image with nix, load it into the head's container runtime, report pins.

The image is the flake's ``packages.<system>.image``: a dockerTools stream script (or, for other
flakes, an image tarball). What was built and loaded is recorded next to the out-link
(``result-image.json``) for `tp4 distribute`.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from tp4 import nix, process
from tp4.errors import InvalidInput, Tp4Error

PIN_PREFIX = "tp4.pin."
FLAKE_REV_LABEL = "tp4.flake.rev"
Echo = Callable[[str], None]


def find_flake(start: str | os.PathLike[str] | None = None) -> Path:
    """The directory holding flake.nix: ``start`` or its nearest parent (default: cwd)."""
    here = Path(start or os.environ.get("TP4_FLAKE") or os.getcwd()).resolve()
    for d in (here, *here.parents):
        if (d / "flake.nix").is_file():
            return d
    raise InvalidInput(f"no flake.nix in {here} or its parents: run tp4 build in the tp4 repository or pass --flake")


def detect_runtime(preferred: str | None = None, *, required: bool = True) -> str:
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


@dataclass(frozen=True)
class Built:
    """An image built by nix and loaded on the head."""

    out_path: str
    ref: str
    id: str

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=2) + "\n")

    @classmethod
    def load(cls, path: Path) -> Built:
        try:
            data = json.loads(path.read_text())
            return cls(out_path=data["out_path"], ref=data["ref"], id=data["id"])
        except FileNotFoundError:
            raise Tp4Error(f"{path} does not exist: run `tp4 build` first, or pass --image") from None
        except (ValueError, KeyError) as exc:
            raise Tp4Error(f"{path} is not a tp4 build record ({exc}): run `tp4 build` again") from None


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


def load(out_path: str, runtime: str) -> str:
    """Load the image into the runtime; returns the reference the runtime printed."""
    producer, loader = load_argv(out_path, runtime)
    if producer is None:
        out = process.run(loader).stdout
    else:
        src = process.start(producer, stdout=subprocess.PIPE)
        try:
            dst = process.start(loader, stdin=src.stdout, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
            assert src.stdout is not None
            src.stdout.close()
            out, err = dst.communicate()
        finally:
            src.wait()
        if src.returncode != 0:
            raise Tp4Error(f"the image stream `{out_path}` failed with exit code {src.returncode}")
        if dst.returncode != 0:
            raise Tp4Error(f"`{shlex.join(loader)}` failed with exit code {dst.returncode}\n{err.strip()}")
    return loaded_ref(out)


def loaded_ref(output: str) -> str:
    """The image named in `podman load` / `docker load` output."""
    refs = re.findall(r"Loaded image(?:\(s\))?(?: ID)?:\s*(\S+)", output)
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


def normalize_id(image_id: str) -> str:
    return image_id.removeprefix("sha256:")


def pin_summary(labels: dict[str, str]) -> list[str]:
    """`component  commit` lines from the image's labels, the flake revision first."""
    pins = [("flake", labels[FLAKE_REV_LABEL])] if FLAKE_REV_LABEL in labels else []
    pins += [(k[len(PIN_PREFIX):], v) for k, v in sorted(labels.items()) if k.startswith(PIN_PREFIX)]
    width = max((len(name) for name, _ in pins), default=0)
    return [f"{name:<{width}}  {value}" for name, value in pins]


def out_link(flake: Path, attr: str) -> Path:
    return flake / f"result-{attr.replace('.', '-')}"


def record_path(flake: Path, attr: str) -> Path:
    return out_link(flake, attr).with_name(out_link(flake, attr).name + ".json")


def _missing_output_hint(exc: Tp4Error, system: str | None) -> Tp4Error:
    """The image exists for aarch64-linux only: say so when nix cannot find it on another host."""
    if system is None and "does not provide attribute" in exc.message and os.uname().machine != "aarch64":
        return Tp4Error(exc.message + "\nhint: the image is built for aarch64-linux (the Sparks): run tp4 build "
                        "on a Spark, or pass --system aarch64-linux with an aarch64 builder configured in nix")
    return exc


def dry_run(flake: Path, attr: str, runtime: str, echo: Echo, *, system: str | None = None) -> None:
    """Print the exact commands `tp4 build` runs and the store paths involved; build nothing."""
    nix.require()
    target = nix.installable(str(flake), attr, system)
    try:
        _dry_run(target, flake, attr, runtime, echo)
    except Tp4Error as exc:
        raise _missing_output_hint(exc, system) from None


def _dry_run(target: str, flake: Path, attr: str, runtime: str, echo: Echo) -> None:
    link = out_link(flake, attr)
    out_path = nix.eval_raw(target + ".outPath")
    drv = nix.derivation(target)
    plan = nix.dry_run(target)
    echo("commands:")
    echo(f"  $ {shlex.join(nix.build_argv(target, link))}")
    echo(f"  $ {describe_load(out_path, runtime)}")
    echo(f"  $ {shlex.join([runtime, 'image', 'inspect', '--format', '{{.Id}} {{json .Config.Labels}}', '<loaded image>'])}")
    echo("store paths:")
    echo(f"  image       {out_path}")
    echo(f"  derivation  {drv}")
    if plan.build:
        echo(f"  to build ({len(plan.build)}):")
        for p in plan.build:
            echo(f"    {p}")
    else:
        echo("  to build: nothing (already in the store)")
    if plan.fetch:
        echo(f"  to fetch ({len(plan.fetch)}):")
        for p in plan.fetch:
            echo(f"    {p}")


def build(flake: Path, attr: str, runtime: str, echo: Echo, *, system: str | None = None) -> Built:
    """nix build, load on the head, print image id and pins; records the result for distribute."""
    nix.require()
    target = nix.installable(str(flake), attr, system)
    try:
        out_path = nix.build(target, out_link(flake, attr), echo=echo)
    except Tp4Error as exc:
        raise _missing_output_hint(exc, system) from None
    echo(f"built {out_path}")
    echo(f"$ {describe_load(out_path, runtime)}")
    ref = load(out_path, runtime)
    found = inspect(runtime, ref)
    if found is None:
        raise Tp4Error(f"{runtime} loaded {ref} but cannot inspect it")
    image_id, labels = found
    built = Built(out_path=out_path, ref=ref, id=image_id)
    built.save(record_path(flake, attr))
    echo(f"image {ref}")
    echo(f"id    {image_id}")
    pins = pin_summary(labels)
    if pins:
        echo("pins:")
        for line in pins:
            echo(f"  {line}")
    return built
