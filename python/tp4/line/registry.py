"""The adapter registry (adapters/registry.toml): gate variables, their values, the rules between
them ("X needs Y") and the boot-log lines they print, and the in-image checks an image must pass
before it is tagged for the line. The one place gate knowledge lives; see the file's header.

The file is parsed into frozen, strict pydantic models (`extra="forbid"`, Literal kinds), then
cross-checked (duplicate gates, condition syntax, every variable a condition or a `{VAR}` names):
a misspelt key, a wrong type or an unknown kind is an error naming the adapter and the entry,
worded here, never pydantic's wording."""

import math
import re
import tomllib
import typing
from collections.abc import Iterable, Iterator, Mapping
from functools import cached_property, lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from tp4.line.container import IMAGE
from tp4.core.errors import InvalidInput

if TYPE_CHECKING:
    from pydantic_core import ErrorDetails

DATA = Path(__file__).resolve().parents[1] / "data"
REGISTRY_PATH = DATA / "registry.toml"
SCHEMA = 2

_T = TypeVar("_T")
# TOML arrays arrive as lists; the models hold tuples (frozen, hashable). Only the container is
# lax: the items stay strict.
Seq = Annotated[tuple[_T, ...], Field(strict=False)]
# defer_build: a model builds its validator when it first validates. Only Registry validates (the
# others are parts of its schema), so the parts' own validators are never built.
_MODEL = ConfigDict(extra="forbid", frozen=True, strict=True, defer_build=True)

Kind = Literal["switch", "int", "float", "enum", "list", "text", "path"]
Level = Literal["error", "warning"]
# A family of gates (DSV41_AB_V0, DSV41_AB_V1, ...) is one gate whose var ends in this.
FAMILY = "<n>"
_VAR = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:<n>)?")
_COND = re.compile(r"^(?P<var>[A-Za-z_][A-Za-z0-9_]*(?:<n>)?)(?:(?P<op>>=|<=|!=|=|~)(?P<arg>.*))?$")
# Gate numbers: ASCII only (re.ASCII: \d would match any Unicode digit), no sign but a leading
# '-', no '_', no spaces, no leading zeros (bash arithmetic reads 010 as octal), 18 digits at most
# (an int64 the engine reads with int() or atoi()).
GATE_INT_DIGITS = 18
GATE_FLOAT_CHARS = 32
_GATE_INT = re.compile(r"-?(?:0|[1-9][0-9]*)", re.ASCII)
_GATE_FLOAT = re.compile(r"-?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?", re.ASCII)
_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)(\+1)?\}")
# Keys the parser fills from an entry's adapter: never keys of the file (an entry that writes
# `adapter = ...` gets "unknown key").
# the keys under which an entry gets its adapter's name and launcher (the Field aliases below
# spell them out: the pydantic mypy plugin needs literal aliases)
_ADAPTER, _LAUNCHER = "(adapter)", "(launcher)"
_CONDITION_FORMS = "VAR, !VAR, VAR=value, VAR!=value, VAR~item, VAR>=N or VAR<=N"


