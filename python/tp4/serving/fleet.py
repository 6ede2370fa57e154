"""A fleet: several TP4 lines behind SGLang's router, from one fleet file (docs/fleet.md).

The fleet file (TOML) lists the lines, each a profile (``profile``, or the fleet's ``base``) with
``set``, a partial profile document merged over it (its nodes, its port, any field), and the
router: where it runs, its port, policy, generating health check and loopback metrics. Loading it
loads every line with the profile loader and builds its plan (so every line is valid on its
own), then checks the rules between lines: no node in two lines, no port clash on the router's
host, the same image and served model name everywhere (unless ``allow``), one API key file.

The router is SGLang's own (``sglang-router``, or its successor ``smg``: :data:`ROUTERS`, one row
per kind), run as a plain process on the router's host through :mod:`tp4.core.process` (over ssh, or
here when ``router.host = "local"``): a constant launcher started in its own session, its pid and
start time in ``<state_dir>/router.pid``, its output in ``<state_dir>/router.log``. The API key
(when the lines have one) goes to ``<state_dir>/api-key`` (mode 0600, through stdin) and the
launcher adds it to the router's arguments inside its own process: never in an argv a process
table shows, never in a log.

* :func:`serve` serves every line in parallel (each with :func:`tp4.serving.serve.serve`, its checks and
  its verification), then starts the router over the lines that came up, and is ready when the
  router reports every one of them healthy; a line that failed is reported and left out (or,
  with ``all_lines``, everything stops).
* :func:`stop` stops the router and every line (idempotent). :func:`status` reports both.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from tp4.core import pidfile, schemas
from tp4.core.contracts.fleet_plan import (
    FleetPlan,
    FleetPlanLine,
    FleetPlanRouter,
    HealthEndpoint,
    Policy,
    RouterHealth,
    RouterKindName,
    RouterService,
)
from tp4.core import netaddr
from tp4.core.errors import InvalidInput, Tp4Error
from tp4.core.privatefiles import PRIVATE_DIR_SH, WRITE_PRIVATE
from tp4.line.profile.models import _NAME, Int, _check_host, _check_identity, _check_path, _check_user
from tp4.line.profile.problem import Problem

if TYPE_CHECKING:
    from tp4.core import process
    from tp4.core.apikey import Secret
    from tp4.line.plan import Plan
    from tp4.line.profile.load import Loaded
    from tp4.hosts.nodes import Node
    from tp4.serving.serve import Options

Echo = Callable[[str], None]

# SGLang's own generating probe gives up after SGLANG_HEALTH_CHECK_TIMEOUT seconds (default 20);
# the router's health check must wait longer, or a busy, healthy line is marked down
SGLANG_HEALTH_TIMEOUT = 20
HEALTH_ENV = "SGLANG_HEALTH_CHECK_TIMEOUT"
METRICS_HOST = "127.0.0.1"
KEY_FILE = "api-key"
# the router's state directory when the fleet file names none: the unit's StateDirectory
# (nixosModules.tp4-router), else the router user's XDG state directory on its host, resolved
# there by its own shell (STATE_DIR_SH); shown as DEFAULT_STATE_DIR where no host is asked
UNIT_STATE_DIR = "/var/lib/tp4-router"
DEFAULT_STATE_DIR = "$XDG_STATE_HOME/tp4/router"
STATE_DIR_SH = (
    "s=${XDG_STATE_HOME:-}; case $s in /*) ;; *) s=${HOME:-}/.local/state;; esac; "
    'case $s in /*) printf "%s\\n" "$s/tp4/router";; *) echo "tp4: no absolute XDG_STATE_HOME or HOME on this host; '
    'fix: set router.state_dir" >&2; exit 3;; esac'
)
PID_FILE = "router.pid"
LOG_FILE = "router.log"
LOG_TAIL = 20


class RouterKind(NamedTuple):
    """One router package: the module whose ``parse_router_args(list)`` and ``launch_router(args)``
    the launcher calls, and the title its process gives itself (setproctitle)."""

    package: str
    module: str
    title: str


ROUTERS: dict[str, RouterKind] = {
    "sglang-router": RouterKind("sglang-router", "sglang_router.launch_router", "sglang::router"),
    "smg": RouterKind("smg", "smg.launch_router", "smg::router"),
}

# The router's process: `python -c LAUNCHER KEYFILE MODULE ARGS...`. The key (when KEYFILE is not
# empty) is read here and added to the router's own argument list in this process, so it is never
# in an argv. A constant: every value is an argument.
LAUNCHER = (
    "import importlib, sys\n"
    "# tp4 fleet router launcher\n"
    "key_file, module, args = sys.argv[1], sys.argv[2], sys.argv[3:]\n"
    "if key_file:\n"
    "    with open(key_file) as f:\n"
    "        args += ['--api-key', f.read().strip()]\n"
    "m = importlib.import_module(module)\n"
    "m.launch_router(m.parse_router_args(args))\n"
)

# a line of the router's /proc/PID/cmdline: the launcher's marker, or the title a router gives itself
_ROUTER_CMDLINE = "^(# tp4 fleet router launcher$|" + "|".join(re.escape(k.title) for k in ROUTERS.values()) + ")"

# constant scripts on the router's host; $1 is the state dir, every value an argument. The state
# dir must be the router user's own, writable by nobody else (tp4.core.privatefiles.private_dir):
# the key file and the log are written there
# a fresh log: never truncated through a symlink (a link there is refused; the file is created
# exclusively, set -C)
_NEW_LOG = (
    'if [ -L "$d/router.log" ]; then echo "tp4: $d/router.log is a symbolic link, refused; fix: remove it" >&2; exit 3; fi; '
    'rm -f -- "$d/router.log" && (set -C && : > "$d/router.log") || exit 1; '
)
_START_TIME = 'sed "s/.*) //" /proc/"$1"/stat 2>/dev/null | cut -d" " -f20'
_ALIVE = (
    # the pid file's process, only while it is the router started (tp4.core.pidfile.SAME_SH): a pid
    # > 1 whose start time is the recorded one, running the launcher (or titled as a router)
    pidfile.SAME_SH + 'alive() { [ -f "$d/router.pid" ] && read -r p s < "$d/router.pid" && '
    f'same "$p" "$s" -qE {shlex.quote(_ROUTER_CMDLINE)}; }}; '
    # the process alive() saw, until it is gone, its zombie included: what a stop waits for
    f'started() {{ [ "$(set -- "$p"; {_START_TIME})" = "$s" ]; }}; '
)
_START = (
    "d=$1; shift; umask 077; "
    + PRIVATE_DIR_SH
    + 'private_dir "$d" || exit 3; '
    + _ALIVE
    + 'if alive; then echo "running $p"; exit 0; fi; '
    + _NEW_LOG
    + 'setsid "$@" < /dev/null >> "$d/router.log" 2>&1 & p=$!; '
    f's=$(set -- "$p"; {_START_TIME}); echo "$p $s" > "$d/router.pid"; echo "started $p"'
)
_PID = "d=$1; " + _ALIVE + 'if alive; then echo "$p"; fi'
_STOP = (
    "d=$1; g=$2; " + _ALIVE + 'if alive; then kill -TERM "$p" 2>/dev/null; i=0; '
    "while started && [ $i -lt $((g * 10)) ]; do sleep 0.1; i=$((i+1)); done; "
    'if alive; then kill -KILL "$p" 2>/dev/null; fi; while started && [ $i -lt $((g * 10 + 20)) ]; do sleep 0.1; i=$((i+1)); done; fi; '
    'if alive; then echo "still running $p"; exit 1; fi; rm -f -- "$d/router.pid" "$d/api-key"'
)


# --- the fleet file -------------------------------------------------------------------------------


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)


class Health(Section):
    """The router's health check of each line: it must generate (SGLang's ``/health_generate``
    runs a one-token request through the scheduler), and wait longer than the line's own probe."""

    endpoint: HealthEndpoint = Field(
        "/health_generate",
        description="What the router probes: /health_generate generates one token; /health only when the engine's SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION is on.",
    )
    timeout: Int = Field(
        30,
        ge=1,
        le=3600,
        description="Seconds a probe may take (--health-check-timeout-secs); above the lines' SGLANG_HEALTH_CHECK_TIMEOUT (20 s).",
    )
    interval: Int = Field(10, ge=1, le=3600, description="Seconds between probes (--health-check-interval-secs).")
    failure_threshold: Int = Field(
        3, ge=1, le=1000, description="Failed probes in a row before a line is taken out (--health-failure-threshold)."
    )
    success_threshold: Int = Field(
        2, ge=1, le=1000, description="Good probes in a row before it comes back (--health-success-threshold)."
    )


