"""The adapter registry (adapters/registry.toml): gate variables, their values, what they need
and the boot-log lines they print, and the in-image checks an image must pass before it is tagged
for the line. The one place gate knowledge lives; see the file's header."""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from tp4.errors import InvalidInput

DATA = Path(__file__).resolve().parent / "data"
REGISTRY_PATH = DATA / "registry.toml"


@dataclass(frozen=True)
class Gate:
    var: str
    adapter: str
    kind: str
    image: str
    values: tuple[str, ...] = ()
    pattern: str | None = None
    min: float | None = None
    max: float | None = None
    off: tuple[str, ...] = ()
    default: str | None = None
    forwarded: bool = False
    needs: tuple[str, ...] = ()
    launcher: str | None = None

    def is_on(self, value: str | None) -> bool:
        return value is not None and value.strip().lower() not in self.off

    def check(self, value: str) -> str | None:
        """None if value is allowed, else the reason it is not."""
        kind = self.kind
        if kind in ("int", "float") and not self.forwarded and value.strip().lower() in self.off:
            return None  # the launcher passes it only when set: an off value turns the gate off (§4)
        if kind == "switch":
            if value not in ("0", "1"):
                return "must be 0 or 1"
        elif kind in ("int", "float"):
            try:
                number = int(value) if kind == "int" else float(value)
            except ValueError:
                return f"must be {'an integer' if kind == 'int' else 'a number'}"
            if self.min is not None and number < self.min:
                return f"must be at least {self.min:g}"
            if self.max is not None and number > self.max:
                return f"must be at most {self.max:g}"
        elif kind == "enum":
            if value not in self.values:
                return "must be one of " + ", ".join(repr(v) for v in self.values)
        elif kind == "list":
            items = value.split(",")
            bad = [i for i in items if i not in self.values]
            if bad or not value:
                return "must be a comma-separated list of " + ", ".join(self.values)
        elif kind == "path":
            if not value.startswith("/"):
                return "must be an absolute path inside the container"
        if self.pattern and not re.fullmatch(self.pattern, value):
            return f"must match {self.pattern}"
        return None


@dataclass(frozen=True)
class BootLine:
    adapter: str
    line: str
    when: tuple[str, ...] = ()
    required: bool = True


@dataclass(frozen=True)
class Rule:
    field: str
    when: tuple[str, ...]
    needs: str
    reason: str
    fix: str
    level: str = "error"
    # A gate the preset sets that fails this rule takes this value instead (filled like `fix`),
    # and the plan notes it: a preset value that only restates another setting follows it.
    follow: str | None = None


@dataclass(frozen=True)
class Adapter:
    name: str
    summary: str
    image: str
    launcher: str | None
    gates: tuple[Gate, ...]
    prefixes: tuple[Gate, ...]
    rules: tuple[tuple[str, str], ...]
    boot: tuple[BootLine, ...]
    moe_align: int | None = None


# The runtime tree (adapters, boot.py, tests) in the image; an image check's `file` is relative to it.
RUNTIME_DIR = "/opt/dsv41"
CHECK_KEYS = ("name", "summary", "file", "args", "argv", "env", "workdir", "gpu", "timeout")
_CHECK_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class ImageCheck:
    """One in-image check (an `[[image_check]]` entry): a command run in a throwaway container of
    the candidate image before it is tagged for the line."""

    name: str
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()
    workdir: str | None = None
    gpu: bool = False
    timeout: int = 1800
    summary: str = ""


