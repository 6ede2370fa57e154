"""What `tp4 deploy` runs, from the plan alone: the build, the copy, the profile and the switch
commands per host, the refusals of bad arguments, and that no profile value changes the shape of
a command (tests/test_deploy.py runs them against real hosts)."""

from __future__ import annotations

import json
import shlex

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tp4.core import process

from tp4.hosts import deploy
from tp4.core.errors import InvalidInput, Tp4Error
from tp4.hosts.nodes import Node, nodes_of
from tp4.line.plan import build_plan
from tp4.line.profile import load_text

pytestmark = pytest.mark.unit

NIXOS = (
    '[cluster]\nuser = "tp4"\n[cluster.head]\nname = "h"\nip = "10.0.0.1"\nkind = "nixos"\nruntime = "podman"\n'
    '[[cluster.workers]]\nname = "w1"\nip = "10.0.0.2"\nkind = "nixos"\nuser = "root"\n'
    '[[cluster.workers]]\nname = "w.2"\nip = "10.0.0.3"\nkind = "nixos"\nssh_port = 2222\n'
    '[[cluster.workers]]\nname = "w3"\nip = "10.0.0.4"\n'
)
SYSTEMD_RUN = [
    "systemd-run",
    "--wait",
    "--collect",
    "--pipe",
    "--quiet",
    "--no-ask-password",
    "--service-type=exec",
    "--setenv=LOCALE_ARCHIVE",
]


@pytest.fixture(scope="module")
def nodes() -> list[Node]:
    return nodes_of(build_plan(load_text(NIXOS, "t")))


def test_the_systems_are_built_once_here_with_quoted_attribute_names(nodes):
    argv = deploy.build_argv("/src/tp4", [n.name for n in deploy.hosts_of(nodes, ())])
    assert argv == [
        "nix",
        "--extra-experimental-features",
        "nix-command flakes",
        "build",
        "--no-link",
        "--json",
        "--log-format",
        "internal-json",
        "-v",
        "/src/tp4#nixosConfigurations.h.config.system.build.toplevel",
        "/src/tp4#nixosConfigurations.w1.config.system.build.toplevel",
        '/src/tp4#nixosConfigurations."w.2".config.system.build.toplevel',
    ]
    out = json.dumps([{"drvPath": f"/nix/store/d{i}.drv", "outputs": {"out": f"/nix/store/{i}-sys"}} for i in range(3)])
    assert deploy.toplevels(out, ["h", "w1", "w.2"]) == {
        "h": "/nix/store/0-sys",
        "w1": "/nix/store/1-sys",
        "w.2": "/nix/store/2-sys",
    }
    with pytest.raises(Tp4Error, match="printed 2 paths for 3 systems"):
        deploy.toplevels(json.dumps(json.loads(out)[:2]), ["h", "w1", "w.2"])
    with pytest.raises(Tp4Error, match="no output paths"):
        deploy.toplevels("oops", ["h"])


