"""One rule for which profile a command uses (python/tp4/cli/common.py): --profile FILE, else
$TP4_PROFILE, else ./profile.toml when it exists, else the embedded example; a command that acts
on hosts or a line says `profile: PATH (plan DIGEST)` on stderr before it acts. The commands run
as a user runs them (a subprocess in a directory holding a profile.toml); the host-acting one is
`tp4 smoke` against a closed port on 127.0.0.1 (it says which profile, then fails to connect)."""

from __future__ import annotations

import ast
import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import click
import pytest

from tp4.cli import SUBCOMMANDS, cli
from tp4.cli.common import CommonOption

REPO = Path(__file__).resolve().parent.parent
DEFAULT = REPO / "python/tp4/data/default-profile.toml"


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def profile_text(port: int) -> str:
    """The embedded example with its head (and workers) on 127.0.0.x and the API on ``port``: a
    head that differs from the example's 10.0.0.1:8888."""
    text = DEFAULT.read_text().replace("10.0.0.", "127.0.0.")
    return text.replace("[cluster]\n", f"[cluster]\nport = {port}\n", 1)


def tp4(cwd: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k != "TP4_PROFILE"}
    return subprocess.run(
        [sys.executable, "-m", "tp4", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        env={**base, "PYTHONPATH": str(REPO / "python"), **(env or {})},
    )


def planned(cwd: Path, *args: str, env: dict[str, str] | None = None) -> dict:
    proc = tp4(cwd, "plan", "--json", *args, env=env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture
def here(tmp_path: Path) -> tuple[Path, int]:
    """A directory holding a profile.toml whose head is not the example's."""
    port = closed_port()
    (tmp_path / "profile.toml").write_text(profile_text(port))
    return tmp_path, port


def test_plan_and_a_host_acting_command_use_the_profile_in_the_directory(here: tuple[Path, int]) -> None:
    cwd, port = here
    text = tp4(cwd, "plan")
    assert text.returncode == 0, text.stderr
    doc = planned(cwd)
    assert f"api: http://127.0.0.1:{port}" in text.stdout and doc["line"]["api"] == f"http://127.0.0.1:{port}"
    assert f"digest: {doc['digest']}" in text.stdout and doc["source"] == "profile.toml"
    assert "profile:" not in text.stderr  # tp4 plan acts on nothing: it prints the plan itself
    smoke = tp4(cwd, "smoke")
    assert smoke.returncode == 1
    first = smoke.stderr.splitlines()[0]
    assert first == f"profile: profile.toml (plan {doc['digest']})"  # said before it acts
    assert f"127.0.0.1:{port}" in smoke.stdout + smoke.stderr and "10.0.0.1" not in smoke.stdout + smoke.stderr
    assert "profile:" not in smoke.stdout


def test_tp4_profile_wins_over_the_directory_and_profile_wins_over_both(
    here: tuple[Path, int], tmp_path_factory
) -> None:
    cwd, port = here
    other_port, third_port = closed_port(), closed_port()
    other = tmp_path_factory.mktemp("env") / "line.toml"
    other.write_text(profile_text(other_port))
    third = tmp_path_factory.mktemp("opt") / "line.toml"
    third.write_text(profile_text(third_port))
    env = {"TP4_PROFILE": str(other)}
    assert planned(cwd, env=env)["line"]["api"] == f"http://127.0.0.1:{other_port}"
    smoke = tp4(cwd, "smoke", env=env)
    assert smoke.stderr.splitlines()[0] == f"profile: {other} (plan {planned(cwd, env=env)['digest']})"
    assert planned(cwd, "--profile", str(third), env=env)["line"]["api"] == f"http://127.0.0.1:{third_port}"
    smoke = tp4(cwd, "smoke", "--profile", str(third), env=env)
    assert smoke.stderr.splitlines()[0].startswith(f"profile: {third} (plan sha256:")
    assert f"127.0.0.1:{third_port}" in smoke.stdout + smoke.stderr


def test_without_any_the_embedded_example_is_used(tmp_path: Path) -> None:
    doc = planned(tmp_path)
    assert doc["line"]["api"] == "http://10.0.0.1:8888" and doc["source"] == "embedded default profile"


@pytest.mark.parametrize("command", [("plan",), ("smoke",), ("doctor",), ("status", "--json"), ("download",)])
def test_a_bad_tp4_profile_is_a_user_error_naming_it(tmp_path: Path, command: tuple[str, ...]) -> None:
    (tmp_path / "profile.toml").write_text(profile_text(closed_port()))  # never a silent fallback to it
    missing = tmp_path / "nope.toml"
    proc = tp4(tmp_path, *command, env={"TP4_PROFILE": str(missing)})
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith(
        f"error: TP4_PROFILE={missing}: does not exist; fix: point TP4_PROFILE at a profile file"
    )
    assert "Traceback" not in proc.stderr
    proc = tp4(tmp_path, *command, env={"TP4_PROFILE": str(tmp_path)})
    assert proc.returncode == 2 and f"TP4_PROFILE={tmp_path}: is a directory" in proc.stderr


# --- every command follows the rule ---------------------------------------------------------------


def commands() -> Iterator[tuple[str, click.Command]]:
    """Every tp4 command and subcommand, by its full name."""
    ctx = click.Context(cli)

    def walk(name: str, command: click.Command) -> Iterator[tuple[str, click.Command]]:
        yield name, command
        if isinstance(command, click.Group):
            for sub in command.list_commands(ctx):
                child = command.get_command(ctx, sub)
                assert child is not None, f"{name} {sub}"
                yield from walk(f"{name} {sub}", child)

    for name in SUBCOMMANDS:
        command = cli.get_command(ctx, name)
        assert command is not None
        yield from walk(name, command)


def test_every_command_that_takes_a_profile_takes_the_common_option() -> None:
    seen = []
    for name, command in commands():
        for param in command.params:
            opts = set(getattr(param, "opts", ())) | set(getattr(param, "secondary_opts", ()))
            if param.name == "profile_path" or "--profile" in opts or "-p" in opts:
                assert isinstance(param, CommonOption) and param.common == "profile", f"tp4 {name}: its own --profile"
                seen.append(name)
                shared = {p.name: p for p in command.params}
                for flag, common in (("strict", "strict"), ("ssh_options", "ssh")):
                    if flag in shared:
                        assert isinstance(shared[flag], CommonOption) and shared[flag].common == common, (
                            f"tp4 {name}: --{flag}"
                        )
            if "--ssh-option" in opts:
                assert isinstance(param, CommonOption) and param.common == "ssh", f"tp4 {name}: its own --ssh-option"
    # the commands that act on a line or its hosts, all of them
    assert {
        "plan",
        "serve",
        "stop",
        "status",
        "logs",
        "smoke",
        "doctor",
        "deploy",
        "share",
        "pack",
        "prepare",
        "download",
        "distribute",
        "images",
        "hosts trust",
        "bench decode",
        "bench prefill",
        "bench needle",
        "qeval",
    } <= set(seen)


def test_the_cli_modules_resolve_no_profile_themselves_and_import_no_private_names() -> None:
    """Only cli/common.py loads a profile by path (cli/profile.py checks the FILE it is given), and
    a CLI module imports from another only cli.common's names."""
    for path in sorted((REPO / "python/tp4/cli").glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tp4.cli."):
                assert node.module == "tp4.cli.common", f"{path.name} imports from {node.module}"
            if (
                isinstance(node, ast.ImportFrom)
                and node.module in ("tp4.line.profile", "tp4.line.profile.load")
                and path.name not in ("common.py", "profile.py")
            ):
                names = {a.name for a in node.names}
                assert not names & {"load_file", "load_default"}, f"{path.name} loads a profile itself"
            if isinstance(node, ast.Constant) and node.value == "profile.toml":
                assert path.name == "common.py", f"{path.name} names profile.toml itself"
