"""What `tp4 serve` runs on each node, from the plan alone: the container's argv (upstream's
docker run flags), the env file (the only place the environment and the API key go), and that no
profile value changes the shape of a remote command."""

from __future__ import annotations

import shlex

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tp4.core import privatefiles, process

from tp4.serving import serve
from tp4.core.apikey import Secret
from tp4.core.errors import InvalidInput
from tp4.hosts.nodes import nodes_of
from tp4.line.plan import build_plan
from tp4.line.profile import load_default, load_text

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def plan():
    return build_plan(load_default())


def test_the_head_runs_with_upstreams_flags_and_its_env_from_the_file(plan):
    head = plan.nodes[0]
    argv = serve.run_argv(head, line="L")
    assert argv[:5] == ["docker", "run", "-d", "--name", "dsv41-head"]
    joined = shlex.join(argv)
    for flags in (
        ["--network", "host"],
        ["--ipc", "host"],
        ["--privileged"],
        ["--cap-add", "IPC_LOCK"],
        ["--gpus", "all"],
        ["--shm-size", "32g"],
        ["--ulimit", "memlock=-1:-1"],
        ["--ulimit", "stack=67108864"],
        ["--device", "/dev/infiniband:/dev/infiniband"],
        ["--restart", "no"],
        ["--env-file", head.service.env_file],
    ):
        assert shlex.join(flags) in joined, flags
    assert argv[-2:] == [head.run.image, "run"]
    # every mount of the run spec, read-only where it says so
    for m in head.run.mounts:
        assert f"-v {shlex.quote(m.source + ':' + m.target + (':ro' if m.read_only else ''))}" in joined
    # the environment never reaches argv
    assert not any(f"{k}=" in a for a in argv for k in head.env if k not in ("memlock", "stack"))


def test_podman_gets_the_gpus_by_cdi_and_no_shm_size_beside_the_hosts_ipc():
    text = (
        '[cluster]\n[cluster.head]\nname = "h"\nip = "10.0.0.1"\nruntime = "podman"\n'
        '[[cluster.workers]]\nname = "w1"\nip = "10.0.0.2"\n[[cluster.workers]]\nname = "w2"\nip = "10.0.0.3"\n'
        '[[cluster.workers]]\nname = "w3"\nip = "10.0.0.4"\n'
    )
    p = build_plan(load_text(text, "t"))
    head, worker = serve.run_argv(p.nodes[0], line="L"), serve.run_argv(p.nodes[1], line="L")
    assert head[0] == "podman" and "nvidia.com/gpu=all" in head and "--shm-size" not in head
    assert (
        worker[0] == "docker" and "--shm-size" in worker and ["--gpus", "all"] == worker[worker.index("--gpus") :][:2]
    )


def test_the_env_file_holds_the_env_and_only_the_head_gets_the_key(plan):
    secret = {"API_KEY": Secret("sk-very-secret")}
    head = serve.env_file_text(plan.nodes[0], secret)
    worker = serve.env_file_text(plan.nodes[1], secret)
    assert "API_KEY=sk-very-secret\n" in head and "sk-very-secret" not in worker
    assert head.splitlines() == sorted(head.splitlines())
    assert {line.split("=", 1)[0] for line in worker.splitlines()} == set(plan.nodes[1].env)


def test_a_value_an_env_file_cannot_carry_is_refused_naming_the_key(plan):
    node = plan.nodes[0]._replace(env={**plan.nodes[0].env, "X": "a\nb"})
    with pytest.raises(InvalidInput, match="the value of X holds a control character or a line break"):
        serve.env_file_text(node, {})


@pytest.mark.parametrize(
    "spec, complaint",
    [
        ("nope=3", "unknown phase 'nope'"),
        ("weights=-1", "seconds between"),
        ("weights=abc", "seconds between"),
        ("nan", "seconds between"),
        ("1e9", "seconds between"),
        ("warmup=", "seconds between"),
    ],
)
def test_bad_timeouts_are_refused(spec, complaint):
    from tp4.cli.common import timeouts as _timeouts

    with pytest.raises(InvalidInput, match=complaint):
        _timeouts((spec,))