def test_the_commands_on_a_host_and_sudo_for_a_user_other_than_root(nodes):
    head, w1, w2 = nodes[0], nodes[1], nodes[2]
    top = "/nix/store/abc-nixos-system-h-1"
    assert deploy.generations_argv(head) == [
        "sudo",
        "-n",
        "nix-env",
        "-p",
        "/nix/var/nix/profiles/system",
        "--list-generations",
    ]
    assert deploy.set_argv(w1, top) == ["nix-env", "-p", "/nix/var/nix/profiles/system", "--set", top]  # root: no sudo
    assert deploy.switch_argv(head, top) == [
        "sudo",
        "-n",
        *SYSTEMD_RUN,
        "--unit=tp4-deploy-switch",
        f"{top}/bin/switch-to-configuration",
        "switch",
    ]
    assert deploy.switch_generation_argv(head, 41) == [
        "sudo",
        "-n",
        "nix-env",
        "-p",
        "/nix/var/nix/profiles/system",
        "--switch-generation",
        "41",
    ]
    assert deploy.rollback_argv(w1, 41) == [
        *SYSTEMD_RUN,
        "--unit=tp4-deploy-rollback",
        "/nix/var/nix/profiles/system-41-link/bin/switch-to-configuration",
        "switch",
    ]
    assert deploy.unit_argv() == ["systemctl", "is-active", "--", "tp4-rdma-check.service"]
    # the copy: the closure here, what the host lacks (the paths on stdin), an export into its import
    assert deploy.closure_argv(top) == ["nix-store", "--query", "--requisites", top]
    assert deploy.missing_argv() == ["sh", "-c", "xargs -r nix-store --check-validity --print-invalid"]
    assert deploy.export_argv(["/nix/store/a", "/nix/store/b"]) == [
        "nix-store",
        "--export",
        "/nix/store/a",
        "/nix/store/b",
    ]
    assert deploy.import_argv(w2) == ["sudo", "-n", "nix-store", "--import"] and deploy.import_argv(w1) == [
        "nix-store",
        "--import",
    ]
    assert deploy.store_uri(w2) == "ssh://tp4@10.0.0.3"
    # the post-check's connection is a new one
    fresh = deploy.fresh(w2)
    assert fresh.remote is not None and "ControlMaster=no" in fresh.remote.ssh_argv()


def test_the_generation_is_the_current_line_of_nix_env():
    text = "   1   2026-11-30 10:00:00   \n  41   2026-12-01 09:00:00   (current)\n  42   2026-12-01 10:00:00   \n"
    assert deploy.current_generation(text) == 41
    assert deploy.current_generation("") is None


def test_hosts_are_the_nixos_nodes_or_those_on_names(nodes):
    assert [n.name for n in deploy.hosts_of(nodes, ())] == ["h", "w1", "w.2"]
    assert [n.name for n in deploy.hosts_of(nodes, ("w.2", "h"))] == ["h", "w.2"]
    with pytest.raises(InvalidInput, match=r"--on 'nope': no such node in the profile; fix: one of h, w1, w.2, w3"):
        deploy.hosts_of(nodes, ("nope",))
    with pytest.raises(InvalidInput, match="--on w3: the node is of kind plain"):
        deploy.hosts_of(nodes, ("w3",))
    plain = nodes_of(build_plan(load_text(NIXOS.replace('kind = "nixos"', 'kind = "plain"'), "t")))
    with pytest.raises(InvalidInput, match="the profile has no node of kind nixos"):
        deploy.hosts_of(plain, ())


def test_the_dry_run_prints_the_commands_of_the_run_and_runs_nothing(nodes, monkeypatch):
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the dry run ran a command")

    monkeypatch.setattr(process, "_spawn", refuse)
    plan = build_plan(load_text(NIXOS, "t"))
    lines: list[str] = []
    deploy.dry_run(plan, nodes, deploy.Options(flake="/src/tp4", on=("w.2",)), lines.append)
    commands = [shlex.split(line[2:]) for line in lines if line.startswith("$ ")]
    w2 = nodes[2]
    top, gen = "<toplevel:w.2>", "<generation:w.2>"

    def remote(argv: list[str], node: Node = w2) -> list[str]:
        return process.full_argv(argv, node.remote)

    assert commands == [
        deploy.build_argv("/src/tp4", ["w.2"]),
        remote(deploy.generations_argv(w2)),
        deploy.closure_argv(top),
        remote(deploy.missing_argv()),
        remote(deploy.is_system_argv(top)),
        remote(deploy.set_argv(w2, top)),
        remote(deploy.generations_argv(w2)),
        remote(deploy.switch_argv(w2, top)),
        remote(["true"], deploy.fresh(w2)),
        remote(deploy.unit_argv(), deploy.fresh(w2)),
        remote(deploy.switch_generation_argv(w2, gen)),
        remote(deploy.rollback_argv(w2, gen)),
        remote(deploy.generations_argv(w2)),
    ]
    assert any("doctor's blocking checks" in line for line in lines)


