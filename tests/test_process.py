"""The one funnel for subprocesses: how a remote command reaches ssh's argv, pipes, timeouts,
and Ctrl-C stopping children locally and on real ssh hosts (netns)."""

from __future__ import annotations

import glob
import json
import logging
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import netns_hosts
from netns_hosts import NetnsHosts
from tp4.core import process
from tp4.core.errors import InvalidInput, Tp4Error
from tp4.core.process import Remote, full_argv

PYTHON = Path(__file__).resolve().parent.parent / "python"

# not a `unit` module: it drives the real ssh client (checks.unit has no ssh)


def test_double_dash_comes_right_before_the_destination_and_the_command_follows_it():
    remote = Remote(host="spark2", user="zurih", identity="/k", port=2222, options=("Ciphers=aes128-ctr",))
    argv = full_argv(["podman", "load", "-i", "/tmp/x y"], remote)
    i = argv.index("--")
    assert argv[0] == "ssh" and argv[i + 1] == "zurih@spark2"
    assert argv[i + 2 :] == [shlex.join(["podman", "load", "-i", "/tmp/x y"])]
    assert argv.count("--") == 1


@pytest.mark.parametrize("host", ["-oProxyCommand=id", "-Jevil.example.com", "-L2222:localhost:22"])
def test_a_host_that_reads_as_an_option_is_after_the_double_dash(host):
    argv = Remote(host=host).ssh_argv()
    assert argv[-2:] == ["--", host]


def test_a_hostile_destination_never_runs_as_an_ssh_option(tmp_path):
    """The funnel refuses such a host before ssh runs; and real ssh given the argv it would
    build (`--` before the destination) does not read `-oProxyCommand=...` as an option."""
    marker = tmp_path / "pwned"
    remote = Remote(host=f"-oProxyCommand=touch {marker}", connect_timeout=5)
    with pytest.raises(InvalidInput, match="starts with '-', so ssh would read it as an option"):
        process.run(["true"], remote=remote, check=False, timeout=30)
    proc = subprocess.run([*remote.ssh_argv(), "true"], stdin=subprocess.DEVNULL, capture_output=True, timeout=30)
    assert proc.returncode != 0
    assert not marker.exists()


def test_a_hostile_user_never_runs_as_an_ssh_option(tmp_path, monkeypatch):
    marker = tmp_path / "pwned"
    known = tmp_path / "known_hosts"  # localhost "trusted", so that ssh really runs
    known.write_text("localhost ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIEo2XX3SLbi8YUkyB4dxDXOILfw8PDxBcTbpfS04WNZq\n")
    monkeypatch.setenv("TP4_KNOWN_HOSTS", str(known))
    remote = Remote(host="localhost", user=f"-oProxyCommand=touch {marker} #", connect_timeout=5)
    proc = process.run(["true"], remote=remote, check=False, timeout=30)
    assert proc.returncode == 255
    assert not marker.exists()


# --- pipe -----------------------------------------------------------------------------------------


def test_pipe_connects_stdout_to_stdin_and_logs_one_line(caplog):
    caplog.set_level(logging.DEBUG, logger="tp4.core.process")
    proc = process.pipe([["printf", "a\\nsecret-x\\nb\\n"], ["grep", "-v", "a"], ["wc", "-l"]], secrets=["secret-x"])
    assert proc.stdout.strip() == "2"
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("$ ")]
    assert lines == ["$ printf 'a\\nsecret-x\\nb\\n' | grep -v a | wc -l".replace("secret-x", "***")]


def test_pipe_echo_shows_the_command_instead_of_the_debug_log(caplog):
    caplog.set_level(logging.DEBUG, logger="tp4.core.process")
    shown: list[str] = []
    process.pipe([["echo", "hi"], ["cat"]], echo=shown.append)
    assert shown == ["$ echo hi | cat"]
    assert not [r for r in caplog.records if r.getMessage().startswith("$ ")]


def test_pipe_names_the_failing_consumer_not_the_producer_it_broke():
    # `yes` dies of SIGPIPE when its consumer fails: the consumer is the culprit
    with pytest.raises(Tp4Error) as err:
        process.pipe([["yes"], ["sh", "-c", "head -c 10 >/dev/null; echo 'load: bad archive' >&2; exit 3"]])
    msg = str(err.value)
    assert msg.startswith("`sh -c ") and "failed with exit code 3" in msg and "load: bad archive" in msg
    assert "(in `yes | sh -c" in msg


def test_pipe_names_a_failing_producer_and_stops_the_consumer():
    started = time.monotonic()
    with pytest.raises(Tp4Error) as err:
        process.pipe([["sh", "-c", "echo 'stream: no such layer' >&2; exit 4"], ["sh", "-c", "sleep 60 <&-"]])
    assert time.monotonic() - started < 10
    assert str(err.value).startswith("`sh -c") and "exit code 4" in str(err.value)
    assert "stream: no such layer" in str(err.value)


