"""The one funnel for subprocesses, local and over ssh.

Every external command tp4 runs goes through :func:`run`, :func:`pipe` or :func:`start`:

* argv is always a list; nothing is ever handed to a local shell;
* a remote command is quoted exactly once (``shlex.join``) and passed to ``ssh`` as one word;
* each command is logged once as ``$ <command>`` (debug level, or on ``echo`` when the caller
  shows it as progress) with every secret replaced by ``***``; a pipe as ``$ a | b``;
* secrets travel on stdin or in files, never in argv (callers pass them as ``input=``);
* Ctrl-C, a timeout or a failing pipe stage stops the children: local ones with SIGTERM (SIGKILL
  after a grace period) to their process group (each child leads its own, so what it started
  goes too; its stdin is never the terminal's), remote ones by their process group over a
  second ssh (below).

Remote children. ssh without a tty does not pass a signal on: when the local ssh dies, the remote
command keeps running until it next writes or reads its stdin (a `sleep`, a build, a container
never does). So every remote command runs under a small ``sh`` wrapper that writes its process
group (sshd starts each session in a new one) to ``/tmp/tp4-<random>.pid`` and removes it when
the command ends; stopping the command kills that group over a second ssh. The log shows the
command without the wrapper, so that the ``$ ssh …`` line can be replayed as it is.

:func:`on_interrupt` (the CLI's handler of SIGINT, SIGTERM and SIGHUP calls it) stops every child
still running, from any thread, before ``KeyboardInterrupt`` reaches the code waiting on them;
without it (``python -m tp4.image.sources``) a KeyboardInterrupt in the main thread still stops the
child it was waiting for. As the children are in
their own process groups, a terminal's Ctrl-C reaches only tp4, which stops them itself.

ssh. Every ssh tp4 starts comes from :meth:`Remote.ssh_argv`: key authentication only
(``BatchMode``), host keys checked strictly against tp4's own known_hosts
(:mod:`tp4.core.knownhosts`; neither the user's nor the system's file can vouch for a host), and one
connection per host reused by the commands that follow (``ControlMaster=auto``, its socket in a
private directory, kept :data:`CONTROL_PERSIST` seconds after the last command). A host whose
key tp4 does not know is refused before ssh runs; a refusal by ssh (unknown or changed key) is a
:class:`~tp4.core.errors.HostKeyError` naming the host and the `tp4 hosts trust` that fixes it, also
for ``check=False``, and is remembered (:data:`host_key_failures`) so that the CLI exits 2 with
that message even when a caller reported the node as failed and went on.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shlex
import signal
import stat
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import IO, Any, AnyStr, Literal, overload

from tp4.core.errors import HostKeyError, Tp4Error
from tp4.core.pidfile import SAME_SH, START_SH

log = logging.getLogger("tp4.core.process")

REDACTED = "***"

Echo = Callable[[str], None]

# what callers of start() hand to Popen; re-exported so that no other module imports subprocess
PIPE = subprocess.PIPE
DEVNULL = subprocess.DEVNULL
STDOUT = subprocess.STDOUT
Popen = subprocess.Popen
CompletedProcess = subprocess.CompletedProcess
TimeoutExpired = subprocess.TimeoutExpired

# seconds a child gets between SIGTERM and SIGKILL; a remote cleanup's ssh gets CLEANUP_TIMEOUT
GRACE = 2.0
CLEANUP_TIMEOUT = 15.0

# writes the session's process group to $1, runs the command, removes $1 (see the module doc)
# A signal trapped here reaches the command too (the kill is to the whole group), and the shell
# runs the trap only once the command has ended, so it reaps the command before it exits: a
# command whose shell died first would stay a zombie in the group until the host's init reaps
# it, and the kill below would wait out its grace for it (a container's or sandbox's pid 1 may
# take seconds).
# The file holds the group's leader (its id is the group's) and the leader's start time: the kill
# signals the group only while its leader is still that process, with the file's name in its
# command line (tp4.core.pidfile.SAME_SH), never a group whose id was reused.
_REMOTE_WRAPPER = (
    "f=$1; shift; (umask 077; set -C; read -r _ _ _ _ g _ < /proc/$$/stat && "
    f's=$(set -- "$g"; {START_SH}) && echo "$g $s" > "$f") 2>/dev/null; '
    "trap 'rm -f \"$f\"; exit 129' HUP; trap 'rm -f \"$f\"; exit 130' INT; trap 'rm -f \"$f\"; exit 143' TERM; "
    '"$@"; s=$?; rm -f "$f"; exit $s'
)
# kills the process group named in $1: SIGTERM, then SIGKILL after GRACE seconds
_REMOTE_KILL = (
    'f=$1; n=0; while [ ! -f "$f" ] && [ $n -lt 20 ]; do sleep 0.05; n=$((n+1)); done; '  # just started
    '[ -f "$f" ] && [ -O "$f" ] || exit 0; read -r g t < "$f"; rm -f "$f"; '
    + SAME_SH
    + 'same "$g" "$t" -qF "$f" || exit 0; '
    f"kill -TERM -$g 2>/dev/null; n=0; while kill -0 -$g 2>/dev/null && [ $n -lt {int(GRACE * 20)} ]; "
    "do sleep 0.05; n=$((n+1)); done; kill -KILL -$g 2>/dev/null; exit 0"
)


# seconds an idle shared ssh connection stays open after its last command (`tp4 status`, then
# `tp4 logs`, reuse it); short, so that a forgotten host is not reachable through it for long
CONTROL_PERSIST = 60
# the longest Unix socket path (sun_path is 108 bytes on Linux, 104 on the BSDs), with room for
# ssh's temporary suffix while it binds
_SOCKET_PATH_MAX = 100
_CONTROL_NAME_LEN = 40  # %C: a SHA1 in hex


def _ssh_path(path: str, what: str) -> str:
    """A path as the value of an ssh ``-o`` option: ``%`` doubled (ssh expands %-tokens in these),
    quoted when it has a space; a quote or a control character cannot be passed at all."""
    if any(c in path for c in "\"'") or any(ord(c) < 0x20 for c in path):
        raise Tp4Error(
            f"{what} {path!r}: ssh cannot take a path with quotes or control characters; fix: use another directory"
        )
    path = path.replace("%", "%%")
    return f'"{path}"' if any(c.isspace() for c in path) else path


_private_dirs: set[str] = set()


def control_dir() -> Path:
    """The private directory (mode 0700, owned by this user) of the ssh control sockets:
    ``$XDG_RUNTIME_DIR/tp4-ssh`` when that path is short enough for a socket, else
    ``/tmp/tp4-ssh-<uid>``. One owned by someone else, or not a directory, is refused."""
    from tp4.core import dirs  # not at import: tp4.image.sources (pkgs/src.nix) runs without them

    uid = os.getuid()
    runtime = dirs.runtime_base() / "tp4-ssh"
    fits = len(os.fsencode(str(runtime))) + 1 + _CONTROL_NAME_LEN <= _SOCKET_PATH_MAX
    path = runtime if fits and str(runtime) != "/tmp/tp4-ssh" else Path(f"/tmp/tp4-ssh-{uid}")
    key = str(path)
    if key in _private_dirs:
        return path
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        raise Tp4Error(
            f"cannot create {path} for tp4's ssh connections: {exc.strerror}; "
            "fix: set XDG_RUNTIME_DIR to a private, writable directory"
        ) from None
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != uid:
        raise Tp4Error(
            f"{path} (where tp4 keeps its ssh connections) is not a directory of yours; "
            "fix: remove it, or set XDG_RUNTIME_DIR to a private directory"
        )
    if stat.S_IMODE(st.st_mode) != 0o700:
        os.chmod(path, 0o700)
    _private_dirs.add(key)
    return path


@dataclass(frozen=True)
class Remote:
    """A host reached over ssh with key authentication only (BatchMode, no password prompts),
    its host key checked against tp4's known_hosts (module doc)."""

    host: str
    user: str | None = None
    identity: str | None = None
    port: int | None = None
    options: tuple[str, ...] = field(default_factory=tuple)
    connect_timeout: int = 15
    # False: a connection of its own, not the shared one; for a command whose forwarding must end
    # with it (a forward asked through the shared connection stays open as long as that does)
    share_connection: bool = True

    @property
    def destination(self) -> str:
        return f"{self.user}@{self.host}" if self.user else self.host

    def ssh_argv(self) -> list[str]:
        from tp4.core import knownhosts  # not at import: tp4.image.sources (pkgs/src.nix) runs without them

        # ssh takes the first value given for an option: these come before self.options, so an
        # extra option (--ssh-option) can add to them but not loosen the host key checking
        argv = [
            "ssh",
            "-o",
            "BatchMode=yes",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            f"UserKnownHostsFile={_ssh_path(str(knownhosts.path().absolute()), 'tp4 known_hosts')}",
            "-o",
            "GlobalKnownHostsFile=/dev/null",
            "-o",
            "UpdateHostKeys=no",
            "-o",
            "CheckHostIP=no",
            "-o",
            f"ConnectTimeout={self.connect_timeout}",
        ]
        if self.share_connection:
            argv += [
                "-o",
                "ControlMaster=auto",
                "-o",
                f"ControlPath={_ssh_path(str(control_dir()), 'the ssh control directory')}/%C",
                "-o",
                f"ControlPersist={CONTROL_PERSIST}",
            ]
        else:
            argv += ["-o", "ControlMaster=no", "-o", "ControlPath=none"]
        if self.identity:
            argv += ["-i", os.path.expanduser(self.identity), "-o", "IdentitiesOnly=yes"]
        if self.port:
            argv += ["-p", str(self.port)]
        for opt in self.options:
            argv += ["-o", opt]
        # `--` ends ssh's options: a destination can never be read as one ("-oProxyCommand=...")
        return argv + ["--", self.destination]


