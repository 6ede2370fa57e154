"""The rules between profile fields (upstream's `files/nccl.sh` config check and the constraints
of `.env.tp4.example`, see docs/upstream.md) and the gate rules of adapters/registry.toml. Every
rule reports the field, the reason and the fix; all problems are collected so the user sees them
at once.

Two levels. An error is a profile that cannot boot or does harm (a crash, a wrong result, a
conflicting flag); a warning is a measured performance caveat: the line boots and serves, but
slower than it could. Warnings print and do not block; `--strict` makes them errors. A setting
that is merely without effect is neither."""

from __future__ import annotations

from collections.abc import Mapping

from tp4.core.errors import clip
from tp4.line import knobs
from tp4.line.profile.models import Profile
from tp4.line.profile.problem import Problem
from tp4.line.registry import Registry, condition_holds, describe_condition, fill_line

CONTEXT_MIN, CONTEXT_MAX = 4096, 1048576
# RoCEnante's size cap on a ring: 262144 bytes with hairpin queue 8192, 81920 at the default 1024.
RING_CAP_HAIRPIN, RING_CAP_DEFAULT = 262144, 81920

# Environment keys the renderer owns per rank (or reserves), and the engine flags it renders from
# typed fields: never settable through [gates], [env] or engine.extra_args (the knob table).
RANK_KEYS = knobs.RANK_KEYS
OWNED_FLAGS = knobs.owned_flags()


