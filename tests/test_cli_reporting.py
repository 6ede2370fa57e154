"""How the CLI reports: a node's failure is said once, help texts tell the exit codes the commands
really return and name the schema versions the code writes (tp4.core.schemas), long work shows
progress. Fast tests: the nodes are stand-ins patched in, no ssh is started."""

from __future__ import annotations

import pytest

from tp4.core import process
from tp4.image import images as images_mod
from tp4.image import runtime_cli

REASON = "cannot reach 192.0.2.7: ssh: connect to host 192.0.2.7 port 22: Connection timed out"


@pytest.fixture
def one_node_down(monkeypatch):
    """The head answers, the worker 192.0.2.7 cannot be asked."""
    monkeypatch.setattr(runtime_cli, "detect", lambda preferred=None, **_: "podman")
    monkeypatch.setattr(
        images_mod,
        "inventory",
        lambda runtime, workers: [
            images_mod.NodeImages("head", None),
            images_mod.NodeImages("192.0.2.7", process.Remote(host="192.0.2.7"), error=REASON),
        ],
    )
    monkeypatch.setattr(images_mod, "running_store", lambda: (None, "not running"))
    monkeypatch.setattr(
        images_mod,
        "prune",
        lambda runtime, workers, keep, dry_run=False: [
            images_mod.Pruned("head"),
            images_mod.Pruned("192.0.2.7", error=REASON),
        ],
    )


@pytest.mark.parametrize("command", [["images"], ["images", "prune"]])
def test_a_node_that_cannot_be_asked_is_told_once_with_its_reason(command, one_node_down, tp4_cli):
    code, out, err = tp4_cli(*command, "--worker", "192.0.2.7")
    assert code == 1, err
    assert (out + err).count(REASON) == 1, out + err
    assert "192.0.2.7" in out and REASON in err and "Traceback" not in err


def _help(tp4_cli, *command: str) -> str:
    code, out, err = tp4_cli(*command, "--help")
    assert code == 0, err
    return " ".join(out.split())


@pytest.mark.parametrize("command", [["images"], ["images", "prune"]])
def test_images_help_states_the_exit_codes_it_returns(command, one_node_down, tp4_cli, tmp_path, monkeypatch):
    said = _help(tp4_cli, *command)
    assert "Exit 1 when a node" in said and "2 when ssh refused a node's host key" in said, said
    code, _, _ = tp4_cli(*command, "--worker", "192.0.2.7")
    assert code == 1
    # a node whose host key tp4 does not hold: refused before any connection, exit 2 (the real
    # listing; prune only as a dry run, this machine's own images are never touched)
    monkeypatch.undo()
    monkeypatch.setenv("TP4_KNOWN_HOSTS", str(tmp_path / "known_hosts"))
    process.host_key_failures.clear()
    dry = ["--dry-run"] if "prune" in command else []
    code, out, err = tp4_cli(*command, *dry, "--runtime", "podman", "--worker", "192.0.2.7")
    assert code == 2, out + err
    assert "not a host tp4 trusts yet" in err
