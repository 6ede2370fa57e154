"""tp4's ssh host keys (tp4.core.knownhosts, tp4.hosts.trust, `tp4 hosts`), on real sshd in netns hosts:
trusting a node after its fingerprints are shown, refusing an unknown or changed key with the
fix named (exit 2, for any command), one shared connection per host, and hostile host names
refused before ssh runs."""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import pytest

from netns_hosts import SSHD, NetnsHosts, storage_conf
from tp4.core import knownhosts, process
from tp4.core.errors import HostKeyError, Tp4Error
from tp4.core.process import Remote

PYTHON = Path(__file__).resolve().parent.parent / "python"


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    with NetnsHosts(tmp_path_factory.mktemp("netns"), count=2) as hosts:
        yield hosts


@pytest.fixture
def empty(tmp_path, monkeypatch, hosts):
    """tp4's known_hosts empty for this test (the hosts' own record is left alone), and no
    shared connection still open to a host (one would let ssh skip the key check)."""
    hosts.close_connections()
    file = tmp_path / "state" / "known_hosts"
    monkeypatch.setenv("TP4_KNOWN_HOSTS", str(file))
    yield file
    hosts.close_connections()


def fingerprint_by_ssh_keygen(pub: Path) -> str:
    return process.run(["ssh-keygen", "-lf", str(pub)]).stdout.split()[1]


def file_bytes(path: Path) -> bytes | None:
    return path.read_bytes() if path.exists() else None


def test_trust_shows_the_fingerprints_records_the_keys_and_a_second_trust_says_already_trusted(hosts, empty, tp4_cli):
    fps = [fingerprint_by_ssh_keygen(h.dir / "host_key.pub") for h in hosts]
    code, out, err = tp4_cli("hosts", "trust", "--host", hosts[0].address, "--host", hosts[1].address, "--yes")
    assert code == 0, err
    for h, fp in zip(hosts, fps, strict=True):
        assert f"{h.address}: new\n  ED25519 {fp}\n" in out
    assert "recorded 2 hosts in" in out
    lines = empty.read_text().splitlines()
    assert sorted(lines) == sorted(f"{h.address} {' '.join(hosts.host_key(h))}" for h in hosts)
    assert process.run(["echo", "ok"], remote=hosts[0].remote).stdout == "ok\n"  # ssh accepts what was recorded

    before = empty.read_bytes()
    code, out, err = tp4_cli("hosts", "trust", "--host", hosts[0].address, "--yes")
    assert code == 0, err
    assert out == f"{hosts[0].address}: already trusted (ED25519 {fps[0]})\n"
    assert empty.read_bytes() == before

    code, out, err = tp4_cli("hosts", "list")
    assert code == 0, err
    assert out.splitlines() == [f"{h.address}  ED25519 {fp}" for h, fp in zip(hosts, fps, strict=True)]


def test_trust_without_yes_off_a_terminal_refuses_and_writes_nothing(hosts, empty):
    proc = subprocess.run(
        [sys.executable, "-m", "tp4", "hosts", "trust", "--host", hosts[0].address],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(PYTHON)},
    )
    assert proc.returncode == 2, proc.stderr
    assert fingerprint_by_ssh_keygen(hosts[0].dir / "host_key.pub") in proc.stdout  # shown all the same
    assert (
        "stdin is not a terminal to confirm on; fix: check the fingerprints against the nodes and rerun with --yes"
        in proc.stderr
    )
    assert "Traceback" not in proc.stderr
    assert not empty.exists()


