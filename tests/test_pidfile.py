"""Pid files (tp4.core.pidfile) and `tp4 image-store stop`: only the process tp4 started is ever
signalled. A pid file naming -1, 0, 1, a non-number, a huge number, a dead pid, an unrelated
process, or a pid reused by another program is refused or taken as "not running"; the process it
names is never signalled."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tp4.core import pidfile
from tp4.image import imagestore

SLEEP = pidfile.Expect("sleep", ("300",))


@pytest.fixture
def victim():
    """An unrelated process (a `sleep` this test starts) that must survive every stop."""
    proc = subprocess.Popen(["sleep", "300"], start_new_session=True)
    yield proc
    proc.kill()
    proc.wait()


@pytest.fixture
def no_kill(monkeypatch):
    """Every signal tp4 sends, recorded instead of sent (a test of `-1` must not signal anything)."""
    sent: list[tuple[str, int, int]] = []
    monkeypatch.setattr(os, "kill", lambda pid, sig: sent.append(("kill", pid, sig)))
    monkeypatch.setattr(os, "killpg", lambda pid, sig: sent.append(("killpg", pid, sig)))
    monkeypatch.setattr(signal, "pidfd_send_signal", lambda fd, sig, *a: sent.append(("pidfd", fd, sig)))
    return sent


def alive(proc: subprocess.Popen[bytes]) -> bool:
    return proc.poll() is None


def test_a_record_of_the_started_process_stops_it(tmp_path):
    proc = subprocess.Popen(["sleep", "300"])
    path = tmp_path / "pid"
    record = pidfile.write(path, proc.pid, port=5)
    assert path.stat().st_mode & 0o777 == 0o600
    data = json.loads(path.read_text())
    assert data["pid"] == proc.pid and data["argv"] == ["sleep", "300"] and data["port"] == 5
    assert os.path.basename(data["exe"]) in SLEEP.programs()
    assert pidfile.running(path, SLEEP, "sleep") == record
    assert pidfile.stop(path, SLEEP, "sleep", grace=2) is True
    # ended: a process the kernel is still tearing down has no exe and no argv left (no longer the
    # recorded one), and is gone once reaped
    assert proc.wait(timeout=5) is not None and pidfile.identity(proc.pid) is None
    assert not path.exists()
    assert pidfile.stop(path, SLEEP, "sleep") is False


def _record(path: Path, **fields: object) -> None:
    path.write_text(
        json.dumps({"format": pidfile.FORMAT, "start": 1, "exe": "/bin/sleep", "argv": ["sleep", "300"]} | fields)
    )


@pytest.mark.parametrize(
    "content",
    ["-1", "0", "1", "-1 5000", "0 5000", "abc", "", "9" * 40, "1e9", "٣", str(2**31), "12 5000"],
    ids=[
        "minus-one",
        "zero",
        "init",
        "minus-one-port",
        "zero-port",
        "word",
        "empty",
        "huge",
        "float",
        "digit",
        "big",
        "old-format",
    ],
)
def test_a_pid_file_that_is_not_a_record_is_refused_and_nothing_is_signalled(tmp_path, no_kill, content):
    path = tmp_path / "pid"
    path.write_text(content)
    with pytest.raises(pidfile.Stale) as exc:
        pidfile.stop(path, SLEEP, "sleep")
    assert str(path) in str(exc.value) and f"fix: remove {path}" in str(exc.value)
    assert no_kill == []
    assert path.exists()  # kept: the operator decides


@pytest.mark.parametrize("pid", [-1, 0, 1, 2**40, "12", True, None])
def test_a_record_naming_no_pid_tp4_may_signal_is_refused(tmp_path, no_kill, pid):
    path = tmp_path / "pid"
    _record(path, pid=pid)
    with pytest.raises(pidfile.Stale, match="nothing was signalled"):
        pidfile.stop(path, SLEEP, "sleep")
    assert no_kill == []


def test_a_pid_file_naming_an_unrelated_process_is_refused(tmp_path, victim):
    """The old format `<pid> <port>` and a record of another program: refused; it lives."""
    path = tmp_path / "pid"
    path.write_text(f"{victim.pid} 5000\n")
    with pytest.raises(pidfile.Stale):
        pidfile.stop(path, pidfile.Expect("docker-registry", ("serve", "/x/config.yml")), "image store")
    ident = pidfile.identity(victim.pid)
    path.write_text(
        json.dumps(
            {
                "format": pidfile.FORMAT,
                "pid": victim.pid,
                "start": ident.start,
                "exe": ident.exe,
                "argv": list(ident.argv),
            }
        )
    )
    with pytest.raises(pidfile.Stale, match="records `sleep 300`"):
        pidfile.stop(path, pidfile.Expect("docker-registry", ("serve", "/x/config.yml")), "image store")
    time.sleep(0.2)
    assert alive(victim)


def test_a_reused_pid_is_not_running_and_is_not_signalled(tmp_path, victim):
    """The record's process ended and its pid now belongs to another process (here: the
    victim's pid with the record of an earlier start): not running, the file removed."""
    ident = pidfile.identity(victim.pid)
    path = tmp_path / "pid"
    _record(path, pid=victim.pid, start=ident.start - 1, exe=ident.exe)
    assert pidfile.running(path, SLEEP, "sleep") is None
    assert pidfile.stop(path, SLEEP, "sleep") is False
    assert not path.exists()
    # the same start time, another program file at that pid: not it either
    path.write_text(
        json.dumps(
            {
                "format": pidfile.FORMAT,
                "pid": victim.pid,
                "start": ident.start,
                "exe": "/opt/elsewhere/" + os.path.basename(ident.exe),
                "argv": ["sleep", "300"],
            }
        )
    )
    assert pidfile.stop(path, SLEEP, "sleep") is False
    time.sleep(0.2)
    assert alive(victim)


