"""The plan a NixOS host configuration reads: committed beside the profile as a file
(`tp4 plan --json -o plan.json`), written whole or not at all, and `tp4 plan --check plan.json`
says when it no longer is the plan the profile renders."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "spark-line"


def test_o_writes_the_json_plan_and_check_finds_it_current(tp4_cli, tmp_path):
    out = tmp_path / "plan.json"
    code, stdout, err = tp4_cli("plan", "--json", "-o", out, "--profile", EXAMPLE / "profile.toml")
    assert code == 0, err
    assert stdout == "" and f"wrote {out}" in err
    code_json, printed, _ = tp4_cli("plan", "--json", "--profile", EXAMPLE / "profile.toml")
    assert json.loads(out.read_text()) == json.loads(printed)
    assert oct(out.stat().st_mode & 0o777) == "0o644"
    assert [p.name for p in tmp_path.iterdir()] == ["plan.json"]
    code, _, err = tp4_cli("plan", "--check", out, "--profile", EXAMPLE / "profile.toml")
    assert code == 0, err
    assert "is current" in err


def test_check_names_each_difference_and_exits_1_when_stale(tp4_cli, tmp_path):
    profile = tmp_path / "profile.toml"
    profile.write_text((EXAMPLE / "profile.toml").read_text())
    out = tmp_path / "plan.json"
    assert tp4_cli("plan", "-o", out, "--profile", profile)[0] == 0
    profile.write_text(profile.read_text().replace("[cluster]\n", "[cluster]\nport = 8899\n", 1))
    code, stdout, err = tp4_cli("plan", "--check", out, "--profile", profile)
    assert code == 1 and stdout == ""
    assert f"{out} is stale" in err
    assert 'line.api: the file has "http://10.0.0.1:8888", the profile renders "http://10.0.0.1:8899"' in err
    assert f"fix: tp4 plan --json -o {out} --profile {profile}" in err


def test_the_profiles_path_is_not_compared(tp4_cli, tmp_path):
    """The plan's `source` is where the profile was read (a store path in the flake's check)."""
    out = tmp_path / "plan.json"
    assert tp4_cli("plan", "-o", out, "--profile", EXAMPLE / "profile.toml")[0] == 0
    copy = tmp_path / "elsewhere.toml"
    copy.write_text((EXAMPLE / "profile.toml").read_text())
    assert tp4_cli("plan", "--check", out, "--profile", copy)[0] == 0


def test_a_failed_write_leaves_the_old_file(tp4_cli, tmp_path, monkeypatch):
    out = tmp_path / "plan.json"
    out.write_text("old\n")

    def broken(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken)
    with pytest.raises(OSError):
        from tp4.plan import build_plan
        from tp4.planfile import write_plan
        from tp4.profile import load_file

        write_plan(out, build_plan(load_file(str(EXAMPLE / "profile.toml"), "")))
    assert out.read_text() == "old\n" and [p.name for p in tmp_path.iterdir()] == ["plan.json"]


@pytest.mark.parametrize(("content", "message"), [
    (None, "no such file; fix: write it with tp4 plan --json -o"),
    ("{", "not a plan file"),
    ('{"schema": "tp4.fleet/1.0"}', "not a tp4 plan"),
])
def test_check_of_a_file_that_is_no_plan_is_invalid_input(tp4_cli, tmp_path, content, message):
    out = tmp_path / "plan.json"
    if content is not None:
        out.write_text(content)
    code, _, err = tp4_cli("plan", "--check", out, "--profile", EXAMPLE / "profile.toml")
    assert code == 2 and message in err and "Traceback" not in err


@pytest.mark.parametrize("args", [("-o", "x.json", "--rank", "1"), ("--check", "x.json", "--rank", "0"), ("-o", "x.json", "--check", "y.json")])
def test_a_plan_file_is_the_whole_line(tp4_cli, tmp_path, args):
    code, _, err = tp4_cli("plan", *args)
    assert code == 2 and "fix:" in err
    assert not (tmp_path / "x.json").exists()