def test_timeouts_set_one_phase_or_all():
    from tp4.cli.common import timeouts as _timeouts

    assert (
        _timeouts(("weights=5",))["weights"] == 5
        and _timeouts(("weights=5",))["graphs"] == serve.DEFAULT_TIMEOUTS["graphs"]
    )
    assert set(_timeouts(("7",)).values()) == {7.0}


hostile = st.text(alphabet=st.sampled_from(list("ab -$()'\";|&`\\\n*~")), min_size=1, max_size=12)


@settings(max_examples=60, deadline=None)
@given(value=hostile)
def test_no_env_value_changes_a_command_and_the_remote_quoting_gives_the_argv_back(value, plan):
    """An env value (quotes, spaces, $(), newlines, leading dashes) reaches the env file only; a
    remote command's one quoted word splits back into exactly the argv."""
    node = plan.nodes[1]
    changed = node._replace(env={**node.env, "DSV41_STATS_SECONDS": value})
    assert serve.run_argv(changed, line="L") == serve.run_argv(node, line="L")
    remote = process.Remote(host="10.0.0.2", user="zurih")
    for argv in (serve.run_argv(node, line=value), ["sh", "-c", serve._WRITE_PRIVATE, "sh", f"/x/{value}"]):
        full = process.full_argv(argv, remote)
        assert full[-2] == "zurih@10.0.0.2" and full[-3] == "--"
        assert shlex.split(full[-1]) == argv


NIXOS = (
    '[cluster]\nuser = "tp4"\n[cluster.head]\nname = "h"\nip = "10.0.0.1"\nkind = "nixos"\nruntime = "podman"\n'
    '[[cluster.workers]]\nname = "w1"\nip = "10.0.0.2"\nkind = "nixos"\nuser = "root"\n'
    '[[cluster.workers]]\nname = "w2"\nip = "10.0.0.3"\n[[cluster.workers]]\nname = "w3"\nip = "10.0.0.4"\n'
)


def test_a_nixos_node_runs_its_rank_as_the_modules_unit():
    """On a NixOS host the module's oci-containers unit runs the container (`<backend>-<name>`);
    serve writes its env file under /run/tp4 and starts and stops the unit, as root."""
    p = build_plan(load_text(NIXOS, "t"))
    head, w1, w2 = (nodes_of(p)[i] for i in range(3))
    assert head.rank.service[:5] == ("nixos", "podman", "podman-dsv41-head.service", "/run/tp4/dsv41-head.env", None)
    # w1 sets no runtime: a NixOS node runs podman
    assert w1.rank.service.unit == "podman-dsv41-worker.service"
    # one command: the env file from stdin (mode 0600), then the start; the module makes a NixOS
    # host's directories, serve a plain host's writable bind mounts
    wrap = ["sh", "-c", serve._WRITE_AND_RUN, "sh"]
    assert serve.start_argv(head, line="L") == [
        "sudo",
        "-n",
        *wrap,
        "/run/tp4/dsv41-head.env",
        "0",
        "systemctl",
        "start",
        "podman-dsv41-head.service",
    ]
    assert serve.start_argv(w1, line="L") == [
        *wrap,
        "/run/tp4/dsv41-worker.env",
        "0",
        "systemctl",
        "start",
        "podman-dsv41-worker.service",
    ]  # root: no sudo
    assert serve.stop_argv(head) == ["sudo", "-n", "systemctl", "stop", "podman-dsv41-head.service"]
    plain = serve.start_argv(w2, line="L")
    dirs = serve.made_dirs(w2.rank)
    assert [m.target for m in w2.rank.run.mounts if m.source in dirs] == ["/state", "/root/.cache", "/engram"]
    assert plain[: 6 + len(dirs)] == [*wrap, w2.rank.service.env_file, str(len(dirs)), *dirs]
    assert plain[6 + len(dirs) :] == serve.run_argv(w2.rank, line="L")
    assert w2.rank.service.env_file.endswith("/dsv41-4x-spark/dsv41-worker.env")
    # a plain head's container is created beside the workers' starts (then `<runtime> start`):
    # the same flags as its run
    create = serve.create_argv(w2, line="L")
    run = serve.run_argv(w2.rank, line="L")
    n = 6 + len(dirs)
    assert w2.runtime == "docker"
    assert create[:n] == plain[:n] and create[n : n + 2] == [w2.runtime, "create"] and create[n + 2 :] == run[3:]
    assert run[1:3] == ["run", "-d"]
    # podman's is initialized too (`podman container init`: the OCI runtime's create), so that
    # its start after the workers' is the runtime's start alone
    p2 = build_plan(
        load_text(
            NIXOS.replace('name = "w3"\nip = "10.0.0.4"\n', 'name = "w3"\nip = "10.0.0.4"\nruntime = "podman"\n'), "t"
        )
    )
    w3 = nodes_of(p2)[3]
    assert w3.runtime == "podman"
    create, run = serve.create_argv(w3, line="L"), serve.run_argv(w3.rank, line="L")
    assert create[n : n + 5] == ["sh", "-c", serve._THEN_INIT, "sh", w3.container]
    assert create[n + 5 : n + 7] == ["podman", "create"] and create[n + 7 :] == run[3:]