@dataclass(frozen=True)
class Step:
    """One command of a :func:`pipe`: argv, run locally or on ``remote``."""

    argv: Sequence[str]
    remote: Remote | None = None
    env: Mapping[str, str] | None = None


def redact(text: str, secrets: Iterable[str]) -> str:
    for secret in secrets:
        if secret:
            text = text.replace(secret, REDACTED)
    return text


def _remote_command(argv: Sequence[str], env: Mapping[str, str] | None) -> list[str]:
    argv = [str(a) for a in argv]
    return ["env", *(f"{k}={v}" for k, v in env.items()), *argv] if env else argv


def full_argv(argv: Sequence[str], remote: Remote | None = None, env: Mapping[str, str] | None = None) -> list[str]:
    """The command as logged: local as given, remote as ``ssh ... -- DEST '<quoted command>'``.

    For a remote command, ``env`` is applied with ``env K=V`` inside the quoted command; never
    pass secrets that way (use ``input=``). What runs adds the cleanup wrapper (module doc).
    """
    if remote is None:
        return [str(a) for a in argv]
    return [*remote.ssh_argv(), shlex.join(_remote_command(argv, env))]


def _describe(argv: Sequence[str], remote: Remote | None) -> str:
    where = f" on {remote.destination}" if remote else ""
    return f"`{shlex.join([str(a) for a in argv])}`{where}"


