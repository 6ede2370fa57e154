"""What the `tp4` commands share: their common options and the one rule for which profile a
command uses.

The profile: `--profile FILE`, else `$TP4_PROFILE`, else `./profile.toml` when it exists, else
the embedded example. Every command that reads a profile takes :data:`profile_option` and loads
it through :func:`load_line` (or :func:`load_profile`); a test walks every command and holds them
to it. A command that acts on hosts or a line says on stderr which profile and plan it acts on,
``profile: PATH (plan DIGEST)``, before it acts (never on stdout, so `--json` output stays JSON).

CLI modules import shared names from here, never each other's private ones."""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

import click

from tp4.core.errors import InvalidInput, clip

if TYPE_CHECKING:
    from tp4.core.apikey import Secret
    from tp4.hosts.nodes import Node
    from tp4.line.plan import Plan
    from tp4.core.process import Remote
    from tp4.line.profile.load import Loaded

PROFILE_ENV = "TP4_PROFILE"
DEFAULT_PROFILE = "profile.toml"
EMBEDDED = "the embedded example profile"


class CommonOption(click.Option):
    """An option made here; ``common`` names which (the test of the commands checks it)."""

    def __init__(self, *args: Any, common: str, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.common = common


F = TypeVar("F", bound=Callable[..., Any])


def _option(common: str, *decls: str, **kwargs: Any) -> Callable[[F], F]:
    return click.option(*decls, cls=CommonOption, common=common, **kwargs)


profile_option = _option(
    "profile",
    "--profile",
    "-p",
    "profile_path",
    type=click.Path(dir_okay=False),
    default=None,
    metavar="FILE",
    help=f"The line's profile (default: ${PROFILE_ENV}, else ./{DEFAULT_PROFILE} when it exists, else the embedded example).",
)
ssh_option = _option(
    "ssh", "--ssh-option", "ssh_options", multiple=True, metavar="OPT", help="Extra `ssh -o` option; repeatable."
)
strict_option = _option(
    "strict", "--strict", is_flag=True, help="Treat the profile's warnings (performance caveats) as errors (exit 2)."
)
dry_run_option = _option("dry-run", "--dry-run", is_flag=True, help="Print the exact commands, run nothing.")
sysfs_option = _option(
    "sysfs",
    "--sysfs",
    default="/sys",
    show_default=True,
    hidden=True,
    help="The sysfs root doctor's checks read on every node.",
)


def flake_option(what: str) -> Callable[[F], F]:
    """--flake DIR: `what` says what the command reads from the flake."""
    return _option(
        "flake",
        "--flake",
        "flake_dir",
        type=click.Path(file_okay=False, path_type=Path),
        default=None,
        help=f"Directory of the flake {what} (default: the nearest flake.nix above the current directory, "
        "or $TP4_FLAKE).",
    )


def boot_timeout_option(whose: str) -> Callable[[F], F]:
    """--timeout [PHASE=]SECONDS, repeatable (read by :func:`timeouts`): `whose` says which boot."""
    from tp4.core.bootphases import BOOT_TIMEOUTS

    return _option(
        "timeout",
        "--timeout",
        "timeouts",
        multiple=True,
        metavar="[PHASE=]SECONDS",
        help=f"Bound a boot phase {whose}({', '.join(BOOT_TIMEOUTS)}), or all; repeatable.",
    )


# --- numbers: read as written, in ASCII, finite and bounded ------------------------------------------

# Python's int() and float() (and click's INT, FLOAT, IntRange and FloatRange, built on them) accept
# "٣", " 3", "+3", "3_000" and "nan" (a NaN passes every range check): an option's number is one of
# these forms and nothing else.
_WHOLE = re.compile(r"-?(?:0|[1-9][0-9]*)", re.ASCII)
_DECIMAL = re.compile(r"-?(?:[0-9]{1,18}(?:\.[0-9]{0,18})?|\.[0-9]{1,18})(?:[eE][-+]?[0-9]{1,3})?", re.ASCII)


def _shown_number(x: float) -> str:
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e15 else f"{x:g}"


def _bound_words(low: float, high: float, low_open: bool) -> str:
    return f"{'above' if low_open else 'from'} {_shown_number(low)} {'up ' if low_open else ''}to {_shown_number(high)}"


def parse_number(text: str, low: float, high: float, *, integer: bool = False, low_open: bool = False) -> float:
    """``text`` as a number in [low, high] (``low_open``: above low); ValueError saying what it
    must be otherwise. Whole numbers: ASCII digits, a leading '-' only, no leading zeros, no -0;
    other numbers: ASCII decimals with an optional exponent, finite."""
    words = f"{'a whole number' if integer else 'a number'} {_bound_words(low, high, low_open)}"
    if integer:
        if not _WHOLE.fullmatch(text) or text == "-0":
            raise ValueError(f"{clip(text)} is not {words} (ASCII digits: no sign but -, no spaces, no leading zeros)")
        if len(text) > 19:  # beyond 64 bits: out of any bound, and never converted (4,300 digits raise)
            raise ValueError(f"{clip(text, 20)} is out of range: expected {words}")
        number: float = int(text)
    else:
        if not _DECIMAL.fullmatch(text):
            raise ValueError(f"{clip(text)} is not {words} (written like 1, 0.5 or 2e3)")
        number = float(text)
    if not math.isfinite(number) or number < low or number > high or (low_open and number == low):
        raise ValueError(f"{text} is out of range: expected {words}")
    return number


class Number(click.ParamType[Any]):
    """The one click type of a numeric option: a finite number, or a whole number, within bounds,
    written in ASCII digits (:func:`parse_number`). A refused value names the option (click's
    "Invalid value for '--port'") and what to pass; exit 2."""

    def __init__(self, low: float, high: float, *, integer: bool = False, low_open: bool = False) -> None:
        self.low, self.high, self.integer, self.low_open = low, high, integer, low_open
        self.name = "integer" if integer else "number"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, bool):
            self.fail(f"{value!r} is not a number", param, ctx)
        text = repr(value) if isinstance(value, float) else str(value)
        try:
            number = parse_number(text, self.low, self.high, integer=self.integer, low_open=self.low_open)
        except ValueError as exc:
            self.fail(f"{exc}; fix: pass {self.words()}", param, ctx)
        return int(number) if self.integer else number

    def words(self) -> str:
        return f"{'a whole number' if self.integer else 'a number'} {_bound_words(self.low, self.high, self.low_open)}"


