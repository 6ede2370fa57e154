"""Pid files of the processes tp4 starts and leaves running, and the one way tp4 signals them.

A pid file alone names a number, not a process: the process may have ended and its pid gone to
another program, and anyone who can write the file can make it name any process (``-1`` makes
``kill`` signal every process the caller may signal, ``0`` the caller's own group). So a pid file
of tp4 records the process's identity when tp4 starts it, and a process is signalled only when it
is still that process:

* ``pid``: a number > 1 and at most the kernel's ``pid_max``;
* ``start``: its start time (``/proc/PID/stat`` field 22, clock ticks after boot): a pid reused
  by a later process has another one;
* ``exe`` and ``argv``: ``/proc/PID/exe`` and ``/proc/PID/cmdline``, which must also be what the
  caller expects (:class:`Expect`: the program and the arguments tp4 started it with).

The file is JSON (``"format": "tp4.pidfile/1"``), written atomically, mode 0600, never through a
symlink. Reading one gives:

* no file, or a recorded process that has ended (its pid gone, or now another process's: another
  start time, program or argv): not running (``None``); :func:`stop` removes such a file;
* a file that is not such a record, or whose record is not what the caller expects (a number
  alone, ``-1``, ``0``, ``1``, a huge number, another program): :class:`Stale`, and nothing is
  signalled. Its message names the file and the fix (remove the file).

Remote pid files (a router on another host, the NFS share, the remote wrapper of
:mod:`tp4.core.process`) are checked the same way by the shell scripts that read them: a pid > 1,
the start time recorded beside it, and the command line tp4 started.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import stat
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from tp4.core.errors import Tp4Error

FORMAT = "tp4.pidfile/1"
PID_MAX_DEFAULT = 4194304  # the kernel's PID_MAX_LIMIT on 64-bit: no pid is larger


class Stale(Tp4Error):
    """A pid file that names no process tp4 started (exit code 1); nothing was signalled."""


@dataclass(frozen=True)
class Identity:
    """What identifies a live process: its pid, start time, program and argv."""

    pid: int
    start: int
    exe: str
    argv: tuple[str, ...]


@dataclass(frozen=True)
class Expect:
    """The process a caller started: its program's file name (``exe`` and ``argv[0]`` must end
    in it) and its arguments after ``argv[0]``."""

    program: str
    args: tuple[str, ...]

    def programs(self) -> set[str]:
        """The file names its exe may have: the program's, or what it resolves to on PATH."""
        found = shutil.which(self.program)
        return {self.program} | ({os.path.basename(os.path.realpath(found))} if found else set())

    def matches(self, ident: Identity) -> bool:
        return (
            os.path.basename(ident.exe) in self.programs()
            and bool(ident.argv)
            and os.path.basename(ident.argv[0]) == self.program
            and tuple(ident.argv[1:]) == self.args
        )

    def describe(self) -> str:
        return " ".join([self.program, *self.args])


@dataclass(frozen=True)
class Record:
    """A pid file's content: the process's identity when tp4 started it, and the caller's
    extra fields (the image store's port)."""

    identity: Identity
    extra: Mapping[str, object] = field(default_factory=dict)

    @property
    def pid(self) -> int:
        return self.identity.pid


def pid_max() -> int:
    try:
        return int(Path("/proc/sys/kernel/pid_max").read_text().strip())
    except (OSError, ValueError):
        return PID_MAX_DEFAULT


def valid_pid(pid: object) -> bool:
    """A pid tp4 may ever signal: an int > 1 and at most pid_max (never -1, 0, init)."""
    return isinstance(pid, int) and not isinstance(pid, bool) and 1 < pid <= pid_max()


def identity(pid: int) -> Identity | None:
    """The identity of the live process ``pid``; None when there is none (or only a zombie)."""
    if not valid_pid(pid):
        return None
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    fields = text.rsplit(")", 1)[-1].split()
    if len(fields) < 20 or fields[0] in ("Z", "X"):
        return None
    try:
        exe = os.readlink(f"/proc/{pid}/exe").removesuffix(" (deleted)")
    except OSError:  # another user's process: its exe is not readable, and it is not ours
        exe = ""
    argv = tuple(a.decode(errors="surrogateescape") for a in cmdline.split(b"\0")[:-1])
    return Identity(pid, int(fields[19]), exe, argv)