class Metrics(Section):
    port: Int = Field(
        29000,
        ge=1,
        le=65535,
        description="The router's Prometheus port, on the router host's loopback (--prometheus-port).",
    )


class Router(Section):
    kind: RouterKindName = Field("sglang-router", description="Which router package runs (ROUTERS).")
    host: str = Field(
        "local", description='Where the router runs: "local" (this machine) or the ssh address of a host.'
    )
    user: str | None = Field(None, description="ssh user on the router's host (default: ssh's).")
    identity: str | None = Field(None, description="ssh identity for the router's host.")
    ssh_port: Int | None = Field(None, ge=1, le=65535, description="ssh port of the router's host.")
    bind: str = Field(
        "0.0.0.0",
        description="Address the router's API binds (--host): an IPv4 or IPv6 address (0.0.0.0 or :: for all) or a host name, without the port (router.port).",
    )
    port: Int = Field(30000, ge=1, le=65535, description="The router's OpenAI API port (--port).")
    policy: Policy = Field(
        "round_robin",
        description="How requests are spread (--policy); cache_aware may send all shared-prefix traffic to one line.",
    )
    python: str | None = Field(
        None, description="Python with the router installed, on the router's host (default: the Python running tp4)."
    )
    state_dir: str | None = Field(
        None,
        description="The router's pid file, log and key file on its host (absolute; a directory of the router's user, "
        "writable by nobody else). Default: $XDG_STATE_HOME/tp4/router (else ~/.local/state/tp4/router) of the "
        "router's user on its host; with service = \"unit\", /var/lib/tp4-router (the unit's StateDirectory).",
    )
    ready_timeout: Int = Field(
        300, ge=1, le=86400, description="Seconds serve waits for the router to report every line healthy."
    )
    stop_grace: Int = Field(10, ge=0, le=3600, description="Seconds between TERM and KILL when the router stops.")
    service: RouterService = Field(
        "process",
        description='How the router runs on its host: a plain process in its own session ("process"), or the NixOS module\'s tp4-router.service ("unit": nixosModules.tp4-router), started and stopped with systemctl.',
    )
    health: Health = Field(default_factory=Health)
    metrics: Metrics = Field(default_factory=Metrics)

    @field_validator("host")
    @classmethod
    def _host(cls, v: str) -> str:
        return v if v == "local" else _check_host(v)

    @field_validator("bind")
    @classmethod
    def _bind(cls, v: str) -> str:
        split = netaddr.split_host_port(v)
        if split is not None and split[1].isdigit() and netaddr.bind_problem(split[0]) is None:
            raise ValueError(
                f"{v[:80]!r} holds a port; fix: bind = {split[0]!r} and port = {split[1][:6]} (the port is router.port)"
            )
        problem = netaddr.bind_problem(v)
        if problem:
            raise ValueError(
                f"{v[:80]!r} {problem}; fix: an IPv4 or IPv6 address of the router's host (0.0.0.0 or :: for all), "
                "or its host name, without a port (the port is router.port)"
            )
        return v

    @field_validator("user")
    @classmethod
    def _user(cls, v: str | None) -> str | None:
        return _check_user(v)

    @field_validator("identity")
    @classmethod
    def _identity(cls, v: str | None) -> str | None:
        return _check_identity(v)

    @field_validator("python", "state_dir")
    @classmethod
    def _path(cls, v: str | None) -> str | None:
        v = _check_path(v)
        if v is not None and not v.startswith("/"):
            raise ValueError(f"{v[:80]!r} is not an absolute path; fix: an absolute path on the router's host (no ~)")
        return v