def test_trust_every_node_of_a_profile_a_worker_on_its_own_ssh_port(hosts, empty, tmp_path, tp4_cli):
    """The head and the workers of the profile's plan; a node on port 2222 is recorded as
    [host]:2222, as OpenSSH looks it up, and tp4's ssh then reaches it there."""
    head, worker = hosts[0], hosts[1]
    extra = process.start(
        [
            "ip",
            "netns",
            "exec",
            worker.namespace,
            SSHD,
            "-D",
            "-e",
            "-o",
            "Port=2222",
            "-f",
            str(worker.dir / "sshd_config"),
        ],
        stdout=process.DEVNULL,
        stderr=process.DEVNULL,
    )
    profile = tmp_path / "profile.toml"
    profile.write_text(
        f'[cluster]\nuser = "root"\nidentity = "{hosts.key}"\n'
        f'head = {{ name = "head", ip = "{head.address}" }}\n'
        f'workers = [{{ name = "w1", ip = "{worker.address}", ssh_port = 2222 }}]\n[engine]\ntp = 2\n'
    )
    try:
        code, out, err = 0, "", ""
        for _ in range(50):  # until the extra sshd listens
            code, out, err = tp4_cli("hosts", "trust", "--profile", profile, "--yes")
            if code == 0:
                break
        assert code == 0, err
        name = f"[{worker.address}]:2222"
        assert f"{head.address}: new\n" in out and f"{name}: new\n" in out
        assert sorted(empty.read_text().splitlines()) == sorted(
            [f"{head.address} {' '.join(hosts.host_key(head))}", f"{name} {' '.join(hosts.host_key(worker))}"]
        )
        on_2222 = Remote(host=worker.address, user="root", identity=str(hosts.key), port=2222)
        assert process.run(["echo", "ok"], remote=on_2222).stdout == "ok\n"
        with pytest.raises(HostKeyError, match=re.escape(f"{worker.address} is not a host tp4 trusts yet")):
            process.run(["true"], remote=worker.remote)  # port 22 is another entry
        code, out, err = tp4_cli("hosts", "trust", "--profile", profile, "--host", head.address)
        assert code == 2 and "--profile and --host contradict each other" in err
    finally:
        process.stop(extra)
        subprocess.run(
            [
                *Remote(host=worker.address, user="root", port=2222).ssh_argv()[:-2],
                "-O",
                "exit",
                "--",
                f"root@{worker.address}",
            ],
            capture_output=True,
            check=False,
        )


def untrusted_message(host) -> str:
    return (
        f"error: {host.address} is not a host tp4 trusts yet: its key is not in {knownhosts.path()}; fix: run "
        f"`tp4 hosts trust --profile FILE` (every node of the line) or `tp4 hosts trust --host {host.address}`, "
        "check the fingerprints it shows, and retry"
    )


@pytest.fixture
def head(monkeypatch, tmp_path):
    """A podman store for the head (short path: see tests/test_build.py) holding one image."""
    store = Path(tempfile.mkdtemp(prefix="tp4h-", dir="/tmp"))
    monkeypatch.setenv("CONTAINERS_STORAGE_CONF", str(storage_conf(store)))
    conf = tmp_path / "containers.conf"  # this sandbox's hard limits: see tests/test_build.py
    conf.write_text('[containers]\ndefault_ulimits = ["nofile=1024:1024", "nproc=4096:4096"]\n')
    monkeypatch.setenv("CONTAINERS_CONF", str(conf))
    (tmp_path / "root").mkdir()
    (tmp_path / "root" / "f").write_text("x")
    with tarfile.open(tmp_path / "root.tar", "w") as tar:
        tar.add(tmp_path / "root" / "f", arcname="f")
    process.run(["podman", "import", "-q", str(tmp_path / "root.tar"), "tp4-hosts:test"])
    yield "tp4-hosts:test"
    process.run(["podman", "rmi", "-a", "-f"], check=False)
    shutil.rmtree(store, ignore_errors=True)


def node_args(hosts, host) -> list[str]:
    return ["--runtime", "podman", "--user", "root", "--identity", str(hosts.key), "--worker", host.address]


def test_an_untrusted_host_stops_any_command_with_the_fix_and_exit_2(hosts, empty, head, tp4_cli):
    host = hosts[0]
    code, out, err = tp4_cli("images", *node_args(hosts, host))
    assert code == 2, (out, err)
    assert untrusted_message(host) in err.splitlines()
    assert "Traceback" not in err and "internal error" not in err

    code, out, err = tp4_cli("distribute", "--check", "--image", head, *node_args(hosts, host))
    assert code == 2, (out, err)
    assert f"{host.address}: failed: {untrusted_message(host)[7:]}" in out
    assert err.count(untrusted_message(host)[7:]) == 1 and "Traceback" not in err

    # the funnel refuses it for check=False too, and in a pipe; nothing reached the host
    with pytest.raises(HostKeyError, match=re.escape(f"{host.address} is not a host tp4 trusts yet")):
        process.run(["true"], remote=host.remote, check=False)
    with pytest.raises(HostKeyError):
        process.pipe([["echo", "x"], process.Step(["cat"], remote=host.remote)])


