"""The `tp4 doctor` test cluster: tests/line_cluster.py's four hosts, each with the hardware facts
doctor reads laid as files and stub commands (what this machine has no hardware for)::

    with DoctorCluster(tmp_path) as cluster:
        cluster.reset()               # every host as a good Spark: doctor passes
        cluster.sysfs(host) / ...     # the host's fake sysfs tree (doctor's --sysfs SYSFS)
        cluster.fake(host, "kernel")  # a stub command's data file

What each host gets (in the host's own view only; nothing on the machine changes):

* a sysfs tree at ``<host dir>/sys`` that the host's sessions see as ``SYSFS`` (/etc/tp4-sys: a
  symlink in the host's /etc overlay, so the test can change the tree while the host runs):
  ``class/infiniband/<hca>/ports/1/{state,link_layer,gids/N,gid_attrs/types/N,hw_counters/*}``
  for each HCA of the plan, and ``device/net/<the host's veth>``; the GID table is a ConnectX
  port's (index 0/1 link-local v1/v2, index 2/3 the IPv4-mapped GID v1/v2);
* ``module/nvidia_drm/parameters/{modeset,fbdev}`` in that tree (Y and N: the display reservation);
* stub ``nvidia-smi`` (a GB10 on driver 580.95.05, the compute apps and the SM clocks from data
  files), ``uname`` (``-r`` from a data file when it exists), ``date`` (an offset in seconds from a
  data file) and ``systemctl`` (``get-default`` and ``is-active UNIT`` from data files:
  ``default-target``, ``unit-state.UNIT``, and ``unit-state`` for a ``*-mesh.service``) in
  ``<host dir>/bin``, first on the sessions' PATH (sshd SetEnv);
* MTU 9000 on the bridge and every veth (reset), 48 small shard files (mode 644) in ``model.dir``, the plan
  with ``nfs.share = false`` (the workers' volumes here are local podman volumes) and both
  packed Engram shards of each rank with a valid header;
* ``class/net/<the host's veth>/speed`` in the sysfs tree: 200000 (a 200 GbE port);
* the bootstrap interface the plan names (``fabric.socket_ifname = "tp4boot0"``): in each host's
  network namespace a veth pair ``tp4boot0``/``tp4boot1``, up, ``tp4boot0`` with the address
  ``198.18.0.<2+i>/24`` (a management LAN of its own: nothing else uses it).

Everything else (ip, ping, ss, df, podman, /proc, the routes and ``net.ipv4.ip_forward`` of each
host's network namespace) is real; ``cluster.netns(host, ...)`` runs a command there.
"""

from __future__ import annotations

import shutil
import struct
from pathlib import Path

from line_cluster import LineCluster, prepare
from netns_hosts import Host

from tp4.core import process
from tp4.hosts.doctor import engram_files, mapped_gid

SYSFS = "/etc/tp4-sys"
BOOTSTRAP = "tp4boot0"  # the plan's NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME here
ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"
GOOD_KERNEL_NOTE = "the real uname"

NVIDIA_SMI = """#!/bin/sh
d={fake}
case "$*" in
  *--query-gpu=clocks*) cat "$d/clocks.csv" ;;
  *--query-gpu=*) cat "$d/gpus.csv" ;;
  *--query-compute-apps=*) cat "$d/apps.csv" ;;
  *) echo "NVIDIA-SMI stub" ;;
esac
"""
UNAME = """#!/bin/sh
if [ "$1" = -r ] && [ -f {fake}/kernel ]; then cat {fake}/kernel; else exec {real} "$@"; fi
"""
DATE = """#!/bin/sh
if [ -f {fake}/clock_offset ]; then
  exec {real} -d "@$(( $({real} +%s) + $(cat {fake}/clock_offset) ))" "$@"
fi
exec {real} "$@"
"""

SYSTEMCTL = """#!/bin/sh
if [ "$1" = get-default ]; then
  cat {fake}/default-target 2>/dev/null || echo multi-user.target
  exit
fi
if [ "$1" = is-active ]; then
  for unit; do :; done
  if [ -f "{fake}/unit-state.$unit" ]; then state=$(cat "{fake}/unit-state.$unit")
  else
    case "$unit" in
      *-mesh.service) state=$(cat {fake}/unit-state 2>/dev/null || echo inactive) ;;
      *) state=inactive ;;
    esac
  fi
  echo "$state"
  [ "$state" = active ]
  exit
fi
echo "systemctl stub: $*" >&2
exit 1
"""


