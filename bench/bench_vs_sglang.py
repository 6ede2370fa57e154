"""`tp4 bench decode` against SGLang's own benchmark client (``sglang.bench_serving``), both on
the same stand-in engine: median TTFT and aggregate decode tok/s per concurrency, and their ratios.

    .venv/bin/python bench/bench_vs_sglang.py [--levels 1,2,4,8,16] [--runs 8] [--max-tokens 64]
                                              [--ttft-ms 200] [--decode-tps 60] [--venv DIR]

The engine is the stand-in (tests/standin/engine.py, its engine role on 127.0.0.1) with a
server-side TTFT floor (TP4_STANDIN_TTFT_SECONDS = --ttft-ms), --decode-tps tokens/s per stream
and three tokens per SSE event, as the line's speculative decoding sends.

SGLang's client is SGLang's own code: its package (``sglang==SGLANG``) is installed with pip,
by name, without its dependencies, into a venv of its own (--venv, default
~/.cache/tp4-bench-sglang/SGLANG), with the two its request function needs (aiohttp, tqdm).
Its benchmark module imports the whole engine (torch, transformers) at import time, so this
script does not import it: it reads the module's source from the installed package and runs
the definitions of its chat request path (``async_request_openai_chat_completions`` and the
helpers it calls: a new aiohttp session per request, ``st = time.perf_counter()`` before the
POST, TTFT at the first chunk with content), as ``bench_serving --backend sglang-oai-chat``
runs them: one warm-up request, then the level's requests all at once.

Per level and run, in their own processes, interleaved (the order alternates every run):

  tp4     `tp4 bench decode --url ... --levels c --prompt-types prose --warmup 1`, its
          result.json's medianTtftMs and aggregateDecodeTps
  sglang  SGLang's request function, c at once; TTFT its ``ttft``; the aggregate by the same
          formula as tp4's (sparkDash's): sum of (output_len - 1) / (max last token - min first
          token), the last token at start + ttft + sum(itl)

Printed: per level, the medians over --runs of both, the ratios tp4 / sglang, and each
client's range over the runs (min-max). The goal (exit 1 when missed): every ratio within 3 % of 1. The first run installs SGLang's client (pip
reaches the package index by name); later runs reuse the venv, offline.
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
ENGINE = REPO / "tests" / "standin" / "engine.py"
MODEL = "standin-model"
SGLANG = "0.5.23"  # the SGLang release whose client is compared (its benchmark module)
SGLANG_DEPS = ("aiohttp", "tqdm")  # what its request path imports (the rest of the module is not run)
GOAL = 0.03
PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."
# the definitions of SGLang's benchmark module that its chat request path runs
SGLANG_NAMES = (
    "_create_bench_client_session",
    "RequestFuncInput",
    "RequestFuncOutput",
    "get_auth_headers",
    "get_request_headers",
    "_combine_openai_chat_content",
    "_extract_cache_from_sglext",
    "_record_server_prompt_len",
    "async_request_openai_chat_completions",
)


# --- SGLang's client (runs in its venv, with the standard library, aiohttp and tqdm only) ----------------


def sglang_source() -> tuple[Path, str]:
    """The installed module that holds SGLang's request functions, and its source."""
    import importlib.util

    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("sglang is not installed in this venv")
    root = Path(list(spec.submodule_search_locations)[0])
    for rel in ("benchmark/serving.py", "bench_serving.py"):
        path = root / rel
        if path.is_file() and "async def async_request_openai_chat_completions" in path.read_text():
            return path, path.read_text()
    raise SystemExit(f"no async_request_openai_chat_completions under {root}")


def sglang_request_function() -> Any:
    """SGLang's ``async_request_openai_chat_completions``, defined from its own source with the
    names it uses, without importing the module (which imports torch and transformers)."""
    import dataclasses
    import traceback
    import uuid
    from argparse import Namespace
    from copy import deepcopy
    from dataclasses import dataclass, field
    from typing import Callable, Dict, List, Optional, Tuple, Union

    import aiohttp
    from tqdm.asyncio import tqdm

    path, text = sglang_source()
    tree = ast.parse(text)
    picked = [
        node
        for node in tree.body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and node.name in SGLANG_NAMES
    ]
    found = {n.name for n in picked}  # type: ignore[attr-defined]
    if "async_request_openai_chat_completions" not in found:
        raise SystemExit(f"{path}: no async_request_openai_chat_completions")

    def remove_prefix(text: str, prefix: str) -> str:  # sglang.benchmark.utils
        return text[len(prefix) :] if text.startswith(prefix) else text

    def parse_custom_headers(header_list: list[str]) -> dict[str, str]:  # sglang.benchmark.utils
        return {k.strip(): v.strip() for h in header_list if ":" in h for k, v in [h.split(":", 1)]}

    namespace: dict[str, Any] = {
        "__name__": "sglang_bench_request",
        "aiohttp": aiohttp,
        "tqdm": tqdm,
        "asyncio": asyncio,
        "json": json,
        "os": os,
        "sys": sys,
        "time": time,
        "traceback": traceback,
        "uuid": uuid,
        "deepcopy": deepcopy,
        "dataclass": dataclass,
        "dataclasses": dataclasses,
        "field": field,
        "Any": Any,
        "Callable": Callable,
        "Dict": Dict,
        "List": List,
        "Optional": Optional,
        "Tuple": Tuple,
        "Union": Union,
        "remove_prefix": remove_prefix,
        "parse_custom_headers": parse_custom_headers,
        "_ROUTING_KEY_HEADER": "X-Routing-Key",
        # bench_serving's defaults for the flags the request function reads
        "args": Namespace(disable_stream=False, disable_ignore_eos=False, print_requests=False, header=None),
    }
    import types

    module = types.ModuleType("sglang_bench_request")  # dataclasses look their module up
    module.__dict__.update(namespace)
    sys.modules[module.__name__] = module
    exec(compile(ast.Module(body=picked, type_ignores=[]), str(path), "exec"), module.__dict__)
    return module.__dict__