class Gate(BaseModel):
    """One gate variable. `adapter` and `launcher` are its adapter's, and `image` and `off`
    default to the adapter's and the registry's (a gate entry never sets the first two)."""

    model_config = _MODEL
    var: str
    adapter: str = Field(alias="(adapter)")
    kind: Kind = "text"
    image: str
    values: Seq[str] = ()
    pattern: str | None = None
    # the pattern in words, with an example: what a refused value is told (never the regex alone)
    form: str | None = None
    min: float | None = None
    max: float | None = None
    off: Seq[str]
    default: str | None = None
    forwarded: bool = False
    launcher: Literal["tp4"] | None = Field(default=None, alias="(launcher)")

    @model_validator(mode="after")
    def _consistent(self) -> "Gate":
        problem = self._problem()
        if problem:
            raise ValueError(problem)
        return self

    def _problem(self) -> str | None:
        if not _VAR.fullmatch(self.var):
            return f"var {self.var!r} is not an environment variable name; fix: use letters, digits and '_' (a family ends in {FAMILY})"
        if self.kind in ("enum", "list") and not self.values:
            return f"a {self.kind} gate needs values; fix: list the allowed values"
        if self.values and self.kind not in ("enum", "list"):
            return f"values are only for enum and list gates (kind is {self.kind}); fix: remove values or change kind"
        if (self.min is not None or self.max is not None) and self.kind not in ("int", "float"):
            return (
                f"min and max are only for int and float gates (kind is {self.kind}); fix: remove them or change kind"
            )
        if self.min is not None and self.max is not None and self.min > self.max:
            return f"min {self.min:g} is above max {self.max:g}; fix: swap them"
        if self.pattern is not None:
            try:
                re.compile(self.pattern)
            except re.error as exc:
                return f"pattern {self.pattern!r} is not a regular expression ({exc}); fix: correct it"
        if (self.pattern is None) != (self.form is None):
            return "pattern and form go together; fix: give form, the allowed values in words with an example, beside pattern"
        if self.family and (self.forwarded or self.default is not None):
            return f"a family ({self.var}) is never forwarded and has no default; fix: remove forwarded and default"
        if self.forwarded and self.default is None:
            return "a forwarded gate needs the default the launcher passes; fix: add default, or remove forwarded"
        if self.default is not None and (reason := self.check(self.default)):
            return f"default {self.default!r} {reason}; fix: give an allowed default"
        return None

    @property
    def family(self) -> bool:
        return self.var.endswith(FAMILY)

    @property
    def prefix(self) -> str:
        """A family's name without `<n>` (DSV41_AB_V for DSV41_AB_V<n>)."""
        return self.var.removesuffix(FAMILY)

    def member(self, key: str) -> bool:
        """key is this gate, or a member of this family (the prefix and a number)."""
        if not self.family:
            return key == self.var
        return key.startswith(self.prefix) and key[len(self.prefix) :].isdigit()

    def is_on(self, value: str | None) -> bool:
        return value is not None and value.strip().lower() not in self.off

    def _number(self, value: str) -> int | float | None:
        """value parsed as the launcher and the engine read it (int() / float() of the text, and
        bash arithmetic for some): only plain ASCII forms, finite, of bounded length; else None.
        Python's int() and float() alone accept "٣", " 3", "+3", "3_000", "nan", "inf" and 1e400."""
        if self.kind == "int":
            if not _GATE_INT.fullmatch(value) or value == "-0" or len(value.lstrip("-")) > GATE_INT_DIGITS:
                return None
            # a '-' passes here only for min's check to refuse it (must be at least N) where negatives are not allowed
            return int(value)
        if len(value) > GATE_FLOAT_CHARS or not _GATE_FLOAT.fullmatch(value):
            return None
        number = float(value)
        if not math.isfinite(number):
            return None
        return number

    def check(self, value: str) -> str | None:
        """None if value is allowed, else the reason it is not."""
        kind = self.kind
        if kind in ("int", "float") and not self.forwarded and value == value.strip() and value.lower() in self.off:
            return None  # the launcher passes it only when set: an off value turns the gate off (upstream `start.sh`)
        if kind == "switch":
            if value not in ("0", "1"):
                return "must be 0 or 1"
        elif kind in ("int", "float"):
            number = self._number(value)
            if number is None:
                if kind == "int":
                    return (
                        f"must be a whole number in ASCII digits (no '+', spaces, '_', leading zeros or -0),"
                        f" at most {GATE_INT_DIGITS} digits"
                    )
                return "must be a finite number written in ASCII (digits, one '.', an optional exponent: 0.5, 1e-3)"
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
            return f"must be {self.form}"
        return None


class Rule(BaseModel):
    """X needs Y, the registry's one form of a dependency: while every condition of `when`
    holds, `needs` must hold. A failure is reported on `field` (default: gates.<the first
    condition's variable>) with `reason` and `fix` (generated when not given; `{VAR}` is that
    variable's value), as an error or, with level = "warning", a warning (a warning rule on a gate says when
    the gate stops acting: a preset's gate that fails it is dropped from the plan with a note). `follow`: a value the
    preset sets for that gate that fails the rule is replaced by this one (the plan notes it)."""

    model_config = _MODEL
    adapter: str = Field(alias="(adapter)")
    when: Annotated[tuple[str, ...], Field(strict=False, min_length=1)]
    needs: str
    field: str
    reason: str
    fix: str
    level: Level = "error"
    follow: str | None = None

    @property
    def dependent(self) -> str | None:
        """The gate this rule is a plain dependency of ("K needs ...": `when` is just K on, and a
        failure is K's): a preset gate whose needed gate is turned off is dropped from the plan."""
        key = self.field.removeprefix("gates.")
        return key if self.field != key and self.when == (key,) else None

    def fails(self, env: Mapping[str, str], registry: "Registry") -> bool:
        return all(condition_holds(c, env, registry) for c in self.when) and not condition_holds(
            self.needs, env, registry
        )

    @property
    def family_var(self) -> str | None:
        """The family (DSV41_AB_V<n>) the rule's `when` names, if any."""
        return next((v for v in (_cond_var(c) for c in self.when) if v.endswith(FAMILY)), None)

    def for_member(self, key: str) -> "Rule":
        """A family's rule for one member: DSV41_AB_V<n> replaced by key (DSV41_AB_V1)."""
        var = self.family_var
        assert var is not None

        def sub(text: str) -> str:
            return text.replace(var, key)

        return self.model_copy(
            update={
                "when": tuple(sub(c) for c in self.when),
                "needs": sub(self.needs),
                "field": sub(self.field),
                "reason": sub(self.reason),
                "fix": sub(self.fix),
                "follow": None if self.follow is None else sub(self.follow),
            }
        )