def write(path: Path, pid: int, **extra: object) -> Record:
    """Record the live process ``pid`` (and ``extra``) in ``path``: atomically, 0600, not
    through a symlink. Call it right after starting the process (its exec is done once
    ``Popen`` returns)."""
    ident = identity(pid)
    # the exec that Popen waited for may still be setting up the new program: its argv is empty
    # until the kernel has laid it out (after close-on-exec, which is what Popen waits for)
    deadline = time.monotonic() + 2.0
    while ident is not None and not ident.argv and time.monotonic() < deadline:
        time.sleep(0.005)
        ident = identity(pid)
    if ident is None or not ident.argv:
        raise Tp4Error(f"process {pid} ended before its pid file {path} was written")
    record = Record(ident, dict(extra))
    data = {"format": FORMAT, "pid": pid, "start": ident.start, "exe": ident.exe, "argv": list(ident.argv), **extra}
    tmp = path.with_name(f".{path.name}.{os.urandom(6).hex()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(json.dumps(data) + "\n")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return record


def _stale(path: Path, why: str, what: str) -> Stale:
    return Stale(
        f"the pid file {path} {why}: it names no {what} tp4 started, so nothing was signalled; "
        f"fix: remove {path} (if {what} still runs, stop it yourself after checking it with `ps -p PID -o args`)"
    )


def read(path: Path, expect: Expect, what: str) -> Record | None:
    """The record in ``path``; None when there is no file; :class:`Stale` when it is not a
    record of tp4's (see the module doc) or records another program than ``expect``."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _stale(path, "is a symlink", what) from None
        raise Tp4Error(f"cannot read the pid file {path}: {exc.strerror or exc}; fix: remove it") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise _stale(path, "is not a regular file", what)
        raw = os.read(fd, 65536)
    finally:
        os.close(fd)
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):
        data = None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise _stale(path, "is not a tp4 pid file (or is one of an older tp4)", what)
    pid, start, exe, argv = data.get("pid"), data.get("start"), data.get("exe"), data.get("argv")
    if not valid_pid(pid):
        raise _stale(path, f"names pid {str(pid)[:40]}, which is not a process id tp4 signals (> 1)", what)
    if not isinstance(start, int) or not isinstance(exe, str) or not isinstance(argv, list):
        raise _stale(path, "lacks the start time, program or arguments of its process", what)
    assert isinstance(pid, int)
    ident = Identity(pid, start, exe, tuple(str(a) for a in argv))
    if not expect.matches(ident):
        raise _stale(path, f"records `{' '.join(ident.argv)[:200]}`, not `{expect.describe()}`", what)
    extra = {k: v for k, v in data.items() if k not in ("format", "pid", "start", "exe", "argv")}
    return Record(ident, extra)


def is_alive(record: Record) -> bool:
    """Whether the recorded process still lives as itself (same start time, program, argv)."""
    now = identity(record.pid)
    return now is not None and now == record.identity


def running(path: Path, expect: Expect, what: str) -> Record | None:
    """The record of ``path`` when its process is alive as recorded; None when there is no
    file or the process has ended; :class:`Stale` when the file is not tp4's record of it."""
    record = read(path, expect, what)
    return record if record is not None and is_alive(record) else None


def _signal(record: Record, sig: int) -> bool:
    """``sig`` to the recorded process when it is still that process; False when it is not.
    Through a pidfd where the kernel has them: the check and the signal then name one process,
    even if it ended in between and its pid was reused."""
    try:
        fd = os.pidfd_open(record.pid)
    except (AttributeError, OSError):
        fd = None
    try:
        if not is_alive(record):
            return False
        if fd is not None:
            signal.pidfd_send_signal(fd, sig)
        else:
            os.kill(record.pid, sig)
        return True
    except ProcessLookupError:
        return False
    finally:
        if fd is not None:
            os.close(fd)


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def stop(path: Path, expect: Expect, what: str, *, grace: float = 4.0) -> bool:
    """Stop the process of ``path`` (SIGTERM, SIGKILL after ``grace`` seconds) and remove the
    file; False when none was running (a file of an ended process is removed too).
    :class:`Stale` (nothing signalled, the file kept) when the file is not tp4's record."""
    record = read(path, expect, what)
    if record is None:
        return False
    if not _signal(record, signal.SIGTERM):
        path.unlink(missing_ok=True)
        return False
    deadline = time.monotonic() + grace
    while is_alive(record) and time.monotonic() < deadline:
        _reap(record.pid)
        time.sleep(0.05)
    if is_alive(record):
        _signal(record, signal.SIGKILL)
        while is_alive(record) and time.monotonic() < deadline + grace:
            _reap(record.pid)
            time.sleep(0.05)
    _reap(record.pid)
    path.unlink(missing_ok=True)
    return True


# The same rule in a shell script on another host (a router, the NFS share, the remote wrapper of
# tp4.core.process): ``same PID START GREP_FLAGS PATTERN`` is true only when PID is a process id
# tp4 may signal (digits, > 1, no leading zero, at most 7 digits: pid_max is at most 4194304),
# its start time (/proc/PID/stat field 22) is START, and a line of its argv (/proc/PID/cmdline, one
# argument a line) matches PATTERN (``grep GREP_FLAGS``: ``-qF`` a fixed string, ``-qxF`` a whole
# line, ``-qE`` an extended regex). A script defines it by starting with SAME_SH.
SAME_SH = (
    "same() { "
    'case $1 in ""|*[!0-9]*|0*|1|????????*) return 1;; esac; '
    '[ -n "$2" ] && [ "$(sed "s/.*) //" /proc/"$1"/stat 2>/dev/null | cut -d" " -f20)" = "$2" ] || return 1; '
    "tr '\\0' '\\n' < /proc/\"$1\"/cmdline 2>/dev/null | grep $3 -- \"$4\" >/dev/null; }; "
)
# START of the process $1 (its /proc/PID/stat field 22), for a script recording one
START_SH = 'sed "s/.*) //" /proc/"$1"/stat 2>/dev/null | cut -d" " -f20'