def sglang_level(url: str, model: str, concurrency: int, max_tokens: int) -> dict[str, Any]:
    ns = sglang_request_function()
    request = ns["async_request_openai_chat_completions"]

    def one() -> Any:
        return ns["RequestFuncInput"](
            prompt=PROMPT,
            api_url=url + "/v1/chat/completions",
            prompt_len=len(PROMPT.split()),
            output_len=max_tokens,
            model=model,
            lora_name="",
            image_data=None,
            extra_request_body={},
        )

    async def run() -> list[Any]:
        warm = await request(one())  # bench_serving's warm-up request
        if not warm.success:
            raise SystemExit(f"SGLang's client: the warm-up failed: {warm.error}")
        tasks = [asyncio.create_task(request(one())) for _ in range(concurrency)]
        return list(await asyncio.gather(*tasks))

    outs = asyncio.run(run())
    failed = [o.error for o in outs if not o.success]
    if failed:
        raise SystemExit(f"SGLang's client: {len(failed)} requests failed: {failed[0][:500]}")
    firsts = [o.start_time + o.ttft for o in outs]
    lasts = [o.start_time + o.ttft + sum(o.itl) for o in outs]
    decode = sum(o.output_len - 1 for o in outs)
    return {
        "medianTtftMs": statistics.median(o.ttft for o in outs) * 1000.0,
        "aggregateDecodeTps": decode / (max(lasts) - min(firsts)),
        "outputTokens": [o.output_len for o in outs],
    }


# --- tp4's client ------------------------------------------------------------------------------------


def tp4_level(url: str, concurrency: int, max_tokens: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="tp4-vs-sglang-") as tmp:
        argv = [sys.executable, "-m", "tp4", "bench", "decode", "--url", url, "--levels", str(concurrency)]
        argv += ["--max-tokens", str(max_tokens), "--prompt-types", "prose", "--c1-runs", "1", "--trials", "1"]
        argv += ["--warmup", "1", "--out", tmp]
        env = {**os.environ, "PYTHONPATH": str(REPO / "python")}
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            raise SystemExit(f"tp4 bench decode exited {done.returncode}: {done.stderr[-2000:]}")
        doc = json.loads((Path(tmp) / "result.json").read_text())
    level = doc["decode"][0]["job"]["results"][0]
    if level["streamsFailed"]:
        raise SystemExit(f"tp4 bench decode: {level['error']}")
    return {"medianTtftMs": level["medianTtftMs"], "aggregateDecodeTps": level["aggregateDecodeTps"]}


# --- the engine, SGLang's venv, the comparison -------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_engine(port: int, ttft_ms: float, decode_tps: float, log: Path) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-u", str(ENGINE), "python", "-m", "sglang.launch_server", "--model-path", "/m"]
    argv += ["--served-model-name", MODEL, "--host", "127.0.0.1", "--port", str(port)]
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "TP4_STANDIN_PACE": "0",
        "TP4_STANDIN_TTFT_SECONDS": str(ttft_ms / 1000.0),
        "TP4_STANDIN_DECODE_TPS": str(decode_tps),
        "TP4_STANDIN_TOKENS_PER_EVENT": "3",
    }
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 30
    while "fired up and ready" not in log.read_text(errors="replace"):
        if proc.poll() is not None or time.monotonic() > deadline:
            stop_engine(proc)
            raise SystemExit(f"the stand-in engine did not start: {log.read_text(errors='replace')[-2000:]}")
        time.sleep(0.05)
    return proc