class LineEntry(Section):
    name: str = Field(description="The line's name in tp4 output.")
    profile: str | None = Field(
        None, description="The line's profile, relative to the fleet file (default: the fleet's base)."
    )
    set: dict[str, object] = Field(
        default_factory=lambda: {},
        description="A partial profile merged over the profile (its nodes, ports, any field).",
    )

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME.fullmatch(v):
            raise ValueError(
                f"{v[:80]!r} is not a line name; fix: 1-63 letters, digits, '.', '_' or '-', starting with a letter or digit"
            )
        return v

    @field_validator("profile")
    @classmethod
    def _profile(cls, v: str | None) -> str | None:
        if v is not None and (not v or any(ord(c) < 32 or c == "\x7f" for c in v)):
            raise ValueError(f"{v[:80]!r} is not a usable path; fix: a profile path without control characters")
        return v


class Allow(Section):
    mixed_images: bool = Field(False, description="Lines may run different images.")
    mixed_models: bool = Field(False, description="Lines may serve different model names.")


class FleetFile(Section):
    base: str | None = Field(None, description="The profile of every line that names none, relative to the fleet file.")
    lines: list[LineEntry] = Field(min_length=1, max_length=64, description="The lines, in order.")
    router: Router = Field(default_factory=Router)
    allow: Allow = Field(default_factory=Allow)

    @field_validator("base")
    @classmethod
    def _base(cls, v: str | None) -> str | None:
        return LineEntry._profile(v)


# --- the loaded fleet -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Line:
    name: str
    loaded: Loaded
    plan: Plan

    @property
    def api(self) -> str:
        return self.plan.line.api


@dataclass(frozen=True)
class Fleet:
    source: str
    file: FleetFile
    lines: tuple[Line, ...]
    warnings: tuple[str, ...] = ()
    key_file: str | None = None  # the lines' api.key_file (one for all)

    @property
    def router(self) -> Router:
        return self.file.router

    @property
    def url(self) -> str:
        """The router's API as clients reach it."""
        r = self.router
        host = r.bind if r.bind not in ("0.0.0.0", "::") else ("127.0.0.1" if r.host == "local" else r.host)
        return f"http://{netaddr.host_port(host, r.port)}"


def _line_problems(where: str, exc: InvalidInput) -> list[str]:
    head = exc.message.split("\n", 1)[0]
    return [f"{where}: {p}" for p in exc.problems] if exc.problems else [f"{where}: {head}"]


def load(path: str | os.PathLike[str]) -> Fleet:
    """The fleet file at ``path``, every line loaded and planned, the rules between them checked.
    Raises InvalidInput listing every problem."""
    from tp4.line.profile.load import _pydantic_problems, _read_toml, merge, parse_document
    from tp4.core.userfiles import parse_toml, read_input

    source = str(path)
    doc = parse_toml(
        read_input(path, "fleet file", "pass an existing fleet file (docs/fleet.md)"),
        source,
        "correct the fleet file (docs/fleet.md)",
    )
    try:
        fleet_file = FleetFile.model_validate(doc)
    except ValidationError as exc:
        raise InvalidInput(
            f"{source}: {len(exc.errors())} problem(s)", [str(p) for p in _pydantic_problems(exc, doc, FleetFile)]
        ) from None
    problems: list[str] = []
    warnings: list[str] = []
    root = Path(path).parent
    lines: list[Line] = []
    seen_names: dict[str, int] = {}
    for i, entry in enumerate(fleet_file.lines):
        where = f"lines[{i}] ({entry.name})"
        if entry.name in seen_names:
            problems.append(
                f"lines[{i}].name: {entry.name!r} is also the name of lines[{seen_names[entry.name]}]; fix: give every line its own name"
            )
            continue
        seen_names[entry.name] = i
        profile = entry.profile or fleet_file.base
        if profile is None:
            problems.append(
                f"lines[{i}].profile: is required (the fleet has no base); fix: name the line's profile, or set base"
            )
            continue
        profile_path = root / profile
        try:
            text = read_input(profile_path, "profile", f"fix {where}.profile (relative to {source})")
            loaded = parse_document(merge(_read_toml(text, str(profile_path)), entry.set), f"{where} {profile_path}")
            from tp4.line.plan import build_plan

            plan = build_plan(loaded)
        except InvalidInput as exc:
            problems += _line_problems(where, exc)
            continue
        warnings += [f"{where}: {w}" for w in loaded.warnings]
        lines.append(Line(entry.name, loaded, plan))
    key_file: str | None = None
    if not problems:
        errors, more, key_file = _rules(fleet_file, lines)
        problems += [str(p) for p in errors]
        warnings += [str(w) for w in more]
    if problems:
        raise InvalidInput(f"{source}: {len(problems)} problem(s)", problems)
    return Fleet(source, fleet_file, tuple(lines), tuple(warnings), key_file)