def test_a_dead_pid_is_not_running(tmp_path, no_kill):
    proc = subprocess.Popen(["sleep", "300"])
    path = tmp_path / "pid"
    pidfile.write(path, proc.pid)
    subprocess.run(["kill", "-KILL", str(proc.pid)], check=True)  # os.kill is the recorder here
    proc.wait()
    assert pidfile.running(path, SLEEP, "sleep") is None
    assert pidfile.stop(path, SLEEP, "sleep") is False
    assert no_kill == [] and not path.exists()


def test_a_symlinked_pid_file_is_refused(tmp_path, victim):
    target = tmp_path / "elsewhere"
    pidfile.write(target, victim.pid)
    (tmp_path / "pid").symlink_to(target)
    with pytest.raises(pidfile.Stale, match="symlink"):
        pidfile.stop(tmp_path / "pid", SLEEP, "sleep")
    assert alive(victim)


def test_write_replaces_a_planted_symlink_without_following_it(tmp_path, victim):
    victim_file = tmp_path / "victim"
    victim_file.write_text("keep")
    (tmp_path / "pid").symlink_to(victim_file)
    pidfile.write(tmp_path / "pid", victim.pid)
    assert victim_file.read_text() == "keep" and not (tmp_path / "pid").is_symlink()


# --- the image store --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "content", ["-1 5000", "0 5000", "1 5000", "x 5000", "99999999999999999999 5000", "VICTIM 5000"]
)
def test_image_store_stop_never_signals_what_its_pid_file_names(tmp_path, tp4_cli, victim, no_kill, content):
    root = tmp_path / "registry"
    root.mkdir()
    (root / "pid").write_text(content.replace("VICTIM", str(victim.pid)))
    assert imagestore.running(root) is None
    code, out, err = tp4_cli("image-store", "stop", "--root", root)
    assert code == 1 and "stopped" not in out, (out, err)
    assert f"the pid file {root / 'pid'}" in err and f"fix: remove {root / 'pid'}" in err and "Traceback" not in err
    assert no_kill == []
    assert alive(victim)


