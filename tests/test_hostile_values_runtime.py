"""Hostile values (issue 25, item 10) where the command asks the machine's container runtime: a
failed listing names each node's reason in its error, never "see above"."""

from __future__ import annotations


def test_an_images_failure_says_each_nodes_reason_in_the_error(tp4_cli, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))  # no known host: 192.0.2.1 is untrusted
    code, out, err = tp4_cli("images", "--json", "--worker", "192.0.2.1")
    assert code in (1, 2), (code, err)
    assert "see above" not in err
    assert "could not list the images of" in err and "192.0.2.1 (" in err and "trust" in err, err