def _rules(ff: FleetFile, lines: Sequence[Line]) -> tuple[list[Problem], list[Problem], str | None]:
    """The rules between lines and the router: (errors, warnings, the API key file)."""
    errors: list[Problem] = []
    warnings: list[Problem] = []
    r = ff.router
    # no node in two lines: by name, fabric IP and ssh address
    for attr, label in (("name", "node name"), ("host", "fabric IP"), ("ssh", "ssh address")):
        owner: dict[str, str] = {}
        for i, line in enumerate(lines):
            for node in line.plan.nodes:
                value = node.ssh.host if attr == "ssh" else getattr(node, attr)
                if value in owner and owner[value] != line.name:
                    errors.append(
                        Problem(
                            f"lines[{i}] ({line.name})",
                            f"{label} {value!r} is also in line {owner[value]}",
                            "every node belongs to one line: give each line its own nodes",
                        )
                    )
                owner.setdefault(value, line.name)
    # ports on the router's host: its API and metrics ports, and each line's API and dist init
    # port where the router shares a host with a line
    if r.port == r.metrics.port:
        errors.append(
            Problem("router.metrics.port", f"equals router.port ({r.port})", "use two ports (default 30000 and 29000)")
        )
    for line in lines:
        addresses = {a for n in line.plan.nodes for a in (n.ssh.host, n.host)}
        if r.host not in addresses:
            continue
        api_port = int(line.plan.line.api.rsplit(":", 1)[1])
        dist_port = int(line.plan.line.dist_init_addr.rsplit(":", 1)[1])
        for field_, port in (("router.port", r.port), ("router.metrics.port", r.metrics.port)):
            for what, taken in (("API", api_port), ("dist init", dist_port)):
                if port == taken:
                    errors.append(
                        Problem(
                            field_,
                            f"{port} is line {line.name}'s {what} port on {r.host}, where the router runs",
                            "choose another port, or run the router on another host",
                        )
                    )
    # the same image and served model everywhere (a client of the router must not see which line answered)
    for attr, allowed, label, flag in (
        ("image", ff.allow.mixed_images, "image", "allow.mixed_images"),
        ("model", ff.allow.mixed_models, "served model name", "allow.mixed_models"),
    ):
        values = {
            line.name: (line.plan.image.tag if attr == "image" else line.plan.nodes[0].env.get("SERVED_MODEL_NAME", ""))
            for line in lines
        }
        if len(set(values.values())) > 1 and not allowed:
            shown = ", ".join(f"{k}: {v}" for k, v in values.items())
            errors.append(
                Problem(
                    "lines",
                    f"the lines differ in their {label} ({shown})",
                    f"give every line the same one, or set {flag} = true",
                )
            )
    # one API key for all: the router passes one key to every line
    keys = {
        line.name: (line.plan.secrets["API_KEY"].file if "API_KEY" in line.plan.secrets else None) for line in lines
    }
    if len(set(keys.values())) > 1:
        shown = ", ".join(f"{k}: {v or 'none'}" for k, v in keys.items())
        errors.append(
            Problem(
                "lines",
                f"the lines have different api.key_file ({shown}); the router gives every line one key",
                "give every line the same api.key_file (or none)",
            )
        )
    # the health check must outwait each line's own generating probe
    own = max((_own_probe(line) for line in lines), default=SGLANG_HEALTH_TIMEOUT)
    if r.health.timeout <= own:
        errors.append(
            Problem(
                "router.health.timeout",
                f"{r.health.timeout} s is not above the lines' own generating probe ({own} s, {HEALTH_ENV}): "
                "the router would mark a busy, healthy line down",
                f"set it above {own} (default 30)",
            )
        )
    if r.health.endpoint != "/health_generate":
        warnings.append(
            Problem(
                "router.health.endpoint",
                f"{r.health.endpoint} generates only while the engine's SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION is on",
                'use "/health_generate"',
            )
        )
    if r.policy == "cache_aware":
        warnings.append(
            Problem(
                "router.policy",
                "cache_aware may send all shared-prefix traffic to one line (measured upstream: prose c32 296 tok/s against 673 with round_robin)",
                'use "round_robin" unless the traffic has few shared prefixes',
            )
        )
    return errors, warnings, next(iter(keys.values()), None)


def _own_probe(line: Line) -> int:
    value = line.plan.nodes[0].env.get(HEALTH_ENV, "")
    return int(value) if value.isdigit() else SGLANG_HEALTH_TIMEOUT


# --- the router's argv ----------------------------------------------------------------------------


def python_of(fleet: Fleet) -> str:
    import sys

    return fleet.router.python or sys.executable


def router_args(fleet: Fleet, urls: Sequence[str]) -> list[str]:
    """The router's own arguments (common to every kind in ROUTERS), without the API key."""
    r = fleet.router
    h = r.health
    return [
        "--host",
        r.bind,
        "--port",
        str(r.port),
        "--worker-urls",
        *urls,
        "--policy",
        r.policy,
        "--health-check-endpoint",
        h.endpoint,
        "--health-check-timeout-secs",
        str(h.timeout),
        "--health-check-interval-secs",
        str(h.interval),
        "--health-failure-threshold",
        str(h.failure_threshold),
        "--health-success-threshold",
        str(h.success_threshold),
        "--prometheus-host",
        METRICS_HOST,
        "--prometheus-port",
        str(r.metrics.port),
        "--shutdown-grace-period-secs",
        str(r.stop_grace),
        "--log-level",
        "info",
    ]


def state_dir_of(fleet: Fleet) -> str | None:
    """The router's state directory where it is known without asking its host: the fleet file's,
    or the unit's; None: the router user's XDG state directory there (STATE_DIR_SH)."""
    r = fleet.router
    return r.state_dir or (UNIT_STATE_DIR if r.service == "unit" else None)


def router_argv(fleet: Fleet, urls: Sequence[str], state_dir: str | None = None) -> list[str]:
    """The command that runs the router on its host: the launcher, the key file (empty without a
    key: the key itself is never here) and the router's arguments. ``state_dir``: the router's
    state directory as its host resolved it (default: :func:`state_dir_of`, else shown as
    DEFAULT_STATE_DIR)."""
    r = fleet.router
    d = state_dir or state_dir_of(fleet) or DEFAULT_STATE_DIR
    key = f"{d}/{KEY_FILE}" if fleet.key_file else ""
    return [python_of(fleet), "-c", LAUNCHER, key, ROUTERS[r.kind].module, *router_args(fleet, urls)]


