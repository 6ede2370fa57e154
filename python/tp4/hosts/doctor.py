"""`tp4 doctor`: every host requirement of the line checked, read-only, with a fix for each failure.

Two halves:

* :func:`gather` reads each node's facts with ONE remote command per node, all nodes in parallel
  (one ssh session each): the constant shell script :data:`FACTS_SCRIPT`, whose inputs (the sysfs
  root, the HCAs, paths, the image, the peers' addresses) are its arguments, quoted once by
  tp4.core.process. It prints sections (``== name`` then the section's lines) that :func:`parse`
  turns into a :class:`Facts` per node. The host facts that need hardware come from files under
  the sysfs root (``/sys`` by default: ``class/infiniband/<hca>/ports/1/{state,link_layer,gids,
  gid_attrs/types,hw_counters,counters}``, ``class/infiniband/<hca>/device/net``,
  ``module/nvidia_drm/parameters/{modeset,fbdev}``) and commands (``nvidia-smi``, ``uname``, ``ip``,
  ``ping``, ``ss``, ``df``, ``date``, ``systemctl``, ``stat``, ``sha256sum``, ``timeout``, ``bash`` for
  one TCP connection, the runtime), found on the node's PATH.
* :func:`evaluate` turns the facts of every node into checks, locally, each with a stable id
  (:data:`CHECKS`), a status per node (ok, warn, fail, or n/a where it does not apply), a detail
  and, for a warning or failure, a fix. Each check is one function, registered under its id by
  ``@node_check`` (run on every reachable node) or ``@line_check`` (run once, judging the nodes
  against each other) into :data:`RUNS`; evaluate runs them in the order of :data:`CHECKS`. A check is blocking or not: `tp4 doctor` exits 1 on a
  blocking failure, and serve runs :func:`blocking_failures`.

The evidence (``--json``) is ``{"schema": "tp4.doctor/1", "nodes": {name: facts}, "checks":
[...]}``, built through its contract (tp4.core.contracts.doctor_evidence; docs/contracts.md).
"""

from __future__ import annotations

import json
import re
import time
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

from tp4.core.contracts import doctor_evidence
from tp4.core.contracts.doctor_evidence import CheckResult, DoctorEvidence, NodeFacts
from tp4.core.errors import Tp4Error
from tp4.hosts.nodes import Node, parallel
from tp4.line.plan import Plan, RankPlan

if TYPE_CHECKING:
    from tp4.line.profile.models import Profile

SCHEMA = doctor_evidence.SCHEMA
Status = doctor_evidence.Status
Json = None | bool | int | float | str | list["Json"] | dict[str, "Json"]

# the RoCE error counters that rise with packet loss (MiaAI-Lab/GLM#115)
COUNTERS = ("packet_seq_err", "roce_adp_retrans", "req_transport_retries_exceeded")
# don't-fragment ICMP payload that fills an MTU of 9000 (20 bytes IP + 8 bytes ICMP)
JUMBO_PAYLOAD = 8972
FABRIC_MTU = 9000
# the jumbo ping: packets per peer and the wait for a reply (a cold ARP entry loses the first
# packets: nixos-dgx-spark's two-Spark playbook pings `-c 4 -W 2 -I DEV`, sparkring's preflight
# `-c 2 -W 2` each ring edge)
PING_COUNT, PING_WAIT = 3, 2
# a Spark's ConnectX-7 ports are 200 GbE (/sys/class/net/<netdev>/speed in Mb/s; sparkring's
# site topology.link_speed_mbps: 200000, scripts/config/exl3-r7-site.example.yaml line 26 at 4aa030a)
LINK_SPEED_MBPS = 200000
# seconds a worker waits for the head's dist init port to answer a TCP connection
CONTROL_WAIT = 3


class CheckSpec(NamedTuple):
    id: str
    title: str
    blocking: bool


# every check, in the order of the table; the ids are stable (the evidence and serve name them).
# Each id has one function (RUNS, below); a check that reads what another recorded comes after it.
CHECKS: tuple[CheckSpec, ...] = tuple(
    CheckSpec(*c)
    for c in (
        ("SSH.REACHABLE", "ssh reaches the node, its host key trusted", True),
        ("RUNTIME.USABLE", "the container runtime works without sudo, with GPU access", True),
        ("GPU.PRESENT", "nvidia-smi lists a GPU", True),
        ("GPU.NO_FOREIGN_APPS", "no compute apps on the GPU", True),
        ("GPU.DRIVER", "driver 580.x (the display reservation is qualified on it)", False),
        (
            "GPU.NVIDIA_DRM",
            "nvidia_drm loaded with modeset=1 and fbdev=0 where the plan uses the display reservation",
            True,
        ),
        ("HOST.HEADLESS", "boots to multi-user.target, no display manager running", False),
        ("GPU.CLOCK_CAP", "the SM clock capped (upstream measured at `nvidia-smi -lgc 0,2200`)", False),
        ("RDMA.DEVICES", "/dev/infiniband and every HCA of the plan", True),
        ("RDMA.PORT_ACTIVE", "every HCA port ACTIVE", True),
        ("RDMA.LINK_LAYER", "link layer Ethernet (RoCE)", True),
        ("RDMA.IPV4", "an IPv4 address on every HCA's netdev", True),
        (
            "RDMA.ONE_IPV4",
            "exactly one IPv4 address on every HCA's netdev (another shifts the port's GID table)",
            False,
        ),
        ("RDMA.MTU", f"Ethernet MTU {FABRIC_MTU}", False),
        ("RDMA.MTU_SAME", "the same MTU on every node", True),
        (
            "RDMA.JUMBO_PING",
            "don't-fragment pings filling the MTU reach every peer through a fabric port (a ring: both "
            "neighbours; switched: every node)",
            False,
        ),
        # the fabric's links and routes, the bootstrap interface and the rendezvous (docs/doctor.md: "Network")
        (
            "RDMA.LINK_SPEED",
            f"every HCA's netdev at {LINK_SPEED_MBPS} Mb/s (a 200 GbE ConnectX-7 port of the Spark)",
            False,
        ),
        (
            "NET.BOOTSTRAP_IFACE",
            "the bootstrap interface (NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME) present, up, with an IPv4 address",
            True,
        ),
        ("NET.RENDEZVOUS_ROUTE", "the dist init address routable from every node (on the head: its own address)", True),
        ("PEER.CONTROL_CHANNEL", "the head's dist init port answers TCP from every worker", True),
        (
            "RING.ROUTES",
            "ring: every other node's fabric IP routed through a fabric port, via another node's address where "
            "not adjacent",
            True,
        ),
        ("RING.IP_FORWARD", "ring: IPv4 forwarding on every node that another node's route goes through", True),
        ("RDMA.GID", "a RoCE v2 IPv4-mapped GID of the port's address", True),
        (
            "RDMA.GID_SAME_INDEX",
            "that GID at the same index on every node (a warning unless the plan pins every node's index)",
            True,
        ),
        ("RDMA.MEMLOCK", "memlock unlimited for the runtime", True),
        ("RDMA.COUNTERS", "RoCE error counters not rising", False),
        ("KERNEL.KNOWN_BAD", "the kernel is not a known-bad one", True),
        ("WEIGHTS.HEAD", "the checkpoint on the head: config.json and every shard", True),
        (
            "WEIGHTS.SHARD_FILES",
            "every shard on the head a readable, non-empty regular file, as many as expected",
            True,
        ),
        ("WEIGHTS.WORKER", "the weights visible on the worker through the plan's volume", True),
        ("ENGRAM.SHARDS", "both packed Engram shards of the rank, or disk to pack them", True),
        ("IMAGE.SAME", "the image on every node, with the same id and layers", True),
        ("IMAGE.ARCH", "the image's architecture is the host's", True),
        ("IMAGE.DIGEST", "the image is the pinned one (the tag's @sha256 digest, the id `tp4 build` recorded)", True),
        ("DISK.FREE", "free disk for the next image", False),
        ("PORTS.FREE", "the API, dist init and image store ports free on the head", True),
        ("CLOCK.SKEW", "clocks within a second of each other", False),
        ("MEMORY.FREE", "free memory for the engine", False),
        ("RING.NCCL", "ring: the patched NCCL, the mesh unit active", True),
        (
            "ARTIFACT.SHA256",
            "ring: the NCCL library's sha256 is the pinned one (fabric.nccl.sha256), else the same on every node",
            True,
        ),
    )
)
BY_ID = {c.id: c for c in CHECKS}


class Result(NamedTuple):
    check: str  # a CHECKS id
    node: str
    status: Status
    detail: str
    fix: str | None
    blocking: bool  # the check is blocking (a failure of it stops serve)

    def contract(self) -> CheckResult:
        return CheckResult(
            id=self.check, node=self.node, status=self.status, detail=self.detail, fix=self.fix, blocking=self.blocking
        )

    def to_json(self) -> dict[str, Json]:
        out: dict[str, Json] = self.contract().model_dump(mode="json")
        return out


@dataclass(frozen=True)
class Limits:
    """What doctor reads and its thresholds (none of them reaches the remote command but
    ``sysfs`` and ``interval``, which are its arguments)."""

    sysfs: str = "/sys"
    interval: float = 2.0  # seconds between the two reads of the RoCE counters
    image_free_gib: float = 50.0  # the next image (~49 GB)
    engram_free_gib: float = 50.0  # packing both shards of a rank (~48 GiB)
    memory_gib: float = 100.0  # MemAvailable before serving
    clock_skew: float = 1.0  # seconds
    timeout: float = 60.0
    # the kind the workers' weights volume must be: "nfs" (nfs.share) or "local"; None: either
    # (the Plan does not carry nfs.share; the CLI passes it from the profile)
    volume_kind: Literal["nfs", "local"] | None = None
    # the shards of a complete checkpoint (the profile's model.expected_shards, which the Plan
    # does not carry: it is the launcher's EXPECTED_SHARDS, not the container's)
    expected_shards: int = 48
    # False: no jumbo ping (a non-blocking check; serve, which only acts on the blocking ones,
    # skips it and the counters' interval)
    ping: bool = True
    # the head's image store (tp4 build, distribute) starts on this port again: it must be free
    # on the head (tp4.image.imagestore.port_in_waiting; None: running, or it takes a free one)
    registry_port: int | None = None
    # the image id `tp4 build` recorded for the plan's tag (result-<attr>.json); None: no record
    image_id: str | None = None

    @classmethod
    def of_profile(cls, profile: Profile, **given: Any) -> Limits:
        """The limits a profile implies (what its Plan does not carry) and the head's image
        store's port, plus ``given``."""
        from tp4.image import imagestore

        return cls(
            volume_kind="nfs" if profile.nfs.share else "local",
            expected_shards=profile.model.expected_shards,
            registry_port=imagestore.port_in_waiting(),
            image_id=built_image_id(profile.image.variant, profile.image.tag),
            **given,
        )


def built_image_id(variant: str, tag: str, flake: str | None = None) -> str | None:
    """The id `tp4 build` recorded for ``tag`` (the build record next to the flake's out-link,
    tp4.image.build.record_path), or None: no flake, no record, or a record of another tag."""
    from tp4.image import build, nix

    try:
        record = build.Built.load(build.record_path(nix.find_flake(flake), build.image_attr(variant)))
    except (Tp4Error, OSError):
        return None
    return record.id.removeprefix("sha256:") if record.ref == tag else None


# --- the remote half -------------------------------------------------------------------------------

