#!/usr/bin/env python3
"""The stand-in engine of the serve tests: the one test double of the suite. Standard library only.

It stands where the line image's entrypoint stands (`python3 -u /opt/dsv41/boot.py run`, the
container run spec's command) and behaves like boot.py and SGLang at their boundary, from the env
the rank's container receives and nothing else (it never sees the plan):

* ``boot.py run`` (the boot role): checks the env as boot.py does (OFFLOAD_MODE, CONTEXT_LENGTH,
  NNODES/NODE_RANK/DIST_INIT_ADDR, the checkpoint's config.json under MODEL_PATH), builds the
  engine argv from the env as boot.py does (docs/upstream.md), writes ``<STATE_PATH>/launch.json``
  (its ``args`` are that argv: a test compares them with the plan's), starts the engine (this file
  again, with that argv: ``... engine.py python -m sglang.launch_server ...``, so `pkill -f
  sglang.launch_server` finds it) in its own session and waits on it. Rank 0 then waits for
  ``/health``, runs the smoke (`What is 19 + 23? ...` must answer ``42`` with finish_reason stop,
  unless SKIP_SMOKE=1) and the warm-up (WARMUP != 0: four prompts and one batch of
  MAX_RUNNING_REQUESTS), prints ``Warm-up done in <N>s`` and ``Ready: API on port <PORT> (rank 0).
  Key is in /state/api-key.`` (or ``..., no API key.``). TERM stops the engine's process group.
  ``boot.py health`` probes ``/health`` as the image's HEALTHCHECK does.
* the engine role (``engine.py python -m sglang.launch_server <argv>``): parses the argv like
  SGLang's argparse (an unknown flag or a bad value: usage and exit 2), joins the dist group (rank
  0 listens on DIST_INIT_ADDR's port, the others connect; a member that goes away takes the others
  down with a Traceback, as NCCL does), prints the boot log, and on rank 0 serves the API on
  ``--host``/``--port``: ``/health`` and ``/health_generate``, ``/get_load`` and ``/v1/loads``
  (running and waiting requests), ``/server_info`` and ``/model_info`` (also under their old
  names ``/get_...``: what a router reads of a line), ``/v1/models``, ``/v1/chat/completions`` (plain and streamed
  as SSE ``data:`` chunks ending in ``data: [DONE]``), and with ``--enable-metrics`` (only then,
  404 otherwise, as SGLang) ``/metrics`` (below). With an API key every path but the health
  probes and ``/metrics`` needs ``Authorization: Bearer <key>`` (401 otherwise; SGLang's
  add_api_key_middleware passes /health* and /metrics*). Workers print their lines and
  wait in the dist group until TERM.

The boot log of every rank, in order: the source stamps of the image (``SOURCE_COMMIT b12x_next
<40 hex>`` and ``SOURCE_PATCH b12x_next <16 hex>``, read from ``/opt/b12x_next/b12x_next/``),
dist init, ``Load weight begin``, the lines of every adapter whose gates are armed in the env it
received (the registry's ``boot`` entries: ``when`` evaluated here over this rank's env, ``{VAR}``
from it, ``...`` filled in; an adapter with launcher = "tp4" only when DSV41_LAUNCHER=tp4), ``Load
weight end``, ``DSV4 memory calculation: ... full_token=<pool>``, the CUDA graph capture with its
time, ``max_total_num_tokens=<min(pin, pool)>, ...``; rank 0 then ``The server is fired up and
ready to roll!``, one ``Prefill batch. ... input throughput (token/s): <X>`` and one ``Decode
batch. ...`` line per warm-up request. The registry is read from ``registry.toml`` beside this
file (the test image puts it there) or else from the repository's python/tp4/data/registry.toml.
A plan that arms a gate wrongly (a key missing from a rank's env, a wrong value) thus shows up as
a missing line, because the line is printed only when this rank's env arms it.

Test controls (environment of the container; they are not engine settings):

  TP4_STANDIN_FAULT        comma-separated fault modes (below); empty: a healthy rank
  TP4_STANDIN_COLOCATED    1: the ranks run side by side on one machine, so ranks above 0 leave
                           --port to rank 0 (on hosts of their own they answer /health there,
                           as SGLang's dummy health check server does)
  TP4_STANDIN_FAULT_RANK   the rank the faults apply to: a number or "all" (default 0; for
                           `commit` the last rank)
  TP4_STANDIN_ROOT         where the container's root is (default /): MODEL_PATH, STATE_PATH and
                           the image trees are looked up under it, so a host run keeps the
                           plan's env verbatim
  TP4_STANDIN_PACE         seconds each boot phase takes (default 0.2)
  TP4_STANDIN_KV_POOL      the KV pool (tokens) the memory calculation arrives at (default 9000000)
  TP4_STANDIN_SLOW_FACTOR  `slow`: the warm-up throughput divisor (default 20)
  TP4_STANDIN_BUSY_SECONDS `busy`: how long each completion takes (default 5)
  TP4_STANDIN_WEDGE_AFTER  `wedge`: completions (beyond boot.py's) answered before it wedges
                           (default 0; 1 lets `tp4 serve`'s own completion through)
  TP4_STANDIN_WEDGE_LOAD   `wedge`: what the load endpoints and /metrics count of the hung
                           requests: empty (the default) counts none running; `held` keeps them
                           running, as a scheduler stuck in a collective does (b12x#313); the
                           wedge of ``POST /standin/wedge`` always keeps them
  TP4_STANDIN_ANSWERS      a JSON file of scripted answers, `[{"contains": TEXT, "answer": TEXT}]`:
                           a plain completion whose prompt contains TEXT (the first entry that
                           matches) is answered with that answer, one token per word (so
                           max_tokens cuts it, finish_reason length); `tp4 qeval`'s tests
  SGLANG_HEALTH_CHECK_TIMEOUT  SGLang's own: how long ``/health_generate`` of a wedged engine
                           waits for its one-token request before it answers 503 (default 20)
  TP4_STANDIN_CONTEXT_TOKENS      the context length: a prompt of this many tokens or more gets
                           SGLang's HTTP 400 `The input (N tokens) is longer than the model's
                           context length (M tokens).` (default: no limit)
  TP4_STANDIN_NEEDLE_LOST_BEYOND  a needle question (below) in a prompt of more tokens than this
                           is answered without the passphrase (default: always found)

While the engine serves, ``POST /standin/wedge`` with ``{"wedged": true}`` or ``{"wedged": false}``
(a test control, no key needed; see :func:`wedge_control`) wedges it or lets it recover: its
completions hang (those already hanging finish once it recovers) and ``/health_generate`` fails
as SGLang's does, while ``/health`` stays 200; ``{"wedged": null}`` goes back to what the
`wedge` fault says. Nothing changes until a test posts it.

The running batch (SGLang's scheduler): at most ``--max-running-requests`` completions (its argv's,
default 16) run at once; one beyond it waits in the queue, first in first out, until a running one
finishes, and is counted waiting meanwhile (``num_waiting_reqs`` of ``/v1/loads``, ``/get_load``'s
``num_waiting_reqs`` and ``num_reqs``, the ``sglang:num_queue_reqs`` gauge, ``#queue-req`` of the
batch log lines), running once it leaves the queue. A waiting request whose client closes its
connection leaves the queue without running (SGLang aborts it). boot.py's own requests (the
``X-Tp4-Standin-Boot`` header) run at once, never queued, and count running: so a warm-up batch
of ``MAX_RUNNING_REQUESTS`` is one batch, as upstream. A hung completion of a wedge keeps its
place in the batch; the `busy` fault's foreign requests are only reported, they take no place.

``/metrics`` (``--enable-metrics``) answers in SGLang's Prometheus text format (version 0.0.4,
multiprocess mode: no ``_created`` series), with the names, help texts and labels of
sglang/srt/metrics/collector.py: the scheduler's gauges ``sglang:num_running_reqs`` and
``sglang:num_queue_reqs`` (what the load endpoints report) and its counter
``sglang:realtime_tokens_total{mode="prefill_compute"|"prefill_cache"|"decode"}`` (a completion's
prompt and answer, and every 0.5 s (its log interval) 2 decode tokens for each running request
while the engine is not wedged: the `busy` fault's foreign requests progress), and the tokenizer's
counters ``sglang:prompt_tokens_total`` and ``sglang:generation_tokens_total`` (per
``is_streaming`` label set, when a request finishes). A wedged engine counts nothing.

Bench timing (`tp4 bench`, SGLang's `bench_serving`; :func:`exact_length` and :class:`Pacing`). A
request that asks for its length exactly (``ignore_eos`` or ``min_tokens``, as a benchmark does)
gets exactly ``max_tokens`` completion tokens (finish_reason ``length``); the length asked is
``max_completion_tokens`` when given, else ``max_tokens`` (SGLang's order). Every streamed answer
is paced as below, whatever the request asked:

  TP4_STANDIN_DECODE_TPS        per-stream decode rate in tokens/s: the events of a stream are sent
                                at first + j * tokens_per_event / rate (0, the default: as fast as it can)
  TP4_STANDIN_TOKENS_PER_EVENT  completion tokens per SSE event (default 3, as the line's
                                speculative decoding sends; the last event may carry fewer)
  TP4_STANDIN_PREFILL_TPS       prefill rate in tokens/s: the first content event comes
                                prompt_tokens / rate after the request (0, the default: at once);
                                prompt tokens are the prompt's words
  TP4_STANDIN_TTFT_SECONDS      a floor under that: the first content event comes no sooner than
                                this after the request was read (default 0)
  TP4_STANDIN_NO_MIN_TOKENS     1: a request with min_tokens or ignore_eos is refused with HTTP 400
                                (an engine without them; sparkDash retries without)

A streamed answer is sent with ``Transfer-Encoding: chunked`` on a connection kept alive for the
next request, as SGLang's server (uvicorn) sends it; ``POST /v1/completions`` (``prompt`` a string
or a list of strings, joined) answers as ``/v1/chat/completions`` does, in the completions API's
shape (``text_completion``, ``choices[].text``).

boot.py hands the engine the API key in TP4_STANDIN_API_KEY (upstream appends --api-key to the
argv, which the host's process table would show) and its pid in TP4_STANDIN_BOOT_PID (the engine
dies with it, as a container's processes die with its pid 1).

Fault modes:

  omit-line    the rank does not print the first required adapter line its env arms
               (TP4_STANDIN_OMIT=<text> picks the first armed line containing <text>)
  forbidden    the rank prints a forbidden line after the adapter lines:
               `[l2_prefetch] plan MISMATCH at layer 3` (TP4_STANDIN_FORBIDDEN=<text> replaces it)
  crash        Traceback during the weight load, exit 1 (boot.py exits 1 with it)
  hang         stops after the CUDA graph capture: no API, never Ready (TERM still stops it)
  wedge        after boot.py's own smoke and warm-up, every completion hangs while /health
               answers 200 and the load endpoints report nothing running or waiting
               (TP4_STANDIN_WEDGE_LOAD=held: the hung requests stay running);
               /health_generate (SGLang's generating probe) waits SGLANG_HEALTH_CHECK_TIMEOUT
               seconds and answers 503 once a completion hung
  busy         completions take TP4_STANDIN_BUSY_SECONDS; the load endpoints report them running
               plus three more running and one waiting (foreign traffic)
  slow         the warm-up input throughput is divided by TP4_STANDIN_SLOW_FACTOR
  retune       the autotune cache is redrawn: prints `tuning from scratch` during the warm-up
  commit       the rank prints a different b12x_next commit (its SOURCE_COMMIT line and the
               moe_b12x_next armed line)
  ignore-term  boot.py and the engine ignore SIGTERM (only SIGKILL stops them)
  wrong-answer after boot.py's own smoke, 19 + 23 is answered 41 (also under a JSON schema)
  stall        a streamed completion stops after its first chunk, the connection left open (its
               place in the running batch freed once the client closes it)

Beyond plain text, completions answer as an OpenAI-compatible server does (for `tp4 smoke
--full`), with no model behind them: under ``response_format`` ``json_schema`` the content is one
JSON object of the schema's properties (numbers 42 for the 19 + 23 question, else 0; strings "");
with ``tools`` offered and the last message the user's, a prompt that names a tool (or a
``tool_choice`` that requires one) gets a call of it (finish_reason ``tool_calls``; a required
string argument is the prompt's first quoted word); after a ``tool`` message the answer is that
tool's result (its ``value`` when it is a JSON object with one). The needle question of `tp4
bench needle` (tp4.measuring.needle: "What is the secret passphrase ...") is answered with the passphrase of
the prompt's needle sentence (``The secret passphrase is <code>.``), as a model that read the
whole prompt would. A prompt's tokens are its words (``len(prompt.split())``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import tomllib
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, NoReturn

HERE = Path(__file__).resolve().parent
FAULTS = (
    "omit-line",
    "forbidden",
    "crash",
    "hang",
    "wedge",
    "busy",
    "slow",
    "retune",
    "commit",
    "ignore-term",
    "wrong-answer",
    "stall",
)
NO_AUTH = ("", "none", "off", "dummy", "0")
QUESTION = "What is 19 + 23? Reply only with the number."
PROSE = (
    "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor incididunt ut labore et "
    "dolore magna aliqua. Ut enim ad minim veniam, quis nostrud exercitation ullamco laboris nisi ut aliquip "
    "ex ea commodo consequat."
).split()
# boot.py's warm-up prompts (words each) and the tokens it asks for
WARMUP_WORDS = (12, 200, 900, 3600)
WARMUP_TOKENS = 24
# the header boot.py's own requests carry (the wedge starts after them)
BOOT_HEADER = "X-Tp4-Standin-Boot"
ENGINE = ("python", "-m", "sglang.launch_server")
# tp4.measuring.needle's protocol: the question, and the needle sentence holding the passphrase
NEEDLE_QUESTION = "What is the secret passphrase"
NEEDLE_SENTENCE = re.compile(r"The secret passphrase is ([A-Za-z0-9-]+)\.")
# tp4/data/container.toml `image.b12x_next` (tests/test_standin.py keeps them equal)
B12X_NEXT = "/opt/b12x_next"


_OUT = threading.Lock()


def log(text: str) -> None:
    with _OUT:  # one write per line: request threads print too
        sys.stdout.write(text + "\n")
        sys.stdout.flush()


def engine_log(rank: int, text: str) -> None:
    log(f"[{time.strftime('%Y-%m-%d %H:%M:%S')} TP{rank}] {text}")


def die(text: str, code: int = 1) -> NoReturn:
    print(text, file=sys.stderr, flush=True)
    sys.exit(code)


# --- test controls ---------------------------------------------------------------------------------


def root() -> Path:
    return Path(os.environ.get("TP4_STANDIN_ROOT") or "/")


def at_root(path: str) -> Path:
    return root() / path.lstrip("/")


def faults(rank: int, nnodes: int) -> set[str]:
    names = {f.strip() for f in os.environ.get("TP4_STANDIN_FAULT", "").split(",") if f.strip()}
    unknown = names - set(FAULTS)
    if unknown:
        die(f"TP4_STANDIN_FAULT: unknown fault {', '.join(sorted(unknown))}; fix: use {', '.join(FAULTS)}", 2)
    where = os.environ.get("TP4_STANDIN_FAULT_RANK", "")
    out = set()
    for name in names:
        target = where or (str(nnodes - 1) if name == "commit" else "0")
        if target == "all" or target == str(rank):
            out.add(name)
    return out


def number(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name) or default)
    except ValueError:
        die(f"{name}: must be a number", 2)


def pace(factor: float = 1.0) -> None:
    time.sleep(number("TP4_STANDIN_PACE", 0.2) * factor)


# --- the registry's boot lines, evaluated over this rank's env ---------------------------------------

_COND = re.compile(r"^(?P<var>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>>=|<=|!=|=|~)(?P<arg>.*))?$")
_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)(\+1)?\}")


def registry() -> dict[str, Any]:
    for path in (HERE / "registry.toml", HERE.parent.parent / "python" / "tp4" / "data" / "registry.toml"):
        if path.exists():
            with open(path, "rb") as fh:
                return tomllib.load(fh)
    die("stand-in: no registry.toml beside the engine or in the repository")


def fill(text: str, env: dict[str, str]) -> str:
    def sub(m: re.Match[str]) -> str:
        value = env.get(m[1], "")
        if m[2]:
            try:
                return str(int(value) + 1)
            except ValueError:
                return "?"
        return value

    return _PLACEHOLDER.sub(sub, text)


class Gates:
    """The adapters' view of the env: a gate is off when its value is one of its off values."""

    def __init__(self, reg: dict[str, Any], env: dict[str, str]) -> None:
        self.env = env
        self.off_default = [str(v) for v in reg.get("off_values", ["", "0", "off", "false"])]
        self.gates = {g["var"]: g for a in reg["adapter"] for g in a.get("gates", [])}

    def value(self, var: str) -> str | None:
        default = self.gates.get(var, {}).get("default")
        return self.env.get(var, None if default is None else str(default))

    def on(self, var: str) -> bool:
        value = self.value(var)
        off = self.gates[var].get("off", self.off_default) if var in self.gates else self.off_default
        return value is not None and value.strip().lower() not in off

    def holds(self, cond: str) -> bool:
        if cond.startswith("!"):
            return not self.holds(cond[1:])
        m = _COND.match(cond)
        if not m:
            die(f"stand-in: bad registry condition {cond!r}")
        var, op = m["var"], m["op"]
        if op is None:
            return self.on(var)
        arg, value = fill(m["arg"], self.env), self.value(var)
        if op == "!=":
            return value != arg
        if value is None:
            return False
        if op == "=":
            return value == arg
        if op == "~":
            return arg in value.split(",") or "all" in value.split(",")
        try:
            return float(value) >= float(arg) if op == ">=" else float(value) <= float(arg)
        except ValueError:
            return False


