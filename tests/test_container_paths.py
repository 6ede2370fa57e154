"""The fixed container paths have one home, tp4/data/container.toml: the Nix files that build the
image read it and write none of the paths themselves (not a unit module: it reads pkgs/, which
the unit check's tree does not hold)."""

from __future__ import annotations

import re
from pathlib import Path

from tp4.container import IMAGE, MOUNTS

REPO = Path(__file__).resolve().parent.parent


def test_nix_reads_the_container_paths():
    for name in ("image.nix", "default.nix"):
        text = (REPO / "pkgs" / name).read_text()
        code = "\n".join(line.split("#", 1)[0] for line in text.splitlines())
        for path in (MOUNTS.model, MOUNTS.state, IMAGE.runtime, IMAGE.b12x, IMAGE.b12x_next, IMAGE.boot):
            assert not re.search(rf'"{re.escape(path)}[/"]', code), f"pkgs/{name} writes {path}: read container.toml"
        assert "container.toml" in code
