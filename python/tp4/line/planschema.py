"""docs/plan-schema.md, generated from the Plan's types (tp4.line.plan) and the knob table (tp4.line.knobs):
a JSON Schema of `tp4 plan --json`, a table per part and the environment keys. A test keeps the
file equal to `python -m tp4.line.planschema`.
"""

from __future__ import annotations

import json
import sys
import types
import typing
from typing import Annotated, Literal, Union, get_args, get_origin, get_type_hints

from tp4.line import plan as planmod
from tp4.line.knobs import KNOBS, LAUNCHER_VARS, Knob
from tp4.line.plan import SCHEMA, Plan

JsonSchema = dict[str, object]


def _is_part(tp: object) -> bool:
    """A plan part: a NamedTuple class of tp4.line.plan."""
    return isinstance(tp, type) and issubclass(tp, tuple) and hasattr(tp, "_fields")


def _fields(tp: type) -> list[tuple[str, object, str]]:
    """A part's fields: name, type, meaning (the string in its Annotated type)."""
    out = []
    for name, hint in get_type_hints(tp, vars(planmod), include_extras=True).items():
        meaning = ""
        if get_origin(hint) is Annotated:
            hint, *extras = get_args(hint)
            meaning = " ".join(str(e) for e in extras)
        out.append((name, hint, meaning))
    return out


def _parts(root: type) -> list[type]:
    """The parts of the plan, each once, in the order they are first reached from root."""
    out: list[type] = []

    def visit(tp: object) -> None:
        if _is_part(tp):
            assert isinstance(tp, type)
            if tp in out:
                return
            out.append(tp)
            for _, hint, _ in _fields(tp):
                visit(hint)
        for arg in get_args(tp):
            visit(arg)

    visit(root)
    return out


def _schema(tp: object) -> JsonSchema:
    origin, args = get_origin(tp), get_args(tp)
    if tp is str:
        return {"type": "string"}
    if tp is bool:
        return {"type": "boolean"}
    if tp is int:
        return {"type": "integer"}
    if tp is type(None):
        return {"type": "null"}
    if origin is Literal:
        return {"enum": list(args)}
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        return {"type": "array", "items": _schema(args[0])}
    if origin is dict and args[0] is str:
        return {"type": "object", "additionalProperties": _schema(args[1])}
    if origin in (Union, types.UnionType):
        return {"anyOf": [_schema(a) for a in args]}
    if _is_part(tp):
        assert isinstance(tp, type)
        return {"$ref": f"#/$defs/{tp.__name__}"}
    raise TypeError(f"no JSON Schema for {tp!r}: give the plan part a plain type")


def _object(tp: type) -> JsonSchema:
    fields = _fields(tp)
    props: dict[str, JsonSchema] = {name: {**_schema(hint), "description": meaning} for name, hint, meaning in fields}
    return {
        "type": "object",
        "description": _doc(tp),
        "properties": props,
        "required": [name for name, _, _ in fields],
        "additionalProperties": False,
    }


def _doc(tp: type) -> str:
    text = tp.__doc__ or ""
    # a NamedTuple without a docstring gets its signature as __doc__
    return "" if text.startswith(tp.__name__ + "(") else " ".join(text.split())


DIGEST_MEANING = (
    "`sha256:` and the SHA-256 of the plan's canonical JSON (keys sorted, no whitespace, UTF-8) "
    "without `digest` and `source` (python/tp4/line/plan.py digest_of); secrets are file references, so it holds none"
)


def json_schema() -> JsonSchema:
    """The JSON Schema (draft 2020-12) of `tp4 plan --json`."""
    root = _object(Plan)
    props = typing.cast(dict[str, JsonSchema], root["properties"])
    root["properties"] = {
        "schema": {"const": SCHEMA, "description": "this schema's version"},
        "digest": {"type": "string", "pattern": "^sha256:[0-9a-f]{64}$", "description": DIGEST_MEANING},
        **props,
    }
    root["required"] = ["schema", "digest", *typing.cast(list[str], root["required"])]
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": f"tp4 plan ({SCHEMA})",
        **root,
        "$defs": {tp.__name__: _object(tp) for tp in _parts(Plan) if tp is not Plan},
    }