def test_the_plan_a_nixos_unit_was_built_from_is_read_from_its_environment():
    """serve reads a NixOS rank unit's TP4_PLAN (modules/tp4-line.nix) from `systemctl show -p
    Environment --value`, which prints the assignments space-separated, a value with spaces in
    double quotes; it refuses another plan than the one the unit was built from."""
    p = build_plan(load_text(NIXOS, "t"))
    head = nodes_of(p)[0]
    assert serve.unit_plan_argv(head) == [
        "systemctl",
        "show",
        "-p",
        "Environment",
        "--value",
        "--",
        "podman-dsv41-head.service",
    ]
    env = 'LOCALE_ARCHIVE=/nix/store/x/lib/locale/locale-archive "PATH=/a b:/c" PODMAN_SYSTEMD_UNIT=podman-dsv41-head.service TP4_PLAN=sha256:ab12'
    assert serve.unit_plan(env) == "sha256:ab12"
    assert serve.unit_plan("PODMAN_SYSTEMD_UNIT=podman-dsv41-head.service") is None
    assert serve.unit_plan("") is None
    assert serve.unit_plan('A="unclosed TP4_PLAN=sha256:cd') == "sha256:cd"


paths = st.text(alphabet=st.sampled_from(list("ab -$()'\";|&`*")), min_size=1, max_size=10).map(lambda s: "/srv/" + s)


@settings(max_examples=40, deadline=None)
@given(workdir=paths, user=st.sampled_from(["zurih", "root", "a-b", "_x"]))
def test_no_path_or_user_changes_the_shape_of_a_remote_command(workdir, user):
    """A workdir with spaces, quotes or $() is one argv word wherever it goes (the env file's
    path, the mounts), and the remote command's one quoted word splits back into exactly it."""
    text = (
        f'[cluster]\nuser = "{user}"\n[cluster.head]\nname = "h"\nip = "10.0.0.1"\n'
        '[[cluster.workers]]\nname = "w1"\nip = "10.0.0.2"\nworkdir = ' + json_str(workdir) + "\n"
        '[[cluster.workers]]\nname = "w2"\nip = "10.0.0.3"\n[[cluster.workers]]\nname = "w3"\nip = "10.0.0.4"\n'
    )
    p = build_plan(load_text(text, "t"))
    node = nodes_of(p)[1]
    argv = serve.run_argv(node.rank, line="L")
    assert node.rank.service.env_file == f"{workdir}/dsv41-worker.env" and node.rank.service.env_file in argv
    full = process.full_argv(argv, node.remote)
    assert full[-2] == f"{user}@10.0.0.2" and shlex.split(full[-1]) == argv


