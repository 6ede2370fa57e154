"""The `tp4 plan` and `tp4 profile` commands as a user runs them."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tp4.plan import SCHEMA

pytestmark = pytest.mark.unit

NODE_KEYS = {"rank", "role", "name", "host", "ssh", "env", "argv", "run", "gid"}
TOP_KEYS = {"schema", "preset", "source", "image", "line", "nodes", "boot_lines", "forbidden_lines", "secrets", "warnings", "notes"}


def test_plan_default_is_the_full_production_line(tp4_cli):
    code, out, err = tp4_cli("plan", "--json")
    assert code == 0, err
    plan = json.loads(out)
    assert set(plan) == TOP_KEYS and plan["schema"] == SCHEMA
    assert plan["preset"] == "production" and plan["source"] == "embedded default profile"
    assert [n["rank"] for n in plan["nodes"]] == [0, 1, 2, 3]
    assert [n["host"] for n in plan["nodes"]] == ["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"]
    assert all(set(n) == NODE_KEYS for n in plan["nodes"])
    assert plan["image"]["tag"] == "dsv41-4x-spark:canary-roce"
    assert plan["image"]["base"].endswith("@sha256:3dbc313030a6ef2c5d7de8ecf48e9aece722694a82182cb618cc82b588816349")
    assert plan["line"] == {"nnodes": 4, "tp": 4, "ep": 1, "fabric": "switched", "dist_init_addr": "10.0.0.1:20000", "api": "http://10.0.0.1:8888"}
    assert sum(b["required"] for b in plan["boot_lines"]) == 12


def test_plan_human_view_and_one_rank(tp4_cli):
    code, out, _ = tp4_cli("plan")
    assert code == 0
    for rank in range(4):
        assert f"rank {rank} (" in out
    assert "boot lines that must appear" in out and "RoCEnante ready: world=4" in out
    code, out, _ = tp4_cli("plan", "--rank", "2")
    assert code == 0 and "rank 2 (worker) spark3" in out and "rank 1 (" not in out
    code, out, _ = tp4_cli("plan", "--rank", "3", "--json")
    assert [n["rank"] for n in json.loads(out)["nodes"]] == [3]


def test_plan_rank_out_of_range(tp4_cli):
    code, _, err = tp4_cli("plan", "--rank", "7")
    assert code == 2 and "ranks 0..3" in err


def test_profile_check_ok_and_bad(tp4_cli, tmp_path, repo):
    good = tmp_path / "good.toml"
    good.write_text((repo / "python/tp4/data/default-profile.toml").read_text())
    code, out, _ = tp4_cli("profile", "check", good)
    assert code == 0 and out.startswith("ok:")
    bad = tmp_path / "bad.toml"
    bad.write_text(good.read_text().replace('preset = "production"', 'preset = "canary"\n[engine]\nep = 1\ncontext_length = 1'))
    code, out, err = tp4_cli("profile", "check", bad)
    assert code == 2
    assert "engine.ep:" in err and "engine.context_length:" in err and "fix:" in err


def test_unknown_preset_suggests(tp4_cli, tmp_path):
    p = tmp_path / "p.toml"
    p.write_text('preset = "productoin"\n')
    code, _, err = tp4_cli("profile", "check", p)
    assert code == 2 and "did you mean 'production'" in err
    code, _, err = tp4_cli("profile", "show-preset", "nope")
    assert code == 2 and "unknown preset" in err


def test_show_preset(tp4_cli):
    code, out, _ = tp4_cli("profile", "show-preset", "production")
    assert code == 0 and 'extends = "canary-roce"' in out and "DSV41_MOE_B12X_NEXT" in out
    code, out, _ = tp4_cli("profile", "show-preset", "production", "--merged")
    assert code == 0 and "launcher-defaults <- base <- canary <- canary-roce <- production" in out
    assert 'SGLANG_RUST_BUILD_MODE = "never"' in out


def test_api_key_file_is_referenced_never_read_into_the_plan(tp4_cli, tmp_path, repo):
    key = tmp_path / "api-key"
    key.write_text("sk-top-secret-123\n")
    prof = tmp_path / "p.toml"
    prof.write_text((repo / "python/tp4/data/default-profile.toml").read_text() + f'\n[api]\nkey_file = "{key}"\n')
    code, out, _ = tp4_cli("plan", "--profile", prof, "--json")
    plan = json.loads(out)
    assert code == 0 and plan["secrets"] == {"API_KEY": {"file": str(key)}}
    assert "sk-top-secret" not in out and "API_KEY" not in plan["nodes"][0]["env"]
    assert "--api-key" not in plan["nodes"][0]["argv"]
    code, out, _ = tp4_cli("plan", "--profile", prof)
    assert "sk-top-secret" not in out and "never shown" in out


@pytest.mark.parametrize("args", [["plan", "--profile", "/nonexistent.toml"], ["profile", "check", "/etc/hostname"], ["plan", "--rank", "x"]])
def test_console_script_errors_without_traceback(args):
    proc = subprocess.run([sys.executable, "-m", "tp4", *args], capture_output=True, text=True)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and proc.stderr.strip()


def test_help_lists_commands(tp4_cli):
    code, out, _ = tp4_cli("--help")
    assert code == 0
    for name in ("plan", "profile", "sources", "build", "distribute"):
        assert name in out