# --- host keys ------------------------------------------------------------------------------------

# the host-key refusals of this run, by known_hosts name; the CLI exits 2 with them (module doc)
host_key_failures: dict[str, HostKeyError] = {}


@dataclass(frozen=True)
class Endpoint:
    """Where ssh really connects for a Remote (after the user's ssh configuration) and the name
    it looks the host key up by in known_hosts."""

    hostname: str
    port: int
    key_name: str  # HostKeyAlias, else hostname; as ``[name]:port`` for a port other than 22


_endpoints: dict[Remote, Endpoint] = {}


def endpoint(remote: Remote) -> Endpoint:
    """The remote's :class:`Endpoint`, from `ssh -G` (once per remote in a run)."""
    from tp4.core import knownhosts  # not at import: tp4.image.sources (pkgs/src.nix) runs without them

    found = _endpoints.get(remote)
    if found is not None:
        return found
    argv = [*remote.ssh_argv()[:-2], "-G", "--", remote.destination]
    log.debug("$ %s", shlex.join(argv))
    settings: dict[str, str] = {}
    try:
        proc = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=10, check=False)
        if proc.returncode == 0:
            settings = dict(line.split(" ", 1) for line in proc.stdout.splitlines() if " " in line)
    except (OSError, subprocess.TimeoutExpired):
        pass
    hostname = settings.get("hostname", remote.host)
    text = settings.get("port", "")
    port = int(text) if text.isdigit() else remote.port or 22
    alias = settings.get("hostkeyalias", "none")
    found = Endpoint(hostname, port, knownhosts.host_name(alias if alias != "none" else hostname, port))
    _endpoints[remote] = found
    return found


def key_name(remote: Remote) -> str:
    """The name ssh looks the remote's host key up by (:class:`Endpoint`)."""
    return endpoint(remote).key_name


