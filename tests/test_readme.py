"""README.md stays true: its two commands, and the profile reference generated from the models."""

from __future__ import annotations

import re
import shutil
import subprocess

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


def test_main_command_works_on_a_copy_of_the_checkout(repo, tmp_path):
    """The README's first command on a fresh copy: a new venv, tp4 installed (not editable), plan printed."""
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
    copy = tmp_path / "checkout"
    for name in filter(None, files):
        src = repo / name
        dst = copy / name
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            dst.symlink_to(src.readlink())
        elif src.is_file():
            shutil.copy2(src, dst)
    proc = subprocess.run(["bash", "-c", MAIN], cwd=copy, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "rank 3 (worker)" in proc.stdout and "RoCEnante ready: world=4" in proc.stdout
    assert not (copy / ".venv/lib/python3.11/site-packages/__editable__.tp4-0.1.0.pth").exists()
    # the installed package (as `nix run` has it) outside any checkout: its own manifest, not a path
    # that exists only in a checkout
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    listing = subprocess.run(
        [str(copy / ".venv/bin/tp4"), "sources", "list"], cwd=outside, capture_output=True, text=True, timeout=60
    )
    assert listing.returncode == 0, listing.stderr
    assert "b12x-main" in listing.stdout and "tree b12x-next" in listing.stdout
    shipped = next((copy / ".venv/lib").glob("python3*/site-packages/tp4/data/sources.manifest"))
    assert not shipped.is_symlink() and shipped.read_text() == (repo / "sources.manifest").read_text()