def filler(before: str, kv: dict[str, str]) -> str:
    """What stands for one `...` of a registry line, given the text before it."""
    for key, value in kv.items():
        if before.endswith(f"{key}="):
            return value
    if before.endswith("="):
        return "True"
    if before.endswith("("):
        return "6.0 MB"
    return "stand-in" if before.endswith(" ") or not before else " (stand-in)"


def armed_lines(env: dict[str, str], kv: dict[str, str]) -> list[tuple[str, bool]]:
    """(line, required) for every registry boot line this env arms, `...` filled in."""
    reg = registry()
    gates = Gates(reg, env)
    out = []
    for adapter in reg["adapter"]:
        if adapter["name"] == "engine":
            continue  # SGLang's own lines: the engine prints them from its argv (engine_main)
        if adapter.get("launcher") == "tp4" and env.get("DSV41_LAUNCHER") != "tp4":
            continue  # M's sitecustomize installs these only under the TP4 launcher
        for boot in adapter.get("boot", []):
            if all(gates.holds(c) for c in boot.get("when", [])):
                parts = fill(boot["line"], env).split("...")
                text = parts[0]
                for part in parts[1:]:
                    text += filler(text, kv) + part
                out.append((text, boot.get("required", True)))
    return out


def stamps(commit_fault: bool) -> tuple[str, str] | None:
    """The b12x_next tree's SOURCE_COMMIT and SOURCE_PATCH (tp4/data/container.toml's b12x_next)."""
    tree = at_root(B12X_NEXT) / "b12x_next"
    try:
        commit = (tree / "SOURCE_COMMIT").read_text().strip()
        patch = (tree / "SOURCE_PATCH").read_text().strip()
    except OSError:
        return None
    if commit_fault:
        commit = "f" * 8 + commit[8:]
    return commit, patch