# One constant script, run as `sh -c FACTS_SCRIPT tp4-doctor ARGS...` (the arguments: see
# remote_args). It changes nothing on the node. Each section is `== name` and its lines.
FACTS_SCRIPT = r"""set -f
sys=$1 interval=$2 rt=$3 image=$4 hcas=$5 model=$6 volume=$7 engram=$8 engram_files=$9
shift 9
peers=$1 unit=$2 ncclso=$3 mesh=$4 targets=$5 rdvhost=$6 rdvport=$7
shift 7
s() { printf '== %s\n' "$*"; }
counters() {
  s "counters $1 $(date +%s.%N)"
  for h in $hcas; do
    for c in packet_seq_err roce_adp_retrans req_transport_retries_exceeded; do
      for sub in hw_counters counters; do
        f=$sys/class/infiniband/$h/ports/1/$sub/$c
        if [ -r "$f" ]; then echo "$h $c $(cat "$f")"; break; fi
      done
    done
  done
}
counters 1
sleep "$interval" & sleeper=$!
s uname; uname -r; uname -m
s user; id -u; grep '^CapEff:' /proc/self/status
s memlock; ulimit -S -l; ulimit -H -l
case "$rt" in
  *docker) p=$(pgrep -x dockerd | head -n 1); [ -n "$p" ] && { s memlock_runtime; grep 'locked memory' "/proc/$p/limits"; } ;;
esac
if [ -n "$unit" ]; then s memlock_unit; systemctl show -p LimitMEMLOCK --value -- "$unit" 2>&1; fi
s ip; ip -j addr show 2>&1
s devinf; if [ -d /dev/infiniband ]; then echo present; ls /dev/infiniband; else echo absent; fi
s ibdevs; ls "$sys/class/infiniband" 2>/dev/null
for h in $hcas; do
  d=$sys/class/infiniband/$h
  [ -d "$d" ] || continue
  pd=$d/ports/1
  s "hca $h"
  echo "state $(cat "$pd/state" 2>/dev/null)"
  echo "link_layer $(cat "$pd/link_layer" 2>/dev/null)"
  set +f
  for n in "$d"/device/net/*; do [ -e "$n" ] && echo "netdev ${n##*/}"; done
  s "gids $h"; grep -H . "$pd"/gids/* 2>/dev/null | grep -v ':0000:0000:0000:0000:0000:0000:0000:0000$'
  s "gidtypes $h"; grep -H . "$pd"/gid_attrs/types/* 2>/dev/null
  set -f
done
s nvidia
if command -v nvidia-smi >/dev/null 2>&1; then
  echo present
  s gpus; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1
  s gpu_apps; nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader 2>&1
  s gpu_clock; nvidia-smi --query-gpu=clocks.sm,clocks.max.sm,clocks_event_reasons.applications_clocks_setting --format=csv,noheader,nounits 2>&1
else
  echo absent
fi
s nvidia_drm
if [ -d "$sys/module/nvidia_drm" ]; then
  echo loaded
  for p in modeset fbdev; do
    f=$sys/module/nvidia_drm/parameters/$p
    if [ -r "$f" ]; then echo "$p $(cat "$f")"; elif [ -e "$f" ]; then echo "$p unreadable"; fi
  done
fi
s cmdline; cat /proc/cmdline
s headless
if command -v systemctl >/dev/null 2>&1; then
  echo "default $(systemctl get-default 2>&1 | head -n 1)"
  echo "display-manager.service $(systemctl is-active -- display-manager.service 2>&1 | head -n 1)"
  echo "tp4-gpu-clock.timer $(systemctl is-active -- tp4-gpu-clock.timer 2>&1 | head -n 1)"
fi
s runtime
if command -v "$rt" >/dev/null 2>&1; then
  echo present
  s image; "$rt" image inspect --format '{{.Id}} {{json .RootFS.Layers}}' -- "$image" 2>&1; echo "rc $?"
  s image_config; "$rt" image inspect --format '{{.Architecture}} {{json .RepoDigests}}' -- "$image" 2>&1; echo "rc $?"
  case "$rt" in
    *docker) store=$(docker info --format '{{.DockerRootDir}}' 2>&1)
             s gpu_access; docker info --format '{{json .Runtimes}} {{json .CDISpecDirs}}' 2>&1 ;;
    *) conf=${CONTAINERS_STORAGE_CONF:-}
       if [ -z "$conf" ]; then
         if [ "$(id -u)" = 0 ]; then conf=/etc/containers/storage.conf; else conf=${XDG_CONFIG_HOME:-$HOME/.config}/containers/storage.conf; fi
       fi
       store=$(sed -n 's/^[[:space:]]*graphroot[[:space:]]*=[[:space:]]*"\(.*\)".*/\1/p' "$conf" 2>/dev/null | sed -n 1p)
       if [ -z "$store" ]; then
         if [ "$(id -u)" = 0 ]; then store=/var/lib/containers/storage; else store=${XDG_DATA_HOME:-$HOME/.local/share}/containers/storage; fi
       fi
       s gpu_access; set +f; grep -ls 'nvidia.com/gpu' /etc/cdi/* /var/run/cdi/* 2>/dev/null; set -f ;;
  esac
  s store; echo "$store"
  case "$store" in /*) set -- "$@" "$store" ;; esac
  if [ -n "$volume" ]; then
    s volume; "$rt" volume inspect --format '{{.Mountpoint}} {{.Driver}} {{json .Options}}' -- "$volume" 2>&1; echo "rc $?"
  fi
else
  echo absent
fi
s weights
weights=$model
if [ -n "$volume" ]; then weights=$("$rt" volume inspect --format '{{.Mountpoint}}' -- "$volume" 2>/dev/null | sed -n 1p); fi
if [ -n "$weights" ]; then
  echo "dir $weights"
  [ -f "$weights/config.json" ] && echo config
  echo "shards $(ls -- "$weights" 2>/dev/null | grep -c '^model-.*-of-.*\.safetensors$')"
fi
if [ -n "$model" ]; then
  s shard_files
  ls -- "$model" 2>/dev/null | grep '^model-.*-of-.*\.safetensors$' | while IFS= read -r x; do
    if [ -r "$model/$x" ]; then r=r; else r=-; fi
    st=$(stat -L -c '%s %a %F' -- "$model/$x" 2>/dev/null | tr ' ' _ | sed 's/_/ /; s/_/ /')
    echo "$r ${st:-- - missing} $x"
  done
fi
s engram
for f in $engram_files; do
  if [ -f "$engram/$f" ]; then
    echo "$f $(stat -c %s -- "$engram/$f") $(od -An -tu8 --endian=little -N48 -- "$engram/$f" | tr -s ' \n' '  ')"
  else
    echo "$f absent"
  fi
done
s df
for x in "$@"; do
  d=$x
  while [ ! -e "$d" ] && [ "$d" != / ]; do d=$(dirname -- "$d"); done
  printf 'path %s\n' "$x"
  r=$(df -k --output=avail,target -- "$d" 2>/dev/null | sed -n 2p)
  printf 'free %s\n' "${r:-- -}"
done
s meminfo; grep -E '^(MemTotal|MemAvailable):' /proc/meminfo
s listening; ss -Hltn 2>&1
# the fabric: each HCA netdev's speed, every RDMA device's netdev, the routes to the other nodes
# and to the rendezvous, IPv4 forwarding; then, at once, a jumbo ping to each peer through the
# netdev its route leaves by, and (a worker) a TCP connection to the head's dist init port. Each
# of those prints its whole section in one write, so they never interleave
s speed
for h in $hcas; do
  set +f
  for n in "$sys/class/infiniband/$h"/device/net/*; do
    [ -e "$n" ] && echo "$h ${n##*/} $(cat "$sys/class/net/${n##*/}/speed" 2>/dev/null)"
  done
  set -f
done
s rdmanet
set +f
for n in "$sys"/class/infiniband/*/device/net/*; do
  [ -e "$n" ] && { d=${n%/device/net/*}; echo "${d##*/} ${n##*/}"; }
done
set -f
for t in $targets; do s "route $t"; ip -o route get to "$t" 2>&1; echo "rc $?"; done
s ip_forward; cat /proc/sys/net/ipv4/ip_forward 2>&1
waitfor=
for p in $peers; do
  (
    dev=$(ip -o route get to "$p" 2>/dev/null | sed -n 's/.* dev \([^ ]*\).*/\1/p' | sed -n 1p)
    if [ -n "$dev" ]; then
      out=$(ping -M do -s 8972 -c 3 -W 2 -I "$dev" -- "$p" 2>&1; echo "rc $?")
    else
      out="no route to $p"
    fi
    printf '== ping %s\ndev %s\n%s\n' "$p" "$dev" "$out"
  ) &
  waitfor="$waitfor $!"
done
if [ -n "$rdvport" ]; then
  (
    if command -v bash >/dev/null 2>&1; then
      out=$(timeout 3 bash -c 'exec 3<>"/dev/tcp/$1/$2"' tp4-doctor "$rdvhost" "$rdvport" 2>&1; echo "rc $?")
    else
      out="no bash"
    fi
    printf '== control %s %s\n%s\n' "$rdvhost" "$rdvport" "$out"
  ) &
  waitfor="$waitfor $!"
fi
for j in $waitfor; do wait "$j"; done
if [ -n "$ncclso" ]; then
  s nccl; if [ -f "$ncclso" ]; then echo present; grep -c SWITCHLESS_RING_ONLY -- "$ncclso"; else echo absent; fi
  s nccl_sha256; if [ -f "$ncclso" ]; then sha256sum -- "$ncclso" 2>&1; fi
fi
if [ -n "$mesh" ]; then s mesh; systemctl is-active -- "$mesh" 2>&1; fi
wait "$sleeper"
counters 2
s date; date +%s.%N
"""


def _mount(rank: RankPlan, target: str) -> tuple[str, str] | None:
    for m in rank.run.mounts:
        if m.target == target:
            return m.type, m.source
    return None


def engram_files(plan: Plan, rank: RankPlan) -> tuple[str, ...]:
    """The two packed shards of the rank (upstream's `engram-l{1,14}-r<rank>of<tp>.bin`)."""
    return tuple(f"engram-l{layer}-r{rank.rank}of{plan.line.tp}.bin" for layer in (1, 14))


def ping_peers(plan: Plan, rank: RankPlan) -> list[RankPlan]:
    """The nodes the rank's traffic goes to directly, which the jumbo ping reaches: on a ring its
    two neighbours (the next rank's first), on a switched fabric every other node."""
    n = len(plan.nodes)
    if n < 2:
        return []
    if plan.line.fabric == "ring":
        around = (plan.nodes[(rank.rank + 1) % n], plan.nodes[(rank.rank - 1) % n])
        return list({r.rank: r for r in around}.values())
    return [r for r in plan.nodes if r.rank != rank.rank]


def rendezvous(plan: Plan) -> tuple[str, int]:
    """The dist init address (host, port): the head's torch TCPStore every rank connects to."""
    from tp4.core.netaddr import split_host_port

    host, port = split_host_port(plan.line.dist_init_addr) or (plan.line.dist_init_addr, "")
    return host, int(port) if port.isdigit() else 0


def remote_args(plan: Plan, rank: RankPlan, limits: Limits) -> list[str]:
    """The arguments of FACTS_SCRIPT for one rank (each one argv word; tp4.core.process quotes them)."""
    from tp4.line.plan import ENGRAM_MOUNT, MODEL_MOUNT, NCCL_MOUNT

    model = _mount(rank, MODEL_MOUNT)
    engram = _mount(rank, ENGRAM_MOUNT)
    nccl = _mount(rank, NCCL_MOUNT) or next(
        ((m.type, m.source) for m in rank.run.mounts if m.source.endswith("/libnccl.so.2")), None
    )
    peers = " ".join(r.host for r in ping_peers(plan, rank)) if limits.ping else ""
    rdv_host, rdv_port = rendezvous(plan)
    targets = " ".join(dict.fromkeys([*(r.host for r in plan.nodes if r.rank != rank.rank), rdv_host]))
    ring = plan.line.fabric == "ring"
    ncclso = ""
    if ring and nccl is not None:
        ncclso = nccl[1] if nccl[1].endswith(".so.2") else f"{nccl[1]}/libnccl.so.2"
    state = _mount(rank, "/state")
    dfs = [d for d in (rank.run.workdir, engram[1] if engram else "", state[1] if state else "") if d]
    return [
        limits.sysfs,
        f"{limits.interval:g}",
        rank.service.runtime,
        rank.run.image,
        " ".join(rank.gid.hcas),
        model[1] if model and model[0] == "bind" else "",
        model[1] if model and model[0] == "volume" else "",
        engram[1] if engram else "",
        " ".join(engram_files(plan, rank)),
        peers,
        rank.service.unit or "",
        ncclso,
        rank.service.mesh_unit or "",
        targets,
        rdv_host,
        str(rdv_port) if rank.rank != 0 else "",
        *dfs,
    ]


@dataclass
class Facts:
    """What one node said: its sections (name -> lines), or why it could not be read."""

    sections: dict[str, list[str]] = field(default_factory=dict)
    error: str | None = None
    received: float = 0.0  # this machine's clock when the facts arrived
    seconds: float = 0.0  # how long the node took
    derived: dict[str, Json] = field(default_factory=dict)  # what the checks resolved (the GID index per HCA)

    def get(self, name: str) -> list[str]:
        return self.sections.get(name, [])

    def has(self, name: str) -> bool:
        return name in self.sections

    def contract(self) -> NodeFacts:
        return NodeFacts(
            error=self.error,
            seconds=round(self.seconds, 3),
            received=self.received,
            derived=dict(self.derived),
            sections={k: list(v) for k, v in self.sections.items()},
        )

    def to_json(self) -> dict[str, Json]:
        out: dict[str, Json] = self.contract().model_dump(mode="json")
        return out


def parse(text: str) -> dict[str, list[str]]:
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        if line.startswith("== "):
            current = sections.setdefault(line[3:].strip(), [])
        elif current is not None:
            current.append(line)
    return sections


class Target(NamedTuple):
    """What doctor runs on a node: how to reach it, and the rank it serves."""

    name: str
    rank: RankPlan
    run: Callable[[Sequence[str], float], tuple[int, str, str]]  # argv, timeout -> rc, stdout, stderr


def _target(node: Node) -> Target:
    from tp4.core import process

    def run(argv: Sequence[str], timeout: float) -> tuple[int, str, str]:
        proc = process.run(
            list(argv), remote=node.remote, check=False, timeout=timeout, purpose=f"reading the facts of {node.name}"
        )
        return proc.returncode, proc.stdout or "", proc.stderr or ""

    return Target(node.name, node.rank, run)


def facts_argv(plan: Plan, rank: RankPlan, limits: Limits) -> list[str]:
    """The one command doctor runs on the node."""
    return ["sh", "-c", FACTS_SCRIPT, "tp4-doctor", *remote_args(plan, rank, limits)]