def Int(low: int, high: int) -> Number:  # noqa: N802 (reads as a type)
    return Number(low, high, integer=True)


def Float(low: float, high: float, *, low_open: bool = False) -> Number:  # noqa: N802
    return Number(low, high, low_open=low_open)


# a TCP port: what every --port takes (ssh's, the API's, a registry's)
PORT = Int(1, 65535)


def json_option(help: str) -> Callable[[F], F]:
    """`--json` as a flag (the command prints one JSON document on stdout instead of its text)."""
    return _option("json", "--json", "as_json", is_flag=True, help=help)


def sysfs_root(value: str) -> str:
    if not value.startswith("/") or any(c in value for c in "\n\r\0"):
        raise InvalidInput(f"--sysfs {value[:80]!r}: expected an absolute path")
    return value


def out(line: str) -> None:
    click.echo(line)


def err(line: str) -> None:
    click.echo(line, err=True)


# --- which profile ----------------------------------------------------------------------------------


class Choice(NamedTuple):
    """The profile a command uses: its file (None: the embedded example) and why it is that one."""

    path: str | None
    origin: str  # "--profile", "$TP4_PROFILE", "./profile.toml", "embedded"

    def shown(self) -> str:
        return EMBEDDED if self.path is None else self.path


def resolve_profile(profile_path: str | None) -> Choice:
    """The one rule: --profile, else $TP4_PROFILE, else ./profile.toml when it exists, else the
    embedded example. A $TP4_PROFILE naming no file is refused (it is never skipped silently)."""
    if profile_path is not None:
        return Choice(profile_path, "--profile")
    env = os.environ.get(PROFILE_ENV, "")
    if env:
        if not Path(env).is_file():
            what = "is a directory" if Path(env).is_dir() else "does not exist"
            raise InvalidInput(
                f"{PROFILE_ENV}={env}: {what}; fix: point {PROFILE_ENV} at a profile file, "
                f"or unset it to use ./{DEFAULT_PROFILE} (or the embedded example)"
            )
        return Choice(env, f"${PROFILE_ENV}")
    if Path(DEFAULT_PROFILE).is_file():
        return Choice(DEFAULT_PROFILE, f"./{DEFAULT_PROFILE}")
    return Choice(None, "embedded")