# --- the engine argv, as boot.py builds it from the env ---------------------------------------------


def boot_argv(env: dict[str, str]) -> list[str]:
    g = env.get
    argv = [
        *ENGINE,
        "--model-path",
        g("MODEL_PATH", "/models/DeepSeek-V4.1-Flash"),
        "--served-model-name",
        g("SERVED_MODEL_NAME", "deepseek-v4.1-flash"),
        "--trust-remote-code",
        "--load-format",
        "safetensors",
        "--tp",
        g("TP_SIZE", "4"),
        "--ep-size",
        g("EP_SIZE", g("TP_SIZE", "4")),
        "--attention-backend",
        g("ATTENTION_BACKEND", "dsv4"),
        "--moe-runner-backend",
        g("MOE_RUNNER_BACKEND", "flashinfer_mxfp4"),
        "--mem-fraction-static",
        g("MEM_FRACTION_STATIC", ""),
        "--chunked-prefill-size",
        g("CHUNKED_PREFILL_SIZE", ""),
        "--context-length",
        g("CONTEXT_LENGTH", ""),
        "--max-running-requests",
        g("MAX_RUNNING_REQUESTS", ""),
        "--cuda-graph-max-bs-decode",
        g("CUDA_GRAPH_MAX_BS_DECODE", ""),
        "--random-seed",
        "0",
        "--enable-decoder-swa-bounded-replay",
        "--tool-call-parser",
        "deepseekv41",
        "--reasoning-parser",
        "deepseek-v41",
        "--host",
        g("HOST", "0.0.0.0"),
        "--port",
        g("SERVER_PORT", "8888"),
    ]
    if g("SPEC_ALGO", "").lower() not in ("off", "none", "0", ""):
        argv += ["--speculative-algorithm", "DSPARK", "--speculative-dspark-block-size", g("DSPARK_BLOCK_SIZE", "")]
        sps, sts = g("DSPARK_SPS_TABLE", ""), g("DSPARK_STS_TABLE", "")
        if sps and at_root(sps).is_file():
            argv += [
                "--speculative-dspark-sps-table-path",
                sps,
                "--speculative-dspark-align-verify-tokens-to-graph-tier",
            ]
        if sts and at_root(sts).is_file():
            argv += ["--speculative-dspark-confidence-sts-path", sts]
    if int(g("NNODES", "1") or "1") > 1:
        argv += [
            "--nnodes",
            g("NNODES", ""),
            "--node-rank",
            g("NODE_RANK", "0"),
            "--dist-init-addr",
            g("DIST_INIT_ADDR", ""),
        ]
    if g("MAX_TOTAL_TOKENS", "") not in ("", "0"):
        argv += ["--max-total-tokens", g("MAX_TOTAL_TOKENS", "")]
    argv += g("EXTRA_SGLANG_ARGS", "").split()
    return argv


def api_key(env: dict[str, str]) -> str:
    """boot.py's key: API_KEY unless it means "no auth", else the key file in the state dir."""
    key = env.get("API_KEY", "")
    if key.strip().lower() not in NO_AUTH:
        return key
    path = at_root(env.get("STATE_PATH", "/state")) / "api-key"
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def int_env(env: dict[str, str], key: str, default: str) -> int:
    try:
        return int(env.get(key, default))
    except ValueError:
        die(f"boot: {key}={env.get(key)!r} is not an integer")


def check_boot_env(env: dict[str, str]) -> tuple[int, int]:
    """boot.py's own checks before it starts the engine; returns (rank, nnodes)."""
    mode = env.get("OFFLOAD_MODE", "nvme")
    if mode not in ("nvme", "ram"):
        die(f"boot: OFFLOAD_MODE={mode!r} is not nvme or ram")
    if mode == "ram" and env.get("ALLOW_RAM_OFFLOAD") != "1":
        die("boot: OFFLOAD_MODE=ram pins ~189 GiB and does not fit; set ALLOW_RAM_OFFLOAD=1 to force it")
    context = int_env(env, "CONTEXT_LENGTH", "1048576")
    if not 4096 <= context <= 1048576:
        die(f"boot: CONTEXT_LENGTH={context} is outside 4096..1048576")
    nnodes, rank = int_env(env, "NNODES", "1"), int_env(env, "NODE_RANK", "0")
    if not 0 <= rank < max(nnodes, 1):
        die(f"boot: NODE_RANK={rank} is not a rank of NNODES={nnodes}")
    if nnodes > 1 and not env.get("DIST_INIT_ADDR"):
        die(f"boot: NNODES={nnodes} needs DIST_INIT_ADDR (host:port of rank 0)")
    model = env.get("MODEL_PATH", "/models/DeepSeek-V4.1-Flash")
    if not at_root(model).joinpath("config.json").is_file():
        if env.get("SKIP_PREPARE") == "1" or rank > 0:
            die(f"boot: prepare: {model}/config.json not found (SKIP_PREPARE=1: the checkpoint must be in place)")
        die(f"boot: prepare: {model}/config.json not found, and the stand-in cannot download the checkpoint")
    return rank, nnodes


