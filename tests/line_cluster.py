"""The test cluster of the `tp4 serve` scenarios: four hosts (tests/netns_hosts.py, a real sshd
each) whose real podman (runc) runs each rank's container with exactly the flags of the plan
(tp4.serving.serve.run_argv), from the stand-in engine's test image (tests/standin/image.py)::

    with LineCluster(tmp_path) as cluster:
        cluster.profile        # the profile TOML of this cluster (head + 3 workers)
        cluster.plan           # tp4.line.plan.build_plan of it
        cluster.hosts, cluster.head
        cluster.nodes()        # tp4.nodes_of(cluster.plan)
        cluster.podman_ps()    # `podman ps -a` on every host
        cluster.leftovers()    # every container and every stand-in process left on any host

The profile: the production preset with the hosts' bridge addresses as fabric IP and ssh
address, user root, the hosts' key, ssh port 22, runtime podman, kind plain, every node's home and
workdir under the cluster's directory (so the mounted ~/.cache and engram dirs are there too),
``model.dir`` on the head holding a config.json, the default fabric. Every host's store holds
the stand-in image under the plan's image tag; each worker has the weights volume of the plan
(``nfs.volume``, `podman volume create`) with a config.json in it. tp4 trusts the hosts' keys
(TP4_KNOWN_HOSTS, as NetnsHosts records them).

What this machine lacks, and how the cluster makes up for it (in the test hosts' configuration,
never in what tp4 renders):

1. ``ip netns exec`` remounts /sys in a new mount namespace, where runc finds no cgroups:
   NetnsHosts starts sshd with ``nsenter --net`` (the network namespace only) in a private mount
   namespace of its own (``unshare --mount``).
2. No CAP_SYS_RESOURCE: memlock cannot be raised above the hard limit, so the plan's
   ``--ulimit memlock=-1:-1`` fails. The profile's ``cluster.memlock`` is the hard limit of this
   process as soft and hard (``resource.getrlimit``; "-1:-1" where it is unlimited); tp4 warns
   about it. podman's default nofile and nproc limits exceed the hard limits too: every host's
   sessions get a containers.conf (CONTAINERS_CONF, by sshd's SetEnv like
   CONTAINERS_STORAGE_CONF) whose ``default_ulimits`` stay within them (nofile at most 65536,
   nproc 4096: podman runs conmon, and so runc, with RLIMIT_NPROC lowered to 32768 here). podman
   4.3 applies those only to a run without any ``--ulimit``, though, and the plan's run sets
   memlock and stack: then it gives nofile and nproc 1048576, which runc cannot set. So the
   hosts' OCI runtime is tests/runc_rlimits.sh (containers.conf ``[engine] runtime``; it calls
   tests/runc_rlimits.py for create, run and exec, runc itself for the rest): runc, with
   those two limits (and only those: the plan never sets them) lowered to its hard limits before
   ``runc create`` and ``runc exec``; the plan's memlock and stack reach runc as podman wrote
   them. The same containers.conf gives each host its own ``tmp_dir`` and ``lock_type = "file"``
   (the locks in that dir): podman's shared-memory locks are one segment for every store on the
   machine, and the refresh a store's first podman does (an empty tmp_dir looks like a reboot)
   frees every lock in it.
3. ``--device nvidia.com/gpu=all`` is a CDI device and there is no GPU. podman 4.3 (Debian 12) has
   no ``cdi_spec_dirs`` setting (it reads /etc/cdi and /var/run/cdi only), so each host's /etc/cdi
   holds ``nvidia.com-gpu.json``: kind nvidia.com/gpu, device ``all``, whose containerEdits only
   set NVIDIA_VISIBLE_DEVICES=void. It is in the hosts' sshd mount namespace only (NetnsHosts
   lays ``host.root/etc`` over /etc there), never on the machine.
4. There is no /dev/infiniband for ``--device /dev/infiniband:/dev/infiniband``: the hosts' /dev
   (the same overlay, ``host.root/dev``) has /dev/infiniband/uverbs0, a character device with
   /dev/null's numbers (1:3). Nothing is created in the machine's /dev.
5. The workers mount the weights volume read-only and the head binds ``model.dir``: the stand-in
   checks MODEL_PATH/config.json, so both hold one.

Needs what NetnsHosts needs, and podman with runc.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import stat
from pathlib import Path
from types import TracebackType

from netns_hosts import Host, NetnsHosts
from standin import image

from tp4.core import process
from tp4.hosts.nodes import Node, nodes_of
from tp4.line.plan import Plan, build_plan
from tp4.line.profile import load_file
from tp4.line.profile.load import Loaded

COUNT = 4
RUNC = Path(__file__).resolve().parent / "runc_rlimits.sh"
# what a stand-in process's command line holds (boot.py, the engine it starts)
STANDIN_MARKS = ("/opt/dsv41/boot.py", "sglang.launch_server", "standin/engine.py")
CDI_SPEC = {
    "cdiVersion": "0.5.0",
    "kind": "nvidia.com/gpu",
    "devices": [{"name": "all", "containerEdits": {"env": ["NVIDIA_VISIBLE_DEVICES=void"]}}],
}


def hard_limit(which: int) -> str:
    hard = resource.getrlimit(which)[1]
    return "-1" if hard == resource.RLIM_INFINITY else str(hard)


def memlock() -> str:
    """cluster.memlock for this machine: the hard limit as soft and hard (-1:-1 where unlimited)."""
    limit = hard_limit(resource.RLIMIT_MEMLOCK)
    return f"{limit}:{limit}"


def _within(which: int, cap: int) -> int:
    hard = resource.getrlimit(which)[1]
    return cap if hard == resource.RLIM_INFINITY else min(hard, cap)


def containers_conf(host: Host) -> Path:
    # within the hard limits, and nproc well within: podman 4.3 runs conmon (so runc) with
    # RLIMIT_NPROC lowered (32768 here), so the session's hard limit itself is refused
    ulimits = [
        f"nofile={_within(resource.RLIMIT_NOFILE, 65536)}:{_within(resource.RLIMIT_NOFILE, 65536)}",
        f"nproc={_within(resource.RLIMIT_NPROC, 4096)}:{_within(resource.RLIMIT_NPROC, 4096)}",
    ]
    conf = host.dir / "containers.conf"
    conf.write_text(
        "[containers]\n"
        f"default_ulimits = {json.dumps(ulimits)}\n"
        "[engine]\n"
        'runtime = "tp4-runc"\n'
        'lock_type = "file"\n'
        f"tmp_dir = {json.dumps(str(host.dir / 'storage' / 'tmp'))}\n"
        "[engine.runtimes]\n"
        f"tp4-runc = {json.dumps([str(RUNC)])}\n"
    )
    return conf


def prepare(host: Host) -> None:
    """A host's podman configuration, its GPU (CDI) and its RDMA device (see the module doc)."""
    host.env["CONTAINERS_CONF"] = str(containers_conf(host))
    cdi = host.root / "etc" / "cdi"
    cdi.mkdir(parents=True, exist_ok=True)
    (cdi / "nvidia.com-gpu.json").write_text(json.dumps(CDI_SPEC, indent=2) + "\n")
    ib = host.root / "dev" / "infiniband"
    ib.mkdir(parents=True, exist_ok=True)
    os.mknod(ib / "uverbs0", 0o666 | stat.S_IFCHR, os.makedev(1, 3))


