"""git through GitPython behind tp4.image.sources.gitrepo: logged like the funnel, timed out, stopped on
Ctrl-C, failures named; against real local repositories."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tp4.core.errors import Tp4Error
from tp4.image.sources import fetch, gitrepo, lock

PYTHON = Path(__file__).resolve().parent.parent / "python"


@pytest.fixture
def origin(tmp_path, monkeypatch):
    """A repository with two commits on main; (path, first commit, second commit)."""
    import git

    monkeypatch.setenv("GIT_CONFIG_GLOBAL", "/dev/null")
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    path = tmp_path / "origin"
    repo = git.Repo.init(path, initial_branch="main")
    who = git.Actor("t", "t@e.invalid")
    (path / "a.py").write_text("a = 1\n")
    repo.index.add(["a.py"])
    first = repo.index.commit("one", author=who, committer=who).hexsha
    (path / "a.py").write_text("a = 2\n")
    repo.index.add(["a.py"])
    second = repo.index.commit("two", author=who, committer=who).hexsha
    repo.close()
    return path, first, second


def git_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "tp4.core.process" and r.getMessage().startswith("$ ")]


def test_ls_remote_is_logged_once_like_the_funnel(origin, caplog):
    caplog.set_level(logging.DEBUG)
    path, _, second = origin
    out = gitrepo.ls_remote(str(path), "main")
    assert out.split() == [second, "refs/heads/main"]
    assert git_lines(caplog) == [f"$ git ls-remote -- {path} main"]
    assert not [r for r in caplog.records if r.name.startswith("git")]  # GitPython's own Popen line


def test_resolve_git_and_checkout_give_the_commit_asked_for(origin, tmp_path):
    path, first, second = origin
    assert lock.resolve_git(f"git+file://{path}@main", "main") == second
    dest = tmp_path / "co"
    fetch.git_checkout(f"git+file://{path}@{first}", first, dest)
    assert (dest / "a.py").read_text() == "a = 1\n" and not (dest / ".git").exists()


def test_a_failing_git_command_is_named_with_its_stderr(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(Tp4Error) as err:
        gitrepo.ls_remote(str(missing), "main")
    msg = str(err.value)
    assert msg.startswith(f"`git ls-remote -- {missing} main` failed with exit code 128")
    assert "does not appear to be a git repository" in msg or "not a git repository" in msg.lower()


def test_a_commit_that_is_not_there_names_the_url_and_the_commit(origin, tmp_path):
    path, _, _ = origin
    with pytest.raises(Tp4Error) as err:
        gitrepo.checkout(str(path), "0" * 40, tmp_path / "co")
    msg = str(err.value)
    assert msg.startswith(f"{path} at {'0' * 40}: `git checkout --quiet --detach {'0' * 40} --` failed with exit code")


def test_a_password_in_the_url_never_reaches_the_log_or_the_message(caplog):
    caplog.set_level(logging.DEBUG)
    with pytest.raises(Tp4Error) as err:
        gitrepo.ls_remote("https://someone:hunter2-token@127.0.0.1:1/x.git", "main", timeout=30)
    assert "hunter2" not in str(err.value) and "https://***@127.0.0.1:1/x.git" in str(err.value)
    assert git_lines(caplog) == ["$ git ls-remote -- https://***@127.0.0.1:1/x.git main"]
    assert not [r for r in caplog.records if "hunter2" in r.getMessage()]


def _sleeping(cmdline: str) -> bool:
    for entry in os.listdir("/proc"):
        try:
            raw = open(f"/proc/{entry}/cmdline", "rb").read() if entry.isdigit() else b""
        except OSError:
            continue
        if raw.replace(b"\0", b" ").decode(errors="replace").strip() == cmdline:
            return True
    return False


def test_a_hanging_git_is_stopped_at_its_timeout_with_what_it_started(monkeypatch):
    nap = f"sleep 51.{os.getpid()}"
    monkeypatch.setenv("GIT_SSH_COMMAND", f"{nap};:")  # the transport hangs, as a dead host would
    started = time.monotonic()
    with pytest.raises(Tp4Error, match=r"^`git ls-remote -- ssh://example\.invalid/x main` did not finish within 1 s$"):
        gitrepo.ls_remote("ssh://example.invalid/x", "main", timeout=1)
    assert time.monotonic() - started < 6
    deadline = time.monotonic() + 5
    while _sleeping(nap) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _sleeping(nap)


def test_ctrl_c_during_a_git_lock_stops_git_and_exits_130(tmp_path):
    """`tp4 sources lock` of a git row whose host hangs; SIGINT to tp4 alone."""
    nap = f"sleep 52.{os.getpid()}"
    manifest = tmp_path / "sources.manifest"
    manifest.write_text("g  main  unlocked  git+ssh://example.invalid/x@main\n")
    before = manifest.read_text()
    env = {
        **os.environ,
        "PYTHONPATH": str(PYTHON),
        "GIT_SSH_COMMAND": f"{nap};:",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": "/dev/null",
    }
    tp4 = subprocess.Popen(
        [sys.executable, "-c", "from tp4.cli import main; main()", "sources", "lock", "--manifest", str(manifest)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 20
        while not _sleeping(nap) and time.monotonic() < deadline and tp4.poll() is None:
            time.sleep(0.05)
        assert _sleeping(nap), tp4.stderr.read() if tp4.poll() is not None else "git never started"
        tp4.send_signal(signal.SIGINT)
        _, err = tp4.communicate(timeout=30)
        deadline = time.monotonic() + 5
        while _sleeping(nap) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _sleeping(nap)
    finally:
        if tp4.poll() is None:
            tp4.kill()
    assert tp4.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err
    assert manifest.read_text() == before
