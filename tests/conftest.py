"""Shared fixtures. Tests run against the real tools of the machine (nix, ssh, podman);
the only stand-in is the engine (and its packer), used by the serving and pack tests."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "python"))


def pytest_configure(config) -> None:
    # checks.unit (pkgs/checks.nix) runs the modules that say `pytestmark = pytest.mark.unit`
    # inside the Nix sandbox (a whole module is unit or not: the others may need nix to import)
    config.addinivalue_line(
        "markers",
        "unit: needs no root, nix, network (loopback only), daemon or file "
        "outside the repository (shared/); only python, bash, GNU patch and git on PATH",
    )


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


@pytest.fixture
def tp4_cli(capsys):
    """Run the tp4 CLI in-process through its real entry point; returns (exit code, stdout, stderr)."""
    from tp4.cli import main

    def invoke(*args: str) -> tuple[int, str, str]:
        capsys.readouterr()
        try:
            main([str(a) for a in args])
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return invoke


@pytest.fixture(scope="session", autouse=True)
def image_store_state(tmp_path_factory):
    """`tp4 build` pushes into the head's image store under $XDG_STATE_HOME (tp4.image.imagestore):
    the session gets its own, stopped at the end, never the user's."""
    import os

    state = tmp_path_factory.mktemp("state")
    old = os.environ.get("XDG_STATE_HOME")
    os.environ["XDG_STATE_HOME"] = str(state)
    yield state
    from tp4.image import imagestore

    imagestore.stop(state / "tp4" / "registry")
    if old is None:
        os.environ.pop("XDG_STATE_HOME", None)
    else:
        os.environ["XDG_STATE_HOME"] = old