def router_remote(fleet: Fleet, ssh_options: Sequence[str] = ()) -> process.Remote | None:
    from tp4.core import process

    r = fleet.router
    if r.host == "local":
        return None
    return process.Remote(host=r.host, user=r.user, identity=r.identity, port=r.ssh_port, options=tuple(ssh_options))


def plan_json(fleet: Fleet) -> dict[str, object]:
    """`tp4 fleet plan --json`, built through its contract (tp4.core.contracts.fleet_plan)."""
    urls = [line.api for line in fleet.lines]
    argv = router_argv(fleet, urls)
    r = fleet.router
    doc = FleetPlan(
        source=fleet.source,
        url=fleet.url,
        lines=[
            FleetPlanLine(
                name=line.name,
                api=line.api,
                nodes=[n.name for n in line.plan.nodes],
                image=line.plan.image.tag,
                model=line.plan.nodes[0].env.get("SERVED_MODEL_NAME"),
                source=line.loaded.source,
            )
            for line in fleet.lines
        ],
        router=FleetPlanRouter(
            kind=r.kind,
            host=r.host,
            port=r.port,
            policy=r.policy,
            metrics=f"http://{METRICS_HOST}:{r.metrics.port}/metrics",
            health=RouterHealth(**r.health.model_dump()),
            state_dir=state_dir_of(fleet) or DEFAULT_STATE_DIR,
            api_key=f"read from {fleet.key_file} at serve time (never shown)" if fleet.key_file else None,
            argv=argv[:2] + ["<launcher>"] + argv[3:],
            # what nixosModules.tp4-router runs (its Python first): the launcher and the
            # arguments over every line; the key is read from the file, never here
            service=r.service,
            python=r.python,
            command=argv,
        ),
        warnings=list(fleet.warnings),
    )
    return doc.model_dump(mode="json", by_alias=True)


def plan_text(fleet: Fleet) -> list[str]:
    out = [f"fleet: {len(fleet.lines)} lines behind {fleet.router.kind} at {fleet.url} ({fleet.source})"]
    for line in fleet.lines:
        p = line.plan
        out.append(
            f"line {line.name}: {p.line.nnodes} nodes ({', '.join(n.name for n in p.nodes)}), TP {p.line.tp}, "
            f"api {p.line.api}, image {p.image.tag}, model {p.nodes[0].env.get('SERVED_MODEL_NAME')}, preset {p.preset}"
        )
    r = fleet.router
    where = "this machine" if r.host == "local" else r.host
    how = "tp4-router.service (nixosModules.tp4-router)" if r.service == "unit" else "a process in its own session"
    out.append(
        f"router: {r.kind} on {where} as {how}, policy {r.policy}, health {r.health.endpoint} every {r.health.interval} s "
        f"(timeout {r.health.timeout} s, out after {r.health.failure_threshold}, back after {r.health.success_threshold}), "
        f"metrics http://{METRICS_HOST}:{r.metrics.port}/metrics on its loopback"
    )
    if fleet.key_file:
        out.append(
            f"api key: read from {fleet.key_file} at serve time, given to the router in a file of mode 0600 (never shown)"
        )
    argv = router_argv(fleet, [line.api for line in fleet.lines])
    out.append("router argv: " + shlex.join(argv[:2]) + " <launcher> " + shlex.join(argv[3:]))
    return out


# --- the router on its host -----------------------------------------------------------------------


# the router as the NixOS module's unit (router.service = "unit"): systemctl and journalctl
ROUTER_UNIT = "tp4-router.service"


def unit_start_argv() -> list[str]:
    return ["systemctl", "start", "--", ROUTER_UNIT]


def unit_stop_argv() -> list[str]:
    return ["systemctl", "stop", "--", ROUTER_UNIT]


def unit_pid_argv() -> list[str]:
    return ["systemctl", "show", "--property=MainPID", "--value", "--", ROUTER_UNIT]


def unit_log_argv(lines: int) -> list[str]:
    return ["journalctl", "--unit", ROUTER_UNIT, "--lines", str(lines), "--no-pager", "--output", "cat"]


def privileged(fleet: Fleet, argv: list[str]) -> list[str]:
    """systemctl as a user other than root goes through ``sudo -n`` (as tp4 serve's for a rank)."""
    user = fleet.router.user
    return ["sudo", "-n", *argv] if user not in (None, "root") else argv