def _type_words(tp: object) -> str:
    origin, args = get_origin(tp), get_args(tp)
    if origin is Literal:
        return " \\| ".join(json.dumps(a) for a in args)
    if origin is tuple:
        return f"array of {_type_words(args[0])}"
    if origin is dict:
        return f"object of {_type_words(args[1])}"
    if origin in (Union, types.UnionType):
        return " or ".join(_type_words(a) for a in args)
    if tp is type(None):
        return "null"
    if _is_part(tp):
        assert isinstance(tp, type)
        return f"[{tp.__name__}](#{tp.__name__.lower()})"
    names: dict[object, str] = {str: "string", int: "integer", bool: "boolean"}
    return names.get(tp, str(tp))


def _ranks(k: Knob) -> str:
    if k.head_only:
        return "head"
    if k.worker_value is not None:
        return f"all (workers: `{k.worker_value}`)"
    if k.head_field is not None:
        return f"all (head: `{k.head_field}` when set)"
    return "all"


def _from(k: Knob) -> str:
    if k.source == "reserved":
        return f"never set by a profile: {k.owner}" + (f" (always `{k.value}`)" if k.value else "")
    if k.source == "rank":
        return f"per rank: {k.owner}"
    if k.form == "fixed":
        when = f" when `{k.when_field}` = `{k.when_equals}`" if k.when_field else ""
        return f"fixed `{k.value}`{when}"
    how = {"comma": " (joined with ',')", "words": " (joined with ' '; absent when empty)"}.get(k.form, "")
    omit = f"; absent at boot.py's default `{k.omit_if}`" if k.omit_if else ""
    return f"`{k.field}`{how}{omit}"


INTRO = """\
# `tp4 plan --json`: schema `{schema}`

<!-- generated by `python -m tp4.line.planschema` from python/tp4/line/plan.py and python/tp4/line/knobs.py; a test keeps it current -->

The plan is the one rendering of a profile. Everything that starts, checks or describes the line
(serve, doctor, the NixOS rank unit, the boot-log check, bench) reads it; none re-derives a flag.
Its parts are typed, immutable NamedTuples (python/tp4/line/plan.py) and this page and the JSON Schema
below are generated from them. Fields are only added under a new minor version, never renamed or
removed within `tp4.plan/1`:

- 1.1 added `notes`;
- 1.2 added `nodes[].gid` (where each node's RoCE v2 GID index comes from);
- 1.3 added `nodes[].service` (how each node runs its rank);
- 1.4 added `nodes[].service.mesh_unit`;
- 1.5 added `nodes[].run.health` (the image's health check, which podman is given as flags).
- 1.6 added `line.gpu_clock_mhz` and `line.nccl_sha256` (the SM clock cap and the host NCCL's pin, which doctor checks).
- 1.7 added `digest` (the plan's digest, which every rank of a line started from it carries as the
  container label `tp4.plan`).
- 1.8 added what a NixOS host reads from the committed plan instead of the profile: `line.id`, `line.api_port`, `line.dist_init_port`, `line.nfs` (the head's export, each worker's server address, the export and mount options), `line.ring_hairpin_queue`, and per rank `service.ready`, `service.directories`, `service.gpu_devices` and `service.host_units`.
- 1.9 added `line.nfs.volumes` (each worker's weights volume options, which tp4 share and a NixOS worker make alike).
- 1.10 lets `nodes[].ssh.identity` be null: a profile that names no key lets ssh choose its own (no `-i`),
  and `nodes[].ssh.user` defaults to the local user running tp4.

Rules the types do not show:
- `digest` is computed over every other field except `source` (one profile, one digest, wherever
  its file lies). Every rank `tp4 serve` starts carries it as the container label `tp4.plan` (a
  NixOS rank's unit sets the same label from this JSON), and serve leaves this JSON beside the
  rank's env file (`<env file without .env>.plan.json`, mode 0600): `tp4 status` and
  `tp4 plan --against-running` name the fields in which the running plan differs from the current one.
- `env` holds every variable the upstream TP4 launcher passes, adapter gates with their launcher
  defaults replaced in place by the profile's `[gates]` (EXTRA_CONTAINER_ENV semantics), then
  `[env]`, then the per-rank keys. Workers never carry head-only keys and always get the worker
  values (see Environment keys).
- `argv` never contains `--api-key`: boot.py adds it from the key file at serve time, and the key
  never appears in a plan, a log or an argv. Workers get no API key at all.
- `notes`: rolling a layer back is one change. A gate the preset sets that needs a gate the
  profile turns off is left out of `env` (upstream's adapter does nothing without it), and so is
  one the change leaves inert (`DSV41_FAST_LOAD_TP_SLICE=auto` at EP 2: a registry warning rule
  on the gate says when it stops acting), and a preset gate that only restates a setting follows it (`DSV41_FAST_LOAD_EP_SIZE` follows
  `engine.ep`); each such gate gets a note. A gate the profile sets itself is never changed: the
  validator reports what it needs. The presets' and the profile's `engine.extra_args` add up:
  a note names the layer (`preset NAME`, `the profile`) each argument of `EXTRA_SGLANG_ARGS`
  comes from, and each inherited argument a layer's `engine.drop_args` removed.
- `gid`: upstream's launcher looks each node's RoCE v2 GID index up when it starts the line. The
  plan renders the profile's index (`fabric.gid_index`, default 3, or the node's own
  `gid_index`); unless the node pins it, the commands in `lookup_by` read the node's GID table at
  start and use the index found there.
- `boot_lines` with `required: false` are useful evidence, not a gate of the line's health.
"""