hostile = st.text(alphabet=st.sampled_from(list("ab -$()'\";|&`\\*~.")), min_size=1, max_size=12)


@settings(max_examples=80, deadline=None)
@given(name=hostile, host=hostile, user=st.one_of(hostile, st.just("root")))
def test_no_node_name_host_or_user_changes_a_command(nodes, name, host, user):
    """A node name, ssh address or user with leading dashes, spaces, quotes or $() (past the
    profile's validation, as a plan built another way could carry) never enters a remote
    command, and is one word (or refused) where it goes: the flake attribute, the store URI."""
    import re

    def node_of(name: str, host: str) -> Node:
        base = nodes[1].rank
        rank = base._replace(name=name, ssh=base.ssh._replace(host=host, user=user))
        return Node(rank, process.Remote(host=host, user=user, identity=rank.ssh.identity, port=rank.ssh.port))

    node, plain = node_of(name, host), node_of("spark2", "10.0.0.9")
    top = "/nix/store/abc-nixos-system"
    for make in (
        deploy.generations_argv,
        lambda n: deploy.set_argv(n, top),
        lambda n: deploy.switch_argv(n, top),
        lambda n: deploy.switch_generation_argv(n, 7),
        lambda n: deploy.rollback_argv(n, 7),
    ):
        argv = make(node)
        assert argv == make(plain) and (argv[:2] == ["sudo", "-n"]) == (user != "root")
        full = process.full_argv(argv, node.remote)
        assert full[-3] == "--" and full[-2] == f"{user}@{host}" and shlex.split(full[-1]) == argv
    try:
        build = deploy.build_argv("/src", [name])
    except InvalidInput:
        assert any(c in name for c in '"\\$')
    else:
        assert len(build) == 10 and build[-1] in (
            f"/src#nixosConfigurations.{name}.config.system.build.toplevel",
            f'/src#nixosConfigurations."{name}".config.system.build.toplevel',
        )
        assert re.fullmatch(r"[A-Za-z_][A-Za-z0-9_'-]*", name) or f'"{name}"' in build[-1]
    try:
        uri = deploy.store_uri(node)
    except InvalidInput:
        assert not (re.fullmatch(r"[A-Za-z0-9:][A-Za-z0-9._:-]*", host) and re.fullmatch(r"[a-z_][a-z0-9_.-]*", user))
    else:
        assert uri == f"ssh://{user}@{host}"
        assert not host.startswith("-") and not any(c.isspace() or c in "$`'\"();|&" for c in host + user)
    # the copy's commands hold no profile value but the store paths
    assert deploy.closure_argv(top) == ["nix-store", "--query", "--requisites", top]
    assert deploy.import_argv(node)[-2:] == ["nix-store", "--import"]


@pytest.mark.parametrize(
    "old, field, value",
    [
        ('name = "w1"', "name", "-oProxyCommand=x"),
        ('name = "w1"', "name", "spark 1"),
        ('ip = "10.0.0.2"', "ip", "-J evil"),
        ('ip = "10.0.0.2"', "ssh", "$(reboot)"),
        ('user = "root"', "user", "-l"),
        ('ip = "10.0.0.2"', "ssh", "a b"),
    ],
)
def test_a_hostile_profile_value_is_refused_before_any_command(tmp_path, tp4_cli, old, field, value):
    """The profile refuses what would become an option or a second word (exit 2, nothing run)."""
    new = f"{field} = {json.dumps(value)}" if field != "ssh" else f"{old}\nssh = {json.dumps(value)}"
    profile = tmp_path / "p.toml"
    profile.write_text(NIXOS.replace(old, new, 1))
    (tmp_path / "flake.nix").write_text("{ outputs = _: { }; }\n")
    code, out, err = tp4_cli("deploy", "-p", str(profile), "--flake", str(tmp_path), "--dry-run")
    assert code == 2 and value in err and "$ " not in out, err