@dataclass
class RouterHost:
    fleet: Fleet
    remote: process.Remote | None
    _state_dir: str | None = field(default=None, init=False, repr=False)

    @property
    def state_dir(self) -> str:
        """The router's state directory on its host (the default resolved there, once)."""
        if self._state_dir is None:
            self._state_dir = state_dir_of(self.fleet) or self.run(
                ["sh", "-c", STATE_DIR_SH], purpose=f"the router's state directory on {self.where}"
            ).stdout.rstrip("\n")
        return self._state_dir

    @property
    def where(self) -> str:
        return "this machine" if self.remote is None else self.fleet.router.host

    def run(
        self, argv: Sequence[str], *, check: bool = True, input: str | None = None, purpose: str, timeout: float = 60
    ) -> process.CompletedProcess[str]:
        from tp4.core import process

        return process.run(list(argv), remote=self.remote, check=check, input=input, timeout=timeout, purpose=purpose)

    @property
    def unit(self) -> bool:
        return self.fleet.router.service == "unit"

    def pid(self) -> int | None:
        if self.unit:
            out = self.run(
                privileged(self.fleet, unit_pid_argv()), check=False, purpose=f"{ROUTER_UNIT}'s pid on {self.where}"
            ).stdout.strip()
            return int(out) if out.isdigit() and int(out) > 0 else None
        out = self.run(
            ["sh", "-c", _PID, "sh", self.state_dir], purpose=f"the router's pid on {self.where}"
        ).stdout.strip()
        return int(out) if out.isdigit() else None

    def start(self, urls: Sequence[str], key: Secret | None) -> str:
        d = self.state_dir
        if key is not None:  # the router's own key file, mode 0600, written from stdin
            write = ["sh", "-c", WRITE_PRIVATE, "sh", f"{d}/{KEY_FILE}"]
            self.run(
                privileged(self.fleet, write) if self.unit else write,  # the unit's directory is root's
                input=key.reveal(),
                purpose=f"writing the router's key file on {self.where}",
            )
        if self.unit:
            # the unit's command is the fleet plan's (every line): a line that did not come up is
            # one the router's health check keeps out
            self.run(privileged(self.fleet, unit_start_argv()), purpose=f"starting {ROUTER_UNIT} on {self.where}")
            return f"started {ROUTER_UNIT} (pid {self.pid() or '?'})"
        out = self.run(
            ["sh", "-c", _START, "sh", d, *router_argv(self.fleet, urls, d)],
            purpose=f"starting the router on {self.where}",
        )
        return out.stdout.strip()

    def stop(self) -> str | None:
        """Stop the router (TERM, KILL after the grace); a problem, or None when none runs."""
        if self.unit:
            proc = self.run(
                privileged(self.fleet, unit_stop_argv()),
                check=False,
                purpose=f"stopping {ROUTER_UNIT} on {self.where}",
                timeout=self.fleet.router.stop_grace + 60,
            )
            self.run(
                privileged(self.fleet, ["rm", "-f", "--", f"{self.state_dir}/{KEY_FILE}"]),
                check=False,
                purpose=f"removing the router's key file on {self.where}",
            )
            if proc.returncode != 0:
                return f"router on {self.where}: systemctl stop {ROUTER_UNIT}: {(proc.stdout + proc.stderr).strip() or f'exit code {proc.returncode}'}"
            return None
        proc = self.run(
            ["sh", "-c", _STOP, "sh", self.state_dir, str(self.fleet.router.stop_grace)],
            check=False,
            purpose=f"stopping the router on {self.where}",
            timeout=self.fleet.router.stop_grace + 60,
        )
        if proc.returncode != 0:
            return f"router on {self.where}: {(proc.stdout + proc.stderr).strip() or 'could not be stopped'}"
        return None

    def log_tail(self, lines: int = LOG_TAIL) -> list[str]:
        if self.unit:
            proc = self.run(
                privileged(self.fleet, unit_log_argv(lines)),
                check=False,
                purpose=f"{ROUTER_UNIT}'s journal on {self.where}",
            )
            return [_plain(line) for line in proc.stdout.splitlines() if line.strip()]
        proc = self.run(
            ["tail", "-n", str(lines), "--", f"{self.state_dir}/{LOG_FILE}"],
            check=False,
            purpose=f"the router's log on {self.where}",
        )
        return [_plain(line) for line in proc.stdout.splitlines() if line.strip()]

    def metrics(self) -> str | None:
        """The router's /metrics, read on its host's loopback (where it listens)."""
        script = (
            "import sys, urllib.request\n"
            "sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())\n"
        )
        url = f"http://{METRICS_HOST}:{self.fleet.router.metrics.port}/metrics"
        proc = self.run(
            [python_of(self.fleet), "-c", script, url], check=False, purpose=f"the router's metrics on {self.where}"
        )
        return proc.stdout if proc.returncode == 0 else None


# the router's per-worker counters (Prometheus text): smg's circuit-breaker outcomes (one per
# request a worker answered, whatever the outcome; sglang-router 0.3.2 and smg), and the older
# sglang-router's processed requests
_WORKER_COUNTER = re.compile(
    r"^(smg_worker_cb_outcomes_total|sgl_router_processed_requests_total)\{([^}]*)\}\s+([0-9.eE+]+)\s*$"
)
_WORKER_LABEL = re.compile(r'(?:^|,)worker="([^"]*)"')


def requests_per_line(metrics: str, lines: dict[str, str]) -> dict[str, int]:
    """Each line's requests so far as the router counts them: ``lines`` maps a line's API URL to
    its name; a worker the router does not list counts 0."""
    got = {name: 0 for name in lines.values()}
    by_url = {url.rstrip("/"): name for url, name in lines.items()}
    for raw in metrics.splitlines():
        m = _WORKER_COUNTER.match(raw.strip())
        if m is None:
            continue
        worker = _WORKER_LABEL.search(m[2])
        name = by_url.get(worker[1].rstrip("/")) if worker else None
        if name is not None:
            try:
                got[name] += int(float(m[3]))
            except (ValueError, OverflowError):
                continue
    return got


def _plain(line: str) -> str:
    """A log line without its terminal colours."""
    return re.sub(r"\x1b\[[0-9;]*m", "", line)


class WorkerHealth(NamedTuple):
    url: str
    healthy: bool


def workers(fleet: Fleet, key: Secret | None, timeout: float = 5.0) -> list[WorkerHealth] | None:
    """The router's workers and their health (GET /workers); None when the router does not answer."""
    from tp4.serving import api

    ep = api.Endpoint.of(fleet.url, "router", key)
    try:
        status, doc = api.get_json(ep, "/workers", timeout)
    except api.ApiError:
        return None
    listed = doc.get("workers") if status == 200 and isinstance(doc, dict) else None
    if not isinstance(listed, list):
        return None
    out = []
    for w in listed:
        if isinstance(w, dict) and isinstance(w.get("url"), str):
            out.append(WorkerHealth(str(w["url"]).rstrip("/"), w.get("is_healthy") is True))
    return out


# --- serve, stop, status --------------------------------------------------------------------------


@dataclass
class LineResult:
    line: Line
    ok: bool
    detail: str