def _strings(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _image_check(raw: object, where: str, problems: list[str]) -> ImageCheck | None:
    if not isinstance(raw, dict):
        problems.append(f"{where}: must be a table, not {type(raw).__name__}")
        return None
    before = len(problems)
    name = raw.get("name")
    if not isinstance(name, str) or not _CHECK_NAME.match(name):
        problems.append(f"{where}: name must be letters, digits, '_', '.' or '-' (got {name!r})")
        name = "?"
    else:
        where = f"{where} ({name})"
    unknown = sorted(set(raw) - set(CHECK_KEYS))
    if unknown:
        problems.append(f"{where}: unknown key {', '.join(unknown)} (allowed: {', '.join(CHECK_KEYS)})")
    file, args, argv = raw.get("file"), raw.get("args"), raw.get("argv")
    if (file is None) == (argv is None):
        problems.append(f"{where}: give exactly one of file (a Python test under {RUNTIME_DIR}) or argv")
    if file is not None and (not isinstance(file, str) or not file or file.startswith("/")
                             or ".." in file.split("/")):
        problems.append(f"{where}: file must be a path relative to {RUNTIME_DIR} (got {file!r})")
    if args is not None and (not _strings(args) or argv is not None):
        problems.append(f"{where}: args must be a list of strings, given with file (argv holds its own)")
    if argv is not None and (not _strings(argv) or not argv or not argv[0]):
        problems.append(f"{where}: argv must be a non-empty list of strings (got {argv!r})")
    env = raw.get("env", {})
    if not isinstance(env, dict) or not all(isinstance(k, str) and _ENV_NAME.match(k) and isinstance(v, str)
                                            for k, v in env.items()):
        problems.append(f"{where}: env must be a table of NAME = \"string\" (got {env!r})")
        env = {}
    workdir = raw.get("workdir")
    if workdir is not None and (not isinstance(workdir, str) or not workdir.startswith("/")):
        problems.append(f"{where}: workdir must be an absolute path in the image (got {workdir!r})")
    gpu = raw.get("gpu", False)
    if not isinstance(gpu, bool):
        problems.append(f"{where}: gpu must be true or false (got {gpu!r})")
    timeout = raw.get("timeout", ImageCheck.timeout)
    if isinstance(timeout, bool) or not isinstance(timeout, int) or timeout < 1:
        problems.append(f"{where}: timeout must be a whole number of seconds >= 1 (got {timeout!r})")
    summary = raw.get("summary", "")
    if not isinstance(summary, str):
        problems.append(f"{where}: summary must be a string")
    if len(problems) > before:
        return None
    command = (["python3", f"{RUNTIME_DIR}/{file}", *(args or [])] if file is not None else list(argv))
    return ImageCheck(name=name, argv=tuple(command), env=tuple(sorted(env.items())), workdir=workdir,
                      gpu=gpu, timeout=timeout, summary=summary)


def parse_image_checks(raw: object, source: str) -> tuple[ImageCheck, ...]:
    """The `[[image_check]]` entries of the registry, or the same list as JSON in an image's
    `tp4.checks` label; strict: an unknown key or a wrong type is an error naming the entry."""
    if not isinstance(raw, list):
        raise InvalidInput(f"{source}: image_check must be a list of tables, not {type(raw).__name__}")
    problems: list[str] = []
    checks = [_image_check(item, f"image_check[{i}]", problems) for i, item in enumerate(raw)]
    names = [c.name for c in checks if c is not None]
    problems += [f"image_check {n!r} is listed twice" for n in sorted({n for n in names if names.count(n) > 1})]
    if problems:
        raise InvalidInput(f"{source}: bad image checks", problems)
    return tuple(c for c in checks if c is not None)


@dataclass(frozen=True)
class Registry:
    adapters: tuple[Adapter, ...]
    image_order: tuple[str, ...]
    off_values: tuple[str, ...]
    forbidden_lines: tuple[str, ...]
    gates: dict[str, Gate] = field(default_factory=dict)
    rules: tuple[Rule, ...] = ()
    moe: dict = field(default_factory=dict)
    image_checks: tuple[ImageCheck, ...] = ()

    def gate(self, var: str) -> Gate | None:
        found = self.gates.get(var)
        if found is not None:
            return found
        for adapter in self.adapters:
            for prefix in adapter.prefixes:
                if var.startswith(prefix.var) and var[len(prefix.var):].isdigit():
                    return prefix
        return None

    def image_rank(self, variant: str) -> int:
        return self.image_order.index(variant)

    def forwarded(self) -> list[Gate]:
        return [g for a in self.adapters for g in a.gates if g.forwarded]


def _gate(raw: dict, adapter: dict, off: tuple[str, ...]) -> Gate:
    return Gate(
        var=raw.get("var") or raw["prefix"],
        adapter=adapter["name"],
        kind=raw.get("kind", "text"),
        image=raw.get("image", adapter.get("image", "base")),
        values=tuple(raw.get("values", ())),
        pattern=raw.get("pattern"),
        min=raw.get("min"),
        max=raw.get("max"),
        off=tuple(raw.get("off", off)),
        default=raw.get("default"),
        forwarded=bool(raw.get("forwarded", False)),
        needs=tuple(raw.get("needs", ())),
        launcher=adapter.get("launcher"),
    )


def parse_registry(data: dict) -> Registry:
    off = tuple(data.get("off_values", ("", "0", "off", "false")))
    adapters = []
    gates: dict[str, Gate] = {}
    for raw in data.get("adapter", []):
        agates = tuple(_gate(g, raw, off) for g in raw.get("gates", []))
        for g in agates:
            if g.var in gates:
                raise InvalidInput(f"adapter registry: gate {g.var} is listed twice")
            gates[g.var] = g
        adapters.append(
            Adapter(
                name=raw["name"],
                summary=raw.get("summary", ""),
                image=raw.get("image", "base"),
                launcher=raw.get("launcher"),
                gates=agates,
                prefixes=tuple(_gate(g, raw, off) for g in raw.get("gate_prefixes", [])),
                rules=tuple((r["when"], r["needs"]) for r in raw.get("rules", [])),
                boot=tuple(
                    BootLine(raw["name"], b["line"], tuple(b.get("when", ())), b.get("required", True))
                    for b in raw.get("boot", [])
                ),
                moe_align=raw.get("moe_align"),
            )
        )
    return Registry(
        adapters=tuple(adapters),
        image_order=tuple(data.get("image_order", ("base", "canary", "canary-roce"))),
        off_values=off,
        forbidden_lines=tuple(data.get("forbidden_lines", ())),
        gates=gates,
        rules=tuple(Rule(r["field"], tuple(r.get("when", ())), r["needs"], r.get("reason", ""), r.get("fix", ""),
                         r.get("level", "error"), r.get("follow")) for r in data.get("rule", [])),
        moe=dict(data.get("moe", {})),
        image_checks=parse_image_checks(data.get("image_check", []), "adapter registry"),
    )


@lru_cache(maxsize=None)
def load_registry(path: str | None = None) -> Registry:
    p = Path(path) if path else REGISTRY_PATH
    try:
        with open(p, "rb") as fh:
            return parse_registry(tomllib.load(fh))
    except OSError as exc:
        raise InvalidInput(f"cannot read the adapter registry {p}: {exc.strerror}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise InvalidInput(f"adapter registry {p}: {exc}") from exc


# --- conditions over an environment ------------------------------------------------------------

_COND = re.compile(r"^(?P<var>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>>=|<=|!=|=|~)(?P<arg>.*))?$")


def condition_holds(cond: str, env: dict[str, str], registry: Registry) -> bool:
    """Evaluate one registry condition ("VAR", "!VAR", "VAR=v", "VAR!=v", "VAR~item", "VAR>=N",
    "VAR<=N"; `{OTHER}` in the argument is OTHER's value) against env. A gate missing from env
    counts with its registry default."""
    if cond.startswith("!"):
        return not condition_holds(cond[1:], env, registry)
    m = _COND.match(cond)
    if not m:
        raise InvalidInput(f"adapter registry: bad condition {cond!r}")
    var, op = m["var"], m["op"]
    arg = fill_line(m["arg"], env) if m["arg"] is not None else None
    gate = registry.gate(var)
    value = env.get(var, gate.default if gate is not None else None)
    if op is None:
        if gate is not None:
            return gate.is_on(value)
        return value is not None and value.strip().lower() not in registry.off_values
    if op == "!=":
        return value != arg
    if value is None:
        return False
    if op == "=":
        return value == arg
    if op == "~":
        items = value.split(",")
        return arg in items or "all" in items
    try:
        number, bound = float(value), float(arg)
    except ValueError:
        return False
    return number >= bound if op == ">=" else number <= bound


def describe_condition(cond: str) -> str:
    if cond.startswith("!"):
        return f"{cond[1:]} off"
    m = _COND.match(cond)
    if not m or m["op"] is None:
        return f"{cond} on"
    if m["op"] == "~":
        return f"{m['var']} containing {m['arg']}"
    return cond


_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)(\+1)?\}")


def fill_line(line: str, env: dict[str, str]) -> str:
    """Replace {VAR} and {VAR+1} with values from env (the rank-0 environment)."""

    def sub(m: re.Match) -> str:
        value = env.get(m[1], "")
        if m[2]:
            try:
                return str(int(value) + 1)
            except ValueError:
                return "..."
        return value

    return _PLACEHOLDER.sub(sub, line)


def line_pattern(text: str) -> str:
    """A boot line as written in the registry (`...` = anything) to a regular expression."""
    return ".*".join(re.escape(part) for part in text.split("..."))
