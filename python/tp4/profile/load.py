"""Loading a profile: read TOML, stack it on its preset layers, parse the models, validate.

A profile is a partial TOML document naming a preset; the preset chain (each preset file names
the one it `extends`) is merged bottom-up, tables key by key, arrays and values replaced whole.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tp4.errors import InvalidInput
from tp4.registry import DATA
from tp4.userfiles import read_input

PRESETS = DATA / "presets"
DEFAULT_PROFILE = DATA / "default-profile.toml"


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a profile: the field, what is wrong, and how to fix it."""

    field: str
    reason: str
    fix: str = ""

    def __str__(self) -> str:
        return f"{self.field}: {self.reason}" + (f"; fix: {self.fix}" if self.fix else "")


@dataclass
class Loaded:
    profile: Any  # tp4.profile.models.Profile (imported lazily)
    source: str
    warnings: list[str] = field(default_factory=list)


def preset_names() -> list[str]:
    return sorted(p.stem for p in PRESETS.glob("*.toml"))


def _read_toml(text: str, where: str) -> dict:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InvalidInput(f"{where} is not valid TOML: {exc}") from exc


def preset_layers(name: str) -> list[tuple[str, dict]]:
    """The chain of preset layers from the bottom up, ending with `name`."""
    chain: list[tuple[str, dict]] = []
    seen: set[str] = set()
    current: str | None = name
    while current is not None:
        if current in seen:
            raise InvalidInput(f"preset {current!r} extends itself through {' -> '.join(seen)}")
        seen.add(current)
        # a name, never a path: `../registry` must not read another data file as a preset
        if current not in preset_names():
            import difflib

            hint = difflib.get_close_matches(current, preset_names(), n=1)
            problem = (f"preset: unknown preset {current!r}; fix: use one of {', '.join(preset_names())}"
                       + (f" (did you mean {hint[0]!r}?)" if hint else ""))
            raise InvalidInput("the profile names no preset tp4 has", [problem])
        path = PRESETS / f"{current}.toml"
        layer = _read_toml(path.read_text(), f"preset {current}")
        current = layer.pop("extends", None)
        chain.append((path.stem, layer))
    return list(reversed(chain))