def trust_command(remote: Remote, *, replace: bool = False) -> str:
    """The `tp4 hosts trust` that records this remote's key."""
    argv = ["tp4", "hosts", "trust", *(["--replace"] if replace else []), "--host", remote.host]
    return shlex.join(argv + (["--port", str(remote.port)] if remote.port and remote.port != 22 else []))


def _refused(remote: Remote, name: str, *, changed: bool) -> HostKeyError:
    from tp4.core import knownhosts  # not at import: tp4.image.sources (pkgs/src.nix) runs without them

    file = knownhosts.path()
    if changed:
        error = HostKeyError(
            f"the host key of {name} changed: ssh was offered another key than the one tp4 recorded in {file} "
            f"(REMOTE HOST IDENTIFICATION HAS CHANGED); if that is expected (the host was reinstalled), run "
            f"`{trust_command(remote, replace=True)}` and check the fingerprints it shows; if not, someone may be "
            "intercepting the connection",
            host=name,
            changed=True,
        )
    else:
        error = HostKeyError(
            f"{name} is not a host tp4 trusts yet: its key is not in {file}; fix: run `tp4 hosts trust --profile FILE` "
            f"(every node of the line) or `{trust_command(remote)}`, check the fingerprints it shows, and retry",
            host=name,
            changed=False,
        )
    host_key_failures.setdefault(name, error)
    return error


def _check_host(remote: Remote) -> None:
    """Before ssh runs: a host name that is no host is refused; so is a host tp4 does not know
    (also when a shared connection to it is still open: ssh would not check the key again)."""
    from tp4.core import knownhosts  # not at import: tp4.image.sources (pkgs/src.nix) runs without them
    from tp4.core.errors import InvalidInput

    problem = knownhosts.host_problem(remote.host)
    if problem:
        raise InvalidInput(
            f"ssh host {remote.host[:80]!r}: not a host name or address: {problem}; "
            "fix: pass the node's ssh name or address"
        )
    name = key_name(remote)
    if not knownhosts.trusted(name):
        raise _refused(remote, name, changed=False)


def _host_key_refusal(remote: Remote | None, code: int | None, err: str | bytes | None) -> HostKeyError | None:
    """The HostKeyError of an ssh that exited 255 because it refused the host's key, else None."""
    if remote is None or code != 255 or not err:
        return None
    text = err if isinstance(err, str) else err.decode(errors="replace")
    changed = "REMOTE HOST IDENTIFICATION HAS CHANGED" in text or "has changed and you have requested strict" in text
    if not changed and "Host key verification failed" not in text:
        return None
    return _refused(remote, key_name(remote), changed=changed)


# --- children -------------------------------------------------------------------------------------


@dataclass
class _Child:
    popen: subprocess.Popen[Any]
    remote: Remote | None
    pidfile: str | None  # the remote wrapper's file naming its process group
    own_group: bool = True  # started as the leader of its own process group


_live: dict[int, _Child] = {}  # id(popen) -> child; plain dict operations, safe from a signal handler
_interrupted_at = 0.0  # when Ctrl-C came (on_interrupt), 0 before
_cleaning = False  # inside cleanup(): worker threads may start commands again
# the main thread between starting a child and recording it in _live, when a stopping signal there
# would leave the child unknown to stop_all (it runs, tp4 exits): the signal waits until it is known
_spawning = False
_deferred: int | None = None


@contextmanager
def cleanup() -> Iterator[None]:
    """A cleanup that runs commands from worker threads after Ctrl-C (stopping every rank of a
    line in parallel): inside it they may start commands again. A second Ctrl-C still stops them."""
    global _cleaning
    _cleaning = True
    try:
        yield
    finally:
        _cleaning = False


