"""The fixed paths inside the line's container, read from tp4/data/container.toml: the one place
they are written (pkgs/image.nix and pkgs/default.nix read the same file)."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import NamedTuple

PATH = Path(__file__).resolve().parent / "data" / "container.toml"


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


def _load() -> tuple[Mounts, ImagePaths]:
    with open(PATH, "rb") as fh:
        data = tomllib.load(fh)
    # the tuples take exactly the file's keys: a missing or extra key fails here, at import
    return Mounts(**data["mounts"]), ImagePaths(**data["image"])


MOUNTS, IMAGE = _load()
