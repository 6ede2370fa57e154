"""Pydantic models of a TP4 profile (TOML).

Field defaults are the upstream launcher's own defaults (what upstream `start.sh` does when a
variable is unset), or the TP4 example's value (upstream `.env.tp4.example`) where the launcher
default is not known (docs/upstream.md). Presets (tp4/data/presets/*.toml) are layers on top of
these defaults. Each field's description names the upstream variable it replaces, so the profile reference in
docs/profile.md is generated from this module.

Two things here keep `tp4 plan` fast (bench/bench_plan.py): no `from __future__ import
annotations` (pydantic would evaluate every annotation string again, ~2 ms), and default
factories that are lambdas, never the builtins `list`/`dict` (pydantic reads each factory's
signature, and the signature of a builtin costs ~1.7 ms the first time).
"""

import re
from typing import Annotated, Literal, NamedTuple, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from tp4.core import netaddr

# The line's hardware: one GPU per Spark, one rank per node; tp4 supports lines of up to 8 nodes.
MAX_NODES = 8
# A DGX Spark (GB10) has 128 GB of unified memory: no per-node size may exceed it.
SPARK_MEMORY_GIB = 128

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
# Never starting with '-': a host name reaches ssh's argv, where "-J..." or "-L..." is an option.
_HOST = re.compile(r"[A-Za-z0-9:][A-Za-z0-9._:-]{0,252}")
_USER = re.compile(r"[a-z_][a-z0-9_.-]{0,31}")
_IFNAME = re.compile(r"[A-Za-z0-9_.@-]{1,15}")
ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # an environment variable name
# Control characters and line separators (any a line-based reader might split on) are never
# allowed in values that reach an env file, an argv or a mount spec.
_UNSAFE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f\x85\u2028\u2029]")


def has_unsafe_chars(value: str) -> bool:
    return bool(_UNSAFE.search(value))


# Engine flags that take a secret: a flag one of whose words (split on '-' and '_') is one of
# these. Never in a profile: engine arguments are in the plan, its notes and the engine's argv.
# SGLang's --api-key and --admin-api-key, --ssl-keyfile-password, --hf-token...; not
# --ssl-keyfile (a path) nor --max-total-tokens (other words).
SECRET_FLAG_WORDS = frozenset({"key", "apikey", "token", "secret", "password", "passwd"})


def secret_flag(word: str) -> str | None:
    """The flag ``word`` starts (``--name`` or ``--name=value``) when it takes a secret, else None."""
    if not word.startswith("-"):
        return None
    flag = word.partition("=")[0]
    parts = re.split(r"[-_]+", flag.lstrip("-").lower())
    return flag if SECRET_FLAG_WORDS.intersection(parts) else None


def secret_flag_problem(flag: str) -> tuple[str, str]:
    """Why a secret flag is refused in engine arguments (never showing its value), and the fix."""
    why = "engine arguments are in the plan and the engine's argv, which are not secret (its value is not shown)"
    if flag == "--api-key":
        return (
            f"--api-key takes the API key: {why}",
            "remove it, write the key to a file (mode 600) and set api.key_file",
        )
    if flag == "--admin-api-key":
        return (
            f"--admin-api-key takes the admin API key, which SGLang reads only from this flag (no environment "
            f"variable) and the image's launcher from no file: {why}",
            "remove it: not supported by tp4, the admin API stays off",
        )
    return (
        f"{flag} takes a secret: {why}",
        "remove it: tp4 passes an engine secret only from a file (mode 600), as api.key_file does for the API key, "
        "and has none for this flag",
    )


def _whole_number(value: object) -> object:
    """TOML integers only: `true` is not 1 and 4.0 is not 4."""
    if isinstance(value, bool) or not isinstance(value, int):
        shown = str(value).lower() if isinstance(value, bool) else repr(value)
        raise ValueError(
            f"must be a whole number, got {shown[:40]}; fix: write digits only, without quotes or a decimal "
            "point (e.g. 4)"
        )
    return value


# Every integer field: no booleans, no floats, no strings; each field adds its own bounds.
Int = Annotated[int, BeforeValidator(_whole_number)]
Bit = Annotated[Literal[0, 1], BeforeValidator(_whole_number)]

# Environment names that look like a credential (HF_TOKEN, OPENAI_API_KEY, MY_PASSWORD, ...):
# one '_'-separated word that is or ends in KEY, TOKEN, SECRET, PASSWORD... (TOKENS is a count).
_SECRET_WORD = re.compile(r"[A-Z0-9]*(KEYS?|TOKEN|SECRETS?|PASSWORDS?|PASSWD|CREDENTIALS?)|PASS")


def looks_like_secret(name: str) -> bool:
    return any(_SECRET_WORD.fullmatch(word) for word in name.upper().split("_"))


def _env_key(key: str) -> str:
    if not ENV_KEY.fullmatch(key):
        raise ValueError(
            f"{key[:60]!r} is not an environment variable name; fix: use letters, digits and '_', "
            "not starting with a digit (e.g. MY_FLAG)"
        )
    if looks_like_secret(key):
        raise ValueError(
            f"{key} looks like a secret, and secrets never go into a profile or a plan; fix: remove it, "
            "write the value to a file (mode 600) and name the file (the API key: api.key_file)"
        )
    return key