def _spawn(
    argv: Sequence[str],
    remote: Remote | None,
    env: Mapping[str, str] | None,
    cwd: str | os.PathLike[str] | None,
    popen_kwargs: Mapping[str, Any],
    *,
    foreground: bool = False,
) -> _Child:
    pidfile = None
    if remote is None:
        cmd = [str(a) for a in argv]
        local_env = {**os.environ, **env} if env else None
    else:
        _check_host(remote)
        pidfile = f"/tmp/tp4-{os.urandom(8).hex()}.pid"
        wrapped = ["sh", "-c", _REMOTE_WRAPPER, "tp4", pidfile, *_remote_command(argv, env)]
        cmd = [*remote.ssh_argv(), shlex.join(wrapped)]
        local_env = None
    # its own process group, stopped with all it started; never the terminal's stdin: a child in
    # a background group that read it would stop (SIGTTIN), and ssh would forward keystrokes
    # a new session (detached) is a process group of its own already
    own = not foreground and not popen_kwargs.get("start_new_session")
    popen_kwargs = {**popen_kwargs, "process_group": 0 if own else None}
    if popen_kwargs.get("stdin") is None:
        popen_kwargs["stdin"] = subprocess.DEVNULL
    main = threading.current_thread() is threading.main_thread()
    if _interrupted_at and not _cleaning and not main:
        raise Tp4Error("interrupted (Ctrl-C): not starting " + _describe(argv, remote))
    global _spawning, _deferred
    if main:
        _spawning = True
    try:
        try:
            popen = subprocess.Popen(cmd, env=local_env, cwd=cwd, **popen_kwargs)
        except FileNotFoundError as exc:
            raise Tp4Error(f"`{cmd[0]}` is not installed or not on PATH; install it and retry") from exc
        child = _Child(popen, remote, pidfile, own_group=not foreground)
        for key, old in list(_live.items()):
            if old.popen.returncode is not None:
                _live.pop(key, None)
        _live[id(popen)] = child
    finally:
        if main:
            _spawning = False
        if main and _deferred is not None:
            signum, _deferred = _deferred, None
            on_interrupt(signum, None)  # stops every child, this one too, and raises KeyboardInterrupt
    if _interrupted_at and not _cleaning and not main:
        # Ctrl-C came while this worker started it, after the handler's stop_all: stop it here
        _stop([child])
        raise Tp4Error("interrupted (Ctrl-C): stopped " + _describe(argv, remote))
    return child


def _forget(child: _Child) -> None:
    _live.pop(id(child.popen), None)


def _kill_remote(child: _Child) -> None:
    if child.remote is None or child.pidfile is None:
        return
    # a command on the shared connection carries little (a log follower, a listing): the kill
    # rides along it, without a handshake; one with a connection of its own may be a big stream
    # (into `podman load`), which leaves the shared connection free for the kill as well
    own = dataclasses.replace(child.remote, share_connection=True)
    argv = [*own.ssh_argv(), shlex.join(["sh", "-c", _REMOTE_KILL, "tp4", child.pidfile])]
    log.debug("$ %s", shlex.join(argv))
    try:
        subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=CLEANUP_TIMEOUT, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("could not stop the command on %s: %s", child.remote.destination, exc)


def _signal_group(child: _Child, sig: int) -> None:
    """``sig`` to the child's process group (it and everything it started), else to the child."""
    if child.own_group:
        try:
            os.killpg(child.popen.pid, sig)
            return
        except OSError:
            pass
    try:
        child.popen.send_signal(sig)
    except OSError:
        pass


def _stop(children: Sequence[_Child]) -> None:
    """SIGTERM every child still running and what it started, SIGKILL them after GRACE seconds,
    then kill the process group of each remote one on its host."""
    running = [c for c in children if c.popen.poll() is None]
    for c in running:
        _signal_group(c, signal.SIGTERM)
    deadline = time.monotonic() + GRACE
    for c in running:
        try:
            c.popen.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal_group(c, signal.SIGKILL)
            c.popen.wait()
        if c.own_group:
            _signal_group(c, signal.SIGKILL)  # what it started and left behind
    remotes = [c for c in running if c.remote is not None]
    threads = [threading.Thread(target=_kill_remote, args=(c,), daemon=True) for c in remotes]
    for t in threads:
        t.start()
    for t in threads:
        t.join(CLEANUP_TIMEOUT + 1)
    for c in children:
        _forget(c)


def stop_all() -> None:
    """Stop every child the funnel started that is still running, local and remote."""
    _stop(list(_live.values()))


_stopping = False


def on_interrupt(signum: int, frame: FrameType | None) -> None:
    """The SIGINT handler: stop every child, then raise KeyboardInterrupt. From then on worker
    threads start no new command (the main thread still may: its cleanup, e.g. removing a
    container); a second Ctrl-C during the cleanup gives it up. Between the main thread's start
    of a child and its record it returns instead: the start raises once the child is known."""
    global _stopping, _interrupted_at, _deferred
    if _spawning and threading.current_thread() is threading.main_thread():
        _deferred = signum
        return
    if _stopping:
        raise KeyboardInterrupt
    _stopping = True
    _interrupted_at = time.monotonic()
    try:
        stop_all()
    finally:
        _stopping = False
    raise KeyboardInterrupt