def validate(
    profile: Profile, gates: Mapping[str, str], head_env: Mapping[str, str], reg: Registry
) -> tuple[list[Problem], list[Problem]]:
    """The rules over a parsed profile and what the renderer made of it (parse, render, then
    check: the loader renders with tp4.line.plan.render_head and passes the result here). ``gates``
    are the gates as the plan runs them (a preset gate that a rollback leaves without the gate it
    needs is dropped there, with a note, so it is not checked here), ``head_env`` rank 0's
    rendered environment; the validator never renders anything itself."""
    errors: list[Problem] = []
    warnings: list[Problem] = []

    def err(field: str, reason: str, fix: str = "") -> None:
        errors.append(Problem(field, reason, fix))

    def warn(field: str, reason: str, fix: str = "") -> None:
        warnings.append(Problem(field, reason, fix))

    eng, cl, fab, nccl = profile.engine, profile.cluster, profile.fabric, profile.fabric.nccl
    tp, ep = eng.tp, profile.ep
    image_rank = reg.image_rank(profile.image.variant)
    # Rules read rank 0's rendered environment (gates as the container sees them, launcher
    # defaults included) plus the line facts the registry names.
    env0 = dict(head_env)
    env0["RING_ROCE_CAP"] = str(RING_CAP_HAIRPIN if fab.ring_hairpin_queue >= 8192 else RING_CAP_DEFAULT)

    # --- cluster: one Spark per rank, unique names and addresses ---
    nnodes = len(profile.nodes)
    if nnodes != tp:
        err(
            "cluster.workers",
            f"{nnodes} node{'s' if nnodes != 1 else ''} (head + {len(cl.workers)} worker{'s' if len(cl.workers) != 1 else ''}) for engine.tp = {tp}; every Spark runs one rank",
            f"list {tp - 1} workers, or set engine.tp = {nnodes}",
        )
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
    if profile.nfs.share and len(profile.nfs.server_ips) not in (1, len(cl.workers)):
        err(
            "nfs.server_ips",
            f"{len(profile.nfs.server_ips)} addresses for {len(cl.workers)} workers",
            "give one address for all workers or one per worker, in worker order",
        )

    # --- engine sizes ---
    if not CONTEXT_MIN <= eng.context_length <= CONTEXT_MAX:
        err(
            "engine.context_length",
            f"{eng.context_length} is outside {CONTEXT_MIN}..{CONTEXT_MAX} (boot.py refuses it)",
            f"set a value from {CONTEXT_MIN} to {CONTEXT_MAX} (the model maximum)",
        )
    if tp % ep != 0 or reg.moe.experts % ep != 0:
        err(
            "engine.ep",
            f"EP {ep} must divide engine.tp ({tp}) and the {reg.moe.experts} experts",
            "use 1, 2 or 4 at TP4",
        )
    else:
        moe = reg.moe
        width = moe.expert_width * ep // tp
        runner = next((a for a in reg.adapters if a.moe_align and a.gates[0].is_on(env0.get(a.gates[0].var))), None)
        if runner is not None and runner.moe_align:
            if width % runner.moe_align:
                err(
                    "engine.ep",
                    f"EP {ep} at TP {tp} gives {width}-wide experts per rank; {runner.name} needs a multiple of {runner.moe_align}",
                    "raise engine.ep (at TP8 use 2)",
                )
        elif width % moe.align:
            alternatives = [a for a in reg.adapters if a.moe_align and width % a.moe_align == 0]
            fix = " or ".join(
                f'set gates.{a.gates[0].var} = "1" (needs image.variant = "{a.image}")' for a in alternatives
            )
            fix = (
                fix + ", or " if fix else ""
            ) + f"raise engine.ep so {moe.expert_width} * ep / tp is a multiple of {moe.align}"
            err(
                "engine.ep",
                f"EP {ep} at TP {tp} gives {width}-wide experts per rank; {moe.runner} needs a multiple of {moe.align}",
                fix,
            )
    # every "X needs Y" of the registry (its rules; a family's once per member set)
    for rule in reg.rules_for(gates):
        if all(condition_holds(c, env0, reg) for c in rule.when) and not condition_holds(rule.needs, env0, reg):
            report = err if rule.level == "error" else warn
            report(
                rule.field,
                fill_line(rule.reason, env0) or f"needs {describe_condition(rule.needs)}",
                fill_line(rule.fix, env0),
            )
    if eng.max_running_requests >= 8 and not _has_flag_value(eng.extra_args, "--min-free-slots-delay", "1"):
        # it boots and serves, with 2-3 of the slots idle: a performance caveat
        warn(
            "engine.extra_args",
            f"max_running_requests = {eng.max_running_requests} without --min-free-slots-delay 1: DSpark's admission delayer holds 2-3 slots free",
            'add "--min-free-slots-delay", "1" to engine.extra_args, or lower engine.max_running_requests below 8',
        )
    for i, arg in enumerate(eng.extra_args):
        flag = arg.split("=", 1)[0]
        if flag in OWNED_FLAGS:
            err(
                f"engine.extra_args[{i}]",
                f"{flag} is set by tp4 from {OWNED_FLAGS[flag]}",
                f"remove it and set {OWNED_FLAGS[flag]}",
            )
    if eng.use_sps_table:
        err(
            "engine.use_sps_table",
            "with the SPS table the first mixed batch dies in the Engram target-verify path",
            "set it to false (production does)",
        )
    if profile.engine.offload_mode == "ram":
        err("engine.offload_mode", "ram offload pins ~189 GiB, which never fits on a Spark", 'use "nvme"')
    if cl.memlock != "-1:-1":
        warn(
            "cluster.memlock",
            f"{cl.memlock} limits locked memory: RDMA registers the KV pool and NCCL's buffers, which needs it unlimited",
            'keep "-1:-1" on Sparks; a limit is for hosts without RDMA',
        )
    if eng.max_total_tokens > 8_000_000:
        warn(
            "engine.max_total_tokens",
            f"{eng.max_total_tokens} is above the measured 8M pin; a pin above the smallest KV budget a boot computes kills the boot or is clamped",
            "read `DSV4 memory calculation: ... full_token=<N>` from a boot and stay under it",
        )

    # --- [gates] and [env] ---
    typed = knobs.typed_env_keys()
    for key, value in gates.items():
        gate = reg.gate(key)
        field = f"gates.{key}"
        if key in RANK_KEYS:
            err(field, "is rendered per rank by tp4", RANK_KEYS[key])
            continue
        if gate is None:
            fix = f"set {typed[key]} instead" if key in typed else reg.hint(key)
            err(field, "is not an adapter gate in adapters/registry.toml", fix)
            continue
        reason = gate.check(value)
        if reason:
            err(field, f"{clip(value)} {reason}", f"see adapter {gate.adapter} in adapters/registry.toml")
        if gate.is_on(value) and reg.image_rank(gate.image) > image_rank:
            err(
                field,
                f"needs the {gate.image} image (adapter {gate.adapter}); image.variant is {profile.image.variant}",
                f'set image.variant = "{gate.image}" (preset canary-roce or production), or set {key} = "0"',
            )
    for key in profile.env:
        field = f"env.{key}"
        if key in RANK_KEYS:
            err(field, "is rendered per rank by tp4", RANK_KEYS[key])
        elif (gate := reg.gate(key)) is not None:
            err(field, f"is a gate of adapter {gate.adapter}", "move it to [gates] so it is validated")
        elif key in typed:
            err(field, f"is rendered from {typed[key]}", f"set {typed[key]} instead")

    # --- fabric (files/nccl.sh rules) ---
    if nccl.worker_dir is not None and not nccl.worker_dir.startswith("/"):
        err("fabric.nccl.worker_dir", "must be absolute (NCCL_WORKER_DIR)", "give an absolute path")
    if fab.mode == "ring":
        if nnodes != 4 or tp != 4:
            err(
                "fabric.mode",
                f"a switchless ring needs exactly four nodes at TP 4 (have {nnodes} nodes, TP {tp})",
                "use the switched fabric",
            )
        if ep not in (1, 2, 4):
            err("engine.ep", f"EP {ep} on a ring", "use 1, 2 or 4")
        if nccl.mount != "overlay":
            err(
                "fabric.nccl.mount",
                "a ring needs the patched NCCL over the image's pip NCCL",
                'set fabric.nccl.mount = "overlay"',
            )
        if nccl.algo != "Ring":
            err("fabric.nccl.algo", f"{nccl.algo!r} on a ring", 'set "Ring"')
        if nccl.net != "IB":
            err("fabric.nccl.net", f"{nccl.net!r} on a ring", 'set "IB"')
        if nccl.ib_disable != 0:
            err("fabric.nccl.ib_disable", "IB is disabled on a ring", "set 0")
        if nccl.ib_subnet_aware_routing != 1:
            err("fabric.nccl.ib_subnet_aware_routing", "must be 1 on a ring", "set 1")
        if not 1 <= nccl.min_nchannels <= nccl.max_nchannels:
            err(
                "fabric.nccl.min_nchannels",
                f"{nccl.min_nchannels} is not within 1..max_nchannels ({nccl.max_nchannels})",
                "set 1 <= min_nchannels <= max_nchannels (4 and 4)",
            )
        if profile.nfs.share:
            err(
                "nfs.share",
                "a ring has no NFS path to the workers; every node needs a full local checkpoint",
                "set nfs.share = false and copy the checkpoint to every node",
            )
    errors.extend(kernel_limits(profile, head_env))
    return errors, warnings


