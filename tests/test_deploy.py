"""`tp4 deploy` against four real hosts (tests/deploy_hosts.py: real sshd, nix build, nix copy and
nix-env; stand-ins for systemd-run, systemctl and the systems' switch-to-configuration): the dry
run, a clean deploy of all four at once, the post-check and rollback of exactly the failing host,
--all-or-nothing, --on, an unreachable host."""

from __future__ import annotations

import logging
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from deploy_hosts import DeployCluster, System

from tp4.core import process

from tp4.hosts import deploy

SYSFS = "/etc/tp4-sys"
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with DeployCluster(tmp_path_factory.mktemp("deploy")) as c:
        c.reset()
        c.install("v0")
        yield c


@pytest.fixture
def line(cluster, monkeypatch):
    monkeypatch.setenv("NIX_CONFIG", cluster.nix_config)
    cluster.reset()
    cluster.clear_records()
    return cluster


def run(tp4_cli, cluster: DeployCluster, *args: str, profile: Path | None = None) -> tuple[int, str, str]:
    return tp4_cli(
        "deploy", "-p", str(profile or cluster.profile), "--flake", str(cluster.flake), "--sysfs", SYSFS, *args
    )


def state(cluster: DeployCluster) -> dict[str, tuple[int, str]]:
    """Each host's current generation and its system."""
    return {h.name: (cluster.current(h), cluster.current_path(h)) for h in cluster.hosts}


def newest(cluster: DeployCluster, host) -> int:
    """The host's highest generation number (nix-env numbers a new one after it)."""
    return max(n for n, _, _ in cluster.generations(host))


def words(command: str, fills: dict[str, str]) -> list[str]:
    """A shown command as its argv (an ssh's remote command as its own argv), each placeholder
    replaced by what the run used."""

    def fill(word: str) -> str:
        for k, v in fills.items():
            word = word.replace(k, v)
        return word

    argv = [fill(w) for w in shlex.split(command)]
    if argv[0] == "ssh":
        argv[-1:] = shlex.split(argv[-1])
    return argv


def row(out: str, host: str) -> list[str]:
    return next(line.split() for line in out.splitlines() if line.startswith(host + " "))


def test_the_dry_run_prints_the_commands_and_changes_nothing(line, tp4_cli):
    line.systems({h.name: System("dry") for h in line.hosts})
    before = state(line)
    code, out, err = run(tp4_cli, line, "--dry-run")
    assert code == 0, err
    assert state(line) == before
    assert all(not line.switches(h) and not line.units(h) and not line.serves(h) for h in line.hosts)
    commands = [shlex.split(x[2:]) for x in out.splitlines() if x.startswith("$ ")]
    assert commands[0] == deploy.build_argv(str(line.flake), [h.name for h in line.hosts])
    # per host: record, the closure, what the host lacks, check, set, record, switch, ssh, unit, then
    # the rollback's three
    assert len(commands) == 1 + 4 * 12
    assert sum(1 for c in commands if "--unit=tp4-deploy-switch" in shlex.split(c[-1])) == 4