def stop_engine(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def sglang_venv(venv: Path, version: str) -> Path:
    """The python of the venv holding SGLang's client, installed on first use."""
    python = venv / "bin" / "python"
    probe = "import aiohttp, tqdm, importlib.metadata as m; print(m.version('sglang'))"
    if python.exists():
        got = subprocess.run([str(python), "-c", probe], capture_output=True, text=True)
        if got.returncode == 0 and got.stdout.strip() == version:
            return python
    print(f"installing SGLang's client (sglang=={version}, no dependencies, + {', '.join(SGLANG_DEPS)}) in {venv}")
    pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    for argv in (
        [sys.executable, "-m", "venv", "--clear", str(venv)],
        [*pip, "--no-deps", f"sglang=={version}"],
        [*pip, *SGLANG_DEPS],
    ):
        if subprocess.run(argv).returncode != 0:
            raise SystemExit(
                f"could not install SGLang's client ({' '.join(argv[-2:])} failed); fix: let pip reach the "
                "package index (or its proxy), or give --venv a venv that has sglang, aiohttp and tqdm"
            )
    return python


def measure(python: Path, client: str, url: str, c: int, max_tokens: int) -> dict[str, Any]:
    me = str(Path(__file__).resolve())
    argv = [str(python) if client == "sglang" else sys.executable, me, "--as-client", client]
    argv += ["--url", url, "--levels", str(c), "--max-tokens", str(max_tokens)]
    env = {**os.environ, "PYTHONPATH": str(REPO / "python")}
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"the {client} client at c{c} failed: {done.stderr[-3000:]}")
    out: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return out


def compare(args: argparse.Namespace) -> int:
    levels = [int(x) for x in args.levels.split(",")]
    python = sglang_venv(Path(args.venv).expanduser(), args.sglang)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory(prefix="tp4-vs-sglang-engine-") as tmp:
        proc = start_engine(port, args.ttft_ms, args.decode_tps, Path(tmp) / "engine.log")
        try:
            rows: dict[tuple[str, int], list[dict[str, Any]]] = {}
            for run in range(args.runs):
                for c in levels:
                    order = ("tp4", "sglang") if (run + c) % 2 == 0 else ("sglang", "tp4")
                    for client in order:
                        got = measure(python, client, url, c, args.max_tokens)
                        rows.setdefault((client, c), []).append(got)
                        print(
                            f"run {run + 1}/{args.runs} c{c} {client:<6}: TTFT {got['medianTtftMs']:.1f} ms, "
                            f"aggregate {got['aggregateDecodeTps']:.1f} tok/s",
                            flush=True,
                        )
        finally:
            stop_engine(proc)
    print()
    print(
        f"stand-in: TTFT floor {args.ttft_ms:g} ms, {args.decode_tps:g} tok/s per stream, {args.max_tokens} tokens; "
        f"medians of {args.runs} runs; SGLang {args.sglang}"
    )
    print(f"{'conc':>4} {'TTFT tp4':>9} {'sglang':>8} {'ratio':>6}   {'agg tp4':>8} {'sglang':>8} {'ratio':>6}")
    worst = 0.0
    for c in levels:
        med = {
            (client, key): statistics.median(r[key] for r in rows[(client, c)])
            for client in ("tp4", "sglang")
            for key in ("medianTtftMs", "aggregateDecodeTps")
        }
        ttft = med[("tp4", "medianTtftMs")] / med[("sglang", "medianTtftMs")]
        agg = med[("tp4", "aggregateDecodeTps")] / med[("sglang", "aggregateDecodeTps")]
        worst = max(worst, abs(ttft - 1), abs(agg - 1))
        print(
            f"{c:>4} {med[('tp4', 'medianTtftMs')]:>9.1f} {med[('sglang', 'medianTtftMs')]:>8.1f} {ttft:>6.3f}   "
            f"{med[('tp4', 'aggregateDecodeTps')]:>8.1f} {med[('sglang', 'aggregateDecodeTps')]:>8.1f} {agg:>6.3f}"
        )
    print("range over the runs (min-max):")
    for c in levels:
        span = {
            (client, key): f"{min(r[key] for r in rows[(client, c)]):.1f}-{max(r[key] for r in rows[(client, c)]):.1f}"
            for client in ("tp4", "sglang")
            for key in ("medianTtftMs", "aggregateDecodeTps")
        }
        print(
            f"  c{c}: TTFT tp4 {span[('tp4', 'medianTtftMs')]} ms, sglang {span[('sglang', 'medianTtftMs')]} ms; "
            f"aggregate tp4 {span[('tp4', 'aggregateDecodeTps')]} tok/s, "
            f"sglang {span[('sglang', 'aggregateDecodeTps')]} tok/s"
        )
    ok = worst <= GOAL
    print(f"largest deviation {worst * 100:.1f} % (goal: within {GOAL * 100:g} %): {'met' if ok else 'MISSED'}")
    return 0 if ok else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--levels", default="1,2,4,8,16")
    ap.add_argument("--runs", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--ttft-ms", type=float, default=200.0)
    ap.add_argument("--decode-tps", type=float, default=60.0)
    ap.add_argument("--venv", default=f"~/.cache/tp4-bench-sglang/{SGLANG}")
    ap.add_argument("--sglang", default=SGLANG, help="the sglang release to install")
    ap.add_argument("--as-client", choices=("tp4", "sglang"), help=argparse.SUPPRESS)
    ap.add_argument("--url", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.as_client == "sglang":
        print(json.dumps(sglang_level(args.url, MODEL, int(args.levels), args.max_tokens)))
        return 0
    if args.as_client == "tp4":
        print(json.dumps(tp4_level(args.url, int(args.levels), args.max_tokens)))
        return 0
    return compare(args)


if __name__ == "__main__":
    sys.exit(main())
