"""The rank's health check under real podman (this machine's: Debian 12's 4.3). The line's image
is an OCI layout that `tp4 build` copies into podman's store with skopeo, and podman reads a
health check only from a Docker-format image config: the image's HEALTHCHECK (pkgs/image.nix,
from tp4/data/container.toml `[health]`) is lost there. The flags serve's run_argv gives a podman
rank put it back: `podman healthcheck run` passes while the rank serves /health and fails while
it does not.

The image: the stand-in engine's test image (tests/standin/image.py) made into an OCI layout by
tp4.image.oci (the steps pkgs/oci.nix runs: its docker-archive as the base, then the layout), with the
config's Healthcheck as pkgs/image.nix writes it (tests/test_flake_eval.py holds image.nix to
the same table), loaded by tp4's own loader (tp4.image.runtime_cli.load: skopeo copy oci:...
containers-storage:...).

The rank: the head of a line whose head runs podman, started with the health flags of
serve.run_argv. The rest of run_argv needs the line's hosts (host network, the RDMA device, the
CDI GPU): tests/test_line_cluster.py runs it whole and runs the health check there too. Here the
container has a network of its own (--network none: the probe and the engine meet on its
loopback, nothing on this machine's ports), the rank's env file with NNODES=1 (a line of one
rank: no workers to wait for) and the stand-in's pace, its model and state directories. This
machine runs no systemd, so podman cannot add the check's timer (DISABLE_HC_SYSTEMD, podman's
own switch, keeps it from trying); the test runs the check itself. Needs root, podman, runc and
skopeo."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from netns_hosts import podman_store
from standin import image as standin

from tp4.core import process

from tp4.image import oci, runtime_cli

from tp4.serving import serve
from tp4.line.container import HEALTH, MOUNTS
from tp4.line.plan import Plan, RankPlan, build_plan
from tp4.line.profile.load import load_text

PROFILE = (
    '[cluster.head]\nname = "h"\nip = "10.0.0.1"\nruntime = "podman"\n'
    '[[cluster.workers]]\nname = "w1"\nip = "10.0.0.2"\n[[cluster.workers]]\nname = "w2"\nip = "10.0.0.3"\n'
    '[[cluster.workers]]\nname = "w3"\nip = "10.0.0.4"\n'
)
SECONDS = 10**9


@pytest.fixture
def store(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    # runc with nofile and nproc within this machine's hard limits (podman's default 1048576 is
    # above them); no systemd timers for the health check (module doc)
    conf = tmp_path / "runtime_cli.conf"
    conf.write_text(
        '[containers]\ndefault_ulimits = ["nofile=1024:1024", "nproc=4096:4096"]\n[engine]\nruntime = "runc"\n'
    )
    monkeypatch.setenv("CONTAINERS_CONF", str(conf))
    monkeypatch.setenv("DISABLE_HC_SYSTEMD", "true")
    yield from podman_store(monkeypatch, "tp4h-")


def image_healthcheck() -> dict[str, object]:
    """The image config's Healthcheck as pkgs/image.nix writes it from container.toml's [health]."""
    return {
        "Test": ["CMD", *HEALTH.cmd],
        "Interval": HEALTH.interval * SECONDS,
        "Timeout": HEALTH.timeout * SECONDS,
        "StartPeriod": HEALTH.start_period * SECONDS,
        "Retries": HEALTH.retries,
    }


@pytest.fixture
def loaded(store: Path, tmp_path: Path) -> str:
    """The stand-in image as an OCI layout carrying the image's Healthcheck, loaded as tp4 build
    loads the line's image; its reference in podman's store."""
    archive, _ = standin.archive()
    base = tmp_path / "base"
    base.mkdir()
    oci.base_layers(str(archive), base)
    config = json.loads((base / "config.json").read_text())
    own = {k: config["config"][k] for k in ("Entrypoint", "Cmd", "WorkingDir", "Env")}
    spec = {"architecture": config["architecture"], "config": {**own, "Healthcheck": image_healthcheck()}}
    layout = tmp_path / "layout"
    layout.mkdir()
    oci.image_layout(base, [], spec, "tp4-health", layout)
    assert runtime_cli.image_kind(str(layout)) == "oci"
    return runtime_cli.load(str(layout), "podman")


@pytest.fixture(scope="module")
def plan() -> Plan:
    return build_plan(load_text(PROFILE, "health"))


def podman(*argv: str, check: bool = True) -> process.CompletedProcess[str]:
    return process.run(["podman", *argv], check=check, timeout=60)


def health_flags(rank: RankPlan) -> list[str]:
    """The --health-* flags (with their values) of the rank's run_argv, in its order."""
    argv = serve.run_argv(rank, line="health")
    return [w for i, w in enumerate(argv) if w.startswith("--health-") or argv[i - 1].startswith("--health-")]