class BootLine(BaseModel):
    model_config = _MODEL
    adapter: str = Field(alias="(adapter)")
    line: str
    when: Seq[str] = ()
    required: bool = True


class Adapter(BaseModel):
    model_config = _MODEL
    name: str
    summary: str = ""
    image: str = "base"
    launcher: Literal["tp4"] | None = None
    moe_align: Annotated[int, Field(gt=0)] | None = None
    gates: Seq[Gate] = ()
    rules: Seq[Rule] = ()
    boot: Seq[BootLine] = ()

    @property
    def prefixes(self) -> tuple[Gate, ...]:
        """The adapter's gate families (DSV41_AB_V<n>)."""
        return tuple(g for g in self.gates if g.family)


class Moe(BaseModel):
    """The routed MoE: every rank holds experts x (expert_width * EP / TP); the default runner
    needs that per-rank width to be a multiple of `align`."""

    model_config = _MODEL
    experts: Annotated[int, Field(gt=0)]
    expert_width: Annotated[int, Field(gt=0)]
    align: Annotated[int, Field(gt=0)]
    runner: str


# The runtime tree (adapters, boot.py, tests) in the image; an image check's `file` is relative to it.
RUNTIME_DIR = IMAGE.runtime  # tp4/data/container.toml
CHECK_KEYS = ("name", "summary", "file", "args", "argv", "env", "workdir", "gpu", "timeout", "images")
_CHECK_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class ImageCheck(BaseModel):
    """One in-image check (an `[[image_check]]` entry): a command run in a throwaway container of
    the candidate image before it is tagged for the line. Built by parse_image_checks, which
    words its own errors (the same list comes as JSON from an image's label)."""

    model_config = _MODEL
    name: str
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()
    workdir: str | None = None
    gpu: bool = False
    timeout: int = 1800
    summary: str = ""
    # the variants whose image carries the check (pkgs/image.nix); None: every image
    images: tuple[str, ...] | None = None


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
    if file is not None and (not isinstance(file, str) or not file or file.startswith("/") or ".." in file.split("/")):
        problems.append(f"{where}: file must be a path relative to {RUNTIME_DIR} (got {file!r})")
    if args is not None and (not _strings(args) or argv is not None):
        problems.append(f"{where}: args must be a list of strings, given with file (argv holds its own)")
    if argv is not None and (not _strings(argv) or not argv or not argv[0]):
        problems.append(f"{where}: argv must be a non-empty list of strings (got {argv!r})")
    env = raw.get("env", {})
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and _ENV_NAME.match(k) and isinstance(v, str) for k, v in env.items()
    ):
        problems.append(f'{where}: env must be a table of NAME = "string" (got {env!r})')
        env = {}
    workdir = raw.get("workdir")
    if workdir is not None and (not isinstance(workdir, str) or not workdir.startswith("/")):
        problems.append(f"{where}: workdir must be an absolute path in the image (got {workdir!r})")
    gpu = raw.get("gpu", False)
    if not isinstance(gpu, bool):
        problems.append(f"{where}: gpu must be true or false (got {gpu!r})")
    timeout = raw.get("timeout", 1800)
    if isinstance(timeout, bool) or not isinstance(timeout, int) or timeout < 1:
        problems.append(f"{where}: timeout must be a whole number of seconds >= 1 (got {timeout!r})")
    summary = raw.get("summary", "")
    if not isinstance(summary, str):
        problems.append(f"{where}: summary must be a string")
    images = raw.get("images")
    if images is not None and (not _strings(images) or not images):
        problems.append(f"{where}: images must be a non-empty list of image variants (got {images!r})")
    if len(problems) > before:
        return None
    command = ["python3", f"{RUNTIME_DIR}/{file}", *(args or [])] if file is not None else list(argv or ())
    # checked above, field by field: built without validating again
    return ImageCheck.model_construct(
        name=name,
        argv=tuple(command),
        env=tuple(sorted(env.items())),
        workdir=workdir,
        gpu=gpu,
        timeout=timeout,
        summary=summary,
        images=None if images is None else tuple(images),
    )


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


class ImageBuild(BaseModel):
    """The image the flake builds for one variant (`[images.<variant>]`): pkgs/default.nix builds
    it as packages.<system>.<attr> and tags it `ref` for the line; a preset's plan names `ref`."""

    model_config = _MODEL
    attr: Annotated[str, Field(pattern=r"^[a-z][a-z0-9-]*$")]
    ref: Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9._/-]*:[A-Za-z0-9._-]+$")]


