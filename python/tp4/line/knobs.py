"""The knob table: one row per environment key the line renders into a rank's container, saying
where its value comes from (a profile field, a fixed value, or the rank), which ranks get it,
whether it is ring-only, whether upstream's launcher forwards it, the engine flag boot.py turns
it into, and how `tp4 profile import` converts an upstream value of it. The renderer
(tp4.line.plan), the validator (owned flags and keys, tp4.line.profile.validate), the importer
(tp4.line.profile.legacy) and the generated reference (docs/plan-schema.md) all read this table:
adding a knob is one row. Adapter gates are not here: adapters/registry.toml holds those.

The second table, LAUNCHER_VARS, holds the upstream launcher's own variables that set a profile
field without being a container key (HEAD_IP, MODEL_DIR, ...): the importer reads it.

Pure data, as NamedTuples (a dataclass costs a millisecond to define, and tp4 plan's start-up
budget is 150 ms).
"""

from __future__ import annotations

from typing import Literal, NamedTuple

from tp4.line.container import MOUNTS

# How a field's value becomes the env value: str(value), items joined with ',' or ' ' (nothing
# when the list is empty), or the knob's fixed `value`.
Form = Literal["text", "comma", "words", "fixed"]
# Where the value comes from: a profile field (before [gates] and [env], which may replace it in
# place), or the rank (after them: never settable), or nowhere tp4 renders (a reserved key).
Source = Literal["field", "rank", "reserved"]
# The importer's conversion of an upstream value (tp4.line.profile.legacy maps each name to a
# function: "path" is a host path written ~/... under WORKER_USER's home, "hcas" RDMA device names
# separated by ',', "ticks" upstream's count of 10-second waits); None: the importer does not take
# the key as a field value.
Imports = Literal["text", "int", "bit", "fraction", "path", "words", "hcas", "args", "spec", "tokens", "ticks", "fixed"]
# The rank-derived values the renderer computes.
RankValue = Literal["node_rank", "node_ip", "gid_index", "nnodes", "dist_init_addr"]


class Knob(NamedTuple):
    env: str
    # the profile field the value comes from (dotted, as a user writes it); for a fixed or rank
    # value, the field a user changes instead
    field: str
    source: Source = "field"
    form: Form = "text"
    # the value of a fixed knob, or what a rank knob computes
    value: str | None = None
    rank_value: RankValue | None = None
    # read this attribute path of the profile instead of `field` (a derived property)
    read: str | None = None
    # on the head, this field's value when it is set (HEAD_MEM_FRACTION_STATIC)
    head_field: str | None = None
    # rendered only when `when_field` has the value `when_equals`
    when_field: str | None = None
    when_equals: str | None = None
    # left out when the value equals boot.py's own default for it (the launcher never passes it)
    omit_if: str | None = None
    ring_only: bool = False
    head_only: bool = False
    # workers always get this value, whatever the profile says
    worker_value: str | None = None
    # upstream's launcher forwards this key itself (False: boot.py's default, or EXTRA_CONTAINER_ENV only)
    launcher: bool = True
    # the engine flag boot.py builds from it, and other spellings of that flag
    flag: str | None = None
    aliases: tuple[str, ...] = ()
    imports: Imports | None = "text"
    # for keys a user cannot set through [gates] or [env]: what to set instead
    fix: str | None = None

    @property
    def owner(self) -> str:
        """What a user sets to change this key: the fix for a rank/reserved key, else the field."""
        return self.fix or self.field


_M = MOUNTS