def start(rank: RankPlan, ref: str, work: Path, name: str, extra: dict[str, str]) -> None:
    """The rank's container with its run_argv's health flags (module doc for the rest)."""
    model, state = work / "model", work / "state"
    model.mkdir()
    state.mkdir()
    (model / "config.json").write_text('{"architectures": ["DeepseekV4ForCausalLM"]}\n')
    env_file = work / "rank.env"
    env_file.write_text(
        serve.env_file_text(rank._replace(env={**rank.env, "NNODES": "1", "TP4_STANDIN_PACE": "0.02", **extra}), {})
    )
    os.chmod(env_file, 0o600)
    podman(
        "run",
        "-d",
        "--name",
        name,
        "--network",
        "none",
        *health_flags(rank),
        "--env-file",
        str(env_file),
        "-v",
        f"{model}:{MOUNTS.model}:ro",
        "-v",
        f"{state}:{MOUNTS.state}",
        ref,
        *rank.run.command,
    )


def wait_for_log(name: str, needle: str, timeout: float = 30) -> str:
    deadline = time.monotonic() + timeout
    log = ""
    while time.monotonic() < deadline:
        proc = podman("logs", name, check=False)
        log = proc.stdout + proc.stderr
        if needle in log:
            return log
        time.sleep(0.1)
    raise AssertionError(f"{name}: no {needle!r} within {timeout} s:\n{log[-3000:]}")


def container_healthcheck(name: str) -> object:
    return json.loads(podman("container", "inspect", "--format", "{{json .Config.Healthcheck}}", name).stdout)


def health_log(name: str) -> str:
    """What podman recorded of the container's checks (its State.Healthcheck in podman 4, State.Health
    later): each run's exit code and output, for an assertion's message."""
    proc = podman("container", "inspect", "--format", "{{json .State}}", name, check=False)
    try:
        state = json.loads(proc.stdout)
    except ValueError:
        return proc.stdout + proc.stderr
    return json.dumps(state.get("Healthcheck") or state.get("Health"))


def test_podman_reads_no_health_check_from_the_oci_image(loaded: str, plan: Plan) -> None:
    """Why the flags are needed: the image carries the check, a container podman makes of it
    without them has none."""
    head = plan.nodes[0]
    podman("create", "--name", "tp4-health-bare", "--network", "none", loaded, *head.run.command)
    try:
        assert container_healthcheck("tp4-health-bare") is None
    finally:
        podman("rm", "-f", "tp4-health-bare", check=False)


def test_the_podman_rank_gets_the_images_health_check(plan: Plan) -> None:
    head = plan.nodes[0]
    assert head.service.runtime == "podman" and head.run.health == HEALTH
    flags = health_flags(head)
    assert (
        flags
        == serve.health_flags(HEALTH)
        == [
            "--health-cmd",
            json.dumps(list(HEALTH.cmd), separators=(",", ":")),
            "--health-interval",
            f"{HEALTH.interval}s",
            "--health-timeout",
            f"{HEALTH.timeout}s",
            "--health-start-period",
            f"{HEALTH.start_period}s",
            "--health-retries",
            str(HEALTH.retries),
        ]
    )
    # docker reads the check from the image config; its --health-cmd would be a shell command
    docker = build_plan(load_text(PROFILE.replace('runtime = "podman"', 'runtime = "docker"'), "health"))
    assert not any(w.startswith("--health") for w in serve.run_argv(docker.nodes[0], line="health"))