class Registry(BaseModel):
    model_config = _MODEL
    schema_version: Literal[2] = Field(alias="schema")
    off_values: Seq[str] = ("", "0", "off", "false")
    image_order: Seq[str] = ("base", "canary", "canary-roce")
    # one image the flake builds per variant of image_order
    images: dict[str, ImageBuild] = Field(default_factory=dict)
    forbidden_lines: Seq[str] = ()
    # The variables besides gates that conditions and `{VAR}` may name: env keys tp4 renders from
    # typed profile fields, and line facts the validator adds (RING_ROCE_CAP).
    facts: Seq[str] = ()
    moe: Moe
    adapters: Seq[Adapter] = Field(alias="adapter")
    image_checks: tuple[ImageCheck, ...] = Field(default=(), alias="image_check")

    @cached_property
    def gates(self) -> dict[str, Gate]:
        """Every gate by var (a family under its var, DSV41_AB_V<n>)."""
        return {g.var: g for a in self.adapters for g in a.gates}

    @cached_property
    def families(self) -> tuple[Gate, ...]:
        return tuple(g for a in self.adapters for g in a.gates if g.family)

    @cached_property
    def rules(self) -> tuple[Rule, ...]:
        return tuple(r for a in self.adapters for r in a.rules)

    def gate(self, var: str) -> Gate | None:
        found = self.gates.get(var)
        if found is not None:
            return found if not found.family else None
        return next((f for f in self.families if f.member(var)), None)

    def image_rank(self, variant: str) -> int:
        return self.image_order.index(variant)

    def forwarded(self) -> list[Gate]:
        return [g for a in self.adapters for g in a.gates if g.forwarded]

    def rules_for(self, keys: Iterable[str]) -> Iterator[Rule]:
        """Every rule, a family's once per member among keys (the gates set)."""
        keys = list(keys)
        for rule in self.rules:
            var = rule.family_var
            if var is None:
                yield rule
                continue
            family = self.gates[var]
            yield from (rule.for_member(k) for k in sorted(keys) if family.member(k))

    @cached_property
    def dependencies(self) -> dict[str, tuple[str, ...]]:
        """Gate var -> what it needs whenever it is on (the rules it is the plain dependent of)."""
        out: dict[str, tuple[str, ...]] = {}
        for rule in self.rules:
            if rule.dependent is not None:
                out[rule.dependent] = (*out.get(rule.dependent, ()), rule.needs)
        return out

    def needs_of(self, key: str) -> tuple[str, ...]:
        """What gate key (a family's member: DSV41_AB_V1) needs whenever it is on."""
        gate = self.gate(key)
        if gate is None:
            return ()
        return tuple(n.replace(gate.var, key) for n in self.dependencies.get(gate.var, ()))

    def hint(self, key: str) -> str:
        """The fix for a [gates] key that is no gate."""
        import difflib

        for family in self.families:
            if (
                key.startswith(family.prefix)
                and not key[len(family.prefix) :].isdigit()
                and difflib.SequenceMatcher(None, key, family.var).ratio() > 0.8
            ):
                return f"{family.var} is a family: write the number for n, e.g. {family.prefix}0, {family.prefix}1"
        close = difflib.get_close_matches(key, [v for v, g in self.gates.items() if not g.family], n=1)
        if close:
            return f"did you mean {close[0]}?"
        return "check the spelling, or put a non-adapter variable in [env]"


def _cond_var(cond: str) -> str:
    m = _COND.match(cond.removeprefix("!"))
    return m["var"] if m else ""


# --- reading and checking the file ---------------------------------------------------------------


def _rule_defaults(data: dict[str, Any]) -> dict[str, Any]:
    """A rule entry with its generated field, reason and fix (where it does not give them)."""
    when, needs = data.get("when"), data.get("needs")
    if not (
        isinstance(when, list)
        and when
        and all(isinstance(c, str) and _COND.match(c.removeprefix("!")) for c in when)
        and isinstance(needs, str)
    ):
        return {"field": "", "reason": "", "fix": "", **data}  # only the real problem is reported
    first = _cond_var(when[0])
    field = data.get("field", f"gates.{first}")
    simple = when == [first] and field == f"gates.{first}"
    reason = (
        f"needs {describe_condition(needs)}"
        if simple
        else f"{' and '.join(describe_condition(c) for c in when)} needs {describe_condition(needs)}"
    )
    fix = f"set gates.{cond_fix(needs)}"
    if simple:
        fix += f", or turn {first} off"
    elif len(when) == 1 and "~" in when[0]:
        var, item = when[0].split("~", 1)
        fix += f", or leave {item} out of gates.{var}"
    return {"field": field, "reason": reason, "fix": fix, **data}


def _prepare(data: Mapping[str, Any]) -> dict[str, Any]:
    """The document with what its entries inherit filled in: each entry its adapter's name, a gate
    its adapter's launcher and (unless set) image and the registry's off_values, a rule its
    generated field, reason and fix. Malformed parts are left for the models to report."""
    out = dict(data)
    adapters = data.get("adapter")
    if not isinstance(adapters, list):
        return out
    off = data.get("off_values", ("", "0", "off", "false"))
    prepared: list[object] = []
    for raw in adapters:
        if not isinstance(raw, dict):
            prepared.append(raw)
            continue
        name = raw["name"] if isinstance(raw.get("name"), str) else "?"
        launcher = "tp4" if raw.get("launcher") == "tp4" else None
        image = raw.get("image", "base")
        adapter = dict(raw)
        for key in ("gates", "rules", "boot"):
            entries = raw.get(key)
            if not isinstance(entries, list):
                continue
            filled: list[object] = []
            for entry in entries:
                if isinstance(entry, dict):
                    entry = {**entry, _ADAPTER: name}
                    if key == "gates":
                        entry = {"image": image, "off": off, **entry, _LAUNCHER: launcher}
                    elif key == "rules":
                        entry = _rule_defaults(entry)
                filled.append(entry)
            adapter[key] = filled
        prepared.append(adapter)
    out["adapter"] = prepared
    return out


