"""An independent statement of the upstream launcher's rules (upstream `start.sh`: docker_common_args and
worker_env_lines; `boot.py`: the engine command line), used
only by tests: given the variables a real `bash -c 'set -a; source .env.tp4'` produces, what
container env and engine argv does start.sh (TP4 launcher) give each rank?"""

from __future__ import annotations

import os
import re
import subprocess

MODEL = "/models/DeepSeek-V4.1-Flash"


def bash_source(path: str, home: str = "/home/zurih") -> dict[str, str]:
    """The variables a bash-syntax profile defines, exactly as bash sees them."""
    script = 'set -a; source "$1"; env -0'
    clean = {"HOME": home, "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    before = subprocess.run(["bash", "-c", "env -0"], env=clean, capture_output=True, check=True).stdout
    after = subprocess.run(["bash", "-c", script, "bash", path], env=clean, capture_output=True, check=True).stdout
    parse = lambda raw: dict(item.split("=", 1) for item in raw.decode().split("\0") if "=" in item)  # noqa: E731
    base, full = parse(before), parse(after)
    return {k: v for k, v in full.items() if k not in base or base[k] != v or k in ("HOME",) and False}


def upstream_env(v: dict[str, str], rank: int) -> dict[str, str]:
    g = lambda k, d="": v.get(k, d)  # noqa: E731
    ips = re.split(r"[\s,]+", g("WORKER_IPS").strip()) if g("WORKER_IPS").strip() else []
    head_ip = g("HEAD_IP", "10.0.0.1")
    node_ip = head_ip if rank == 0 else ips[rank - 1]
    tp = g("TP_SIZE", "4")
    mrr = g("MAX_RUNNING_REQUESTS", "4")
    env = {
        "OFFLOAD_MODE": g("OFFLOAD_MODE", "nvme"),
        "DSV41_CACHE_GIB": g("DSV41_CACHE_GIB", "4"),
        "DSV41_SERIAL_WEIGHT_LOAD": g("DSV41_SERIAL_WEIGHT_LOAD", "0"),
        "DSV41_IO_THREADS": g("DSV41_IO_THREADS", "96"),
        "DSV41_RESIDENT_SCALES": g("DSV41_RESIDENT_SCALES", "0"),
        "DSV41_CACHE_WAYS": g("DSV41_CACHE_WAYS", "4"),
        "DSV41_STATS_SECONDS": g("DSV41_STATS_SECONDS", "60"),
        "DSV41_PACKED_DIR": g("DSV41_PACKED_DIR", "/engram"),
        "DSPARK_SPS_TABLE": g("DSPARK_SPS_TABLE", "/state/dspark_sps.json"),
        "DSPARK_STS_TABLE": g("DSPARK_STS_TABLE", "/state/dspark_sts.json"),
        "DSV41_SOURCE": MODEL,
        "MODEL_PATH": MODEL,
        "STATE_PATH": "/state",
        "SERVER_PORT": g("PORT", "8888"),
        "NNODES": str(len(ips) + 1),
        "TP_SIZE": tp,
        "EP_SIZE": g("EP_SIZE", tp),
        "DIST_INIT_ADDR": f"{head_ip}:{g('DIST_PORT', '20000')}",
        "CONTEXT_LENGTH": g("CONTEXT_LENGTH", "409600"),
        "MEM_FRACTION_STATIC": (g("HEAD_MEM_FRACTION_STATIC") or g("MEM_FRACTION_STATIC", "0.80"))
        if rank == 0
        else g("MEM_FRACTION_STATIC", "0.80"),
        "MAX_RUNNING_REQUESTS": mrr,
        "CHUNKED_PREFILL_SIZE": g("CHUNKED_PREFILL_SIZE", "2048"),
        "MAX_TOTAL_TOKENS": g("MAX_TOTAL_TOKENS", "320000"),
        "CUDA_GRAPH_MAX_BS_DECODE": mrr,
        "SPEC_ALGO": g("SPEC_ALGO", "DSPARK"),
        "DSPARK_BLOCK_SIZE": g("DSPARK_BLOCK_SIZE", "5"),
    }
    for k in (
        "DSV41_WO_A_W8",
        "DSV41_WO_A_W8_MID",
        "DSV41_WO_A_W8_DROP",
        "DSV41_DRAFT_HEAD_FP8",
        "DSV41_VERIFY_CAP",
        "DSV41_BLOCK_VERIFY",
        "DSV41_ENGRAM_PREFETCH",
        "DSV41_FOLDED_FENCE",
        "DSV41_AUTOTUNE_KEEP",
        "DSV41_WO_A_W8_DRAFT",
        "DSV41_ENGRAM_PREFETCH_CHECK",
    ):
        env[k] = g(k, "0")
    env["DSV41_DRAFT_TAU"] = g("DSV41_DRAFT_TAU", "1")
    env.update(
        {
            "SERVED_MODEL_NAME": g("SERVED_MODEL_NAME", "deepseek-v4.1-flash"),
            "SKIP_PREPARE": g("SKIP_PREPARE", "1"),
            "SKIP_VERIFY": g("SKIP_VERIFY", "1"),
            "HOST": "0.0.0.0",
            "NCCL_NET": g("NCCL_NET", "IB"),
            "NCCL_IB_DISABLE": g("NCCL_IB_DISABLE", "0"),
            "NCCL_IB_HCA": g("IB_HCA", "rocep1s0f0,rocep1s0f1"),
            "NCCL_SOCKET_IFNAME": g("NCCL_SOCKET_IFNAME", "enP7s7"),
            "GLOO_SOCKET_IFNAME": g("GLOO_SOCKET_IFNAME", "enP7s7"),
            "NCCL_P2P_DISABLE": g("NCCL_P2P_DISABLE", "1"),
            "NCCL_SHM_DISABLE": g("NCCL_SHM_DISABLE", "1"),
            "NCCL_CROSS_NIC": g("NCCL_CROSS_NIC", "1"),
            "NCCL_IB_MERGE_NICS": g("NCCL_IB_MERGE_NICS", "0"),
            "NCCL_IB_SUBNET_AWARE_ROUTING": g("NCCL_IB_SUBNET_AWARE_ROUTING", "1"),
            "NCCL_CUMEM_ENABLE": "0",
            "NCCL_DEBUG": g("NCCL_DEBUG", "WARN"),
            "NCCL_BUFFSIZE": g("NCCL_BUFFSIZE", "4194304"),
            "NCCL_LL128_BUFFSIZE": g("NCCL_LL128_BUFFSIZE", "-2"),
            "NCCL_PROTO": g("NCCL_PROTO", "LL,LL128,Simple"),
            "NCCL_MAX_NCHANNELS": g("NCCL_MAX_NCHANNELS", "32"),
            "NCCL_DEBUG_SUBSYS": g("NCCL_DEBUG_SUBSYS", "INIT"),
            "DSV41_MXFP8_BACKEND": g("DSV41_MXFP8_BACKEND", "b12x"),
            "SGLANG_FLASHINFER_MOE_FUSED_FINALIZE": g("SGLANG_FLASHINFER_MOE_FUSED_FINALIZE", "1"),
            "SGLANG_DSV41_REASONING_EFFORT": g("SGLANG_DSV41_REASONING_EFFORT", "75"),
            "DSV41_MAX_NEW_TOKENS": g("DSV41_MAX_NEW_TOKENS", "32768"),
            "DSV41_LOOP_ABORT": g("DSV41_LOOP_ABORT", "1"),
            # the names the loop_abort adapter reads (start.sh forwards them): DSV41_LOOP_NGRAM, not DSV41_LOOP_ABORT_NGRAM
            "DSV41_LOOP_NGRAM": g("DSV41_LOOP_NGRAM", "32"),
            "DSV41_LOOP_REPEATS": g("DSV41_LOOP_REPEATS", "4"),
            "DSV41_LOOP_LINE_REPEATS": g("DSV41_LOOP_LINE_REPEATS", "8"),
            "PYTORCH_CUDA_ALLOC_CONF": g("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:False"),
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
            "SGLANG_ENABLE_DSV41_ENGRAM_HOST_TABLE": "0",
            "DSV41_TP_PAD": g("DSV41_TP_PAD", "1"),
            "VLLM_HOST_IP": node_ip,
            "HOST_IP": node_ip,
            "NCCL_IB_GID_INDEX": g("NCCL_IB_GID_INDEX", "3"),
        }
    )
    if g("EXTRA_SGLANG_ARGS"):
        env["EXTRA_SGLANG_ARGS"] = g("EXTRA_SGLANG_ARGS")
    if "SGLANG_DSPARK_FOLDED_SAMPLING" in v:
        env["SGLANG_DSPARK_FOLDED_SAMPLING"] = v["SGLANG_DSPARK_FOLDED_SAMPLING"]
    if g("NCCL_SWITCHLESS_RING_ONLY") == "1":
        env.update(
            {
                "NCCL_SWITCHLESS_RING_ONLY": "1",
                "NCCL_ALGO": g("NCCL_ALGO", "Ring"),
                "NCCL_SKIP_TREE_CONNECT": g("NCCL_SKIP_TREE_CONNECT", "1"),
                "NCCL_IB_SUBNET_PREFIX_LEN": g("NCCL_IB_SUBNET_PREFIX_LEN", "24"),
                "NCCL_MIN_NCHANNELS": g("NCCL_MIN_NCHANNELS", "4"),
                "NCCL_P2P_LEVEL": g("NCCL_P2P_LEVEL", "SYS"),
            }
        )
    if rank == 0:
        env.update(
            {
                "NODE_RANK": "0",
                "WARMUP": g("WARMUP", "1"),
                "SKIP_SMOKE": g("SKIP_SMOKE", "0"),
                "SMOKE_QUICK": g("SMOKE_QUICK", "1"),
            }
        )
    else:
        env.update({"NODE_RANK": str(rank), "SKIP_PREPARE": "1", "SKIP_VERIFY": "1", "SKIP_SMOKE": "1"})
    env.update(
        {
            "DSV41_LAUNCHER": "tp4",
            "DSV41_SHARED_PAD_K": g("DSV41_SHARED_PAD_K", "0"),
            "DSV41_SHARED_PAD_BUF_ROWS": g("DSV41_SHARED_PAD_BUF_ROWS", "256"),
        }
    )
    for item in g("EXTRA_CONTAINER_ENV").split():
        key, value = item.split("=", 1)
        env[key] = value
    if rank > 0:
        env.update({"SKIP_PREPARE": "1", "SKIP_VERIFY": "1", "SKIP_SMOKE": "1"})
    return env


def upstream_state_dir(v: dict[str, str], rank: int, checkout: str) -> str:
    """The host directory mounted at /state (`start-tp4.sh`, `start.sh`): start-tp4.sh runs from the checkout that
    holds .env.tp4 with STATE_DIR=state-tp4/; a worker mounts $WORKER_DIR/state."""
    if rank == 0:
        return f"{checkout}/state-tp4"
    return f"{v['WORKER_DIR']}/state"


def upstream_argv(env: dict[str, str]) -> list[str]:
    """boot.py's engine command for a rank's env, no SPS/STS table files present."""
    argv = [
        "python",
        "-m",
        "sglang.launch_server",
        "--model-path",
        env["MODEL_PATH"],
        "--served-model-name",
        env["SERVED_MODEL_NAME"],
        "--trust-remote-code",
        "--load-format",
        "safetensors",
        "--tp",
        env["TP_SIZE"],
        "--ep-size",
        env["EP_SIZE"],
        "--attention-backend",
        env.get("ATTENTION_BACKEND", "dsv4"),
        "--moe-runner-backend",
        env.get("MOE_RUNNER_BACKEND", "flashinfer_mxfp4"),
        "--mem-fraction-static",
        env["MEM_FRACTION_STATIC"],
        "--chunked-prefill-size",
        env["CHUNKED_PREFILL_SIZE"],
        "--context-length",
        env["CONTEXT_LENGTH"],
        "--max-running-requests",
        env["MAX_RUNNING_REQUESTS"],
        "--cuda-graph-max-bs-decode",
        env["CUDA_GRAPH_MAX_BS_DECODE"],
        "--random-seed",
        "0",
        "--enable-decoder-swa-bounded-replay",
        "--tool-call-parser",
        "deepseekv41",
        "--reasoning-parser",
        "deepseek-v41",
        "--host",
        env["HOST"],
        "--port",
        env["SERVER_PORT"],
    ]
    if env["SPEC_ALGO"].lower() not in ("off", "none", "0"):
        argv += ["--speculative-algorithm", "DSPARK", "--speculative-dspark-block-size", env["DSPARK_BLOCK_SIZE"]]
    if int(env["NNODES"]) > 1:
        argv += ["--nnodes", env["NNODES"], "--node-rank", env["NODE_RANK"], "--dist-init-addr", env["DIST_INIT_ADDR"]]
    if env.get("MAX_TOTAL_TOKENS", "") not in ("", "0"):
        argv += ["--max-total-tokens", env["MAX_TOTAL_TOKENS"]]
    return argv + env.get("EXTRA_SGLANG_ARGS", "").split()