# The kernel's limits on what execve takes (linux include/uapi/linux/binfmts.h): one argv word or
# environment string ("KEY=value") of at most MAX_ARG_STRLEN = 32 pages = 131072 bytes with its
# NUL; all of argv and the environment together within ARG_MAX, a quarter of the stack limit
# (2 MiB under the usual 8 MiB). Every profile string reaches an argv or an environment (the
# container runtime's, the engine's): one over the first limit fails the launch with E2BIG.
MAX_ARG_STRLEN = 131072
# what argv and the environment of one rank may take together: half the usual ARG_MAX, leaving the
# other half to what tp4 and the runtime add around them
ARG_BUDGET = 1 << 20


def kernel_limits(profile: Profile, head_env: Mapping[str, str]) -> list[Problem]:
    """Every string of the profile that, as one argv word or environment string, is longer than
    the kernel takes, and the rank's environment and engine arguments over the budget together."""
    found: list[Problem] = []

    def walk(value: object, path: str, env_key: str | None = None) -> None:
        if isinstance(value, str):
            word = f"{env_key}={value}" if env_key is not None else value
            size = len(word.encode("utf-8", "surrogatepass")) + 1
            if size > MAX_ARG_STRLEN:
                found.append(
                    Problem(
                        path,
                        f"is {size} bytes as one {'environment string' if env_key else 'argument'}, over the kernel's "
                        f"limit of {MAX_ARG_STRLEN} (MAX_ARG_STRLEN): the launch would fail with E2BIG",
                        "shorten it (a long value belongs in a file the line mounts)",
                    )
                )
        elif isinstance(value, Mapping):
            for k, v in value.items():
                key = str(k)
                walk(v, f"{path}.{key}" if path else key, key if path in ("env", "gates") else None)
        elif isinstance(value, (list, tuple)):
            for i, v in enumerate(value):
                walk(v, f"{path}[{i}]")

    walk(profile.model_dump(), "")
    total = sum(len(f"{k}={v}".encode("utf-8", "surrogatepass")) + 1 for k, v in head_env.items()) + sum(
        len(a.encode("utf-8", "surrogatepass")) + 1 for a in profile.engine.extra_args
    )
    if total > ARG_BUDGET:
        found.append(
            Problem(
                "env",
                f"the rank's environment and engine.extra_args take {total} bytes together, over the {ARG_BUDGET} "
                "tp4 allows (the kernel's ARG_MAX is 2 MiB for argv and environment together)",
                "shorten [env], [gates] and engine.extra_args",
            )
        )
    return found


def _has_flag_value(args: list[str], flag: str, value: str) -> bool:
    for i, arg in enumerate(args):
        if arg == f"{flag}={value}" or (arg == flag and i + 1 < len(args) and args[i + 1] == value):
            return True
    return False


def local_file_warnings(profile: Profile) -> list[Problem]:
    """Files the profile names on the machine running tp4, checked where they are: api.key_file,
    by the one check of the key file (tp4.core.apikey.key_file_problem: its metadata only, never the
    key). A warning here, since plan and check only name the file; serve, which sends the key,
    reads it through the same check."""
    path = profile.api.key_file
    if path is None:
        return []
    import os

    from tp4.core.apikey import key_file_problem

    where = os.path.expanduser(path)
    found = key_file_problem(where)
    return [] if found is None else [Problem("api.key_file", f"{where} {found.reason}", found.fix)]