@dataclass
class Served:
    url: str
    lines: list[LineResult] = field(default_factory=list)

    @property
    def up(self) -> list[Line]:
        return [r.line for r in self.lines if r.ok]

    @property
    def failed(self) -> list[LineResult]:
        return [r for r in self.lines if not r.ok]


def read_secrets(fleet: Fleet) -> dict[str, Secret]:
    from tp4.core import apikey

    if not fleet.key_file:
        return {}
    return {"API_KEY": apikey.read_key(os.path.expanduser(fleet.key_file))}


def line_nodes(line: Line, ssh_options: Sequence[str]) -> list[Node]:
    from tp4.hosts.nodes import nodes_of

    return nodes_of(line.plan, ssh_options=ssh_options)


def _prefixed(name: str, echo: Echo) -> Echo:
    return lambda text: echo(f"[{name}] {text}")


def serve(
    fleet: Fleet, opts: Options, out: Echo, progress: Echo, *, all_lines: bool = False, ssh_options: Sequence[str] = ()
) -> Served:
    """Every line in parallel, each verified by tp4.serving.serve (``opts`` with each line's own
    weights kind and shard count); then the router over the lines that
    came up, ready when it reports each of them healthy (module doc). Raises Tp4Error when no
    line came up, when the router does not get ready (then everything started is stopped), or
    with ``all_lines`` when any line failed (then every line stops)."""
    from tp4.core import process
    from tp4.serving import serve as serve_mod

    secrets = read_secrets(fleet)
    host = RouterHost(fleet, router_remote(fleet, ssh_options))
    running = host.pid()
    if running is not None:
        raise Tp4Error(
            f"the fleet's router already runs on {host.where} (pid {running}); fix: `tp4 fleet stop` first, or `tp4 fleet status`"
        )
    served = Served(fleet.url)
    started_router = False
    try:
        done: dict[str, LineResult] = {}  # as each line finishes: what a Ctrl-C meanwhile must stop

        def one(line: Line) -> None:
            nodes = line_nodes(line, ssh_options)
            profile = line.loaded.profile  # what doctor expects of this line's weights
            own = dataclasses.replace(
                opts, volume_kind="nfs" if profile.nfs.share else "local", expected_shards=profile.model.expected_shards
            )
            try:
                serve_mod.serve(
                    line.plan, nodes, secrets, own, _prefixed(line.name, out), _prefixed(line.name, progress)
                )
            except Tp4Error as exc:
                done[line.name] = LineResult(line, False, exc.message)
                return
            done[line.name] = LineResult(line, True, line.api)

        progress(f"serving {len(fleet.lines)} lines in parallel: {', '.join(line.name for line in fleet.lines)}")
        try:
            with ThreadPoolExecutor(max_workers=len(fleet.lines)) as pool:
                for future in [pool.submit(one, line) for line in fleet.lines]:
                    future.result()
        finally:
            served.lines = [done[line.name] for line in fleet.lines if line.name in done]
        for r in served.failed:
            progress(f"line {r.line.name} failed: {r.detail}")
        if not served.up:
            raise Tp4Error(
                "no line came up, so the router was not started:\n"
                + "\n".join(f"  line {r.line.name}: {r.detail}" for r in served.failed)
            )
        if served.failed and all_lines:
            raise Tp4Error(
                f"--all: {len(served.failed)} of {len(served.lines)} lines failed, so every line stops:\n"
                + "\n".join(f"  line {r.line.name}: {r.detail}" for r in served.failed)
            )
        urls = [line.api for line in served.up]
        progress(
            f"starting the router ({fleet.router.kind}) on {host.where} over {', '.join(line.name for line in served.up)}"
        )
        started_router = True
        progress(f"router: {host.start(urls, secrets.get('API_KEY'))}")
        _wait_router(fleet, host, urls, secrets.get("API_KEY"), progress)
    except BaseException:
        with process.cleanup():
            if started_router:
                problem = host.stop()
                if problem:
                    progress(f"warning: {problem}")
            up = [r.line for r in served.lines if r.ok]
            if up:
                progress(f"stopping the {len(up)} lines this serve started ...")
                for problem in _stop_lines(up, secrets, ssh_options, progress, by="tp4 fleet serve, which failed"):
                    progress(f"warning: {problem}")
        raise
    names = ", ".join(line.name for line in served.up)
    out(
        f"ready: {fleet.url} ({fleet.router.kind}, {fleet.router.policy}) over {len(served.up)} of {len(served.lines)} lines: {names}; "
        f"the router reports each healthy"
    )
    return served


def _wait_router(fleet: Fleet, host: RouterHost, urls: Sequence[str], key: Secret | None, progress: Echo) -> None:
    deadline = time.monotonic() + fleet.router.ready_timeout
    want = {u.rstrip("/") for u in urls}
    last: list[WorkerHealth] | None = None
    while time.monotonic() < deadline:
        if host.pid() is None:
            raise Tp4Error(
                f"the router on {host.where} exited before it was ready; its log:\n"
                + "\n".join(f"  | {line}" for line in host.log_tail())
            )
        last = workers(fleet, key)
        if last is not None and want <= {w.url for w in last if w.healthy}:
            progress(f"router: every line healthy ({len(want)})")
            return
        time.sleep(0.5)
    seen = (
        "no answer from its /workers"
        if last is None
        else ", ".join(f"{w.url} {'healthy' if w.healthy else 'unhealthy'}" for w in last) or "no workers"
    )
    raise Tp4Error(
        f"the router on {host.where} did not report every line healthy within {fleet.router.ready_timeout} s ({seen}); "
        "its log:\n" + "\n".join(f"  | {line}" for line in host.log_tail())
    )