EnvKey = Annotated[str, AfterValidator(_env_key)]


def _no_secret_flag(v: str) -> str:
    flag = secret_flag(v)
    if flag is not None:
        reason, fix = secret_flag_problem(flag)
        raise ValueError(f"{reason}; fix: {fix}")
    return v


# an item of engine.extra_args or drop_args: refused, naming the flag only, when it takes a
# secret (checked item by item, before anything that would show an item or the value after it)
EngineArg = Annotated[str, AfterValidator(_no_secret_flag)]


def Form(regex: str, words: str, example: str) -> AfterValidator:  # noqa: N802 (reads as a type)
    """A string field of one textual form, refused with the value and the form in words."""
    compiled = re.compile(regex)

    def check(v: str) -> str:
        if not compiled.fullmatch(v):
            raise ValueError(f"{v[:80]!r} does not fit the pattern of {words}; fix: write it like {example!r}")
        return v

    return AfterValidator(check)


# the field checks keep an optional field's None and a required field's str
_MaybeStr = TypeVar("_MaybeStr", bound=str | None)


def _check_host(v: _MaybeStr) -> _MaybeStr:
    """An ssh address: an IP address or an RFC 1123 host name (never starting with '-')."""
    if v is not None and (not _HOST.fullmatch(v) or netaddr.host_problem(v)):
        raise ValueError(f"{v[:80]!r} is not a host name or IP address; fix: write {netaddr.HOST_WORDS}")
    return v


def _check_ip(v: str) -> str:
    """A fabric address: an IP address (ipaddress), which the plan puts in URLs and dist-init."""
    if v.startswith("-"):
        problem: str | None = "starts with '-', which ssh would read as an option"
    else:
        problem = None if _HOST.fullmatch(v) else f"is not {netaddr.IP_WORDS}"
    if problem is None:
        problem = netaddr.ip_problem(v)
    if problem:
        raise ValueError(f"{v[:80]!r} {problem}; fix: write {netaddr.IP_WORDS}, the node's address on the fabric")
    return v


def _check_user(v: _MaybeStr) -> _MaybeStr:
    if v is not None and not _USER.fullmatch(v):
        raise ValueError(
            f"{v[:40]!r} is not a valid user name; fix: 1-32 lower-case letters, digits, '_', '.' or '-', "
            "starting with a letter or '_'"
        )
    return v


def _check_identity(v: _MaybeStr) -> _MaybeStr:
    v = _check_path(v)
    if v is not None and any(c in v for c in "'\"$`\\"):
        raise ValueError(
            f"{v[:80]!r}: an ssh identity path must not contain quotes, '$', '`' or '\\'; fix: move the key "
            "to a plain path such as ~/.ssh/id_ed25519"
        )
    return v


def _decimal_text(value: object) -> object:
    """Keep a fraction's text exactly as written ("0.80"); a TOML float gets at least 2 decimals."""
    if isinstance(value, bool):
        raise ValueError(f"got {str(value).lower()}; must be a number between 0 and 1; fix: write it like 0.80")
    if isinstance(value, int | float):
        text = repr(float(value))
        whole, _, frac = text.partition(".")
        return f"{whole}.{frac.ljust(2, '0')}"
    if isinstance(value, str):
        return value.strip()
    return value


def _check_fraction(value: str) -> str:
    if not re.fullmatch(r"(0|1)?\.[0-9]+|[01](\.[0-9]*)?", value):
        raise ValueError(f"{value[:40]!r} is not a number between 0 and 1; fix: write it like 0.80")
    number = float(value)
    if not 0 < number <= 1:
        raise ValueError(f"{value} is not above 0 and at most 1; fix: use a fraction such as 0.80")
    return value


Fraction = Annotated[str, BeforeValidator(_decimal_text)]


