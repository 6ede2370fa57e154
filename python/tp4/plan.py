"""The one renderer: a validated Profile becomes the Plan of the line, per rank the container
environment (upstream-line.md §1.6), the engine argv boot.py runs (§1.8), the container run spec
(§1.5), plus the image and the boot-log lines the armed gates print (§6.1).

serve, doctor, the NixOS unit and the boot-log check read a Plan; none of them derives a flag.
JSON schema (`tp4 plan --json`, version "tp4.plan/1.1"): see docs/plan-schema.md.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from typing import Any

from tp4.profile.models import has_unsafe_chars
from tp4.registry import Registry, condition_holds, fill_line, line_pattern, load_registry

SCHEMA = "tp4.plan/1.1"
MODEL_MOUNT = "/models/DeepSeek-V4.1-Flash"
STATE_MOUNT = "/state"
ENGRAM_MOUNT = "/engram"
NCCL_MOUNT = "/nccl"
# boot.py's own defaults for variables the launcher does not forward.
BOOT_DEFAULTS = {"ATTENTION_BACKEND": "dsv4", "MOE_RUNNER_BACKEND": "flashinfer_mxfp4"}


@dataclass
class RankPlan:
    rank: int
    role: str  # "head" | "worker"
    name: str
    host: str  # the fabric IP
    ssh: dict[str, Any]
    env: dict[str, str]
    argv: list[str]
    run: dict[str, Any]


@dataclass
class Plan:
    preset: str
    source: str
    image: dict[str, str]
    line: dict[str, Any]
    nodes: list[RankPlan]
    boot_lines: list[dict[str, Any]]
    forbidden_lines: list[str]
    secrets: dict[str, Any]
    warnings: list[str] = field(default_factory=list)
    # what the plan renders differently from the profile as written, and why (resolve_gates)
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        return {"schema": SCHEMA, **out}


def _b(v: Any) -> str:
    return str(v)


# Typed fields in the order the launcher forwards them (§1.6): env key -> (field path, value).
# Forwarded adapter gates are added from the registry; rank keys are added per rank.
def _typed(p: Any) -> list[tuple[str, str, Callable[[], str | None]]]:
    e, en, rt, fab, n, cl = p.engine, p.engram, p.runtime, p.fabric, p.fabric.nccl, p.cluster
    ring = fab.mode == "ring"
    return [
        ("OFFLOAD_MODE", "engine.offload_mode", lambda: e.offload_mode),
        ("DSV41_CACHE_GIB", "engram.cache_gib", lambda: _b(en.cache_gib)),
        ("DSV41_IO_THREADS", "engram.io_threads", lambda: _b(en.io_threads)),
        ("DSV41_RESIDENT_SCALES", "engram.resident_scales", lambda: _b(en.resident_scales)),
        ("DSV41_CACHE_WAYS", "engram.cache_ways", lambda: _b(en.cache_ways)),
        ("DSV41_STATS_SECONDS", "engram.stats_seconds", lambda: _b(en.stats_seconds)),
        ("DSV41_PACKED_DIR", "engram.packed_dir", lambda: en.packed_dir),
        ("DSPARK_SPS_TABLE", "engine.sps_table", lambda: e.sps_table),
        ("DSPARK_STS_TABLE", "engine.sts_table", lambda: e.sts_table),
        ("DSV41_SOURCE", "model", lambda: MODEL_MOUNT),
        ("MODEL_PATH", "model", lambda: MODEL_MOUNT),
        ("STATE_PATH", "cluster.*.state_dir", lambda: STATE_MOUNT),
        ("SERVER_PORT", "cluster.port", lambda: _b(cl.port)),
        ("TP_SIZE", "engine.tp", lambda: _b(e.tp)),
        ("EP_SIZE", "engine.ep", lambda: _b(p.ep)),
        ("CONTEXT_LENGTH", "engine.context_length", lambda: _b(e.context_length)),
        ("MEM_FRACTION_STATIC", "engine.mem_fraction_static", lambda: e.mem_fraction_static),
        ("MAX_RUNNING_REQUESTS", "engine.max_running_requests", lambda: _b(e.max_running_requests)),
        ("CHUNKED_PREFILL_SIZE", "engine.chunked_prefill_size", lambda: _b(e.chunked_prefill_size)),
        ("MAX_TOTAL_TOKENS", "engine.max_total_tokens", lambda: _b(e.max_total_tokens)),
        ("CUDA_GRAPH_MAX_BS_DECODE", "engine.max_running_requests", lambda: _b(e.max_running_requests)),
        ("SPEC_ALGO", "engine.spec_algo", lambda: e.spec_algo),
        ("DSPARK_BLOCK_SIZE", "engine.dspark_block_size", lambda: _b(e.dspark_block_size)),
        ("ATTENTION_BACKEND", "engine.attention_backend",
         lambda: None if e.attention_backend == BOOT_DEFAULTS["ATTENTION_BACKEND"] else e.attention_backend),
        ("MOE_RUNNER_BACKEND", "engine.moe_runner_backend",
         lambda: None if e.moe_runner_backend == BOOT_DEFAULTS["MOE_RUNNER_BACKEND"] else e.moe_runner_backend),
        ("SERVED_MODEL_NAME", "model.served_name", lambda: p.model.served_name),
        ("SKIP_PREPARE", "runtime.skip_prepare", lambda: _b(rt.skip_prepare)),
        ("SKIP_VERIFY", "runtime.skip_verify", lambda: _b(rt.skip_verify)),
        ("WARMUP", "runtime.warmup", lambda: _b(rt.warmup)),
        ("HOST", "engine.host", lambda: e.host),
        ("NCCL_NET", "fabric.nccl.net", lambda: n.net),
        ("NCCL_IB_DISABLE", "fabric.nccl.ib_disable", lambda: _b(n.ib_disable)),
        ("NCCL_IB_HCA", "fabric.hcas", lambda: ",".join(fab.hcas)),
        ("NCCL_SOCKET_IFNAME", "fabric.socket_ifname", lambda: fab.socket_ifname),
        ("GLOO_SOCKET_IFNAME", "fabric.socket_ifname", lambda: fab.socket_ifname),
        ("NCCL_P2P_DISABLE", "fabric.nccl.p2p_disable", lambda: _b(n.p2p_disable)),
        ("NCCL_SHM_DISABLE", "fabric.nccl.shm_disable", lambda: _b(n.shm_disable)),
        ("NCCL_CROSS_NIC", "fabric.nccl.cross_nic", lambda: _b(n.cross_nic)),
        ("NCCL_IB_MERGE_NICS", "fabric.nccl.ib_merge_nics", lambda: _b(n.ib_merge_nics)),
        ("NCCL_IB_SUBNET_AWARE_ROUTING", "fabric.nccl.ib_subnet_aware_routing", lambda: _b(n.ib_subnet_aware_routing)),
        ("NCCL_CUMEM_ENABLE", "fabric.nccl", lambda: "0"),
        ("NCCL_DEBUG", "fabric.nccl.debug", lambda: n.debug),
        ("NCCL_BUFFSIZE", "fabric.nccl.buffsize", lambda: _b(n.buffsize)),
        ("NCCL_LL128_BUFFSIZE", "fabric.nccl.ll128_buffsize", lambda: _b(n.ll128_buffsize)),
        ("NCCL_PROTO", "fabric.nccl.proto", lambda: n.proto),
        ("NCCL_MAX_NCHANNELS", "fabric.nccl.max_nchannels", lambda: _b(n.max_nchannels)),
        ("NCCL_DEBUG_SUBSYS", "fabric.nccl.debug_subsys", lambda: n.debug_subsys),
        ("SGLANG_FLASHINFER_MOE_FUSED_FINALIZE", "runtime.moe_fused_finalize", lambda: _b(rt.moe_fused_finalize)),
        ("PYTORCH_CUDA_ALLOC_CONF", "runtime.pytorch_cuda_alloc_conf", lambda: rt.pytorch_cuda_alloc_conf),
        ("CUDA_DEVICE_ORDER", "runtime", lambda: "PCI_BUS_ID"),
        ("EXTRA_SGLANG_ARGS", "engine.extra_args", lambda: " ".join(e.extra_args) or None),
        ("LD_LIBRARY_PATH", "fabric.nccl.mount", lambda: NCCL_MOUNT if n.mount == "dir" else None),
        ("NCCL_SWITCHLESS_RING_ONLY", "fabric.mode", lambda: "1" if ring else None),
        ("NCCL_ALGO", "fabric.nccl.algo", lambda: n.algo if ring else None),
        ("NCCL_SKIP_TREE_CONNECT", "fabric.nccl.skip_tree_connect", lambda: _b(n.skip_tree_connect) if ring else None),
        ("NCCL_IB_SUBNET_PREFIX_LEN", "fabric.nccl.ib_subnet_prefix_len", lambda: _b(n.ib_subnet_prefix_len) if ring else None),
        ("NCCL_MIN_NCHANNELS", "fabric.nccl.min_nchannels", lambda: _b(n.min_nchannels) if ring else None),
        ("NCCL_P2P_LEVEL", "fabric.nccl.p2p_level", lambda: n.p2p_level if ring else None),
        ("SKIP_SMOKE", "runtime.skip_smoke", lambda: _b(rt.skip_smoke)),
        ("SMOKE_QUICK", "runtime.smoke_quick", lambda: _b(rt.smoke_quick)),
    ]


_TYPED_KEYS: dict[str, str] | None = None


def typed_env_keys() -> dict[str, str]:
    """Env keys rendered from typed profile fields -> the field that sets them."""
    global _TYPED_KEYS
    if _TYPED_KEYS is None:
        from tp4.profile.models import Profile

        _TYPED_KEYS = {key: path for key, path, _ in _typed(Profile())}
        _TYPED_KEYS.update({"NODE_RANK": "cluster.workers", "DIST_INIT_ADDR": "cluster.dist_port", "NNODES": "cluster.workers"})
    return _TYPED_KEYS


HEAD_ONLY = ("WARMUP", "SMOKE_QUICK")
# Worker-forced values (§1.6): workers never prepare, verify or smoke.
WORKER_FORCED = {"SKIP_PREPARE": "1", "SKIP_VERIFY": "1", "SKIP_SMOKE": "1"}


def home_of(node: Any, cluster: Any) -> str:
    if node.home:
        return node.home
    user = node.user or cluster.user
    return "/root" if user == "root" else f"/home/{user}"


def expand(path: str, home: str) -> str:
    if path == "~":
        return home
    if path.startswith("~/"):
        return home + path[1:]
    return path


@lru_cache(maxsize=None)
def _preset_gates(name: str) -> tuple[tuple[str, str], ...]:
    from tp4.profile.load import merged_document

    return tuple(merged_document({"preset": name}).get("gates", {}).items())


def resolve_gates(p: Any, reg: Registry) -> tuple[dict[str, str], list[str]]:
    """The profile's gates as the line runs them, and a note for each gate the preset set that
    does not apply as set. Rolling a layer back is one change (seed "Rollback"): a gate the preset
    sets whose needed gate the profile turns off is dropped, since upstream's adapter does nothing
    without it; a preset gate that fails a registry rule with `follow` takes the followed value.
    A gate counts as the preset's when the profile document does not set it (or, for a profile
    not read by the loader, when it has the preset's value); one the profile sets itself is kept,
    and the validator reports what it needs."""
    preset = dict(_preset_gates(p.preset))
    gates = dict(p.gates)
    own = p._own_gates
    from_preset = {k for k, v in gates.items()
                   if k in preset and (k not in own if own is not None else preset[k] == v)}
    turned_off = {k for k, v in gates.items()
                  if k not in from_preset and (g := reg.gate(k)) is not None and not g.is_on(v)}
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
                notes.append(f"gates.{key}: the preset's {key}={gates.pop(key)} is dropped: it needs {cause}, and {why}")
                dropped.add(key)
                changed = True
    env = _render_env(p, 0, reg, gates)
    for rule in reg.rules_for(gates):
        key = rule.field.removeprefix("gates.")
        if rule.follow is None or key not in from_preset or key not in gates:
            continue
        if rule.fails(env, reg):
            value = fill_line(rule.follow, env)
            notes.append(f"gates.{key}: the preset's {key}={gates[key]} {fill_line(rule.reason, env)}; the plan sets {value}")
            gates[key] = value
            env = _render_env(p, 0, reg, gates)
    return gates, notes


def rank_env(p: Any, rank: int, reg: Registry) -> dict[str, str]:
    return _render_env(p, rank, reg, resolve_gates(p, reg)[0])


def _render_env(p: Any, rank: int, reg: Registry, gates: dict[str, str]) -> dict[str, str]:
    node = p.nodes[rank]
    head = p.cluster.head
    env: dict[str, str] = {}
    for key, _, value in _typed(p):
        v = value()
        if v is not None:
            env[key] = v
    env["NNODES"] = str(len(p.nodes))
    env["DIST_INIT_ADDR"] = f"{head.ip}:{p.cluster.dist_port}"
    if rank == 0 and p.engine.head_mem_fraction_static is not None:
        env["MEM_FRACTION_STATIC"] = p.engine.head_mem_fraction_static
    for gate in reg.forwarded():
        env[gate.var] = gate.default or ""
    env["DSV41_LAUNCHER"] = "tp4"
    # EXTRA_CONTAINER_ENV semantics: a key already present is replaced in place, a new one appended.
    for key, value in gates.items():
        env[key] = value
    for key, value in p.env.items():
        env[key] = value
    env["VLLM_HOST_IP"] = node.ip
    env["HOST_IP"] = node.ip
    env["NCCL_IB_GID_INDEX"] = str(node.gid_index if node.gid_index is not None else p.fabric.gid_index)
    env["NODE_RANK"] = str(rank)
    if rank > 0:
        for key in HEAD_ONLY:
            env.pop(key, None)
        env.update(WORKER_FORCED)
    return env


def engine_argv(env: dict[str, str], *, sps: bool, sts: bool) -> list[str]:
    """The engine command boot.py builds from a rank's environment (§1.8), without --api-key."""
    g = env.get
    argv = [
        "python", "-m", "sglang.launch_server",
        "--model-path", g("MODEL_PATH", MODEL_MOUNT),
        "--served-model-name", g("SERVED_MODEL_NAME", "deepseek-v4.1-flash"),
        "--trust-remote-code", "--load-format", "safetensors",
        "--tp", g("TP_SIZE", "4"), "--ep-size", g("EP_SIZE", g("TP_SIZE", "4")),
        "--attention-backend", g("ATTENTION_BACKEND", BOOT_DEFAULTS["ATTENTION_BACKEND"]),
        "--moe-runner-backend", g("MOE_RUNNER_BACKEND", BOOT_DEFAULTS["MOE_RUNNER_BACKEND"]),
        "--mem-fraction-static", g("MEM_FRACTION_STATIC", ""),
        "--chunked-prefill-size", g("CHUNKED_PREFILL_SIZE", ""),
        "--context-length", g("CONTEXT_LENGTH", ""),
        "--max-running-requests", g("MAX_RUNNING_REQUESTS", ""),
        "--cuda-graph-max-bs-decode", g("CUDA_GRAPH_MAX_BS_DECODE", ""),
        "--random-seed", "0", "--enable-decoder-swa-bounded-replay",
        "--tool-call-parser", "deepseekv41", "--reasoning-parser", "deepseek-v41",
        "--host", g("HOST", "0.0.0.0"), "--port", g("SERVER_PORT", "8888"),
    ]
    if g("SPEC_ALGO", "").lower() not in ("off", "none", "0", ""):
        argv += ["--speculative-algorithm", "DSPARK", "--speculative-dspark-block-size", g("DSPARK_BLOCK_SIZE", "")]
        if sps:
            argv += ["--speculative-dspark-sps-table-path", g("DSPARK_SPS_TABLE", ""),
                     "--speculative-dspark-align-verify-tokens-to-graph-tier"]
        if sts:
            argv += ["--speculative-dspark-confidence-sts-path", g("DSPARK_STS_TABLE", "")]
    if int(g("NNODES", "1")) > 1:
        argv += ["--nnodes", g("NNODES"), "--node-rank", g("NODE_RANK", "0"), "--dist-init-addr", g("DIST_INIT_ADDR", "")]
    if g("MAX_TOTAL_TOKENS", "") not in ("", "0"):
        argv += ["--max-total-tokens", g("MAX_TOTAL_TOKENS")]
    argv += g("EXTRA_SGLANG_ARGS", "").split()
    return argv


