"""README.md stays true: its two commands, and the profile reference generated from the models."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import zipfile
from pathlib import Path

from tp4.line.profile.reference import BEGIN, END, generate

MAIN = "bash python/setup.sh && .venv/bin/tp4 plan"
TESTS = "bash tests/run"


def test_readme_states_the_two_commands_and_ci_runs_the_test_command(repo):
    readme = (repo / "README.md").read_text()
    assert MAIN in readme and TESTS in readme
    assert re.search(r"^exec bash tests/run$", (repo / ".ci/run").read_text(), re.M)


def test_profile_reference_is_generated(repo):
    readme = (repo / "README.md").read_text()
    section = readme[readme.index(BEGIN) : readme.index(END) + len(END)]
    assert section == generate(), "README's profile reference is stale: regenerate it with `tp4 profile reference`"


def _copy_checkout(repo: Path, copy: Path) -> None:
    files = (
        subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=repo,
            capture_output=True,
            check=True,
        )
        .stdout.decode()
        .split("\0")
    )
    for name in filter(None, files):
        src = repo / name
        dst = copy / name
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            dst.symlink_to(src.readlink())
        elif src.is_file():
            shutil.copy2(src, dst)


def test_main_command_works_on_a_copy_of_the_checkout(repo, tmp_path):
    """The README's first command on a fresh copy: a new venv, tp4 installed editable from the
    copy, plan printed; an edit of the copy's adapters/registry.toml or of a preset reaches the
    next command, as the README says. The wheel still carries its own data."""
    copy = tmp_path / "checkout"
    _copy_checkout(repo, copy)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TP4_PROFILE")}
    proc = subprocess.run(["bash", "-c", MAIN], cwd=copy, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "rank 3 (worker)" in proc.stdout and "RoCEnante ready: world=4" in proc.stdout
    tp4 = str(copy / ".venv/bin/tp4")
    where = subprocess.run(
        [str(copy / ".venv/bin/python"), "-c", "import tp4; print(tp4.__file__)"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert where.stdout.strip() == str(copy / "python/tp4/__init__.py"), "not an editable install of the checkout"
    # edits in the checkout reach the CLI: the registry (through adapters/registry.toml) and a preset
    registry = copy / "adapters/registry.toml"
    text = registry.read_text()
    assert "RoCEnante ready: world={TP_SIZE}" in text
    registry.write_text(text.replace("RoCEnante ready: world={TP_SIZE}", "RoCEnante edited: world={TP_SIZE}"))
    preset = copy / "python/tp4/data/presets/production.toml"
    assert 'DSV41_DRAFT_TAU = "0.7"' in preset.read_text()
    preset.write_text(preset.read_text().replace('DSV41_DRAFT_TAU = "0.7"', 'DSV41_DRAFT_TAU = "0.6"'))
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    plan = subprocess.run([tp4, "plan"], cwd=outside, env=env, capture_output=True, text=True, timeout=60)
    assert plan.returncode == 0, plan.stderr
    assert "RoCEnante edited: world=4" in plan.stdout and "RoCEnante ready" not in plan.stdout
    assert "DSV41_DRAFT_TAU=0.6" in plan.stdout and "DSV41_DRAFT_TAU=0.7" not in plan.stdout
    listing = subprocess.run([tp4, "sources", "list"], cwd=outside, env=env, capture_output=True, text=True, timeout=60)
    assert listing.returncode == 0, listing.stderr
    assert "b12x-main" in listing.stdout and "tree b12x-next" in listing.stdout
    # the wheel (what `nix run` and a pip install of the package have) carries its own data, not links
    # into a checkout
    dist = tmp_path / "dist"
    wheel = subprocess.run(
        [str(copy / ".venv/bin/pip"), "wheel", "-q", "--no-deps", "-w", str(dist), str(repo / "python")],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert wheel.returncode == 0, wheel.stderr[-2000:]
    with zipfile.ZipFile(next(dist.glob("tp4-*.whl"))) as whl:
        names = set(whl.namelist())
        assert {"tp4/data/registry.toml", "tp4/data/presets/production.toml"} <= names
        assert whl.read("tp4/data/sources.manifest").decode() == (repo / "sources.manifest").read_text()
