"""The fixed paths inside the line's container, read from tp4/data/container.toml: the one place
they are written (pkgs/image.nix and pkgs/default.nix read the same file)."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

PATH = Path(__file__).resolve().parent / "data" / "container.toml"


@dataclass(frozen=True)
class Mounts:
    """Mount targets of the container run spec."""

    model: str
    state: str
    engram: str
    nccl: str
    cache: str


@dataclass(frozen=True)
class ImagePaths:
    """Where the image holds its trees."""

    runtime: str
    adapters: str
    wheels: str
    b12x: str
    b12x_next: str
    sglang: str
    boot: str


def _load() -> tuple[Mounts, ImagePaths]:
    with open(PATH, "rb") as fh:
        data = tomllib.load(fh)
    # the dataclasses take exactly the file's keys: a missing or extra key fails here, at import
    return Mounts(**data["mounts"]), ImagePaths(**data["image"])


MOUNTS, IMAGE = _load()