def test_pipe_stops_a_producer_when_the_consumer_fails_without_reading(tmp_path):
    marker = tmp_path / "producer-finished"
    started = time.monotonic()
    with pytest.raises(Tp4Error) as err:
        process.pipe([["sh", "-c", f"sleep 31.{os.getpid()}; touch {marker}"], ["false"]])
    assert time.monotonic() - started < 10
    assert str(err.value).startswith("`false` failed with exit code 1")
    time.sleep(0.5)
    assert not marker.exists() and not _running(f"sleep 31.{os.getpid()}")


def test_pipe_timeout_stops_every_step():
    with pytest.raises(Tp4Error, match=r"`sleep 41\.5 \| cat` did not finish within 0\.5 s"):
        process.pipe([["sleep", "41.5"], ["cat"]], timeout=0.5)
    assert not _running("sleep 41.5")


def test_pipe_reports_a_missing_program():
    with pytest.raises(Tp4Error, match="`no-such-tp4-program` is not installed"):
        process.pipe([["echo"], ["no-such-tp4-program"]])


def test_run_reads_stdin_from_a_file_and_logs_it(tmp_path, caplog):
    caplog.set_level(logging.DEBUG, logger="tp4.core.process")
    src = tmp_path / "in put"
    src.write_bytes(b"x" * 100000)
    with open(src, "rb") as stream:
        assert process.run(["wc", "-c"], stdin=stream).stdout.strip() == "100000"
    assert f"$ wc -c < '{src}'" in [r.getMessage() for r in caplog.records]


def test_run_timeout_kills_a_local_child():
    with pytest.raises(Tp4Error, match=r"`sleep 42\.5` did not finish within 0\.3 s"):
        process.run(["sleep", "42.5"], timeout=0.3)
    assert not _running("sleep 42.5")


def _running(cmdline: str) -> list[int]:
    """Processes (on this machine, which the netns hosts share) whose command line is ``cmdline``."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                raw = open(f"/proc/{entry}/cmdline", "rb").read()
                state = open(f"/proc/{entry}/stat").read().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if raw.replace(b"\0", b" ").decode(errors="replace").strip() == cmdline and state != "Z":
                found.append(int(entry))
    return found


def _wait_until(predicate, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


# --- remote commands and Ctrl-C (real sshd in netns hosts) ----------------------------------------


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    with NetnsHosts(tmp_path_factory.mktemp("netns"), count=2) as hosts:
        yield hosts


def test_a_remote_command_gets_stdin_and_its_exit_code_and_leaves_no_pid_file(hosts):
    before = set(glob.glob("/tmp/tp4-*.pid"))
    proc = process.run(["sh", "-c", "cat; exit 7"], remote=hosts[0].remote, input="through ssh", check=False)
    assert (proc.returncode, proc.stdout) == (7, "through ssh")
    assert set(glob.glob("/tmp/tp4-*.pid")) == before


def test_a_remote_pipe_step(hosts):
    proc = process.pipe([["printf", "one\\ntwo\\n"], process.Step(["wc", "-l"], remote=hosts[0].remote)])
    assert proc.stdout.strip() == "2"


def test_a_remote_timeout_kills_the_remote_command(hosts):
    with pytest.raises(Tp4Error, match=r"`sleep 43\.5` on root@.* did not finish within 1 s"):
        process.run(["sleep", "43.5"], remote=hosts[0].remote, timeout=1)
    assert _wait_until(lambda: not _running("sleep 43.5"), 5)


def test_stopping_a_remote_command_reaps_it_before_the_wrapper_exits(hosts):
    """The remote wrapper traps the group's TERM and runs the trap only once its command has
    ended: it reaps the command and exits 143 itself. Its session then holds no process at all,
    not even a zombie (one whose shell died first waits for the host's init, and the remote kill
    would wait out its grace for it)."""
    follower = process.start(["sleep", "41.25"], remote=hosts[0].remote, stdout=process.PIPE, text=True)
    try:
        assert _wait_until(lambda: bool(_running("sleep 41.25")), 10)
        child = process._live[id(follower)]
        # the group (its leader's pid) and the leader's start time, which the kill checks
        group, started = process.run(["cat", child.pidfile], remote=hosts[0].remote).stdout.split()
        assert group.isdigit() and started.isdigit()
        process.stop(follower, remote_first=True)
        assert follower.returncode == 143  # the wrapper's trap, after the command ended
        left = process.run(
            ["sh", "-c", 'for p in /proc/[0-9]*; do read -r s < "$p/stat" 2>/dev/null && echo "$s"; done'],
            remote=hosts[0].remote,
        ).stdout
        in_group = [line for line in left.splitlines() if line.rpartition(")")[2].split()[2:3] == [group]]
        assert in_group == []
    finally:
        if follower.poll() is None:
            follower.kill()


def test_the_hosts_sessions_read_a_fresh_accounts_bashrc(hosts):
    """tests/netns_hosts.py: the machine's own ~/.bashrc (which may run pyenv and the like on
    every remote command) is not what the test hosts' sessions read."""
    home_rc = Path(os.path.expanduser("~/.bashrc"))
    if not home_rc.is_file():
        pytest.fail(f"{home_rc} does not exist: the hosts bind their .bashrc over it")
    machine = home_rc.read_text()
    seen = process.run(["sh", "-c", 'cat "$HOME/.bashrc"'], remote=hosts[0].remote).stdout
    assert seen == netns_hosts.FRESH_BASHRC
    assert home_rc.read_text() == machine  # the machine's own file is untouched


