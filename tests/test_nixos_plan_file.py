"""The plan a NixOS host configuration reads: committed beside the profile as a file
(`tp4 plan --json -o plan.json`), written whole or not at all, and `tp4 plan --check plan.json`
says when it no longer is the plan the profile renders."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tp4.core.errors import InvalidInput

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "spark-line"


def test_o_writes_the_json_plan_and_check_finds_it_current(tp4_cli, tmp_path):
    out = tmp_path / "plan.json"
    code, stdout, err = tp4_cli("plan", "--json", "-o", out, "--profile", EXAMPLE / "profile.toml")
    assert code == 0, err
    assert stdout == "" and f"wrote {out}" in err
    _, printed, _ = tp4_cli("plan", "--json", "--profile", EXAMPLE / "profile.toml")
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
    # said as a plan that cannot be written (tp4.core.userfiles.write_output), not a traceback
    with pytest.raises(InvalidInput, match="cannot write plan"):
        from tp4.line.plan import build_plan
        from tp4.line.planfile import write_plan
        from tp4.line.profile import load_file

        write_plan(out, build_plan(load_file(str(EXAMPLE / "profile.toml"), "")))
    assert out.read_text() == "old\n" and [p.name for p in tmp_path.iterdir()] == ["plan.json"]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "no such file; fix: write it with tp4 plan --json -o"),
        ("{", "not a plan file"),
        ('{"schema": "tp4.fleet/1.0"}', "not a tp4 plan"),
    ],
)
def test_check_of_a_file_that_is_no_plan_is_invalid_input(tp4_cli, tmp_path, content, message):
    out = tmp_path / "plan.json"
    if content is not None:
        out.write_text(content)
    code, _, err = tp4_cli("plan", "--check", out, "--profile", EXAMPLE / "profile.toml")
    assert code == 2 and message in err and "Traceback" not in err


@pytest.mark.parametrize(
    "args",
    [("-o", "x.json", "--rank", "1"), ("--check", "x.json", "--rank", "0"), ("-o", "x.json", "--check", "y.json")],
)
def test_a_plan_file_is_the_whole_line(tp4_cli, tmp_path, args):
    code, _, err = tp4_cli("plan", *args)
    assert code == 2 and "fix:" in err
    assert not (tmp_path / "x.json").exists()


# --- what a host reads from the plan (tp4.plan/1.9) ----------------------------------------------


def _plan(text: str):
    from tp4.line.plan import build_plan
    from tp4.line.profile.load import load_text

    return build_plan(load_text(text, "t"))


def test_the_nfs_share_is_the_plans_with_pythons_fallback_address():
    """One server address is every worker's; a profile that writes none gets tp4's default, as tp4
    share uses it (the NixOS hosts used to refuse it)."""
    text = (EXAMPLE / "profile.toml").read_text()
    plan = _plan(text)
    assert plan.line.nfs is not None
    assert plan.line.nfs.export == plan.nodes[0].run.mounts[0].source and plan.line.nfs.port == 2049
    assert plan.line.nfs.servers == ("10.0.0.1",) * 3
    import re

    bare = re.sub(r"(?m)^server_ips = .*\n", "", text)
    assert bare != text
    assert _plan(bare).line.nfs.servers == ("10.0.22.1",) * 3
    assert _plan(text.replace("[nfs]", "[nfs]\nshare = false")).line.nfs is None


def test_a_ring_carries_its_hairpin_queue_and_no_share():
    text = (EXAMPLE / "profile.toml").read_text().replace("[nfs]", "[nfs]\nshare = false")
    ring = text.replace(
        'hcas = ["rocep1s0f0", "roceP2p1s0f0"]',
        'hcas = ["rocep1s0f0", "roceP2p1s0f0"]\nmode = "ring"\n'
        'ring_hairpin_queue = 16384\n\n[fabric.nccl]\nmount = "overlay"',
    )
    ring += '\n[gates]\nDSV41_ROCE_RING = "1"\nSGLANG_ROCE_MAX_SIZE = "262144"\nDSV41_ROCE_GATHER = "262144"\n'
    plan = _plan(ring)
    assert plan.line.ring_hairpin_queue == 16384 and plan.line.nfs is None
    assert _plan(text).line.ring_hairpin_queue is None


def test_readiness_is_serves_boot_check_on_the_ranks_own_log():
    from tp4.serving.serve import DEFAULT_TIMEOUTS

    plan = _plan((EXAMPLE / "profile.toml").read_text())
    head, worker = plan.nodes[0].service.ready, plan.nodes[1].service.ready
    assert head.timeout == sum(DEFAULT_TIMEOUTS[k] for k in ("start", "weights", "graphs", "smoke", "warmup", "ready"))
    assert worker.timeout == DEFAULT_TIMEOUTS["start"] + DEFAULT_TIMEOUTS["weights"]
    import re

    assert re.search(head.pattern, "Ready: API on port 8888") and not re.search(
        head.pattern, "Ready: API on port 88881"
    )
    assert head.required_lines and not worker.required_lines
    assert re.search(worker.pattern, "[2026] Load weight end. elapsed=3s") and not re.search(
        worker.pattern, "Load weight endX"
    )


def test_a_hosts_directories_and_gpu_devices_are_the_plans():
    from tp4.serving import serve

    plan = _plan((EXAMPLE / "profile.toml").read_text())
    svc = plan.nodes[1].service
    assert [d.path for d in svc.directories] == [m.source for m in plan.nodes[1].run.mounts[1:4]] + ["/run/tp4"]
    assert {d.owner for d in svc.directories[:3]} == {plan.nodes[1].ssh.user} and svc.directories[3][1:] == (
        "root",
        "0700",
    )
    assert svc.gpu_devices == ("nvidia.com/gpu=all",)
    assert serve.line_id(plan) == plan.line.id == "10.0.0.1-8888"