def _q(value: str) -> str:
    return json.dumps(value)  # a TOML basic string


class LineCluster:
    def __init__(self, workdir: Path, *, key_file: str | None = None, storage_driver: str = "vfs") -> None:
        self.workdir = Path(workdir)
        self.key_file = key_file
        self.hosts = NetnsHosts(self.workdir / "hosts", count=COUNT, prepare=prepare, storage_driver=storage_driver)
        self.profile = self.workdir / "profile.toml"
        self.model_dir = self.workdir / "model"
        self.loaded: Loaded | None = None
        self._plan: Plan | None = None

    # --- lifecycle -------------------------------------------------------------------------

    def __enter__(self) -> LineCluster:
        self.hosts.__enter__()
        try:
            self._setup()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _setup(self) -> None:
        self.model_dir.mkdir(parents=True, exist_ok=True)
        (self.model_dir / "config.json").write_text('{"architectures": ["DeepseekV4ForCausalLM"]}\n')
        self.profile.write_text(self.profile_text())
        self.loaded = load_file(self.profile)
        self._plan = build_plan(self.loaded)
        for host in self.hosts:
            image.load(host.env, tag=self._plan.image.tag)
        for rank in self._plan.nodes[1:]:
            host = self.hosts[rank.rank]
            for m in rank.run.mounts:
                if m.type == "volume":
                    host.run("podman", "volume", "create", "--", m.source)
                    mountpoint = host.run(
                        "podman", "volume", "inspect", "--format", "{{.Mountpoint}}", "--", m.source
                    ).stdout.strip()
                    process.run(
                        ["sh", "-c", 'cat > "$1/config.json"', "sh", mountpoint],
                        remote=host.remote,
                        input='{"architectures": ["DeepseekV4ForCausalLM"]}\n',
                    )

    def profile_text(self) -> str:
        nodes = []
        for i, host in enumerate(self.hosts):
            table = "[cluster.head]" if i == 0 else "[[cluster.workers]]"
            nodes.append(
                f"{table}\nname = {_q(host.name)}\nip = {_q(host.address)}\nssh = {_q(host.address)}\n"
                f'user = "root"\nidentity = {_q(str(self.hosts.key))}\nssh_port = 22\n'
                f"home = {_q(str(host.dir / 'home'))}\nworkdir = {_q(str(host.dir / 'work'))}\n"
                'kind = "plain"\nruntime = "podman"\n'
            )
        api = f"\n[api]\nkey_file = {_q(self.key_file)}\n" if self.key_file else ""
        return (
            '# the LineCluster of the tests (tests/line_cluster.py)\npreset = "production"\n\n'
            f'[cluster]\nuser = "root"\nidentity = {_q(str(self.hosts.key))}\nmemlock = {_q(memlock())}\n\n'
            + "\n".join(nodes)
            + f"\n[model]\ndir = {_q(str(self.model_dir))}\n"
            + api
        )

    def close(self) -> None:
        for host in self.hosts:
            if host.sshd is not None and host.sshd.poll() is None:
                process.run(["podman", "rm", "-f", "-a", "-t", "0"], remote=host.remote, check=False, timeout=60)
        self.hosts.close()
        for host in self._host_dirs():
            shutil.rmtree(host / "storage", ignore_errors=True)  # the image, 4 copies (vfs)

    def _host_dirs(self) -> list[Path]:
        return sorted(p.parent for p in (self.workdir / "hosts").glob("node*/storage.conf"))

    # --- what tests use --------------------------------------------------------------------

    @property
    def plan(self) -> Plan:
        assert self._plan is not None, "LineCluster: not entered"
        return self._plan

    @property
    def head(self) -> Host:
        return self.hosts[0]

    def nodes(self) -> list[Node]:
        """The plan's nodes as tp4.serving.serve reaches them (over ssh, as the profile says)."""
        return nodes_of(self.plan)

    def podman_ps(self) -> dict[str, str]:
        """`podman ps -a` on every host: host name -> its output."""
        return {h.name: h.run("podman", "ps", "-a").stdout for h in self.hosts}

    def containers(self, host: Host) -> list[str]:
        """Every container on the host: "name (state)"."""
        out = host.run("podman", "ps", "-a", "--format", "{{.Names}} ({{.State}})").stdout
        return [line for line in out.splitlines() if line.strip()]

    def processes(self, host: Host) -> list[str]:
        """Every stand-in process in the host's network namespace: "pid cmdline"."""
        pids = process.run(["ip", "netns", "pids", host.namespace], check=False).stdout.split()
        found = []
        for pid in pids:
            try:
                cmdline = (
                    Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
                )
            except OSError:  # gone meanwhile
                continue
            if any(mark in cmdline for mark in STANDIN_MARKS):
                found.append(f"{pid} {cmdline}")
        return found

    def leftovers(self) -> list[str]:
        """Every container and every stand-in process on every host: "<host>: ..."."""
        out = []
        for host in self.hosts:
            out += [f"{host.name}: container {c}" for c in self.containers(host)]
            out += [f"{host.name}: process {p}" for p in self.processes(host)]
        return out

    def api(self) -> str:
        """The head's API as the test process reaches it (over the bridge)."""
        return self.plan.line.api
