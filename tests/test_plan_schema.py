"""The Plan contract: docs/plan-schema.md is generated from the types and stays current; every
plan tp4 renders conforms to the generated JSON Schema; the knob table is the one source of the
env keys, owned flags and fixed container paths."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tp4.line import knobs, planschema
from tp4.line.container import MOUNTS
from tp4.line.plan import SCHEMA, build_plan
from tp4.line.profile import load_default
from tp4.line.profile.load import parse_document
from tp4.line.profile.models import Profile
from tp4.line.registry import load_registry

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parent.parent


def test_schema_doc_is_generated_from_the_types():
    text = (REPO / "docs" / "plan-schema.md").read_text()
    assert text == planschema.generate(), (
        "docs/plan-schema.md is stale: run `python -m tp4.line.planschema > docs/plan-schema.md`"
    )


def _conforms(value: object, schema: dict, defs: dict, where: str = "plan") -> list[str]:
    """A strict validator for the subset of JSON Schema planschema emits."""
    if "$ref" in schema:
        return _conforms(value, defs[schema["$ref"].rsplit("/", 1)[1]], defs, where)
    if "anyOf" in schema:
        results = [_conforms(value, s, defs, where) for s in schema["anyOf"]]
        return [] if any(not r for r in results) else [f"{where}: matches none of anyOf ({results})"]
    if "const" in schema:
        return [] if value == schema["const"] else [f"{where}: {value!r} != {schema['const']!r}"]
    if "enum" in schema:
        return (
            []
            if value in schema["enum"] and type(value) in {type(e) for e in schema["enum"]}
            else [f"{where}: {value!r} not in {schema['enum']}"]
        )
    kind = schema["type"]
    checks = {
        "string": lambda v: isinstance(v, str),
        "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "boolean": lambda v: isinstance(v, bool),
        "null": lambda v: v is None,
        "array": lambda v: isinstance(v, list),
        "object": lambda v: isinstance(v, dict),
    }
    if not checks[kind](value):
        return [f"{where}: {value!r} is not {kind}"]
    problems: list[str] = []
    if kind == "array":
        for i, item in enumerate(value):
            problems += _conforms(item, schema["items"], defs, f"{where}[{i}]")
    if kind == "object":
        props = schema.get("properties")
        if props is not None:
            problems += [f"{where}: missing {k}" for k in schema["required"] if k not in value]
            problems += [f"{where}: unexpected {k}" for k in value if k not in props]
            for k, v in value.items():
                if k in props:
                    problems += _conforms(v, props[k], defs, f"{where}.{k}")
        else:
            for k, v in value.items():
                problems += _conforms(v, schema["additionalProperties"], defs, f"{where}.{k}")
    return problems


RING = {
    "preset": "production",
    "fabric": {"mode": "ring", "nccl": {"mount": "overlay", "min_nchannels": 4, "max_nchannels": 4}},
    "nfs": {"share": False},
    "api": {"key_file": "/etc/tp4/api-key"},
    "gates": {"DSV41_ROCE_RING": "1", "SGLANG_ROCE_MAX_SIZE": "262144", "DSV41_ROCE_GATHER": "262144"},
    "cluster": {
        "head": {"name": "a", "ip": "10.0.0.1", "gid_index": 5},
        "workers": [{"name": "b", "ip": "10.0.0.2"}, {"name": "c", "ip": "10.0.0.3"}, {"name": "d", "ip": "10.0.0.4"}],
    },
}


@pytest.mark.parametrize("which", ["default", "ring"])
def test_rendered_plans_conform_to_the_schema(which):
    loaded = load_default() if which == "default" else parse_document(RING, "ring")
    data = json.loads(json.dumps(build_plan(loaded).to_json()))
    schema = planschema.json_schema()
    assert _conforms(data, schema, schema["$defs"]) == []
    assert data["schema"] == SCHEMA


def test_the_validator_catches_a_wrong_plan():
    schema = planschema.json_schema()
    data = json.loads(json.dumps(build_plan(load_default()).to_json()))
    data["nodes"][1]["role"] = "boss"
    data["nodes"][0]["run"]["mounts"][0]["read_only"] = "no"
    data["line"]["extra"] = 1
    del data["nodes"][2]["gid"]
    problems = _conforms(data, schema, schema["$defs"])
    assert len(problems) == 4, problems


def test_plan_is_frozen():
    plan = build_plan(load_default())
    with pytest.raises(AttributeError):
        plan.nodes[0].rank = 5  # type: ignore[misc]
    with pytest.raises(AttributeError):
        plan.nodes[0].run.mounts[0].source = "/x"  # type: ignore[misc]
    assert isinstance(plan.nodes, tuple) and isinstance(plan.nodes[0].argv, tuple)


def test_gid_index_says_where_it_comes_from():
    plan = build_plan(parse_document(RING, "ring"))
    head, worker = plan.nodes[0].gid, plan.nodes[1].gid
    assert (head.value, head.pinned_by, head.lookup_by) == (5, "cluster.head.gid_index", ())
    assert (worker.value, worker.pinned_by) == (3, None) and worker.lookup_by == ("tp4 serve", "tp4 doctor")
    assert plan.nodes[0].env["NCCL_IB_GID_INDEX"] == "5" and plan.nodes[1].env["NCCL_IB_GID_INDEX"] == "3"
    assert worker.hcas == tuple(parse_document(RING, "ring").profile.fabric.hcas) and worker.hcas


def _resolves(path: str) -> bool:
    cur: object = Profile()
    for part in path.split("."):
        if not hasattr(cur, part):
            return False
        cur = getattr(cur, part)
    return True


def test_every_knob_names_a_real_field():
    for k in knobs.KNOBS:
        for path in (k.field, k.read, k.head_field, k.when_field):
            if path is not None and path != "ep":
                assert _resolves(path), f"{k.env}: {path} is not a profile field"
        assert (k.source == "rank") == (k.rank_value is not None), k.env
        assert (k.form == "fixed") == (k.value is not None), k.env
    for v in knobs.LAUNCHER_VARS:
        assert _resolves(v.field), v.var
    envs = [k.env for k in knobs.KNOBS]
    assert len(envs) == len(set(envs))


def test_every_rendered_key_is_a_knob_or_a_gate():
    reg = load_registry()
    for loaded in (load_default(), parse_document(RING, "ring")):
        for node in build_plan(loaded).nodes:
            for key in node.env:
                assert key in knobs.BY_ENV or reg.gate(key) is not None or key in loaded.profile.env, key


def test_owned_flags_come_from_the_knobs():
    flags = knobs.owned_flags()
    loaded = load_default()
    argv = build_plan(loaded).nodes[1].argv
    rendered = {a for a in argv if a.startswith("--")} - set(loaded.profile.engine.extra_args)
    fixed = {
        "--trust-remote-code",
        "--load-format",
        "--random-seed",
        "--enable-decoder-swa-bounded-replay",
        "--tool-call-parser",
        "--reasoning-parser",
    }
    assert rendered - fixed <= set(flags), rendered - fixed - set(flags)
    assert flags["--tp"] == "engine.tp" and flags["--api-key"] == "api.key_file" and flags["--ep"] == "engine.ep"


def test_container_paths_have_one_home():
    """Python reads tp4/data/container.toml (the Nix side: tests/test_container_paths.py)."""
    plan = build_plan(load_default())
    assert {m.target for m in plan.nodes[0].run.mounts} >= {MOUNTS.model, MOUNTS.state, MOUNTS.engram, MOUNTS.cache}
    assert plan.nodes[0].env["MODEL_PATH"] == MOUNTS.model and plan.nodes[0].env["STATE_PATH"] == MOUNTS.state