def load_profile(profile_path: str | None, strict: bool = False) -> Loaded:
    """The profile the rule chooses, loaded; its warnings go to stderr as `warning: ...`, or with
    ``strict`` fail the command."""
    return _load(resolve_profile(profile_path), strict)


def _load(choice: Choice, strict: bool) -> Loaded:
    from tp4.line.profile import load_default, load_file
    from tp4.line.profile import load as load_mod

    if choice.path is None:
        loaded = load_default()
    else:
        fix = {
            "--profile": "pass an existing file, or omit --profile",
            f"${PROFILE_ENV}": f"point {PROFILE_ENV} at an existing file, or unset it",
        }.get(choice.origin, "pass --profile FILE")
        loaded = load_file(choice.path, fix)
    if strict:
        load_mod.strict(loaded)
    for w in loaded.warnings:
        click.echo(f"warning: {w}", err=True)
    return loaded


class Line(NamedTuple):
    """A profile the rule chose, loaded, and its plan."""

    choice: Choice
    loaded: Loaded
    plan: Plan

    def announce(self) -> None:
        """`profile: PATH (plan DIGEST)` on stderr: what a command that acts is about to act on."""
        click.echo(f"profile: {self.choice.shown()} (plan {self.plan.digest})", err=True)


def load_line(profile_path: str | None, strict: bool = False, *, announce: bool = True) -> Line:
    """The profile the rule chooses and its plan; ``announce``: say which on stderr (every command
    that acts on hosts or a line does, before it acts)."""
    from tp4.line.plan import build_plan

    choice = resolve_profile(profile_path)
    loaded = _load(choice, strict)
    line = Line(choice, loaded, build_plan(loaded))
    if announce:
        line.announce()
    return line


def read_secrets(plan: Plan) -> dict[str, Secret]:
    """The secrets the plan references (the API key, from its file): only what serving needs. The
    key stays a Secret up to the env file serve writes (tp4.serving.serve.env_file_text)."""
    secrets: dict[str, Secret] = {}
    if "API_KEY" in plan.secrets:
        from tp4.core import apikey

        secrets["API_KEY"] = apikey.read_key(os.path.expanduser(plan.secrets["API_KEY"].file))
    return secrets


class Served(NamedTuple):
    """A line as the serving commands use it: the profile, its plan, its nodes and its secrets."""

    line: Line
    nodes: list[Node]
    secrets: dict[str, Secret]

    @property
    def plan(self) -> Plan:
        return self.line.plan


def load_served(profile_path: str | None, strict: bool, ssh_options: tuple[str, ...]) -> Served:
    """The line of the profile with its nodes and secrets (announced on stderr)."""
    from tp4.hosts.nodes import nodes_of

    line = load_line(profile_path, strict)
    return Served(line, nodes_of(line.plan, ssh_options=ssh_options), read_secrets(line.plan))


