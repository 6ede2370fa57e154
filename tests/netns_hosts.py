"""Test hosts: network namespaces on a private bridge, each with its own real sshd.

Reusable by every test that needs nodes over ssh (distribute, deploy, serve)::

    with NetnsHosts(tmp_path, count=3) as hosts:
        hosts[0].remote        # a tp4.process.Remote for that host (key auth, BatchMode)
        hosts.rate_limit("50mbit")

Each host is ``<subnet>.<2+i>`` in namespace ``tp4t<pid>h<i>``; the bridge ``tp4t<pid>`` holds
``<subnet>.1`` (the "head" side, the test process). Traffic stays on this bridge. The subnet is
``10.77.<n>`` with ``n`` from the process id, so two test runs on one machine do not collide.
Each host's sshd sets ``CONTAINERS_STORAGE_CONF`` in its sessions, so ``podman`` run over ssh on
that host uses the host's own image store (``<dir>/storage``): the hosts share one filesystem but
not images. ``env=`` adds environment to every session (``SetEnv``); ``Host.run`` runs a command
on a host over ssh.
Needs root, iproute2 and openssh-server.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from tp4 import process
from tp4.process import Remote

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"


def storage_conf(root: Path) -> Path:
    """A containers-storage config for an isolated podman store under ``root`` (vfs driver)."""
    (root / "storage").mkdir(parents=True, exist_ok=True)
    conf = root / "storage.conf"
    conf.write_text(
        "[storage]\n"
        'driver = "vfs"\n'
        f'graphroot = "{root}/storage/graph"\n'
        f'runroot = "{root}/storage/run"\n'
    )
    return conf


@dataclass
class Host:
    name: str
    namespace: str
    address: str
    dir: Path
    remote: Remote
    sshd: subprocess.Popen | None = None
    env: dict[str, str] = field(default_factory=dict)

    def run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess:
        """Run a command on the host over ssh (as tp4 would)."""
        return process.run(list(argv), remote=self.remote, check=check)


class NetnsHosts:
    def __init__(self, workdir: Path, count: int = 3, *, env: dict[str, str] | None = None,
                 subnet: str | None = None) -> None:
        self.workdir = Path(workdir)
        self.count = count
        self.prefix = f"tp4t{os.getpid() % 100000}"
        self.subnet = subnet or f"10.77.{os.getpid() % 200 + 20}"
        self.bridge = self.prefix
        self.hosts: list[Host] = []
        self.extra_env = dict(env or {})
        self.key = self.workdir / "id_ed25519"

    def __enter__(self) -> NetnsHosts:
        try:
            self._setup()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getitem__(self, i: int) -> Host:
        return self.hosts[i]

    def __iter__(self):
        return iter(self.hosts)

    def __len__(self) -> int:
        return len(self.hosts)

    @property
    def head_address(self) -> str:
        """The test process's address on the bridge (what the hosts see as the head)."""
        return f"{self.subnet}.1"

    @property
    def remotes(self) -> list[Remote]:
        return [h.remote for h in self.hosts]

    def _ip(self, *args: str) -> None:
        process.run(["ip", *args])

    def _setup(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        Path("/run/sshd").mkdir(exist_ok=True)
        process.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(self.key)])
        known_hosts = self.workdir / "known_hosts"
        self._ip("link", "add", self.bridge, "type", "bridge")
        self._ip("addr", "add", f"{self.subnet}.1/24", "dev", self.bridge)
        self._ip("link", "set", self.bridge, "up")
        for i in range(self.count):
            self.hosts.append(self._host(i, known_hosts))
        deadline = time.monotonic() + 20
        for host in self.hosts:
            while process.run(["true"], remote=host.remote, check=False).returncode != 0:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"sshd on {host.address} did not come up")
                time.sleep(0.1)

    def _host(self, i: int, known_hosts: Path) -> Host:
        name, ns, addr = f"node{i + 1}", f"{self.prefix}h{i}", f"{self.subnet}.{2 + i}"
        hdir = self.workdir / name
        hdir.mkdir(parents=True, exist_ok=True)
        outer, inner = f"{self.prefix}v{i}", f"{self.prefix}p{i}"
        self._ip("netns", "add", ns)
        self._ip("link", "add", outer, "type", "veth", "peer", "name", inner)
        self._ip("link", "set", inner, "netns", ns)
        self._ip("link", "set", outer, "master", self.bridge)
        self._ip("link", "set", outer, "up")
        for args in (["addr", "add", f"{addr}/24", "dev", inner], ["link", "set", inner, "up"],
                     ["link", "set", "lo", "up"]):
            process.run(["ip", "netns", "exec", ns, "ip", *args])
        process.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(hdir / "host_key")])
        shutil.copy(f"{self.key}.pub", hdir / "authorized_keys")
        env = {"CONTAINERS_STORAGE_CONF": str(storage_conf(hdir)), **self.extra_env}
        (hdir / "sshd_config").write_text(
            f"ListenAddress {addr}\nPort 22\nHostKey {hdir / 'host_key'}\n"
            f"PidFile {hdir / 'sshd.pid'}\nAuthorizedKeysFile {hdir / 'authorized_keys'}\n"
            "PermitRootLogin prohibit-password\nPasswordAuthentication no\nStrictModes no\n"
            "UsePAM no\nMaxStartups 100\nMaxSessions 100\n"
            f"SetEnv {' '.join(f'{k}={v}' for k, v in env.items())}\n"
        )
        sshd = process.start(["ip", "netns", "exec", ns, SSHD, "-D", "-e", "-f", str(hdir / "sshd_config")],
                             stdout=subprocess.DEVNULL, stderr=open(hdir / "sshd.log", "wb"))
        remote = Remote(host=addr, user="root", identity=str(self.key), options=(
            f"UserKnownHostsFile={known_hosts}", "StrictHostKeyChecking=no", "LogLevel=ERROR"))
        return Host(name=name, namespace=ns, address=addr, dir=hdir, remote=remote, sshd=sshd, env=env)

    def rate_limit(self, rate: str, burst: str = "256kb", latency: str = "50ms") -> None:
        """Limit each host's link (both directions) with a tbf qdisc, like a slower network."""
        for i, host in enumerate(self.hosts):
            process.run(["tc", "qdisc", "replace", "dev", f"{self.prefix}v{i}", "root", "tbf",
                         "rate", rate, "burst", burst, "latency", latency])
            process.run(["ip", "netns", "exec", host.namespace, "tc", "qdisc", "replace", "dev",
                         f"{self.prefix}p{i}", "root", "tbf", "rate", rate, "burst", burst, "latency", latency])

    def close(self) -> None:
        for i, host in enumerate(self.hosts):
            if host.sshd is not None and host.sshd.poll() is None:
                host.sshd.terminate()
                try:
                    host.sshd.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    host.sshd.kill()
            process.run(["ip", "netns", "del", host.namespace], check=False)
            process.run(["ip", "link", "del", f"{self.prefix}v{i}"], check=False)
        process.run(["ip", "link", "del", self.bridge], check=False)
        self.hosts = []