def _doctor_prepare(host: Host) -> None:
    prepare(host)
    bin_dir, fake = host.dir / "bin", host.dir / "fake"
    bin_dir.mkdir(exist_ok=True)
    fake.mkdir(exist_ok=True)
    (host.dir / "sys").mkdir(exist_ok=True)
    etc = host.root / "etc"
    etc.mkdir(parents=True, exist_ok=True)
    (etc / "tp4-sys").symlink_to(host.dir / "sys")
    stubs = {
        "nvidia-smi": NVIDIA_SMI.format(fake=fake),
        "uname": UNAME.format(fake=fake, real=shutil.which("uname")),
        "date": DATE.format(fake=fake, real=shutil.which("date")),
        "systemctl": SYSTEMCTL.format(fake=fake),
    }
    for name, text in stubs.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    host.env["PATH"] = f"{bin_dir}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class DoctorCluster(LineCluster):
    def __init__(self, workdir: Path, *, key_file: str | None = None, storage_driver: str = "vfs") -> None:
        super().__init__(workdir, key_file=key_file, storage_driver=storage_driver)
        self.hosts.prepare = _doctor_prepare

    def profile_text(self) -> str:
        return super().profile_text() + f'\n[nfs]\nshare = false\n\n[fabric]\nsocket_ifname = "{BOOTSTRAP}"\n'

    def netns(self, host: Host, *argv: str) -> str:
        """Run a command in the host's network namespace (its routes, sysctls, links); its output."""
        return process.run(["ip", "netns", "exec", host.namespace, *argv]).stdout

    def set_bootstrap(self, host: Host, *, up: bool = True, address: bool = True) -> None:
        """The host's bootstrap interface (see the module doc): up or down, with or without its address."""
        i = self.hosts.hosts.index(host)
        links = self.netns(host, "ip", "-o", "link", "show")
        if f" {BOOTSTRAP}@" not in links:
            self.netns(host, "ip", "link", "add", BOOTSTRAP, "type", "veth", "peer", "name", "tp4boot1")
        self.netns(host, "ip", "addr", "flush", "dev", BOOTSTRAP)
        if address:
            self.netns(host, "ip", "addr", "add", f"198.18.0.{2 + i}/24", "dev", BOOTSTRAP)
        for dev in ("tp4boot1", BOOTSTRAP):
            self.netns(host, "ip", "link", "set", dev, "up" if up else "down")

    def veth(self, host: Host) -> str:
        return f"{self.hosts.prefix}p{self.hosts.hosts.index(host)}"

    def sysfs(self, host: Host) -> Path:
        return host.dir / "sys"

    def port(self, host: Host, hca: str) -> Path:
        return self.sysfs(host) / "class" / "infiniband" / hca / "ports" / "1"

    def fake(self, host: Host, name: str) -> Path:
        return host.dir / "fake" / name

    def set_mtu(self, mtu: int, hosts: list[Host] | None = None) -> None:
        """The MTU of the hosts' veths (both ends) and, for every host, of the bridge."""
        chosen = list(self.hosts) if hosts is None else hosts
        if hosts is None:
            process.run(["ip", "link", "set", self.hosts.bridge, "mtu", str(mtu)])
        for host in chosen:
            i = self.hosts.hosts.index(host)
            process.run(["ip", "link", "set", f"{self.hosts.prefix}v{i}", "mtu", str(mtu)])
            process.run(["ip", "netns", "exec", host.namespace, "ip", "link", "set", self.veth(host), "mtu", str(mtu)])

    def set_gid(self, host: Host, hca: str, index: int, gid: str, kind: str) -> None:
        port = self.port(host, hca)
        (port / "gids" / str(index)).write_text(gid + "\n")
        (port / "gid_attrs" / "types" / str(index)).write_text(kind + "\n" if kind else "")
        (port / "gid_attrs" / "ndevs" / str(index)).write_text(self.veth(host) + "\n" if kind else "")

    def lay_sysfs(self, host: Host) -> None:
        root = self.sysfs(host)
        shutil.rmtree(root / "class", ignore_errors=True)
        shutil.rmtree(root / "module", ignore_errors=True)
        # nvidia_drm's parameters as the display reservation wants them; the driver declares both
        # `bool` (sysfs prints Y/N), mode 0400 (open-gpu-kernel-modules
        # kernel-open/nvidia-drm/nvidia-drm-linux.c, module_param_named(modeset|fbdev, ..., bool, 0400))
        params = root / "module" / "nvidia_drm" / "parameters"
        params.mkdir(parents=True)
        (params / "modeset").write_text("Y\n")
        (params / "fbdev").write_text("N\n")
        hcas = self.plan.nodes[0].gid.hcas
        for hca in hcas:
            dev = root / "class" / "infiniband" / hca
            (dev / "device" / "net" / self.veth(host)).mkdir(parents=True)
            (root / "class" / "net" / self.veth(host)).mkdir(parents=True, exist_ok=True)
            (root / "class" / "net" / self.veth(host) / "speed").write_text("200000\n")
            port = self.port(host, hca)
            for sub in ("gids", "gid_attrs/types", "gid_attrs/ndevs", "hw_counters"):
                (port / sub).mkdir(parents=True)
            (port / "state").write_text("4: ACTIVE\n")
            (port / "link_layer").write_text("Ethernet\n")
            link_local = "fe80:0000:0000:0000:0200:00ff:fe00:00" + f"{self.hosts.hosts.index(host) + 2:02x}"
            table = [
                (link_local, "IB/RoCE v1"),
                (link_local, "RoCE v2"),
                (mapped_gid(host.address), "IB/RoCE v1"),
                (mapped_gid(host.address), "RoCE v2"),
            ] + [(ZERO_GID, "")] * 4
            for i, (gid, kind) in enumerate(table):
                self.set_gid(host, hca, i, gid, kind)
            for c in ("packet_seq_err", "roce_adp_retrans", "req_transport_retries_exceeded"):
                (port / "hw_counters" / c).write_text("7\n")

    def engram_dir(self, rank: int) -> Path:
        return Path(next(m.source for m in self.plan.nodes[rank].run.mounts if m.target == "/engram"))

    def lay_engram(self, rank: int) -> None:
        d = self.engram_dir(rank)
        d.mkdir(parents=True, exist_ok=True)
        for name in engram_files(self.plan, self.plan.nodes[rank]):
            rows, row_bytes = 4, 16
            header = struct.pack("<6Q", 0x4D41524745, 1, 0, rows, rows, row_bytes)
            (d / name).write_bytes(header + b"\0" * rows * row_bytes)

    def reset(self) -> None:
        """Every host as a good Spark (see the module doc)."""
        self.set_mtu(9000)
        (self.model_dir / "config.json").write_text('{"architectures": ["DeepseekV4ForCausalLM"]}\n')
        for shard in self.model_dir.glob("model-*-of-*.safetensors"):
            shard.unlink()
        for i in range(1, 49):
            shard = self.model_dir / f"model-{i:05d}-of-00048.safetensors"
            shard.write_bytes(b"shard %d\n" % i)
            shard.chmod(0o644)
        for rank, host in enumerate(self.hosts):
            self.lay_sysfs(host)
            self.set_bootstrap(host)
            self.lay_engram(rank)
            for name in ("kernel", "clock_offset", "unit-state", "default-target"):
                self.fake(host, name).unlink(missing_ok=True)
            for state in self.fake(host, "x").parent.glob("unit-state.*"):
                state.unlink()
            self.fake(host, "gpus.csv").write_text("NVIDIA GB10, 580.95.05\n")
            # clocks.sm, clocks.max.sm, clocks_event_reasons.applications_clocks_setting (csv,
            # noheader, nounits): test values of a capped GPU, not a GB10's reading
            self.fake(host, "clocks.csv").write_text("1980, 3000, Active\n")
            self.fake(host, "apps.csv").write_text("")
