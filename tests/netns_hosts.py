"""Test hosts: network namespaces on a private bridge, each with its own real sshd.

Reusable by every test that needs nodes over ssh (distribute, deploy, serve)::

    with NetnsHosts(tmp_path, count=3) as hosts:
        hosts[0].remote        # a tp4.core.process.Remote for that host (key auth, BatchMode)
        hosts.rate_limit("50mbit")

Each host is ``<subnet>.<2+i>`` in namespace ``tp4t<pid><k>h<i>``; the bridge ``tp4t<pid><k>`` holds
``<subnet>.1`` (the "head" side, the test process). Traffic stays on this bridge. The subnet is
``10.77.<n>``: the first from ``n`` (derived from the process id and the cluster's number ``k`` in
the run) that no interface of the machine holds, so two test runs on one machine, and two clusters
of one run, do not collide.
Each host's sshd sets ``CONTAINERS_STORAGE_CONF`` in its sessions, so ``podman`` run over ssh on
that host uses the host's own image store (``<dir>/storage``): the hosts share one filesystem but
not images. ``env=`` adds environment to every session (``SetEnv``); ``Host.run`` runs a command
on a host over ssh.

tp4 trusts only the host keys in its own known_hosts (tp4.core.knownhosts): the hosts' keys are
recorded in ``<workdir>/known_hosts`` and ``TP4_KNOWN_HOSTS`` points at it while the hosts are up
(for the test process and the tp4 commands it starts), as `tp4 hosts trust` would have.
``new_host_key(i)`` gives a host a new key (a reinstalled node), and ``close`` ends tp4's shared
ssh connections to the hosts and every process left in their namespaces.

Each sshd runs in the host's network namespace only (``nsenter --net``), not under ``ip netns
exec``: that one also enters a new mount namespace and remounts /sys there, where runc then finds
no cgroups, so ``podman run`` in a session would fail. sshd gets a private mount namespace of its
own (``unshare --mount``), shared by its sessions: ``prepare(host)`` (called before the host's
sshd starts; it may add to ``host.env``) can put files under ``host.root`` (``<dir>/root``), and
each of its top directories ``dev``, ``etc`` and ``run`` (where ``prepare`` made one) is laid over
the machine's /dev, /etc or /run in that namespace (an overlay whose upper layer is a tmpfs
holding a copy of the tree): the host's sessions see them and what they write there, the machine
does not, and they go with the namespace. ``host.bind(src,
dst)`` (in ``prepare``) binds a directory of the host over one of the machine's there, e.g. a
host-local /nix/var/nix/profiles (the hosts share this machine's /nix/store).

The sessions' shell (root's bash, which sshd runs with ``-c`` for every command and which then
reads ``~/.bashrc``) reads a fresh account's ``.bashrc`` there (Debian's /etc/skel one, which
returns at once when not interactive), bound over this machine's ``~/.bashrc`` in that mount
namespace only: as on a freshly installed node. A development machine's root ``.bashrc`` may do
much more (here it ran `pyenv init`: 80 ms of CPU per remote command), which every test and
benchmark would otherwise count as tp4's.
Needs root, iproute2, util-linux (nsenter, unshare) and openssh-server.
"""

from __future__ import annotations