# In the order the launcher forwards them (upstream start.sh's docker run), then the line facts,
# then the per-rank keys.
KNOBS: tuple[Knob, ...] = (
    Knob("OFFLOAD_MODE", "engine.offload_mode"),
    Knob("DSV41_CACHE_GIB", "engram.cache_gib", imports="int"),
    Knob("DSV41_IO_THREADS", "engram.io_threads", imports="int"),
    Knob("DSV41_RESIDENT_SCALES", "engram.resident_scales", imports="bit"),
    Knob("DSV41_CACHE_WAYS", "engram.cache_ways", imports="int"),
    Knob("DSV41_STATS_SECONDS", "engram.stats_seconds", imports="int"),
    Knob("DSV41_PACKED_DIR", "engram.packed_dir"),
    Knob("DSPARK_SPS_TABLE", "engine.sps_table", flag="--speculative-dspark-sps-table-path"),
    Knob("DSPARK_STS_TABLE", "engine.sts_table", flag="--speculative-dspark-confidence-sts-path"),
    Knob("DSV41_SOURCE", "model", form="fixed", value=_M.model, imports="fixed"),
    Knob("MODEL_PATH", "model", form="fixed", value=_M.model, flag="--model-path", imports="fixed"),
    Knob("STATE_PATH", "cluster.head.state_dir", form="fixed", value=_M.state, imports="fixed"),
    Knob("SERVER_PORT", "cluster.port", flag="--port", imports="int"),
    Knob("TP_SIZE", "engine.tp", flag="--tp", aliases=("--tp-size",), imports="int"),
    Knob("EP_SIZE", "engine.ep", read="ep", flag="--ep-size", aliases=("--ep",), imports="int"),
    Knob("CONTEXT_LENGTH", "engine.context_length", flag="--context-length", imports="int"),
    Knob(
        "MEM_FRACTION_STATIC",
        "engine.mem_fraction_static",
        head_field="engine.head_mem_fraction_static",
        flag="--mem-fraction-static",
        imports="fraction",
    ),
    Knob("MAX_RUNNING_REQUESTS", "engine.max_running_requests", flag="--max-running-requests", imports="int"),
    Knob("CHUNKED_PREFILL_SIZE", "engine.chunked_prefill_size", flag="--chunked-prefill-size", imports="int"),
    Knob("MAX_TOTAL_TOKENS", "engine.max_total_tokens", flag="--max-total-tokens", imports="tokens"),
    Knob("CUDA_GRAPH_MAX_BS_DECODE", "engine.max_running_requests", flag="--cuda-graph-max-bs-decode", imports=None),
    Knob("SPEC_ALGO", "engine.spec_algo", flag="--speculative-algorithm", imports="spec"),
    Knob("DSPARK_BLOCK_SIZE", "engine.dspark_block_size", flag="--speculative-dspark-block-size", imports="int"),
    Knob("ATTENTION_BACKEND", "engine.attention_backend", omit_if="dsv4", launcher=False, flag="--attention-backend"),
    Knob(
        "MOE_RUNNER_BACKEND",
        "engine.moe_runner_backend",
        omit_if="flashinfer_mxfp4",
        launcher=False,
        flag="--moe-runner-backend",
    ),
    Knob("SERVED_MODEL_NAME", "model.served_name", flag="--served-model-name"),
    Knob("SKIP_PREPARE", "runtime.skip_prepare", worker_value="1", imports="bit"),
    Knob("SKIP_VERIFY", "runtime.skip_verify", worker_value="1", imports="bit"),
    Knob("WARMUP", "runtime.warmup", head_only=True, imports="bit"),
    Knob("HOST", "engine.host", flag="--host"),
    Knob("NCCL_NET", "fabric.nccl.net"),
    Knob("NCCL_IB_DISABLE", "fabric.nccl.ib_disable", imports="bit"),
    Knob("NCCL_IB_HCA", "fabric.hcas", form="comma", imports="hcas"),
    # the importer takes fabric.socket_ifname from these two together (tp4.line.profile.legacy)
    Knob("NCCL_SOCKET_IFNAME", "fabric.socket_ifname", imports=None),
    Knob("GLOO_SOCKET_IFNAME", "fabric.socket_ifname", imports=None),
    Knob("NCCL_P2P_DISABLE", "fabric.nccl.p2p_disable", imports="bit"),
    Knob("NCCL_SHM_DISABLE", "fabric.nccl.shm_disable", imports="bit"),
    Knob("NCCL_CROSS_NIC", "fabric.nccl.cross_nic", imports="int"),
    Knob("NCCL_IB_MERGE_NICS", "fabric.nccl.ib_merge_nics", imports="bit"),
    Knob("NCCL_IB_SUBNET_AWARE_ROUTING", "fabric.nccl.ib_subnet_aware_routing", imports="bit"),
    Knob("NCCL_CUMEM_ENABLE", "fabric.nccl", form="fixed", value="0", imports="fixed"),
    Knob("NCCL_DEBUG", "fabric.nccl.debug"),
    Knob("NCCL_BUFFSIZE", "fabric.nccl.buffsize", imports="int"),
    Knob("NCCL_LL128_BUFFSIZE", "fabric.nccl.ll128_buffsize", imports="int"),
    Knob("NCCL_PROTO", "fabric.nccl.proto"),
    Knob("NCCL_MAX_NCHANNELS", "fabric.nccl.max_nchannels", imports="int"),
    Knob("NCCL_DEBUG_SUBSYS", "fabric.nccl.debug_subsys"),
    Knob("SGLANG_FLASHINFER_MOE_FUSED_FINALIZE", "runtime.moe_fused_finalize", imports="bit"),
    Knob("PYTORCH_CUDA_ALLOC_CONF", "runtime.pytorch_cuda_alloc_conf"),
    Knob("CUDA_DEVICE_ORDER", "runtime", form="fixed", value="PCI_BUS_ID", imports="fixed"),
    Knob("EXTRA_SGLANG_ARGS", "engine.extra_args", form="words", imports="args"),
    Knob(
        "LD_LIBRARY_PATH",
        "fabric.nccl.mount",
        form="fixed",
        value=_M.nccl,
        when_field="fabric.nccl.mount",
        when_equals="dir",
        imports=None,
    ),
    Knob("NCCL_SWITCHLESS_RING_ONLY", "fabric.mode", form="fixed", value="1", ring_only=True, imports=None),
    Knob("NCCL_ALGO", "fabric.nccl.algo", ring_only=True),
    Knob("NCCL_SKIP_TREE_CONNECT", "fabric.nccl.skip_tree_connect", ring_only=True, imports="bit"),
    Knob("NCCL_IB_SUBNET_PREFIX_LEN", "fabric.nccl.ib_subnet_prefix_len", ring_only=True, imports="int"),
    Knob("NCCL_MIN_NCHANNELS", "fabric.nccl.min_nchannels", ring_only=True, imports="int"),
    Knob("NCCL_P2P_LEVEL", "fabric.nccl.p2p_level", ring_only=True),
    Knob("SKIP_SMOKE", "runtime.skip_smoke", worker_value="1", imports="bit"),
    Knob("SMOKE_QUICK", "runtime.smoke_quick", head_only=True, imports="bit"),
    # line facts, the same on every rank
    Knob(
        "NNODES",
        "cluster.workers",
        source="rank",
        rank_value="nnodes",
        flag="--nnodes",
        imports=None,
        fix="add or remove cluster.workers",
    ),
    Knob(
        "DIST_INIT_ADDR",
        "cluster.dist_port",
        source="rank",
        rank_value="dist_init_addr",
        flag="--dist-init-addr",
        imports=None,
        fix="set cluster.head.ip and cluster.dist_port",
    ),
    # per rank, after [gates] and [env]
    Knob(
        "VLLM_HOST_IP",
        "cluster.head.ip",
        source="rank",
        rank_value="node_ip",
        imports=None,
        fix="set cluster.head.ip / cluster.workers[i].ip",
    ),
    Knob(
        "HOST_IP",
        "cluster.head.ip",
        source="rank",
        rank_value="node_ip",
        imports=None,
        fix="set cluster.head.ip / cluster.workers[i].ip",
    ),
    Knob(
        "NCCL_IB_GID_INDEX",
        "fabric.gid_index",
        source="rank",
        rank_value="gid_index",
        imports="int",
        fix="set fabric.gid_index or cluster.*.gid_index",
    ),
    Knob(
        "NODE_RANK",
        "cluster.workers",
        source="rank",
        rank_value="node_rank",
        flag="--node-rank",
        imports=None,
        fix="the rank follows cluster.workers order",
    ),
    # keys tp4 never renders and no profile may set
    Knob(
        "API_KEY",
        "api.key_file",
        source="reserved",
        flag="--api-key",
        imports=None,
        fix="write the key to a file and set api.key_file",
    ),
    Knob(
        "DSV41_LAUNCHER",
        "image.variant",
        source="reserved",
        form="fixed",
        value="tp4",
        imports="fixed",
        fix="tp4 always runs the TP4 launcher's adapters",
    ),
)

