"""The `tp4 plan` and `tp4 profile` commands as a user runs them."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tp4.line.plan import SCHEMA

pytestmark = pytest.mark.unit

NODE_KEYS = {"rank", "role", "name", "host", "ssh", "env", "argv", "run", "gid", "service"}
TOP_KEYS = {
    "schema",
    "digest",
    "preset",
    "source",
    "image",
    "line",
    "nodes",
    "boot_lines",
    "forbidden_lines",
    "secrets",
    "warnings",
    "notes",
}


def test_plan_default_is_the_full_production_line(tp4_cli):
    code, out, err = tp4_cli("plan", "--json")
    assert code == 0, err
    plan = json.loads(out)
    assert set(plan) == TOP_KEYS and plan["schema"] == SCHEMA
    assert plan["preset"] == "production" and plan["source"] == "embedded default profile"
    assert [n["rank"] for n in plan["nodes"]] == [0, 1, 2, 3]
    assert [n["host"] for n in plan["nodes"]] == ["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"]
    assert all(set(n) == NODE_KEYS for n in plan["nodes"])
    # DGX OS hosts: docker runs each rank's container, its env in a file beside the checkout
    svc = plan["nodes"][0]["service"]
    assert {k: svc[k] for k in ("kind", "runtime", "unit", "env_file", "mesh_unit", "host_units", "gpu_devices")} == {
        "kind": "plain",
        "runtime": "docker",
        "unit": None,
        "env_file": "/home/zurih/dsv41-4x-spark/dsv41-head.env",
        "mesh_unit": None,
        "host_units": None,
        "gpu_devices": [],
    }
    assert plan["nodes"][1]["service"]["env_file"] == "/home/zurih/dsv41-4x-spark/dsv41-worker.env"
    assert plan["image"]["tag"] == "dsv41-4x-spark:canary-roce"
    assert plan["image"]["base"].endswith("@sha256:3dbc313030a6ef2c5d7de8ecf48e9aece722694a82182cb618cc82b588816349")
    facts = {
        "nnodes": 4,
        "tp": 4,
        "ep": 1,
        "fabric": "switched",
        "dist_init_addr": "10.0.0.1:20000",
        "api": "http://10.0.0.1:8888",
        "id": "10.0.0.1-8888",
        "api_port": 8888,
        "dist_init_port": 20000,
        "ring_hairpin_queue": None,
        "gpu_clock_mhz": 2200,
        "nccl_sha256": None,
    }
    assert {k: plan["line"][k] for k in facts} == facts
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
    bad.write_text(
        good.read_text().replace('preset = "production"', 'preset = "canary"\n[engine]\nep = 1\ncontext_length = 1')
    )
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


@pytest.mark.parametrize(
    "args", [["plan", "--profile", "/nonexistent.toml"], ["profile", "check", "/etc/hostname"], ["plan", "--rank", "x"]]
)
def test_console_script_errors_without_traceback(args):
    proc = subprocess.run([sys.executable, "-m", "tp4", *args], capture_output=True, text=True)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and proc.stderr.strip()


def test_help_lists_commands(tp4_cli):
    code, out, _ = tp4_cli("--help")
    assert code == 0
    for name in ("plan", "profile", "sources", "build", "distribute"):
        assert name in out


def _slots_profile(tmp_path, repo):
    """The default profile with 16 slots and the preset's --min-free-slots-delay dropped: valid, with one warning."""
    text = (repo / "python/tp4/data/default-profile.toml").read_text()
    prof = tmp_path / "slots.toml"
    prof.write_text(text + '\n[engine]\nmax_running_requests = 16\ndrop_args = ["--min-free-slots-delay"]\n')
    return prof


WARNING = "warning: engine.extra_args: max_running_requests = 16 without --min-free-slots-delay 1"