def _text_value(value: object) -> object:
    """Gate and env values are strings in the container; accept TOML numbers and booleans."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)
    return value


def _safe_value(value: str) -> str:
    if has_unsafe_chars(value):
        raise ValueError(
            f"{value[:60]!r} contains a control character or line break; fix: remove it (a value is one "
            "line of printable text)"
        )
    return value


# checked per value, so a bad entry is reported (and dropped for the other checks) alone
EnvValue = Annotated[str, BeforeValidator(_text_value), AfterValidator(_safe_value)]


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)


class NodeSpec(Section):
    """One Spark. `ip` is the node's address on the fabric (upstream HEAD_IP / WORKER_IPS entry)."""

    name: str = Field(description="Node name used in tp4 output (upstream WORKER_HOSTS for workers).")
    ssh: str | None = Field(None, description="ssh address of the node; default: `ip`.")
    ip: str = Field(
        description="Fabric IP (HEAD_IP / WORKER_IPS): dist init, GID lookup, HOST_IP. An IPv4 or IPv6 address; the plan brackets an IPv6 head in its API URL and dist init address ([fd00::1]:20000, what SGLang's --dist-init-addr reads)."
    )
    user: str | None = Field(None, description="ssh user; default: `cluster.user` (WORKER_USER).")
    identity: str | None = Field(None, description="ssh identity file; default: `cluster.identity`.")
    ssh_port: Int | None = Field(None, ge=1, le=65535, description="ssh port; default 22.")
    home: str | None = Field(
        None, description="Home directory of `user` on the node; default /home/<user> (/root for root)."
    )
    workdir: str = Field("~/dsv41-4x-spark", description="Working directory on the node (WORKER_DIR).")
    state_dir: str | None = Field(
        None, description="Mounted at /state; default `<workdir>/state-tp4` on the head, `<workdir>/state` on workers."
    )
    engram_dir: str | None = Field(
        None,
        description="Packed Engram shards, mounted at /engram; default ~/dsv41-engram on the head (ENGRAM_DIR), `<workdir>/engram` on workers (WORKER_ENGRAM_DIR).",
    )
    gid_index: Int | None = Field(
        None, ge=0, le=255, description="This node's NCCL_IB_GID_INDEX; default `fabric.gid_index`."
    )
    kind: Literal["plain", "nixos"] = Field(
        "plain",
        description="plain: a DGX OS / Ubuntu host where tp4 runs the rank's container over ssh; nixos: a host of the NixOS module, whose unit runs the rank (serve starts and stops it).",
    )
    runtime: Literal["docker", "podman"] = Field(
        "docker",
        description="Container runtime of the node: docker by default on a plain host (DGX OS); a NixOS node runs "
        "podman (its default there), the runtime nixos-dgx-spark sets up.",
    )

    @model_validator(mode="before")
    @classmethod
    def _runtime_of_kind(cls, data: object) -> object:
        # a NixOS node's default is podman: nixos-dgx-spark enables it (modules/dgx-spark.nix)
        if isinstance(data, dict) and data.get("kind") == "nixos" and "runtime" not in data:
            return {**data, "runtime": "podman"}
        return data

    @field_validator("runtime")
    @classmethod
    def _runtime(cls, v: str, info: ValidationInfo) -> str:
        if v == "docker" and info.data.get("kind") == "nixos":
            raise ValueError(
                "a NixOS node runs its rank with podman: nixos-dgx-spark enables podman with dockerCompat "
                "and dockerSocket, which nixpkgs' podman module refuses beside virtualisation.docker.enable "
                '(what a docker rank unit needs); fix: set runtime = "podman" (or leave it out) for this node'
            )
        return v

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME.fullmatch(v):
            raise ValueError(
                f"{v[:80]!r} is not a node name; fix: 1-63 letters, digits, '.', '_' or '-', starting with a "
                "letter or digit (e.g. spark1)"
            )
        return v

    @field_validator("ssh")
    @classmethod
    def _host(cls, v: str | None) -> str | None:
        return _check_host(v)

    @field_validator("ip")
    @classmethod
    def _ip(cls, v: str) -> str:
        return _check_ip(v)

    @field_validator("user")
    @classmethod
    def _user(cls, v: str | None) -> str | None:
        return _check_user(v)

    @field_validator("identity")
    @classmethod
    def _identity(cls, v: str | None) -> str | None:
        return _check_identity(v)

    @field_validator("workdir", "state_dir", "engram_dir", "home")
    @classmethod
    def _path(cls, v: str | None) -> str | None:
        return _check_path(v)


def _check_path(v: _MaybeStr) -> _MaybeStr:
    if v is None:
        return v
    if not v or has_unsafe_chars(v) or any(c in v for c in ":,"):
        raise ValueError(
            f"{v[:80]!r} is not a usable path; fix: a non-empty path without control characters, ':' or ','"
        )
    if not (v.startswith("/") or v == "~" or v.startswith("~/")):
        raise ValueError(f"{v[:80]!r} is a relative path; fix: make it absolute or start it with ~/")
    return v