BY_ENV: dict[str, Knob] = {k.env: k for k in KNOBS}

# Keys a profile cannot set through [gates] or [env] (rendered per rank, or reserved) -> the fix.
RANK_KEYS: dict[str, str] = {k.env: k.owner for k in KNOBS if k.source in ("rank", "reserved")}
# Keys rendered from typed profile fields -> the field to set instead.
FIELD_KEYS: dict[str, str] = {k.env: k.field for k in KNOBS if k.source == "field"}


def typed_env_keys() -> dict[str, str]:
    """Env keys rendered from profile fields or per rank -> the field that sets them."""
    return {**FIELD_KEYS, **{k.env: k.field for k in KNOBS if k.source == "rank"}}


# Values the launcher fixes (the importer accepts them only unchanged).
FIXED: dict[str, str] = {k.env: k.value for k in KNOBS if k.form == "fixed" and k.value is not None}


def owned_flags() -> dict[str, str]:
    """Engine flags tp4 renders itself -> the profile field that sets them (never in engine.extra_args)."""
    out: dict[str, str] = {}
    for k in KNOBS:
        for flag in (k.flag, *k.aliases):
            if flag is not None:
                out[flag] = k.field
    return out


class LauncherVar(NamedTuple):
    """An upstream launcher variable that sets a profile field but is not a container key."""

    var: str
    field: str
    imports: Imports = "text"