import itertools
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tp4.core import knownhosts, process
from tp4.core.process import Remote

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"
# the top directories of host.root that are laid over the machine's (in sshd's mount namespace)
OVERLAID = ("dev", "etc", "run")
# the sessions' ~/.bashrc (module doc): a fresh account's
FRESH_BASHRC = (
    Path("/etc/skel/.bashrc").read_text()
    if Path("/etc/skel/.bashrc").is_file()
    else "case $- in *i*) ;; *) return;; esac\n"
)
# run as `sh -c SETUP sh <host dir> <sshd argv...>` in sshd's new mount namespace: each
# <host dir>/root/<top> over /<top> (an overlay on a tmpfs copy; the submounts of /<top>, such as
# /dev/shm and /dev/pts, bound back), then sshd
_SETUP = r"""set -e
mount --make-rprivate /
dir=$1; shift
mnt=$dir/mnt
mkdir -p "$mnt"
mount -t tmpfs tp4-netns "$mnt"
for top in dev etc run; do
  [ -d "$dir/root/$top" ] || continue
  mkdir -p "$mnt/$top.lower" "$mnt/$top.work"
  cp -a "$dir/root/$top" "$mnt/$top.upper"
  mount --rbind "/$top" "$mnt/$top.lower"
  mount -t overlay overlay -o "lowerdir=$mnt/$top.lower,upperdir=$mnt/$top.upper,workdir=$mnt/$top.work" "/$top"
  awk -v p="$mnt/$top.lower/" 'index($5, p) == 1 { s = substr($5, length(p) + 1); sub("/.*", "", s); print s }' \
      /proc/self/mountinfo | sort -u | while read -r sub; do mount --rbind "$mnt/$top.lower/$sub" "/$top/$sub"; done
done
if [ -f "$dir/bashrc" ] && [ -f "$HOME/.bashrc" ]; then mount --bind "$dir/bashrc" "$HOME/.bashrc"; fi
if [ -f "$dir/binds" ]; then
  while IFS='	' read -r src dst; do mount --bind "$src" "$dst"; done < "$dir/binds"
fi
exec "$@"
"""


def storage_conf(root: Path, driver: str = "vfs") -> Path:
    """A containers-storage config for an isolated podman store under ``root`` (vfs driver; the
    benchmarks use overlay, as the nodes do: vfs copies the image's whole tree per container)."""
    (root / "storage").mkdir(parents=True, exist_ok=True)
    conf = root / "storage.conf"
    conf.write_text(
        f'[storage]\ndriver = "{driver}"\ngraphroot = "{root}/storage/graph"\nrunroot = "{root}/storage/run"\n'
    )
    return conf


def podman_store(monkeypatch, prefix: str) -> Iterator[Path]:
    """A pytest fixture's body: this machine's podman on a store of its own under a short /tmp
    path (CONTAINERS_STORAGE_CONF), emptied and removed after the test."""
    root = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    monkeypatch.setenv("CONTAINERS_STORAGE_CONF", str(storage_conf(root)))
    yield root
    process.run(["podman", "rmi", "-a", "-f"], check=False)
    shutil.rmtree(root, ignore_errors=True)


@dataclass
class Host:
    name: str
    namespace: str
    address: str
    dir: Path
    remote: Remote
    sshd: subprocess.Popen | None = None
    env: dict[str, str] = field(default_factory=dict)

    @property
    def root(self) -> Path:
        """Files the host's sessions see over the machine's /dev and /etc (see the module doc)."""
        return self.dir / "root"

    def bind(self, src: Path, dst: str) -> None:
        """``src`` over the machine's directory ``dst`` in the host's sessions (call it in
        ``prepare``, before its sshd starts; see the module doc)."""
        if any(c in f"{src}{dst}" for c in "\t\n"):
            raise ValueError(f"bind {src} {dst}: no tab or newline in either path")
        with open(self.dir / "binds", "a") as f:
            f.write(f"{src}\t{dst}\n")

    def run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess:
        """Run a command on the host over ssh (as tp4 would)."""
        return process.run(list(argv), remote=self.remote, check=check)


_INSTANCES = itertools.count()


def _free_subnet(first: str) -> str:
    """The first 10.77.<n> from ``first`` on that no interface of the machine's network namespace
    holds: two test runs at once (a fresh-machine CI in a chroot shares the network namespace)
    may derive the same subnet from their process ids, and two bridges of one /24 break both."""
    taken = set(re.findall(r"inet 10\.77\.(\d+)\.", process.run(["ip", "-4", "-o", "addr", "show"]).stdout))
    start = int(first.rsplit(".", 1)[1])
    for k in range(200):
        n = (start - 20 + k) % 200 + 20
        if str(n) not in taken:
            return f"10.77.{n}"
    raise RuntimeError("every subnet 10.77.20-219 is held by an interface: remove the bridges a run left behind")