# The keys an entry may set (what the error for an unknown key suggests from); derived keys are
# not among them.
_KEYS: dict[str, tuple[str, ...]] = {
    "gate": tuple(k for k, f in Gate.model_fields.items() if f.alias not in (_ADAPTER, _LAUNCHER)),
    "rule": tuple(k for k, f in Rule.model_fields.items() if f.alias != _ADAPTER),
    "boot line": tuple(k for k, f in BootLine.model_fields.items() if f.alias != _ADAPTER),
    "adapter": tuple(Adapter.model_fields),
    "moe": tuple(Moe.model_fields),
    "top level": tuple(f.alias or k for k, f in Registry.model_fields.items()),
}
# Keys of the old layout (schema 1), and what replaced them.
_MOVED = {
    (
        "gate",
        "needs",
    ): 'a dependency is a rule now: add { when = ["<this gate>"], needs = "..." } to the adapter\'s rules',
    (
        "adapter",
        "gate_prefixes",
    ): f'a family is a gate whose var ends in {FAMILY}: {{ var = "NAME{FAMILY}", ... }} in gates',
    ("top level", "rule"): "rules belong to an adapter now: move each to the rules of the adapter whose gate it checks",
}
_TYPES = {
    "string_type": ("a string", 'quote it: "..."'),
    "int_type": ("a whole number", "write a number without quotes"),
    "float_type": ("a number", "write a number without quotes"),
    "bool_type": ("true or false", "write true or false"),
    "tuple_type": ("a list", "write [ ... ]"),
    "list_type": ("a list", "write [ ... ]"),
    "model_type": ("a table", "write { key = value, ... }"),
    "model_attributes_type": ("a table", "write { key = value, ... }"),
    "dict_type": ("a table", "write { key = value, ... }"),
}


def _entry(data: object, loc: tuple[int | str, ...]) -> tuple[str, str, tuple[int | str, ...]]:
    """Where an error is (`adapter X, gate Y`), the kind of entry and the rest of its location."""
    if len(loc) < 2 or loc[0] != "adapter" or not isinstance(loc[1], int) or not isinstance(data, dict):
        if loc and loc[0] == "moe":
            return "moe", "moe", loc[1:]
        return "top level", "top level", loc
    raw = data["adapter"][loc[1]]
    name = raw.get("name") if isinstance(raw, dict) else None
    where = f"adapter {name}" if isinstance(name, str) else f"adapter #{loc[1] + 1}"
    rest = loc[2:]
    if (
        len(rest) < 2
        or rest[0] not in ("gates", "rules", "boot")
        or not isinstance(rest[1], int)
        or not isinstance(raw, dict)
    ):
        return where, "adapter", rest
    entry = raw[rest[0]][rest[1]]
    entry = entry if isinstance(entry, dict) else {}
    if rest[0] == "gates":
        var = entry.get("var")
        return (f"{where}, gate {var}" if isinstance(var, str) else f"{where}, gates[{rest[1]}]"), "gate", rest[2:]
    if rest[0] == "rules":
        return f"{where}, {_rule_name(rest[1], entry)}", "rule", rest[2:]
    return f"{where}, boot line {rest[1] + 1}", "boot line", rest[2:]


def _rule_name(index: int, raw: Mapping[str, object]) -> str:
    when = raw.get("when")
    shown = (
        f" (when {', '.join(when)})"
        if isinstance(when, list) and when and all(isinstance(c, str) for c in when)
        else ""
    )
    return f"rule {index + 1}{shown}"


