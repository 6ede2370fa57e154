"""The one renderer: a validated Profile becomes the Plan of the line: per rank the container
environment (upstream start.sh's `docker run -e`), the engine argv boot.py runs, the container run
spec, plus the image and the boot-log lines the armed gates print.

serve, doctor, the NixOS unit and the boot-log check read a Plan; none of them derives a flag.
The Plan is typed, immutable NamedTuples (cheap to define: `tp4 plan` starts fast); its JSON (`tp4 plan --json`) is generated from them and
so is docs/plan-schema.md (tp4.line.planschema). Which env key comes from which field is the knob
table (tp4.line.knobs); adapter gates come from adapters/registry.toml.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import TYPE_CHECKING, Annotated, Literal, NamedTuple

from tp4.core import netaddr, schemas
from tp4.core.bootphases import BOOT_TIMEOUTS
from tp4.core.errors import InvalidInput
from tp4.line.container import HEALTH, MOUNTS, PODMAN_GPU_DEVICES, Health
from tp4.line.knobs import BY_ENV, KNOBS, Knob
from tp4.line.registry import Registry, condition_holds, fill_line, line_pattern, load_registry

if TYPE_CHECKING:
    from tp4.line.profile.load import Loaded
    from tp4.line.profile.models import Cluster, NodeSpec, Profile

SCHEMA = schemas.PLAN
# kept for the callers that name a mount target; the values live in tp4/data/container.toml
MODEL_MOUNT = MOUNTS.model
STATE_MOUNT = MOUNTS.state
ENGRAM_MOUNT = MOUNTS.engram
NCCL_MOUNT = MOUNTS.nccl
# boot.py's own defaults for variables the launcher does not forward (the knobs' `omit_if`).
BOOT_DEFAULTS = {k.env: k.omit_if for k in KNOBS if k.omit_if is not None}

Role = Literal["head", "worker"]
Variant = Literal["base", "canary", "canary-roce"]
Fabric = Literal["switched", "ring"]
MountType = Literal["bind", "volume"]
HostKind = Literal["plain", "nixos"]
Runtime = Literal["docker", "podman"]


class SshTarget(NamedTuple):
    """How tp4 reaches the node."""

    host: Annotated[str, "ssh address (the node's `ssh`, default its fabric IP)"]
    user: Annotated[str, "ssh user"]
    identity: Annotated[str | None, "ssh identity file on the machine running tp4; null: ssh's own choice (no -i)"]
    port: Annotated[int, "ssh port"]


class Mount(NamedTuple):
    """One mount of the container."""

    type: Annotated[MountType, "a host directory (bind) or a named volume (the workers' NFS weights)"]
    source: Annotated[str, "host path or volume name"]
    target: Annotated[str, "path in the container (tp4/data/container.toml)"]
    read_only: Annotated[bool, "mounted read-only"]


class Ulimits(NamedTuple):
    memlock: Annotated[str, "locked memory, soft:hard (-1 = unlimited: RDMA registers the KV pool)"]
    stack: Annotated[str, "stack size in bytes"]


class RunSpec(NamedTuple):
    """The container run spec of one rank (upstream start.sh's `docker run` flags)."""

    container: Annotated[str, "container name"]
    image: Annotated[str, "image reference run on the node"]
    command: Annotated[tuple[str, ...], "arguments to the image's entrypoint (boot.py)"]
    network: Annotated[Literal["host"], "host networking (RoCE and the dist init port)"]
    ipc: Annotated[Literal["host"], "host IPC namespace"]
    privileged: Annotated[bool, "privileged (the RDMA devices and GPU clocks)"]
    cap_add: Annotated[tuple[str, ...], "added capabilities"]
    gpus: Annotated[Literal["all"], "GPUs given to the container"]
    shm_size: Annotated[str, "size of /dev/shm"]
    ulimits: Annotated[Ulimits, "resource limits"]
    devices: Annotated[tuple[str, ...], "devices, host:container"]
    mounts: Annotated[tuple[Mount, ...], "model, state, cache, engram, then the host NCCL if any"]
    restart: Annotated[Literal["no"], "restart policy: never (a failed rank fails the line)"]
    workdir: Annotated[str, "the node's working directory on the host (upstream's checkout)"]
    health: Annotated[Health, "the image's health check, passed to podman as flags (docker reads it from the image)"]


class GidIndex(NamedTuple):
    """The RoCE v2 GID index NCCL uses on this node (NCCL_IB_GID_INDEX)."""

    # `value`, not `index`: a NamedTuple field must not shadow tuple.index
    value: Annotated[int, "the index rendered into env (the node's pin, else fabric.gid_index)"]
    pinned_by: Annotated[str | None, "the profile field that pins it for this node; null when not pinned"]
    lookup_by: Annotated[
        tuple[str, ...],
        (
            "the commands that look the index up on the node at start (the RoCE v2 IPv4 GID "
            "of `hcas` for the node's fabric IP) and use it in place of `value`; empty when pinned"
        ),
    ]
    hcas: Annotated[tuple[str, ...], "the RDMA devices whose GID table is read"]


class Readiness(NamedTuple):
    """When the rank counts as up, from its own container log: what the NixOS module's readiness
    unit waits for (`tp4 bootlog wait`), the rank's part of tp4 serve's boot-log check."""

    pattern: Annotated[
        str,
        (
            "a Python regular expression for the log line that says the rank is up: the head's "
            "`Ready: API on port <API port>`, a worker's SGLang `Load weight end.` (it prints no Ready)"
        ),
    ]
    timeout: Annotated[
        int,
        (
            "seconds the rank may take to print it: the head, the sum of serve's boot phase bounds "
            "from start to ready; a worker, its start and weight load"
        ),
    ]
    required_lines: Annotated[bool, "the plan's required boot_lines must be in this rank's log (rank 0)"]


class HostDir(NamedTuple):
    """A host directory the rank needs before its container starts (serve makes them on a plain
    host, the NixOS module as tmpfiles rules)."""

    path: Annotated[str, "the directory on the host"]
    owner: Annotated[str, "its owner: the node's user (the bind mounts), root (the env file's directory)"]
    mode: Annotated[str, "its mode, octal"]


class HostUnits(NamedTuple):
    """The systemd units the NixOS host modules declare around the rank unit, by the names the
    modules give them (the rank unit is ordered after them; tp4 deploy checks the RDMA check)."""

    rdma_check: Annotated[str, "the oneshot check that the fabric ports are ACTIVE with their RoCE v2 GIDs"]
    weights_volume: Annotated[str | None, "the oneshot that makes a worker's weights volume; null on the head"]
    ready: Annotated[str, "the rank's readiness (tp4 bootlog wait), beside the rank unit"]


class Service(NamedTuple):
    """How the node runs its rank: tp4 runs the container over ssh (plain), or the NixOS module's
    unit does and tp4 starts and stops it (nixos)."""

    kind: Annotated[HostKind, "plain (tp4 runs the container) or nixos (the module's unit runs it)"]
    runtime: Annotated[Runtime, "the node's container runtime"]
    unit: Annotated[str | None, "the systemd unit of the rank (nixos), else null"]
    env_file: Annotated[
        str, "where serve writes the rank's environment (mode 0600; the container reads it, it never goes into argv)"
    ]
    mesh_unit: Annotated[
        str | None,
        "the systemd unit that brings the ring's mesh up before the rank (a ring line), else "
        "null: upstream's dsv41-mesh.service on a plain host, the NixOS module's tp4-mesh.service",
    ]
    ready: Annotated[Readiness, "when the rank is up, read from its own log"]
    directories: Annotated[
        tuple[HostDir, ...],
        (
            "the host directories made before the start: the writable bind mounts "
            "(state, cache, Engram; never the checkpoint), and on a NixOS host the env file's"
        ),
    ]
    gpu_devices: Annotated[
        tuple[str, ...],
        (
            "the devices podman is given for run.gpus = all (NVIDIA's CDI device); "
            "empty with docker, which takes --gpus all"
        ),
    ]
    host_units: Annotated[HostUnits | None, "the NixOS host units around the rank unit (nixos); null on a plain host"]


class RankPlan(NamedTuple):
    """One rank: one Spark, one container."""

    rank: Annotated[int, "rank; 0 is the head"]
    role: Annotated[Role, "head (serves the API, hosts dist init and NFS) or worker"]
    name: Annotated[str, "node name"]
    host: Annotated[str, "the node's fabric IP"]
    ssh: Annotated[SshTarget, "how tp4 reaches the node"]
    env: Annotated[dict[str, str], "the container environment, one value per key (see Environment keys)"]
    argv: Annotated[tuple[str, ...], "the engine command boot.py runs, without --api-key"]
    run: Annotated[RunSpec, "the container run spec"]
    gid: Annotated[GidIndex, "where NCCL_IB_GID_INDEX comes from"]
    service: Annotated[Service, "how the node runs the rank"]


class ImageRef(NamedTuple):
    tag: Annotated[str, "image reference every node runs"]
    variant: Annotated[Variant, "which image: base, canary or canary-roce"]
    base: Annotated[str, "base image, pinned by digest"]


class VolumeOptions(NamedTuple):
    """A worker's weights volume as `<runtime> volume create --driver local --opt KEY=VALUE` makes it."""

    type: Annotated[str, "the mount type (nfs)"]
    o: Annotated[str, "the mount options: the head's address (addr=) and the NFS client options"]
    device: Annotated[str, "the export, as `:<path>`"]


class NfsShare(NamedTuple):
    """The head's NFS export of the checkpoint to the workers (tp4 share, the NixOS hosts)."""

    export: Annotated[str, "the head's checkpoint directory, exported read-only (the head's model bind mount)"]
    servers: Annotated[
        tuple[str, ...],
        "per worker in rank order, the head's address it mounts from (nfs.server_ips: one for all, or one per worker)",
    ]
    port: Annotated[int, "the NFS server's TCP port (NFSv4), opened on the head"]
    export_options: Annotated[
        tuple[str, ...], "exports(5) options of the checkpoint (upstream files/nfs-share.sh's, without fsid=0)"
    ]
    mount_options: Annotated[
        tuple[str, ...], "the workers' NFS client options (the weights volume's and a NixOS worker's mount)"
    ]
    volumes: Annotated[
        tuple[VolumeOptions, ...],
        "per worker in rank order, its weights volume's options (tp4 share makes it, a NixOS worker's unit too)",
    ]


class LineFacts(NamedTuple):
    nnodes: Annotated[int, "nodes in the line (one rank each)"]
    tp: Annotated[int, "tensor parallel size"]
    ep: Annotated[int, "expert parallel size"]
    fabric: Annotated[Fabric, "switched RoCE fabric or a switchless ring"]
    dist_init_addr: Annotated[
        str,
        "torch distributed init address (head IP:port; an IPv6 head in brackets, [fd00::1]:20000, the form SGLang's --dist-init-addr reads)",
    ]
    api: Annotated[str, "the OpenAI API URL on the head (an IPv6 head in brackets: http://[fd00::1]:8888)"]
    gpu_clock_mhz: Annotated[
        int | None,
        (
            "the SM clock cap of every node's GPU in MHz (nvidia-smi -lgc 0,<MHz>; the NixOS "
            "module's tp4-gpu-clock.timer); null: the clock is left alone"
        ),
    ]
    nccl_sha256: Annotated[
        str | None,
        (
            "the sha256 of the host NCCL build's libnccl.so.2 every node must carry "
            "(fabric.nccl.sha256); null: unpinned (doctor compares the nodes with the head)"
        ),
    ]
    id: Annotated[
        str,
        "the line's name, the tp4.line label of every rank's container: the head's ssh host and the API port, other characters '_'",
    ]
    api_port: Annotated[int, "the API's TCP port on the head (cluster.port)"]
    dist_init_port: Annotated[int, "the torch distributed init port on the head (cluster.dist_port)"]
    nfs: Annotated[
        NfsShare | None,
        "the head's NFS share of the checkpoint; null when every node holds its own copy (a ring, nfs.share = false)",
    ]
    ring_hairpin_queue: Annotated[
        int | None,
        "a ring's devlink hairpin_queue_size on the fabric functions (fabric.ring_hairpin_queue); null on a switched fabric",
    ]


class BootLine(NamedTuple):
    """A line rank 0's boot log prints when the line is armed as planned."""

    adapter: Annotated[str, "the adapter (registry entry) that prints it"]
    text: Annotated[str, "the line, '...' where anything may stand"]
    pattern: Annotated[str, "a Python regular expression for the line ('...' became '.*')"]
    required: Annotated[bool, "false: useful evidence, not a gate of the line's health"]


class SecretRef(NamedTuple):
    file: Annotated[str, "the file holding the secret, on the machine running tp4; read only at serve time"]


class Plan(NamedTuple):
    """The plan of the line: what every rank runs."""

    preset: Annotated[str, "the profile's top preset layer"]
    source: Annotated[str, "the profile path, or 'embedded default profile'"]
    image: Annotated[ImageRef, "the image"]
    line: Annotated[LineFacts, "facts of the whole line"]
    nodes: Annotated[tuple[RankPlan, ...], "ranks in order; rank 0 is the head"]
    boot_lines: Annotated[tuple[BootLine, ...], "lines rank 0's boot log prints for the armed gates"]
    forbidden_lines: Annotated[tuple[str, ...], "text that must never appear in any rank's log"]
    secrets: Annotated[dict[str, SecretRef], "references to secrets (never their values); {} when the API is open"]
    warnings: Annotated[tuple[str, ...], "validation warnings (the plan is still valid)"] = ()
    notes: Annotated[
        tuple[str, ...],
        "where the plan renders a gate differently from the profile as written, and why; the layer each extra engine argument comes from",
    ] = ()

    def to_json(self) -> dict[str, Json]:
        """The plan as JSON values (objects, arrays, strings, numbers, booleans, null), under its
        schema, with its digest."""
        out = _json(self)
        assert isinstance(out, dict)
        doc: dict[str, Json] = {"schema": SCHEMA, **out}
        return {"schema": SCHEMA, "digest": digest_of(doc), **out}

    @property
    def digest(self) -> str:
        """The plan's digest (:func:`digest_of`): what every rank of a line started from it carries."""
        return digest_of(self.to_json())


# fields of the plan's JSON the digest leaves out: the digest itself, and where the profile was
# read from (the same profile named by another path is the same line)
DIGEST_EXCLUDES = ("digest", "source")


def canonical_json(doc: object) -> bytes:
    """The one canonical JSON of a document: keys sorted, no whitespace, UTF-8."""
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def digest_of(doc: dict[str, Json]) -> str:
    """``sha256:<hex>`` of the canonical JSON of a plan document without DIGEST_EXCLUDES. Secrets
    are file references in a plan, so the digest holds none."""
    body = {k: v for k, v in doc.items() if k not in DIGEST_EXCLUDES}
    return "sha256:" + hashlib.sha256(canonical_json(body)).hexdigest()


def differences(running: Json, planned: Json, path: str = "") -> list[tuple[str, Json, Json]]:
    """The fields where two plan documents differ, as (dotted path, running value, planned value);
    list items by index (nodes[1].env.X), a field only one side has with None on the other.
    The digest and the source are left out, as the digest leaves them out."""
    if isinstance(running, dict) and isinstance(planned, dict):
        out: list[tuple[str, Json, Json]] = []
        for key in [*running, *(k for k in planned if k not in running)]:
            if not path and key in DIGEST_EXCLUDES:
                continue
            out += differences(running.get(key), planned.get(key), f"{path}.{key}" if path else key)
        return out
    if isinstance(running, list) and isinstance(planned, list):
        out = []
        for i in range(max(len(running), len(planned))):
            out += differences(
                running[i] if i < len(running) else None, planned[i] if i < len(planned) else None, f"{path}[{i}]"
            )
        return out
    return [] if running == planned else [(path or "(plan)", running, planned)]


Json = None | bool | int | str | list["Json"] | dict[str, "Json"]


def _json(value: object) -> Json:
    """A plan part as JSON values: a part becomes an object of its fields in order, a tuple an array."""
    names: tuple[str, ...] | None = getattr(type(value), "_fields", None)
    if isinstance(value, tuple) and names is not None:  # a plan part (a NamedTuple)
        return {name: _json(getattr(value, name)) for name in names}
    if isinstance(value, tuple | list):
        return [_json(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _json(v) for k, v in value.items()}
    if value is None or isinstance(value, bool | int | str):
        return value
    raise TypeError(f"plan value {value!r} is not JSON")


def _read(p: Profile, path: str) -> object:
    cur: object = p
    for part in path.split("."):
        cur = getattr(cur, part)
    return cur


def _field_value(p: Profile, knob: Knob, rank: int) -> str | None:
    """A field knob's value for a rank, or None when the knob is not rendered."""
    if knob.ring_only and p.fabric.mode != "ring":
        return None
    if knob.when_field is not None and str(_read(p, knob.when_field)) != knob.when_equals:
        return None
    if knob.form == "fixed":
        return knob.value
    value = _read(p, knob.read or knob.field)
    if rank == 0 and knob.head_field is not None:
        head = _read(p, knob.head_field)
        if head is not None:
            value = head
    if knob.form in ("comma", "words"):
        assert isinstance(value, list)
        text = ("," if knob.form == "comma" else " ").join(str(v) for v in value)
        return text or None if knob.form == "words" else text
    text = str(value)
    return None if knob.omit_if is not None and text == knob.omit_if else text


def local_user() -> str:
    """The name of the local user running tp4, as ssh takes it when no user is given ($LOGNAME,
    $USER, else the account's name): a profile without cluster.user runs the line as them."""
    import getpass

    from tp4.line.profile.models import _check_user

    try:
        name = getpass.getuser()
    except (KeyError, OSError):
        name = ""
    try:
        return str(_check_user(name))
    except ValueError as exc:
        raise InvalidInput(
            f"cluster.user: not set, and the local user's name ({name[:40]!r}) is no ssh user name "
            f"({str(exc).split('; fix: ', 1)[-1]}); fix: set cluster.user to the user tp4 logs in as on the nodes"
        ) from None


def user_of(node: NodeSpec, cluster: Cluster) -> str:
    """The ssh user of a node: its own, the cluster's, else the local user's (as ssh does)."""
    return node.user or cluster.user or local_user()


def home_of(node: NodeSpec, cluster: Cluster) -> str:
    if node.home:
        return node.home
    user = user_of(node, cluster)
    return "/root" if user == "root" else f"/home/{user}"


def expand(path: str, home: str) -> str:
    if path == "~":
        return home
    if path.startswith("~/"):
        return home + path[1:]
    return path


def resolve_gates(p: Profile, reg: Registry) -> tuple[dict[str, str], list[str]]:
    """The profile's gates as the line runs them, and a note for each gate the preset set that
    does not apply as set. Rolling a layer back is one change (seed "Rollback"): a gate the preset
    sets whose needed gate the profile turns off is dropped, since upstream's adapter does nothing
    without it, and so is one that fails a warning rule on it (the rule says when the gate stops
    acting: DSV41_FAST_LOAD_TP_SLICE=auto at EP 2); a preset gate that fails a registry rule with
    `follow` takes the followed value.
    A gate counts as the preset's when the preset chain sets it (recorded on the Profile by the
    loader, which reads the preset files: the renderer never does) and the profile document does
    not (or, when the document's own gates are not recorded, when it has the preset's value); one
    the profile sets itself is kept, and the validator reports what it needs."""
    preset = p._preset_gates or {}
    gates = dict(p.gates)
    own = p._own_gates
    from_preset = {k for k, v in gates.items() if k in preset and (k not in own if own is not None else preset[k] == v)}
    turned_off = {
        k for k, v in gates.items() if k not in from_preset and (g := reg.gate(k)) is not None and not g.is_on(v)
    }
    notes: list[str] = []
    dropped: set[str] = set()
    changed = True
    while changed:
        changed = False
        for key in sorted(from_preset - dropped):
            gate = reg.gate(key)
            if gate is None or not gate.is_on(gates[key]):
                continue
            cause = next((c for c in reg.needs_of(key) if c in turned_off or c in dropped), None)
            if cause is not None:
                why = "the profile turns it off" if cause in turned_off else "it is dropped too"
                notes.append(
                    f"gates.{key}: the preset's {key}={gates.pop(key)} is dropped: it needs {cause}, and {why}"
                )
                dropped.add(key)
                changed = True
        # a warning rule on a gate says when that gate stops acting (DSV41_FAST_LOAD_TP_SLICE=auto
        # only acts at EP 1): the preset's gate is dropped with a note, as above, instead of
        # leaving a warning that --strict turns into an error; one the profile sets is warned about
        env = _render_env(p, 0, reg, gates)
        for rule in reg.rules_for(gates):
            key = rule.field.removeprefix("gates.")
            if rule.level != "warning" or rule.follow is not None or key not in from_preset - dropped:
                continue
            if key in gates and rule.fails(env, reg):
                notes.append(
                    f"gates.{key}: the preset's {key}={gates.pop(key)} is dropped: {fill_line(rule.reason, env)}"
                )
                dropped.add(key)
                changed = True
                break
    env = _render_env(p, 0, reg, gates)
    for rule in reg.rules_for(gates):
        key = rule.field.removeprefix("gates.")
        if rule.follow is None or key not in from_preset or key not in gates:
            continue
        if rule.fails(env, reg):
            value = fill_line(rule.follow, env)
            notes.append(
                f"gates.{key}: the preset's {key}={gates[key]} {fill_line(rule.reason, env)}; the plan sets {value}"
            )
            gates[key] = value
            env = _render_env(p, 0, reg, gates)
    return gates, notes


class Rendered(NamedTuple):
    """What the profile's rules read, rendered once: the gates as the line runs them, the notes
    on preset gates that do not apply as set, and rank 0's environment."""

    gates: dict[str, str]
    notes: list[str]
    head_env: dict[str, str]


def render_head(p: Profile, reg: Registry) -> Rendered:
    gates, notes = resolve_gates(p, reg)
    return Rendered(gates, notes, _render_env(p, 0, reg, gates))


def arg_notes(loaded: Loaded) -> list[str]:
    """The layer each argument of engine.extra_args comes from (the layers' lists add up), and
    each inherited one a layer's engine.drop_args removed."""

    def layer(name: str) -> str:
        return "the profile" if name == "profile" else name

    return [
        f"engine.extra_args: {' '.join(o.words)} from {layer(o.layer)}"
        if o.dropped_by is None
        else f"engine.extra_args: {' '.join(o.words)} from {layer(o.layer)} is dropped by {layer(o.dropped_by)}'s engine.drop_args"
        for o in loaded.arg_origins
    ]


def _rank_value(p: Profile, knob: Knob, rank: int) -> str:
    node = p.nodes[rank]
    match knob.rank_value:
        case "node_rank":
            return str(rank)
        case "node_ip":
            return node.ip
        case "gid_index":
            return str(node.gid_index if node.gid_index is not None else p.fabric.gid_index)
        case "nnodes":
            return str(len(p.nodes))
        case "dist_init_addr":
            # an IPv6 head in brackets: SGLang reads "[v6]:port" (configure_ipv6) and splits anything
            # else on ':' (sgl-project/sglang python/sglang/srt/utils.py at 4ebfeba)
            return netaddr.host_port(p.cluster.head.ip, p.cluster.dist_port)
    raise AssertionError(f"knob {knob.env}: no rank value")


def _render_env(p: Profile, rank: int, reg: Registry, gates: dict[str, str]) -> dict[str, str]:
    """One rank's environment: the field knobs and line facts in the launcher's order, the
    forwarded gates at their defaults, then [gates] and [env] (a key already present is replaced
    in place, a new one appended: EXTRA_CONTAINER_ENV semantics), then the per-rank keys."""
    env: dict[str, str] = {}
    per_rank: list[Knob] = []
    for knob in KNOBS:
        if knob.head_only and rank > 0:
            continue
        if knob.source == "field":
            value = knob.worker_value if rank > 0 and knob.worker_value is not None else _field_value(p, knob, rank)
            if value is not None:
                env[knob.env] = value
        elif knob.source == "rank" and knob.rank_value in ("nnodes", "dist_init_addr"):
            env[knob.env] = _rank_value(p, knob, rank)
        elif knob.source == "rank":
            per_rank.append(knob)
    for gate in reg.forwarded():
        env[gate.var] = gate.default or ""
    for knob in KNOBS:
        if knob.source == "reserved" and knob.form == "fixed" and knob.value is not None:
            env[knob.env] = knob.value
    env.update(gates)
    env.update(p.env)
    for knob in per_rank:
        env[knob.env] = _rank_value(p, knob, rank)
    if rank > 0:
        # workers never prepare, verify or smoke, whatever [gates] or [env] say
        env.update({k.env: k.worker_value for k in KNOBS if k.worker_value is not None})
        for knob in KNOBS:
            if knob.head_only:
                env.pop(knob.env, None)
    return env


def _flag(env_key: str) -> str:
    flag = BY_ENV[env_key].flag
    assert flag is not None, env_key
    return flag


def engine_argv(env: dict[str, str], *, sps: bool, sts: bool) -> tuple[str, ...]:
    """The engine command boot.py builds from a rank's environment, without --api-key (boot.py
    adds it from the key file). Each flag is the knob's (tp4.line.knobs); defaults are boot.py's."""
    g = env.get

    def opt(key: str, default: str = "") -> list[str]:
        return [_flag(key), g(key, default)]

    argv = [
        "python",
        "-m",
        "sglang.launch_server",
        *opt("MODEL_PATH", MOUNTS.model),
        *opt("SERVED_MODEL_NAME", "deepseek-v4.1-flash"),
        "--trust-remote-code",
        "--load-format",
        "safetensors",
        *opt("TP_SIZE", "4"),
        _flag("EP_SIZE"),
        g("EP_SIZE", g("TP_SIZE", "4")),
        *opt("ATTENTION_BACKEND", BOOT_DEFAULTS["ATTENTION_BACKEND"]),
        *opt("MOE_RUNNER_BACKEND", BOOT_DEFAULTS["MOE_RUNNER_BACKEND"]),
        *opt("MEM_FRACTION_STATIC"),
        *opt("CHUNKED_PREFILL_SIZE"),
        *opt("CONTEXT_LENGTH"),
        *opt("MAX_RUNNING_REQUESTS"),
        *opt("CUDA_GRAPH_MAX_BS_DECODE"),
        "--random-seed",
        "0",
        "--enable-decoder-swa-bounded-replay",
        "--tool-call-parser",
        "deepseekv41",
        "--reasoning-parser",
        "deepseek-v41",
        *opt("HOST", "0.0.0.0"),
        *opt("SERVER_PORT", "8888"),
    ]
    if g("SPEC_ALGO", "").lower() not in ("off", "none", "0", ""):
        argv += ["--speculative-algorithm", "DSPARK", *opt("DSPARK_BLOCK_SIZE")]
        if sps:
            argv += [*opt("DSPARK_SPS_TABLE"), "--speculative-dspark-align-verify-tokens-to-graph-tier"]
        if sts:
            argv += opt("DSPARK_STS_TABLE")
    if int(g("NNODES", "1")) > 1:
        argv += [*opt("NNODES"), *opt("NODE_RANK", "0"), *opt("DIST_INIT_ADDR")]
    if g("MAX_TOTAL_TOKENS", "") not in ("", "0"):
        argv += opt("MAX_TOTAL_TOKENS")
    argv += g("EXTRA_SGLANG_ARGS", "").split()
    return tuple(argv)


def run_spec(p: Profile, rank: int) -> RunSpec:
    node = p.nodes[rank]
    cl = p.cluster
    home = home_of(node, cl)
    workdir = expand(node.workdir, home)
    if rank == 0:
        state = expand(node.state_dir or f"{workdir}/state-tp4", home)
        engram = expand(node.engram_dir or "~/dsv41-engram", home)
        model = Mount("bind", expand(p.model.dir, home), MOUNTS.model, False)
    else:
        state = expand(node.state_dir or f"{workdir}/state", home)
        engram = expand(node.engram_dir or f"{workdir}/engram", home)
        model = Mount("volume", p.nfs.volume, MOUNTS.model, True)
    mounts = [
        model,
        Mount("bind", state, MOUNTS.state, False),
        Mount("bind", f"{home}/.cache", MOUNTS.cache, False),
        Mount("bind", engram, MOUNTS.engram, False),
    ]
    nccl = p.fabric.nccl
    nccl_dir = expand(nccl.worker_dir if rank > 0 and nccl.worker_dir else nccl.host_dir, home)
    if nccl.mount == "dir":
        mounts.append(Mount("bind", nccl_dir, MOUNTS.nccl, True))
    elif nccl.mount == "overlay":
        mounts.append(Mount("bind", f"{nccl_dir}/libnccl.so.2", nccl.pip_so, True))
    return RunSpec(
        container=cl.head_container if rank == 0 else cl.worker_container,
        image=p.image.tag,
        command=("run",),
        network="host",
        ipc="host",
        privileged=True,
        cap_add=("IPC_LOCK",),
        gpus="all",
        shm_size=cl.shm_size,
        ulimits=Ulimits(memlock=cl.memlock, stack="67108864"),
        devices=("/dev/infiniband:/dev/infiniband",),
        mounts=tuple(mounts),
        restart="no",
        workdir=workdir,
        health=HEALTH,
    )


# where a NixOS host's rank unit reads its environment (the NixOS module's oci-containers
# environmentFiles): a tmpfs only root reads
NIXOS_ENV_DIR = "/run/tp4"
# the unit that brings a ring's mesh up, by kind of host: upstream's host setup (sparkring's
# mesh-up script as dsv41-mesh.service) and modules/spark-host.nix's
MESH_UNITS: dict[str, str] = {"plain": "dsv41-mesh.service", "nixos": "tp4-mesh.service"}
# the units modules/spark-host.nix and modules/tp4-line.nix declare under these names
RDMA_CHECK_UNIT = "tp4-rdma-check.service"
WEIGHTS_VOLUME_UNIT = "tp4-weights-volume.service"
READY_UNIT = "tp4-rank-ready.service"


# a NixOS rank's readiness takes the sum of the boot phases' bounds (BOOT_TIMEOUTS) up to its last one
HEAD_READY_PHASES = ("start", "weights", "graphs", "smoke", "warmup", "ready")
WORKER_READY_PHASES = ("start", "weights")
# SGLang's model runner on every rank once the weights are loaded (a worker prints no Ready)
WORKER_READY = r"Load weight end\."
NFS_PORT = 2049
# upstream files/nfs-share.sh's export (without fsid=0: the path itself is exported) and client
# options; tp4 share and the NixOS hosts both read them from the plan
NFS_EXPORT_OPTIONS = ("ro", "sync", "no_subtree_check", "no_root_squash", "insecure")
NFS_MOUNT_OPTIONS = ("nfsvers=4.2", "ro", "nconnect=8", "rsize=1048576", "wsize=1048576", "hard", "timeo=600")


def readiness(p: Profile, rank: int) -> Readiness:
    if rank == 0:
        return Readiness(
            pattern=rf"^Ready: API on port {p.cluster.port}(?![0-9])",
            timeout=int(sum(BOOT_TIMEOUTS[k] for k in HEAD_READY_PHASES)),
            required_lines=True,
        )
    return Readiness(
        pattern=WORKER_READY, timeout=int(sum(BOOT_TIMEOUTS[k] for k in WORKER_READY_PHASES)), required_lines=False
    )


def host_dirs(run: RunSpec, user: str, env_file: str, kind: HostKind) -> tuple[HostDir, ...]:
    binds = [
        HostDir(m.source, user, "0755")
        for m in run.mounts
        if m.type == "bind" and not m.read_only and m.target != MOUNTS.model
    ]
    own = [HostDir(env_file.rsplit("/", 1)[0], "root", "0700")] if kind == "nixos" else []
    return tuple(binds + own)


def service(p: Profile, rank: int, run: RunSpec | None = None) -> Service:
    node = p.nodes[rank]
    run = run or run_spec(p, rank)
    container = p.cluster.head_container if rank == 0 else p.cluster.worker_container
    mesh = MESH_UNITS[node.kind] if p.fabric.mode == "ring" else None
    user = user_of(node, p.cluster)
    gpus = PODMAN_GPU_DEVICES if node.runtime == "podman" else ()
    if node.kind == "nixos":
        # virtualisation.oci-containers names the unit of container C `<backend>-C.service`
        env_file = f"{NIXOS_ENV_DIR}/{container}.env"
        return Service(
            kind="nixos",
            runtime=node.runtime,
            unit=f"{node.runtime}-{container}.service",
            env_file=env_file,
            mesh_unit=mesh,
            ready=readiness(p, rank),
            directories=host_dirs(run, user, env_file, "nixos"),
            gpu_devices=gpus,
            host_units=HostUnits(
                rdma_check=RDMA_CHECK_UNIT, weights_volume=WEIGHTS_VOLUME_UNIT if rank > 0 else None, ready=READY_UNIT
            ),
        )
    workdir = expand(node.workdir, home_of(node, p.cluster))
    env_file = f"{workdir}/{container}.env"
    return Service(
        kind="plain",
        runtime=node.runtime,
        unit=None,
        env_file=env_file,
        mesh_unit=mesh,
        ready=readiness(p, rank),
        directories=host_dirs(run, user, env_file, "plain"),
        gpu_devices=gpus,
        host_units=None,
    )


def line_id(head_ssh_host: str, api_port: int) -> str:
    """A name for the line: its head and API (two profiles of one head share the line)."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", f"{head_ssh_host}-{api_port}")


def nfs_share(p: Profile, head_run: RunSpec) -> NfsShare | None:
    """The head's export to the workers, when the line shares the checkpoint (validation refuses
    nfs.share on a ring, and a bad count of nfs.server_ips)."""
    if not p.nfs.share or p.fabric.mode != "switched" or len(p.nodes) < 2:
        return None
    ips, workers = p.nfs.server_ips, len(p.nodes) - 1
    servers = tuple(ips) * workers if len(ips) == 1 else tuple(ips)
    export = head_run.mounts[0].source
    volumes = tuple(
        VolumeOptions(type="nfs", o=",".join((f"addr={s}", *NFS_MOUNT_OPTIONS)), device=f":{export}") for s in servers
    )
    return NfsShare(
        export=export,
        servers=servers,
        port=NFS_PORT,
        export_options=NFS_EXPORT_OPTIONS,
        mount_options=NFS_MOUNT_OPTIONS,
        volumes=volumes,
    )


# The commands that look a node's RoCE v2 GID index up at start when the profile does not pin it.
GID_LOOKUP_BY = ("tp4 serve", "tp4 doctor")


def gid_index(p: Profile, rank: int) -> GidIndex:
    node = p.nodes[rank]
    where = "cluster.head" if rank == 0 else f"cluster.workers[{rank - 1}]"
    pinned = node.gid_index is not None
    return GidIndex(
        value=node.gid_index if node.gid_index is not None else p.fabric.gid_index,
        pinned_by=f"{where}.gid_index" if pinned else None,
        lookup_by=() if pinned else GID_LOOKUP_BY,
        hcas=tuple(p.fabric.hcas),
    )


def boot_lines(env: dict[str, str], reg: Registry) -> tuple[BootLine, ...]:
    out = []
    for adapter in reg.adapters:
        for bl in adapter.boot:
            if all(condition_holds(c, env, reg) for c in bl.when):
                text = fill_line(bl.line, env)
                out.append(BootLine(adapter=adapter.name, text=text, pattern=line_pattern(text), required=bl.required))
    return tuple(out)


def build_plan(loaded: Loaded, registry: Registry | None = None) -> Plan:
    reg = registry or load_registry()
    p = loaded.profile
    gates, notes = resolve_gates(p, reg)
    nodes = []
    for rank, node in enumerate(p.nodes):
        env = _render_env(p, rank, reg, gates)
        run = run_spec(p, rank)
        nodes.append(
            RankPlan(
                rank=rank,
                role="head" if rank == 0 else "worker",
                name=node.name,
                host=node.ip,
                ssh=SshTarget(
                    host=node.ssh or node.ip,
                    user=user_of(node, p.cluster),
                    identity=node.identity or p.cluster.identity,
                    port=node.ssh_port or 22,
                ),
                env=env,
                argv=engine_argv(env, sps=p.engine.use_sps_table, sts=p.engine.use_sts_table),
                run=run,
                gid=gid_index(p, rank),
                service=service(p, rank, run),
            )
        )
    head_env = nodes[0].env
    return Plan(
        preset=p.preset,
        source=loaded.source,
        image=ImageRef(tag=p.image.tag, variant=p.image.variant, base=p.image.base),
        line=LineFacts(
            nnodes=len(p.nodes),
            tp=p.engine.tp,
            ep=p.ep,
            fabric=p.fabric.mode,
            dist_init_addr=head_env["DIST_INIT_ADDR"],
            api=f"http://{netaddr.host_port(p.cluster.head.ip, p.cluster.port)}",
            gpu_clock_mhz=p.cluster.gpu_clock_mhz or None,
            nccl_sha256=p.fabric.nccl.sha256,
            id=line_id(nodes[0].ssh.host, p.cluster.port),
            api_port=p.cluster.port,
            dist_init_port=p.cluster.dist_port,
            nfs=nfs_share(p, nodes[0].run),
            ring_hairpin_queue=p.fabric.ring_hairpin_queue if p.fabric.mode == "ring" else None,
        ),
        nodes=tuple(nodes),
        boot_lines=boot_lines(head_env, reg),
        forbidden_lines=tuple(reg.forbidden_lines),
        secrets={"API_KEY": SecretRef(file=p.api.key_file)} if p.api.key_file else {},
        warnings=tuple(loaded.warnings),
        notes=(*notes, *arg_notes(loaded)),
    )
