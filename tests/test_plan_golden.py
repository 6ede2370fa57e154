"""Golden: the production preset on the example cluster renders the upstream production line.
Expected values are written out from upstream `start.sh` (docker run flags, container env), the argv `boot.py` builds, and `.env.tp4.example` with its EXTRA_CONTAINER_ENV item 5
(v2.1 form), not computed by the renderer."""

from __future__ import annotations

import pytest

from tp4.line.plan import build_plan
from tp4.line.profile import load_default

pytestmark = pytest.mark.unit

MODEL = "/models/DeepSeek-V4.1-Flash"

# `.env.tp4.example` EXTRA_CONTAINER_ENV item 5, v2.1 form (DSV41_DRAFT_HEAD_FP8_IMPL=tp4, no cert head).
PRODUCTION_EXTRA = (
    "DSV41_INDEXER_CHUNKED=1 SGLANG_DSPARK_FOLDED_SAMPLING=2 SGLANG_RUST_BUILD_MODE=never "
    "SGLANG_ROCE_ALLREDUCE=1 SGLANG_ROCE_MAX_SIZE=2097152 B12X_ROCE_HCA=rocep1s0f0,roceP2p1s0f0 "
    "B12X_ROCE_CACHE_DIR=/state/b12x-roce B12X_COMPILE_CACHE_DIR=/state/b12x-compile "
    "SPARK_PREFILL_TP_SPLIT=1 SPARK_PREFILL_TP_MIN_CONTEXT=32768 SPARK_PREFILL_TP_MIN_ROWS=1024 "
    "DSV41_FAST_LOAD=1 DSV41_FAST_LOAD_EP_SIZE=1 DSV41_FAST_LOAD_TP_SLICE=auto DSV41_FAST_LOAD_N_EXPERTS=384 "
    "DSV41_FAST_LOAD_INFLIGHT_GB=6 DSV41_ENGRAM_PREFETCH=1 DSV41_SHARED_PAD_K=1 DSV41_WO_A_W8=1 "
    "DSV41_DRAFT_TAU=0.7 DSV41_DRAFT_HEAD_FP8=1 DSV41_BLOCK_VERIFY=1 DSV41_FOLDED_FENCE=1 "
    "DSV41_VERIFY_CAP=conf:0.1 DSV41_AUTOTUNE_KEEP=1 DSV41_WO_A_W8_MID=1 DSV41_WO_A_W8_DROP=1 "
    "DSV41_REPLICATED_SPLIT=wqkv_a,engram.wkv DSV41_DRAFT_MAIN_PROJ_SPLIT=1 DSV41_ROCE_GATHER=2097152 "
    "DSV41_ROUTER_LIVE=1 DSV41_MOE_B12X_NEXT=1 DSV41_MOE_B12X_NEXT_DETERMINISTIC=1 DSV41_HC_FUSED=1 "
    "DSV41_PREFILL_SP=1 DSV41_PREFILL_SP_FP8=1 DSV41_L2_PREFETCH=1 DSV41_L2_PREFETCH_WOA=1 "
    "DSV41_SPEC_SYNC_FREE=all DSV41_EAGER_GLUE=all DSV41_SPLIT_COMPACT_GATHER=1 DSV41_DRAFT_HEAD_FP8_IMPL=tp4"
)

EXTRA_SGLANG_ARGS = (
    "--fp8-gemm-backend flashinfer_cutlass --watchdog-timeout 1800 --min-free-slots-delay 1 "
    "--enable-deepseek-v4-fp4-indexer --enable-cache-report --sleep-on-idle"
)