def _announce(text: str, secrets: Sequence[str], echo: Echo | None) -> None:
    line = f"$ {redact(text, secrets)}"
    if echo is not None:
        echo(line)
    else:
        log.debug("%s", line)


def _from_file(stdin: IO[bytes] | None) -> str:
    name = getattr(stdin, "name", None)
    return f" < {shlex.quote(name)}" if isinstance(name, str) else ""


def _tail(err: str | bytes | None, secrets: Sequence[str], lines: int = 15) -> str:
    if not err:
        return ""
    text = err if isinstance(err, str) else err.decode(errors="replace")
    tail = "\n".join(text.strip().splitlines()[-lines:])
    return "\n" + redact(tail, secrets) if tail else ""


# --- the three ways to run ------------------------------------------------------------------------


@overload
def run(
    argv: Sequence[str],
    *,
    remote: Remote | None = None,
    check: bool = True,
    capture: bool = True,
    input: str | bytes | None = None,
    stdin: IO[bytes] | None = None,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    timeout: float | None = None,
    purpose: str | None = None,
    secrets: Iterable[str] = (),
    text: Literal[True] = True,
    echo: Echo | None = None,
) -> subprocess.CompletedProcess[str]: ...


@overload
def run(
    argv: Sequence[str],
    *,
    remote: Remote | None = None,
    check: bool = True,
    capture: bool = True,
    input: str | bytes | None = None,
    stdin: IO[bytes] | None = None,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    timeout: float | None = None,
    purpose: str | None = None,
    secrets: Iterable[str] = (),
    text: Literal[False],
    echo: Echo | None = None,
) -> subprocess.CompletedProcess[bytes]: ...


def run(
    argv: Sequence[str],
    *,
    remote: Remote | None = None,
    check: bool = True,
    capture: bool = True,
    input: str | bytes | None = None,
    stdin: IO[bytes] | None = None,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    timeout: float | None = None,
    purpose: str | None = None,
    secrets: Iterable[str] = (),
    text: bool = True,
    echo: Echo | None = None,
) -> subprocess.CompletedProcess[str] | subprocess.CompletedProcess[bytes]:
    """Run one command to completion and return its CompletedProcess.

    ``stdin`` is an open file the command reads (``$ … < file`` in the log); ``input`` is data
    written to it. With ``check`` a non-zero exit raises :class:`Tp4Error` naming the command
    (secrets redacted) and the tail of its stderr. ``echo`` (a callable) shows the ``$ …`` line
    as progress instead of the debug log. ``timeout`` (seconds) stops the command, on its host
    too, and raises a Tp4Error naming the command, its host and ``purpose`` (what it was for,
    e.g. "listing the images of spark2"), which also heads the error of a failed command.
    """
    secrets = tuple(s for s in secrets if s)
    _announce(shlex.join(full_argv(argv, remote, env)) + _from_file(stdin), secrets, echo)
    if isinstance(input, str) and not text:
        input = input.encode()
    out_err = subprocess.PIPE if capture else None
    child = _spawn(
        argv,
        remote,
        env,
        cwd,
        {
            "stdin": subprocess.PIPE if input is not None else stdin,
            "stdout": out_err,
            "stderr": out_err,
            "text": text,
        },
    )
    what = redact(_describe(argv, remote), secrets)
    return _finish(
        child,
        f"{purpose} ({what})" if purpose else what,
        input=input,
        timeout=timeout,
        check=check,
        secrets=secrets,
        capture=capture,
    )


def _finish(
    child: _Child,
    what: str,
    *,
    input: str | bytes | None,
    timeout: float | None,
    check: bool,
    secrets: Sequence[str],
    capture: bool = True,
) -> subprocess.CompletedProcess[Any]:
    try:
        out, err = child.popen.communicate(input, timeout=timeout)
    except subprocess.TimeoutExpired:
        _stop([child])
        raise Tp4Error(f"{what} did not finish within {timeout:g} s") from None
    except BaseException:  # Ctrl-C (KeyboardInterrupt) and anything else: the child goes too
        _stop([child])
        raise
    finally:
        _forget(child)
    proc = subprocess.CompletedProcess(child.popen.args, child.popen.returncode, out, err)
    refusal = _host_key_refusal(child.remote, proc.returncode, err if capture else None)
    if refusal is not None:
        raise refusal
    if check and proc.returncode != 0:
        raise Tp4Error(f"{what} failed with exit code {proc.returncode}" + (_tail(err, secrets) if capture else ""))
    return proc