def test_image_store_stop_of_a_reused_pid_says_not_running(tmp_path, tp4_cli, victim):
    root = tmp_path / "registry"
    root.mkdir()
    ident = pidfile.identity(victim.pid)
    (root / "pid").write_text(
        json.dumps(
            {
                "format": pidfile.FORMAT,
                "pid": victim.pid,
                "start": ident.start - 1,
                "exe": "/usr/bin/docker-registry",
                "argv": ["docker-registry", "serve", str(root / "config.yml")],
                "port": 5000,
            }
        )
    )
    code, out, err = tp4_cli("image-store", "stop", "--root", root)
    assert code == 0 and "not running" in out, (out, err)
    time.sleep(0.2)
    assert alive(victim)


# --- the same rule in the shell scripts of remote pid files --------------------------------------------


def _sh(script: str, *args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["sh", "-c", script, "sh", *map(str, args)], capture_output=True, text=True, timeout=30)


def _start_time(pid: int) -> int:
    return pidfile.identity(pid).start


def _lookalike(tmp_path: Path, name: str, *args: str) -> subprocess.Popen[bytes]:
    """A shell under another name (its comm is that name) waiting on a `sleep`, with ``args``
    after its script, in a session of its own."""
    exe = tmp_path / name
    if not exe.exists():
        exe.write_bytes(Path("/bin/sh").resolve().read_bytes())
        exe.chmod(0o755)
    return subprocess.Popen([str(exe), "-c", "sleep 300; :", *args], start_new_session=True)