class NetnsHosts:
    def __init__(
        self,
        workdir: Path,
        count: int = 3,
        *,
        env: dict[str, str] | None = None,
        subnet: str | None = None,
        prepare: Callable[[Host], None] | None = None,
        storage_driver: str = "vfs",
    ) -> None:
        self.workdir = Path(workdir)
        self.count = count
        # names and subnet of this cluster alone: each cluster of a test run has its own (a letter
        # and a subnet per instance), so hosts a failed teardown left behind never answer for the
        # next cluster's addresses with their old host keys
        n = next(_INSTANCES)
        self.prefix = f"tp4t{os.getpid() % 100000}{'abcdefghijklmnopqrstuvwxyz'[n % 26]}"
        self.subnet = subnet or f"10.77.{(os.getpid() + 7 * n) % 200 + 20}"
        self._own_subnet = subnet is None
        self.bridge = self.prefix
        self.hosts: list[Host] = []
        self.extra_env = dict(env or {})
        self.prepare = prepare
        self.storage_driver = storage_driver
        self.key = self.workdir / "id_ed25519"
        self.known_hosts = self.workdir / "known_hosts"
        self._old_known_hosts: str | None = None
        self._set_known_hosts = False

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
        self._old_known_hosts = os.environ.get(knownhosts.ENV)
        os.environ[knownhosts.ENV] = str(self.known_hosts)
        self._set_known_hosts = True
        self.known_hosts.unlink(missing_ok=True)
        self._ip("link", "add", self.bridge, "type", "bridge")
        if self._own_subnet:
            self.subnet = _free_subnet(self.subnet)
        self._ip("addr", "add", f"{self.subnet}.1/24", "dev", self.bridge)
        self._ip("link", "set", self.bridge, "up")
        for i in range(self.count):
            self.hosts.append(self._host(i))
        knownhosts.update([], [(h.address, *self.host_key(h)) for h in self.hosts], self.known_hosts)
        deadline = time.monotonic() + 20
        for host in self.hosts:
            while process.run(["true"], remote=host.remote, check=False).returncode != 0:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"sshd on {host.address} did not come up")
                time.sleep(0.1)

    def unreachable(self) -> str:
        """An address on the bridge where no host answers, trusted as if its node had been up
        once (its key recorded): what a node that is down looks like to tp4."""
        address = f"{self.subnet}.250"
        knownhosts.update([address], [(address, *self.host_key(self.hosts[0]))], self.known_hosts)
        return address

    def host_key(self, host: Host) -> tuple[str, str]:
        """The host's public key: (type, base64)."""
        keytype, key = (host.dir / "host_key.pub").read_text().split()[:2]
        return keytype, key

    def _host(self, i: int) -> Host:
        name, ns, addr = f"node{i + 1}", f"{self.prefix}h{i}", f"{self.subnet}.{2 + i}"
        hdir = self.workdir / name
        hdir.mkdir(parents=True, exist_ok=True)
        outer, inner = f"{self.prefix}v{i}", f"{self.prefix}p{i}"
        self._ip("netns", "add", ns)
        self._ip("link", "add", outer, "type", "veth", "peer", "name", inner)
        self._ip("link", "set", inner, "netns", ns)
        self._ip("link", "set", outer, "master", self.bridge)
        self._ip("link", "set", outer, "up")
        for args in (
            ["addr", "add", f"{addr}/24", "dev", inner],
            ["link", "set", inner, "up"],
            ["link", "set", "lo", "up"],
        ):
            process.run(["ip", "netns", "exec", ns, "ip", *args])
        process.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(hdir / "host_key")])
        shutil.copy(f"{self.key}.pub", hdir / "authorized_keys")
        (hdir / "bashrc").write_text(FRESH_BASHRC)
        env = {"CONTAINERS_STORAGE_CONF": str(storage_conf(hdir, self.storage_driver)), **self.extra_env}
        remote = Remote(host=addr, user="root", identity=str(self.key), options=("LogLevel=ERROR",))
        host = Host(name=name, namespace=ns, address=addr, dir=hdir, remote=remote, env=env)
        if self.prepare is not None:
            self.prepare(host)
        (hdir / "sshd_config").write_text(
            f"ListenAddress {addr}\nPort 22\nHostKey {hdir / 'host_key'}\n"
            f"PidFile {hdir / 'sshd.pid'}\nAuthorizedKeysFile {hdir / 'authorized_keys'}\n"
            "PermitRootLogin prohibit-password\nPasswordAuthentication no\nStrictModes no\n"
            "UsePAM no\nMaxStartups 100\nMaxSessions 100\n"
            f"SetEnv {' '.join(f'{k}={v}' for k, v in host.env.items())}\n"
        )
        self._start_sshd(host)
        return host

    def _start_sshd(self, host: Host) -> None:
        # its log is appended to: a test counts the connections it accepted (LogLevel VERBOSE
        # says "Connection from ..." for each)
        # the network namespace only, and a mount namespace of its own (see the module doc)
        host.sshd = process.start(
            [
                "nsenter",
                f"--net=/run/netns/{host.namespace}",
                "unshare",
                "--mount",
                "--propagation",
                "private",
                "sh",
                "-c",
                _SETUP,
                "sh",
                str(host.dir),
                SSHD,
                "-D",
                "-e",
                "-o",
                "LogLevel=VERBOSE",
                "-f",
                str(host.dir / "sshd_config"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=open(host.dir / "sshd.log", "ab"),
        )

    def _stop_sshd(self, host: Host) -> None:
        """Stop the host's sshd and every session it started (they outlive the listener)."""
        if host.sshd is not None and host.sshd.poll() is None:
            host.sshd.terminate()
            try:
                host.sshd.wait(timeout=5)
            except subprocess.TimeoutExpired:
                host.sshd.kill()
                host.sshd.wait()
        pids = process.run(["ip", "netns", "pids", host.namespace], check=False).stdout.split()
        for pid in pids:
            try:
                os.kill(int(pid), 9)
            except (ProcessLookupError, ValueError):
                pass

    def close_connections(self) -> None:
        """End tp4's shared ssh connections to the hosts (their masters, ControlMaster)."""
        for host in self.hosts:
            subprocess.run(
                [*host.remote.ssh_argv()[:-2], "-O", "exit", "--", host.remote.destination],
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=15,
                check=False,
            )

    def new_host_key(self, i: int) -> None:
        """A new host key for host i (its sshd restarted with it, its sessions gone): what a
        reinstalled node, or someone in the middle, offers. tp4's known_hosts keeps the old one."""
        host = self.hosts[i]
        self._stop_sshd(host)
        for f in (host.dir / "host_key", host.dir / "host_key.pub"):
            f.unlink()
        process.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(host.dir / "host_key")])
        self._start_sshd(host)
        self.wait_for_sshd(host)

    def wait_for_sshd(self, host: Host, seconds: float = 20) -> None:
        deadline = time.monotonic() + seconds
        while process.run(["ssh-keyscan", "-T", "2", "--", host.address], check=False).stdout.count(" ") < 2:
            if time.monotonic() > deadline:
                raise RuntimeError(f"sshd on {host.address} did not come up")
            time.sleep(0.1)

    def rate_limit(self, rate: str, burst: str = "256kb", latency: str = "50ms") -> None:
        """Limit each host's link (both directions) with a tbf qdisc, like a slower network."""
        for i, host in enumerate(self.hosts):
            process.run(
                [
                    "tc",
                    "qdisc",
                    "replace",
                    "dev",
                    f"{self.prefix}v{i}",
                    "root",
                    "tbf",
                    "rate",
                    rate,
                    "burst",
                    burst,
                    "latency",
                    latency,
                ]
            )
            process.run(
                [
                    "ip",
                    "netns",
                    "exec",
                    host.namespace,
                    "tc",
                    "qdisc",
                    "replace",
                    "dev",
                    f"{self.prefix}p{i}",
                    "root",
                    "tbf",
                    "rate",
                    rate,
                    "burst",
                    burst,
                    "latency",
                    latency,
                ]
            )

    def close(self) -> None:
        self.close_connections()
        for i, host in enumerate(self.hosts):
            self._stop_sshd(host)
            process.run(["ip", "netns", "del", host.namespace], check=False)
            process.run(["ip", "link", "del", f"{self.prefix}v{i}"], check=False)
        process.run(["ip", "link", "del", self.bridge], check=False)
        self.hosts = []
        if self._set_known_hosts:
            self._set_known_hosts = False
            if self._old_known_hosts is None:
                os.environ.pop(knownhosts.ENV, None)
            else:
                os.environ[knownhosts.ENV] = self._old_known_hosts