def wait_for(
    popen: subprocess.Popen[AnyStr],
    what: str,
    *,
    timeout: float | None = None,
    check: bool = True,
    secrets: Iterable[str] = (),
) -> subprocess.CompletedProcess[AnyStr]:
    """Wait for a child another library started (GitPython's), as run() waits for its own: a
    timeout, Ctrl-C or :func:`stop_all` stops it; with ``check`` a non-zero exit raises
    :class:`Tp4Error` naming ``what`` (already redacted; logged by the caller as ``$ …``) and
    the tail of its stderr. Its stdout and stderr must be pipes."""
    try:
        own_group = popen.poll() is None and os.getpgid(popen.pid) == popen.pid
    except OSError:
        own_group = False
    child = _Child(popen, None, None, own_group=own_group)
    _live[id(popen)] = child
    return _finish(child, what, input=None, timeout=timeout, check=check, secrets=tuple(s for s in secrets if s))


def _broken_pipe(code: int) -> bool:
    """The exit of a producer whose consumer went away (SIGPIPE, or a shell's 128+13)."""
    return code in (-signal.SIGPIPE, 128 + signal.SIGPIPE)


@overload
def pipe(
    steps: Sequence[Step | Sequence[str]],
    *,
    stdin: IO[bytes] | None = None,
    timeout: float | None = None,
    purpose: str | None = None,
    secrets: Iterable[str] = (),
    text: Literal[True] = True,
    echo: Echo | None = None,
) -> subprocess.CompletedProcess[str]: ...


@overload
def pipe(
    steps: Sequence[Step | Sequence[str]],
    *,
    stdin: IO[bytes] | None = None,
    timeout: float | None = None,
    purpose: str | None = None,
    secrets: Iterable[str] = (),
    text: Literal[False],
    echo: Echo | None = None,
) -> subprocess.CompletedProcess[bytes]: ...


def pipe(
    steps: Sequence[Step | Sequence[str]],
    *,
    stdin: IO[bytes] | None = None,
    timeout: float | None = None,
    purpose: str | None = None,
    secrets: Iterable[str] = (),
    text: bool = True,
    echo: Echo | None = None,
) -> subprocess.CompletedProcess[str] | subprocess.CompletedProcess[bytes]:
    """Run ``a | b | …``: each step's stdout is the next one's stdin; returns the last step's
    output. Logged once as ``$ a | b``; every step is waited for; when one fails the others are
    stopped and the error names the failing step (a producer killed by SIGPIPE because its
    consumer failed is not the culprit) and the tail of its stderr. A timeout or Ctrl-C stops
    all of them, remote ones on their hosts too."""
    import tempfile

    secrets = tuple(s for s in secrets if s)
    plan = [s if isinstance(s, Step) else Step(s) for s in steps]
    if len(plan) < 2:
        raise ValueError("a pipe needs at least two steps")
    shown = " | ".join(shlex.join(full_argv(s.argv, s.remote, s.env)) for s in plan)
    _announce(shown + _from_file(stdin), secrets, echo)
    children: list[_Child] = []
    errs: list[IO[bytes]] = []
    with tempfile.TemporaryFile() as out:
        try:
            upstream: IO[bytes] | int | None = stdin
            for i, step in enumerate(plan):
                err = tempfile.TemporaryFile()
                errs.append(err)
                last = i == len(plan) - 1
                child = _spawn(
                    step.argv,
                    step.remote,
                    step.env,
                    None,
                    {"stdin": upstream, "stdout": out if last else subprocess.PIPE, "stderr": err},
                )
                children.append(child)
                previous = children[i - 1].popen.stdout if i else None
                if previous is not None:
                    previous.close()  # only the next step holds the read end
                upstream = child.popen.stdout
            deadline = None if timeout is None else time.monotonic() + timeout
            failed = _wait_all(children, deadline)
            if failed is None:
                _stop(children)
                raise Tp4Error(
                    f"{purpose + ': ' if purpose else ''}`{redact(_joined(plan), secrets)}`"
                    f"{_hosts_of(plan)} did not finish within {timeout:g} s"
                )
            if any(code != 0 for code in failed):
                _stop(children)  # the others are stopped: their exit codes say nothing
        except BaseException:
            _stop(children)
            raise
        finally:
            for c in children:
                _forget(c)
            tails = []
            for e in errs:
                e.seek(0)
                tails.append(e.read())
                e.close()
        bad = [i for i, code in enumerate(failed) if code not in (None, 0)]
        for i in bad:
            refusal = _host_key_refusal(plan[i].remote, failed[i], tails[i])
            if refusal is not None:
                raise refusal
        if bad:
            culprit = next((i for i in bad if not _broken_pipe(failed[i] or 0)), bad[0])
            step = plan[culprit]
            raise Tp4Error(
                f"{purpose + ': ' if purpose else ''}"
                f"{redact(_describe(step.argv, step.remote), secrets)} failed with exit code {failed[culprit]} "
                f"(in `{redact(_joined(plan), secrets)}`)" + _tail(tails[culprit], secrets)
            )
        out.seek(0)
        data = out.read()
    done: subprocess.CompletedProcess[str] | subprocess.CompletedProcess[bytes]
    if text:
        done = subprocess.CompletedProcess(
            plan[-1].argv, 0, data.decode(errors="replace"), tails[-1].decode(errors="replace")
        )
    else:
        done = subprocess.CompletedProcess(plan[-1].argv, 0, data, tails[-1])
    done.args = [list(s.argv) for s in plan]  # one argv per step, which __init__'s type (one command) cannot say
    return done