def _message(data: object, err: "ErrorDetails") -> str:
    import difflib

    where, kind, rest = _entry(data, tuple(err["loc"]))
    key = "".join(f"[{p}]" if isinstance(p, int) else (f".{p}" if i else p) for i, p in enumerate(rest))
    kind_of, value, ctx = err["type"], err.get("input"), err.get("ctx") or {}
    if kind_of == "extra_forbidden":
        moved = _MOVED.get((kind, key))
        if moved:
            return f"{where}: unknown key {key!r}; fix: {moved}"
        allowed = _KEYS.get(kind, ())
        close = difflib.get_close_matches(key, [*allowed, *(k for (e, k) in _MOVED if e == kind)], n=1)
        if close:
            also = f" ({_MOVED[(kind, close[0])]})" if (kind, close[0]) in _MOVED else ""
            return f"{where}: unknown key {key!r}; fix: did you mean {close[0]!r}?{also}"
        return f"{where}: unknown key {key!r}; fix: remove it (allowed: {', '.join(allowed)})"
    if kind_of == "missing":
        return f"{where}: {key} is required; fix: add {key} = ..."
    if kind_of == "literal_error":
        choices = {"kind": typing.get_args(Kind), "level": typing.get_args(Level), "launcher": ("tp4",)}.get(
            key.split(".")[-1]
        )
        if key == "schema":
            return f"{where}: schema {value!r} is not this layout (schema = {SCHEMA}); fix: migrate the file to schema {SCHEMA} (see its header)"
        if choices:
            close = difflib.get_close_matches(str(value), choices, n=1)
            fix = f"did you mean {close[0]!r}?" if close else "use one of " + ", ".join(choices)
            return f"{where}: {key} {value!r} is not one of {', '.join(choices)}; fix: {fix}"
        return f"{where}: {key} {value!r} is not allowed; fix: use {ctx.get('expected', 'an allowed value')}"
    if kind_of in _TYPES:
        what, fix = _TYPES[kind_of]
        return f"{where}: {key + ' ' if key else ''}must be {what} (got {value!r}); fix: {fix}"
    if kind_of == "too_short":
        return f"{where}: {key} must not be empty; fix: give at least one"
    if kind_of == "greater_than":
        return f"{where}: {key} must be greater than {ctx.get('gt')} (got {value!r}); fix: give a positive number"
    if kind_of == "value_error":
        return f"{where}: {ctx.get('error')}"
    return f"{where}: {key} has a bad value {value!r}; fix: see the registry's header"


def _cross_check(reg: "Registry", data: Mapping[str, Any]) -> list[str]:
    """What the models alone cannot see: duplicates, and every condition and `{VAR}` against the
    gates and facts."""
    problems: list[str] = []
    if set(reg.images) != set(reg.image_order):
        problems.append(
            f"images: has {', '.join(sorted(reg.images)) or 'none'}; fix: give one [images.<variant>] for each of "
            f"image_order ({', '.join(reg.image_order)})"
        )
    for check in reg.image_checks:
        for variant in check.images or ():
            if variant not in reg.image_order:
                problems.append(
                    f"image_check {check.name}: images names {variant!r}; fix: use one of {', '.join(reg.image_order)}"
                )
    for key in ("attr", "ref"):
        values = [getattr(i, key) for i in reg.images.values()]
        problems += [
            f"images: {key} {v!r} is given twice; fix: give every variant its own {key}"
            for v in sorted({v for v in values if values.count(v) > 1})
        ]
    owner: dict[str, str] = {}
    seen_adapters: set[str] = set()
    for adapter in reg.adapters:
        if adapter.name in seen_adapters:
            problems.append(f"adapter {adapter.name}: is listed twice; fix: give every adapter its own name")
        seen_adapters.add(adapter.name)
        for gate in adapter.gates:
            where = f"adapter {adapter.name}, gate {gate.var}"
            if gate.var in owner:
                problems.append(f"{where}: is also a gate of adapter {owner[gate.var]}; fix: keep one")
            elif gate.var in reg.facts:
                problems.append(f"{where}: is also a fact (rendered by tp4); fix: remove one")
            owner.setdefault(gate.var, adapter.name)
            if gate.image not in reg.image_order:
                problems.append(
                    f"{where}: image {gate.image!r} is not in image_order; fix: use one of {', '.join(reg.image_order)}"
                )
        if adapter.image not in reg.image_order:
            problems.append(
                f"adapter {adapter.name}: image {adapter.image!r} is not in image_order; fix: use one of {', '.join(reg.image_order)}"
            )
        if adapter.moe_align is not None and (not adapter.gates or adapter.gates[0].kind != "switch"):
            problems.append(
                f"adapter {adapter.name}: moe_align needs a switch as the adapter's first gate (it replaces the runner when on); fix: list that switch first"
            )
    for family in reg.families:
        for var in reg.gates:
            if var != family.var and family.member(var):
                problems.append(
                    f"adapter {reg.gates[var].adapter}, gate {var}: is a member of the family {family.var} (adapter {family.adapter}); fix: remove one"
                )

    def known(var: str, where: str, family_ok: bool = False) -> bool:
        if var in reg.facts or (var in reg.gates and (family_ok or not var.endswith(FAMILY))):
            return True
        if var in reg.gates:
            problems.append(
                f"{where}: names the family {var}, which only a rule's when may name (the rule then holds for each member set); "
                f"fix: name a member, e.g. {reg.gates[var].prefix}1"
            )
            return False
        import difflib

        close = difflib.get_close_matches(var, [*reg.gates, *reg.facts], n=1)
        fix = (
            f"did you mean {close[0]}?"
            if close
            else "name a gate of the registry, or add a variable tp4 renders to facts"
        )
        problems.append(f"{where}: {var} is no gate and no fact; fix: {fix}")
        return False

    def placeholders(text: str, where: str) -> None:
        for m in _PLACEHOLDER.finditer(text):
            known(m[1], where)

    def condition(cond: str, where: str, family_ok: bool = False) -> None:
        m = _COND.match(cond.removeprefix("!"))
        if not m:
            problems.append(f"{where}: bad condition {cond!r}; fix: write {_CONDITION_FORMS}")
            return
        var, op, arg = m["var"], m["op"], m["arg"]
        if not known(var, where, family_ok):
            return
        if arg is not None:
            placeholders(arg, where)
        gate = reg.gates.get(var)
        literal = arg is not None and not _PLACEHOLDER.search(arg)
        if op in (">=", "<=") and literal:
            try:
                float(arg)
            except ValueError:
                problems.append(f"{where}: {cond!r} compares with {arg!r}, not a number; fix: write {var}{op}<number>")
        elif op == "~" and gate is not None and gate.kind == "list" and arg not in gate.values:
            problems.append(f"{where}: {cond!r} names no item of {var}; fix: use one of {', '.join(gate.values)}")
        elif op == "~" and gate is not None and gate.kind not in ("list", "text"):
            problems.append(
                f"{where}: {cond!r}: {var} is a {gate.kind} gate, not a comma-separated list; fix: use = or !="
            )
        elif op in ("=", "!=") and gate is not None and gate.kind == "enum" and literal and arg not in gate.values:
            problems.append(
                f"{where}: {cond!r}: {arg!r} is not a value of {var}; fix: use one of {', '.join(gate.values)}"
            )

    for a, raw_adapter in zip(reg.adapters, data["adapter"], strict=True):
        for i, rule in enumerate(a.rules):
            where = f"adapter {a.name}, {_rule_name(i, raw_adapter['rules'][i])}"
            for cond in rule.when:
                condition(cond, where, family_ok=True)
            condition(rule.needs, where)
            for text in (rule.reason, rule.fix, rule.follow or ""):
                placeholders(text, where)
            if rule.field.startswith("gates."):
                target = rule.field.removeprefix("gates.")
                if known(target, where, family_ok=True) and target.endswith(FAMILY) and target != rule.family_var:
                    problems.append(
                        f"{where}: field {rule.field} names a family its when does not; fix: start when with {target}"
                    )
            elif rule.follow is not None:
                problems.append(
                    f'{where}: follow is only for a rule on a gate (field = "gates.NAME"); fix: remove follow'
                )
            if "fix" not in raw_adapter["rules"][i] and _cond_var(rule.needs) in reg.facts:
                problems.append(
                    f"{where}: needs {rule.needs!r} names a fact, not a gate, so no fix can be generated; fix: give fix"
                )
        for i, line in enumerate(a.boot):
            where = f"adapter {a.name}, boot line {i + 1}"
            for cond in line.when:
                condition(cond, where)
            placeholders(line.line, where)
    return problems