class Cluster(Section):
    head: NodeSpec = Field(
        default_factory=lambda: NodeSpec(name="head", ip="10.0.0.1"),
        description="The head: rank 0, serves the API, hosts dist init and the NFS export.",
    )
    workers: list[NodeSpec] = Field(
        default_factory=lambda: [], max_length=MAX_NODES - 1, description="Workers in rank order (rank = index + 1)."
    )
    user: str | None = Field(
        None,
        description="Default ssh user of every node (WORKER_USER); default: the local user running tp4, as ssh "
        "takes it ($USER, else the account's name). The plan records the user it was rendered with, so two "
        "operators' plans of a profile without it differ in the user and the home under it: set it for a line "
        "several people run. `tp4 profile import` writes upstream's own default (zurih) for a file without "
        "WORKER_USER, as upstream's launcher runs it.",
    )
    identity: str | None = Field(
        None,
        description="Default ssh identity (SSH_IDENTITY); default: none, ssh's own choice (its default keys, the "
        "agent, ~/.ssh/config). `tp4 profile import` writes upstream's own default (~/.ssh/id_ed25519_shared) "
        "for a file without SSH_IDENTITY.",
    )
    port: Int = Field(8888, ge=1, le=65535, description="OpenAI API port on the head (PORT / SERVER_PORT).")
    dist_port: Int = Field(20000, ge=1, le=65535, description="torch distributed init port on the head (DIST_PORT).")
    head_container: str = Field("dsv41-head", description="Container name on the head (HEAD_CTN).")
    worker_container: str = Field("dsv41-worker", description="Container name on workers (WORKER_CTN).")
    shm_size: str = Field("32g", description="Container /dev/shm size (SHM_SIZE).")
    gpu_clock_mhz: Int = Field(
        2200,
        ge=0,
        le=10000,
        description="The SM clock cap of every node's GPU in MHz (`nvidia-smi -lgc 0,<MHz>`): upstream measured its published numbers at 2200, re-applied by a timer on each node. The NixOS module's tp4-gpu-clock.timer applies it; tp4 doctor's GPU.CLOCK_CAP checks it. 0: the clock is left alone and not checked.",
    )
    memlock: Annotated[
        str,
        Form(
            r"(-1|[0-9]{1,19}):(-1|[0-9]{1,19})", "soft:hard locked-memory limits in bytes, -1 for unlimited", "-1:-1"
        ),
    ] = Field(
        "-1:-1",
        description="Locked-memory limit of every rank's container (soft:hard, -1 = unlimited). RDMA registers the KV pool: anything but -1:-1 is for hosts without RDMA (tests).",
    )

    @field_validator("gpu_clock_mhz")
    @classmethod
    def _clock(cls, v: int) -> int:
        if 0 < v < 300:
            raise ValueError(
                f"{v} MHz would throttle the GPU to a crawl; fix: the cap in MHz (2200, as upstream measured) "
                "or 0 to leave the clock alone"
            )
        return v

    @field_validator("head_container", "worker_container")
    @classmethod
    def _ctn(cls, v: str) -> str:
        if not _NAME.fullmatch(v):
            raise ValueError(f"{v[:80]!r} is not a container name; fix: 1-63 letters, digits, '.', '_' or '-'")
        return v

    @field_validator("user")
    @classmethod
    def _user(cls, v: str | None) -> str | None:
        return _check_user(v)

    @field_validator("identity")
    @classmethod
    def _identity(cls, v: str | None) -> str | None:
        return _check_identity(v)

    @field_validator("shm_size")
    @classmethod
    def _shm(cls, v: str) -> str:
        m = re.fullmatch(r"([0-9]{1,15})([bkmg]?)", v)
        if not m:
            raise ValueError(f'{v[:40]!r} is not a size; fix: a number with an optional unit b, k, m or g, e.g. "32g"')
        size = int(m.group(1)) * 1024 ** "bkmg".index(m.group(2) or "b")
        if size > SPARK_MEMORY_GIB * 1024**3:
            raise ValueError(
                f"{v} is more than a Spark's {SPARK_MEMORY_GIB} GiB of memory; fix: use at most {SPARK_MEMORY_GIB}g (32g in the TP4 line)"
            )
        return v


class Nccl(Section):
    net: Literal["IB", "Socket"] = Field("IB", description="NCCL_NET.")
    ib_disable: Bit = Field(0, description="NCCL_IB_DISABLE.")
    p2p_disable: Bit = Field(1, description="NCCL_P2P_DISABLE.")
    shm_disable: Bit = Field(1, description="NCCL_SHM_DISABLE.")
    debug: Literal["VERSION", "WARN", "INFO", "TRACE"] = Field(
        "WARN", description="NCCL_DEBUG (INFO for one validation boot)."
    )
    debug_subsys: Annotated[
        str,
        Form(
            r"\^?[A-Z]+(,[A-Z]+)*",
            "upper-case NCCL subsystem names separated by ',' (optionally led by '^')",
            "INIT,NET",
        ),
    ] = Field("INIT", description="NCCL_DEBUG_SUBSYS.")
    buffsize: Int = Field(
        4194304, ge=1, le=1 << 30, description="NCCL_BUFFSIZE (1048576 in the TP4 line: pinned buffers 5.0 -> 0.14 GB)."
    )
    ll128_buffsize: Int = Field(-2, ge=-2, le=1 << 30, description="NCCL_LL128_BUFFSIZE.")
    proto: Annotated[
        str,
        Form(
            r"\^?[A-Za-z0-9]+(,[A-Za-z0-9]+)*",
            "NCCL protocol names separated by ',' (optionally led by '^')",
            "LL,LL128,Simple",
        ),
    ] = Field("LL,LL128,Simple", description="NCCL_PROTO.")
    max_nchannels: Int = Field(32, ge=1, le=64, description="NCCL_MAX_NCHANNELS.")
    min_nchannels: Int = Field(4, ge=1, le=64, description="NCCL_MIN_NCHANNELS (ring only).")
    cross_nic: Annotated[Literal[0, 1, 2], BeforeValidator(_whole_number)] = Field(1, description="NCCL_CROSS_NIC.")
    ib_merge_nics: Bit = Field(0, description="NCCL_IB_MERGE_NICS.")
    ib_subnet_aware_routing: Bit = Field(1, description="NCCL_IB_SUBNET_AWARE_ROUTING.")
    algo: Annotated[str, Form(r"[A-Za-z,]+", "NCCL algorithm names (letters) separated by ','", "Ring")] = Field(
        "Ring", description="NCCL_ALGO (ring only)."
    )
    skip_tree_connect: Bit = Field(1, description="NCCL_SKIP_TREE_CONNECT (ring only).")
    ib_subnet_prefix_len: Int = Field(24, ge=1, le=32, description="NCCL_IB_SUBNET_PREFIX_LEN (ring only).")
    p2p_level: Annotated[str, Form(r"[A-Z]+", "one upper-case NCCL P2P level", "SYS")] = Field(
        "SYS", description="NCCL_P2P_LEVEL (ring only)."
    )
    mount: Literal["none", "dir", "overlay"] = Field(
        "none",
        description="Host NCCL build: 'dir' mounts `host_dir` at /nccl with LD_LIBRARY_PATH=/nccl (reaches ctypes users only); 'overlay' binds `<host_dir>/libnccl.so.2` over the image's pip NCCL (NCCL_OVERLAY_PIP=1; required on a ring).",
    )
    host_dir: str = Field("~/nccl-2.30.7", description="Host NCCL build directory (NCCL_HOST_DIR).")
    worker_dir: str | None = Field(
        None,
        description="NCCL build directory on workers if not the same home-relative path (NCCL_WORKER_DIR, absolute).",
    )
    pip_so: str = Field(
        "/opt/sglang/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2",
        description="The image's pip NCCL that 'overlay' replaces (NCCL_PIP_SO).",
    )
    sha256: (
        Annotated[
            str,
            Form(
                r"[0-9a-f]{64}",
                "a sha256 digest (64 lower-case hex digits, as sha256sum prints it)",
                "<64 hex digits of sha256sum libnccl.so.2>",
            ),
        ]
        | None
    ) = Field(
        None,
        description="The sha256 of the host NCCL build's libnccl.so.2 every node must carry (tp4 doctor's ARTIFACT.SHA256); unset: the nodes are compared with the head.",
    )

    @field_validator("host_dir", "worker_dir", "pip_so")
    @classmethod
    def _path(cls, v: str | None) -> str | None:
        return _check_path(v)


