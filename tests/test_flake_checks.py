"""The cheap checks of pkgs/checks.nix: checks.unit builds for real, as Nix runs it.

checks.unit is built from pkgs/checks.nix with tests/host-pkgs.nix for nixpkgs (busybox sh as
runCommand, the test's Python), in a network namespace with only loopback, and with nothing on
PATH but that Python and what stdenv would add (bash, GNU patch) plus git: so a test marked
`unit` that calls nix, ssh, podman or ip, or reaches past loopback, fails it here as it would in
the Nix sandbox.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

from nix_env import busybox_dir, nix_config
from tp4.core import process

REPO = Path(__file__).resolve().parent.parent
MARK = re.compile(r"^pytestmark = pytest.mark.unit$", re.M)


def host_tools(dest: Path) -> Path:
    """bin/ with links to the host's bash, GNU patch and git, and nothing else."""
    (dest / "bin").mkdir(parents=True)
    for tool in ("bash", "patch", "git"):
        found = shutil.which(tool)
        assert found, f"{tool} is not installed: run bash tests/run (python/setup.sh --test installs it)"
        (dest / "bin" / tool).symlink_to(found)
    return dest


def unit_check(tmp: Path) -> str:
    venv = Path(sys.executable).parent.parent
    bb = busybox_dir(tmp / "bb")
    tools = host_tools(tmp / "tools")
    return f"""
      let
        pkgs = import {REPO}/tests/host-pkgs.nix {{
          busybox = {bb};
          python = "{venv}";
          stdenvPath = [ "{tools}" ];
          extra.git = "{tools}";
        }};
        checks = import {REPO}/pkgs/checks.nix {{
          inherit pkgs;
          src = import {REPO}/pkgs/src.nix {{ root = {REPO}; }};
          python = "{venv}";
          outputs = {{ }};
        }};
      in
      checks.unit"""


def test_unit_check_passes_with_loopback_only_and_no_nix(tmp_path):
    build = [
        "nix-build",
        "--no-out-link",
        "--option",
        "sandbox",
        "false",
        "--option",
        "build-users-group",
        "",
        "-E",
        unit_check(tmp_path),
    ]
    # a fresh network namespace has only `lo`, and it is down until brought up (as the sandbox does)
    proc = process.run(
        ["unshare", "--net", "sh", "-c", 'ip link set lo up && exec "$@"', "sh", *build],
        env={"NIX_CONFIG": nix_config(tmp_path / "nix")},
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    log = process.run(
        ["nix", "log", proc.stdout.strip().splitlines()[-1]],
        env={"NIX_CONFIG": nix_config(tmp_path / "nix")},
        check=False,
    ).stdout
    counts = re.search(r"(\d+) passed", log)
    assert counts and int(counts.group(1)) > 100, log[-2000:]
    assert "skipped" not in log and "deselected" not in log, log[-2000:]


def test_the_check_runs_every_unit_test():
    """The modules checks.unit collects (those that mark themselves) hold every test marked unit."""
    marked = sorted(p.name for p in (REPO / "tests").glob("test_*.py") if MARK.search(p.read_text()))
    assert "test_plan_golden.py" in marked and "test_sources_nar.py" not in marked
    listed = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-m", "unit", "tests"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert listed.returncode == 0, listed.stdout[-2000:] + listed.stderr[-2000:]
    collected = sorted(
        {line.split("::")[0].removeprefix("tests/") for line in listed.stdout.splitlines() if "::" in line}
    )
    assert collected == marked
