"""Loading a profile: read TOML, stack it on its preset layers, parse the models, validate.

A profile is a partial TOML document naming a preset; the preset chain (each preset file names
the one it `extends`) and then the profile are merged bottom-up: tables key by key, values
replaced, and each list as its row of `models.LIST_MERGE` says (engine.extra_args adds to the
layers below, engine.drop_args removes from them, the other lists are replaced whole).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from tp4.core.errors import InvalidInput, clip
from tp4.line.profile.problem import Problem
from tp4.line.registry import DATA
from tp4.core.userfiles import parse_toml, read_input

if TYPE_CHECKING:
    from pydantic import BaseModel, ValidationError

    from tp4.line.profile.models import Profile

# a TOML document as tomllib gives it, and a place in one (keys and array indices)
Doc = dict[str, Any]
Loc = tuple[str | int, ...]

PRESETS = DATA / "presets"
DEFAULT_PROFILE = DATA / "default-profile.toml"


class ArgOrigin(NamedTuple):
    """One argument of engine.extra_args (a flag and its values) and the layer that set it:
    "preset NAME" or "profile"; `dropped_by`: the layer whose engine.drop_args removed it."""

    words: tuple[str, ...]
    layer: str
    dropped_by: str | None = None


@dataclass
class Loaded:
    profile: Profile  # imported lazily: models are built only when a profile is loaded
    source: str
    warnings: list[str] = field(default_factory=list)
    # where each extra engine argument came from, in the order the line runs them, then the
    # dropped ones (the plan's notes); () for a profile not read through the loader
    arg_origins: tuple[ArgOrigin, ...] = ()


def preset_names() -> list[str]:
    return sorted(p.stem for p in PRESETS.glob("*.toml"))


def _read_toml(text: str, where: str) -> Doc:
    # a syntax error, nesting 5,000 deep or a 5,000-digit number: the user's file, said plainly
    return parse_toml(text, where, "correct the file (`tp4 profile reference` says what each field takes)")


def preset_layers(name: str) -> list[tuple[str, Doc]]:
    """The chain of preset layers from the bottom up, ending with `name`."""
    chain: list[tuple[str, Doc]] = []
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
            problem = f"preset: unknown preset {clip(current)}; fix: use one of {', '.join(preset_names())}" + (
                f" (did you mean {hint[0]!r}?)" if hint else ""
            )
            raise InvalidInput("the profile names no preset tp4 has", [problem])
        path = PRESETS / f"{current}.toml"
        layer = _read_toml(path.read_text(), f"preset {current}")
        current = layer.pop("extends", None)
        chain.append((path.stem, layer))
    return list(reversed(chain))


def merge(base: Doc, top: Doc) -> Doc:
    out = dict(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def merged_document(doc: Doc, source: str = "the profile") -> Doc:
    """The profile document stacked on its preset chain (before model parsing). `source` names
    the profile in errors (its path)."""
    return _stacked(doc, source)[0]


def _stacked(doc: Doc, source: str) -> tuple[Doc, tuple[ArgOrigin, ...], dict[str, Any]]:
    """The merged document, where each extra engine argument came from, and the gates the preset
    chain alone sets (what the renderer counts as the preset's: it reads them from the Profile,
    never the preset files). Raises InvalidInput for a list the layers cannot merge (a flag given
    twice, a drop of nothing inherited)."""
    preset = doc.get("preset", "production")
    if not isinstance(preset, str):
        raise InvalidInput(
            "the profile names no preset tp4 has",
            [
                f"preset: got {_shown(preset)}; must be a string naming a preset; fix: use one of {', '.join(preset_names())}"
            ],
        )
    layers = [_Layer(f"preset {name}", _where(f"preset {name}"), layer) for name, layer in preset_layers(preset)]
    layers.append(_Layer("profile", source, doc))
    result: Doc = {}
    args: list[ArgOrigin] = []
    dropped: list[ArgOrigin] = []
    problems: list[str] = []
    preset_gates: dict[str, Any] = {}
    for layer in layers:
        if layer.name == "profile":
            preset_gates = dict(result.get("gates", {}))
        merged_args = _merge_args(layer, args, dropped, problems)
        result = merge(result, layer.doc)
        if merged_args is not None:
            engine = result.setdefault("engine", {})
            if isinstance(engine, dict):
                engine["extra_args"] = [w for a in args for w in a.words]
                if dropped:
                    engine["drop_args"] = [_flag(a.words[0]) for a in dropped]
    if problems:
        raise InvalidInput(
            f"{source}: the layers' engine.extra_args do not merge ({len(problems)} problem(s))", problems
        )
    result["preset"] = preset
    return _image_tag(result), (*args, *dropped), preset_gates


class _Layer(NamedTuple):
    name: str  # as the plan's notes say it: "preset base", "profile"
    where: str  # as errors say it: the preset's file, the profile's path
    doc: Doc


def _shown_word(word: str) -> str:
    """An item of engine.drop_args or extra_args as a message shows it: a secret flag's value never
    (``--admin-api-key=<not shown>``), anything else cut at 60 characters."""
    from tp4.line.profile.models import secret_flag

    flag = secret_flag(word)
    if flag is not None:
        return repr(flag + ("=<not shown>" if "=" in word else ""))
    return repr(word[:60])


def _flag(word: str) -> str | None:
    """The flag a word of extra_args starts (`--name` or `--name=value`), or None for a value."""
    return word.partition("=")[0] if word.startswith("--") else None


def _arguments(words: list[str]) -> list[tuple[str, ...]]:
    """Words grouped into arguments: a flag with the values after it (words not starting `--`)."""
    out: list[list[str]] = []
    for word in words:
        if _flag(word) is None and out:
            out[-1].append(word)
        else:
            out.append([word])
    return [tuple(a) for a in out]


def _merge_args(layer: _Layer, args: list[ArgOrigin], dropped: list[ArgOrigin], problems: list[str]) -> bool | None:
    """Apply one layer's engine.drop_args and engine.extra_args to the inherited `args` (in place,
    recording what is dropped); None when the layer sets neither. A list of anything but strings is
    left to the model, which reports it (the layer's value then replaces the inherited list)."""
    engine = layer.doc.get("engine")
    if not isinstance(engine, dict) or ("extra_args" not in engine and "drop_args" not in engine):
        return None
    own = engine.get("extra_args", [])
    drops = engine.get("drop_args", [])
    if not (
        isinstance(own, list)
        and all(isinstance(w, str) for w in own)
        and isinstance(drops, list)
        and all(isinstance(w, str) for w in drops)
    ):
        return None
    inherited = sorted({f for a in args if (f := _flag(a.words[0])) is not None})
    for i, name in enumerate(drops):
        hits = [a for a in args if a.words and _flag(a.words[0]) == name]
        shown = _shown_word(name)
        if name in drops[:i]:
            problems.append(f"engine.drop_args[{i}]: {shown} is named twice in {layer.where}; fix: remove one")
            continue
        if not hits:
            problems.append(
                f"engine.drop_args[{i}]: {shown} in {layer.where} is not a flag a lower layer sets in "
                f"engine.extra_args, so there is nothing to drop; fix: "
                + (
                    f"name one of {', '.join(inherited)} (a flag, without its value), or remove it"
                    if inherited
                    else "remove it (the layers below set no extra_args)"
                )
            )
            continue
        for a in hits:
            args.remove(a)
            dropped.append(a._replace(dropped_by=layer.name))
    seen = {f: a for a in args if (f := _flag(a.words[0])) is not None}
    for words in _arguments(own):
        flag = _flag(words[0])
        first = seen.get(flag) if flag is not None else None
        if first is not None:
            twice = (
                f"twice in {layer.where}"
                if first.layer == layer.name
                else f"by {_where(first.layer)} and again by {layer.where}"
            )
            fix = (
                "remove one of them"
                if first.layer == layer.name
                else f'to change the inherited value, add "{flag}" to engine.drop_args in {layer.where} and keep '
                "yours; otherwise remove yours"
            )
            problems.append(f"engine.extra_args: {flag} is given {twice}; fix: {fix}")
            continue
        origin = ArgOrigin(words, layer.name)
        args.append(origin)
        if flag is not None:
            seen[flag] = origin
    return True


def _where(name: str) -> str:
    """A preset layer's name as an error says it, with its file."""
    if name.startswith("preset "):
        return f"{name} ({PRESETS / name.removeprefix('preset ')}.toml)"
    return name


_EXTRA_ARG = re.compile(r"engine\.extra_args\[([0-9]+)\]")


def _own_index(problem: Problem, origins: tuple[ArgOrigin, ...]) -> Problem:
    """A problem of the merged engine.extra_args at the index the profile's own list has: the
    profile's items follow every inherited one."""
    m = _EXTRA_ARG.match(problem.field)
    if m is None or not any(o.layer == "profile" and o.dropped_by is None for o in origins):
        return problem
    inherited = sum(len(o.words) for o in origins if o.layer != "profile" and o.dropped_by is None)
    k = int(m.group(1))
    if k < inherited:
        return problem
    import dataclasses

    return dataclasses.replace(problem, field=f"engine.extra_args[{k - inherited}]" + problem.field[m.end() :])


def _image_tag(doc: Doc) -> Doc:
    """The reference of the image the flake builds for the document's variant (the registry's
    `[images.<variant>]`, which pkgs/default.nix builds), unless the profile names a tag itself."""
    image = doc.get("image")
    if isinstance(image, dict) and "tag" not in image and isinstance(image.get("variant"), str):
        from tp4.line.registry import load_registry

        built = load_registry().images.get(image["variant"])
        if built is not None:
            doc["image"] = {**image, "tag": built.ref}
    return doc


def _clean_loc(loc: Loc) -> Loc:
    """A pydantic error location without its internal parts (validator names, "[key]" of a dict key)."""
    return tuple(p for p in loc if not (isinstance(p, str) and (p.startswith("function-") or p == "[key]")))


def _loc(loc: Loc) -> str:
    out = ""
    for part in _clean_loc(loc):
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            # a table key as TOML writes it: bare when it can be, quoted otherwise (env."A=B")
            out += ("." if out else "") + toml_key(str(part))
    return out or "profile"


_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def toml_key(key: str) -> str:
    """A table key as TOML writes it: bare when it can be, else quoted with escapes (env."A=B")."""
    if _BARE_KEY.fullmatch(key):
        return key
    escaped = "".join(f"\\{c}" if c in '"\\' else f"\\u{ord(c):04X}" if not c.isprintable() else c for c in key)
    return f'"{escaped}"'


def _pydantic_problems(exc: ValidationError, doc: Doc, model: type[BaseModel] | None = None) -> list[Problem]:
    """Each error of a validation as a Problem (field, reason, fix); ``model``: the model that was
    validated (default: the profile), whose fields the hint for a misspelt key is taken from."""
    from tp4.line.profile import models

    problems = []
    for err in exc.errors():
        loc = _clean_loc(err["loc"])
        where = _loc(loc)
        if err["type"] == "extra_forbidden":
            import difflib

            known = _known_fields(model or models.Profile, loc[:-1])
            hint = difflib.get_close_matches(str(loc[-1]), known, n=1)
            fix = (
                f"did you mean {hint[0]!r}?"
                if hint
                else ("remove it; known fields here: " + ", ".join(sorted(known)) if known else "remove it")
            )
            if loc[-1] in ("api_key", "key"):
                fix = "never put a key in a profile: write it to a file (mode 600) and set api.key_file"
            problems.append(Problem(where, "unknown field", fix))
        elif err["type"] == "missing":
            problems.append(Problem(where, "is required", "set it"))
        elif err["type"] == "too_long":
            most = err["ctx"]["max_length"]
            problems.append(
                Problem(where, f"has {err['ctx']['actual_length']} items, more than {most}", f"list at most {most}")
            )
        elif err["type"] == "too_short":
            least = err["ctx"]["min_length"]
            problems.append(
                Problem(where, f"has {err['ctx']['actual_length']} items, fewer than {least}", f"list at least {least}")
            )
        elif err["type"] in _BOUNDS and isinstance(err["input"], int | float):
            reason, fix, key = _BOUNDS[err["type"]]
            bound = err["ctx"][key]
            problems.append(Problem(where, f"{err['input']} is {reason} {bound}", f"use a value of {fix} {bound}"))
        elif err["type"] == "literal_error":
            problems.append(Problem(where, f"{_shown(err['input'])} is not allowed", f"use {err['ctx']['expected']}"))
        elif err["msg"].startswith("Input should be "):
            kind = _TOML_KINDS.get(err["type"], err["msg"][len("Input should be ") :])
            problems.append(
                Problem(where, f"got {_shown(err['input'])}; must be {kind}", _kind_fix(err["type"], err["input"]))
            )
        else:
            msg = err["msg"]
            if msg.startswith("Value error, "):
                msg = msg[len("Value error, ") :]
            reason, _, fix = msg.partition("; fix: ")
            problems.append(Problem(where, reason, fix or "see `tp4 profile reference` for what this field takes"))
    return problems


_TOML_KINDS = {
    "model_type": "a table",
    "dict_type": "a table",
    "model_attributes_type": "a table",
    "list_type": "an array",
    "string_type": "a string",
    "int_type": "a whole number",
    "bool_type": "true or false",
    "float_type": "a number",
}


def _kind_fix(kind: str, value: object) -> str:
    """How to write a value of the right TOML kind, from what was written."""
    if kind == "string_type":
        text = (
            str(value).lower() if isinstance(value, bool) else str(value) if isinstance(value, int | float) else "..."
        )
        return f'write it in quotes, e.g. "{text}"'
    if kind in ("int_type", "float_type"):
        return "write the number without quotes, e.g. 4"
    if kind == "bool_type":
        return "write true or false, without quotes"
    if kind == "list_type":
        return 'write an array, e.g. ["a", "b"]'
    if kind in ("model_type", "dict_type", "model_attributes_type"):
        return "write it as a [table] with its fields, not a single value"
    return "see `tp4 profile reference` for the field"


def _shown(value: object) -> str:
    """A value as the user wrote it in TOML (true, not True), cut short."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, dict | list):
        return "a table" if isinstance(value, dict) else "an array"
    return repr(value)[:60]


_BOUNDS = {
    "less_than_equal": ("above the maximum", "at most", "le"),
    "greater_than_equal": ("below the minimum", "at least", "ge"),
}


def _known_fields(model: type[BaseModel], loc: Loc) -> list[str]:
    from typing import get_args

    from pydantic import BaseModel

    current: type[BaseModel] | None = model
    for part in loc:
        if isinstance(part, int):
            continue
        info = current.model_fields.get(part) if current is not None else None
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


def parse_document(doc: Doc, source: str) -> Loaded:
    """Merge a profile document with its presets, parse and validate it. Raises InvalidInput
    listing every problem at once."""
    from pydantic import ValidationError

    from tp4.line.profile.models import Profile

    merged, origins, preset_gates = _stacked(doc, source)
    problems: list[Problem] = []
    bad: list[Loc] = []  # where the bad values are; each is reported once, then left out
    candidate = merged
    profile = None
    # Field errors first; then, so that every problem shows at once, the rules between fields on
    # the document without the bad values.
    for _ in range(5):
        try:
            profile = Profile.model_validate(candidate)
            break
        except ValidationError as exc:
            # a dropped bad field may come back as "is required": it is reported once, as bad
            reported = {p.field for p in problems}
            problems += [p for p in _pydantic_problems(exc, candidate) if p.field not in reported]
            locs = [_clean_loc(e["loc"]) for e in exc.errors()]
            pruned = _drop(candidate, locs)
            if pruned is None:
                # a required field without a value (missing, or its bad value left out): a
                # stand-in, so that the rest of the profile is still checked (what names the field
                # is not reported, below)
                missing = [loc for loc, e in zip(locs, exc.errors(), strict=True) if e["type"] == "missing"]
                pruned = _stand_in(candidate, missing)
                if pruned is None:
                    break
                bad += [loc for loc in missing if loc not in bad]
            else:
                bad += locs
            candidate = pruned
    warnings: list[Problem] = []
    if profile is not None:
        without_bad = _drop(doc, bad)
        own = doc if without_bad is None else without_bad
        errors, warnings = _checked(profile, own, preset_gates)
        if bad:
            # A rule that fails only because a bad value is missing is not a problem of its own:
            # keep what fails both with the model's defaults (above) and with the presets' values
            # standing in for the bad ones.
            try:
                preset_doc, _, stand_in_gates = _stacked(own, source)
                missing = [loc for loc in bad if _value_at(preset_doc, loc) is None]
                stand_in = Profile.model_validate(_stand_in(preset_doc, missing) if missing else preset_doc)
            except (ValidationError, InvalidInput):
                stand_in = None
            if stand_in is not None:
                other_errors, other_warnings = _checked(stand_in, own, stand_in_gates)
                errors = [e for e in errors if e in other_errors]
                warnings = [w for w in warnings if w in other_warnings]
            # and what names a bad field (`equals cluster.port (8888)`) read its stand-in
            names = {_loc(loc) for loc in bad} | {
                str(loc[-1]) for loc in bad if len(loc) == 2 and loc[0] in ("gates", "env")
            }
            errors = [e for e in errors if not any(_names(str(e), n) for n in names)]
            warnings = [w for w in warnings if not any(_names(str(w), n) for n in names)]
        seen = {p.field for p in problems}
        problems += [e for e in errors if e.field not in seen]
        warnings = [w for w in warnings if w.field not in seen]
    problems = [_own_index(p, origins) for p in problems]
    warnings = [_own_index(w, origins) for w in warnings]
    if problems:
        raise InvalidInput(f"{source}: {len(problems)} problem(s)", [str(p) for p in problems])
    assert profile is not None  # no profile only after a field error, and every field error is a problem
    return Loaded(profile, source, [str(w) for w in warnings], origins)


def _names(text: str, name: str) -> bool:
    """Whether text names the field or variable `name` (a whole word: engine.ep, not engine.epsilon)."""
    return re.search(rf"(?<![\w.]){re.escape(name)}(?![\w])", text) is not None


def _checked(profile: Profile, doc: Doc, preset_gates: dict[str, Any]) -> tuple[list[Problem], list[Problem]]:
    """Render, then check: the rules between fields over what the renderer makes of the parsed
    profile (its gates and rank 0's environment, rendered once), and the files the profile names
    on this machine. The validator reads the rendered values; it never calls the renderer."""
    from tp4.line.plan import render_head
    from tp4.line.profile.validate import local_file_warnings, validate
    from tp4.line.registry import load_registry

    own = doc.get("gates")
    profile._own_gates = frozenset(own) if isinstance(own, dict) else frozenset()
    profile._preset_gates = {str(k): str(v) for k, v in preset_gates.items()}
    reg = load_registry()
    rendered = render_head(profile, reg)
    errors, warnings = validate(profile, rendered.gates, rendered.head_env, reg)
    return errors, warnings + local_file_warnings(profile)


def strict(loaded: Loaded) -> Loaded:
    """`--strict`: the profile's warnings are errors (exit 2)."""
    if loaded.warnings:
        raise InvalidInput(
            f"{loaded.source}: {len(loaded.warnings)} warning(s), errors under --strict; "
            "fix: address each, or drop --strict",
            loaded.warnings,
        )
    return loaded


# Stand-ins for the required fields (a node's name and fabric IP) while the rest is checked:
# unique, and of a form no real line uses (the IPs are TEST-NET-1, RFC 5737).
_STAND_INS = {"name": "tp4-stand-in-{n}", "ip": "192.0.2.{n}"}


def _value_at(doc: Doc, loc: Loc) -> object:
    cur: Any = doc
    for part in loc:
        try:
            cur = cur[part]
        except (KeyError, IndexError, TypeError):
            return None
    return cur


def _stand_in(doc: Doc, locs: list[Loc]) -> Doc | None:
    """A copy of doc with a stand-in at each of locs (required fields left without a value), or
    None when one of them has no stand-in."""
    import copy

    if not locs or any(not loc or loc[-1] not in _STAND_INS for loc in locs):
        return None
    out = copy.deepcopy(doc)
    for n, loc in enumerate(locs, start=1):
        parent = _value_at(out, loc[:-1])
        if not isinstance(parent, dict):
            return None
        parent[str(loc[-1])] = _STAND_INS[str(loc[-1])].format(n=n)
    return out


def _drop(doc: Doc, locs: list[Loc]) -> Doc | None:
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


def load_file(path: str | Path, missing_fix: str = "pass an existing profile file") -> Loaded:
    """The profile in a file the user named; `missing_fix` says what to do when it is not one (the
    command's own words: `tp4 plan` can fall back to its default, `profile check` cannot)."""
    text = read_input(path, "profile", missing_fix)
    return load_text(text, str(path))


def load_default() -> Loaded:
    return load_text(DEFAULT_PROFILE.read_text(), "embedded default profile")