@pytest.mark.parametrize("command", [["plan", "--profile"], ["plan", "--json", "--profile"], ["profile", "check"]])
def test_a_warning_prints_on_stderr_and_does_not_block(tp4_cli, tmp_path, repo, command):
    code, out, err = tp4_cli(*command, _slots_profile(tmp_path, repo))
    assert code == 0, err
    assert [line for line in err.splitlines() if line.startswith("warning:")] == [
        WARNING + ': DSpark\'s admission delayer holds 2-3 slots free; fix: add "--min-free-slots-delay", "1" to '
        "engine.extra_args, or lower engine.max_running_requests below 8"
    ]
    assert "warning:" not in out
    if "--json" in command:
        assert json.loads(out)["warnings"] == [err.strip().removeprefix("warning: ")]


@pytest.mark.parametrize("command", [["plan", "--strict", "--profile"], ["profile", "check", "--strict"]])
def test_strict_makes_warnings_errors(tp4_cli, tmp_path, repo, command):
    code, out, err = tp4_cli(*command, _slots_profile(tmp_path, repo))
    assert code == 2 and out == ""
    assert err.startswith("error: ") and "1 warning(s), errors under --strict" in err
    assert "  - engine.extra_args: max_running_requests = 16" in err


@pytest.mark.parametrize("command", [["plan", "--strict"], ["profile", "check", "--strict"]])
def test_strict_passes_a_profile_without_warnings(tp4_cli, repo, command):
    if command[0] == "profile":
        command = [*command, str(repo / "python/tp4/data/default-profile.toml")]
    code, _, err = tp4_cli(*command)
    assert code == 0 and err == ""


def test_profile_check_of_a_missing_file_suggests_only_what_it_has(tp4_cli, tmp_path):
    code, _, err = tp4_cli("profile", "check", tmp_path / "nope.toml")
    assert code == 2 and "does not exist" in err
    assert "--profile" not in err and "fix: name an existing profile file" in err
    code, _, err = tp4_cli("plan", "--profile", tmp_path / "nope.toml")
    assert code == 2 and "omit --profile" in err


def test_import_of_an_upstream_profile_with_only_warnings_succeeds_and_reports_them(tp4_cli, tmp_path, repo):
    env = tmp_path / ".env.tp4"
    env.write_text((repo / "tests/fixtures/env.tp4.production").read_text().replace(" --min-free-slots-delay 1", ""))
    code, out, err = tp4_cli("profile", "import", env, "-o", tmp_path / "p.toml")
    assert code == 0 and out.startswith("wrote "), err
    # in the terms of the imported file (its line, the .env variables)
    assert "EXTRA_SGLANG_ARGS=" in err and "max_running_requests = 16 without --min-free-slots-delay 1" in err
    assert "fix: add --min-free-slots-delay 1 to EXTRA_SGLANG_ARGS, or lower MAX_RUNNING_REQUESTS below 8" in err
    code, _, err = tp4_cli("profile", "check", "--strict", tmp_path / "p.toml")
    assert code == 2 and "errors under --strict" in err


def test_distribute_strict_refuses_a_profile_with_warnings(tmp_path, repo, capsys):
    """`tp4 distribute --strict` reads its workers from the profile the same way (tp4 build reads none)."""
    from tp4.cli.common import profile_remotes as _nodes
    from tp4.core.errors import InvalidInput

    prof = _slots_profile(tmp_path, repo)
    assert [n.host for n in _nodes((), str(prof), None, None, None, ())] == ["spark2", "spark3", "spark4"]
    assert WARNING in capsys.readouterr().err
    with pytest.raises(InvalidInput) as exc:
        _nodes((), str(prof), None, None, None, (), strict=True)
    assert "errors under --strict" in str(exc.value)


def test_plan_help_names_the_schema_the_output_carries(tp4_cli):
    code, help_text, _ = tp4_cli("plan", "--help")
    code2, out, _ = tp4_cli("plan", "--json")
    assert code == code2 == 0
    schema = json.loads(out)["schema"]
    assert f"schema {schema}," in " ".join(help_text.split())