def test_a_changed_host_key_is_refused_naming_the_host_and_replace_accepts_it(
    hosts, tmp_path, monkeypatch, head, tp4_cli
):
    host = hosts[1]
    file = tmp_path / "known_hosts"
    shutil.copy(hosts.known_hosts, file)
    monkeypatch.setenv("TP4_KNOWN_HOSTS", str(file))
    old_fp = fingerprint_by_ssh_keygen(host.dir / "host_key.pub")
    assert process.run(["true"], remote=host.remote).returncode == 0  # a shared connection is open
    hosts.new_host_key(1)  # sshd and its sessions (the shared connection too) gone; a new key
    new_fp = fingerprint_by_ssh_keygen(host.dir / "host_key.pub")
    assert new_fp != old_fp
    before = file.read_bytes()
    try:
        with pytest.raises(HostKeyError, match=re.escape(f"the host key of {host.address} changed")) as refused:
            process.run(["true"], remote=host.remote, check=False)
        assert refused.value.changed and refused.value.host == host.address
        with pytest.raises(HostKeyError, match=re.escape(f"the host key of {host.address} changed")):
            process.pipe([["echo", "x"], process.Step(["cat"], remote=host.remote)])
        assert f"run `tp4 hosts trust --replace --host {host.address}`" in refused.value.message

        code, out, err = tp4_cli("images", *node_args(hosts, host))
        assert code == 2, (out, err)
        assert f"error: the host key of {host.address} changed" in err and "Traceback" not in err

        code, out, err = tp4_cli("hosts", "trust", "--host", hosts[0].address, "--host", host.address, "--yes")
        assert code == 2, (out, err)
        assert f"{hosts[0].address}: already trusted" in out
        assert f"{host.address}: CHANGED\n  recorded ED25519 {old_fp}\n  offered  ED25519 {new_fp}\n" in out
        assert (
            f"error: the host key of {host.address} changed: recorded ED25519 {old_fp}; now offered ED25519 {new_fp}; "
            f"nothing was written to {file}; if the change is expected (the host was reinstalled), run "
            f"`tp4 hosts trust --replace --host {host.address}`"
        ) in err
        assert file.read_bytes() == before

        code, out, err = tp4_cli("hosts", "trust", "--replace", "--host", host.address, "--yes")
        assert code == 0, err
        assert "recorded 1 host in" in out
        lines = file.read_text().splitlines()
        assert f"{host.address} {' '.join(hosts.host_key(host))}" in lines
        assert not [
            line
            for line in lines
            if line.startswith(f"{host.address} ") and old_fp in knownhosts.fingerprint(line.split()[2])
        ]
        assert len([line for line in lines if line.startswith(f"{host.address} ")]) == 1
        code, out, err = tp4_cli("images", *node_args(hosts, host))
        assert code == 0, err
    finally:
        # the module's own record follows the host's new key, for the tests after this one
        knownhosts.update([host.address], [(host.address, *hosts.host_key(host))], hosts.known_hosts)


def test_forget_refuses_the_host_at_once_even_with_its_shared_connection_open(hosts, tmp_path, monkeypatch, tp4_cli):
    file = tmp_path / "known_hosts"
    shutil.copy(hosts.known_hosts, file)
    monkeypatch.setenv("TP4_KNOWN_HOSTS", str(file))
    assert process.run(["true"], remote=hosts[0].remote).returncode == 0
    code, out, err = tp4_cli("hosts", "forget", hosts[0].address)
    assert (code, out) == (0, f"{hosts[0].address}: forgot 1 key\n"), err
    with pytest.raises(HostKeyError, match="not a host tp4 trusts yet"):
        process.run(["true"], remote=hosts[0].remote)
    assert process.run(["true"], remote=hosts[1].remote).returncode == 0  # the other one stays
    code, out, err = tp4_cli("hosts", "forget", hosts[0].address)
    assert code == 0 and "not recorded" in out


def accepted(host) -> int:
    """Connections the host's sshd accepted (LogLevel VERBOSE: one "Connection from" each)."""
    return (host.dir / "sshd.log").read_text(errors="replace").count("Connection from ")


