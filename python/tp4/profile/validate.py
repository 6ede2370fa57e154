"""The rules between profile fields (upstream-line.md §1.7, §2.3) and the gate rules of
adapters/registry.toml. Every rule reports the field, the reason and the fix; all problems are
collected so the user sees them at once."""

from __future__ import annotations

from tp4.profile.load import Problem
from tp4.profile.models import Profile
from tp4.registry import Registry, condition_holds, describe_condition, load_registry

EXPERTS = 384
# Per-expert intermediate width of DeepSeek-V4.1-Flash; a rank holds width * ep / tp of each expert.
EXPERT_WIDTH = 2304
# FlashInfer's MXFP4 MoE needs the per-rank width to be a multiple of 128, b12x of 64.
FLASHINFER_ALIGN = 128
B12X_ALIGN = 64
CONTEXT_MIN, CONTEXT_MAX = 4096, 1048576
# RoCEnante's size cap on a ring: 262144 bytes with hairpin queue 8192, 81920 at the default 1024.
RING_CAP_HAIRPIN, RING_CAP_DEFAULT = 262144, 81920

# Environment keys the renderer owns per rank: never settable through [gates] or [env].
RANK_KEYS = {
    "NODE_RANK": "the rank follows cluster.workers order",
    "HOST_IP": "set cluster.head.ip / cluster.workers[i].ip",
    "VLLM_HOST_IP": "set cluster.head.ip / cluster.workers[i].ip",
    "DIST_INIT_ADDR": "set cluster.head.ip and cluster.dist_port",
    "NNODES": "add or remove cluster.workers",
    "NCCL_IB_GID_INDEX": "set fabric.gid_index or cluster.*.gid_index",
    "API_KEY": "write the key to a file and set api.key_file",
    "DSV41_LAUNCHER": "tp4 always runs the TP4 launcher's adapters",
}

# Engine flags the renderer already sets from typed fields: never in engine.extra_args.
OWNED_FLAGS = {
    "--model-path": "model", "--served-model-name": "model.served_name", "--tp": "engine.tp",
    "--tp-size": "engine.tp", "--ep-size": "engine.ep", "--ep": "engine.ep",
    "--attention-backend": "engine.attention_backend", "--moe-runner-backend": "engine.moe_runner_backend",
    "--mem-fraction-static": "engine.mem_fraction_static", "--chunked-prefill-size": "engine.chunked_prefill_size",
    "--context-length": "engine.context_length", "--max-running-requests": "engine.max_running_requests",
    "--cuda-graph-max-bs-decode": "engine.max_running_requests", "--host": "engine.host",
    "--port": "cluster.port", "--speculative-algorithm": "engine.spec_algo",
    "--speculative-dspark-block-size": "engine.dspark_block_size", "--nnodes": "cluster.workers",
    "--node-rank": "cluster.workers", "--dist-init-addr": "cluster.dist_port",
    "--max-total-tokens": "engine.max_total_tokens", "--api-key": "api.key_file",
}


def effective_gates(profile: Profile, registry: Registry) -> dict[str, str]:
    """Gate values as the container sees them: forwarded defaults, then the profile's gates."""
    values = {g.var: g.default for g in registry.forwarded() if g.default is not None}
    values.update(profile.gates)
    return values