class Fabric(Section):
    mode: Literal["switched", "ring"] = Field(
        "switched", description="Switched RoCE fabric, or a switchless ring of four DACs (NCCL_SWITCHLESS_RING_ONLY=1)."
    )
    hcas: list[str] = Field(
        default_factory=lambda: ["rocep1s0f0", "rocep1s0f1"],
        min_length=1,
        description="RDMA devices for NCCL (IB_HCA -> NCCL_IB_HCA).",
    )
    socket_ifname: str = Field(
        "enP7s7", description="LAN interface for the TCP bootstrap (NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME)."
    )
    iface: str | None = Field(
        None, description="Fabric interface, for reference only (FABRIC_IFACE; unused by the launcher)."
    )
    gid_index: Int = Field(
        3, ge=0, le=255, description="Fallback NCCL_IB_GID_INDEX when a node sets none (3 = RoCE v2 IPv4-mapped)."
    )
    ring_hairpin_queue: Int = Field(
        8192,
        ge=1,
        le=1 << 20,
        description="Ring only: devlink hairpin queue size; RoCEnante's size cap is 262144 bytes at 8192, 81920 at the driver default 1024.",
    )
    nccl: Nccl = Field(default_factory=Nccl)

    @field_validator("hcas")
    @classmethod
    def _hcas(cls, v: list[str]) -> list[str]:
        for hca in v:
            if not re.fullmatch(r"[A-Za-z0-9_]+", hca):
                raise ValueError(
                    f"{hca[:40]!r} is not an RDMA device name; fix: letters, digits and '_' as `ibv_devices` "
                    "lists them (e.g. rocep1s0f0)"
                )
        return v

    @field_validator("socket_ifname", "iface")
    @classmethod
    def _ifname(cls, v: str | None) -> str | None:
        if v is not None and not _IFNAME.fullmatch(v):
            raise ValueError(
                f"{v[:40]!r} is not a network interface name; fix: 1-15 letters, digits, '_', '.', '@' or '-' "
                "as `ip link` lists them (e.g. enP7s7)"
            )
        return v


class Model(Section):
    dir: str = Field("~/NewModels/DeepSeek-V4.1-Flash", description="Checkpoint directory on the head (MODEL_DIR).")
    common_link: str = Field(
        "/var/tmp/DeepSeek-V4.1-Flash", description="Symlink to the checkpoint on the head (COMMON_MODEL)."
    )
    hf_repo: Annotated[
        str,
        Form(
            r"[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+",
            "a Hugging Face repository OWNER/NAME (letters, digits, '_', '.', '-')",
            "deepseek-ai/DeepSeek-V4.1-Flash",
        ),
    ] = Field("deepseek-ai/DeepSeek-V4.1-Flash", description="Hugging Face repository (HF_REPO).")
    hf_revision: Annotated[
        str,
        Form(
            r"[0-9a-f]{40}", "a full 40-character lower-case hex commit id", "fb2764a5cf321eaa5070ca8f9e892818f477c16d"
        ),
    ] = Field("fb2764a5cf321eaa5070ca8f9e892818f477c16d", description="Pinned revision (HF_REVISION).")
    expected_shards: Int = Field(
        48, ge=1, le=100000, description="Safetensors shards a complete checkpoint has (EXPECTED_SHARDS)."
    )
    served_name: Annotated[
        str,
        Form(
            r"[A-Za-z0-9][A-Za-z0-9._/-]*",
            "a model name of letters, digits, '.', '_', '/' or '-', starting with a letter or digit",
            "deepseek-v4.1-flash",
        ),
    ] = Field("deepseek-v4.1-flash", description="Model name served by the API (SERVED_MODEL_NAME).")

    @field_validator("dir", "common_link")
    @classmethod
    def _path(cls, v: str) -> str:
        return _check_path(v)