def gather_one(plan: Plan, target: Target, limits: Limits) -> Facts:
    began = time.monotonic()
    try:
        rc, out, err = target.run(facts_argv(plan, target.rank, limits), limits.timeout + limits.interval)
    except Tp4Error as exc:
        return Facts(
            error=exc.message.splitlines()[0] if exc.message else "unreachable", seconds=time.monotonic() - began
        )
    facts = Facts(sections=parse(out), received=time.time(), seconds=time.monotonic() - began)
    if rc == 255 and not facts.sections:
        facts.error = (err.strip().splitlines() or ["ssh failed"])[-1]
    elif "date" not in facts.sections:
        facts.error = f"the facts script stopped early (exit {rc}): {(err.strip().splitlines() or [''])[-1]}"
    return facts


def gather(plan: Plan, nodes: Sequence[Node], limits: Limits) -> dict[str, Facts]:
    """Every node's facts, in parallel (one ssh command each)."""
    targets = {t.name: t for t in (_target(n) for n in nodes)}
    results = parallel(nodes, lambda n: gather_one(plan, targets[n.name], limits))
    out: dict[str, Facts] = {}
    for name, value in results.items():
        out[name] = value if isinstance(value, Facts) else Facts(error=str(value))
    return out


# --- the local half: checks from facts ---------------------------------------------------------------


@dataclass
class Context:
    plan: Plan
    facts: dict[str, Facts]
    limits: Limits
    results: list[Result] = field(default_factory=list)
    ranks: list[RankPlan] = field(default_factory=list)  # the nodes of the plan there are facts of
    up: list[RankPlan] = field(default_factory=list)  # those of them that answered
    # ring: node -> (from, to) of the routes through it (RING.ROUTES finds them, RING.IP_FORWARD judges them)
    relays: dict[str, list[tuple[str, RankPlan]]] = field(default_factory=dict)

    def add(self, check: str, node: str, status: Status, detail: str, fix: str | None = None) -> None:
        spec = BY_ID[check]
        self.results.append(
            Result(check, node, status, detail, fix if status in ("warn", "fail") else None, spec.blocking)
        )


class CheckRun(NamedTuple):
    """How evaluate runs one check: per node (`run(ctx, rank, facts)`, once for every reachable
    node) or for the line (`run(ctx)`, which judges the nodes against each other)."""

    per_node: bool
    run: Callable[..., None]


# check id -> its function; filled by @node_check and @line_check beside each function, one per
# CHECKS id (a test holds the two equal). evaluate runs them in the order of CHECKS.
RUNS: dict[str, CheckRun] = {}


def _register(check: str, per_node: bool) -> Callable[[Callable[..., None]], Callable[..., None]]:
    def register(fn: Callable[..., None]) -> Callable[..., None]:
        if check not in BY_ID or check in RUNS:
            raise AssertionError(f"{check}: not a CHECKS id, or registered twice")
        RUNS[check] = CheckRun(per_node, fn)
        return fn

    return register


def node_check(check: str) -> Callable[[Callable[[Context, RankPlan, Facts], None]], Callable[..., None]]:
    """Register fn(ctx, rank, facts) as check `check`, run once for every reachable node."""
    return _register(check, per_node=True)


def line_check(check: str) -> Callable[[Callable[[Context], None]], Callable[..., None]]:
    """Register fn(ctx) as check `check`, run once for the line (ctx.up: the reachable nodes)."""
    return _register(check, per_node=False)


def _kib(value: str) -> int | None:
    """A `ulimit -l` value in KiB; -1 for unlimited."""
    value = value.strip()
    if value in ("unlimited", "infinity"):
        return -1
    return int(value) if value.isdigit() else None


def _plan_memlock(rank: RankPlan) -> int | None:
    """The plan's memlock soft limit in KiB (-1 unlimited)."""
    soft = rank.run.ulimits.memlock.split(":", 1)[0].strip()
    if soft in ("-1", "unlimited"):
        return -1
    return int(soft) // 1024 if soft.isdigit() else None


def _fmt_kib(v: int) -> str:
    return "unlimited" if v < 0 else f"{v} KiB"


def _addresses(f: Facts) -> dict[str, tuple[int | None, list[str]]]:
    """netdev -> (mtu, IPv4 addresses) from `ip -j addr`."""
    text = "\n".join(f.get("ip"))
    try:
        data = json.loads(text) if text.strip() else []
    except ValueError:
        return {}
    out: dict[str, tuple[int | None, list[str]]] = {}
    for link in data if isinstance(data, list) else []:
        if not isinstance(link, dict) or not isinstance(link.get("ifname"), str):
            continue
        mtu = link.get("mtu")
        addrs = [
            a["local"]
            for a in link.get("addr_info", [])
            if isinstance(a, dict) and a.get("family") == "inet" and isinstance(a.get("local"), str)
        ]
        out[link["ifname"]] = (mtu if isinstance(mtu, int) else None, addrs)
    return out


def _hca(f: Facts, hca: str) -> dict[str, str]:
    info: dict[str, str] = {}
    for line in f.get(f"hca {hca}"):
        key, _, value = line.partition(" ")
        if key == "netdev":
            info.setdefault("netdev", value.strip())
        else:
            info[key] = value.strip()
    return info


def mapped_gid(ip: str) -> str:
    """The sysfs form of the RoCE v2 IPv4-mapped GID of ``ip``: ::ffff:a.b.c.d."""
    a, b, c, d = (int(x) for x in ip.split("."))
    return f"0000:0000:0000:0000:0000:ffff:{a:02x}{b:02x}:{c:02x}{d:02x}"


def _gids(f: Facts, hca: str) -> dict[int, tuple[str, str]]:
    """index -> (gid, type) of the non-zero GIDs of the HCA's port 1."""
    types: dict[int, str] = {}
    for line in f.get(f"gidtypes {hca}"):
        path, _, value = line.partition(":")
        idx = path.rsplit("/", 1)[-1]
        if idx.isdigit():
            types[int(idx)] = value.strip()
    out: dict[int, tuple[str, str]] = {}
    for line in f.get(f"gids {hca}"):
        path, _, value = line.partition(":")
        idx = path.rsplit("/", 1)[-1]
        if idx.isdigit():
            out[int(idx)] = (value.strip().lower(), types.get(int(idx), ""))
    return out


def gid_index_of(f: Facts, hca: str, ips: Sequence[str]) -> int | None:
    """The index of the RoCE v2 GID mapping one of ``ips`` (the first found, lowest index)."""
    want = {mapped_gid(ip) for ip in ips}
    for idx, (gid, kind) in sorted(_gids(f, hca).items()):
        if gid in want and kind.lower().replace("_", " ") == "roce v2":
            return idx
    return None


def _counters(f: Facts, which: str) -> tuple[float | None, dict[tuple[str, str], int]]:
    name = next((k for k in f.sections if k.startswith(f"counters {which} ")), None)
    if name is None:
        return None, {}
    try:
        t: float | None = float(name.split()[2])
    except (IndexError, ValueError):
        t = None
    values: dict[tuple[str, str], int] = {}
    for line in f.get(name):
        parts = line.split()
        if len(parts) == 3 and parts[2].isdigit():
            values[(parts[0], parts[1])] = int(parts[2])
    return t, values


def _known_bad() -> list[dict[str, str]]:
    text = resources.files("tp4.data").joinpath("known-bad-kernels.toml").read_text()
    return [{k: str(v) for k, v in entry.items()} for entry in tomllib.loads(text).get("kernel", [])]


def _df(f: Facts) -> dict[str, tuple[str, float]]:
    """asked path -> (mount point, free GiB). Each path is two lines, `path <asked path>` and
    `free <KiB available> <mount point>` (df --output=avail,target): a path or a mount point
    with spaces stays whole (the fields are never split on blanks)."""
    out: dict[str, tuple[str, float]] = {}
    asked: str | None = None
    for line in f.get("df"):
        if line.startswith("path "):
            asked = line[5:]
        elif line.startswith("free ") and asked is not None:
            avail, _, target = line[5:].lstrip().partition(" ")
            if avail.isdigit() and target:
                out[asked] = (target, int(avail) / (1024 * 1024))
            asked = None
    return out


def _store_free(f: Facts) -> tuple[str, float] | None:
    store = (f.get("store") or [""])[0].strip()
    if not store:
        return None
    return _df(f).get(store)


def _no_such_image(lines: list[str]) -> bool:
    """The runtime answered, and has no such image (docker: "No such image", podman: "image not known")."""
    text = " ".join(lines).lower()
    return "no such image" in text or "not known" in text or "no such object" in text


def _rc(lines: list[str]) -> tuple[int | None, list[str]]:
    if lines and lines[-1].startswith("rc "):
        tail = lines[-1][3:].strip()
        return (int(tail) if tail.lstrip("-").isdigit() else None), lines[:-1]
    return None, lines


def evaluate(plan: Plan, facts: dict[str, Facts], limits: Limits | None = None) -> list[Result]:
    """Every check of every node from the gathered facts (no remote command): the checks of CHECKS
    in their order (RUNS), a node check on every reachable node, a line check once."""
    ranks = [r for r in plan.nodes if r.name in facts]
    ctx = Context(plan, facts, limits or Limits(), ranks=ranks, up=[r for r in ranks if facts[r.name].error is None])
    for spec in CHECKS:
        check = RUNS[spec.id]
        if check.per_node:
            for r in ctx.up:
                check.run(ctx, r, facts[r.name])
        else:
            check.run(ctx)
    order = {c.id: i for i, c in enumerate(CHECKS)}
    names = [r.name for r in plan.nodes]
    ctx.results.sort(key=lambda x: (order[x.check], names.index(x.node) if x.node in names else 99))
    return ctx.results


@line_check("SSH.REACHABLE")
def _ssh_reachable(ctx: Context) -> None:
    """Every node answers; a node that does not gets every other check as not checked."""
    for r in ctx.ranks:
        f = ctx.facts[r.name]
        if f.error is not None:
            fix = (
                "compare the key's fingerprint with the node's own (ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub on "
                "its console), then trust it as the detail says"
                if "host key" in f.error or "trusts" in f.error
                else f"check that {r.ssh.user}@{r.ssh.host}:{r.ssh.port} answers (the node is up, sshd runs) and takes "
                + (
                    f"the key {r.ssh.identity}"
                    if r.ssh.identity
                    else "a key ssh offers by default (~/.ssh/id_*, the agent)"
                )
            )
            ctx.add("SSH.REACHABLE", r.name, "fail", f.error, fix)
            for spec in CHECKS[1:]:
                ctx.add(spec.id, r.name, "n/a", "not checked: the node is unreachable")
        else:
            ctx.add("SSH.REACHABLE", r.name, "ok", f"{r.ssh.user}@{r.ssh.host} answered in {f.seconds:.2f} s")


@node_check("RUNTIME.USABLE")
def _runtime_usable(ctx: Context, r: RankPlan, f: Facts) -> None:
    n, add, rt, user = r.name, ctx.add, r.service.runtime, r.ssh.user
    if (f.get("runtime") or [""])[0] != "present":
        add(
            "RUNTIME.USABLE",
            n,
            "fail",
            f"{rt} is not installed (not on the PATH of {user})",
            f"install {rt} on {n} (the plan's runtime: cluster node `runtime`)",
        )
    else:
        rc, out = _rc(f.get("image"))
        gpu = [x for x in f.get("gpu_access") if x.strip()]
        gpu_ok = bool(gpu) and ("nvidia" in " ".join(gpu) if rt == "docker" else True)
        if rc != 0 and not _no_such_image(out):
            why = (out or ["no output"])[-1]
            add(
                "RUNTIME.USABLE",
                n,
                "fail",
                f"`{rt} image inspect` fails for {user}: {why}",
                f"let {user} use {rt} without sudo (docker: usermod -aG docker {user}, then log in again)",
            )
        elif not gpu_ok:
            add(
                "RUNTIME.USABLE",
                n,
                "fail",
                f"{rt} has no GPU access: "
                + (
                    "no CDI spec for nvidia.com/gpu in /etc/cdi or /var/run/cdi"
                    if rt == "podman"
                    else "no nvidia runtime in `docker info`"
                ),
                "install nvidia-container-toolkit and generate the CDI spec: nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml"
                + (
                    " (docker: nvidia-ctk runtime configure --runtime=docker, restart docker)" if rt == "docker" else ""
                ),
            )
        else:
            add("RUNTIME.USABLE", n, "ok", f"{rt} works for {user}; GPU access: {gpu[0].strip()[:80]}")


NO_NVIDIA_SMI = ("nvidia-smi is not on the PATH", "install the NVIDIA driver 580.x with nvidia-smi (DGX OS ships it)")


def _has_nvidia_smi(f: Facts) -> bool:
    return (f.get("nvidia") or [""])[0] == "present"


def _gpus(f: Facts) -> list[str] | None:
    """The GPUs nvidia-smi lists (name, driver), None when it lists none or fails."""
    gpus = [x.strip() for x in f.get("gpus") if x.strip()]
    return None if not gpus or any("fail" in g.lower() or "error" in g.lower() for g in gpus) else gpus