def test_four_hosts_deploy_at_once_and_the_dry_run_showed_what_ran(line, tp4_cli, caplog):
    specs = {h.name: System("v1", seconds=1.5) for h in line.hosts}
    paths = line.build(specs)
    before = state(line)
    _, dry, _ = run(tp4_cli, line, "--dry-run")
    caplog.set_level(logging.DEBUG, logger="tp4.core.process")
    code, out, err = run(tp4_cli, line)
    assert code == 0, out + err
    # what ran: the build is shown on stderr, every other command logged (-v)
    ran = [words(x[2:], {}) for x in err.splitlines() if x.startswith("$ ")]
    ran += [words(r.getMessage()[2:], {}) for r in caplog.records if r.getMessage().startswith("$ ")]
    for h in line.hosts:
        gen, path = state(line)[h.name]
        assert path == paths[h.name] and gen == newest(line, h) > before[h.name][0]
        assert row(out, h.name) == [h.name, str(before[h.name][0]), str(gen), "deployed"]
        assert line.unit_state(h) == "active"
        # switched once, in the unit, with exactly the options tp4 gives it
        assert [(s[1], s[2], s[3]) for s in line.switches(h)] == [("start", path, "switch"), ("end", path, "switch")]
        [unit] = line.units(h)
        assert unit["unit"] == "tp4-deploy-switch.service" and unit["argv"] == [
            f"{path}/bin/switch-to-configuration",
            "switch",
        ]
        assert unit["options"] == [*deploy.SYSTEMD_RUN[1:], "--unit=tp4-deploy-switch"]
        # the copy asked the host which paths it lacks and imported them into its own store
        assert line.serves(h) == ["--check-validity --print-invalid", "--import "]
        assert line.has_path(h, path)
    # at once: every switch started before any ended
    starts = [s[0] for h in line.hosts for s in line.switches(h) if s[1] == "start"]
    ends = [s[0] for h in line.hosts for s in line.switches(h) if s[1] == "end"]
    assert max(starts) < min(ends), (starts, ends)
    # every command of the dry run but the rollback's ran, word for word, the placeholders filled
    fills = {f"<toplevel:{h.name}>": paths[h.name] for h in line.hosts}
    fills.update({f"<generation:{h.name}>": str(before[h.name][0]) for h in line.hosts})
    expected, rollback = [], []
    in_rollback = False
    for x in dry.splitlines():
        if x.startswith("# "):
            in_rollback = "on a failed switch" in x
        elif x.startswith("$ "):
            (rollback if in_rollback else expected).append(words(x[2:], fills))
    assert len(expected) == 1 + 4 * 9 and len(rollback) == 4 * 3
    missing = [c for c in expected if c not in ran]
    assert not missing, missing
    assert not [c for c in rollback if c in ran and "--list-generations" not in c]


def test_a_failing_post_check_rolls_back_exactly_that_host(line, tp4_cli):
    bad = line.hosts[2]
    specs = {h.name: System("v2", rdma="failed" if h is bad else "active") for h in line.hosts}
    paths = line.build(specs)
    before = state(line)
    code, out, err = run(tp4_cli, line)
    assert code == 1, out + err
    after = state(line)
    for h in line.hosts:
        if h is bad:
            assert after[h.name] == before[h.name]
            assert row(out, h.name) == [
                h.name,
                str(before[h.name][0]),
                str(newest(line, h)),
                "rolled",
                "back",
                "to",
                str(before[h.name][0]),
            ]
            # switched, then back to the recorded generation's system in the rollback unit
            assert [s[2] for s in line.switches(h) if s[1] == "start"] == [paths[h.name], before[h.name][1]]
            assert [u["unit"] for u in line.units(h)] == ["tp4-deploy-switch.service", "tp4-deploy-rollback.service"]
            assert (
                line.units(h)[1]["argv"][0]
                == f"{deploy.generation_link(before[h.name][0])}/bin/switch-to-configuration"
            )
            assert line.unit_state(h) == "active"  # what the old system's switch set again
        else:
            assert after[h.name][0] == newest(line, h) > before[h.name][0] and row(out, h.name)[-1] == "deployed"
            assert [u["unit"] for u in line.units(h)] == ["tp4-deploy-switch.service"]
    assert f"{bad.name}: post-check: rdma: tp4-rdma-check.service is failed" in out
    assert f"failed: {bad.name}" in err


def test_all_or_nothing_takes_every_host_back(line, tp4_cli):
    bad = line.hosts[1]
    line.systems({h.name: System("v3", fail=h is bad) for h in line.hosts})
    before = state(line)
    code, out, err = run(tp4_cli, line, "--all-or-nothing")
    assert code == 1, out + err
    assert state(line) == before
    for h in line.hosts:
        assert row(out, h.name)[-4:] == ["rolled", "back", "to", str(before[h.name][0])]
        assert [u["unit"] for u in line.units(h)] == ["tp4-deploy-switch.service", "tp4-deploy-rollback.service"]
    assert "activation failed (on purpose)" in out
    assert "rolled back with the others (--all-or-nothing; failed: node2)" in out


def test_a_system_that_does_not_build_changes_no_host(line, tp4_cli):
    line.systems({h.name: System("v9", broken=h is line.hosts[3]) for h in line.hosts})
    before = state(line)
    code, out, err = run(tp4_cli, line)
    assert code == 1 and "building the systems" in err and "this system does not build (on purpose)" in err, err
    assert state(line) == before and not any(line.units(h) or line.serves(h) for h in line.hosts)
    assert "nix: building '/nix/store/" in err  # nix's progress, one line per build