def run_spec(p: Any, rank: int) -> dict[str, Any]:
    node = p.nodes[rank]
    cl = p.cluster
    home = home_of(node, cl)
    workdir = expand(node.workdir, home)
    if rank == 0:
        state = expand(node.state_dir or f"{workdir}/state-tp4", home)
        engram = expand(node.engram_dir or "~/dsv41-engram", home)
        model = {"type": "bind", "source": expand(p.model.dir, home), "target": MODEL_MOUNT, "read_only": False}
    else:
        state = expand(node.state_dir or f"{workdir}/state", home)
        engram = expand(node.engram_dir or f"{workdir}/engram", home)
        model = {"type": "volume", "source": p.nfs.volume, "target": MODEL_MOUNT, "read_only": True}
    mounts = [
        model,
        {"type": "bind", "source": state, "target": STATE_MOUNT, "read_only": False},
        {"type": "bind", "source": f"{home}/.cache", "target": "/root/.cache", "read_only": False},
        {"type": "bind", "source": engram, "target": ENGRAM_MOUNT, "read_only": False},
    ]
    nccl = p.fabric.nccl
    nccl_dir = expand(nccl.worker_dir if rank > 0 and nccl.worker_dir else nccl.host_dir, home)
    if nccl.mount == "dir":
        mounts.append({"type": "bind", "source": nccl_dir, "target": NCCL_MOUNT, "read_only": True})
    elif nccl.mount == "overlay":
        mounts.append({"type": "bind", "source": f"{nccl_dir}/libnccl.so.2", "target": nccl.pip_so, "read_only": True})
    return {
        "container": cl.head_container if rank == 0 else cl.worker_container,
        "image": p.image.tag,
        "command": ["run"],
        "network": "host",
        "ipc": "host",
        "privileged": True,
        "cap_add": ["IPC_LOCK"],
        "gpus": "all",
        "shm_size": cl.shm_size,
        "ulimits": {"memlock": "-1:-1", "stack": "67108864"},
        "devices": ["/dev/infiniband:/dev/infiniband"],
        "mounts": mounts,
        "restart": "no",
        "workdir": workdir,
    }


