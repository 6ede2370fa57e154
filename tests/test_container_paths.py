"""The fixed container paths have one home, tp4/data/container.toml: the Nix files that build the
image read it and write none of the paths themselves (not a unit module: it reads pkgs/, which
the unit check's tree does not hold)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tp4.line.container import IMAGE, MOUNTS

REPO = Path(__file__).resolve().parent.parent


def test_nix_reads_the_container_paths():
    for name in ("image.nix", "default.nix"):
        text = (REPO / "pkgs" / name).read_text()
        code = "\n".join(line.split("#", 1)[0] for line in text.splitlines())
        for path in (MOUNTS.model, MOUNTS.state, IMAGE.runtime, IMAGE.b12x, IMAGE.b12x_next, IMAGE.boot):
            assert not re.search(rf'"{re.escape(path)}[/"]', code), f"pkgs/{name} writes {path}: read container.toml"
        assert "container.toml" in code


def test_the_health_table_is_checked_at_import():
    """A wrong [health] would reach every podman rank's flags and the image config: refused."""
    from tp4.line.container import HEALTH, _health

    good = {"cmd": list(HEALTH.cmd), "interval": 30, "timeout": 30, "start_period": 1800, "retries": 3}
    assert _health(good, IMAGE.boot) == HEALTH
    for change, field in (
        ({"cmd": "python3 -S /opt/dsv41/boot.py health"}, "health.cmd"),
        ({"cmd": ["python3", "boot.py", "health"]}, "health.cmd"),
        ({"interval": 0}, "health.interval"),
        ({"retries": True}, "health.retries"),
        ({"start_period": -1}, "health.start_period"),
        ({"timeout": "30s"}, "health.timeout"),
    ):
        with pytest.raises(ValueError, match=field):
            _health({**good, **change}, IMAGE.boot)
    with pytest.raises(TypeError):
        _health({**good, "interval_s": 30}, IMAGE.boot)