class Nfs(Section):
    share: bool = Field(
        True,
        description="Export the head's checkpoint over NFSv4 to the workers (NFS_SHARE). Off on a ring: every node holds a full local copy.",
    )
    volume: Annotated[
        str,
        Form(
            r"[A-Za-z0-9][A-Za-z0-9_.-]*",
            "a volume name of letters, digits, '_', '.' or '-', starting with a letter or digit",
            "dsv41-weights",
        ),
    ] = Field("dsv41-weights", description="Weights volume on workers (NFS_VOLUME).")
    export_name: Annotated[
        str,
        Form(
            r"[A-Za-z0-9][A-Za-z0-9_.-]*",
            "an export name of letters, digits, '_', '.' or '-', starting with a letter or digit",
            "dsv41-native",
        ),
    ] = Field("dsv41-native", description="Export name when reusing a foreign exporter (NFS_EXPORT_NAME).")
    server_ips: list[str] = Field(
        default_factory=lambda: ["10.0.22.1"],
        description="NFS server address: one for all workers, or one per worker (NFS_SERVER_IPS).",
    )
    clients: list[str] = Field(
        default_factory=lambda: ["10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.22.0/24"],
        description="Export ACL (NFS_CLIENTS).",
    )

    @field_validator("server_ips", "clients")
    @classmethod
    def _addrs(cls, v: list[str]) -> list[str]:
        for a in v:
            if not re.fullmatch(r"[0-9A-Fa-f.:]+(/[0-9]{1,3})?|[A-Za-z0-9.-]+", a):
                raise ValueError(
                    f"{a[:60]!r} is not an address or CIDR; fix: an IP address, a host name or a network "
                    "such as 10.0.22.0/24"
                )
        return v


class Image(Section):
    variant: Literal["base", "canary", "canary-roce"] = Field(
        "base",
        description="Which image the line runs: base (Dockerfile), canary (SGLang dsv4.1 branch), canary-roce (+ RoCEnante and b12x_next; production).",
    )
    tag: Annotated[
        str,
        Form(
            r"[a-z0-9][a-z0-9._/-]*(:[A-Za-z0-9._-]+)?(@sha256:[0-9a-f]{64})?",
            "an image reference NAME[:TAG][@sha256:DIGEST] with a lower-case name",
            "dsv41-3x-spark:local",
        ),
    ] = Field("dsv41-3x-spark:local", description="Image reference run on every node (IMAGE).")
    base: Annotated[
        str,
        Form(
            r"[a-z0-9][a-z0-9._/-]*(:[A-Za-z0-9._-]+)?(@sha256:[0-9a-f]{64})?",
            "an image reference NAME[:TAG][@sha256:DIGEST] with a lower-case name",
            "lmsysorg/sglang:dev-dsv41@sha256:<64 hex digits>",
        ),
    ] = Field(
        "lmsysorg/sglang:dev-dsv41@sha256:3dbc313030a6ef2c5d7de8ecf48e9aece722694a82182cb618cc82b588816349",
        description="Base image, pinned by digest (BASE_IMAGE).",
    )


