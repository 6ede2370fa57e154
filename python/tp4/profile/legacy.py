"""Import of an upstream bash-syntax profile (.env.tp4) into a tp4 profile.

The upstream launcher does `set -a; source .env.tp4`, so the file is bash: quotes, `$VAR` and
`${VAR:-default}` expansion, `~`, comments, and later assignments overriding earlier ones (the
last active EXTRA_CONTAINER_ENV line wins). We read the assignments without running bash, then
map each variable onto the profile fields that render the same container env and engine argv
(upstream-line.md §1.6, §1.8). The result sits on the `launcher-defaults` preset, so every value
comes from the file or from the launcher's own defaults.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from tp4.errors import InvalidInput

HOME = "\x00HOME\x00"
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_EXTRA_ITEM = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
OFF_KEYS = ("", "none", "off", "dummy", "0")


@dataclass
class Assignment:
    name: str
    value: str
    line: int


class _Parser:
    def __init__(self, text: str, source: str) -> None:
        self.text = text
        self.source = source
        self.pos = 0
        self.line = 1
        self.vars: dict[str, str] = {}
        self.notes: list[str] = []
        self.errors: list[str] = []

    def fail(self, line: int, msg: str) -> None:
        raise InvalidInput(f"{self.source}: line {line}: {msg}")

    def peek(self, n: int = 0) -> str:
        i = self.pos + n
        return self.text[i] if i < len(self.text) else ""

    def advance(self) -> str:
        ch = self.text[self.pos]
        self.pos += 1
        if ch == "\n":
            self.line += 1
        return ch

    def skip_line(self) -> None:
        while self.peek() and self.peek() != "\n":
            self.advance()

    def parse(self) -> list[Assignment]:
        out: list[Assignment] = []
        while self.pos < len(self.text):
            ch = self.peek()
            if ch in " \t\r\n;":
                self.advance()
                continue
            if ch == "#":
                self.skip_line()
                continue
            start_line = self.line
            word = self._bare_word()
            if word == "export":
                while self.peek() in " \t":
                    self.advance()
                word = self._bare_word()
            if not word or self.peek() != "=" or not _NAME.fullmatch(word):
                rest = self.text[self.pos:self.text.find("\n", self.pos) if "\n" in self.text[self.pos:] else len(self.text)]
                self.fail(start_line, f"not a KEY=VALUE assignment: {(word + rest).strip()[:60]!r}; only assignments (and comments) are read")
            self.advance()  # '='
            value = self._value(start_line)
            self.vars[word] = value
            out.append(Assignment(word, value, start_line))
        return out

    def _bare_word(self) -> str:
        start = self.pos
        while self.peek() and (self.peek().isalnum() or self.peek() == "_"):
            self.advance()
        return self.text[start:self.pos]

    def _value(self, line: int) -> str:
        parts: list[str] = []
        at_start = True
        while True:
            ch = self.peek()
            if ch == "" or ch in "\n;":
                break
            if ch in " \t\r":
                # whitespace ends the value; what follows must be a comment or the line's end
                while self.peek() in " \t\r":
                    self.advance()
                if self.peek() in ("", "\n", ";"):
                    break
                if self.peek() == "#":
                    self.skip_line()
                    break
                self.fail(line, "a value with spaces must be quoted (bash would run the rest as a command)")
            if ch == "'":
                self.advance()
                start = self.pos
                while self.peek() != "'":
                    if self.peek() == "":
                        self.fail(line, "unterminated single quote")
                    self.advance()
                parts.append(self.text[start:self.pos])
                self.advance()
            elif ch == '"':
                self.advance()
                parts.append(self._double_quoted(line))
            elif ch == "\\":
                self.advance()
                nxt = self.advance() if self.peek() else ""
                if nxt != "\n":
                    parts.append(nxt)
            elif ch == "$":
                parts.append(self._expansion(line))
            elif ch == "`":
                self.fail(line, "command substitution is not supported; write the value literally")
            elif ch == "~" and at_start and self.peek(1) in ("/", "", " ", "\n", "\t", ":"):
                self.advance()
                parts.append(HOME)
            elif ch in "()<>|&":
                self.fail(line, f"unexpected {ch!r}; only plain assignments are read")
            else:
                parts.append(self.advance())
            at_start = False
        return "".join(parts)

    def _double_quoted(self, line: int) -> str:
        parts = []
        while True:
            ch = self.peek()
            if ch == "":
                self.fail(line, "unterminated double quote")
            if ch == '"':
                self.advance()
                return "".join(parts)
            if ch == "\\":
                self.advance()
                nxt = self.advance() if self.peek() else ""
                if nxt in '$`"\\':
                    parts.append(nxt)
                elif nxt != "\n":
                    parts.append("\\" + nxt)
            elif ch == "$":
                parts.append(self._expansion(line))
            elif ch == "`":
                self.fail(line, "command substitution is not supported; write the value literally")
            else:
                parts.append(self.advance())

    def _expansion(self, line: int) -> str:
        self.advance()  # '$'
        if self.peek() == "(":
            self.fail(line, "command substitution is not supported; write the value literally")
        if self.peek() == "{":
            self.advance()
            name = self._bare_word()
            default = None
            if self.peek() == ":" and self.peek(1) in "-=":
                self.advance()
                self.advance()
                default = self._until_brace(line)
                use_default_if_empty = True
            elif self.peek() in "-=":
                self.advance()
                default = self._until_brace(line)
                use_default_if_empty = False
            if self.peek() != "}":
                self.fail(line, "unsupported ${...} expansion; use $VAR, ${VAR} or ${VAR:-default}")
            self.advance()
            value = self._lookup(name, line)
            if default is not None:
                if value is None or (use_default_if_empty and value == ""):
                    return default
            return value or ""
        name = self._bare_word()
        if not name:
            return "$"
        return self._lookup(name, line) or ""

    def _until_brace(self, line: int) -> str:
        parts = []
        while self.peek() != "}":
            if self.peek() in ("", "\n"):
                self.fail(line, "unterminated ${...}")
            if self.peek() == "$":
                parts.append(self._expansion(line))
            else:
                parts.append(self.advance())
        return "".join(parts)

    def _lookup(self, name: str, line: int) -> str | None:
        if name == "HOME":
            return HOME
        if name in self.vars:
            return self.vars[name]
        if name == "USER":
            return self.vars.get("WORKER_USER")
        self.notes.append(f"line {line}: ${name} is not set in the file; it expands to an empty string")
        return None


def parse_env_text(text: str, source: str = "<env>") -> tuple[list[Assignment], list[str]]:
    parser = _Parser(text, source)
    return parser.parse(), parser.notes


# --- mapping onto the profile --------------------------------------------------------------------


def _words(v: str) -> list[str]:
    return [w for w in re.split(r"[\s,]+", v) if w]


def _int(var: str) -> Callable[[str], int]:
    def conv(v: str) -> int:
        try:
            return int(v)
        except ValueError:
            raise ValueError(f"{var}={v!r} is not an integer") from None
    return conv


def _bit(var: str) -> Callable[[str], int]:
    def conv(v: str) -> int:
        if v not in ("0", "1"):
            raise ValueError(f"{var} must be 0 or 1, got {v!r}")
        return int(v)
    return conv


def _fraction(v: str) -> Any:
    try:
        f = float(v)
    except ValueError:
        return v
    whole, _, frac = repr(f).partition(".")
    return f if f"{whole}.{frac.ljust(2, '0')}" == v else v


def _path(v: str) -> str:
    if v.startswith(HOME):
        return "~" + v[len(HOME):]
    return v.replace(HOME, "~")


def _spec(v: str) -> str:
    return "none" if v.lower() in ("off", "none", "0", "") else v


# legacy variable (or container env key set through EXTRA_CONTAINER_ENV) -> (profile path, converter)
TYPED: dict[str, tuple[tuple[str, ...], Callable[[str], Any]]] = {
    "HEAD_IP": (("cluster", "head", "ip"), str),
    "WORKER_USER": (("cluster", "user"), str),
    "SSH_IDENTITY": (("cluster", "identity"), _path),
    "PORT": (("cluster", "port"), _int("PORT")),
    "SERVER_PORT": (("cluster", "port"), _int("SERVER_PORT")),
    "DIST_PORT": (("cluster", "dist_port"), _int("DIST_PORT")),
    "HEAD_CTN": (("cluster", "head_container"), str),
    "WORKER_CTN": (("cluster", "worker_container"), str),
    "SHM_SIZE": (("cluster", "shm_size"), str),
    "FABRIC_IFACE": (("fabric", "iface"), str),
    "IB_HCA": (("fabric", "hcas"), _words),
    "NCCL_IB_HCA": (("fabric", "hcas"), _words),
    "NCCL_IB_GID_INDEX": (("fabric", "gid_index"), _int("NCCL_IB_GID_INDEX")),
    "NCCL_NET": (("fabric", "nccl", "net"), str),
    "NCCL_IB_DISABLE": (("fabric", "nccl", "ib_disable"), _bit("NCCL_IB_DISABLE")),
    "NCCL_P2P_DISABLE": (("fabric", "nccl", "p2p_disable"), _bit("NCCL_P2P_DISABLE")),
    "NCCL_SHM_DISABLE": (("fabric", "nccl", "shm_disable"), _bit("NCCL_SHM_DISABLE")),
    "NCCL_DEBUG": (("fabric", "nccl", "debug"), str),
    "NCCL_DEBUG_SUBSYS": (("fabric", "nccl", "debug_subsys"), str),
    "NCCL_BUFFSIZE": (("fabric", "nccl", "buffsize"), _int("NCCL_BUFFSIZE")),
    "NCCL_LL128_BUFFSIZE": (("fabric", "nccl", "ll128_buffsize"), _int("NCCL_LL128_BUFFSIZE")),
    "NCCL_PROTO": (("fabric", "nccl", "proto"), str),
    "NCCL_MAX_NCHANNELS": (("fabric", "nccl", "max_nchannels"), _int("NCCL_MAX_NCHANNELS")),
    "NCCL_MIN_NCHANNELS": (("fabric", "nccl", "min_nchannels"), _int("NCCL_MIN_NCHANNELS")),
    "NCCL_CROSS_NIC": (("fabric", "nccl", "cross_nic"), _int("NCCL_CROSS_NIC")),
    "NCCL_IB_MERGE_NICS": (("fabric", "nccl", "ib_merge_nics"), _bit("NCCL_IB_MERGE_NICS")),
    "NCCL_IB_SUBNET_AWARE_ROUTING": (("fabric", "nccl", "ib_subnet_aware_routing"), _bit("NCCL_IB_SUBNET_AWARE_ROUTING")),
    "NCCL_ALGO": (("fabric", "nccl", "algo"), str),
    "NCCL_SKIP_TREE_CONNECT": (("fabric", "nccl", "skip_tree_connect"), _bit("NCCL_SKIP_TREE_CONNECT")),
    "NCCL_IB_SUBNET_PREFIX_LEN": (("fabric", "nccl", "ib_subnet_prefix_len"), _int("NCCL_IB_SUBNET_PREFIX_LEN")),
    "NCCL_P2P_LEVEL": (("fabric", "nccl", "p2p_level"), str),
    "NCCL_HOST_DIR": (("fabric", "nccl", "host_dir"), _path),
    "NCCL_WORKER_DIR": (("fabric", "nccl", "worker_dir"), _path),
    "NCCL_PIP_SO": (("fabric", "nccl", "pip_so"), str),
    "MODEL_DIR": (("model", "dir"), _path),
    "COMMON_MODEL": (("model", "common_link"), _path),
    "HF_REPO": (("model", "hf_repo"), str),
    "HF_REVISION": (("model", "hf_revision"), str),
    "EXPECTED_SHARDS": (("model", "expected_shards"), _int("EXPECTED_SHARDS")),
    "SERVED_MODEL_NAME": (("model", "served_name"), str),
    "NFS_VOLUME": (("nfs", "volume"), str),
    "NFS_EXPORT_NAME": (("nfs", "export_name"), str),
    "NFS_SERVER_IPS": (("nfs", "server_ips"), _words),
    "NFS_CLIENTS": (("nfs", "clients"), _words),
    "IMAGE": (("image", "tag"), str),
    "BASE_IMAGE": (("image", "base"), str),
    "TP_SIZE": (("engine", "tp"), _int("TP_SIZE")),
    "EP_SIZE": (("engine", "ep"), _int("EP_SIZE")),
    "CONTEXT_LENGTH": (("engine", "context_length"), _int("CONTEXT_LENGTH")),
    "MEM_FRACTION_STATIC": (("engine", "mem_fraction_static"), _fraction),
    "HEAD_MEM_FRACTION_STATIC": (("engine", "head_mem_fraction_static"), _fraction),
    "MAX_RUNNING_REQUESTS": (("engine", "max_running_requests"), _int("MAX_RUNNING_REQUESTS")),
    "CHUNKED_PREFILL_SIZE": (("engine", "chunked_prefill_size"), _int("CHUNKED_PREFILL_SIZE")),
    "MAX_TOTAL_TOKENS": (("engine", "max_total_tokens"), lambda v: int(v) if v else 0),
    "SPEC_ALGO": (("engine", "spec_algo"), _spec),
    "DSPARK_BLOCK_SIZE": (("engine", "dspark_block_size"), _int("DSPARK_BLOCK_SIZE")),
    "DSPARK_SPS_TABLE": (("engine", "sps_table"), str),
    "DSPARK_STS_TABLE": (("engine", "sts_table"), str),
    "OFFLOAD_MODE": (("engine", "offload_mode"), str),
    "HOST": (("engine", "host"), str),
    "ATTENTION_BACKEND": (("engine", "attention_backend"), str),
    "MOE_RUNNER_BACKEND": (("engine", "moe_runner_backend"), str),
    "EXTRA_SGLANG_ARGS": (("engine", "extra_args"), lambda v: v.split()),
    "DSV41_CACHE_GIB": (("engram", "cache_gib"), _int("DSV41_CACHE_GIB")),
    "DSV41_CACHE_WAYS": (("engram", "cache_ways"), _int("DSV41_CACHE_WAYS")),
    "DSV41_IO_THREADS": (("engram", "io_threads"), _int("DSV41_IO_THREADS")),
    "DSV41_RESIDENT_SCALES": (("engram", "resident_scales"), _bit("DSV41_RESIDENT_SCALES")),
    "DSV41_STATS_SECONDS": (("engram", "stats_seconds"), _int("DSV41_STATS_SECONDS")),
    "DSV41_PACKED_DIR": (("engram", "packed_dir"), str),
    "SKIP_PREPARE": (("runtime", "skip_prepare"), _bit("SKIP_PREPARE")),
    "SKIP_VERIFY": (("runtime", "skip_verify"), _bit("SKIP_VERIFY")),
    "SKIP_SMOKE": (("runtime", "skip_smoke"), _bit("SKIP_SMOKE")),
    "SMOKE_QUICK": (("runtime", "smoke_quick"), _bit("SMOKE_QUICK")),
    "WARMUP": (("runtime", "warmup"), _bit("WARMUP")),
    "READY_TIMEOUT": (("runtime", "ready_timeout"), lambda v: int(v) * 10),
    "SGLANG_FLASHINFER_MOE_FUSED_FINALIZE": (("runtime", "moe_fused_finalize"), _bit("SGLANG_FLASHINFER_MOE_FUSED_FINALIZE")),
    "PYTORCH_CUDA_ALLOC_CONF": (("runtime", "pytorch_cuda_alloc_conf"), str),
}
# Values the launcher fixes; EXTRA_CONTAINER_ENV may only repeat them.
FIXED = {"DSV41_SOURCE": "/models/DeepSeek-V4.1-Flash", "MODEL_PATH": "/models/DeepSeek-V4.1-Flash",
         "STATE_PATH": "/state", "CUDA_DEVICE_ORDER": "PCI_BUS_ID", "NCCL_CUMEM_ENABLE": "0",
         "DSV41_LAUNCHER": "tp4"}
# Read by the launcher itself, with no place in a tp4 profile.
LAUNCHER_ONLY = {
    "BUILD_DOCKERFILE": "the image variant is taken from it",
    "BUILD_ARGS": "tp4 builds the image with nix from pinned sources; no docker build arguments",
    "NNODES": "derived from the worker list",
    "WORKER_IPS": "imported as cluster.workers", "WORKER_HOSTS": "imported as cluster.workers",
    "GLOO_SOCKET_IFNAME": "imported as fabric.socket_ifname", "NCCL_SOCKET_IFNAME": "imported as fabric.socket_ifname",
    "NCCL_SWITCHLESS_RING_ONLY": "imported as fabric.mode", "NCCL_OVERLAY_PIP": "imported as fabric.nccl.mount",
    "NFS_SHARE": "imported as nfs.share", "NFS_SERVER_IP": "imported as nfs.server_ips",
    "WORKER_DIR": "imported as cluster.workers[].workdir", "WORKER_ENGRAM_DIR": "imported as cluster.workers[].engram_dir",
    "ENGRAM_DIR": "imported as cluster.head.engram_dir",
    "API_KEY": "keys are never imported", "WORKER_PASS": "passwords are never imported; tp4 uses ssh keys only",
    "EXTRA_CONTAINER_ENV": "imported as [gates] and [env]",
    "FORCE": "a per-run switch", "DOCTOR_STRICT": "a per-run switch",
    "REMOTE_TIMEOUT": "tp4 sets its own timeouts", "PULL_TIMEOUT": "tp4 sets its own timeouts",
    "BUILD_TIMEOUT": "tp4 sets its own timeouts",
    "NCCL_CONTAINER_DIR": "tp4 mounts a host NCCL at /nccl", "WORKER_FABRIC_IPS": "set nfs.server_ips per worker",
    "NFS_OPTS": "tp4 fixes the NFS mount options", "NFS_OPTS_CLIENT": "tp4 fixes the NFS mount options",
    "NFS_IMAGE": "not used", "NFS_CONTAINER": "not used", "HF_EXPORT_ROOT": "not used",
    "NFS_REUSE_EXPORT": "not used", "TP4_ENV_FILE": "not used", "STATE_DIR": "see cluster.head.state_dir",
    "LOG_DIR": "not used", "SERVE_LOG": "not used", "ENV_FILE": "not used", "ENV_EXAMPLE": "not used",
    "SGLANG_RUST_BUILD_MODE": "the launcher never forwards this line; it only acts inside EXTRA_CONTAINER_ENV",
    "DSV41_PREFILL_EMPTY_CACHE_TOKENS": "the launcher never forwards this line; it only acts inside EXTRA_CONTAINER_ENV",
}
RANK_KEYS = ("NODE_RANK", "HOST_IP", "VLLM_HOST_IP", "DIST_INIT_ADDR", "NNODES")


@dataclass
class ImportResult:
    toml: str
    document: dict
    summary: str
    notes: list[str] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)


def _set(doc: dict, path: tuple[str, ...], value: Any) -> None:
    cur = doc
    for part in path[:-1]:
        cur = cur.setdefault(part, {})
    cur[path[-1]] = value


def import_assignments(assignments: list[Assignment], source: str, parse_notes: list[str] | None = None) -> ImportResult:
    from tp4.registry import load_registry

    reg = load_registry()
    final: dict[str, Assignment] = {}
    for a in assignments:
        final[a.name] = a  # bash: the last assignment wins
    errors: list[str] = []
    notes = list(parse_notes or [])
    unknown: list[str] = []
    doc: dict[str, Any] = {"preset": "launcher-defaults"}
    origin: dict[str, str] = {}

    def at(a: Assignment) -> str:
        return f"{a.name} (line {a.line})"

    def apply_typed(key: str, value: str, a: Assignment) -> None:
        path, conv = TYPED[key]
        try:
            _set(doc, path, conv(value))
        except ValueError as exc:
            errors.append(f"line {a.line}: {exc}")
        origin[".".join(path)] = at(a)

    def get(name: str) -> str | None:
        a = final.get(name)
        return a.value if a else None

    for name, a in final.items():
        value = a.value
        if name in TYPED:
            apply_typed(name, value, a)
        elif name in LAUNCHER_ONLY or name in RANK_KEYS or re.fullmatch(r"WORKER\d+_(IP|HOST)|NFS_SERVER_IP_\d+", name):
            reason = LAUNCHER_ONLY.get(name, "")
            if not reason.startswith("imported as") and name not in ("BUILD_DOCKERFILE", "NNODES", "EXTRA_CONTAINER_ENV", "API_KEY"):
                if reason and not name.startswith("WORKER") and name not in RANK_KEYS:
                    notes.append(f"line {a.line}: {name} not imported: {reason}")
            continue
        elif reg.gate(name) is not None:
            if reg.gate(name).forwarded or name == "SGLANG_DSPARK_FOLDED_SAMPLING":
                doc.setdefault("gates", {})[name] = value
                origin[f"gates.{name}"] = at(a)
            else:
                notes.append(f"line {a.line}: {name} is an adapter gate the launcher only passes through EXTRA_CONTAINER_ENV; not imported")
        elif name in FIXED:
            continue
        else:
            unknown.append(name)

    # Workers: WORKER_IPS/WORKER_HOSTS, or the legacy WORKERn_IP/WORKERn_HOST pairs.
    ips = _words(get("WORKER_IPS") or "")
    hosts = _words(get("WORKER_HOSTS") or "")
    if not ips:
        n = 1
        while get(f"WORKER{n}_IP") is not None:
            ips.append(get(f"WORKER{n}_IP") or "")
            hosts.append(get(f"WORKER{n}_HOST") or get(f"WORKER{n}_IP") or "")
            n += 1
    if not hosts:
        hosts = list(ips)
    if len(ips) != len(hosts):
        errors.append(f"WORKER_IPS has {len(ips)} entries but WORKER_HOSTS has {len(hosts)}; give one host name per IP, in rank order")
    if not ips:
        errors.append("no workers: set WORKER_IPS and WORKER_HOSTS (rank order)")
    user = get("WORKER_USER") or "zurih"
    home = "/root" if user == "root" else f"/home/{user}"
    workers = []
    for ip, host in zip(ips, hosts, strict=False):  # unequal lengths were reported above
        w: dict[str, Any] = {"name": host, "ssh": host, "ip": ip}
        if get("WORKER_DIR") is not None:
            w["workdir"] = _home_rel(_path(get("WORKER_DIR")), home)
        if get("WORKER_ENGRAM_DIR") is not None:
            w["engram_dir"] = _home_rel(_path(get("WORKER_ENGRAM_DIR")), home)
        workers.append(w)
    if workers:
        doc.setdefault("cluster", {})["workers"] = workers
    head = doc.setdefault("cluster", {}).setdefault("head", {})
    head.setdefault("ip", "10.0.0.1")
    head["name"] = "head" if "head" not in hosts else "rank0"
    if get("ENGRAM_DIR") is not None:
        head["engram_dir"] = _path(get("ENGRAM_DIR"))
    nnodes = get("NNODES")
    if nnodes is not None and nnodes != str(len(ips) + 1):
        errors.append(f"NNODES={nnodes} but there are {len(ips)} workers; NNODES must be workers + 1")

    gloo, nsock = get("GLOO_SOCKET_IFNAME"), get("NCCL_SOCKET_IFNAME")
    if gloo is not None and nsock is not None and gloo != nsock:
        errors.append(f"GLOO_SOCKET_IFNAME={gloo} and NCCL_SOCKET_IFNAME={nsock} differ; tp4 bootstraps both on fabric.socket_ifname")
    if gloo or nsock:
        _set(doc, ("fabric", "socket_ifname"), gloo or nsock)

    for var, path, conv in (("NCCL_SWITCHLESS_RING_ONLY", ("fabric", "mode"), lambda v: "ring" if v == "1" else "switched"),
                            ("NCCL_OVERLAY_PIP", ("fabric", "nccl", "mount"), lambda v: "overlay" if v == "1" else "none"),
                            ("NFS_SHARE", ("nfs", "share"), lambda v: v == "1"),
                            ("DSV41_SERIAL_WEIGHT_LOAD", None, None)):
        v = get(var)
        if v is None:
            continue
        if v not in ("0", "1"):
            errors.append(f"line {final[var].line}: {var} must be 0 or 1, got {v!r}")
        elif path is not None:
            _set(doc, path, conv(v))
    if get("NCCL_WORKER_DIR") and not _path(get("NCCL_WORKER_DIR")).startswith("/"):
        errors.append(f"line {final['NCCL_WORKER_DIR'].line}: NCCL_WORKER_DIR must be absolute")
    if get("NCCL_OVERLAY_PIP") != "1" and get("NCCL_HOST_DIR"):
        notes.append("NCCL_HOST_DIR: upstream mounts it at /nccl only when a library exists there; "
                     'tp4 makes that explicit: set fabric.nccl.mount = "dir" if the host has one')
    if get("NFS_SERVER_IPS") is None:
        per = []
        n = 1
        while get(f"NFS_SERVER_IP_{n}") is not None:
            per.append(get(f"NFS_SERVER_IP_{n}"))
            n += 1
        if per:
            _set(doc, ("nfs", "server_ips"), per)
        elif get("NFS_SERVER_IP"):
            _set(doc, ("nfs", "server_ips"), [get("NFS_SERVER_IP")])

    dockerfile = get("BUILD_DOCKERFILE")
    tag = get("IMAGE") or ""
    variants = {"Dockerfile": "base", "Dockerfile.canary": "canary", "Dockerfile.canary-roce": "canary-roce"}
    if dockerfile is not None:
        if dockerfile not in variants:
            errors.append(f"line {final['BUILD_DOCKERFILE'].line}: BUILD_DOCKERFILE={dockerfile!r} is not one of {', '.join(variants)}")
        else:
            _set(doc, ("image", "variant"), variants[dockerfile])
    else:
        _set(doc, ("image", "variant"), "canary-roce" if tag.endswith(":canary-roce") else "canary" if tag.endswith(":canary") else "base")

    api = get("API_KEY")
    if api is not None and api.strip().lower() not in OFF_KEYS:
        notes.append("API_KEY: the key was not imported; write it to a file (mode 600) and set api.key_file")

    extra = final.get("EXTRA_CONTAINER_ENV")
    if extra is not None:
        for item in extra.value.split():
            if not _EXTRA_ITEM.match(item):
                errors.append(f"line {extra.line}: EXTRA_CONTAINER_ENV item {item!r} is not KEY=VALUE")
                continue
            key, value = item.split("=", 1)
            if key in RANK_KEYS or key in ("API_KEY", "NCCL_IB_GID_INDEX"):
                errors.append(f"line {extra.line}: EXTRA_CONTAINER_ENV sets {key}, which tp4 renders per rank")
            elif key in FIXED:
                if value != FIXED[key]:
                    errors.append(f"line {extra.line}: EXTRA_CONTAINER_ENV sets {key}={value}; tp4 fixes it to {FIXED[key]}")
            elif reg.gate(key) is not None:
                doc.setdefault("gates", {})[key] = value
                origin[f"gates.{key}"] = f"EXTRA_CONTAINER_ENV (line {extra.line})"
            elif key in TYPED and key not in ("HEAD_IP", "WORKER_USER", "SSH_IDENTITY", "PORT", "DIST_PORT", "HEAD_CTN",
                                               "WORKER_CTN", "SHM_SIZE", "FABRIC_IFACE", "IB_HCA", "MODEL_DIR", "COMMON_MODEL",
                                               "HF_REPO", "HF_REVISION", "EXPECTED_SHARDS", "NFS_VOLUME", "NFS_EXPORT_NAME",
                                               "NFS_SERVER_IPS", "NFS_CLIENTS", "IMAGE", "BASE_IMAGE", "READY_TIMEOUT",
                                               "NCCL_HOST_DIR", "NCCL_WORKER_DIR", "NCCL_PIP_SO", "NCCL_IB_GID_INDEX"):
                apply_typed(key, value, extra)
            else:
                doc.setdefault("env", {})[key] = value
    if errors:
        raise InvalidInput(f"{source}: {len(errors)} problem(s)", errors)

    from tp4.profile.load import parse_document
    from tp4.profile.toml import dumps

    try:
        loaded = parse_document(doc, source)
    except InvalidInput as exc:
        problems = [p + _origin_hint(p, origin) for p in exc.problems]
        raise InvalidInput(f"{source}: the imported profile is not valid ({len(problems)} problem(s))", problems) from None
    p = loaded.profile
    header = (f"# Imported by `tp4 profile import` from {Path(source).name}.\n"
              "# On the launcher-defaults preset: every value below comes from that file.\n")
    summary = f"{len(p.nodes)} nodes, TP {p.engine.tp}, EP {p.ep}, image {p.image.tag} ({p.image.variant})"
    return ImportResult(header + dumps(doc), doc, summary, notes + [str(w) for w in loaded.warnings], unknown)


def _origin_hint(problem: str, origin: dict[str, str]) -> str:
    fieldname = problem.split(":", 1)[0]
    return f" (from {origin[fieldname]})" if fieldname in origin else ""


def _home_rel(path: str, home: str) -> str:
    if path == home or path.startswith(home + "/"):
        return "~" + path[len(home):]
    return path


def import_env_text(text: str, source: str) -> ImportResult:
    assignments, notes = parse_env_text(text, source)
    return import_assignments(assignments, source, notes)


def import_env_file(path: str) -> ImportResult:
    from tp4.profile.load import read_input

    return import_env_text(read_input(path, "env file"), str(path))