def test_on_picks_the_hosts(line, tp4_cli):
    line.systems({h.name: System("v4") for h in line.hosts})
    before = state(line)
    code, out, err = run(tp4_cli, line, "--on", "node2", "--on", "node4")
    assert code == 0, out + err
    after = state(line)
    for h in line.hosts:
        picked = h.name in ("node2", "node4")
        assert (after[h.name][0] == newest(line, h) > before[h.name][0]) if picked else after[h.name] == before[h.name]
        assert bool(line.units(h)) == picked and bool(line.serves(h)) == picked
    assert [x.split()[0] for x in out.splitlines()[1:]] == ["node2", "node4"]


def test_user_errors_exit_2_before_anything_runs(line, tp4_cli):
    before = state(line)
    for args, message in (
        (["--on", "nope"], "--on 'nope': no such node"),
        (["--skip-check", "NOPE"], "--skip-check 'NOPE': no such doctor check"),
    ):
        code, out, err = run(tp4_cli, line, *args)
        assert code == 2 and message in err, err
    assert state(line) == before and not any(line.units(h) for h in line.hosts)


def test_an_unreachable_host_is_reported_and_with_all_or_nothing_no_host_changes(line, tp4_cli):
    down = line.hosts[3]
    address = line.hosts.unreachable()
    profile = line.workdir / "profile-down.toml"
    profile.write_text(line.profile_text().replace(f'ssh = "{down.address}"', f'ssh = "{address}"'))
    line.systems({h.name: System("v5") for h in line.hosts})
    before = state(line)
    code, out, err = run(tp4_cli, line, "--all-or-nothing", profile=profile)
    assert code == 1, out + err
    assert state(line) == before and not any(line.units(h) for h in line.hosts)
    assert row(out, down.name)[-1] == "failed" and f"  {down.name}: reading the system generations" in out
    for h in line.hosts[:3]:
        assert "not switched (--all-or-nothing" in out and row(out, h.name)[-1] == "unchanged"
    # without it the others deploy
    line.systems({h.name: System("v6") for h in line.hosts})
    code, out, err = run(tp4_cli, line, profile=profile)
    assert code == 1 and row(out, down.name)[-1] == "failed"
    for h in line.hosts[:3]:
        assert line.current(h) == newest(line, h) > before[h.name][0] and row(out, h.name)[-1] == "deployed"


def test_a_switch_that_ends_its_ssh_connection_still_completes_and_is_checked(line, tp4_cli):
    """What systemd-run is for: the switch restarts sshd (here: ends the connection that started
    it), the activation goes on in its unit, tp4 waits for the unit on a new connection and the
    post-check decides."""
    cut = line.hosts[1]
    paths = line.build({h.name: System("v7", drop_ssh=h is cut, seconds=1.0) for h in line.hosts})
    before = state(line)
    code, out, err = run(tp4_cli, line)
    assert code == 0, out + err
    assert f"{cut.name}: the ssh connection ended during the switch" in err
    assert [(s[1], s[2]) for s in line.switches(cut)] == [("start", paths[cut.name]), ("end", paths[cut.name])]
    assert state(line)[cut.name] == (newest(line, cut), paths[cut.name]) and newest(line, cut) > before[cut.name][0]
    assert line.unit_state(cut, "tp4-deploy-switch.service") == "inactive"  # ended and collected


def test_a_host_that_stops_taking_new_ssh_connections_fails_its_post_check(line, tp4_cli):
    """sshd stops listening after the switch: the shared connection still works (a check over it
    would pass), a new one does not; the host goes back to its generation over the shared one."""
    mute = line.hosts[0]
    line.systems({h.name: System("v8", stop_sshd=h is mute) for h in line.hosts})
    before = state(line)
    try:
        code, out, err = run(tp4_cli, line, "--check-timeout", "2")
        assert process.run(["true"], remote=mute.remote).returncode == 0  # the shared connection lives on
    finally:
        line.hosts._start_sshd(mute)
        line.hosts.wait_for_sshd(mute)
    assert code == 1, out + err
    assert f"{mute.name}: post-check: ssh: a new ssh connection fails" in out
    assert row(out, mute.name)[-4:] == ["rolled", "back", "to", str(before[mute.name][0])]
    assert state(line)[mute.name] == before[mute.name]
    assert all(row(out, h.name)[-1] == "deployed" for h in line.hosts[1:])