def _hosts_of(plan: Sequence[Step]) -> str:
    hosts = list(dict.fromkeys(s.remote.destination for s in plan if s.remote is not None))
    return f" (on {', '.join(hosts)})" if hosts else ""


def _joined(plan: Sequence[Step]) -> str:
    return " | ".join(shlex.join([str(a) for a in s.argv]) for s in plan)


def _wait_all(children: Sequence[_Child], deadline: float | None) -> list[int | None] | None:
    """Wait until all exit or one fails; their exit codes then (None: still running), or None
    when the deadline passes first."""
    pause = 0.005
    while True:
        codes = [c.popen.poll() for c in children]
        if all(code is not None for code in codes) or any(code not in (None, 0) for code in codes):
            return codes
        if deadline is not None and time.monotonic() > deadline:
            return None
        time.sleep(pause)
        pause = min(pause * 2, 0.1)


def start(
    argv: Sequence[str],
    *,
    remote: Remote | None = None,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    secrets: Iterable[str] = (),
    echo: Echo | None = None,
    foreground: bool = False,
    detached: bool = False,
    **popen_kwargs: Any,
) -> subprocess.Popen[Any]:
    """Start a command without waiting (a stream read as it comes); same logging, quoting and
    Ctrl-C handling as run(). The caller waits for it, and calls :func:`stop` when it gives up.
    ``foreground`` keeps it in tp4's process group (a viewer that draws on the terminal);
    ``detached`` (local only) starts a service that outlives tp4: in its own session, and not
    stopped by Ctrl-C or :func:`stop_all` (the image store's registry)."""
    secrets = tuple(s for s in secrets if s)
    if detached and (remote is not None or foreground):
        raise ValueError("detached: a local command in its own session only")
    _announce(shlex.join(full_argv(argv, remote, env)), secrets, echo)
    if detached:
        popen_kwargs = {**popen_kwargs, "start_new_session": True}
    child = _spawn(argv, remote, env, cwd, popen_kwargs, foreground=foreground)
    if detached:
        _forget(child)
    return child.popen


def stop(popen: subprocess.Popen[Any], *, remote_first: bool = False) -> None:
    """Stop a command from :func:`start` (its remote process group too) and wait for it.

    ``remote_first``: end the remote command first (a follower such as `podman logs -f`), so that
    its ssh, seeing the channel close, exits by itself, instead of a SIGTERM it may sit on."""
    child = _live.get(id(popen))
    if child is not None and remote_first and child.remote is not None and child.popen.poll() is None:
        _kill_remote(child)
        try:
            child.popen.wait(timeout=GRACE)
        except subprocess.TimeoutExpired:
            pass
        _stop([child])
    elif child is not None:
        _stop([child])
    elif popen.poll() is None:
        popen.kill()
        popen.wait()