@node_check("GPU.PRESENT")
def _gpu_present(ctx: Context, r: RankPlan, f: Facts) -> None:
    if not _has_nvidia_smi(f):
        ctx.add("GPU.PRESENT", r.name, "fail", *NO_NVIDIA_SMI)
    elif (gpus := _gpus(f)) is None:
        listed = [x.strip() for x in f.get("gpus") if x.strip()]
        ctx.add(
            "GPU.PRESENT",
            r.name,
            "fail",
            f"nvidia-smi lists no GPU: {(listed or ['no output'])[0]}",
            "check the driver (nvidia-smi must list the GB10); reboot after a driver update",
        )
    else:
        name, _, _ = gpus[0].rpartition(",")
        ctx.add("GPU.PRESENT", r.name, "ok", f"{len(gpus)} GPU: {name.strip()}")


@node_check("GPU.NO_FOREIGN_APPS")
def _gpu_no_foreign_apps(ctx: Context, r: RankPlan, f: Facts) -> None:
    n = r.name
    if not _has_nvidia_smi(f):
        ctx.add("GPU.NO_FOREIGN_APPS", n, "fail", *NO_NVIDIA_SMI)
        return
    apps = [x.strip() for x in f.get("gpu_apps") if x.strip() and not x.lower().startswith("no running")]
    if apps:
        ctx.add(
            "GPU.NO_FOREIGN_APPS",
            n,
            "fail",
            f"{len(apps)} compute app(s) on the GPU: {'; '.join(apps[:3])}",
            "stop the other stack (its PIDs are listed) or `tp4 stop` a line left running; wait until "
            "`nvidia-smi --query-compute-apps=pid --format=csv` lists nothing",
        )
    else:
        ctx.add("GPU.NO_FOREIGN_APPS", n, "ok", "no compute apps")


@node_check("GPU.DRIVER")
def _gpu_driver(ctx: Context, r: RankPlan, f: Facts) -> None:
    n = r.name
    if not _has_nvidia_smi(f):
        ctx.add("GPU.DRIVER", n, "warn", *NO_NVIDIA_SMI)
    elif (gpus := _gpus(f)) is None:
        ctx.add("GPU.DRIVER", n, "warn", "no driver version", "install the NVIDIA driver 580.x")
    else:
        driver = gpus[0].rpartition(",")[2].strip()
        if driver.startswith("580."):
            ctx.add("GPU.DRIVER", n, "ok", f"driver {driver}")
        else:
            ctx.add(
                "GPU.DRIVER",
                n,
                "warn",
                f"driver {driver}: the display reservation is qualified on 580.x only (reported not to work on 595.84)",
                "use driver 580.x, or leave DSV41_ENGRAM_DRM_NODE unset",
            )


def _present(r: RankPlan, f: Facts) -> list[str]:
    """The plan's HCAs the node lists."""
    listed = set(f.get("ibdevs"))
    return [h for h in r.gid.hcas if h in listed]


def _fabric_ipv4(r: RankPlan, f: Facts) -> tuple[dict[str, int | None], list[str], list[str]]:
    """Of the plan's HCAs on the node: the MTU of each HCA/netdev, those without an IPv4 address,
    those without a netdev."""
    addrs = _addresses(f)
    noip: list[str] = []
    mtus: dict[str, int | None] = {}
    nodev: list[str] = []
    for h in _present(r, f):
        dev = _hca(f, h).get("netdev")
        if not dev or dev not in addrs:
            nodev.append(f"{h} has no netdev" + (f" ({dev} not in `ip addr`)" if dev else ""))
            continue
        mtu, ips = addrs[dev]
        mtus[f"{h}/{dev}"] = mtu
        if not ips:
            noip.append(f"{h} ({dev}) has no IPv4 address")
    return mtus, noip, nodev


@node_check("RDMA.DEVICES")
def _rdma_devices(ctx: Context, r: RankPlan, f: Facts) -> None:
    n, add = r.name, ctx.add
    devinf = f.get("devinf")
    listed = set(f.get("ibdevs"))
    missing = [h for h in r.gid.hcas if h not in listed]
    if not devinf or devinf[0] != "present":
        add(
            "RDMA.DEVICES",
            n,
            "fail",
            "/dev/infiniband does not exist",
            "load the RDMA modules and rdma-core (modprobe mlx5_ib ib_uverbs); the container gets --device /dev/infiniband",
        )
    elif missing:
        add(
            "RDMA.DEVICES",
            n,
            "fail",
            f"no RDMA device {', '.join(missing)} under {ctx.limits.sysfs}/class/infiniband "
            f"(there: {', '.join(sorted(listed)) or 'none'})",
            "fix fabric.hcas to the node's devices (names are case-sensitive; see `ibdev2netdev`), or load mlx5_ib",
        )
    else:
        add("RDMA.DEVICES", n, "ok", f"/dev/infiniband, {', '.join(r.gid.hcas)}")


@node_check("RDMA.PORT_ACTIVE")
def _rdma_port_active(ctx: Context, r: RankPlan, f: Facts) -> None:
    n, add, present = r.name, ctx.add, _present(r, f)
    down = [
        f"{h} port 1 is {_hca(f, h).get('state') or 'unreadable'}"
        for h in present
        if "ACTIVE" not in _hca(f, h).get("state", "")
    ]
    if not present:
        add("RDMA.PORT_ACTIVE", n, "fail", "no HCA of the plan to check", "see RDMA.DEVICES")
    elif down:
        add(
            "RDMA.PORT_ACTIVE",
            n,
            "fail",
            "; ".join(down),
            "cable the port and bring its netdev up (ip link set <netdev> up); check the switch port",
        )
    else:
        add("RDMA.PORT_ACTIVE", n, "ok", ", ".join(f"{h} {_hca(f, h).get('state')}" for h in present))


@node_check("RDMA.LINK_LAYER")
def _rdma_link_layer(ctx: Context, r: RankPlan, f: Facts) -> None:
    n, add, present = r.name, ctx.add, _present(r, f)
    wrong = [
        f"{h} is {_hca(f, h).get('link_layer') or 'unreadable'}"
        for h in present
        if _hca(f, h).get("link_layer") != "Ethernet"
    ]
    if not present:
        add("RDMA.LINK_LAYER", n, "fail", "no HCA of the plan to check", "see RDMA.DEVICES")
    elif wrong:
        add(
            "RDMA.LINK_LAYER",
            n,
            "fail",
            "; ".join(wrong) + " (RoCE needs Ethernet)",
            "set the ConnectX port to Ethernet: mlxconfig -d <pci> set LINK_TYPE_P1=2 (then reboot)",
        )
    else:
        add("RDMA.LINK_LAYER", n, "ok", "Ethernet")


@node_check("RDMA.IPV4")
def _rdma_ipv4(ctx: Context, r: RankPlan, f: Facts) -> None:
    n, add, present, addrs = r.name, ctx.add, _present(r, f), _addresses(f)
    _, noip, nodev = _fabric_ipv4(r, f)
    if nodev or noip or not present:
        add(
            "RDMA.IPV4",
            n,
            "fail",
            "; ".join(nodev + noip) or "no HCA of the plan to check",
            "give every fabric netdev its IPv4 address (RoCE v2 derives its GIDs from it), netplan or NetworkManager",
        )
    else:
        add("RDMA.IPV4", n, "ok", ", ".join(f"{h}: {','.join(addrs[_hca(f, h)['netdev']][1])}" for h in present))


@node_check("RDMA.ONE_IPV4")
def _rdma_one_ipv4(ctx: Context, r: RankPlan, f: Facts) -> None:
    n, add, present, addrs = r.name, ctx.add, _present(r, f), _addresses(f)
    _, noip, nodev = _fabric_ipv4(r, f)
    # every IPv4 of a netdev adds RoCE GIDs, so an extra one moves the index NCCL_IB_GID_INDEX names
    extra = {
        dev: addrs[dev][1]
        for dev in dict.fromkeys(_hca(f, h).get("netdev") for h in present)
        if dev in addrs and len(addrs[dev][1]) > 1
    }
    if not present or nodev or noip:
        add("RDMA.ONE_IPV4", n, "n/a", "see RDMA.IPV4")
    elif extra:
        add(
            "RDMA.ONE_IPV4",
            n,
            "warn",
            "; ".join(f"{dev} has {len(ips)} IPv4 addresses ({', '.join(ips)})" for dev, ips in extra.items())
            + ": each adds RoCE GIDs, which can move the index of the fabric address's GID",
            "keep only the fabric address on each fabric netdev (ip addr del <other>/<prefix> dev <netdev>; "
            "persist it in netplan or NetworkManager)",
        )
    else:
        add("RDMA.ONE_IPV4", n, "ok", "one IPv4 address per fabric netdev")


@node_check("RDMA.MTU")
def _rdma_mtu(ctx: Context, r: RankPlan, f: Facts) -> None:
    n, add = r.name, ctx.add
    mtus = _fabric_ipv4(r, f)[0]
    small = {k: v for k, v in mtus.items() if v != FABRIC_MTU}
    if not mtus:
        add("RDMA.MTU", n, "warn", "no fabric netdev to read", "see RDMA.IPV4")
    elif small:
        add(
            "RDMA.MTU",
            n,
            "fail",
            ", ".join(f"{k} has MTU {v}" for k, v in small.items())
            + f" (not {FABRIC_MTU}: RoCE runs at a smaller MTU, prefill ~40 % slower at 1024)",
            f"ip link set <netdev> mtu {FABRIC_MTU} (persist it in netplan/NetworkManager; the switch ports too)",
        )
    else:
        add("RDMA.MTU", n, "ok", f"MTU {FABRIC_MTU}")


@node_check("RDMA.GID")
def _rdma_gid(ctx: Context, r: RankPlan, f: Facts) -> None:
    """Also records the GID index found per HCA (f.derived), which RDMA.GID_SAME_INDEX compares."""
    n, add, present, addrs = r.name, ctx.add, _present(r, f), _addresses(f)
    fabric_ips = [r.host]
    found: dict[str, int | None] = {}
    for h in present:
        dev = _hca(f, h).get("netdev")
        ips = addrs.get(dev or "", (None, []))[1]
        found[h] = gid_index_of(
            f, h, [ip for ip in ips if ip in fabric_ips] + [ip for ip in ips if ip not in fabric_ips]
        )
    f.derived["gid_index"] = {h: i for h, i in found.items()}
    bad = [h for h, i in found.items() if i is None]
    if not present:
        add("RDMA.GID", n, "fail", "no HCA of the plan to check", "see RDMA.DEVICES")
    elif bad:
        add(
            "RDMA.GID",
            n,
            "fail",
            ", ".join(
                f"{h}: no RoCE v2 GID ::ffff:<its IPv4> in {ctx.limits.sysfs}/class/infiniband/{h}/ports/1/gids"
                for h in bad
            ),
            "address the port's netdev (the GID table follows the IPv4 address), then check `show_gids`",
        )
    else:
        add("RDMA.GID", n, "ok", ", ".join(f"{h} index {i}" for h, i in found.items()))