def _stop_lines(
    lines: Sequence[Line], secrets: Mapping[str, Secret], ssh_options: Sequence[str], progress: Echo, *, by: str
) -> list[str]:
    """`tp4 stop` of each line, in parallel, recorded as a stop on purpose by ``by`` (a watchdog
    leaves the line stopped)."""
    from tp4.serving import serve as serve_mod

    def one(line: Line) -> list[str]:
        nodes = line_nodes(line, ssh_options)
        try:
            return [
                f"line {line.name}: {p}"
                for p in serve_mod.stop(
                    line.plan, nodes, secrets, lambda _: None, _prefixed(line.name, progress), by=by
                )
            ]
        except Tp4Error as exc:
            return [f"line {line.name}: {exc.message}"]

    problems: list[str] = []
    with ThreadPoolExecutor(max_workers=max(1, len(lines))) as pool:
        for got in pool.map(one, lines):
            problems += got
    return problems


def _router_as_run(fleet: Fleet, argv: Sequence[str], ssh_options: Sequence[str]) -> str:
    from tp4.core import process

    where = "router" if fleet.router.host == "local" else f"router {fleet.router.host}"
    return f"{where}: {shlex.join(process.full_argv(argv, router_remote(fleet, ssh_options)))}"


def _router_state_dir(fleet: Fleet) -> str:
    """The router's state directory as a dry run shows it: the fleet's, else the default its host
    resolves ($XDG_STATE_HOME/tp4/router)."""
    return state_dir_of(fleet) or DEFAULT_STATE_DIR


def rehearse_serve(fleet: Fleet, ssh_options: Sequence[str] = ()) -> list[str]:
    """`tp4 fleet serve --dry-run`: each line's commands (as `tp4 serve --dry-run` prints them,
    prefixed by the line), then the router's start over every line; nothing is run."""
    from tp4.serving import serve as serve_mod

    out = [
        f"line {line.name}: {cmd}"
        for line in fleet.lines
        for cmd in serve_mod.rehearse_serve(line.plan, line_nodes(line, ssh_options))
    ]
    if fleet.router.service == "unit":
        argv = privileged(fleet, unit_start_argv())
    else:
        d = _router_state_dir(fleet)
        argv = ["sh", "-c", _START, "sh", d, *router_argv(fleet, [line.api for line in fleet.lines], d)]
    return [*out, _router_as_run(fleet, argv, ssh_options)]


def rehearse_stop(fleet: Fleet, ssh_options: Sequence[str] = ()) -> list[str]:
    """`tp4 fleet stop --dry-run`: the router's stop, then each line's (as `tp4 stop --dry-run`)."""
    from tp4.serving import serve as serve_mod

    if fleet.router.service == "unit":
        argv = privileged(fleet, unit_stop_argv())
    else:
        argv = ["sh", "-c", _STOP, "sh", _router_state_dir(fleet), str(fleet.router.stop_grace)]
    return [
        _router_as_run(fleet, argv, ssh_options),
        *(
            f"line {line.name}: {cmd}"
            for line in fleet.lines
            for cmd in serve_mod.rehearse_stop(line_nodes(line, ssh_options))
        ),
    ]


def stop(fleet: Fleet, out: Echo, progress: Echo, *, ssh_options: Sequence[str] = ()) -> list[str]:
    """Stop the router, then every line (also what a crashed serve left); the problems (empty:
    nothing of the fleet runs)."""
    secrets = read_secrets(fleet)
    host = RouterHost(fleet, router_remote(fleet, ssh_options))
    problems: list[str] = []
    try:
        problem = host.stop()
    except Tp4Error as exc:
        problem = f"router on {host.where}: {exc.message}"
    if problem:
        problems.append(problem)
    problems += _stop_lines(fleet.lines, secrets, ssh_options, progress, by="tp4 fleet stop")
    if not problems:
        out(
            f"stopped: the router on {host.where} and {len(fleet.lines)} lines ({', '.join(line.name for line in fleet.lines)})"
        )
    return problems


def status(fleet: Fleet, *, ssh_options: Sequence[str] = (), probe_timeout: float = 10.0) -> dict[str, object]:
    """The router (its process, every line's health as it sees it) and every line (tp4 status)."""
    from tp4.serving import serve as serve_mod

    secrets = read_secrets(fleet)
    host = RouterHost(fleet, router_remote(fleet, ssh_options))
    try:
        pid: int | None = host.pid()
        error = None
    except Tp4Error as exc:
        pid, error = None, exc.message.splitlines()[0]
    seen = workers(fleet, secrets.get("API_KEY")) if pid is not None else None
    health = {w.url: w.healthy for w in seen or []}

    def one(line: Line) -> dict[str, object]:
        data = serve_mod.status(line.plan, line_nodes(line, ssh_options), secrets, probe_timeout=probe_timeout)
        in_router = line.api.rstrip("/") in health
        return {
            "name": line.name,
            "api": line.api,
            "in_router": in_router,
            "router_health": ("healthy" if health[line.api.rstrip("/")] else "unhealthy") if in_router else None,
            "status": data,
        }

    with ThreadPoolExecutor(max_workers=len(fleet.lines)) as pool:
        lines = list(pool.map(one, fleet.lines))
    router: dict[str, object] = {
        "kind": fleet.router.kind,
        "host": fleet.router.host,
        "url": fleet.url,
        "state": "running" if pid is not None else ("unreachable" if error else "stopped"),
        "pid": pid,
        "answers": seen is not None,
        "workers": [w._asdict() for w in seen or []],
    }
    if error:
        router["error"] = error
    return {"schema": schemas.FLEET_STATUS, "router": router, "lines": lines}


def healthy(data: dict[str, object]) -> bool:
    """Whether a status says the fleet serves on every line."""
    router = data.get("router")
    lines = data.get("lines")
    if not isinstance(router, dict) or router.get("state") != "running" or not isinstance(lines, list):
        return False
    return all(isinstance(line, dict) and line.get("router_health") == "healthy" for line in lines)


def dumps(data: object) -> str:
    return json.dumps(data, indent=2, sort_keys=True)
