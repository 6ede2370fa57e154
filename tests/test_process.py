"""The one funnel for subprocesses: how a remote command reaches ssh's argv."""

from __future__ import annotations

import shlex

import pytest

from tp4 import process
from tp4.process import Remote, full_argv

# not a `unit` module: it drives the real ssh client (checks.unit has no ssh)


def test_double_dash_comes_right_before_the_destination_and_the_command_follows_it():
    remote = Remote(host="spark2", user="zurih", identity="/k", port=2222, options=("Ciphers=aes128-ctr",))
    argv = full_argv(["podman", "load", "-i", "/tmp/x y"], remote)
    i = argv.index("--")
    assert argv[0] == "ssh" and argv[i + 1] == "zurih@spark2"
    assert argv[i + 2:] == [shlex.join(["podman", "load", "-i", "/tmp/x y"])]
    assert argv.count("--") == 1


@pytest.mark.parametrize("host", ["-oProxyCommand=id", "-Jevil.example.com", "-L2222:localhost:22"])
def test_a_host_that_reads_as_an_option_is_after_the_double_dash(host):
    argv = Remote(host=host).ssh_argv()
    assert argv[-2:] == ["--", host]


def test_a_hostile_destination_never_runs_as_an_ssh_option(tmp_path):
    """Real ssh: without `--` before it, `-oProxyCommand=...` would be an option and run."""
    marker = tmp_path / "pwned"
    remote = Remote(host=f"-oProxyCommand=touch {marker}", connect_timeout=5)
    proc = process.run(["true"], remote=remote, check=False, timeout=30)
    assert proc.returncode != 0
    assert not marker.exists()


def test_a_hostile_user_never_runs_as_an_ssh_option(tmp_path):
    marker = tmp_path / "pwned"
    remote = Remote(host="localhost", user=f"-oProxyCommand=touch {marker} #", connect_timeout=5)
    process.run(["true"], remote=remote, check=False, timeout=30)
    assert not marker.exists()