@node_check("RDMA.MEMLOCK")
def _rdma_memlock(ctx: Context, r: RankPlan, f: Facts) -> None:
    n, add, rt, user = r.name, ctx.add, r.service.runtime, r.ssh.user
    soft_hard = f.get("memlock")
    session_soft = _kib(soft_hard[0]) if soft_hard else None
    session_hard = _kib(soft_hard[1]) if len(soft_hard) > 1 else None
    cap = next((x.split()[1] for x in f.get("user") if x.startswith("CapEff:")), "0")
    can_raise = (f.get("user") or [""])[0].strip() == "0" and int(cap, 16) & (
        1 << 24
    ) != 0  # root with CAP_SYS_RESOURCE
    want = _plan_memlock(r)
    where, limit = f"the hard limit of {user}'s sessions ({rt} runs as {user})", session_hard
    if f.has("memlock_runtime"):
        parts = (f.get("memlock_runtime") or [""])[0].split()
        limit, where, can_raise = (
            (_kib(parts[3]) if len(parts) > 3 and parts[3].isdigit() else -1 if len(parts) > 3 else None),
            "dockerd's limit",
            True,
        )
        if limit is not None and limit > 0:
            limit //= 1024  # /proc limits are bytes
    if f.has("memlock_unit"):
        v = (f.get("memlock_unit") or [""])[0].strip()
        limit, where, can_raise = (
            (-1 if v == "infinity" else int(v) // 1024 if v.isdigit() else None),
            f"LimitMEMLOCK of {r.service.unit}",
            False,
        )
    if want is None or limit is None:
        add("RDMA.MEMLOCK", n, "fail", f"memlock unreadable ({where}: {soft_hard})", "check `ulimit -l` of the runtime")
    elif not can_raise and limit >= 0 and (want < 0 or want > limit):
        fix = (
            f"LimitMEMLOCK=infinity for {r.service.unit}"
            if f.has("memlock_unit")
            else f"raise the memlock hard limit for {user} to unlimited (/etc/security/limits.d: `{user} - memlock unlimited`; "
            "a systemd service: LimitMEMLOCK=infinity), then log in again"
        )
        add(
            "RDMA.MEMLOCK",
            n,
            "fail",
            f"the plan asks memlock {_fmt_kib(want)}; {where} is {_fmt_kib(limit)}: the container cannot get it, "
            "ibv_reg_mr of the KV pool fails",
            fix,
        )
    elif want >= 0:
        add(
            "RDMA.MEMLOCK",
            n,
            "warn",
            f"the plan limits memlock to {_fmt_kib(want)} (cluster.memlock), not unlimited "
            f"({where}: {_fmt_kib(limit)}); RDMA registers the KV pool",
            'set cluster.memlock = "-1:-1" where the hosts allow it',
        )
    else:
        add(
            "RDMA.MEMLOCK",
            n,
            "ok",
            f"unlimited ({where}: {_fmt_kib(limit)}{', raised by the runtime' if can_raise else ''}"
            f"; session soft {_fmt_kib(session_soft) if session_soft is not None else '?'})",
        )


@node_check("RDMA.COUNTERS")
def _rdma_counters(ctx: Context, r: RankPlan, f: Facts) -> None:
    n, add = r.name, ctx.add
    t1, c1 = _counters(f, "1")
    t2, c2 = _counters(f, "2")
    rising = {k: c2[k] - c1[k] for k in c1 if k in c2 and c2[k] > c1[k]}
    if ctx.limits.interval <= 0:
        add("RDMA.COUNTERS", n, "n/a", "not watched (no interval between the two reads)")
    elif not c1:
        add(
            "RDMA.COUNTERS",
            n,
            "warn",
            f"no RoCE counters ({', '.join(COUNTERS)}) under hw_counters or counters",
            "load mlx5_ib (its hw_counters) to watch RoCE packet loss",
        )
    elif rising:
        dt = f"{t2 - t1:.1f} s" if t1 is not None and t2 is not None else "the interval"
        add(
            "RDMA.COUNTERS",
            n,
            "warn",
            "rising in " + dt + ": " + ", ".join(f"{h} {c} +{d}" for (h, c), d in sorted(rising.items())),
            "RoCE is losing packets: enable PFC/ECN (lossless) on the switch and the NICs, check cables and the MTU of every hop",
        )
    else:
        add("RDMA.COUNTERS", n, "ok", f"{len(c1)} counters steady")


@node_check("KERNEL.KNOWN_BAD")
def _kernel_known_bad(ctx: Context, r: RankPlan, f: Facts) -> None:
    n, add = r.name, ctx.add
    release = (f.get("uname") or [""])[0].strip()
    bad_k = next((k for k in _known_bad() if k.get("release") == release), None)
    if bad_k:
        add("KERNEL.KNOWN_BAD", n, "fail", f"kernel {release}: {bad_k['what']} ({bad_k['source']})", bad_k["fix"])
    else:
        add("KERNEL.KNOWN_BAD", n, "ok", f"kernel {release}")


@node_check("DISK.FREE")
def _disk_free(ctx: Context, r: RankPlan, f: Facts) -> None:
    n, add, rt = r.name, ctx.add, r.service.runtime
    store = _store_free(f)
    if store is None:
        add("DISK.FREE", n, "warn", "the image store's free space is unknown", f"check `{rt} info` on {n}")
    elif store[1] < ctx.limits.image_free_gib:
        add(
            "DISK.FREE",
            n,
            "warn",
            f"{store[1]:.1f} GiB free on {store[0]} (the image store), less than {ctx.limits.image_free_gib:g} GiB "
            "for the next image",
            f"{rt} image prune, or tp4 images --prune",
        )
    else:
        add("DISK.FREE", n, "ok", f"{store[1]:.1f} GiB free on {store[0]}")


@node_check("PORTS.FREE")
def _ports_free(ctx: Context, r: RankPlan, f: Facts) -> None:
    """The head's API, dist init and image store ports."""
    n, add = r.name, ctx.add
    if r.rank == 0:
        ports = {int(m) for m in re.findall(r":(\d+)\s", "\n".join(f.get("listening")) + "\n")}
        wanted = [
            ("API", int(ctx.plan.line.api.rsplit(":", 1)[1])),
            ("dist init", int(ctx.plan.line.dist_init_addr.rsplit(":", 1)[1])),
        ]
        if ctx.limits.registry_port is not None:
            wanted.append(("image store", ctx.limits.registry_port))
        used = [(what, port) for what, port in wanted if port in ports]
        if used:
            fixes = []
            if any(w != "image store" for w, _ in used):
                fixes.append(
                    "stop what listens there (ss -ltnp), or `tp4 stop` a line left running, or change cluster.port / "
                    "cluster.dist_port"
                )
            if any(w == "image store" for w, _ in used):
                fixes.append(
                    "the image store starts on its last port again: stop what took it, or start the store once "
                    "on another (`tp4 image-store start --port N`)"
                )
            add("PORTS.FREE", n, "fail", ", ".join(f"the {w} port {p} is in use" for w, p in used), "; ".join(fixes))
        else:
            add("PORTS.FREE", n, "ok", ", ".join(w for w, _ in wanted[:-1]) + f" and {wanted[-1][0]} ports free")
    else:
        add("PORTS.FREE", n, "n/a", "the head's ports only")


@node_check("MEMORY.FREE")
def _memory_free(ctx: Context, r: RankPlan, f: Facts) -> None:
    n, add = r.name, ctx.add
    mem = {
        x.split(":")[0]: int(x.split()[1]) for x in f.get("meminfo") if len(x.split()) >= 2 and x.split()[1].isdigit()
    }
    avail = mem.get("MemAvailable")
    if avail is None:
        add("MEMORY.FREE", n, "warn", "MemAvailable unreadable", "check /proc/meminfo")
    elif avail / (1024 * 1024) < ctx.limits.memory_gib:
        add(
            "MEMORY.FREE",
            n,
            "warn",
            f"{avail / 1048576:.1f} GiB available, less than {ctx.limits.memory_gib:g} GiB",
            "stop what uses the memory (another stack, a desktop session: systemctl set-default multi-user.target)",
        )
    else:
        add("MEMORY.FREE", n, "ok", f"{avail / 1048576:.1f} GiB available")


@node_check("RING.NCCL")
def _ring_nccl(ctx: Context, r: RankPlan, f: Facts) -> None:
    n, add = r.name, ctx.add
    if ctx.plan.line.fabric != "ring":
        add("RING.NCCL", n, "n/a", "switched fabric")
    else:
        nccl = f.get("nccl")
        mesh = (f.get("mesh") or [""])[0].strip()
        if not nccl or nccl[0] != "present":
            add(
                "RING.NCCL",
                n,
                "fail",
                "the patched NCCL library is missing (fabric.nccl.host_dir/libnccl.so.2)",
                "build NCCL 2.30.7 with the switchless patch into fabric.nccl.host_dir on every node",
            )
        elif len(nccl) < 2 or not nccl[1].strip().isdigit() or int(nccl[1]) == 0:
            add(
                "RING.NCCL",
                n,
                "fail",
                "the NCCL library lacks SWITCHLESS_RING_ONLY (stock NCCL)",
                "rebuild it with the switchless-ring patch",
            )
        elif mesh != "active":
            unit = r.service.mesh_unit
            add(
                "RING.NCCL",
                n,
                "fail",
                f"{unit} is {mesh or 'unknown'}",
                f"systemctl start {unit} (the ring mesh) and check its log",
            )
        else:
            add("RING.NCCL", n, "ok", f"patched NCCL, {r.service.mesh_unit} active")


def _weights(f: Facts) -> tuple[str, int, bool]:
    """What the node said of its checkpoint: the directory, its shards, whether config.json is there."""
    lines = f.get("weights")
    d = next((x[4:] for x in lines if x.startswith("dir ")), "")
    shards = next((int(x.split()[1]) for x in lines if x.startswith("shards ") and x.split()[1].isdigit()), 0)
    return d, shards, "config" in lines


@node_check("WEIGHTS.HEAD")
def _weights_head(ctx: Context, r: RankPlan, f: Facts) -> None:
    n = r.name
    d, shards, config = _weights(f)
    expected = ctx.limits.expected_shards
    if r.rank == 0:
        if not d:
            ctx.add("WEIGHTS.HEAD", n, "fail", "the plan mounts no checkpoint directory on the head", "set model.dir")
        elif not config or shards < expected:
            ctx.add(
                "WEIGHTS.HEAD",
                n,
                "fail",
                f"{d}: " + ("no config.json, " if not config else "") + f"{shards} of {expected} shards",
                "tp4 download (the pinned checkpoint), or point model.dir at it",
            )
        else:
            ctx.add("WEIGHTS.HEAD", n, "ok", f"{d}: config.json, {shards} shards")
        return
    ctx.add("WEIGHTS.HEAD", n, "n/a", "workers read the volume")


@node_check("WEIGHTS.WORKER")
def _weights_worker(ctx: Context, r: RankPlan, f: Facts) -> None:
    n = r.name
    if r.rank == 0:
        ctx.add("WEIGHTS.WORKER", n, "n/a", "the head reads model.dir")
        return
    d, shards, config = _weights(f)
    rc, vol = _rc(f.get("volume"))
    volume = next((m.source for m in r.run.mounts if m.type == "volume"), None)
    if volume is None:
        d2 = next((m.source for m in r.run.mounts if m.target.startswith("/models")), "?")
        ctx.add(
            "WEIGHTS.WORKER",
            n,
            "ok" if config else "fail",
            f"{d2}: " + ("config.json" if config else "no config.json"),
            None if config else "copy the checkpoint to the node, or tp4 share",
        )
        return
    if rc != 0 or not vol:
        ctx.add(
            "WEIGHTS.WORKER",
            n,
            "fail",
            f"the volume {volume} does not exist: {' '.join(vol)[:120]}",
            "tp4 share (it creates the workers' weights volume)",
        )
        return
    parts = vol[0].split(" ", 2)
    opts = parts[2] if len(parts) > 2 else ""
    kind = "nfs" if '"type":"nfs' in opts.replace(" ", "") else "local"
    want = ctx.limits.volume_kind or kind
    if kind != want:
        ctx.add(
            "WEIGHTS.WORKER",
            n,
            "fail",
            f"the volume {volume} is {kind}, the profile says {want} (nfs.share)",
            "tp4 share (re-creates the volume as the profile says), or set nfs.share",
        )
    elif not config and kind == "nfs":
        ctx.add(
            "WEIGHTS.WORKER",
            n,
            "warn",
            f"the NFS volume {volume} ({opts[:120]}) is not mounted now: not verified",
            "tp4 share checks that every worker sees the checkpoint",
        )
    elif not config:
        ctx.add(
            "WEIGHTS.WORKER",
            n,
            "fail",
            f"the volume {volume} ({d}) holds no config.json",
            "tp4 share, or fill the volume",
        )
    else:
        ctx.add("WEIGHTS.WORKER", n, "ok", f"{kind} volume {volume}: config.json, {shards} shards")


@node_check("ENGRAM.SHARDS")
def _engram(ctx: Context, r: RankPlan, f: Facts) -> None:
    n = r.name
    problems, good = [], []
    for line in f.get("engram"):
        parts = line.split()
        if len(parts) < 2:
            continue
        name = parts[0]
        if parts[1] == "absent":
            problems.append(f"{name} missing")
            continue
        header = [int(x) for x in parts[2:8] if x.isdigit()]
        size = int(parts[1]) if parts[1].isdigit() else 0
        if len(header) < 6:
            problems.append(f"{name} has no header ({size} bytes)")
            continue
        need = 48 + header[4] * header[5]
        if size < need:
            problems.append(f"{name} is incomplete ({size} of {need} bytes)")
        else:
            good.append(name)
    if not problems:
        ctx.add("ENGRAM.SHARDS", n, "ok", ", ".join(good))
        return
    engram = _mount(r, "/engram")
    free = _df(f).get(engram[1]) if engram else None
    if free is not None and free[1] >= ctx.limits.engram_free_gib:
        ctx.add(
            "ENGRAM.SHARDS",
            n,
            "warn",
            "; ".join(problems) + f"; {free[1]:.0f} GiB free on {free[0]} to pack them",
            "tp4 pack",
        )
    else:
        have = f"{free[1]:.1f} GiB free on {free[0]}" if free else "free space unknown"
        ctx.add(
            "ENGRAM.SHARDS",
            n,
            "fail",
            "; ".join(problems) + f"; {have}, less than {ctx.limits.engram_free_gib:g} GiB to pack them",
            "free disk on the engram dir's filesystem, then tp4 pack",
        )


@line_check("RDMA.MTU_SAME")
def _mtu_same(ctx: Context) -> None:
    facts, add, up = ctx.facts, ctx.add, ctx.up
    per_node: dict[str, set[int]] = {}
    for r in up:
        addrs = _addresses(facts[r.name])
        per_node[r.name] = {
            m
            for h in r.gid.hcas
            if (dev := _hca(facts[r.name], h).get("netdev")) in addrs
            for m in [addrs[dev or ""][0]]
            if m is not None
        }
    counts: dict[int, int] = {}
    for mtus in per_node.values():
        for m in mtus:
            counts[m] = counts.get(m, 0) + 1
    common = max(counts, key=lambda m: (counts[m], m)) if counts else None
    for r in up:
        mtus = per_node[r.name]
        if common is None or not mtus:
            add("RDMA.MTU_SAME", r.name, "fail", "no fabric MTU to compare", "see RDMA.IPV4")
        elif mtus != {common}:
            add(
                "RDMA.MTU_SAME",
                r.name,
                "fail",
                f"MTU {', '.join(map(str, sorted(mtus)))} where the other nodes have {common}",
                f"set the same MTU ({FABRIC_MTU}) on every fabric netdev of every node",
            )
        else:
            add("RDMA.MTU_SAME", r.name, "ok", f"MTU {common} like the others")


@line_check("RDMA.GID_SAME_INDEX")
def _gid_same_index(ctx: Context) -> None:
    """Reads the GID index RDMA.GID recorded per node (f.derived); CHECKS runs RDMA.GID first."""
    facts, add, up = ctx.facts, ctx.add, ctx.up
    indices: dict[str, set[int]] = {}
    for r in up:
        got = facts[r.name].derived.get("gid_index")
        indices[r.name] = {i for i in got.values() if isinstance(i, int)} if isinstance(got, dict) else set()
    votes: dict[int, int] = {}
    for s in indices.values():
        for i in s:
            votes[i] = votes.get(i, 0) + 1
    common_gid = max(votes, key=lambda i: (votes[i], -i)) if votes else None
    for r in up:
        s = indices[r.name]
        pinned = r.gid.pinned_by
        if not s:
            add("RDMA.GID_SAME_INDEX", r.name, "fail", "no RoCE v2 GID found", "see RDMA.GID")
        elif pinned is not None and s != {r.gid.value}:
            add(
                "RDMA.GID_SAME_INDEX",
                r.name,
                "fail",
                f"{pinned} pins index {r.gid.value}, the GID is at {', '.join(map(str, sorted(s)))}",
                f"remove {pinned} (serve looks the index up), or set it to {min(s)}",
            )
        elif len(s) > 1 or s != {common_gid}:
            # upstream's launcher resolves NCCL_IB_GID_INDEX per node (each rank its own), and so
            # does serve for an unpinned node: a line with different indices starts. A plan that
            # pins one index on every node fails above, on the node whose GID is elsewhere
            add(
                "RDMA.GID_SAME_INDEX",
                r.name,
                "warn",
                f"index {', '.join(map(str, sorted(s)))} where the other nodes have {common_gid}",
                f"serve gives this rank its own NCCL_IB_GID_INDEX ({', '.join(map(str, sorted(s)))}), as upstream's "
                "launcher does; to keep one index, readdress the node (extra addresses of the fabric netdev, an IPv6 "
                "address, move the GID)",
            )
        else:
            add("RDMA.GID_SAME_INDEX", r.name, "ok", f"index {common_gid} on every node")


@line_check("IMAGE.SAME")
def _image_same(ctx: Context) -> None:
    facts, add, up = ctx.facts, ctx.add, ctx.up
    images: dict[str, tuple[str, str]] = {}
    for r in up:
        f = facts[r.name]
        if (f.get("runtime") or [""])[0] != "present":
            continue
        rc, out = _rc(f.get("image"))
        if rc == 0 and out:
            iid, _, layers = out[0].partition(" ")
            images[r.name] = (iid.removeprefix("sha256:"), layers.strip())
    head = ctx.plan.nodes[0].name
    ref = images.get(head) or (next(iter(images.values())) if images else None)
    for r in up:
        img = images.get(r.name)
        if img is None:
            add(
                "IMAGE.SAME",
                r.name,
                "fail",
                f"no image {r.run.image} in {r.service.runtime}",
                "tp4 build (head), then tp4 distribute",
            )
        elif ref is not None and img != ref:
            what = "id" if img[0] != ref[0] else "layers"
            add(
                "IMAGE.SAME",
                r.name,
                "fail",
                f"{r.run.image} is {img[0][:12]}, the head's is {ref[0][:12]} (the {what} differ)",
                "tp4 distribute (every node runs the head's image)",
            )
        else:
            add("IMAGE.SAME", r.name, "ok", f"{img[0][:12]}, {len(json.loads(img[1] or '[]') or [])} layers")


@line_check("CLOCK.SKEW")
def _clock_skew(ctx: Context) -> None:
    facts, add, up = ctx.facts, ctx.add, ctx.up
    offsets: dict[str, float] = {}
    for r in up:
        f = facts[r.name]
        try:
            offsets[r.name] = float((f.get("date") or [""])[0]) - f.received
        except ValueError:
            pass
    if offsets:
        median = sorted(offsets.values())[len(offsets) // 2]
        for r in up:
            if r.name not in offsets:
                add("CLOCK.SKEW", r.name, "warn", "the clock is unreadable", "check `date` on the node")
                continue
            skew = offsets[r.name] - median
            if abs(skew) > ctx.limits.clock_skew:
                add(
                    "CLOCK.SKEW",
                    r.name,
                    "warn",
                    f"the clock is {skew:+.1f} s off the others",
                    "enable NTP (timedatectl set-ntp true; chrony)",
                )
            else:
                add("CLOCK.SKEW", r.name, "ok", f"{skew:+.2f} s")


# --- the host state the NixOS module sets (display reservation, headless boot, SM clock cap), the
# head's shard files, the image's architecture and pin, the deployed NCCL's sha256 ----------------

# `uname -m` against the image config's GOARCH (the OCI image spec's `architecture`)
ARCH = {"aarch64": "arm64", "arm64": "arm64", "x86_64": "amd64", "amd64": "amd64"}
DRM_NODE = "DSV41_ENGRAM_DRM_NODE"  # the plan uses the display reservation when a rank's env sets it
DISPLAY_FIX = (
    "nvidia-drm.modeset=1 nvidia-drm.fbdev=0 last on the kernel command line, then reboot (NixOS: "
    "tp4.host.displayReservation.enable = true appends them), or unset DSV41_ENGRAM_DRM_NODE in the profile"
)
HEADLESS_FIX = (
    "systemctl set-default multi-user.target; systemctl disable --now display-manager.service "
    "(NixOS: tp4.host.displayReservation.enable = true sets both)"
)


def module_param(cmdline: str, module: str, param: str) -> str | None:
    """The value the kernel gives ``module``'s ``param`` from a command line: the last occurrence
    wins, '-' and '_' are one character in module names (modules/lib/kernel.nix, moduleParam)."""
    want = f"{module.replace('-', '_')}.{param}"
    value = None
    for word in cmdline.split():
        key, eq, v = word.partition("=")
        mod, dot, name = key.partition(".")
        if eq and dot and f"{mod.replace('-', '_')}.{name}" == want:
            value = v
    return value


def _flag(value: str | None) -> bool | None:
    """A kernel bool parameter (sysfs prints Y/N; a command line may say 1/0, y/n, true/false)."""
    v = (value or "").strip().lower()
    return True if v in ("y", "1", "true", "on") else False if v in ("n", "0", "false", "off") else None


@node_check("GPU.NVIDIA_DRM")
def _nvidia_drm(ctx: Context, r: RankPlan, f: Facts) -> None:
    n, drm = r.name, r.env.get(DRM_NODE)
    lines = f.get("nvidia_drm")
    if not drm:
        ctx.add("GPU.NVIDIA_DRM", n, "n/a", f"the plan does not use the display reservation ({DRM_NODE} unset)")
        return
    if not lines or lines[0] != "loaded":
        ctx.add(
            "GPU.NVIDIA_DRM",
            n,
            "fail",
            f"nvidia_drm is not loaded ({ctx.limits.sysfs}/module/nvidia_drm is absent): "
            f"{drm} ({DRM_NODE}) does not exist",
            "load nvidia-drm with " + DISPLAY_FIX,
        )
        return
    sysfs = dict(x.split(" ", 1) for x in lines[1:] if " " in x)
    cmdline = " ".join(f.get("cmdline"))
    got: dict[str, tuple[bool | None, str]] = {}
    for p in ("modeset", "fbdev"):
        if p in sysfs and sysfs[p] != "unreadable":
            got[p] = (_flag(sysfs[p]), f"{p}={sysfs[p].strip()}")
        elif (v := module_param(cmdline, "nvidia-drm", p)) is not None:
            got[p] = (_flag(v), f"{p}={v} (/proc/cmdline; the sysfs file is root's only)")
        elif p == "fbdev" and p not in sysfs:
            got[p] = (False, "no fbdev parameter (this driver makes no framebuffer)")
        else:
            got[p] = (None, f"{p} unknown (the sysfs file is root's only and the command line does not set it)")
    wrong = [why for p, (v, why) in got.items() if v is not None and v != (p == "modeset")]
    unknown = [why for v, why in got.values() if v is None]
    detail = ", ".join(why for _, why in got.values())
    if wrong:
        ctx.add(
            "GPU.NVIDIA_DRM",
            n,
            "fail",
            f"nvidia_drm {detail}: the display reservation ({drm}) is not free (it needs modeset=1 fbdev=0)",
            DISPLAY_FIX,
        )
    elif unknown:
        ctx.add(
            "GPU.NVIDIA_DRM",
            n,
            "warn",
            f"nvidia_drm {detail}",
            "run tp4 doctor as root, or set the parameters on the "
            "kernel command line where they can be read: " + DISPLAY_FIX,
        )
    else:
        ctx.add("GPU.NVIDIA_DRM", n, "ok", f"nvidia_drm {detail}")


@node_check("HOST.HEADLESS")
def _headless(ctx: Context, r: RankPlan, f: Facts) -> None:
    n = r.name
    state = dict(x.split(" ", 1) for x in f.get("headless") if " " in x)
    if "default" not in state:
        ctx.add("HOST.HEADLESS", n, "warn", "systemctl is not on the PATH: the boot target is unknown", HEADLESS_FIX)
        return
    problems = []
    if state["default"] != "multi-user.target":
        problems.append(f"boots to {state['default']}")
    dm = state.get("display-manager.service", "")
    if dm in ("active", "activating", "reloading", "deactivating"):
        problems.append(f"display-manager.service is {dm}")
    if problems:
        why = (
            f"a desktop takes the display reservation {r.env[DRM_NODE]} and memory"
            if r.env.get(DRM_NODE)
            else "a desktop takes memory from the engine"
        )
        ctx.add("HOST.HEADLESS", n, "fail", f"{'; '.join(problems)}: {why}", HEADLESS_FIX)
    else:
        ctx.add("HOST.HEADLESS", n, "ok", f"multi-user.target, display-manager.service {dm or 'absent'}")


@node_check("GPU.CLOCK_CAP")
def _clock_cap(ctx: Context, r: RankPlan, f: Facts) -> None:
    n, cap = r.name, ctx.plan.line.gpu_clock_mhz
    fix = (
        f"nvidia-smi -lgc 0,{cap} on a timer (a driver reload or a GPU reset drops it; NixOS: the module's "
        "tp4-gpu-clock.timer applies the plan's cap), or set cluster.gpu_clock_mhz in the profile"
    )
    if cap is None:
        ctx.add("GPU.CLOCK_CAP", n, "n/a", "no cap asked (cluster.gpu_clock_mhz = 0)")
        return
    if (f.get("nvidia") or [""])[0] != "present":
        ctx.add("GPU.CLOCK_CAP", n, "warn", "nvidia-smi is not on the PATH", fix)
        return
    line = (f.get("gpu_clock") or [""])[0]
    parts = [x.strip() for x in line.split(",")]
    if len(parts) < 3 or not parts[0].isdigit() or not parts[1].isdigit():
        ctx.add("GPU.CLOCK_CAP", n, "warn", f"the SM clock is unreadable: {line[:120] or 'no output'}", fix)
        return
    sm, top, reason = int(parts[0]), int(parts[1]), parts[2]
    timer = dict(x.split(" ", 1) for x in f.get("headless") if " " in x).get("tp4-gpu-clock.timer", "")
    if sm > cap:
        ctx.add(
            "GPU.CLOCK_CAP",
            n,
            "fail",
            f"the SM clock runs at {sm} MHz, above the cap of {cap} MHz (upstream's numbers were measured capped)",
            fix,
        )
    elif top <= cap:
        ctx.add("GPU.CLOCK_CAP", n, "ok", f"SM clock {sm} MHz, the GPU's maximum {top} MHz is within {cap} MHz")
    elif r.service.kind == "nixos":
        if timer == "active":
            ctx.add("GPU.CLOCK_CAP", n, "ok", f"SM clock {sm} MHz (max {top}); tp4-gpu-clock.timer is active")
        else:
            ctx.add(
                "GPU.CLOCK_CAP",
                n,
                "fail",
                f"tp4-gpu-clock.timer is {timer or 'unknown'}: nothing caps the SM clock "
                f"(now {sm} MHz, the GPU's maximum {top} MHz)",
                fix,
            )
    elif reason.lower() == "active":
        ctx.add(
            "GPU.CLOCK_CAP",
            n,
            "ok",
            f"SM clock {sm} MHz (max {top}), held by a clock setting "
            "(clocks_event_reasons.applications_clocks_setting Active)",
        )
    else:
        ctx.add(
            "GPU.CLOCK_CAP",
            n,
            "warn",
            f"SM clock {sm} MHz now, but nothing shows a cap (max {top} MHz, "
            f"clocks_event_reasons.applications_clocks_setting {reason}): the GPU may boost past {cap} MHz",
            fix,
        )


@node_check("WEIGHTS.SHARD_FILES")
def _shard_files(ctx: Context, r: RankPlan, f: Facts) -> None:
    n = r.name
    if r.rank != 0:
        ctx.add("WEIGHTS.SHARD_FILES", n, "n/a", "the head's files only")
        return
    if not f.has("shard_files"):
        ctx.add(
            "WEIGHTS.SHARD_FILES", n, "n/a", "the plan mounts no checkpoint directory on the head: see WEIGHTS.HEAD"
        )
        return
    expected = ctx.limits.expected_shards
    bad, total, totals = [], 0, set()
    rows = [x.split(" ", 4) for x in f.get("shard_files")]
    for row in rows:
        if len(row) < 5:
            continue
        readable, size, mode, kind, name = row
        m = re.search(r"-of-0*(\d+)\.safetensors$", name)
        if m:
            totals.add(int(m.group(1)))
        if kind == "missing":
            bad.append(f"{name} is a dangling link")
        elif not kind.startswith("regular"):
            bad.append(f"{name} is a {kind.replace('_', ' ')}")
        elif not size.isdigit() or int(size) == 0:
            bad.append(f"{name} is empty (0 bytes)")
        elif readable != "r" or not re.fullmatch(r"[0-7]+", mode) or int(mode, 8) & 0o444 == 0:
            bad.append(f"{name} is not readable (mode {mode})")
        else:
            total += int(size)
    count = len(rows)
    if count != expected:
        bad.insert(0, f"{count} shard files, the checkpoint has {expected} (model.expected_shards)")
    if totals - {expected}:
        bad.insert(0, "names say -of-" + ", -of-".join(map(str, sorted(totals - {expected}))) + f", not -of-{expected}")
    if bad:
        more = f"; and {len(bad) - 4} more" if len(bad) > 4 else ""
        ctx.add(
            "WEIGHTS.SHARD_FILES",
            n,
            "fail",
            "; ".join(bad[:4]) + more,
            "tp4 download again (it fetches what is missing or broken), remove shards of another checkpoint, and "
            "make every shard readable (chmod a+r)",
        )
    else:
        ctx.add("WEIGHTS.SHARD_FILES", n, "ok", f"{count} shards, {total / 2**30:.1f} GiB, each readable and non-empty")


def _image_config(f: Facts) -> tuple[str, list[str]] | None:
    """(architecture, repo digests) of the plan's image on the node, None without it."""
    rc, out = _rc(f.get("image_config"))
    if (f.get("runtime") or [""])[0] != "present" or rc != 0 or not out or not out[0].strip():
        return None
    arch, _, digests = out[0].strip().partition(" ")
    try:
        repo = json.loads(digests or "[]")
    except ValueError:
        repo = []
    return arch, [d for d in repo or [] if isinstance(d, str)]


@node_check("IMAGE.ARCH")
def _image_arch(ctx: Context, r: RankPlan, f: Facts) -> None:
    n = r.name
    machine = (f.get("uname") or ["", ""])[1:2]
    machine_s = machine[0].strip() if machine else ""
    config = _image_config(f)
    if config is None:
        ctx.add("IMAGE.ARCH", n, "n/a", f"no image {r.run.image}: see IMAGE.SAME")
    elif not machine_s:
        ctx.add("IMAGE.ARCH", n, "warn", "`uname -m` printed nothing", "check `uname -m` on the node")
    elif ARCH.get(machine_s, machine_s) != ARCH.get(config[0], config[0]):
        ctx.add(
            "IMAGE.ARCH",
            n,
            "fail",
            f"{r.run.image} is a {config[0]} image, the host is {machine_s} "
            f"({ARCH.get(machine_s, machine_s)}): it cannot run here",
            "build the image for the Sparks (tp4 build on a Spark, or --system aarch64-linux), then tp4 distribute",
        )
    else:
        ctx.add("IMAGE.ARCH", n, "ok", f"{config[0]} image on an {machine_s} host")


@node_check("IMAGE.DIGEST")
def _image_digest(ctx: Context, r: RankPlan, f: Facts) -> None:
    n = r.name
    _, at, digest = ctx.plan.image.tag.partition("@")
    recorded = ctx.limits.image_id
    if not at and not recorded:
        ctx.add(
            "IMAGE.DIGEST",
            n,
            "n/a",
            "nothing pins the image: the tag has no @sha256 digest and no `tp4 build` record names it",
        )
        return
    config, iid = _image_config(f), image_id(f)
    if config is None or iid is None:
        ctx.add("IMAGE.DIGEST", n, "n/a", f"no image {r.run.image}: see IMAGE.SAME")
        return
    problems, good = [], []
    if at:
        if any(d.endswith("@" + digest) for d in config[1]):
            good.append(f"digest {digest[:19]}")
        else:
            problems.append(
                f"its repo digests ({', '.join(d.rpartition('@')[2][:19] for d in config[1]) or 'none'}) "
                f"are not the tag's {digest[:19]}"
            )
    if recorded:
        if iid == recorded:
            good.append(f"id {iid[:12]} as `tp4 build` recorded")
        else:
            problems.append(f"id {iid[:12]}, `tp4 build` recorded {recorded[:12]} for {ctx.plan.image.tag}")
    if problems:
        ctx.add(
            "IMAGE.DIGEST",
            n,
            "fail",
            f"{r.run.image}: " + "; ".join(problems),
            "tp4 distribute (every node gets the recorded build), or tp4 build again",
        )
    else:
        ctx.add("IMAGE.DIGEST", n, "ok", ", ".join(good))


@line_check("ARTIFACT.SHA256")
def _artifact_sha256(ctx: Context) -> None:
    """The ring's NCCL library against the pin, else against the head's."""
    up = ctx.up
    shas: dict[str, tuple[str, str]] = {}
    for r in up:
        line = (ctx.facts[r.name].get("nccl_sha256") or [""])[0].split(None, 1)
        if len(line) == 2 and re.fullmatch(r"[0-9a-f]{64}", line[0]):
            shas[r.name] = (line[0], line[1].strip())
    pinned = ctx.plan.line.nccl_sha256
    head = ctx.plan.nodes[0].name
    ref = shas.get(head, (None, ""))[0]
    fix = (
        "copy one NCCL build (2.30.7 with the switchless patch) to every node, and pin its sha256 in fabric.nccl.sha256"
    )
    for r in up:
        f = ctx.facts[r.name]
        if ctx.plan.line.fabric != "ring" or not f.has("nccl"):
            ctx.add("ARTIFACT.SHA256", r.name, "n/a", "no host NCCL on this rank")
        elif r.name not in shas:
            ctx.add("ARTIFACT.SHA256", r.name, "n/a", "no NCCL library to hash: see RING.NCCL")
        else:
            sha, path = shas[r.name]
            if pinned and sha != pinned:
                ctx.add(
                    "ARTIFACT.SHA256",
                    r.name,
                    "fail",
                    f"{path}: sha256 {sha[:16]}..., fabric.nccl.sha256 pins {pinned[:16]}...",
                    fix,
                )
            elif pinned:
                ctx.add("ARTIFACT.SHA256", r.name, "ok", f"{path}: sha256 {sha[:16]}... as pinned")
            elif ref is not None and sha != ref:
                ctx.add(
                    "ARTIFACT.SHA256", r.name, "fail", f"{path}: sha256 {sha[:16]}..., the head's is {ref[:16]}...", fix
                )
            else:
                ctx.add(
                    "ARTIFACT.SHA256",
                    r.name,
                    "ok",
                    f'{path}: sha256 {sha[:16]}..., the head\'s (not pinned: set fabric.nccl.sha256 = "{sha}")',
                )


# --- the network: the fabric's peers, links and routes, the bootstrap interface, the rendezvous ---------

# `ip route get` types that carry no packet to the address (ip-route(8) ROUTE TYPES)
NO_ROUTE = ("unreachable", "blackhole", "prohibit", "throw")
ROUTE_TYPES = ("unicast", "local", "broadcast", "multicast", "anycast", "nat", *NO_ROUTE)


class Route(NamedTuple):
    kind: str  # the route's type: unicast, local, ...
    dev: str | None
    via: str | None
    text: str  # what `ip -o route get` printed, on one line


def _route(f: Facts, address: str) -> tuple[Route | None, str]:
    """The node's route to ``address`` (None: it has none) and what ip said."""
    rc, out = _rc(f.get(f"route {address}"))
    text = " ".join(" ".join(out).replace("\\", " ").split()).removeprefix("RTNETLINK answers: ")
    words = text.split()
    if rc != 0 or not words or words[0] in NO_ROUTE:
        return None, text or "no answer"

    def after(key: str) -> str | None:
        return words[words.index(key) + 1] if key in words[:-1] else None

    return Route(words[0] if words[0] in ROUTE_TYPES else "unicast", after("dev"), after("via"), text), text


class Link(NamedTuple):
    up: bool  # administratively up with a carrier (flags UP and LOWER_UP)
    ipv4: list[str]


def _links(f: Facts) -> dict[str, Link]:
    """Every interface of the node from `ip -j addr`."""
    try:
        data = json.loads("\n".join(f.get("ip")) or "[]")
    except ValueError:
        return {}
    out: dict[str, Link] = {}
    for link in data if isinstance(data, list) else []:
        if isinstance(link, dict) and isinstance(link.get("ifname"), str):
            flags = link["flags"] if isinstance(link.get("flags"), list) else []
            addrs = [
                a["local"]
                for a in link.get("addr_info", [])
                if isinstance(a, dict) and a.get("family") == "inet" and isinstance(a.get("local"), str)
            ]
            out[link["ifname"]] = Link("UP" in flags and "LOWER_UP" in flags, addrs)
    return out


def _fabric_netdevs(f: Facts) -> dict[str, str]:
    """netdev -> RDMA device, for every RDMA device of the node (its fabric ports)."""
    out: dict[str, str] = {}
    for line in f.get("rdmanet"):
        parts = line.split()
        if len(parts) == 2:
            out.setdefault(parts[1], parts[0])
    return out


ROUTE_FIX = (
    "route every node's fabric IP through a fabric port: on a switch, the fabric ports of all nodes in one "
    "subnet; on a ring, the mesh's routes via the neighbours (the mesh unit, sparkring's mesh-up)"
)


def _owners(ctx: Context) -> dict[str, str]:
    """Each address of a reachable node (not loopback) -> the node."""
    return {
        a: r.name
        for r in ctx.up
        for _, addrs in _addresses(ctx.facts[r.name]).values()
        for a in addrs
        if not a.startswith("127.")
    }


@node_check("RDMA.JUMBO_PING")
def _jumbo_ping(ctx: Context, r: RankPlan, f: Facts) -> None:
    fabric = _fabric_netdevs(f)
    peers = ping_peers(ctx.plan, r)
    if not peers:
        ctx.add("RDMA.JUMBO_PING", r.name, "n/a", "a single node")
        return
    if not ctx.limits.ping:
        ctx.add("RDMA.JUMBO_PING", r.name, "n/a", "not run (serve leaves the non-blocking ping out)")
        return
    good, bad, fixes = [], [], []
    for peer in peers:
        who = f"{peer.name} ({peer.host})"
        lines = f.get(f"ping {peer.host}")
        dev = next((x[4:].strip() for x in lines if x.startswith("dev ")), "")
        rc, out = _rc([x for x in lines if not x.startswith("dev ")])
        text = [x.strip() for x in out if x.strip()]
        sent = next(
            (m for x in text if (m := re.search(r"(\d+) packets transmitted, (\d+) (?:packets )?received", x))), None
        )
        if not f.has(f"ping {peer.host}") or not dev:
            bad.append(f"{who}: no route")
            fixes.append(ROUTE_FIX)
        elif dev not in fabric:
            bad.append(
                f"{who}: the route leaves through {dev}, not a fabric port ({', '.join(sorted(fabric)) or 'none'})"
            )
            fixes.append(ROUTE_FIX)
        elif rc == 0:
            good.append(
                f"{who} via {dev}" + (f" ({sent[2]} of {sent[1]} replies)" if sent and sent[1] != sent[2] else "")
            )
        else:
            why = next(
                (x for x in text if "too long" in x.lower() or "mtu" in x.lower() or "unreachable" in x.lower()),
                f"no reply to {PING_COUNT} packets within {PING_WAIT} s" if sent else (text or ["no output"])[-1],
            )
            bad.append(f"{who} via {dev}: {why}")
            fixes.append(f"MTU {FABRIC_MTU} on both nodes' fabric netdevs and on every switch port between them")
    if bad:
        ctx.add(
            "RDMA.JUMBO_PING",
            r.name,
            "fail",
            f"`ping -M do -s {JUMBO_PAYLOAD} -c {PING_COUNT} -W {PING_WAIT}` fails to "
            + "; ".join(bad)
            + (f" (reached: {', '.join(good)})" if good else ""),
            "; ".join(dict.fromkeys(fixes)),
        )
    else:
        ctx.add(
            "RDMA.JUMBO_PING", r.name, "ok", f"{JUMBO_PAYLOAD}+28 bytes with don't-fragment reach " + ", ".join(good)
        )


@node_check("RDMA.LINK_SPEED")
def _link_speed(ctx: Context, r: RankPlan, f: Facts) -> None:
    rows = [x.split() for x in f.get("speed") if x.strip()]
    if not rows:
        ctx.add("RDMA.LINK_SPEED", r.name, "fail", "no netdev of the plan's HCAs found", "see RDMA.DEVICES")
        return
    slow, good = [], []
    for hca, netdev, *value in rows:
        speed = value[0] if value else ""
        if speed == str(LINK_SPEED_MBPS):
            good.append(f"{hca}/{netdev}")
        elif speed.isdigit():
            slow.append(f"{hca}/{netdev} at {speed} Mb/s")
        else:
            slow.append(f"{hca}/{netdev} speed unknown ({speed or 'unreadable'}: the link is down?)")
    if slow:
        ctx.add(
            "RDMA.LINK_SPEED",
            r.name,
            "fail",
            ", ".join(slow) + f", not {LINK_SPEED_MBPS} Mb/s",
            f"reseat or replace the cable (DAC) and check the switch port: `ethtool <netdev>` must show Speed: "
            f"{LINK_SPEED_MBPS}Mb/s; a port that trained lower carries the line at that speed",
        )
    else:
        ctx.add("RDMA.LINK_SPEED", r.name, "ok", ", ".join(good) + f" at {LINK_SPEED_MBPS} Mb/s")


@node_check("NET.BOOTSTRAP_IFACE")
def _bootstrap_iface(ctx: Context, r: RankPlan, f: Facts) -> None:
    names: dict[str, list[str]] = {}  # the value -> the variables that name it
    for var in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"):
        if r.env.get(var):
            names.setdefault(r.env[var], []).append(var)
    if not names:
        ctx.add(
            "NET.BOOTSTRAP_IFACE", r.name, "n/a", "the plan names no bootstrap interface (NCCL and Gloo choose one)"
        )
        return
    links = _links(f)
    good, bad, fixes = [], [], []
    for value, variables in names.items():
        what = f"{' and '.join(variables)}={value}"
        if value.startswith("^"):  # NCCL's exclusion list: any other interface
            good.append(f"{what} (excludes, not checked)")
            continue
        # NCCL_SOCKET_IFNAME names prefixes ("=" before the list: exact names); Gloo's names are exact
        exact = value.startswith("=") or "GLOO_SOCKET_IFNAME" in variables
        wanted = [w for w in value.removeprefix("=").split(",") if w]
        found = [n for n in links if any(n == w if exact else n.startswith(w) for w in wanted)]
        usable = [n for n in found if links[n].up and links[n].ipv4]
        if usable:
            good.append(f"{what}: {usable[0]} {links[usable[0]].ipv4[0]}")
        elif not found:
            bad.append(f"{what}: no such interface (there: {', '.join(sorted(links)) or 'none'})")
            fixes.append(
                "set fabric.socket_ifname to the node's management LAN interface (`ip -br addr`), the same name on "
                "every node"
            )
        elif not any(links[n].ipv4 for n in found):
            bad.append(f"{what}: {', '.join(found)} has no IPv4 address")
            fixes.append(f"give {found[0]} its IPv4 address (NCCL and Gloo bind and advertise it)")
        else:
            bad.append(f"{what}: {', '.join(found)} is down")
            fixes.append(f"ip link set {found[0]} up (and check its cable)")
    if bad:
        ctx.add("NET.BOOTSTRAP_IFACE", r.name, "fail", "; ".join(bad), "; ".join(fixes))
    else:
        ctx.add("NET.BOOTSTRAP_IFACE", r.name, "ok", "; ".join(good))


@node_check("NET.RENDEZVOUS_ROUTE")
def _rendezvous_route(ctx: Context, r: RankPlan, f: Facts) -> None:
    host, _ = rendezvous(ctx.plan)
    route, text = _route(f, host)
    if r.rank == 0:
        if route is not None and route.kind == "local":
            ctx.add("NET.RENDEZVOUS_ROUTE", r.name, "ok", f"the dist init address {host} is the head's own")
        else:
            ctx.add(
                "NET.RENDEZVOUS_ROUTE",
                r.name,
                "fail",
                f"the dist init address {host} is not the head's ({text})",
                "cluster.head.ip must be an address of the head: its TCPStore listens there",
            )
        return
    if route is None:
        ctx.add(
            "NET.RENDEZVOUS_ROUTE",
            r.name,
            "fail",
            f"no route to the dist init address {host}: {text}",
            f"route the head's address {host} from this node (a ring: the mesh's route via a neighbour, see RING.ROUTES)",
        )
    elif route.kind == "local":
        ctx.add(
            "NET.RENDEZVOUS_ROUTE",
            r.name,
            "fail",
            f"the dist init address {host} is this node's own address",
            "give every node its own fabric IP (cluster.*.ip)",
        )
    else:
        ctx.add(
            "NET.RENDEZVOUS_ROUTE", r.name, "ok", f"{host} via {route.dev}" + (f" and {route.via}" if route.via else "")
        )


@node_check("PEER.CONTROL_CHANNEL")
def _control_channel(ctx: Context, r: RankPlan, f: Facts) -> None:
    host, port = rendezvous(ctx.plan)
    if r.rank == 0:
        ctx.add("PEER.CONTROL_CHANNEL", r.name, "n/a", f"the head serves the dist init port {port}")
        return
    rc, out = _rc(f.get(f"control {host} {port}"))
    said = " ".join(x.strip() for x in out if x.strip())
    if not f.has(f"control {host} {port}"):
        ctx.add("PEER.CONTROL_CHANNEL", r.name, "n/a", "not checked")
    elif said == "no bash":
        ctx.add(
            "PEER.CONTROL_CHANNEL",
            r.name,
            "warn",
            "not checked: no bash on the node (the TCP check uses its /dev/tcp)",
            f"install bash, or check `nc -zv {host} {port}` from the node by hand",
        )
    elif rc == 0:
        ctx.add(
            "PEER.CONTROL_CHANNEL", r.name, "ok", f"{host}:{port} accepted a connection (something listens there now)"
        )
    elif "refused" in said.lower():
        ctx.add(
            "PEER.CONTROL_CHANNEL",
            r.name,
            "ok",
            f"{host}:{port} answers (connection refused: nothing listens before serve)",
        )
    else:
        why = (
            f"no answer within {CONTROL_WAIT} s" if rc == 124 else (said.rsplit(": ", 1)[-1] if said else f"exit {rc}")
        )
        ctx.add(
            "PEER.CONTROL_CHANNEL",
            r.name,
            "fail",
            f"TCP to the dist init port {host}:{port}: {why}",
            f"let TCP port {port} through to the head from every worker (a firewall that drops it stalls the line's "
            "start until the rendezvous times out; a NixOS head opens it: tp4.host.firewall)",
        )


@node_check("RING.ROUTES")
def _ring_routes(ctx: Context, r: RankPlan, f: Facts) -> None:
    """Also records the routes that go through another node (ctx.relays), which RING.IP_FORWARD
    judges; CHECKS runs RING.ROUTES first."""
    if ctx.plan.line.fabric != "ring":
        ctx.add("RING.ROUTES", r.name, "n/a", "switched fabric (RDMA.JUMBO_PING checks the route to every node)")
        return
    fabric, owners, relays = _fabric_netdevs(f), _owners(ctx), ctx.relays
    good, bad = [], []
    for other in ctx.plan.nodes:
        if other.rank == r.rank:
            continue
        who = f"{other.name} ({other.host})"
        route, text = _route(f, other.host)
        if route is None:
            bad.append(f"no route to {who}: {text}")
        elif route.kind == "local":
            bad.append(f"{who} is this node's own address")
        elif route.dev not in fabric:
            bad.append(f"{who} leaves through {route.dev}, not a fabric port ({', '.join(sorted(fabric)) or 'none'})")
        elif route.via is not None and route.via not in owners:
            bad.append(f"{who} goes via {route.via}, no node's address")
        elif route.via is not None:
            good.append(f"{other.name} via {owners[route.via]}")
            if owners[route.via] != other.name:
                relays.setdefault(owners[route.via], []).append((r.name, other))
        else:
            good.append(f"{other.name} on {route.dev}")
    if bad:
        ctx.add("RING.ROUTES", r.name, "fail", "; ".join(bad), ROUTE_FIX)
    else:
        ctx.add("RING.ROUTES", r.name, "ok", ", ".join(good))


@node_check("RING.IP_FORWARD")
def _ip_forward(ctx: Context, r: RankPlan, f: Facts) -> None:
    through = ctx.relays.get(r.name, []) if ctx.plan.line.fabric == "ring" else None
    if through is None:
        ctx.add("RING.IP_FORWARD", r.name, "n/a", "switched fabric")
        return
    value = (f.get("ip_forward") or [""])[0].strip()
    routes = ", ".join(f"{a}'s to {b.name} ({b.host})" for a, b in through)
    fix = (
        "sysctl -w net.ipv4.ip_forward=1 and keep it across boots (/etc/sysctl.d/; spark-host sets it on every node "
        "of a ring)"
    )
    if not through:
        ctx.add(
            "RING.IP_FORWARD", r.name, "ok", f"no node's route goes through it (net.ipv4.ip_forward={value or '?'})"
        )
    elif value == "1":
        ctx.add("RING.IP_FORWARD", r.name, "ok", f"forwards the routes {routes}")
    elif value == "0":
        ctx.add(
            "RING.IP_FORWARD", r.name, "fail", f"net.ipv4.ip_forward is 0, and the routes {routes} go through it", fix
        )
    else:
        ctx.add(
            "RING.IP_FORWARD",
            r.name,
            "warn",
            f"net.ipv4.ip_forward unreadable ({value or 'no answer'}), and the routes {routes} go through it",
            fix,
        )


# --- entry points ------------------------------------------------------------------------------------


class Report(NamedTuple):
    facts: dict[str, Facts]
    results: list[Result]
    seconds: float

    @property
    def blocking(self) -> list[Result]:
        return [x for x in self.results if x.blocking and x.status == "fail"]

    def evidence(self) -> dict[str, Json]:
        """`tp4 doctor --json`, built through its contract (tp4.core.contracts.doctor_evidence)."""
        doc = DoctorEvidence(
            seconds=round(self.seconds, 3),
            nodes={name: f.contract() for name, f in self.facts.items()},
            checks=[x.contract() for x in self.results],
        )
        out: dict[str, Json] = doc.model_dump(mode="json", by_alias=True)
        return out


def doctor(plan: Plan, nodes: Sequence[Node], limits: Limits | None = None) -> Report:
    lim = limits or Limits()
    began = time.monotonic()
    facts = gather(plan, nodes, lim)
    return Report(facts, evaluate(plan, facts, lim), time.monotonic() - began)


def blocking_failures(plan: Plan, nodes: Sequence[Node], limits: Limits | None = None) -> list[Result]:
    """The blocking failures of the line (what serve refuses on), empty when it may start."""
    return doctor(plan, nodes, limits).blocking


def image_id(facts: Facts) -> str | None:
    """The id of the plan's image on the node, from its facts (None: no such image)."""
    rc, out = _rc(facts.get("image"))
    if rc != 0 or not out or not out[0].strip():
        return None
    return out[0].split(" ", 1)[0].removeprefix("sha256:")


MARK = {"ok": "ok", "warn": "warn", "fail": "FAIL", "n/a": "-"}


def table(plan: Plan, results: Sequence[Result]) -> list[str]:
    """One row per check, one column per node, then a fix line per warning and failure."""
    names = [r.name for r in plan.nodes]
    cell = {(x.check, x.node): x for x in results}
    width = max(len(c.id) for c in CHECKS)
    cols = [max(len(n), 4) for n in names]
    lines = ["check".ljust(width) + "  " + "  ".join(n.ljust(w) for n, w in zip(names, cols, strict=True))]
    for spec in CHECKS:
        row = [MARK[cell[(spec.id, n)].status] if (spec.id, n) in cell else "?" for n in names]
        lines.append(
            spec.id.ljust(width) + "  " + "  ".join(v.ljust(w) for v, w in zip(row, cols, strict=True)).rstrip()
        )
    issues = [x for x in results if x.status in ("warn", "fail")]
    if issues:
        lines.append("")
    for x in issues:
        tag = "FAIL" if x.status == "fail" else "warn"
        block = " (blocking)" if x.status == "fail" and x.blocking else ""
        lines.append(f"{tag} {x.node} {x.check}{block}: {x.detail}")
        if x.fix:
            lines.append(f"     fix: {x.fix}")
    return lines


REFERENCE_BEGIN = "<!-- checks: generated by tp4.hosts.doctor.reference -->"
REFERENCE_END = "<!-- end of checks -->"


def reference() -> str:
    """The checks as a Markdown table (docs/doctor.md holds it; a test keeps it current)."""
    rows = [REFERENCE_BEGIN, "", "| id | blocking | passes when |", "|---|---|---|"]
    rows += [f"| `{c.id}` | {'yes' if c.blocking else 'no'} | {c.title} |" for c in CHECKS]
    return "\n".join([*rows, "", REFERENCE_END])
