"""The one funnel for subprocesses, local and over ssh.

Every external command tp4 runs goes through :func:`run` or :func:`start`:

* argv is always a list; nothing is ever handed to a local shell;
* a remote command is quoted exactly once (``shlex.join``) and passed to ``ssh`` as one word;
* each command is logged as ``$ <command>`` at debug level with every secret replaced by ``***``;
* secrets travel on stdin or in files, never in argv (callers pass them as ``input=``).
"""

from __future__ import annotations

import logging
import os
import shlex
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from tp4.errors import Tp4Error

log = logging.getLogger("tp4.process")

REDACTED = "***"


@dataclass(frozen=True)
class Remote:
    """A host reached over ssh with key authentication only (BatchMode, no password prompts)."""

    host: str
    user: str | None = None
    identity: str | None = None
    port: int | None = None
    options: tuple[str, ...] = field(default_factory=tuple)
    connect_timeout: int = 15

    @property
    def destination(self) -> str:
        return f"{self.user}@{self.host}" if self.user else self.host

    def ssh_argv(self) -> list[str]:
        argv = [
            "ssh",
            "-o", "BatchMode=yes",
            "-o", "StrictHostKeyChecking=accept-new",
            "-o", f"ConnectTimeout={self.connect_timeout}",
        ]
        if self.identity:
            argv += ["-i", os.path.expanduser(self.identity), "-o", "IdentitiesOnly=yes"]
        if self.port:
            argv += ["-p", str(self.port)]
        for opt in self.options:
            argv += ["-o", opt]
        # `--` ends ssh's options: a destination can never be read as one ("-oProxyCommand=...")
        return argv + ["--", self.destination]


def redact(text: str, secrets: Iterable[str]) -> str:
    for secret in secrets:
        if secret:
            text = text.replace(secret, REDACTED)
    return text


def full_argv(argv: Sequence[str], remote: Remote | None = None,
              env: Mapping[str, str] | None = None) -> list[str]:
    """The argv actually executed: local as given, remote as ``ssh ... -- DEST '<quoted command>'``.

    For a remote command, ``env`` is applied with ``env K=V`` inside the quoted command; never
    pass secrets that way (use ``input=``).
    """
    argv = [str(a) for a in argv]
    if remote is None:
        return argv
    if env:
        argv = ["env", *(f"{k}={v}" for k, v in env.items()), *argv]
    return [*remote.ssh_argv(), shlex.join(argv)]


def _describe(argv: Sequence[str], remote: Remote | None) -> str:
    where = f" on {remote.destination}" if remote else ""
    return f"`{shlex.join(argv)}`{where}"


def run(
    argv: Sequence[str],
    *,
    remote: Remote | None = None,
    check: bool = True,
    capture: bool = True,
    input: str | bytes | None = None,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    timeout: float | None = None,
    secrets: Iterable[str] = (),
    text: bool = True,
) -> subprocess.CompletedProcess:
    """Run one command to completion and return its CompletedProcess.

    With ``check`` a non-zero exit raises :class:`Tp4Error` naming the command (secrets redacted)
    and the tail of its stderr.
    """
    secrets = tuple(s for s in secrets if s)
    cmd = full_argv(argv, remote, env)
    log.debug("$ %s", redact(shlex.join(cmd), secrets))
    local_env = None
    if env and remote is None:
        local_env = {**os.environ, **env}
    if isinstance(input, str) and not text:
        input = input.encode()
    try:
        proc = subprocess.run(
            cmd,
            input=input,
            capture_output=capture,
            env=local_env,
            cwd=cwd,
            timeout=timeout,
            text=text,
            check=False,
        )
    except FileNotFoundError as exc:
        raise Tp4Error(f"`{cmd[0]}` is not installed or not on PATH; install it and retry") from exc
    except subprocess.TimeoutExpired as exc:
        raise Tp4Error(
            f"{redact(_describe(argv, remote), secrets)} did not finish within {timeout:g} s"
        ) from exc
    if check and proc.returncode != 0:
        detail = ""
        if capture and proc.stderr:
            err = proc.stderr if isinstance(proc.stderr, str) else proc.stderr.decode(errors="replace")
            tail = "\n".join(err.strip().splitlines()[-15:])
            detail = "\n" + redact(tail, secrets)
        raise Tp4Error(
            f"{redact(_describe(argv, remote), secrets)} failed with exit code {proc.returncode}{detail}"
        )
    return proc


def start(
    argv: Sequence[str],
    *,
    remote: Remote | None = None,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    secrets: Iterable[str] = (),
    **popen_kwargs,
) -> subprocess.Popen:
    """Start a command without waiting (streams, pipelines); same logging and quoting as run()."""
    secrets = tuple(s for s in secrets if s)
    cmd = full_argv(argv, remote, env)
    log.debug("$ %s", redact(shlex.join(cmd), secrets))
    local_env = {**os.environ, **env} if env and remote is None else None
    try:
        return subprocess.Popen(cmd, env=local_env, cwd=cwd, **popen_kwargs)
    except FileNotFoundError as exc:
        raise Tp4Error(f"`{cmd[0]}` is not installed or not on PATH; install it and retry") from exc