def generate() -> str:
    out = [INTRO.format(schema=SCHEMA)]
    for tp in _parts(Plan):
        out += [f"## {tp.__name__}", ""]
        if _doc(tp):
            out += [_doc(tp), ""]
        out += ["| field | type | meaning |", "|---|---|---|"]
        if tp is Plan:
            out.append(f'| `schema` | `"{SCHEMA}"` | this schema\'s version |')
            out.append(f"| `digest` | string | {DIGEST_MEANING} |")
        for name, hint, meaning in _fields(tp):
            out.append(f"| `{name}` | {_type_words(hint)} | {meaning.replace('|', chr(92) + '|')} |")
        out.append("")
    out += [
        "## Environment keys",
        "",
        "Every key the renderer puts into a rank's container environment besides the adapter gates "
        "(adapters/registry.toml), in the order they are rendered (python/tp4/line/knobs.py).",
        "",
        "| key | value from | ranks | ring only | upstream launcher passes it | engine flag |",
        "|---|---|---|---|---|---|",
    ]
    for k in KNOBS:
        flag = ", ".join(f"`{f}`" for f in (k.flag, *k.aliases) if f) or ""
        out.append(
            f"| `{k.env}` | {_from(k)} | {_ranks(k)} | {'yes' if k.ring_only else ''} | "
            f"{'yes' if k.launcher and k.source != 'reserved' else 'no'} | {flag} |"
        )
    out += [
        "",
        "`tp4 profile import` reads these keys (and the launcher's own variables below) from an "
        "upstream `.env` file into the fields named.",
        "",
        "| launcher variable | profile field |",
        "|---|---|",
    ]
    out += [f"| `{v.var}` | `{v.field}` |" for v in LAUNCHER_VARS]
    out += ["", "## JSON Schema", "", "```json", json.dumps(json_schema(), indent=2), "```", ""]
    return "\n".join(out)


if __name__ == "__main__":
    sys.stdout.write(generate())