def _end(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def test_same_sh_checks_pid_start_time_and_command_line(victim):
    start = _start_time(victim.pid)
    same = pidfile.SAME_SH + 'same "$1" "$2" -qxF "$3"'
    assert _sh(same, victim.pid, start, "300").returncode == 0
    for pid, when, word in [
        (victim.pid, start + 1, "300"),  # a reused pid: another start time
        (victim.pid, "", "300"),
        (victim.pid, start, "301"),  # another command line
        ("-1", start, "300"),
        ("0", start, "300"),
        (
            "1",
            Path("/proc/1/stat").read_text().rsplit(")", 1)[1].split()[19],
            _sh("tr '\\0' '\\n' < /proc/1/cmdline | head -n1").stdout.strip() or "x",
        ),
        (f"0{victim.pid}", start, "300"),
        ("9" * 20, start, "300"),
        ("abc", start, "300"),
        ("", start, "300"),
    ]:
        assert _sh(same, pid, when, word).returncode != 0, (pid, when, word)


@pytest.mark.parametrize("content", ["-1 1", "0 1", "1 1", "abc 1", "99999999999999999999 1", "VICTIM", "VICTIM START"])
def test_the_router_stop_script_signals_only_the_router(tmp_path, victim, content):
    """A router.pid naming anything but the router tp4 started (even an unrelated process with its
    right start time) is not running: the script signals nothing and removes the stale file."""
    from tp4.serving import fleet

    d = tmp_path / "router"
    d.mkdir()
    (d / "router.pid").write_text(
        content.replace("VICTIM", str(victim.pid)).replace("START", str(_start_time(victim.pid))) + "\n"
    )
    assert _sh(fleet._PID, d).stdout.strip() == ""
    proc = _sh(fleet._STOP, d, 1)
    assert proc.returncode == 0 and not (d / "router.pid").exists(), proc.stderr
    time.sleep(0.2)
    assert alive(victim)


def test_the_router_stop_script_stops_the_router_it_started(tmp_path):
    from tp4.serving import fleet

    d = tmp_path / "router"
    d.mkdir()
    router = subprocess.Popen(
        ["python3", "-c", "import time\n# tp4 fleet router launcher\ntime.sleep(300)\n"], start_new_session=True
    )
    try:
        time.sleep(0.3)
        (d / "router.pid").write_text(f"{router.pid} {_start_time(router.pid)}\n")
        assert _sh(fleet._PID, d).stdout.strip() == str(router.pid)
        assert _sh(fleet._STOP, d, 2).returncode == 0
        assert router.wait(timeout=10) == -signal.SIGTERM
    finally:
        router.kill()


def test_the_ganesha_scripts_signal_only_the_ganesha_started_with_that_pid_file(tmp_path):
    """A process named ganesha.nfsd that is not the one started with this pid file (its comm
    alone once sufficed) is not running and not signalled; the one started with it is stopped,
    and only while its start time is the one first seen."""
    from tp4.hosts import share

    pid_path = tmp_path / "ganesha.pid"
    other = _lookalike(tmp_path, "ganesha.nfsd")
    ours = None
    try:
        for content in [str(other.pid), "-1", "0", "1", "x", "9" * 30]:
            pid_path.write_text(content + "\n")
            assert _sh(share._GANESHA_PID, pid_path).stdout.strip() == "", content
            assert _sh(share._GANESHA_STOP, pid_path).returncode == 0
            time.sleep(0.1)
            assert other.poll() is None, content
        ours = _lookalike(tmp_path, "ganesha.nfsd", "-p", str(pid_path))
        pid_path.write_text(f"{ours.pid}\n")
        time.sleep(0.2)
        assert _sh(share._GANESHA_PID, pid_path).stdout.strip() == str(ours.pid)
        assert (tmp_path / "ganesha.pid.start").read_text().strip() == str(_start_time(ours.pid))
        # a start time recorded of an earlier process: this one is not it
        (tmp_path / "ganesha.pid.start").write_text(f"{_start_time(ours.pid) - 1}\n")
        assert _sh(share._GANESHA_PID, pid_path).stdout.strip() == ""
        (tmp_path / "ganesha.pid.start").unlink()
        assert _sh(share._GANESHA_STOP, pid_path).returncode == 0
        assert ours.wait(timeout=15) == -signal.SIGTERM
        assert not (tmp_path / "ganesha.pid.start").exists()
    finally:
        _end(other)
        if ours is not None:
            _end(ours)


def test_the_remote_kill_signals_only_the_group_its_wrapper_recorded(tmp_path, victim):
    """tp4.core.process's wrapper records its process group and the leader's start time; the kill
    signals that group only while its leader is still that wrapper (run locally here)."""
    from tp4.core import process

    f = tmp_path / "tp4-0123456789abcdef.pid"
    for content in ["-1", "0", "1", "abc", f"{victim.pid}", f"{victim.pid} {_start_time(victim.pid)}"]:
        f.write_text(content + "\n")
        assert _sh(process._REMOTE_KILL, f).returncode == 0
        time.sleep(0.1)
        assert alive(victim), content
    wrapped = subprocess.Popen(
        ["sh", "-c", process._REMOTE_WRAPPER, "tp4", str(f), "sleep", "300"], start_new_session=True
    )
    try:
        for _ in range(100):
            if f.exists() and f.read_text().strip():
                break
            time.sleep(0.05)
        g, start = f.read_text().split()
        assert int(g) == wrapped.pid and int(start) == _start_time(wrapped.pid)
        assert _sh(process._REMOTE_KILL, f).returncode == 0
        assert wrapped.wait(timeout=10) != 0
    finally:
        wrapped.kill()


@pytest.mark.parametrize("kind", ["fifo", "directory", "huge"])
def test_a_pid_file_that_is_no_small_regular_file_is_refused_without_hanging(tmp_path, no_kill, kind):
    path = tmp_path / "pid"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    else:
        with open(path, "wb") as fh:
            fh.truncate(2**30)  # sparse: read no further than a record can be
    with pytest.raises(pidfile.Stale):
        pidfile.stop(path, SLEEP, "sleep")
    assert no_kill == []