def merge(base: dict, top: dict) -> dict:
    out = dict(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def merged_document(doc: dict) -> dict:
    """The profile document stacked on its preset chain (before model parsing)."""
    preset = doc.get("preset", "production")
    if not isinstance(preset, str):
        raise InvalidInput("preset: must be a string naming a preset", [f"preset: one of {', '.join(preset_names())}"])
    result: dict = {}
    for _, layer in preset_layers(preset):
        result = merge(result, layer)
    result = merge(result, doc)
    result["preset"] = preset
    return result


def _clean_loc(loc: tuple) -> tuple:
    """A pydantic error location without its internal parts (validator names, "[key]" of a dict key)."""
    return tuple(p for p in loc if not (isinstance(p, str) and (p.startswith("function-") or p == "[key]")))


def _loc(loc: tuple) -> str:
    out = ""
    for part in _clean_loc(loc):
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "profile"


def _pydantic_problems(exc: Any, doc: dict) -> list[Problem]:
    from tp4.profile import models

    problems = []
    for err in exc.errors():
        loc = _clean_loc(err["loc"])
        where = _loc(loc)
        if err["type"] == "extra_forbidden":
            import difflib

            known = _known_fields(models.Profile, loc[:-1])
            hint = difflib.get_close_matches(str(loc[-1]), known, n=1)
            fix = f"did you mean {hint[0]!r}?" if hint else (
                "remove it; known fields here: " + ", ".join(sorted(known)) if known else "remove it")
            if loc[-1] in ("api_key", "key"):
                fix = "never put a key in a profile: write it to a file (mode 600) and set api.key_file"
            problems.append(Problem(where, "unknown field", fix))
        elif err["type"] == "missing":
            problems.append(Problem(where, "is required", "set it"))
        elif err["type"] == "too_long":
            most = err["ctx"]["max_length"]
            problems.append(Problem(where, f"has {err['ctx']['actual_length']} items, more than {most}", f"list at most {most}"))
        elif err["type"] in _BOUNDS and isinstance(err["input"], int | float):
            reason, fix, key = _BOUNDS[err["type"]]
            bound = err["ctx"][key]
            problems.append(Problem(where, f"{err['input']} is {reason} {bound}", f"use a value of {fix} {bound}"))
        elif err["type"] == "literal_error":
            problems.append(Problem(where, f"{_shown(err['input'])} is not allowed", f"use {err['ctx']['expected']}"))
        elif err["msg"].startswith("Input should be "):
            kind = _TOML_KINDS.get(err["type"], err["msg"][len("Input should be "):])
            problems.append(Problem(where, f"got {_shown(err['input'])}; must be {kind}", ""))
        else:
            msg = err["msg"]
            if msg.startswith("Value error, "):
                msg = msg[len("Value error, "):]
            problems.append(Problem(where, msg, ""))
    return problems


_TOML_KINDS = {"model_type": "a table", "dict_type": "a table", "model_attributes_type": "a table",
               "list_type": "an array", "string_type": "a string", "int_type": "a whole number",
               "bool_type": "true or false", "float_type": "a number"}


def _shown(value: Any) -> str:
    """A value as the user wrote it in TOML (true, not True), cut short."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, dict | list):
        return "a table" if isinstance(value, dict) else "an array"
    return repr(value)[:60]


_BOUNDS = {"less_than_equal": ("above the maximum", "at most", "le"),
           "greater_than_equal": ("below the minimum", "at least", "ge")}


def _known_fields(model: Any, loc: tuple) -> list[str]:
    from typing import get_args

    from pydantic import BaseModel

    current = model
    for part in loc:
        if isinstance(part, int):
            continue
        info = current.model_fields.get(part) if isinstance(current, type) and issubclass(current, BaseModel) else None
        if info is None:
            return []
        ann = info.annotation
        candidates = [ann, *get_args(ann)]
        for args in list(candidates):
            candidates.extend(get_args(args))
        current = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)
        if current is None:
            return []
    return list(current.model_fields) if current is not None else []


def parse_document(doc: dict, source: str) -> Loaded:
    """Merge a profile document with its presets, parse and validate it. Raises InvalidInput
    listing every problem at once."""
    from pydantic import ValidationError

    from tp4.profile.models import Profile
    from tp4.profile.validate import validate

    merged = merged_document(doc)
    problems: list[Problem] = []
    candidate = merged
    profile = None
    # Field errors first; then, so that every problem shows at once, the rules between fields on
    # the document with the bad fields dropped (their defaults stand in).
    for _ in range(5):
        try:
            profile = Profile.model_validate(candidate)
            break
        except ValidationError as exc:
            # a dropped bad field may come back as "is required": it is reported once, as bad
            reported = {p.field for p in problems}
            problems += [p for p in _pydantic_problems(exc, candidate) if p.field not in reported]
            pruned = _drop(candidate, [e["loc"] for e in exc.errors()])
            if pruned is None:
                break
            candidate = pruned
    warnings: list[Problem] = []
    if profile is not None:
        own = doc.get("gates")
        profile._own_gates = frozenset(own) if isinstance(own, dict) else frozenset()
        errors, warnings = validate(profile)
        seen = {p.field for p in problems}
        problems += [e for e in errors if e.field not in seen]
    if problems:
        raise InvalidInput(f"{source}: {len(problems)} problem(s)", [str(p) for p in problems])
    return Loaded(profile, source, [str(w) for w in warnings])


def _drop(doc: dict, locs: list[tuple]) -> dict | None:
    """A copy of doc without the values at locs, or None when nothing could be dropped."""
    import copy

    out = copy.deepcopy(doc)
    dropped = False
    for loc in locs:
        loc = _clean_loc(loc)
        cur: Any = out
        for part in loc[:-1]:
            try:
                cur = cur[part]
            except (KeyError, IndexError, TypeError):
                cur = None
                break
        if isinstance(cur, dict) and loc and loc[-1] in cur:
            del cur[loc[-1]]
            dropped = True
    return out if dropped else None


def load_text(text: str, source: str) -> Loaded:
    return parse_document(_read_toml(text, source), source)


def load_file(path: str | Path) -> Loaded:
    text = read_input(path, "profile", "pass an existing file, or omit --profile to use the embedded default")
    return load_text(text, str(path))


def load_default() -> Loaded:
    return load_text(DEFAULT_PROFILE.read_text(), "embedded default profile")