# `start.sh` docker_common_args with the TP4 example values of `.env.tp4.example`.
COMMON = {
    "OFFLOAD_MODE": "nvme",
    "DSV41_CACHE_GIB": "4",
    "DSV41_SERIAL_WEIGHT_LOAD": "0",
    "DSV41_IO_THREADS": "96",
    "DSV41_RESIDENT_SCALES": "0",
    "DSV41_CACHE_WAYS": "16",
    "DSV41_STATS_SECONDS": "60",
    "DSV41_PACKED_DIR": "/engram",
    "DSPARK_SPS_TABLE": "/state/dspark_sps.json",
    "DSPARK_STS_TABLE": "/state/dspark_sts.json",
    "DSV41_SOURCE": MODEL,
    "MODEL_PATH": MODEL,
    "STATE_PATH": "/state",
    "SERVER_PORT": "8888",
    "NNODES": "4",
    "TP_SIZE": "4",
    "EP_SIZE": "1",
    "DIST_INIT_ADDR": "10.0.0.1:20000",
    "CONTEXT_LENGTH": "1048576",
    "MEM_FRACTION_STATIC": "0.80",
    "MAX_RUNNING_REQUESTS": "16",
    "CHUNKED_PREFILL_SIZE": "4096",
    "MAX_TOTAL_TOKENS": "8000000",
    "CUDA_GRAPH_MAX_BS_DECODE": "16",
    "SPEC_ALGO": "DSPARK",
    "DSPARK_BLOCK_SIZE": "5",
    # adapter switches with launcher defaults 0 (TAU 1), overridden below by EXTRA_CONTAINER_ENV
    "DSV41_WO_A_W8": "0",
    "DSV41_WO_A_W8_MID": "0",
    "DSV41_WO_A_W8_DROP": "0",
    "DSV41_DRAFT_HEAD_FP8": "0",
    "DSV41_VERIFY_CAP": "0",
    "DSV41_DRAFT_TAU": "1",
    "DSV41_BLOCK_VERIFY": "0",
    "DSV41_ENGRAM_PREFETCH": "0",
    "DSV41_FOLDED_FENCE": "0",
    "DSV41_AUTOTUNE_KEEP": "0",
    "DSV41_WO_A_W8_DRAFT": "0",
    "DSV41_ENGRAM_PREFETCH_CHECK": "0",
    "SERVED_MODEL_NAME": "deepseek-v4.1-flash",
    "SKIP_PREPARE": "1",
    "SKIP_VERIFY": "1",
    "HOST": "0.0.0.0",
    "NCCL_NET": "IB",
    "NCCL_IB_DISABLE": "0",
    "NCCL_IB_HCA": "rocep1s0f0,roceP2p1s0f0",
    "NCCL_SOCKET_IFNAME": "enP7s7",
    "GLOO_SOCKET_IFNAME": "enP7s7",
    "NCCL_P2P_DISABLE": "1",
    "NCCL_SHM_DISABLE": "1",
    "NCCL_CROSS_NIC": "1",
    "NCCL_IB_MERGE_NICS": "0",
    "NCCL_IB_SUBNET_AWARE_ROUTING": "1",
    "NCCL_CUMEM_ENABLE": "0",
    "NCCL_DEBUG": "WARN",
    "NCCL_BUFFSIZE": "1048576",
    "NCCL_LL128_BUFFSIZE": "262144",
    "NCCL_PROTO": "^LL128",
    "NCCL_MAX_NCHANNELS": "8",
    "NCCL_DEBUG_SUBSYS": "INIT,ENV",
    "DSV41_MXFP8_BACKEND": "b12x",
    "SGLANG_FLASHINFER_MOE_FUSED_FINALIZE": "0",
    "SGLANG_DSV41_REASONING_EFFORT": "75",
    "DSV41_MAX_NEW_TOKENS": "32768",
    "DSV41_LOOP_ABORT": "1",
    "DSV41_LOOP_NGRAM": "32",
    "DSV41_LOOP_REPEATS": "4",
    "DSV41_LOOP_LINE_REPEATS": "8",
    "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False",
    "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
    "SGLANG_ENABLE_DSV41_ENGRAM_HOST_TABLE": "0",
    "DSV41_TP_PAD": "0",
    "NCCL_IB_GID_INDEX": "3",
    "EXTRA_SGLANG_ARGS": EXTRA_SGLANG_ARGS,
    # TP4 launcher only
    "DSV41_LAUNCHER": "tp4",
    "DSV41_SHARED_PAD_K": "1",
    "DSV41_SHARED_PAD_BUF_ROWS": "256",
}


