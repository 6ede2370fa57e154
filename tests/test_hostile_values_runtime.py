"""Hostile values (issue 25, item 10) where the command asks the machine's container runtime: a
failed listing names each node's reason in its error, never "see above"."""

from __future__ import annotations


def test_an_images_failure_says_each_nodes_reason_in_the_error(tp4_cli, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))  # no known host: 192.0.2.1 is untrusted
    code, out, err = tp4_cli("images", "--json", "--worker", "192.0.2.1")
    assert code in (1, 2), (code, err)
    assert "see above" not in err
    assert "could not list the images of" in err and "192.0.2.1 (" in err and "trust" in err, err


# runs the real df of doctor's facts script: not a unit test (a Nix build's sandbox has no mounts to ask)
def test_doctor_reads_free_space_of_a_path_with_spaces(tmp_path):
    import subprocess

    from tp4.hosts import doctor

    script = doctor.FACTS_SCRIPT
    part = script[script.index("s df\n") : script.index("s meminfo")]
    here = tmp_path / "my models" / "engram dir"
    here.mkdir(parents=True)
    missing = tmp_path / "not yet" / "made here"
    text = subprocess.run(
        ["sh", "-c", "s() { printf '== %s\\n' \"$*\"; }\n" + part, "tp4-doctor", str(here), str(missing)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    facts = doctor.Facts(sections={"df": text.splitlines()[1:]})
    found = doctor._df(facts)
    assert set(found) == {str(here), str(missing)}, text
    for mount, free in found.values():
        assert mount.startswith("/") and free > 0, (mount, free)
    facts.sections["store"] = [str(here)]
    assert doctor._store_free(facts) == found[str(here)]