def json_str(value: str) -> str:
    import json

    return json.dumps(value)


def test_the_env_file_and_the_plan_beside_it_never_go_through_a_planted_path(tmp_path):
    """serve's writers (the env file with the start, the plan beside it, a spec table) create
    their file through a new one beside it: a planted `<file>.tmp` link to a victim neither
    changes it nor receives the secret; a directory others may write refuses a secret."""
    import subprocess

    from tp4.hosts import share

    d = tmp_path / "work"
    d.mkdir(mode=0o755)
    victim = tmp_path / "victim"
    victim.write_text("victim\n")
    env = d / "dsv41-head.env"
    for name in ("dsv41-head.env.tmp", "dsv41-head.plan.json.tmp", "t.json.tmp", "exports.tmp"):
        (d / name).symlink_to(victim)
    run = subprocess.run(
        ["sh", "-c", serve._WRITE_AND_RUN, "sh", str(env), "0", "cat", str(env)],
        input="API_KEY=sk-env-1\n",
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0 and run.stdout == "API_KEY=sk-env-1\n", run.stderr
    assert (env.stat().st_mode & 0o777) == 0o600
    for script, path, *mode in (
        (serve._WRITE_PRIVATE, d / "dsv41-head.plan.json"),
        (privatefiles.WRITE_SHARED, d / "t.json", "644"),
        (share._WRITE, d / "exports", "644"),
    ):
        got = subprocess.run(["sh", "-c", script, "sh", str(path), *mode], input="x", capture_output=True, text=True)
        assert got.returncode == 0 and path.read_text() == "x" and not path.is_symlink(), got.stderr
    assert victim.read_text() == "victim\n"
    d.chmod(0o777)
    run = subprocess.run(
        ["sh", "-c", serve._WRITE_AND_RUN, "sh", str(env), "0", "echo", "started"],
        input="API_KEY=sk-env-2\n",
        capture_output=True,
        text=True,
    )
    assert run.returncode == privatefiles.REFUSED and "started" not in run.stdout
    assert f"{d} is writable by group or others" in run.stderr and "sk-env-2" not in run.stderr + env.read_text()


def test_the_files_tp4_keeps_here_never_go_through_a_planted_tmp_link(tmp_path):
    """The build and push records, the checkpoint's hash cache and doctor's evidence were written
    through `<file>.tmp`: a link planted there would have had its target overwritten. Now a new
    file beside the target (created exclusively) is renamed over it."""
    from tp4.core.privatefiles import replace_file
    from tp4.hosts import checkpoint
    from tp4.image.build import Built

    victim = tmp_path / "victim"
    victim.write_text("victim\n")
    built = tmp_path / "built.json"
    (tmp_path / "built.json.tmp").symlink_to(victim)
    Built("/nix/store/x", "ref", "sha256:1").save(built)
    assert Built.load(built).ref == "ref"
    (tmp_path / f"{checkpoint.CACHE_NAME}.tmp").symlink_to(victim)
    checkpoint.save_cache(tmp_path, {"schema": checkpoint.SCHEMA, "files": {}})
    (tmp_path / "evidence.json").symlink_to(victim)  # a link at the target itself is replaced
    replace_file(tmp_path / "evidence.json", "{}\n")
    assert victim.read_text() == "victim\n" and not (tmp_path / "evidence.json").is_symlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(  # no temporary left
        [
            "victim",
            "built.json",
            "built.json.tmp",
            checkpoint.CACHE_NAME,
            f"{checkpoint.CACHE_NAME}.tmp",
            "evidence.json",
        ]
    )
