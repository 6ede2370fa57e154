"""`tp4 serve | status | stop` on a line of NixOS hosts: the plan's digest goes from the committed
plan file (`tp4 plan --json -o plan.json`) through the NixOS module's rank unit to `tp4 status`;
`tp4 stop`'s stop record goes to /run/tp4 on the head as the env file does.

The hosts are tests/doctor_hosts.py's four netns hosts (real sshd, real podman), every node of
the profile ``kind = "nixos"``. A netns host has no systemd, so each host's sessions find a
stand-in ``systemctl`` first on their PATH (:data:`SYSTEMCTL`): for ``start podman-<name>.service``
it runs what the unit nixpkgs' oci-containers module makes of the container modules/lib gives
that host (``rankUnit``, evaluated from the plan file with tests/nixos_helpers.hosts_expr) would
run, and for ``stop`` what that unit's stop runs. The `podman run` argv is made here from that
evaluation (:func:`oci_run_argv`), never written by hand: the labels (tp4.plan among them), the env
file, the mounts, the devices and the flags are the module's.

What a netns host cannot have, and how it is made up for (nothing of it changes what the module
gives):

* no journald: oci-containers' default ``--log-driver=journald`` becomes podman's ``k8s-file``
  (the log `podman logs` reads: what serve follows and status reads, as it reads the journal);
* no systemd: the stand-in plays the unit's parts that matter to `podman run`: its
  ``RuntimeDirectory`` (/run/<name>, holding the cidfile), its ExecStartPre (``podman rm -f``),
  its ``Environment`` (PODMAN_SYSTEMD_UNIT, TP4_PLAN) and its stop (preStop, postStop), and
  ``systemctl show`` of the two properties tp4 reads (LimitMEMLOCK for doctor, Environment for
  serve's TP4_PLAN); the unit's ordering (RDMA check, weights volume) and hardening are not
  played, nor LimitMEMLOCK=infinity (the hosts' hard limit stays: the plan's memlock is
  cluster.memlock, within it, as tests/line_cluster.py says);
* systemd-tmpfiles makes the rank's directories (``rankUnit.directories``) at activation: the
  test makes them as the rules say; the weights volume unit's volume is the cluster's podman volume
  (tests/line_cluster.py), which the module is told is the local weights directory
  (``localWeights``: the plan has no NFS share, as on DoctorCluster);
* the GPU (CDI ``nvidia.com/gpu=all``) and /dev/infiniband are the hosts' stand-ins of
  tests/line_cluster.py (its module doc, points 3 and 4), as for a plain node;
* /run: each host's /run is its own (tests/netns_hosts.py lays ``<host>/root/run`` over it), so the
  env files serve writes under /run/tp4 and the units' runtime directories stay on their host.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from doctor_hosts import SYSFS, DoctorCluster, _doctor_prepare
from netns_hosts import Host
from nixos_helpers import hosts_expr, nix_eval
from test_serve import assert_nothing_left

REPO = Path(__file__).resolve().parent.parent

# the unit's stand-in: `systemctl start|stop|show ... UNIT` for a unit of <host>/units, everything else to
# doctor's systemctl stub (get-default, is-active). What it runs for a unit is the unit's file,
# written by the test from the module's evaluation.
SYSTEMCTL = """#!/usr/bin/python3
import json, os, shutil, subprocess, sys

units, other = {units!r}, {other!r}
args = sys.argv[1:]
path = os.path.join(units, args[-1] + ".json") if args else ""
if not (args and args[0] in ("start", "stop", "show") and os.path.isfile(path)):
    os.execv(other, [other, *args])
unit = json.load(open(path))
if args[0] == "show":  # show -p PROPERTY --value [--] UNIT: the unit's setting, as systemd prints it
    print(unit["show"][args[args.index("-p") + 1]])
    sys.exit(0)