def boot_lines(env: dict[str, str], reg: Registry) -> list[dict[str, Any]]:
    out = []
    for adapter in reg.adapters:
        for bl in adapter.boot:
            if all(condition_holds(c, env, reg) for c in bl.when):
                text = fill_line(bl.line, env)
                out.append({"adapter": adapter.name, "text": text, "pattern": line_pattern(text), "required": bl.required})
    return out


def build_plan(loaded: Any, registry: Registry | None = None) -> Plan:
    reg = registry or load_registry()
    p = loaded.profile
    gates, notes = resolve_gates(p, reg)
    nodes = []
    for rank, node in enumerate(p.nodes):
        env = _render_env(p, rank, reg, gates)
        nodes.append(RankPlan(
            rank=rank,
            role="head" if rank == 0 else "worker",
            name=node.name,
            host=node.ip,
            ssh={"host": node.ssh or node.ip, "user": node.user or p.cluster.user,
                 "identity": node.identity or p.cluster.identity, "port": node.ssh_port or 22},
            env=env,
            argv=engine_argv(env, sps=p.engine.use_sps_table, sts=p.engine.use_sts_table),
            run=run_spec(p, rank),
        ))
    head_env = nodes[0].env
    return Plan(
        preset=p.preset,
        source=loaded.source,
        image={"tag": p.image.tag, "variant": p.image.variant, "base": p.image.base},
        line={"nnodes": len(p.nodes), "tp": p.engine.tp, "ep": p.ep, "fabric": p.fabric.mode,
              "dist_init_addr": head_env["DIST_INIT_ADDR"], "api": f"http://{p.cluster.head.ip}:{p.cluster.port}"},
        nodes=nodes,
        boot_lines=boot_lines(head_env, reg),
        forbidden_lines=list(reg.forbidden_lines),
        secrets={"API_KEY": {"file": p.api.key_file}} if p.api.key_file else {},
        warnings=list(loaded.warnings),
        notes=notes,
    )


_ENV_LINE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


def env_file_text(env: dict[str, str]) -> str:
    """A container env file (`--env-file`): one KEY=VALUE per line, taken verbatim."""
    lines = []
    for key, value in env.items():
        line = f"{key}={value}"
        if not _ENV_LINE.match(line) or has_unsafe_chars(value):
            raise ValueError(f"{key}: cannot be written to an env file")
        lines.append(line)
    return "\n".join(lines) + "\n"