def expected_env(rank: int, ip: str) -> dict[str, str]:
    env = dict(COMMON)
    env.update({"VLLM_HOST_IP": ip, "HOST_IP": ip})
    for item in PRODUCTION_EXTRA.split():  # replaced in place or appended, never duplicated
        key, value = item.split("=", 1)
        env[key] = value
    if rank == 0:
        env.update({"NODE_RANK": "0", "WARMUP": "1", "SKIP_SMOKE": "0", "SMOKE_QUICK": "1"})
    else:
        env.update({"NODE_RANK": str(rank), "SKIP_PREPARE": "1", "SKIP_VERIFY": "1", "SKIP_SMOKE": "1"})
    return env


def expected_argv(rank: int) -> list[str]:
    return [
        "python",
        "-m",
        "sglang.launch_server",
        "--model-path",
        MODEL,
        "--served-model-name",
        "deepseek-v4.1-flash",
        "--trust-remote-code",
        "--load-format",
        "safetensors",
        "--tp",
        "4",
        "--ep-size",
        "1",
        "--attention-backend",
        "dsv4",
        "--moe-runner-backend",
        "flashinfer_mxfp4",
        "--mem-fraction-static",
        "0.80",
        "--chunked-prefill-size",
        "4096",
        "--context-length",
        "1048576",
        "--max-running-requests",
        "16",
        "--cuda-graph-max-bs-decode",
        "16",
        "--random-seed",
        "0",
        "--enable-decoder-swa-bounded-replay",
        "--tool-call-parser",
        "deepseekv41",
        "--reasoning-parser",
        "deepseek-v41",
        "--host",
        "0.0.0.0",
        "--port",
        "8888",
        "--speculative-algorithm",
        "DSPARK",
        "--speculative-dspark-block-size",
        "5",
        "--nnodes",
        "4",
        "--node-rank",
        str(rank),
        "--dist-init-addr",
        "10.0.0.1:20000",
        "--max-total-tokens",
        "8000000",
        "--fp8-gemm-backend",
        "flashinfer_cutlass",
        "--watchdog-timeout",
        "1800",
        "--min-free-slots-delay",
        "1",
        "--enable-deepseek-v4-fp4-indexer",
        "--enable-cache-report",
        "--sleep-on-idle",
    ]


@pytest.fixture(scope="module")
def plan():
    return build_plan(load_default())


@pytest.mark.parametrize("rank,ip", [(0, "10.0.0.1"), (2, "10.0.0.3")])
def test_production_env_is_the_upstream_line(plan, rank, ip):
    env = plan.nodes[rank].env
    expected = expected_env(rank, ip)
    missing = sorted(set(expected) - set(env))
    extra = sorted(set(env) - set(expected))
    wrong = {k: (env[k], expected[k]) for k in expected if k in env and env[k] != expected[k]}
    assert (missing, extra, wrong) == ([], [], {})


@pytest.mark.parametrize("rank", [0, 1, 3])
def test_production_argv_is_the_upstream_line(plan, rank):
    assert list(plan.nodes[rank].argv) == expected_argv(rank)


def test_worker_forced_values_and_head_only_keys(plan):
    for node in plan.nodes[1:]:
        assert (node.env["SKIP_PREPARE"], node.env["SKIP_VERIFY"], node.env["SKIP_SMOKE"]) == ("1", "1", "1")
        assert "WARMUP" not in node.env and "SMOKE_QUICK" not in node.env
    assert plan.nodes[0].env["WARMUP"] == "1"