name = unit["name"]
runtime_dir = "/run/" + name  # RuntimeDirectory=<name>
cidfile = runtime_dir + "/ctr-id"
env = {{**os.environ, **unit["environment"]}}
if args[0] == "start":
    # ExecStartPre: oci-containers' pre-start (no image to load: it is in the store)
    subprocess.run(["podman", "rm", "-f", name], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    os.makedirs(runtime_dir, mode=0o755, exist_ok=True)
    if os.path.exists(cidfile):
        os.unlink(cidfile)
    # ExecStart: the unit's script, `exec podman run ...` (Type=notify: started when conmon says so,
    # which is when `podman run -d` returns)
    os.execvpe(unit["run"][0], unit["run"], env)
# ExecStop (preStop), ExecStopPost (postStop); then systemd removes the RuntimeDirectory
stop = subprocess.run(["podman", "stop", "--ignore", "--cidfile=" + cidfile], env=env, capture_output=True, text=True)
rm = subprocess.run(["podman", "rm", "-f", "--ignore", "--cidfile=" + cidfile], env=env, capture_output=True, text=True)
shutil.rmtree(runtime_dir, ignore_errors=True)
sys.stderr.write(stop.stderr + rm.stderr)
sys.exit(0)
"""

# the log driver of the netns hosts (module doc): oci-containers' default is journald
LOG_DRIVER = "k8s-file"
# the keys of rankUnit.container that oci_run_argv maps (a key it does not know fails the test
# instead of being left out of the run)
CONTAINER_KEYS = {
    "image",
    "cmd",
    "environmentFiles",
    "volumes",
    "labels",
    "privileged",
    "capabilities",
    "devices",
    "networks",
    "extraOptions",
    "pull",
    "autoStart",
}


def oci_run_argv(name: str, c: dict) -> list[str]:
    """The `podman run` of the unit nixpkgs' oci-containers module makes of container ``name``
    with the options ``c`` (modules/tp4-line.nix sets rankUnit.container and the image source, and
    leaves log-driver, autoRemoveOnStop, podman.sdnotify, entrypoint, hostname, user, workdir,
    environment and ports at their defaults): mkService's ``script`` for the podman backend, as
    the words the unit's shell splits it into. Read at NixOS/nixpkgs 035a24e7 (the pinned commit
    is not stored), nixos/modules/virtualisation/oci-containers.nix, mkService: script, preStop,
    postStop, serviceConfig."""
    unknown = set(c) - CONTAINER_KEYS
    assert not unknown, f"oci_run_argv does not map {sorted(unknown)}"
    argv = [
        "podman",
        "run",
        f"--name={name}",
        f"--log-driver={LOG_DRIVER}",
        f"--cidfile=/run/{name}/ctr-id",
        "--cgroups=enabled",
        "--sdnotify=conmon",
        "-d",
        "--replace",
    ]
    for f in c["environmentFiles"]:
        argv += ["--env-file", f]
    for v in c["volumes"]:
        argv += ["-v", v]
    for k in sorted(c["labels"]):  # mapAttrsToList: by name
        argv += ["-l", f"{k}={c['labels'][k]}"]
    if c["privileged"]:
        argv.append("--privileged")
    argv.append("--rm")  # autoRemoveOnStop, true by default
    argv += [f"--cap-add={k}" for k in sorted(c["capabilities"]) if c["capabilities"][k] is True]
    argv += [f"--cap-drop={k}" for k in sorted(c["capabilities"]) if c["capabilities"][k] is False]
    argv += [f"--device={d}" for d in c["devices"]]
    argv += [f"--network={n}" for n in dict.fromkeys(c["networks"])]
    argv += ["--pull", c["pull"]]
    argv += c["extraOptions"]
    return [*argv, c["image"], *c["cmd"]]


def _nixos_prepare(host: Host) -> None:
    _doctor_prepare(host)
    (host.root / "run").mkdir(parents=True, exist_ok=True)  # a /run of its own (module doc)
    units = host.dir / "units"
    units.mkdir(exist_ok=True)
    bin_dir = host.dir / "bin"
    (bin_dir / "systemctl").rename(bin_dir / "systemctl.doctor")
    (bin_dir / "systemctl").write_text(SYSTEMCTL.format(units=str(units), other=str(bin_dir / "systemctl.doctor")))
    (bin_dir / "systemctl").chmod(0o755)


class NixosCluster(DoctorCluster):
    """DoctorCluster with every node ``kind = "nixos"`` and the stand-in systemctl."""

    def __init__(self, workdir: Path) -> None:
        super().__init__(workdir)
        self.hosts.prepare = _nixos_prepare

    def profile_text(self) -> str:
        text = super().profile_text()
        assert text.count('kind = "plain"\n') == len(self.hosts)
        return text.replace('kind = "plain"\n', 'kind = "nixos"\n')


def tp4(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "tp4", *args, *(["--sysfs", SYSFS] if args[0] == "serve" else [])]
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=timeout, env={**os.environ, "PYTHONPATH": str(REPO / "python")}
    )


def install_units(cluster: NixosCluster, plan_file: Path, work: Path) -> dict[str, dict]:
    """Evaluate the module for every host from the plan file and give each host its rank unit
    (the stand-in's file) and the directories its tmpfiles rules make; host name -> rankUnit."""
    volumes = {}
    for rank in cluster.plan.nodes[1:]:
        host = cluster.hosts[rank.rank]
        source = next(m.source for m in rank.run.mounts if m.type == "volume")
        volumes[rank.name] = host.run(
            "podman", "volume", "inspect", "--format", "{{.Mountpoint}}", "--", source
        ).stdout.strip()
    # the hosts file: the line's second fabric port (fabric.hcas) needs an address on every host;
    # the evaluation only checks it (the module's networking.interfaces are not played here)
    hosts_file = work / "hosts.toml"
    hosts_file.write_text(
        "".join(
            f'[nodes.{n.name}.ports.enP2p1s0f0np0]\naddress = "198.51.100.{2 + n.rank}"\n' for n in cluster.plan.nodes
        )
    )
    units = {}
    for rank in cluster.plan.nodes:
        host = cluster.hosts[rank.rank]
        local = json.dumps(volumes.get(rank.name, "/nonexistent"))  # a head has no weights volume
        value, err = nix_eval(hosts_expr(plan_file, hosts_file, localWeights=local), work / "nix")
        assert value is not None, err
        unit = value[rank.name]["rankUnit"]
        c = unit["container"]
        assert unit["backend"] == "podman" and unit["unit"] == f"podman-{unit['name']}.service" == rank.service.unit
        (host.dir / "units" / f"{unit['unit']}.json").write_text(
            json.dumps(
                {
                    "name": unit["name"],
                    "run": oci_run_argv(unit["name"], c),
                    # the unit's Environment (oci-containers) and environment.TP4_PLAN (modules/tp4-line.nix)
                    "environment": {"PODMAN_SYSTEMD_UNIT": unit["unit"], "TP4_PLAN": c["labels"]["tp4.plan"]},
                    # what tp4 asks of the unit: the module's serviceConfig (doctor's RDMA.MEMLOCK) and its
                    # Environment as systemctl prints it (space-separated assignments), TP4_PLAN the plan
                    # the host configuration was built from (serve compares it with the plan it serves)
                    "show": {
                        "LimitMEMLOCK": unit["serviceConfig"]["LimitMEMLOCK"],
                        "Environment": f"PODMAN_SYSTEMD_UNIT={unit['unit']} TP4_PLAN={c['labels']['tp4.plan']}",
                    },
                }
            )
        )
        for d in unit["directories"]:  # systemd.tmpfiles.rules: d <path> <mode> <user> - -
            host.run("install", "-d", "-m", d["mode"], "-o", d["user"], "--", d["path"])
        units[rank.name] = unit
    return units


@pytest.fixture(scope="module")
def line(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NixosCluster]:
    with NixosCluster(tmp_path_factory.mktemp("serve-nixos")) as c:
        c.reset()
        for host in c.hosts:  # spark-host's timer of the plan's SM clock cap (GPU.CLOCK_CAP)
            c.fake(host, "unit-state.tp4-gpu-clock.timer").write_text("active\n")
        yield c


def test_the_plan_files_digest_reaches_status_through_the_nixos_unit_and_another_plan_is_named_and_refused(
    line: NixosCluster, tmp_path: Path
) -> None:
    """`tp4 plan -o plan.json` is the plan file the hosts' module reads; the rank unit it gives
    each host labels the container with the file's digest, which `tp4 status` reports for every
    rank; a changed profile is reported with the fields that differ, and serve refuses it."""
    profile = str(line.profile)
    plan_file = tmp_path / "plan.json"
    wrote = tp4("plan", "--json", "-o", str(plan_file), "--profile", profile)
    assert wrote.returncode == 0, wrote.stderr
    committed = json.loads(plan_file.read_text())
    digest = committed["digest"]
    assert digest == line.plan.digest
    units = install_units(line, plan_file, tmp_path)
    for rank in line.plan.nodes:
        labels = units[rank.name]["container"]["labels"]
        assert labels == {"tp4.line": committed["line"]["id"], "tp4.rank": str(rank.rank), "tp4.plan": digest}
    try:
        proc = tp4("serve", "--profile", profile)
        assert proc.returncode == 0, proc.stderr
        assert f"profile: {profile} (plan {digest})" in proc.stderr.splitlines()
        for node, host in zip(line.nodes(), line.hosts, strict=True):
            # the unit's container: created by the unit's `podman run` (podman keeps its argv), with
            # the module's labels, oci-containers' --rm and the cidfile
            c = units[node.name]["container"]
            created = json.loads(
                host.run("podman", "inspect", "--format", "{{json .Config.CreateCommand}}", node.container).stdout
            )
            assert created == oci_run_argv(node.container, c)
            got = json.loads(
                host.run("podman", "inspect", "--format", "{{json .Config.Labels}}", node.container).stdout
            )
            assert {k: got.get(k) for k in c["labels"]} == c["labels"]
            assert (
                host.run("podman", "inspect", "--format", "{{.HostConfig.AutoRemove}}", node.container).stdout.strip()
                == "true"
            )
            cid = host.run("cat", f"/run/{node.container}/ctr-id").stdout.strip()
            assert cid == host.run("podman", "inspect", "--format", "{{.Id}}", node.container).stdout.strip()
            # serve wrote the env file the unit reads, and the plan beside it, under /run/tp4
            assert c["environmentFiles"] == [node.rank.service.env_file] and node.rank.service.env_file.startswith(
                "/run/tp4/"
            )
            assert host.run("stat", "-c", "%a", node.rank.service.env_file).stdout.strip() == "600"
            stored = node.rank.service.env_file.removesuffix(".env") + ".plan.json"
            assert json.loads(host.run("cat", stored).stdout)["digest"] == digest
        status = tp4("status", "--profile", profile, "--json")
        assert status.returncode == 0, status.stdout + status.stderr
        data = json.loads(status.stdout)
        assert [n["state"] for n in data["nodes"]] == ["running"] * 4
        assert [n["plan"] for n in data["nodes"]] == [digest] * 4
        assert data["plan"]["same"] is True and data["plan"]["fields"] == []
        same = tp4("plan", "--profile", profile, "--against-running")
        assert same.returncode == 0, same.stdout + same.stderr
        assert f"plan: the line runs this plan ({digest})" in same.stdout

        changed = tmp_path / "changed.toml"
        changed.write_text(line.profile.read_text() + '\n[env]\nTP4_STANDIN_NOTE = "changed"\n')
        new = json.loads(tp4("plan", "--profile", str(changed), "--json").stdout)["digest"]
        assert new != digest
        human = tp4("status", "--profile", str(changed))
        assert human.returncode == 0, human.stdout + human.stderr
        assert f"from another plan ({digest}), not this plan ({new})" in human.stdout
        assert 'nodes[0].env.TP4_STANDIN_NOTE: running null, this plan "changed"' in human.stdout
        data = json.loads(tp4("status", "--profile", str(changed), "--json").stdout)["plan"]
        assert data["same"] is False and data["running"] == [digest]
        assert {f.split(":")[0] for f in data["fields"]} == {f"nodes[{r}].env.TP4_STANDIN_NOTE" for r in range(4)}
        diff = tp4("plan", "--profile", str(changed), "--against-running")
        assert diff.returncode == 1 and "4 field(s) differ: nodes[0].env.TP4_STANDIN_NOTE" in diff.stdout
        refused = tp4("serve", "--profile", str(changed))
        assert refused.returncode == 1 and "already running" in refused.stderr
        assert f"from another plan ({digest}), not this plan ({new})" in refused.stderr
        assert "commit it and deploy the hosts (tp4 deploy), then `tp4 serve --replace` stops it" in refused.stderr
        assert [n["plan"] for n in json.loads(tp4("status", "--profile", profile, "--json").stdout)["nodes"]] == [
            digest
        ] * 4
        # the hosts were built from the committed plan file: --replace with another plan would start
        # their units, which run that file's container, with this plan's env file; serve refuses
        # before it stops anything, naming the unit's plan and how to deploy this one
        replaced = tp4("serve", "--profile", str(changed), "--replace")
        assert replaced.returncode == 1, replaced.stderr
        head = line.plan.nodes[0]
        assert (
            f"{head.name}: deployed plan: its NixOS unit {head.service.unit} was built from plan {digest}, "
            f"not this plan ({new})"
        ) in replaced.stderr, replaced.stderr
        assert "4 NixOS node(s)" in replaced.stderr and "tp4 plan --json -o plan.json" in replaced.stderr
        assert "replacing" not in replaced.stderr and "Traceback" not in replaced.stderr
        assert [n["plan"] for n in json.loads(tp4("status", "--profile", profile, "--json").stdout)["nodes"]] == [
            digest
        ] * 4

        stop = tp4("stop", "--profile", profile)
        assert stop.returncode == 0, stop.stderr
        assert_nothing_left(line)
        # a stopped line: the changed plan is refused all the same, and nothing starts
        refused = tp4("serve", "--profile", str(changed))
        assert refused.returncode == 1, refused.stderr
        assert (
            f"{head.name}: deployed plan: its NixOS unit {head.service.unit} was built from plan {digest}"
            in refused.stderr
        )
        assert "started" not in refused.stderr

        # the stop is recorded beside the head's env file under /run/tp4 (as that file is written:
        # mode 0600), status says the line was stopped on purpose, a refused serve leaves the
        # record and a serve removes it
        record = head.service.env_file.removesuffix(".env") + ".stopped.json"
        assert line.hosts[0].run("stat", "-c", "%a", record).stdout.strip() == "600"
        assert json.loads(line.hosts[0].run("cat", record).stdout)["by"] == "tp4 stop"
        down = json.loads(tp4("status", "--profile", profile, "--json").stdout)
        assert down["state"] == "down" and down["state_detail"].startswith("stopped by tp4 stop at "), down
        again = tp4("serve", "--profile", profile)
        assert again.returncode == 0, again.stderr
        assert line.hosts[0].run("test", "-e", record, check=False).returncode == 1
        assert json.loads(tp4("status", "--profile", profile, "--json").stdout)["stopped"] is None
        assert tp4("stop", "--profile", profile).returncode == 0
    finally:
        for host in line.hosts:
            host.run("podman", "rm", "-f", "-a", "-t", "0", check=False)
    assert_nothing_left(line)
    for node, host in zip(line.nodes(), line.hosts, strict=True):  # the units' runtime directories went too
        assert host.run("test", "-e", f"/run/{node.container}", check=False).returncode == 1
