"""The fixed paths inside the line's container and the image's health check, read from
tp4/data/container.toml: the one place they are written (pkgs/image.nix and pkgs/default.nix read
the same file)."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Annotated, NamedTuple

PATH = Path(__file__).resolve().parents[1] / "data" / "container.toml"


class Mounts(NamedTuple):
    """Mount targets of the container run spec."""

    model: str
    state: str
    engram: str
    nccl: str
    cache: str


class ImagePaths(NamedTuple):
    """Where the image holds its trees."""

    runtime: str
    adapters: str
    b12x: str
    b12x_next: str
    sglang: str
    boot: str


class Health(NamedTuple):
    """The rank container's health check: the image's (tp4/data/container.toml `[health]`, which
    pkgs/image.nix writes into the image config). podman reads no health check from an OCI image's
    config, so serve and the NixOS unit give it to podman as `--health-*` flags."""

    cmd: Annotated[
        tuple[str, ...],
        "the check, run in the container without a shell (exec form): boot.py's `health`, GET /health on 127.0.0.1:SERVER_PORT",
    ]
    interval: Annotated[int, "seconds between checks"]
    timeout: Annotated[int, "seconds one check may take"]
    start_period: Annotated[
        int, "seconds after the start in which a failed check does not count (the weight load and warm-up)"
    ]
    retries: Annotated[int, "failed checks in a row before the container is unhealthy"]


def _health(table: dict[str, object], boot: str) -> Health:
    """The [health] table, checked: a wrong value here would reach every rank's runtime."""
    cmd = table.get("cmd")
    if not (isinstance(cmd, list) and cmd and all(isinstance(w, str) and w for w in cmd)):
        raise ValueError(f"{PATH}: health.cmd must be a non-empty list of non-empty strings (the exec form)")
    if boot not in cmd:
        raise ValueError(f"{PATH}: health.cmd must run the image's entrypoint script image.boot ({boot})")
    numbers = {k: v for k, v in table.items() if k != "cmd"}
    for key, value in numbers.items():
        least = 0 if key == "start_period" else 1
        if not isinstance(value, int) or isinstance(value, bool) or value < least:
            raise ValueError(f"{PATH}: health.{key} must be an integer of at least {least}")
    return Health(cmd=tuple(cmd), **numbers)  # type: ignore[arg-type]


def _load() -> tuple[Mounts, ImagePaths, Health]:
    with open(PATH, "rb") as fh:
        data = tomllib.load(fh)
    # the tuples take exactly the file's keys: a missing or extra key fails here, at import
    image = ImagePaths(**data["image"])
    return Mounts(**data["mounts"]), image, _health(data["health"], image.boot)


MOUNTS, IMAGE, HEALTH = _load()

# what podman is given for `gpus = all`: the NVIDIA container toolkit's CDI device (docker takes
# --gpus all); serve's flags and the plan's service.gpu_devices (the NixOS unit's) are this
PODMAN_GPU_DEVICES = ("nvidia.com/gpu=all",)