def parse_registry(data: Mapping[str, Any], source: str = "adapter registry") -> Registry:
    """The registry from its TOML document, strictly: every problem, named, in one InvalidInput."""
    raw = dict(data)
    checks = parse_image_checks(raw.pop("image_check", []), source)
    try:
        reg = Registry.model_validate({**_prepare(raw), "image_check": checks})
    except ValidationError as exc:
        raise InvalidInput(f"{source} is not valid", [_message(raw, e) for e in exc.errors()]) from None
    problems = _cross_check(reg, raw)
    if problems:
        raise InvalidInput(f"{source} is not valid", problems)
    return reg


def _construct(data: Mapping[str, Any]) -> Registry:
    """The registry from a document parse_registry accepted, built without validating again: the
    same objects (tests/test_registry.py compares them), without building the models' schemas."""
    raw = _prepare({k: v for k, v in data.items() if k != "image_check"})

    def gate(g: dict[str, Any]) -> Gate:
        return Gate.model_construct(
            var=g["var"],
            adapter=g[_ADAPTER],
            kind=g.get("kind", "text"),
            image=g["image"],
            values=tuple(g.get("values", ())),
            pattern=g.get("pattern"),
            form=g.get("form"),
            min=None if g.get("min") is None else float(g["min"]),
            max=None if g.get("max") is None else float(g["max"]),
            off=tuple(g["off"]),
            default=g.get("default"),
            forwarded=g.get("forwarded", False),
            launcher=g[_LAUNCHER],
        )

    def rule(r: dict[str, Any]) -> Rule:
        return Rule.model_construct(
            adapter=r[_ADAPTER],
            when=tuple(r["when"]),
            needs=r["needs"],
            field=r["field"],
            reason=r["reason"],
            fix=r["fix"],
            level=r.get("level", "error"),
            follow=r.get("follow"),
        )

    def boot(b: dict[str, Any]) -> BootLine:
        return BootLine.model_construct(
            adapter=b[_ADAPTER], line=b["line"], when=tuple(b.get("when", ())), required=b.get("required", True)
        )

    adapters = tuple(
        Adapter.model_construct(
            name=a["name"],
            summary=a.get("summary", ""),
            image=a.get("image", "base"),
            launcher=a.get("launcher"),
            moe_align=a.get("moe_align"),
            gates=tuple(gate(g) for g in a.get("gates", ())),
            rules=tuple(rule(r) for r in a.get("rules", ())),
            boot=tuple(boot(b) for b in a.get("boot", ())),
        )
        for a in raw["adapter"]
    )
    return Registry.model_construct(
        schema_version=raw["schema"],
        off_values=tuple(raw.get("off_values", ("", "0", "off", "false"))),
        image_order=tuple(raw.get("image_order", ("base", "canary", "canary-roce"))),
        images={k: ImageBuild.model_construct(**v) for k, v in raw.get("images", {}).items()},
        forbidden_lines=tuple(raw.get("forbidden_lines", ())),
        facts=tuple(raw.get("facts", ())),
        moe=Moe.model_construct(**raw["moe"]),
        adapters=adapters,
        image_checks=parse_image_checks(data.get("image_check", []), "adapter registry"),
    )


