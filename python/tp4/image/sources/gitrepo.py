"""git, through GitPython, run the way :mod:`tp4.core.process` runs every other command.

Each call (in its own process group, like the funnel's children) is logged once as ``$ git …`` on the funnel's logger (a URL's user and password shown as
``***``), has a timeout, is stopped on Ctrl-C like the funnel's children, and a failure is a
:class:`Tp4Error` naming the command and the tail of git's stderr. git never prompts (a URL that
wants a password fails at once instead of waiting for input nobody gives).

GitPython is imported on the first call, so ``python -m tp4.image.sources`` runs without it where no
git row is fetched (the Nix tree builds).
"""

from __future__ import annotations

import logging
import re
import shlex
from collections.abc import Sequence
from pathlib import Path

from tp4.core import process
from tp4.core.errors import Tp4Error

# seconds: asking a remote for its refs is quick; a clone moves a whole history
LS_REMOTE_TIMEOUT = 120.0
CLONE_TIMEOUT = 1800.0

_USERINFO = re.compile(r"(?<=://)[^/@\s]+@")


def redact_url(text: str) -> str:
    """``https://user:token@host/…`` -> ``https://***@host/…``."""
    return _USERINFO.sub(f"{process.REDACTED}@", text)


def git(args: Sequence[str], *, cwd: Path | None = None, timeout: float) -> str:
    """Run ``git <args>`` (in ``cwd``) to completion; its stdout."""
    try:
        import git as gitpython
    except ImportError as exc:
        raise Tp4Error("git rows need GitPython (pip install gitpython)") from exc
    # GitPython's own debug line (`Popen(...)`) would repeat the `$ git …` line under `tp4 -v`
    logging.getLogger("git").setLevel(logging.INFO)
    shown = redact_url(shlex.join(["git", *args]))
    process.log.debug("$ %s", shown + (f"    # in {cwd}" if cwd else ""))
    runner = gitpython.Git(str(cwd) if cwd else None)
    try:
        handle = runner.execute(
            [gitpython.Git.GIT_PYTHON_GIT_EXECUTABLE or "git", *args],
            as_process=True,
            env={"GIT_TERMINAL_PROMPT": "0"},
            process_group=0,
        )
    except gitpython.GitCommandNotFound as exc:
        raise Tp4Error("`git` is not installed or not on PATH; install it and retry") from exc
    popen = handle.proc
    if popen is None:  # GitPython clears it only once it has waited for the process itself
        raise Tp4Error(f"`{shown}`: GitPython returned no process to wait for")
    try:
        done = process.wait_for(popen, f"`{shown}`", timeout=timeout)
    finally:
        handle.proc = None  # waited for here: GitPython must not kill or wait for it again
    out = done.stdout
    return out.decode(errors="replace") if isinstance(out, bytes) else out or ""


def ls_remote(url: str, ref: str, *, timeout: float = LS_REMOTE_TIMEOUT) -> str:
    """``git ls-remote`` of ``ref`` at ``url``: its ``<sha>\\t<name>`` lines."""
    return git(["ls-remote", "--", url, ref], timeout=timeout)


def checkout(url: str, commit: str, dest: Path, *, timeout: float = CLONE_TIMEOUT) -> None:
    """Clone ``url`` into ``dest`` and check out ``commit`` (detached)."""
    git(["clone", "--quiet", "--no-checkout", "--", url, str(dest)], timeout=timeout)
    try:
        git(["checkout", "--quiet", "--detach", commit, "--"], cwd=dest, timeout=timeout)
    except Tp4Error as exc:
        raise Tp4Error(f"{redact_url(url)} at {commit}: {exc}") from None