class Engine(Section):
    tp: Int = Field(
        4,
        ge=1,
        le=MAX_NODES,
        description="Tensor parallel size (TP_SIZE); one GPU per Spark, so also the node count (NNODES).",
    )
    ep: Int | None = Field(
        None,
        ge=1,
        le=MAX_NODES,
        description="Expert parallel size (EP_SIZE); default: tp. Production: 1 (needs b12x_next); base and canary images: 2.",
    )
    context_length: Int = Field(409600, ge=1, le=1 << 40, description="Context length (CONTEXT_LENGTH), 4096..1048576.")
    mem_fraction_static: Fraction = Field(
        "0.80", description="Static memory fraction on workers (MEM_FRACTION_STATIC)."
    )
    head_mem_fraction_static: Fraction | None = Field(
        None, description="Static memory fraction on the head (HEAD_MEM_FRACTION_STATIC); default: mem_fraction_static."
    )
    max_running_requests: Int = Field(
        4, ge=1, le=4096, description="Decode slots (MAX_RUNNING_REQUESTS); also the CUDA graph batch size."
    )
    chunked_prefill_size: Int = Field(
        2048, ge=1, le=1 << 20, description="Prefill chunk (CHUNKED_PREFILL_SIZE); 4096 needs DSV41_INDEXER_CHUNKED=1."
    )
    max_total_tokens: Int = Field(
        320000,
        ge=0,
        le=1 << 32,
        description="KV pool pin in tokens (MAX_TOTAL_TOKENS); 0 = no pin. Keep it under the smallest `full_token` any boot computes.",
    )
    attention_backend: Annotated[
        str, Form(r"[a-z0-9_]+", "a backend name of lower-case letters, digits and '_'", "dsv4")
    ] = Field("dsv4", description="--attention-backend (ATTENTION_BACKEND).")
    moe_runner_backend: Annotated[
        str, Form(r"[a-z0-9_]+", "a backend name of lower-case letters, digits and '_'", "flashinfer_mxfp4")
    ] = Field("flashinfer_mxfp4", description="--moe-runner-backend (MOE_RUNNER_BACKEND).")
    spec_algo: Literal["DSPARK", "none"] = Field("DSPARK", description="Speculative decoding (SPEC_ALGO).")
    dspark_block_size: Int = Field(
        5, ge=1, le=16, description="DSpark draft block (DSPARK_BLOCK_SIZE); verify window = block + 1."
    )
    sps_table: str = Field("/state/dspark_sps.json", description="DSPARK_SPS_TABLE path in the container.")
    sts_table: str = Field("/state/dspark_sts.json", description="DSPARK_STS_TABLE path in the container.")
    use_sps_table: bool = Field(
        False,
        description="The SPS table file is present, so boot.py passes it (not used in production: the first mixed batch dies in the Engram verify path).",
    )
    use_sts_table: bool = Field(False, description="The STS confidence table file is present, so boot.py passes it.")
    offload_mode: Literal["nvme", "ram"] = Field(
        "nvme", description="Engram offload (OFFLOAD_MODE); ram (~189 GiB pinned) never fits on a Spark."
    )
    host: Annotated[str, Form(r"[0-9A-Fa-f.:]+", "an IPv4 or IPv6 address", "0.0.0.0")] = Field(
        "0.0.0.0", description="Bind address of the API (HOST)."
    )
    extra_args: list[EngineArg] = Field(
        default_factory=lambda: [],
        description="Extra engine arguments, one word per item (EXTRA_SGLANG_ARGS); a flag's values follow it as their own items. A flag that takes a secret (--api-key, --admin-api-key, key, token, secret or password in its name) is refused: the API key goes in api.key_file.",
    )
    drop_args: list[EngineArg] = Field(
        default_factory=lambda: [],
        description='Flags of the presets\' `engine.extra_args` this layer removes, each with its values (e.g. ["--sleep-on-idle"]); each must be a flag a lower layer sets.',
    )

    @field_validator("mem_fraction_static", "head_mem_fraction_static")
    @classmethod
    def _fraction(cls, v: str | None) -> str | None:
        return None if v is None else _check_fraction(v)

    @field_validator("sps_table", "sts_table")
    @classmethod
    def _abs(cls, v: str) -> str:
        if not v.startswith("/") or has_unsafe_chars(v):
            raise ValueError(
                f"{v[:80]!r} is not an absolute path inside the container; fix: a path starting with / "
                "without control characters"
            )
        return v

    @field_validator("extra_args", "drop_args")
    @classmethod
    def _words(cls, v: list[str]) -> list[str]:
        for arg in v:
            if not arg or any(c.isspace() for c in arg) or has_unsafe_chars(arg):
                raise ValueError(
                    f"{arg[:60]!r}: each item must be one non-empty word without whitespace (boot.py splits "
                    'EXTRA_SGLANG_ARGS on whitespace); fix: split it into separate items, e.g. ["--flag", "value"]'
                )
        return v


class ListMerge(NamedTuple):
    """How a list a layer sets (a preset, then the profile) combines with the lists of the layers
    below it: "add" appends the layer's items to the inherited ones (removing one is explicit, in
    the field named by `drop`); "replace" takes the layer's list whole."""

    how: Literal["add", "replace", "drop"]
    why: str
    drop: str | None = None


# Every list field of the profile, and how it layers: the one place this is decided. The loader
# (load.py) merges by it, the profile reference prints it, and a test holds it to the models.
LIST_MERGE: dict[str, ListMerge] = {
    "engine.extra_args": ListMerge(
        "add",
        "the presets' flags are part of the line they describe (--fp8-gemm-backend, "
        "--sleep-on-idle, ...): a profile adds its own flags after them; one flag given twice, by two "
        "layers or in one, is an error naming both; an inherited flag is removed with "
        "`engine.drop_args`",
        drop="engine.drop_args",
    ),
    "engine.drop_args": ListMerge(
        "drop",
        "each layer's items remove flags of the layers below it (with their values) before "
        "its own `engine.extra_args` are added; naming a flag no lower layer sets is an error",
    ),
    "cluster.workers": ListMerge(
        "replace",
        "the workers are this line's machines in rank order: a list added to another "
        "layer's would put ranks on hosts this line does not have",
    ),
    "fabric.hcas": ListMerge(
        "replace",
        "the RDMA devices of this line's hosts, all of which NCCL uses: the preset's names "
        "are another host's, and a device NCCL cannot open fails the line",
    ),
    "nfs.server_ips": ListMerge(
        "replace",
        "one address for all workers or one per worker, by position: items added to "
        "another layer's would shift every worker's server",
    ),
    "nfs.clients": ListMerge(
        "replace",
        "the export's access list: adding to a preset's would open the checkpoint to "
        "addresses the preset guessed and never let a profile narrow it",
    ),
}