# registry.toml as parse_registry accepted it, as JSON with the digest of the TOML text
# (`python -m tp4.line.registry --write-json` parses the TOML strictly, then writes it; a test keeps it
# current). `tp4 plan` reads the registry on every run: while the digest matches, the document
# comes from the JSON (~0.1 ms; tomllib takes ~4 ms over this file) and is built without
# validating again (the strict parse builds the models' schemas, several ms more). Any other
# text, an edited registry.toml included, is parsed strictly; a stale twin only makes a run
# slower, never different.
JSON_TWIN = DATA / "registry.json"


def _digest(text: bytes) -> str:
    import hashlib

    return hashlib.sha256(text).hexdigest()


def _accepted(text: bytes) -> dict[str, Any] | None:
    """The document of text if the twin says parse_registry accepted exactly this text."""
    import json

    try:
        twin = json.loads(JSON_TWIN.read_bytes())
    except (OSError, ValueError):
        return None
    if not isinstance(twin, dict) or twin.get("source_sha256") != _digest(text):
        return None
    document = twin.get("document")
    return document if isinstance(document, dict) else None


@lru_cache(maxsize=None)
def load_registry(path: str | None = None) -> Registry:
    p = Path(path) if path else REGISTRY_PATH
    try:
        text = p.read_bytes()
        accepted = _accepted(text)
        if accepted is not None:
            return _construct(accepted)
        data = tomllib.loads(text.decode())
    except OSError as exc:
        raise InvalidInput(f"cannot read the adapter registry {p}: {exc.strerror}") from exc
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise InvalidInput(f"adapter registry {p}: {exc}") from exc
    return parse_registry(data, f"adapter registry {p}")


def write_json_twin(path: Path = REGISTRY_PATH) -> None:
    """Parse the registry strictly and write its JSON twin."""
    import json

    text = path.read_bytes()
    document = tomllib.loads(text.decode())
    parse_registry(document, f"adapter registry {path}")
    twin = {
        "generated": f"from {path.name} by `python -m tp4.line.registry --write-json`; read only while source_sha256 is its digest",
        "source_sha256": _digest(text),
        "document": document,
    }
    JSON_TWIN.write_text(json.dumps(twin, indent=1, ensure_ascii=False) + "\n")


# --- conditions over an environment ------------------------------------------------------------


def condition_holds(cond: str, env: Mapping[str, str], registry: "Registry") -> bool:
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
    assert arg is not None
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


def cond_fix(cond: str) -> str:
    """The assignment that makes cond hold, as `VAR = "value"` (after "set gates.")."""
    if cond.startswith("!"):
        return f'{cond[1:]} = "0"'
    m = _COND.match(cond)
    if not m or m["op"] is None:
        return f'{cond} = "1"'
    var, op, arg = m["var"], m["op"], m["arg"]
    if op == "~":
        return f'{var} to a list containing "{arg}"'
    if op == ">=":
        return f'{var} = "{arg}" or more'
    if op == "<=":
        return f'{var} = "{arg}" or less'
    if op == "!=":
        return f'{var} to anything but "{arg}"'
    return f'{var} = "{arg}"'


def fill_line(line: str, env: Mapping[str, str]) -> str:
    """Replace {VAR} and {VAR+1} with values from env (the rank-0 environment)."""

    def sub(m: re.Match[str]) -> str:
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


if __name__ == "__main__":
    import sys

    if sys.argv[1:] != ["--write-json"]:
        sys.exit(
            "usage: python -m tp4.line.registry --write-json  (parse adapters/registry.toml strictly and write its JSON twin)"
        )
    try:
        write_json_twin()
    except InvalidInput as exc:
        sys.exit(f"error: {exc}")
    print(f"wrote {JSON_TWIN}")