def test_commands_to_one_host_share_one_connection_in_a_private_directory(hosts, monkeypatch):
    runtime = Path(tempfile.mkdtemp(prefix="tp4r-", dir="/tmp"))
    try:
        monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
        control = runtime / "tp4-ssh"
        hosts.close_connections()
        before = accepted(hosts[0])
        for n in range(6):
            assert process.run(["echo", str(n)], remote=hosts[0].remote).stdout == f"{n}\n"
        process.pipe([["echo", "x"], process.Step(["cat"], remote=hosts[0].remote)])
        assert accepted(hosts[0]) - before == 1
        st = os.stat(control)
        assert stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == os.getuid()
        sockets = [p for p in control.iterdir() if stat.S_ISSOCK(p.lstat().st_mode)]
        assert len(sockets) == 1 and len(str(sockets[0])) < 100
        # the ssh a remote command runs with names that directory, and every option of the funnel
        argv = hosts[0].remote.ssh_argv()
        for opt in (
            "BatchMode=yes",
            "StrictHostKeyChecking=yes",
            f"UserKnownHostsFile={hosts.known_hosts}",
            "GlobalKnownHostsFile=/dev/null",
            "ControlMaster=auto",
            f"ControlPath={control}/%C",
            f"ControlPersist={process.CONTROL_PERSIST}",
        ):
            assert argv[argv.index(opt) - 1] == "-o", opt
        # a reverse tunnel gets a connection of its own (a forward through the shared one would stay)
        from tp4.image import distribute, imagestore

        tunnel = distribute.tunneled(hosts[0].remote, 5000, imagestore.Store(runtime, 5000))
        assert "ControlPath=none" in tunnel.ssh_argv() and "ControlMaster=auto" not in tunnel.ssh_argv()
        before = accepted(hosts[0])
        process.run(["true"], remote=tunnel)
        assert accepted(hosts[0]) - before == 1
        hosts.close_connections()
    finally:
        shutil.rmtree(runtime, ignore_errors=True)


def test_the_control_directory_is_made_private_and_one_of_another_user_is_refused(monkeypatch):
    runtime = Path(tempfile.mkdtemp(prefix="tp4r-", dir="/tmp"))
    try:
        monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
        (runtime / "tp4-ssh").mkdir(mode=0o755)
        os.chmod(runtime / "tp4-ssh", 0o755)
        assert process.control_dir() == runtime / "tp4-ssh"
        assert stat.S_IMODE(os.stat(runtime / "tp4-ssh").st_mode) == 0o700
        other = Path(tempfile.mkdtemp(prefix="tp4r-", dir="/tmp"))
        monkeypatch.setenv("XDG_RUNTIME_DIR", str(other))
        (other / "tp4-ssh").mkdir()
        os.chown(other / "tp4-ssh", 65534, 65534)
        with pytest.raises(Tp4Error, match="is not a directory of yours; fix: remove it, or set XDG_RUNTIME_DIR"):
            process.control_dir()
        shutil.rmtree(other)
        long = runtime / ("d" * 70)  # a socket path there would be too long: /tmp/tp4-ssh-<uid> instead
        long.mkdir()
        monkeypatch.setenv("XDG_RUNTIME_DIR", str(long))
        assert process.control_dir() == Path(f"/tmp/tp4-ssh-{os.getuid()}")
    finally:
        shutil.rmtree(runtime, ignore_errors=True)


def test_a_timed_out_remote_command_names_its_host_and_purpose(hosts):
    with pytest.raises(
        Tp4Error,
        match=rf"^waiting for the test's sleep \(`sleep 41\.5` on root@{re.escape(hosts[0].address)}\) "
        r"did not finish within 1 s$",
    ):
        process.run(["sleep", "41.5"], remote=hosts[0].remote, timeout=1, purpose="waiting for the test's sleep")


@pytest.mark.parametrize("host", ["-oProxyCommand=touch /tmp/x", "node\nevil ssh-ed25519 AAAA", "node\0x", "a b", ""])
def test_a_hostile_host_name_is_refused_before_ssh_runs(host, tmp_path, monkeypatch, tp4_cli, empty):
    bin_dir = tmp_path / "bin"  # an ssh or ssh-keyscan that ran would leave a mark
    bin_dir.mkdir()
    for tool in ("ssh", "ssh-keyscan"):
        (bin_dir / tool).write_text(f"#!/bin/sh\ntouch {tmp_path}/ran\n")
        (bin_dir / tool).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    code, out, err = tp4_cli("hosts", "trust", f"--host={host}", "--yes")
    assert code == 2, (out, err)
    # a NUL is refused for any argument before the command runs (no argument can carry it)
    reason = "holds a NUL character" if "\0" in host else "is not a host name or address"
    assert err.startswith("error: --host: ") and reason in err and "Traceback" not in err
    code, out, err = tp4_cli("hosts", "forget", "--", host)
    assert code == 2 and err.startswith("error: HOST: "), err
    with pytest.raises(Tp4Error, match="not a host name or address") as refused:
        process.run(["true"], remote=Remote(host=host))
    assert refused.value.exit_code == 2
    assert not (tmp_path / "ran").exists() and not empty.exists()