LAUNCHER_VARS: tuple[LauncherVar, ...] = (
    LauncherVar("HEAD_IP", "cluster.head.ip"),
    LauncherVar("WORKER_USER", "cluster.user"),
    LauncherVar("SSH_IDENTITY", "cluster.identity", "path"),
    LauncherVar("PORT", "cluster.port", "int"),
    LauncherVar("DIST_PORT", "cluster.dist_port", "int"),
    LauncherVar("HEAD_CTN", "cluster.head_container"),
    LauncherVar("WORKER_CTN", "cluster.worker_container"),
    LauncherVar("SHM_SIZE", "cluster.shm_size"),
    LauncherVar("FABRIC_IFACE", "fabric.iface"),
    LauncherVar("IB_HCA", "fabric.hcas", "hcas"),
    LauncherVar("NCCL_HOST_DIR", "fabric.nccl.host_dir", "path"),
    LauncherVar("NCCL_WORKER_DIR", "fabric.nccl.worker_dir"),  # absolute on the workers: stays literal
    LauncherVar("NCCL_PIP_SO", "fabric.nccl.pip_so"),
    LauncherVar("MODEL_DIR", "model.dir", "path"),
    LauncherVar("COMMON_MODEL", "model.common_link", "path"),
    LauncherVar("HF_REPO", "model.hf_repo"),
    LauncherVar("HF_REVISION", "model.hf_revision"),
    LauncherVar("EXPECTED_SHARDS", "model.expected_shards", "int"),
    LauncherVar("NFS_VOLUME", "nfs.volume"),
    LauncherVar("NFS_EXPORT_NAME", "nfs.export_name"),
    LauncherVar("NFS_SERVER_IPS", "nfs.server_ips", "words"),
    LauncherVar("NFS_CLIENTS", "nfs.clients", "words"),
    LauncherVar("IMAGE", "image.tag"),
    LauncherVar("BASE_IMAGE", "image.base"),
    LauncherVar("HEAD_MEM_FRACTION_STATIC", "engine.head_mem_fraction_static", "fraction"),
    LauncherVar("READY_TIMEOUT", "runtime.ready_timeout", "ticks"),
)