def test_the_stand_ins_refuse_what_systemd_and_nix_env_refuse(line):
    """The stand-ins are strict where tp4 could go wrong: an unknown option, a relative command, a
    unit already loaded; nix-env (the real one) refuses an unknown generation (a path not in the
    store it would try to substitute: not tried here, offline)."""
    host = line.hosts[0]
    for argv, message in (
        (["systemd-run", "--bogus", "/bin/true"], "unrecognized option '--bogus'"),
        (["systemd-run", "--wait", "true"], "Failed to find executable true"),
        (["systemd-run", "--unit=x", "--wait", "--service-type=nope", "/bin/true"], "Failed to parse service type"),
        (["systemd-run"], "Command line to execute required"),
        (
            ["nix-env", "-p", deploy.SYSTEM_PROFILE, "--switch-generation", "9999"],
            "profile version 9999 does not exist",
        ),
    ):
        proc = host.run(*argv, check=False)
        assert proc.returncode != 0 and message in proc.stderr, (argv, proc.stderr)
    # a failed unit without --collect stays loaded, and the same name is refused then
    assert host.run("systemd-run", "--unit=tp4-test-stays", "--wait", "/bin/false", check=False).returncode == 1
    again = host.run("systemd-run", "--unit=tp4-test-stays", "--wait", "--collect", "/bin/true", check=False)
    assert again.returncode == 1 and "tp4-test-stays.service was already loaded" in again.stderr
    assert host.run("systemctl", "is-active", "--", "tp4-test-stays.service", check=False).stdout.strip() == "failed"
    # with --collect a failed unit goes, and its exit status is systemd-run's
    assert (
        host.run("systemd-run", "--unit=tp4-test-goes", "--wait", "--collect", "/bin/false", check=False).returncode
        == 1
    )
    assert host.run("systemctl", "is-active", "--", "tp4-test-goes.service", check=False).stdout.strip() == "inactive"
    # the unit's environment is a unit's, not the caller's
    env = host.run("systemd-run", "--wait", "--pipe", "--collect", "--setenv=A=1", "/usr/bin/env").stdout.split()
    assert sorted(env) == ["A=1", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]


def test_ctrl_c_during_the_switches_takes_every_switched_host_back(line, tmp_path):
    """SIGINT while the four switches run (each takes 4 s in its unit, which outlives the
    interrupted ssh command): tp4 waits for each switch to finish there, switches every host back
    to its recorded generation, prints the table and exits 130."""
    paths = line.build({h.name: System("v9", seconds=4.0) for h in line.hosts})
    before = state(line)
    child = subprocess.Popen(
        [sys.executable, "-m", "tp4", "deploy", "-p", str(line.profile), "--flake", str(line.flake), "--sysfs", SYSFS],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO / "python"), "NIX_CONFIG": line.nix_config},
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and child.poll() is None:
            if all(any(s[1] == "start" for s in line.switches(h)) for h in line.hosts):
                break
            time.sleep(0.2)
        assert child.poll() is None, child.communicate()
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=120)
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode == 130, out + err
    assert "interrupted" in err and "Traceback" not in out + err
    assert state(line) == before
    for h in line.hosts:
        starts = [s for s in line.switches(h) if s[1] == "start"]
        ends = [s for s in line.switches(h) if s[1] == "end"]
        # the new system's switch ran to its end before the rollback's began
        assert [s[2] for s in starts] == [paths[h.name], before[h.name][1]], line.switches(h)
        assert ends[0][0] <= starts[1][0]
        assert [u["unit"] for u in line.units(h)] == ["tp4-deploy-switch.service", "tp4-deploy-rollback.service"]
        assert row(out, h.name)[-4:] == ["rolled", "back", "to", str(before[h.name][0])]
        assert newest(line, h) > before[h.name][0]  # the new generation stays in the list, not current
    assert "interrupted (Ctrl-C) during the deploy" in out