def test_hashed_and_wildcard_lines_are_read_as_openssh_reads_them(tmp_path):
    key = "AAAAC3NzaC1lZDI1NTE5AAAAIEo2XX3SLbi8YUkyB4dxDXOILfw8PDxBcTbpfS04WNZq"
    file = tmp_path / "known_hosts"
    file.write_text(f"spark2 ssh-ed25519 {key}\n[spark3]:2222 ssh-ed25519 {key}\n*.lab,!bad.lab ssh-ed25519 {key}\n")
    process.run(["ssh-keygen", "-q", "-H", "-f", str(file)])  # hashes the plain names, as HashKnownHosts would
    assert all(line.startswith("|1|") or line.startswith("*.lab") for line in file.read_text().splitlines())
    assert knownhosts.trusted("spark2", file) and knownhosts.trusted("[spark3]:2222", file)
    assert not knownhosts.trusted("spark3", file) and not knownhosts.trusted("spark4", file)
    assert knownhosts.trusted("a.lab", file) and not knownhosts.trusted("bad.lab", file)
    assert knownhosts.update(["spark2"], [], file) == 1
    assert not knownhosts.trusted("spark2", file) and knownhosts.trusted("[spark3]:2222", file)
    assert (
        knownhosts.fingerprint(key)
        == process.run(["ssh-keygen", "-lf", "-"], input=f"x ssh-ed25519 {key}\n").stdout.split()[1]
    )


def test_the_profile_and_the_funnel_take_the_same_host_names():
    from tp4.line.profile import models

    assert models._HOST.pattern == knownhosts.HOST.pattern


@pytest.mark.parametrize("answer,code", [("n", 2), ("y", 0)])
def test_trust_on_a_terminal_asks_before_recording(hosts, empty, answer, code):
    main, terminal = os.openpty()
    try:
        tp4 = subprocess.Popen(
            [sys.executable, "-m", "tp4", "hosts", "trust", "--host", hosts[0].address],
            stdin=terminal,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": str(PYTHON)},
        )
        os.write(main, f"{answer}\n".encode())
        out, err = tp4.communicate(timeout=60)
    finally:
        os.close(main)
        os.close(terminal)
    assert tp4.returncode == code, err
    assert f"record the keys of {hosts[0].address} in {empty}? [y/N]" in err
    if answer == "y":
        assert empty.read_text() == f"{hosts[0].address} {' '.join(hosts.host_key(hosts[0]))}\n"
        assert "recorded 1 host in" in out
    else:
        assert "not recorded: you declined; nothing was written" in err and not empty.exists()


def test_trust_names_every_node_that_gave_no_key(tmp_path, monkeypatch, tp4_cli):
    """Nodes scanned in parallel are all reported when several fail, not only the first; what
    tp4 is doing is said on stderr before the scan (it can take the keyscan's timeout)."""
    monkeypatch.setenv("TP4_KNOWN_HOSTS", str(tmp_path / "known_hosts"))
    hosts = ["127.0.0.2", "127.0.0.3", "127.0.0.4"]
    code, out, err = tp4_cli("hosts", "trust", *[a for h in hosts for a in ("--host", h)], "--port", "9", "--yes")
    assert code == 1, err
    assert err.startswith("fetching the host keys of 3 nodes")
    assert "3 of 3 nodes gave no host key" in err
    for h in hosts:
        assert f"  - [{h}]:9: ssh-keyscan fetched no host key" in err, err
        assert err.count(f"[{h}]:9: ssh-keyscan fetched no host key") == 1, err  # told once
    # progress: a line per node as its scan ends, counted
    done = re.findall(r"^\[(\d)/3\] (\S+): failed \(named in the error at the end\)$", err, re.M)
    assert [d for d, _ in done] == ["1", "2", "3"] and sorted(h for _, h in done) == hosts, err
    assert not (tmp_path / "known_hosts").exists() and "Traceback" not in err