# `podman exec` (and so `podman healthcheck run`) cannot enter a container when podman itself runs
# chrooted in a mount namespace whose root is not the chroot (the fresh-machine CI's root): runc's
# pivot_root moves the chroot's mount, the exec joins the namespace at its real root, and its chdir
# to the WorkingDir fails there. What runc says then:
CHROOT_EXEC = 'chdir to cwd ("/opt/dsv41") set in config.json failed: no such file or directory'


def exec_works(name: str) -> bool:
    """Whether this machine's podman can exec into ``name``; where it cannot, it must be for the
    chroot reason above and no other."""
    proc = podman("exec", name, "python3", "-c", "pass", check=False)
    if proc.returncode == 0:
        return True
    assert CHROOT_EXEC in proc.stderr.replace('\\"', '"'), proc.stdout + proc.stderr
    return False


def probe(name: str, ref: str) -> process.CompletedProcess[str]:
    """The container's own health command (its Config.Healthcheck Test) in a sibling container of
    the same image in the rank's network namespace: what the check runs, without an exec."""
    test = container_healthcheck(name)["Test"]  # type: ignore[index]
    assert test[0] == "CMD", test
    return podman(
        "run",
        "--rm",
        "--network",
        f"container:{name}",
        "--env-file",
        str(ENV_FILES[name]),
        "--entrypoint",
        test[1],
        ref,
        *test[2:],
        check=False,
    )


ENV_FILES: dict[str, Path] = {}


def test_healthcheck_run_passes_while_the_rank_serves_and_fails_while_it_does_not(
    loaded: str, plan: Plan, tmp_path: Path
) -> None:
    head = plan.nodes[0]
    names = ("tp4-health-serving", "tp4-health-hung")
    try:
        (tmp_path / "serving").mkdir()
        start(head, loaded, tmp_path / "serving", names[0], {})
        ENV_FILES[names[0]] = tmp_path / "serving" / "rank.env"
        wait_for_log(names[0], "Ready: API on port 8888")
        assert container_healthcheck(names[0]) == image_healthcheck()
        # the check's command passes against the serving rank
        served = probe(names[0], loaded)
        assert served.returncode == 0, served.stdout + served.stderr
        can_exec = exec_works(names[0])
        if can_exec:
            ok = podman("healthcheck", "run", names[0], check=False)
            assert ok.returncode == 0, ok.stdout + ok.stderr + health_log(names[0])

        # the `hang` fault: the engine stops after its CUDA graph capture, the rank runs and /health
        # never answers (the stand-in serves its API only once it gets past that point)
        (tmp_path / "hung").mkdir()
        start(head, loaded, tmp_path / "hung", names[1], {"TP4_STANDIN_FAULT": "hang"})
        ENV_FILES[names[1]] = tmp_path / "hung" / "rank.env"
        wait_for_log(names[1], "Scheduler: waiting for the first batch")
        hung = probe(names[1], loaded)
        assert hung.returncode == 1 and "health: 127.0.0.1:8888" in hung.stderr, hung.stdout + hung.stderr
        if can_exec:
            bad = podman("healthcheck", "run", names[1], check=False)
            assert bad.returncode == 1 and bad.stdout.strip() == "unhealthy", bad.stdout + bad.stderr
        assert podman("container", "inspect", "--format", "{{.State.Status}}", names[1]).stdout.strip() == "running"
    finally:
        for name in names:
            podman("rm", "-f", "-t", "0", name, check=False)