def test_run_spec_matches_docker_run_flags(plan):
    nodes = plan.to_json()["nodes"]
    head, worker = nodes[0]["run"], nodes[1]["run"]
    for run in (head, worker):
        assert (run["network"], run["ipc"], run["privileged"], run["cap_add"], run["gpus"]) == (
            "host",
            "host",
            True,
            ["IPC_LOCK"],
            "all",
        )
        assert run["shm_size"] == "32g"
        assert run["ulimits"] == {"memlock": "-1:-1", "stack": "67108864"}
        assert run["devices"] == ["/dev/infiniband:/dev/infiniband"]
        assert run["command"] == ["run"] and run["image"] == "dsv41-4x-spark:canary-roce"
    assert head["container"] == "dsv41-head" and worker["container"] == "dsv41-worker"
    assert [(m["source"], m["target"], m["read_only"]) for m in head["mounts"]] == [
        ("/home/zurih/NewModels/DeepSeek-V4.1-Flash", MODEL, False),
        ("/home/zurih/dsv41-4x-spark/state-tp4", "/state", False),
        ("/home/zurih/.cache", "/root/.cache", False),
        ("/home/zurih/dsv41-engram", "/engram", False),
    ]
    assert [(m["type"], m["source"], m["target"], m["read_only"]) for m in worker["mounts"]] == [
        ("volume", "dsv41-weights", MODEL, True),
        ("bind", "/home/zurih/dsv41-4x-spark/state", "/state", False),
        ("bind", "/home/zurih/.cache", "/root/.cache", False),
        ("bind", "/home/zurih/dsv41-4x-spark/engram", "/engram", False),
    ]


# K README v2.3 (docs/upstream.md): the lines the production line's boot log must show.
REQUIRED_BOOT_LINES = [
    "DSV41 shared-expert padding K: foo (5120, 576) -> (5120, 640)",
    "DSV41 indexer chunked (sglang#39187 backport) ARMED: budget=2147483648",
    "Initialized DSpark draft runner. x gamma=5, verify_num_draft_tokens=6",
    "max_total_num_tokens=6400000, chunked_prefill_size=4096, x max_running_requests=16",
    "RoCEnante ready: world=4 hcas=rocep1s0f0,roceP2p1s0f0",
    "[moe_b12x_next] armed: routed MoE on b12x_next a7d7d29b (W4A8, in-place repack)",
    "[moe_b12x_next] INFO: routed MoE at EP_SIZE=1 (each rank a quarter)",
    "DSV41 hc_fused: first call (4096 rows) bit-identical to stock",
    "DSV41_L2_PREFETCH: model forward bracketed (decode/verify only); v3: wo_a windows (6.0 MB)",
    "[spec_sync_free] armed (all): skip draft=True accept=True vcap=True merge=True audit=False",
    "[eager_glue] vcap: verify_cap live length captured into the draft graph (M=6)",
    "[replicated_split] model.layers.0.self_attn.wqkv_a: compact gather (roce) bit-identical, ON (M<=96)",
]


def test_expected_boot_lines_cover_section_6_1(plan):
    import re

    required = [b for b in plan.boot_lines if b.required]
    for line in REQUIRED_BOOT_LINES:
        assert any(re.fullmatch(b.pattern, line) for b in required), line
    for b in required:
        assert any(re.fullmatch(b.pattern, line) for line in REQUIRED_BOOT_LINES), b.text
    assert plan.forbidden_lines == ("DIFFER", "CHECK FAILED", "MISMATCH", "Traceback")


def test_boot_lines_follow_the_gates():
    from tp4.line.profile.load import parse_document

    loaded = parse_document({"preset": "base", "cluster": _cluster()}, "t")
    texts = [b.text for b in build_plan(loaded).boot_lines if b.required]
    assert not any("moe_b12x_next" in t or "RoCEnante" in t for t in texts)
    assert any("indexer chunked" in t for t in texts)


def _cluster():
    return {
        "head": {"name": "h", "ip": "10.0.0.1"},
        "workers": [{"name": f"w{i}", "ip": f"10.0.0.{i}"} for i in (2, 3, 4)],
    }