# --- the boot role (boot.py) ------------------------------------------------------------------------


def http(method: str, url: str, body: dict[str, Any] | None, key: str, timeout: float) -> tuple[int, dict[str, Any]]:
    headers = {"Content-Type": "application/json", BOOT_HEADER: "1"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as exc:
        return exc.code, {}


def chat(base: str, key: str, text: str, max_tokens: int) -> dict[str, Any]:
    body = {
        "model": "default",
        "messages": [{"role": "user", "content": text}],
        "temperature": 0,
        "max_tokens": max_tokens,
        "chat_template_kwargs": {"thinking": False},
    }
    status, out = http("POST", f"{base}/v1/chat/completions", body, key, 180)
    if status != 200:
        raise RuntimeError(f"HTTP {status}")
    return out


def boot_main(argv: list[str]) -> int:
    sub = argv[0] if argv else "run"
    env = dict(os.environ)
    if sub == "health":
        port = env.get("SERVER_PORT", "8888")
        try:
            status, _ = http("GET", f"http://127.0.0.1:{port}/health", None, "", 30)
        except OSError as exc:
            print(f"health: 127.0.0.1:{port}: {exc}", file=sys.stderr)
            return 1
        if status != 200:
            print(f"health: 127.0.0.1:{port}/health answered {status}", file=sys.stderr)
        return 0 if status == 200 else 1
    if sub not in ("run", "serve"):
        die("usage: boot.py {run,prepare,health,smoke}\nboot.py: error: unknown command " + repr(sub), 2)
    rank, nnodes = check_boot_env(env)
    mine = faults(rank, nnodes)
    key = api_key(env)
    args = boot_argv(env)
    state = at_root(env.get("STATE_PATH", "/state"))
    try:
        state.mkdir(parents=True, exist_ok=True)
        (state / "launch.json").write_text(
            json.dumps(
                {
                    "mode": env.get("OFFLOAD_MODE", "nvme"),
                    "args": args,
                    "nnodes": nnodes,
                    "rank": rank,
                    "tp": env.get("TP_SIZE", "4"),
                    "ep": env.get("EP_SIZE", env.get("TP_SIZE", "4")),
                },
                indent=1,
            )
            + "\n"
        )
    except OSError as exc:
        log(f"boot: WARNING: cannot write {state}/launch.json: {exc.strerror}")
    # the stand-in passes the key in the engine's env, not its argv (upstream boot.py appends
    # --api-key): the host's process table shows a container's argv
    child_env = {
        **env,
        "DSV41_SOURCE": env.get("MODEL_PATH", "/models/DeepSeek-V4.1-Flash"),
        "TP4_STANDIN_API_KEY": key,
        "TP4_STANDIN_BOOT_PID": str(os.getpid()),
    }
    log(f"boot: rank {rank}/{nnodes} starting {' '.join(args[:3])} ({len(args) - 3} arguments)")
    child = subprocess.Popen(
        [sys.executable, "-u", str(Path(__file__).resolve()), *args], env=child_env, start_new_session=True
    )

    def stop(signum: int, _frame: object) -> None:
        # reaped with os.waitpid: the main thread may be inside child.wait(), holding its lock
        try:
            os.killpg(child.pid, signal.SIGTERM)
            deadline = time.monotonic() + 10
            while os.waitpid(child.pid, os.WNOHANG) == (0, 0):
                if time.monotonic() > deadline:
                    os.killpg(child.pid, signal.SIGKILL)
                    break
                time.sleep(0.02)
        except (ProcessLookupError, ChildProcessError):
            pass
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, signal.SIG_IGN if "ignore-term" in mine else stop)
    signal.signal(signal.SIGINT, stop)
    if rank > 0:
        return child.wait()
    port = env.get("SERVER_PORT", "8888")
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + number("READY_TIMEOUT_S", 3600)
    while True:
        if child.poll() is not None:
            log(f"boot: the engine exited with code {child.returncode} before /health answered")
            return child.returncode or 1
        try:
            if http("GET", f"{base}/health", None, "", 3)[0] == 200:
                break
        except OSError:
            pass
        if time.monotonic() > deadline:
            log("boot: /health did not answer in READY_TIMEOUT_S")
            return 1
        time.sleep(0.1)
    if env.get("SKIP_SMOKE") != "1":
        out = chat(base, key, QUESTION, 32)
        choice = out["choices"][0]
        if choice["message"]["content"].strip() != "42" or choice["finish_reason"] != "stop":
            log(f"boot: SMOKE FAILED: {choice!r}")
            return 1
        (state / "smoke.json").write_text(json.dumps(out) + "\n")
        log("boot: smoke ok: 42 (finish_reason stop)")
    if env.get("WARMUP", "1") != "0":
        started = time.monotonic()
        for words in WARMUP_WORDS:
            chat(base, key, " ".join((PROSE * (words // len(PROSE) + 1))[:words]), WARMUP_TOKENS)
        batch = int_env(env, "MAX_RUNNING_REQUESTS", "16")

        def one() -> None:
            try:
                chat(base, key, "Write one sentence in Latin.", WARMUP_TOKENS)
            except (OSError, RuntimeError) as exc:  # boot.py: warm-up failures only warn
                log(f"boot: WARNING: warm-up request failed: {exc}")

        threads = [threading.Thread(target=one) for _ in range(batch)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        log(f"Warm-up done in {time.monotonic() - started:.0f}s")
    state_shown = env.get("STATE_PATH", "/state")
    log(
        f"Ready: API on port {port} (rank 0). Key is in {state_shown}/api-key."
        if key
        else f"Ready: API on port {port} (rank 0), no API key."
    )
    return child.wait()


# --- the engine role (sglang.launch_server) ---------------------------------------------------------


def engine_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="launch_server.py", allow_abbrev=False)
    text = (
        "--model-path",
        "--served-model-name",
        "--load-format",
        "--attention-backend",
        "--moe-runner-backend",
        "--tool-call-parser",
        "--reasoning-parser",
        "--host",
        "--speculative-algorithm",
        "--speculative-dspark-sps-table-path",
        "--speculative-dspark-confidence-sts-path",
        "--dist-init-addr",
        "--api-key",
        "--fp8-gemm-backend",
    )
    ints = (
        "--tp",
        "--ep-size",
        "--chunked-prefill-size",
        "--context-length",
        "--max-running-requests",
        "--cuda-graph-max-bs-decode",
        "--random-seed",
        "--port",
        "--speculative-dspark-block-size",
        "--nnodes",
        "--node-rank",
        "--max-total-tokens",
        "--min-free-slots-delay",
    )
    floats = ("--mem-fraction-static", "--watchdog-timeout")
    switches = (
        "--trust-remote-code",
        "--enable-decoder-swa-bounded-replay",
        "--speculative-dspark-align-verify-tokens-to-graph-tier",
        "--enable-deepseek-v4-fp4-indexer",
        "--enable-cache-report",
        "--sleep-on-idle",
        "--enable-metrics",
    )
    for flag in text:
        p.add_argument(flag)
    for flag in ints:
        p.add_argument(flag, type=int)
    for flag in floats:
        p.add_argument(flag, type=float)
    for flag in switches:
        p.add_argument(flag, action="store_true")
    p.set_defaults(
        model_path=None,
        tp=1,
        ep_size=1,
        nnodes=1,
        node_rank=0,
        host="127.0.0.1",
        port=30000,
        served_model_name=None,
        max_running_requests=16,
        chunked_prefill_size=8192,
        context_length=None,
    )
    return p


class DistGroup:
    """The torch dist group over TCP: rank 0 listens on DIST_INIT_ADDR's port, the others connect.
    A member that goes away aborts the others (as an NCCL communicator does)."""

    def __init__(self, rank: int, nnodes: int, addr: str | None, on_abort: Any) -> None:
        self.rank, self.nnodes, self.addr, self.on_abort = rank, nnodes, addr, on_abort
        self.peers: list[socket.socket] = []

    def join(self) -> None:
        if self.nnodes <= 1:
            return
        assert self.addr is not None
        host, _, port = self.addr.rpartition(":")
        if self.rank == 0:
            srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            srv.bind(("0.0.0.0", int(port)))
            srv.listen(self.nnodes)
            while len(self.peers) < self.nnodes - 1:
                conn, _ = srv.accept()
                peer = conn.recv(16).decode().strip()
                engine_log(0, f"dist group: rank {peer} joined")
                self.peers.append(conn)
            srv.close()
            for conn in self.peers:
                conn.sendall(b"go\n")
        else:
            while True:
                try:
                    conn = socket.create_connection((host, int(port)), timeout=5)
                    break
                except OSError:
                    time.sleep(0.2)
            conn.settimeout(None)
            conn.sendall(f"{self.rank}\n".encode())
            if conn.recv(3) != b"go\n":
                self.on_abort(0)
            self.peers.append(conn)
        for conn in self.peers:
            threading.Thread(target=self._watch, args=(conn,), daemon=True).start()

    def _watch(self, conn: socket.socket) -> None:
        try:
            data = conn.recv(1)
        except OSError:
            data = b""
        if not data:
            self.on_abort(None)


class Engine:
    def __init__(self, args: argparse.Namespace, env: dict[str, str], mine: set[str]) -> None:
        self.args, self.env, self.faults = args, env, mine
        self.key = env.get("TP4_STANDIN_API_KEY") or args.api_key or ""
        self.lock = threading.Lock()
        self.running = 0
        # SGLang's waiting queue: completions beyond --max-running-requests wait here, FIFO
        self.queue: deque[object] = deque()
        self.turn = threading.Condition(self.lock)
        self.limit = max(1, args.max_running_requests or 16)
        self.stopping = threading.Event()
        self.served_name = args.served_model_name or args.model_path
        self.slow = number("TP4_STANDIN_SLOW_FACTOR", 20) if "slow" in mine else 1.0
        self.prefill_seen = 0
        self.answered = 0  # completions other than boot.py's, for TP4_STANDIN_WEDGE_AFTER
        self.wedge_set: bool | None = None  # POST /standin/wedge; None: the `wedge` fault decides
        self.held = env.get("TP4_STANDIN_WEDGE_LOAD", "") == "held"
        # SGLang's counters (collector.py): the scheduler's realtime tokens per mode, the tokenizer's
        # prompt and generation tokens per is_streaming
        self.realtime = {"prefill_compute": 0, "prefill_cache": 0, "decode": 0}
        self.finished_tokens = {s: {"prompt": 0, "generation": 0} for s in ("false", "true")}

    def wedged(self, count: bool = False) -> bool:
        """Whether completions hang now; ``count``: a completion (not boot.py's) arrives."""
        with self.lock:
            if count and "wedge" in self.faults:
                self.answered += 1
            if self.wedge_set is not None:
                return self.wedge_set
            return "wedge" in self.faults and self.answered > number("TP4_STANDIN_WEDGE_AFTER", 0)

    def admit(self, boot: bool, gone: Callable[[], bool]) -> bool:
        """A completion enters the running batch: at once when fewer than --max-running-requests
        run (and none waits before it) or when it is boot.py's own, else after waiting in the
        queue (FIFO) until a running one finishes. False when it never runs: the engine stops or
        ``gone()`` says its client went away while it waited (SGLang aborts such a request)."""
        with self.turn:
            if boot:
                self.running += 1
                return True
            ticket = object()
            self.queue.append(ticket)
            try:
                while not (self.queue[0] is ticket and self.running < self.limit):
                    if self.stopping.is_set() or gone():
                        return False
                    self.turn.wait(0.1)
                self.running += 1
                return True
            finally:
                self.queue.remove(ticket)
                self.turn.notify_all()

    def release(self) -> None:
        """A running completion leaves the batch: the next waiting one may run."""
        with self.turn:
            self.running -= 1
            self.turn.notify_all()

    def load(self) -> dict[str, Any]:
        with self.lock:
            running, waiting = self.running, len(self.queue)
        extra_running, extra_waiting = (3, 1) if "busy" in self.faults else (0, 0)
        if "wedge" in self.faults and not self.held:
            running = waiting = 0
        return {"running": running + extra_running, "waiting": waiting + extra_waiting}

    def count(self, mode: str, tokens: int) -> None:
        with self.lock:
            self.realtime[mode] += tokens

    def finish(self, streaming: bool, prompt: int, generation: int) -> None:
        """The tokenizer's counters of a request that finished (observe_one_finished_request)."""
        with self.lock:
            got = self.finished_tokens["true" if streaming else "false"]
            got["prompt"] += prompt
            got["generation"] += generation

    def tick(self) -> None:
        """The scheduler's log interval: every running request decodes while it is not wedged."""
        while not self.stopping.wait(0.5):
            if not self.wedged():
                self.count("decode", 2 * self.load()["running"])

    def metrics(self) -> str:
        """``/metrics`` as SGLang writes it (module docstring)."""
        model = self.served_name.replace("\\", "\\\\").replace('"', '\\"')
        sched = f'engine_type="unified",model_name="{model}",pp_rank="0",tp_rank="0"'
        load = self.load()
        with self.lock:
            realtime = dict(self.realtime)
            finished = {k: dict(v) for k, v in self.finished_tokens.items()}
        out = [
            "# HELP sglang:num_running_reqs The number of running requests.",
            "# TYPE sglang:num_running_reqs gauge",
            f"sglang:num_running_reqs{{{sched}}} {float(load['running'])}",
            "# HELP sglang:num_queue_reqs The number of requests in the waiting queue.",
            "# TYPE sglang:num_queue_reqs gauge",
            f"sglang:num_queue_reqs{{{sched}}} {float(load['waiting'])}",
            "# HELP sglang:realtime_tokens_total Total number of tokens processed (updated on each log interval). "
            "mode: prefill_compute, prefill_cache, decode.",
            "# TYPE sglang:realtime_tokens_total counter",
            *(f'sglang:realtime_tokens_total{{{sched},mode="{m}"}} {float(n)}' for m, n in realtime.items()),
            "# HELP sglang:prompt_tokens_total Number of prefill tokens processed.",
            "# TYPE sglang:prompt_tokens_total counter",
            *(
                f'sglang:prompt_tokens_total{{is_streaming="{k}",model_name="{model}"}} {float(v["prompt"])}'
                for k, v in finished.items()
            ),
            "# HELP sglang:generation_tokens_total Number of generation tokens processed.",
            "# TYPE sglang:generation_tokens_total counter",
            *(
                f'sglang:generation_tokens_total{{is_streaming="{k}",model_name="{model}"}} {float(v["generation"])}'
                for k, v in finished.items()
            ),
        ]
        return "\n".join(out) + "\n"


class Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256  # the warm-up batch connects at once

    def handle_error(self, request: object, client_address: tuple[str, int]) -> None:
        # a client that went away (a probe's timeout) is no engine error: no Traceback in the log
        engine_log(0, f"HTTP: connection from {client_address[0]} ended early: {sys.exc_info()[1]!r}")


def dummy_health_handler() -> type[BaseHTTPRequestHandler]:
    """What a rank above 0 answers (SGLang's launch_dummy_health_check_server): 200 on /ping,
    /health and /health_generate, 404 on anything else."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            del format, args

        def do_GET(self) -> None:
            found = self.path.split("?")[0] in ("/ping", "/health", "/health_generate")
            self.send_response(200 if found else 404)
            self.send_header("Content-Length", "0")
            self.end_headers()

    return Handler


def handler(engine: Engine) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True  # TCP_NODELAY, as asyncio (uvicorn, SGLang's server) sets it

        def log_message(self, format: str, *args: Any) -> None:
            del format, args  # SGLang logs no access lines by default

        def send_json(self, status: int, body: object) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def authorized(self) -> bool:
            if not engine.key or self.path.split("?")[0] in ("/health", "/health_generate", "/metrics"):
                return True
            if self.headers.get("Authorization", "") == f"Bearer {engine.key}":
                return True
            self.send_json(401, {"error": "Unauthorized"})
            return False

        def do_GET(self) -> None:
            if not self.authorized():
                return
            path = self.path.split("?")[0]
            load = engine.load()
            if path in ("/health", "/health_generate"):
                self.send_response(generating_health(engine) if path == "/health_generate" else 200)
                self.send_header("Content-Length", "0")
                self.end_headers()
            elif path == "/get_load":
                self.send_json(
                    200,
                    [
                        {
                            "dp_rank": 0,
                            "num_reqs": load["running"] + load["waiting"],
                            "num_waiting_reqs": load["waiting"],
                            "num_tokens": 0,
                        }
                    ],
                )
            elif path == "/v1/loads":
                self.send_json(
                    200,
                    {
                        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                        "dp_rank_count": 1,
                        "loads": [
                            {
                                "dp_rank": 0,
                                "num_running_reqs": load["running"],
                                "num_waiting_reqs": load["waiting"],
                                "num_total_reqs": load["running"] + load["waiting"],
                                "max_running_requests": engine.args.max_running_requests,
                            }
                        ],
                    },
                )
            elif path == "/metrics" and engine.args.enable_metrics:
                data = engine.metrics().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            elif path in ("/server_info", "/get_server_info", "/model_info", "/get_model_info"):
                self.send_json(200, server_info(engine, path))
            elif path == "/v1/models":
                self.send_json(
                    200,
                    {
                        "object": "list",
                        "data": [
                            {
                                "id": engine.served_name,
                                "object": "model",
                                "owned_by": "sglang",
                                "root": engine.served_name,
                            }
                        ],
                    },
                )
            else:
                self.send_json(404, {"detail": "Not Found"})

        def do_POST(self) -> None:
            if self.path.split("?")[0] == "/standin/wedge":
                self.send_json(*wedge_control(engine, self.rfile.read(int(self.headers.get("Content-Length") or 0))))
                return
            if not self.authorized():
                return
            path = self.path.split("?")[0]
            if path not in ("/v1/chat/completions", "/v1/completions"):
                self.send_json(404, {"detail": "Not Found"})
                return
            self.text_api = path == "/v1/completions"
            try:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                if self.text_api:
                    given = body["prompt"]
                    prompt = given if isinstance(given, str) else " ".join(str(p) for p in given)
                    body = {**body, "messages": [{"role": "user", "content": prompt}]}
                messages = body["messages"]
                prompt = " ".join(str(m.get("content", "")) for m in messages if m.get("role") != "tool")
                # SGLang's protocol: max_completion_tokens, when given, is the limit (max_tokens is its older name):
                # sglang 0.5.23 srt/entrypoints/openai/protocol.py line 1214 (`self.max_completion_tokens or
                # self.max_tokens`), serving_chat.py line 1180
                max_tokens = int(body.get("max_completion_tokens") or body.get("max_tokens") or 256)
                wrong = "wrong-answer" in engine.faults and self.headers.get(BOOT_HEADER) != "1"
                answer, calls = reply(body, prompt, wrong)
                answer = exact_length(body, answer, max_tokens)
            except (ValueError, KeyError, TypeError, AttributeError):
                self.send_json(400, {"object": "error", "message": "invalid request body", "code": 400})
                return
            if (refusal := context_refusal(prompt)) is not None:
                return self.send_json(400, refusal)
            boot = self.headers.get(BOOT_HEADER) == "1"
            if not engine.admit(boot, self.client_gone):
                self.close_connection = True
                return
            self.counted = True
            try:
                if not boot and engine.wedged(count=True):
                    # a wedged rank: the request finishes only if the engine recovers
                    while engine.wedged() and not engine.stopping.wait(0.1):
                        pass
                    if engine.stopping.is_set():
                        return
                if "busy" in engine.faults and not boot:
                    time.sleep(number("TP4_STANDIN_BUSY_SECONDS", 5))
                self.complete(prompt, max_tokens, bool(body.get("stream")), answer, calls)
            finally:
                self.finished()

        def finished(self) -> None:
            """The request leaves the running count once, before its last bytes are sent: SGLang's
            scheduler drops a finished request from its batch before the tokenizer manager writes
            the final chunk, so a client that has read the answer never sees it still running."""
            if getattr(self, "counted", False):
                self.counted = False
                engine.release()

        def client_gone(self) -> bool:
            """Whether the client closed its connection (a waiting request's client that timed out)."""
            try:
                if not select.select([self.connection], [], [], 0)[0]:
                    return False
                return self.connection.recv(1, socket.MSG_PEEK) == b""
            except OSError:
                return True

        def complete(
            self, prompt: str, max_tokens: int, stream: bool, answer: list[str], calls: list[dict[str, Any]]
        ) -> None:
            # the EOS token counts against max_tokens: "42" then EOS needs two
            tokens = answer[:max_tokens]
            finish = "tool_calls" if calls else "stop" if len(answer) < max_tokens else "length"
            prompt_tokens = len(prompt.split())
            completion_tokens = len(tokens) + (1 if finish == "stop" else 0)
            with engine.lock:
                engine.prefill_seen += 1
                seen, running, waiting = engine.prefill_seen, engine.running, len(engine.queue)
            engine.count("prefill_compute", prompt_tokens)
            engine.count("decode", completion_tokens)
            tps = (4200.0 + 137 * (seen % 5)) / 8 / engine.slow
            engine_log(
                0,
                f"Prefill batch. #new-seq: 1, #new-token: {prompt_tokens}, #cached-token: 0, token usage: 0.00, "
                f"#running-req: {running - 1}, #queue-req: {waiting}, input throughput (token/s): {tps:.2f}",
            )
            engine_log(
                0,
                f"Decode batch. #running-req: {running}, #token: {prompt_tokens + completion_tokens}, "
                f"token usage: 0.00, accept len: 3.10, cuda graph: True, gen throughput (token/s): {89.7 / engine.slow:.2f}, #queue-req: {waiting}",
            )
            if "retune" in engine.faults and seen == 1:
                engine_log(0, "flashinfer autotune: cache digest changed, tuning from scratch")
            ident = f"chatcmpl-{os.getpid()}-{time.monotonic_ns()}"
            usage = {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            }
            if not stream:
                self.finished()
                engine.finish(False, prompt_tokens, completion_tokens)
            if not stream and self.text_api:
                self.send_json(
                    200,
                    {
                        "id": ident,
                        "object": "text_completion",
                        "created": int(time.time()),
                        "model": engine.served_name,
                        "usage": usage,
                        "choices": [{"index": 0, "text": "".join(tokens), "logprobs": None, "finish_reason": finish}],
                    },
                )
                return
            if not stream:
                self.send_json(
                    200,
                    {
                        "id": ident,
                        "object": "chat.completion",
                        "created": int(time.time()),
                        "model": engine.served_name,
                        "usage": usage,
                        "choices": [
                            {
                                "index": 0,
                                "message": {
                                    "role": "assistant",
                                    "content": "".join(tokens).strip() if not calls else None,
                                    **({"tool_calls": calls} if calls else {}),
                                },
                                "finish_reason": finish,
                            }
                        ],
                    },
                )
                return
            # uvicorn's streaming response: chunked, the connection kept alive for the next request
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()

            def send(data: bytes) -> None:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()

            def chunk(delta: dict[str, Any], finish_reason: str | None, **extra: object) -> None:
                if self.text_api:  # sglang 0.5.23 protocol.py lines 546-575: CompletionStreamResponse
                    text = delta.get("content")
                    if not text and finish_reason is None:
                        return  # the completions API has no role or tool-call chunk
                    choice: dict[str, Any] = {"index": 0, "text": text or "", "logprobs": None}
                    kind = "text_completion"
                else:
                    choice, kind = {"index": 0, "delta": delta}, "chat.completion.chunk"
                data = {
                    "id": ident,
                    "object": kind,
                    "created": int(time.time()),
                    "model": engine.served_name,
                    "choices": [{**choice, "finish_reason": finish_reason}],
                    **extra,
                }
                send(f"data: {json.dumps(data)}\n\n".encode())

            pacing = Pacing.of(prompt_tokens)
            chunk({"role": "assistant", "content": ""}, None)
            if "stall" in engine.faults:  # until its client leaves (SGLang aborts it): its place in the batch freed
                while not engine.stopping.wait(0.1) and not self.client_gone():
                    pass
                self.close_connection = True
                return
            if calls:
                chunk({"tool_calls": [{"index": i, **c} for i, c in enumerate(calls)]}, None)
            for text in pacing.events([] if calls else tokens):
                chunk({"content": text}, None)
            self.finished()
            engine.finish(True, prompt_tokens, completion_tokens)
            chunk({}, finish, usage=usage)
            send(b"data: [DONE]\n\n")
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()

    return Handler


def server_info(engine: Engine, path: str) -> dict[str, Any]:
    """SGLang's ``/server_info`` (``/get_server_info``: some of its server args) and ``/model_info``
    (``/get_model_info``), which a router reads when a line registers (its served model name)."""
    if path.endswith("model_info"):
        return {"model_path": engine.args.model_path, "tokenizer_path": engine.args.model_path, "is_generation": True}
    a = engine.args
    return {
        "model_path": a.model_path,
        "served_model_name": engine.served_name,
        "tp_size": a.tp,
        "dp_size": 1,
        "max_running_requests": a.max_running_requests,
        "version": "stand-in",
    }


def generating_health(engine: Engine) -> int:
    """SGLang's ``/health_generate``: one token through the scheduler, 503 when none comes within
    SGLANG_HEALTH_CHECK_TIMEOUT seconds (http_server.py's health handler). A wedged engine
    generates nothing: the probe waits the timeout out (answering 200 as soon as it recovers)."""
    deadline = time.monotonic() + number("SGLANG_HEALTH_CHECK_TIMEOUT", 20)
    while engine.wedged():
        if time.monotonic() > deadline or engine.stopping.wait(0.1):
            engine_log(
                0,
                "Health check failed. Server couldn't get a response from detokenizer for last "
                f"{number('SGLANG_HEALTH_CHECK_TIMEOUT', 20):g} seconds.",
            )
            return 503
    return 200


def wedge_control(engine: Engine, raw: bytes) -> tuple[int, dict[str, Any]]:
    """The test control ``POST /standin/wedge``: ``{"wedged": true}`` wedges the engine (its
    completions hang, /health_generate fails, /health stays 200), ``{"wedged": false}`` lets it
    recover (hanging completions finish), ``{"wedged": null}`` leaves it to the `wedge` fault.
    Answers the state now."""
    try:
        body = json.loads(raw or b"{}")
        value = body["wedged"]
        if value is not None and not isinstance(value, bool):
            raise ValueError(value)
    except (ValueError, KeyError, TypeError):
        return 400, {"error": 'expected {"wedged": true | false | null}'}
    with engine.lock:
        engine.wedge_set = value
    engine_log(0, f"stand-in control: wedged = {value}")
    return 200, {"wedged": engine.wedged()}


def reply(body: dict[str, Any], prompt: str, wrong: bool) -> tuple[list[str], list[dict[str, Any]]]:
    """The answer's tokens and tool calls for a request (the module docstring says how)."""
    scripted = scripted_answer(prompt)
    if scripted is not None:
        return scripted, []
    messages = body["messages"]
    last = messages[-1] if messages else {}
    sum_asked = "19 + 23" in prompt
    if last.get("role") == "tool":
        try:
            result = json.loads(last.get("content") or "")
        except ValueError:
            result = last.get("content")
        if isinstance(result, dict) and "value" in result:
            result = result["value"]
        return [str(result)], []
    tools = [t["function"] for t in body.get("tools") or [] if t.get("type") == "function"]
    choice = body.get("tool_choice") or "auto"
    forced = choice["function"]["name"] if isinstance(choice, dict) else None
    wanted = [
        t
        for t in tools
        if t["name"] == forced or (choice == "required" and not forced) or (choice == "auto" and t["name"] in prompt)
    ]
    if wanted and last.get("role") == "user":
        tool = wanted[0]
        quoted = re.findall("['\"]([^'\"]+)['\"]", prompt)
        params = tool.get("parameters") or {}
        args = {
            name: (quoted[0] if quoted else "") if spec.get("type") == "string" else 0
            for name, spec in (params.get("properties") or {}).items()
            if name in (params.get("required") or [])
        }
        return [], [
            {
                "id": f"call_{time.monotonic_ns()}",
                "type": "function",
                "function": {"name": tool["name"], "arguments": json.dumps(args)},
            }
        ]
    fmt = body.get("response_format") or {}
    if fmt.get("type") == "json_schema":
        schema = (fmt.get("json_schema") or {}).get("schema") or {}
        number_ = (41 if wrong else 42) if sum_asked else 0
        obj = {
            name: number_ if spec.get("type") in ("integer", "number") else "" if spec.get("type") == "string" else None
            for name, spec in (schema.get("properties") or {}).items()
        }
        return [json.dumps(obj)], []
    if (passphrase := needle_reply(prompt)) is not None:
        return passphrase, []
    if QUESTION in prompt:
        return ["41" if wrong else "42"], []
    return [w + " " for w in PROSE], []


def scripted_answer(prompt: str) -> list[str] | None:
    """TP4_STANDIN_ANSWERS: the tokens of the first scripted answer whose `contains` is in the
    prompt (each word with the whitespace before it, so that the tokens join back to the answer)."""
    path = os.environ.get("TP4_STANDIN_ANSWERS")
    if not path:
        return None
    for entry in json.loads(Path(path).read_text()):
        if entry["contains"] in prompt:
            return re.findall(r"\s*\S+", entry["answer"]) or [""]
    return None


def needle_reply(prompt: str) -> list[str] | None:
    """The answer to tp4 bench needle's question: the passphrase of the needle sentence in the
    prompt; without it beyond TP4_STANDIN_NEEDLE_LOST_BEYOND tokens. None: not that question."""
    if NEEDLE_QUESTION not in prompt:
        return None
    lost = os.environ.get("TP4_STANDIN_NEEDLE_LOST_BEYOND")
    found = NEEDLE_SENTENCE.search(prompt)
    if found is None or (lost and len(prompt.split()) > number("TP4_STANDIN_NEEDLE_LOST_BEYOND", 0)):
        return [w + " " for w in "I could not find a passphrase in the notes.".split()]
    return [found[1]]


def context_refusal(prompt: str) -> dict[str, Any] | None:
    """SGLang's refusal of a prompt at or beyond its context length (tokenizer_manager.py,
    `_validate_one_request`: input tokens >= context length), under TP4_STANDIN_CONTEXT_TOKENS;
    None: accepted."""
    if not os.environ.get("TP4_STANDIN_CONTEXT_TOKENS"):
        return None
    limit, tokens = int(number("TP4_STANDIN_CONTEXT_TOKENS", 0)), len(prompt.split())
    if tokens < limit:
        return None
    return {
        "object": "error",
        "message": f"The input ({tokens} tokens) is longer than the model's context length ({limit} tokens).",
        "type": "BadRequestError",
        "param": None,
        "code": 400,
    }


def exact_length(body: dict[str, Any], answer: list[str], max_tokens: int) -> list[str]:
    """A request with ``ignore_eos`` or ``min_tokens`` gets exactly ``max_tokens`` tokens (the
    answer, then prose words), as an engine that ignores EOS gives them; any other, the answer."""
    if not (body.get("ignore_eos") or body.get("min_tokens")) or body.get("tools") or body.get("response_format"):
        return answer
    if os.environ.get("TP4_STANDIN_NO_MIN_TOKENS") == "1":
        raise ValueError("min_tokens and ignore_eos are not supported")  # do_POST answers HTTP 400
    words = [w + " " for w in PROSE]
    out = list(answer)
    while len(out) < max_tokens:
        out.append(words[len(out) % len(words)])
    return out[:max_tokens]


class Pacing:
    """How a streamed answer is timed and cut into SSE events (the module docstring's bench
    timing): the first content event at prompt_tokens / TP4_STANDIN_PREFILL_TPS after the
    request (no sooner than TP4_STANDIN_TTFT_SECONDS), event j at first + j * per_event /
    TP4_STANDIN_DECODE_TPS."""

    def __init__(self, per_event: int, decode_tps: float, prefill_seconds: float) -> None:
        self.per_event, self.decode_tps, self.prefill_seconds = max(1, per_event), decode_tps, prefill_seconds
        self.started = time.monotonic()

    @classmethod
    def of(cls, prompt_tokens: int) -> Pacing:
        prefill = number("TP4_STANDIN_PREFILL_TPS", 0)
        return cls(
            int(number("TP4_STANDIN_TOKENS_PER_EVENT", 3)),
            number("TP4_STANDIN_DECODE_TPS", 0),
            max(prompt_tokens / prefill if prefill > 0 else 0.0, number("TP4_STANDIN_TTFT_SECONDS", 0)),
        )

    def events(self, tokens: list[str]) -> Iterator[str]:
        """The content of each event, sent when its time has come (the last one's trailing space cut)."""
        groups = [tokens[i : i + self.per_event] for i in range(0, len(tokens), self.per_event)]
        first = self.started + self.prefill_seconds
        for j, group in enumerate(groups):
            due = first + (j * self.per_event / self.decode_tps if self.decode_tps > 0 else 0.0)
            wait = due - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            text = "".join(group)
            yield text.rstrip() if j == len(groups) - 1 else text


def die_with_boot() -> None:
    """Go when boot.py goes, as every process of a container goes with its pid 1 (a host run has
    no container around the two)."""
    boot = os.environ.get("TP4_STANDIN_BOOT_PID")
    if boot:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        if str(os.getppid()) != boot:
            os._exit(1)


def engine_main(argv: list[str]) -> int:
    die_with_boot()
    parser = engine_parser()
    args = parser.parse_args(argv)  # exit 2 with usage on an unknown flag or a bad value
    env = dict(os.environ)
    rank, nnodes = args.node_rank, args.nnodes
    if args.model_path is None:
        parser.error("the following arguments are required: --model-path")
    if nnodes > 1 and not args.dist_init_addr:
        parser.error("--nnodes > 1 needs --dist-init-addr")
    if not 0 <= rank < nnodes:
        parser.error(f"--node-rank {rank} is not below --nnodes {nnodes}")
    if args.tp % nnodes or (args.ep_size and args.tp % args.ep_size):
        parser.error(f"--tp {args.tp} must be a multiple of --nnodes {nnodes} and of --ep-size {args.ep_size}")
    for flag, path in (
        ("--speculative-dspark-sps-table-path", args.speculative_dspark_sps_table_path),
        ("--speculative-dspark-confidence-sts-path", args.speculative_dspark_confidence_sts_path),
    ):
        if path and not at_root(path).is_file():
            parser.error(f"{flag} {path}: no such file")
    mine = faults(rank, nnodes)
    engine = Engine(args, env, mine)

    def abort(peer: int | None) -> None:
        if engine.stopping.is_set():
            return
        who = f"rank {peer}" if peer is not None else "a peer"
        log("Traceback (most recent call last):")
        log(
            '  File "/sgl-workspace/sglang/python/sglang/srt/managers/scheduler.py", line 2904, in run_scheduler_process'
        )
        log(f"torch.distributed.DistBackendError: NCCL communicator was aborted on rank {rank}: {who} left the group")
        os._exit(1)

    def on_term(signum: int, _frame: object) -> None:
        engine.stopping.set()
        engine_log(rank, f"Received sig {signum}, exiting.")
        os._exit(0)

    signal.signal(signal.SIGTERM, signal.SIG_IGN if "ignore-term" in mine else on_term)
    pool = int(number("TP4_STANDIN_KV_POOL", 9_000_000))
    total = min(args.max_total_tokens, pool) if args.max_total_tokens else pool
    engine_log(
        rank,
        f"server_args=ServerArgs(model_path='{args.model_path}', served_model_name='{engine.served_name}', "
        f"tp_size={args.tp}, ep_size={args.ep_size}, nnodes={nnodes}, node_rank={rank}, host='{args.host}', "
        f"port={args.port}, api_key={'***' if engine.key else None})",
    )
    found = stamps("commit" in mine)
    if found:
        engine_log(rank, f"SOURCE_COMMIT b12x_next {found[0]}")
        engine_log(rank, f"SOURCE_PATCH b12x_next {found[1]}")
    engine_log(rank, "Init torch distributed begin.")
    DistGroup(rank, nnodes, args.dist_init_addr, abort).join()
    engine_log(rank, "Init torch distributed ends. mem usage=0.00 GB")
    engine_log(rank, "Load weight begin. avail mem=112.40 GB")
    pace()
    if "crash" in mine:
        log("Traceback (most recent call last):")
        log(
            '  File "/sgl-workspace/sglang/python/sglang/srt/model_loader/loader.py", line 412, in load_weights_and_postprocess'
        )
        log("RuntimeError: CUDA error: an illegal memory access was encountered (stand-in fault: crash)")
        return 1
    if env.get("NCCL_SWITCHLESS_RING_ONLY") == "1":
        engine_log(rank, "NCCL INFO NCCL_SWITCHLESS_RING_ONLY set by environment to 1")
    lines = armed_lines(env, {"hcas": env.get("B12X_ROCE_HCA", "")})
    omit = os.environ.get("TP4_STANDIN_OMIT", "")
    if "omit-line" in mine:
        target = next((t for t, req in lines if (omit in t if omit else req)), None)
        lines = [(t, r) for t, r in lines if t != target]
    commit8 = found[0][:8] if found else None
    for text, _required in lines:
        if commit8 and "on b12x_next " in text:
            text = re.sub(r"on b12x_next [0-9a-f]{8}", f"on b12x_next {commit8}", text)
        elif not found and text.startswith("[moe_b12x_next]"):
            log("Traceback (most recent call last):")
            log(
                "ModuleNotFoundError: No module named 'b12x_next' (no /opt/b12x_next/b12x_next/SOURCE_COMMIT in the image)"
            )
            return 1
        engine_log(rank, text)
    if "forbidden" in mine:
        engine_log(rank, os.environ.get("TP4_STANDIN_FORBIDDEN") or "[l2_prefetch] plan MISMATCH at layer 3")
    engine_log(
        rank,
        "Load weight end. type=DeepseekV4ForCausalLM, dtype=torch.bfloat16, avail mem=41.20 GB, mem usage=71.20 GB.",
    )
    engine_log(
        rank,
        f"DSV4 memory calculation: bytes_per_full_token=1670.75, available_bytes={pool * 1670.75:.0f}, full_token={pool}",
    )
    engine_log(rank, f"KV Cache is allocated. #tokens: {total}")
    if args.speculative_algorithm == "DSPARK":
        gamma = args.speculative_dspark_block_size
        engine_log(
            rank,
            f"Initialized DSpark draft runner. draft_model=dspark, gamma={gamma}, verify_num_draft_tokens={(gamma or 0) + 1}",
        )
    engine_log(rank, "Capture cuda graph begin. This can take up to several minutes. avail mem=12.10 GB")
    started = time.monotonic()
    pace()
    engine_log(
        rank,
        f"Capture cuda graph end. Time elapsed: {time.monotonic() - started + 11.0:.2f} s. mem usage=1.10 GB. avail mem=11.00 GB.",
    )
    engine_log(rank, f"Capture target verify CUDA graph end. elapsed={time.monotonic() - started + 7.5:.2f}s")
    engine_log(
        rank,
        f"max_total_num_tokens={total}, chunked_prefill_size={args.chunked_prefill_size}, max_prefill_tokens=16384, "
        f"max_running_requests={args.max_running_requests}, context_len={args.context_length}, available_gpu_mem=11.00 GB",
    )
    if "hang" in mine:
        engine_log(rank, "Scheduler: waiting for the first batch")
        while True:
            time.sleep(3600)
    if rank > 0:
        engine_log(rank, "Scheduler ready: waiting on rank 0 in the dist group")
        # SGLang's node_rank >= 1 serves launch_dummy_health_check_server on --host/--port: /ping,
        # /health and /health_generate, each 200 with no body (sglang/srt/utils, at 18bfdd16)
        # (TP4_STANDIN_COLOCATED=1: the ranks share one machine, and rank 0 keeps the port)
        if os.environ.get("TP4_STANDIN_COLOCATED") == "1":
            while True:
                time.sleep(3600)
        dummy = Server((args.host, args.port), dummy_health_handler())
        engine_log(rank, f"Dummy health check server scheduled on existing loop at {args.host}:{args.port}")
        dummy.serve_forever()
        return 0
    server = Server((args.host, args.port), handler(engine))
    threading.Thread(target=engine.tick, daemon=True).start()
    engine_log(rank, f"Uvicorn running on http://{args.host}:{args.port} (Press CTRL+C to quit)")
    engine_log(rank, "The server is fired up and ready to roll!")
    server.serve_forever()
    return 0


def main(argv: list[str]) -> int:
    if tuple(argv[:3]) == ENGINE:
        return engine_main(argv[3:])
    return boot_main(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