def validate(profile: Profile, registry: Registry | None = None) -> tuple[list[Problem], list[Problem]]:
    from tp4.plan import typed_env_keys

    reg = registry or load_registry()
    errors: list[Problem] = []
    warnings: list[Problem] = []
    err = lambda f, r, x="": errors.append(Problem(f, r, x))  # noqa: E731
    warn = lambda f, r, x="": warnings.append(Problem(f, r, x))  # noqa: E731

    eng, cl, fab, nccl = profile.engine, profile.cluster, profile.fabric, profile.fabric.nccl
    tp, ep = eng.tp, profile.ep
    gates = effective_gates(profile, reg)
    image_rank = reg.image_rank(profile.image.variant)

    # --- cluster: one Spark per rank, unique names and addresses ---
    nnodes = len(profile.nodes)
    if nnodes != tp:
        err("cluster.workers", f"{nnodes} nodes (head + {len(cl.workers)} workers) for engine.tp = {tp}; every Spark runs one rank",
            f"list {tp - 1} workers, or set engine.tp = {nnodes}")
    for attr, label in (("name", "name"), ("ip", "fabric IP"), ("ssh", "ssh address")):
        seen: dict[str, str] = {}
        for rank, node in enumerate(profile.nodes):
            value = getattr(node, attr) if attr != "ssh" else (node.ssh or node.ip)
            where = "cluster.head" if rank == 0 else f"cluster.workers[{rank - 1}]"
            if value in seen:
                err(f"{where}.{attr}", f"{label} {value!r} is also used by {seen[value]}", "give every node its own")
            else:
                seen[value] = where
    if cl.port == cl.dist_port:
        err("cluster.dist_port", f"equals cluster.port ({cl.port})", "use distinct ports (upstream: 8888 and 20000)")
    if cl.head_container == cl.worker_container:
        warn("cluster.worker_container", "same name as the head container", "keep them distinct so logs and stop name the role")
    if profile.nfs.share and len(profile.nfs.server_ips) not in (1, len(cl.workers)):
        err("nfs.server_ips", f"{len(profile.nfs.server_ips)} addresses for {len(cl.workers)} workers",
            "give one address for all workers or one per worker, in worker order")

    # --- engine sizes ---
    if not CONTEXT_MIN <= eng.context_length <= CONTEXT_MAX:
        err("engine.context_length", f"{eng.context_length} is outside {CONTEXT_MIN}..{CONTEXT_MAX} (boot.py refuses it)",
            f"set a value from {CONTEXT_MIN} to {CONTEXT_MAX} (the model maximum)")
    if tp % ep != 0 or EXPERTS % ep != 0:
        err("engine.ep", f"EP {ep} must divide engine.tp ({tp}) and the {EXPERTS} experts", "use 1, 2 or 4 at TP4")
    else:
        width = EXPERT_WIDTH * ep // tp
        b12x_next = reg.gate("DSV41_MOE_B12X_NEXT").is_on(gates.get("DSV41_MOE_B12X_NEXT"))
        if b12x_next:
            if width % B12X_ALIGN:
                err("engine.ep", f"EP {ep} at TP {tp} gives {width}-wide experts per rank; b12x needs a multiple of {B12X_ALIGN}",
                    f"raise engine.ep (at TP8 use 2)")
        elif width % FLASHINFER_ALIGN:
            fix = ('set gates.DSV41_MOE_B12X_NEXT = "1" (needs image.variant = "canary-roce"), or engine.ep = 2'
                   if tp == 4 else f"raise engine.ep so {EXPERT_WIDTH} * ep / tp is a multiple of {FLASHINFER_ALIGN}")
            err("engine.ep", f"EP {ep} at TP {tp} gives {width}-wide experts per rank; FlashInfer's MXFP4 MoE needs a multiple of {FLASHINFER_ALIGN}", fix)
    if eng.chunked_prefill_size >= 4096 and not reg.gate("DSV41_INDEXER_CHUNKED").is_on(gates.get("DSV41_INDEXER_CHUNKED")):
        err("engine.chunked_prefill_size", f"{eng.chunked_prefill_size} without the chunked indexer: the indexer transient is ~14 B x chunk x prefix (~60 GB at 4096 and 1M context)",
            'set gates.DSV41_INDEXER_CHUNKED = "1", or engine.chunked_prefill_size = 1024')
    if eng.max_running_requests >= 8 and not _has_flag_value(eng.extra_args, "--min-free-slots-delay", "1"):
        err("engine.extra_args", f"max_running_requests = {eng.max_running_requests} without --min-free-slots-delay 1: DSpark's admission delayer holds 2-3 slots free",
            'add "--min-free-slots-delay", "1" to engine.extra_args, or lower engine.max_running_requests below 8')
    for i, arg in enumerate(eng.extra_args):
        flag = arg.split("=", 1)[0]
        if flag in OWNED_FLAGS:
            err(f"engine.extra_args[{i}]", f"{flag} is set by tp4 from {OWNED_FLAGS[flag]}", f"remove it and set {OWNED_FLAGS[flag]}")
    if eng.use_sps_table:
        warn("engine.use_sps_table", "with the SPS table the first mixed batch dies in the Engram target-verify path", "leave it off (production does)")
    if eng.spec_algo == "none" and eng.use_sts_table:
        warn("engine.use_sts_table", "has no effect without speculative decoding")
    if profile.engine.offload_mode == "ram":
        err("engine.offload_mode", "ram offload pins ~189 GiB, which never fits on a Spark", 'use "nvme"')
    if eng.max_total_tokens > 8_000_000:
        warn("engine.max_total_tokens", f"{eng.max_total_tokens} is above the measured 8M pin; a pin above the smallest KV budget a boot computes kills the boot or is clamped",
             "read `DSV4 memory calculation: ... full_token=<N>` from a boot and stay under it")

    # --- [gates] and [env] ---
    typed = typed_env_keys()
    for key, value in profile.gates.items():
        gate = reg.gate(key)
        field = f"gates.{key}"
        if key in RANK_KEYS:
            err(field, "is rendered per rank by tp4", RANK_KEYS[key])
            continue
        if gate is None:
            fix = f"set {typed[key]} instead" if key in typed else _gate_hint(key, reg)
            err(field, "is not an adapter gate in adapters/registry.toml", fix)
            continue
        reason = gate.check(value)
        if reason:
            err(field, f"{value!r} {reason}", f"see adapter {gate.adapter} in adapters/registry.toml")
        if gate.is_on(value) and reg.image_rank(gate.image) > image_rank:
            err(field, f"needs the {gate.image} image (adapter {gate.adapter}); image.variant is {profile.image.variant}",
                f'set image.variant = "{gate.image}" (preset canary-roce or production), or set {key} = "0"')
    for key in profile.env:
        field = f"env.{key}"
        if key in RANK_KEYS:
            err(field, "is rendered per rank by tp4", RANK_KEYS[key])
        elif reg.gate(key) is not None:
            err(field, f"is a gate of adapter {reg.gate(key).adapter}", f"move it to [gates] so it is validated")
        elif key in typed:
            err(field, f"is rendered from {typed[key]}", f"set {typed[key]} instead")

    for key, value in gates.items():
        gate = reg.gate(key)
        if gate is None or not gate.is_on(value) or key not in profile.gates:
            continue
        for cond in gate.needs:
            if not condition_holds(cond, gates, reg):
                err(f"gates.{key}", f"needs {describe_condition(cond)}", f"set gates.{_cond_fix(cond)} or turn {key} off")
    for adapter in reg.adapters:
        for when, needs in adapter.rules:
            if condition_holds(when, gates, reg) and not condition_holds(needs, gates, reg):
                var = when.split("~")[0].split("=")[0]
                err(f"gates.{var}", f"{describe_condition(when)} needs {describe_condition(needs)}", f"set gates.{_cond_fix(needs)}")

    on = lambda var: reg.gate(var).is_on(gates.get(var))  # noqa: E731
    if "B12X_NEXT_COMPILE_CACHE_DIR" in gates and gates.get("B12X_NEXT_COMPILE_CACHE_DIR") == gates.get("B12X_COMPILE_CACHE_DIR"):
        err("gates.B12X_NEXT_COMPILE_CACHE_DIR", "equals B12X_COMPILE_CACHE_DIR (RoCEnante's JIT cache)", "use /state/b12x-next-compile")
    if "DSV41_FAST_LOAD_EP_SIZE" in gates and gates["DSV41_FAST_LOAD_EP_SIZE"] != str(ep):
        err("gates.DSV41_FAST_LOAD_EP_SIZE", f"{gates['DSV41_FAST_LOAD_EP_SIZE']} does not match engine.ep ({ep})", f'set it to "{ep}"')
    if gates.get("DSV41_FAST_LOAD_TP_SLICE") == "auto" and on("DSV41_FAST_LOAD") and ep != 1:
        warn("gates.DSV41_FAST_LOAD_TP_SLICE", f"auto only acts at EP 1 (engine.ep = {ep})")
    if on("SGLANG_ROCE_ALLREDUCE") and "SGLANG_ROCE_MAX_SIZE" in gates:
        need = 61440 * eng.max_running_requests  # the 16-request decode all-reduce is 983 KB
        if int(gates["SGLANG_ROCE_MAX_SIZE"]) < need and fab.mode == "switched":
            warn("gates.SGLANG_ROCE_MAX_SIZE", f"{gates['SGLANG_ROCE_MAX_SIZE']} bytes is below the ~{need}-byte decode all-reduce at {eng.max_running_requests} requests; larger ones fall back to NCCL",
                 "use 2097152")

    # --- fabric (files/nccl.sh rules) ---
    if nccl.worker_dir is not None and not nccl.worker_dir.startswith("/"):
        err("fabric.nccl.worker_dir", "must be absolute (NCCL_WORKER_DIR)", "give an absolute path")
    if fab.mode == "ring":
        if nnodes != 4 or tp != 4:
            err("fabric.mode", f"a switchless ring needs exactly four nodes at TP 4 (have {nnodes} nodes, TP {tp})", "use the switched fabric")
        if ep not in (1, 2, 4):
            err("engine.ep", f"EP {ep} on a ring", "use 1, 2 or 4")
        if nccl.mount != "overlay":
            err("fabric.nccl.mount", "a ring needs the patched NCCL over the image's pip NCCL", 'set fabric.nccl.mount = "overlay"')
        if nccl.algo != "Ring":
            err("fabric.nccl.algo", f"{nccl.algo!r} on a ring", 'set "Ring"')
        if nccl.net != "IB":
            err("fabric.nccl.net", f"{nccl.net!r} on a ring", 'set "IB"')
        if nccl.ib_disable != 0:
            err("fabric.nccl.ib_disable", "IB is disabled on a ring", "set 0")
        if nccl.ib_subnet_aware_routing != 1:
            err("fabric.nccl.ib_subnet_aware_routing", "must be 1 on a ring", "set 1")
        if not 1 <= nccl.min_nchannels <= nccl.max_nchannels:
            err("fabric.nccl.min_nchannels", f"{nccl.min_nchannels} is not within 1..max_nchannels ({nccl.max_nchannels})", "set 1 <= min_nchannels <= max_nchannels (4 and 4)")
        if profile.nfs.share:
            err("nfs.share", "a ring has no NFS path to the workers; every node needs a full local checkpoint", "set nfs.share = false and copy the checkpoint to every node")
        cap = RING_CAP_HAIRPIN if fab.ring_hairpin_queue >= 8192 else RING_CAP_DEFAULT
        if on("SGLANG_ROCE_ALLREDUCE"):
            if not on("DSV41_ROCE_RING"):
                err("gates.SGLANG_ROCE_ALLREDUCE", "RoCEnante on a ring needs the hardware-forwarded mesh (DSV41_ROCE_RING=1)",
                    'set gates.DSV41_ROCE_RING = "1" with the mesh up, or SGLANG_ROCE_ALLREDUCE = "0" and no DSV41_ROCE_GATHER')
            for var in ("SGLANG_ROCE_MAX_SIZE", "DSV41_ROCE_GATHER"):
                if var in gates and gates[var].isdigit() and int(gates[var]) > cap:
                    err(f"gates.{var}", f"{gates[var]} is above the ring cap of {cap} bytes (hairpin queue {fab.ring_hairpin_queue})", f'set "{cap}"')
        elif on("DSV41_ROCE_GATHER") if "DSV41_ROCE_GATHER" in gates else False:
            err("gates.DSV41_ROCE_GATHER", "without RoCEnante on a ring", "remove it")
    return errors, warnings


def _has_flag_value(args: list[str], flag: str, value: str) -> bool:
    for i, arg in enumerate(args):
        if arg == f"{flag}={value}" or (arg == flag and i + 1 < len(args) and args[i + 1] == value):
            return True
    return False


def _cond_fix(cond: str) -> str:
    if "~" in cond:
        var, item = cond.split("~", 1)
        return f'{var} to a list containing "{item}"'
    if ">=" in cond:
        var, n = cond.split(">=", 1)
        return f'{var} = "{n}" or more'
    if "=" in cond:
        var, value = cond.split("=", 1)
        return f'{var} = "{value}"'
    return f'{cond} = "1"'


def _gate_hint(key: str, reg: Registry) -> str:
    import difflib

    hint = difflib.get_close_matches(key, list(reg.gates), n=1)
    if hint:
        return f"did you mean {hint[0]}?"
    return "check the spelling, or put a non-adapter variable in [env]"