class Engram(Section):
    cache_gib: Int = Field(
        4, ge=0, le=SPARK_MEMORY_GIB, description="Engram row cache per host in GiB (DSV41_CACHE_GIB)."
    )
    cache_ways: Int = Field(4, ge=1, le=1024, description="Row cache associativity (DSV41_CACHE_WAYS).")
    io_threads: Int = Field(96, ge=1, le=4096, description="Miss-servicing thread pool (DSV41_IO_THREADS).")
    resident_scales: Bit = Field(0, description="Pin scale rows (~1 GiB/layer/rank) (DSV41_RESIDENT_SCALES).")
    stats_seconds: Int = Field(60, ge=0, le=86400, description="Engram stats interval (DSV41_STATS_SECONDS).")
    packed_dir: str = Field("/engram", description="Packed shards in the container (DSV41_PACKED_DIR).")

    @field_validator("packed_dir")
    @classmethod
    def _abs(cls, v: str) -> str:
        if not v.startswith("/") or has_unsafe_chars(v):
            raise ValueError(
                f"{v[:80]!r} is not an absolute path inside the container; fix: a path starting with / "
                "without control characters"
            )
        return v


class Runtime(Section):
    """boot.py behaviour inside the container."""

    skip_prepare: Bit = Field(
        1, description="Skip the checkpoint fetch/verify on rank 0 (SKIP_PREPARE); workers always skip."
    )
    skip_verify: Bit = Field(
        1, description="Skip hashing the checkpoint against the Hub (SKIP_VERIFY); workers always skip."
    )
    skip_smoke: Bit = Field(0, description="Skip the boot smoke test on the head (SKIP_SMOKE); workers always skip.")
    smoke_quick: Bit = Field(1, description="Quick smoke only (SMOKE_QUICK).")
    warmup: Bit = Field(1, description="Warm-up prompts after the smoke (WARMUP).")
    ready_timeout: Int = Field(
        3600,
        ge=10,
        le=7 * 86400,
        description="Seconds to wait for the head to report ready (READY_TIMEOUT x 10 s upstream).",
    )
    moe_fused_finalize: Bit = Field(
        1,
        description="SGLANG_FLASHINFER_MOE_FUSED_FINALIZE (0 in the TP4 line: the fused atomic finalize is nondeterministic).",
    )
    pytorch_cuda_alloc_conf: Annotated[
        str,
        Form(
            r"[A-Za-z0-9_:,.]+",
            "allocator options of letters, digits, '_', ':', ',' and '.'",
            "expandable_segments:False",
        ),
    ] = Field(
        "expandable_segments:False",
        description="PYTORCH_CUDA_ALLOC_CONF (True gives NaN logits on >64-token prefills).",
    )


class Api(Section):
    key_file: str | None = Field(
        None,
        description="File holding the API key on the machine running tp4; none = open endpoint. The key itself never goes into a profile.",
    )

    @field_validator("key_file")
    @classmethod
    def _path(cls, v: str | None) -> str | None:
        return _check_path(v)


class Profile(Section):
    # the gates the profile document itself sets (not its presets): set by the loader; None when
    # the profile was built another way, and then a gate equal to the preset's counts as the preset's
    _own_gates: frozenset[str] | None = PrivateAttr(default=None)
    # the gates its preset chain alone sets: set by the loader, which reads the preset files; None
    # (no gate is the preset's) when the profile was built another way
    _preset_gates: dict[str, str] | None = PrivateAttr(default=None)
    preset: str = Field(
        "production",
        description="The preset layer this profile overrides: launcher-defaults, base, canary, canary-roce or production.",
    )
    cluster: Cluster = Field(default_factory=Cluster)
    fabric: Fabric = Field(default_factory=Fabric)
    model: Model = Field(default_factory=Model)
    nfs: Nfs = Field(default_factory=Nfs)
    image: Image = Field(default_factory=Image)
    engine: Engine = Field(default_factory=Engine)
    engram: Engram = Field(default_factory=Engram)
    runtime: Runtime = Field(default_factory=Runtime)
    api: Api = Field(default_factory=Api)
    gates: dict[EnvKey, EnvValue] = Field(
        default_factory=lambda: {},
        description='Adapter gates (adapters/registry.toml), e.g. DSV41_MOE_B12X_NEXT = "1"; "0" turns a preset\'s gate off.',
    )
    env: dict[EnvKey, EnvValue] = Field(
        default_factory=lambda: {},
        description="Extra container environment that is not an adapter gate (e.g. SGLANG_RUST_BUILD_MODE, dual-plane NCCL flags).",
    )

    @property
    def nodes(self) -> list[NodeSpec]:
        return [self.cluster.head, *self.cluster.workers]

    @property
    def ep(self) -> int:
        return self.engine.ep if self.engine.ep is not None else self.engine.tp