def profile_remotes(
    hosts: tuple[str, ...],
    profile_path: str | None,
    user: str | None,
    identity: str | None,
    port: int | None,
    ssh_options: tuple[str, ...],
    strict: bool = False,
    *,
    head: bool = False,
) -> list[Remote]:
    """The workers: the --worker hosts, else the workers (ranks 1..) of the profile's plan; with
    ``head``, the plan's head (rank 0) too."""
    from tp4.core.process import Remote

    # a list is split at commas and spaces only: any other blank (a newline, a tab) is part of a
    # name, which check_host refuses, never a separator that turns one value into two hosts
    names = [h for item in hosts for h in item.replace(",", " ").split(" ") if h]
    if not names and any(item.strip(", ") == "" for item in hosts):
        raise InvalidInput(
            "--worker: the host is empty; fix: pass a worker's ssh name or address, or leave --worker out"
        )
    if names:
        from tp4.core.knownhosts import check_host

        for name in names:  # refused before any node is asked, as the profile's hosts are
            check_host(name, "--worker")
    if names:
        return [Remote(host=h, user=user, identity=identity, port=port, options=ssh_options) for h in names]
    plan = load_line(profile_path, strict).plan
    nodes = [
        Remote(
            host=n.ssh.host,
            user=user or n.ssh.user,
            identity=identity or n.ssh.identity,
            port=port or n.ssh.port,
            options=ssh_options,
        )
        for n in plan.nodes
        if n.rank > 0 or head
    ]
    if not nodes:
        raise InvalidInput("the profile has no workers: add [[cluster.workers]], or pass --worker HOST")
    return nodes


# --- shared by the serving commands (serve, fleet) ---------------------------------------------------


def timeouts(items: tuple[str, ...]) -> dict[str, float]:
    """--timeout [PHASE=]SECONDS, repeatable, over serve's default boot-phase bounds."""
    from tp4.serving import serve

    result = dict(serve.DEFAULT_TIMEOUTS)
    for item in items:
        phase, sep, value = item.partition("=")
        if not sep:
            phase, value = "", item
        try:
            if sep and not phase:
                raise ValueError("the phase before '=' is empty")
            seconds = parse_number(value, 0, 7 * 86400, low_open=True)
        except ValueError as exc:
            raise InvalidInput(
                f"--timeout {clip(item)}: {exc}; fix: pass PHASE=SECONDS or SECONDS, seconds between 0 and 604800 "
                f"(phases: {', '.join(result)})"
            ) from None
        if not phase:
            result = {k: seconds for k in result}
        elif phase in result:
            result[phase] = seconds
        else:
            raise InvalidInput(f"--timeout {clip(item)}: unknown phase {clip(phase)}; fix: one of {', '.join(result)}")
    return result


def render_status(data: dict[str, object]) -> list[str]:
    """`tp4 status`'s text: a line per node, the line's liveness, the boot, the running plan."""
    lines = []
    nodes = data.get("nodes")
    for n in nodes if isinstance(nodes, list) else []:
        if not isinstance(n, dict):
            continue
        age = n.get("last_log_age_s")
        extra = f"  last log line {age:.0f} s ago" if isinstance(age, (int, float)) else ""
        image = str(n.get("image") or "")[:12]
        plan = n.get("plan")
        lines.append(
            f"{n.get('node')} (rank {n.get('rank')}): {n.get('state')}"
            + (f" since {n.get('started')}" if n.get("started") else "")
            + (f"  image {image}" if image else "")
            + (f"  plan {plan}" if plan else "")
            + extra
            + (f"  {n.get('error')}" if n.get("error") else "")
        )
    live = data.get("liveness")
    if isinstance(live, dict):
        load = "" if live.get("running") is None else f" (running {live.get('running')}, waiting {live.get('waiting')})"
        lines.append(f"line {data.get('api')}: {live.get('state')}{load}: {live.get('detail')}")
    if data.get("state"):
        lines.append(f"state: {data.get('state')}: {data.get('state_detail')}")
    boot = data.get("boot")
    if isinstance(boot, dict):
        sig = boot.get("signature") if isinstance(boot.get("signature"), dict) else {}
        assert isinstance(sig, dict)
        lines.append(
            f"boot: ready after {boot.get('ready_seconds')} s, warm-up {sig.get('warmup_tps_median')} token/s, "
            f"KV pool {sig.get('kv_pool')}, pin {sig.get('pin')}" + ("" if boot.get("ok") else " (slow)")
        )
        warnings = boot.get("warnings")
        for w in warnings if isinstance(warnings, list) else []:
            lines.append(f"  warning: {w}")
    plan = data.get("plan")
    if isinstance(plan, dict) and plan.get("summary"):
        lines.append(f"plan: {plan.get('summary')}")
        fields = plan.get("fields")
        for f in fields if isinstance(fields, list) else []:
            lines.append(f"  {f}")
    return lines