DRIVER = '''
import json, sys
from concurrent.futures import ThreadPoolExecutor
import click
from tp4 import cli
from tp4.core import process

spec = json.loads(sys.argv[1])
remotes = [process.Remote(**{**r, "options": tuple(r["options"])}) for r in spec["remotes"]]

@click.command("drive")
def drive() -> None:
    """What distribute does: remote commands from worker threads, or one in the main thread."""
    argv = spec["argv"]
    if spec["how"] == "threads":
        with ThreadPoolExecutor(max_workers=len(remotes)) as pool:
            list(pool.map(lambda r: process.run(argv, remote=r), remotes))
    elif spec["how"] == "remote":
        process.run(argv, remote=remotes[0])
    elif spec["how"] == "pipe":
        process.pipe([argv, process.Step(["cat"], remote=remotes[0])])
    else:
        process.run(argv)

cli.SUBCOMMANDS["drive"] = ("__main__", "drive", "a test driver")
print("ready", flush=True)
cli.main(["drive"])
'''


def _drive(tmp_path, hosts, how: str, argv: list[str]) -> subprocess.Popen:
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    spec = {
        "how": how,
        "argv": argv,
        "remotes": [
            {
                "host": h.remote.host,
                "user": h.remote.user,
                "identity": h.remote.identity,
                "options": list(h.remote.options),
            }
            for h in hosts
        ],
    }
    return subprocess.Popen(
        [sys.executable, str(script), json.dumps(spec)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env={**os.environ, "PYTHONPATH": str(PYTHON)},
    )


@pytest.mark.parametrize("how,copies", [("remote", 1), ("threads", 2), ("pipe", 1), ("local", 1)])
def test_ctrl_c_stops_the_children_everywhere_and_exits_130(tmp_path, hosts, how, copies):
    """SIGINT to tp4 alone (not to its process group): ssh never passes it on, yet the remote
    `sleep` must go, and tp4 says `interrupted` with exit code 130 and no traceback."""
    _stop_with(tmp_path, hosts, how, copies, signal.SIGINT, "interrupted", 130)


@pytest.mark.parametrize("sig,message,code", [(signal.SIGTERM, "terminated", 143), (signal.SIGHUP, "hung up", 129)])
def test_kill_and_a_closed_terminal_stop_the_children_too(tmp_path, hosts, sig, message, code):
    """tp4's children run in their own process groups, so a terminal's SIGHUP or a `kill` reaches
    only tp4: it must stop them itself."""
    _stop_with(tmp_path, hosts, "threads", 2, sig, message, code)


def _stop_with(tmp_path, hosts, how: str, copies: int, sig: int, message: str, code: int) -> None:
    argv = ["sleep", f"{900 + len(how) + sig}.{os.getpid()}"]
    cmdline = shlex.join(argv)
    launched = time.time()
    driver = _drive(tmp_path, hosts, how, argv)
    try:
        assert _wait_until(lambda: len(_running(cmdline)) == copies, 20), (
            driver.stderr.read() if driver.poll() is not None else "not started"
        )
        started = time.monotonic()
        driver.send_signal(sig)
        out, err = driver.communicate(timeout=30)
        assert _wait_until(lambda: not _running(cmdline), 5), f"{cmdline} still running"
        assert time.monotonic() - started < 10
    finally:
        if driver.poll() is None:
            driver.kill()
        for pid in _running(cmdline):
            os.kill(pid, signal.SIGKILL)
    assert driver.returncode == code, err
    assert message in err.splitlines() and "Traceback" not in err and "internal error" not in err
    assert not [p for p in glob.glob("/tmp/tp4-*.pid") if os.path.getmtime(p) >= launched - 1]


def test_a_stopping_signal_while_a_child_starts_still_stops_that_child(monkeypatch):
    """Ctrl-C in the moment between the child's start (it runs) and the funnel's record of it used
    to raise there, leaving a child stop_all never knew: it ran on after tp4 exited (test above,
    `local`, once under load). The signal now waits until the child is recorded, then stops it."""
    real_popen = subprocess.Popen
    started: list[subprocess.Popen] = []

    def popen_then_signal(*args, **kwargs):
        child = real_popen(*args, **kwargs)
        started.append(child)
        os.kill(os.getpid(), signal.SIGINT)  # its Python handler runs at the next line, here
        time.sleep(0.05)
        return child

    monkeypatch.setattr(process.subprocess, "Popen", popen_then_signal)
    previous = signal.signal(signal.SIGINT, process.on_interrupt)
    try:
        with pytest.raises(KeyboardInterrupt):
            process.run(["sleep", "30"])
    finally:
        signal.signal(signal.SIGINT, previous)
        process._interrupted_at = 0.0  # as before the signal: the tests after this one start commands
    assert len(started) == 1
    assert started[0].poll() is not None, "the child started as the signal came is still running"
    assert process._deferred is None and not process._spawning
