"""adapters/registry.toml is read strictly: every misspelt key, wrong type, unknown kind,
duplicate gate, bad condition or unknown variable is an error naming the adapter and the entry,
in tp4's words (never pydantic's). The shipped registry loads, and its facts and rule fields are
real settings."""

from __future__ import annotations

import copy
import tomllib
import typing
from typing import Any

import pytest

from tp4.core.errors import InvalidInput
from tp4.line.profile.load import parse_document
from tp4.line.registry import REGISTRY_PATH, Gate, Registry, load_registry, parse_registry

pytestmark = pytest.mark.unit

SHIPPED: dict[str, Any] = tomllib.loads(REGISTRY_PATH.read_text())


def adapter(data: dict[str, Any], name: str) -> dict[str, Any]:
    return next(a for a in data["adapter"] if a["name"] == name)


def gate(data: dict[str, Any], var: str) -> dict[str, Any]:
    return next(g for a in data["adapter"] for g in a.get("gates", []) if g["var"] == var)


def refused(change: typing.Callable[[dict[str, Any]], object]) -> list[str]:
    """The problems of the shipped registry with one change."""
    data = copy.deepcopy(SHIPPED)
    change(data)
    with pytest.raises(InvalidInput) as exc:
        parse_registry(data, "adapter registry t.toml")
    assert exc.value.exit_code == 2
    assert str(exc.value).startswith("adapter registry t.toml is not valid")
    for p in exc.value.problems:
        assert "validation error" not in p and "Input should" not in p and "pydantic" not in p, p
        assert "; fix: " in p, p
    return exc.value.problems


def test_the_shipped_registry_loads():
    reg = load_registry()
    assert isinstance(reg, Registry) and len(reg.adapters) == len(SHIPPED["adapter"])
    assert reg.gate("DSV41_MOE_B12X_NEXT").adapter == "moe_b12x_next"
    assert reg.gate("DSV41_MOE_B12X_NEXT").image == "canary-roce"  # the adapter's
    assert reg.gate("DSV41_VERIFY_CAP").off == ("", "0", "off")  # its own
    assert reg.gate("DSV41_FAST_LOAD").off == tuple(SHIPPED["off_values"])  # the registry's
    assert reg.gate("DSV41_FAST_LOAD").launcher == "tp4"
    # gates are frozen
    with pytest.raises(Exception):  # noqa: B017 (pydantic's frozen-instance error)
        reg.gate("DSV41_FAST_LOAD").kind = "text"  # type: ignore[misc]


def test_the_facts_are_settings_tp4_renders():
    from tp4.line.knobs import typed_env_keys

    reg = load_registry()
    assert set(reg.facts) <= set(typed_env_keys()) | {"RING_ROCE_CAP"}


def test_every_rule_field_is_a_gate_or_a_profile_field():
    from tp4.line.profile.models import Profile

    reg = load_registry()
    for rule in reg.rules:
        if rule.field.startswith("gates."):
            assert rule.field.removeprefix("gates.") in reg.gates, rule
            continue
        model: Any = Profile
        for part in rule.field.split("."):
            assert part in model.model_fields, rule
            model = model.model_fields[part].annotation


def test_one_form_of_dependency_with_the_gate_needs_derived():
    reg = load_registry()
    assert reg.needs_of("DSV41_MOE_B12X_NEXT_DETERMINISTIC") == ("DSV41_MOE_B12X_NEXT",)
    assert reg.needs_of("DSV41_AB_V3") == ("DSV41_AB_VARIANTS>=2",)
    assert reg.needs_of("DSV41_MOE_B12X_NEXT") == ()
    # a rule with its own `when` is no plain dependency of the gate
    glue = [r for r in reg.rules if r.field == "gates.DSV41_EAGER_GLUE"]
    assert glue and all(r.dependent is None for r in glue)
    assert glue[0].fix == 'set gates.DSV41_FOLDED_FENCE = "1", or leave fence out of gates.DSV41_EAGER_GLUE'


def test_a_family_is_one_gate_written_with_n():
    reg = load_registry()
    family = reg.gates["DSV41_AB_V<n>"]
    assert family.family and reg.gate("DSV41_AB_V0") is family and reg.gate("DSV41_AB_V12") is family
    assert reg.gate("DSV41_AB_V<n>") is None and reg.gate("DSV41_AB_VN") is None
    assert "DSV41_AB_V0, DSV41_AB_V1" in reg.hint("DSV41_AB_VN")
    assert "DSV41_AB_V0, DSV41_AB_V1" in reg.hint("DSV41_AB_V<n>")
    assert reg.hint("DSV41_AB_VARIANTZ") == "did you mean DSV41_AB_VARIANTS?"


def test_a_profile_that_writes_the_family_literally_gets_the_real_form():
    d = {
        "preset": "launcher-defaults",
        "cluster": {
            "head": {"name": "spark1", "ip": "10.0.0.1"},
            "workers": [{"name": f"spark{i}", "ip": f"10.0.0.{i}"} for i in (2, 3, 4)],
        },
        "gates": {"DSV41_AB_VN": "x", "DSV41_AB_V1": "DSV41_L2_PREFETCH=1"},
    }
    with pytest.raises(InvalidInput) as exc:
        parse_document(d, "t.toml")
    problems = exc.value.problems
    assert any(
        p.startswith("gates.DSV41_AB_VN: is not an adapter gate") and "e.g. DSV41_AB_V0, DSV41_AB_V1" in p
        for p in problems
    ), problems
    # the member is a gate, and the family's rule applies to it by its own name
    assert any(
        p.startswith("gates.DSV41_AB_V1: needs DSV41_AB_VARIANTS>=2; fix: set gates.DSV41_AB_VARIANTS")
        for p in problems
    ), problems
    d["gates"] = {"DSV41_AB_V1": "DSV41_L2_PREFETCH=1", "DSV41_AB_VARIANTS": "2"}
    parse_document(d, "t.toml")


def test_the_reference_shows_the_family_as_it_is_written():
    from tp4.line.profile.reference import generate

    text = generate()
    assert "`DSV41_AB_V<n>`" in text and "n = 0, 1, …" in text and "DSV41_AB_VN" not in text


# --- each kind of mistake, named by adapter and entry ---------------------------------------------


def test_a_misspelt_gate_key_is_named_with_the_key_it_meant():
    problems = refused(lambda d: gate(d, "DSV41_ENGRAM_DRM_MIB").update(neds=["DSV41_ENGRAM_DRM_NODE"]))
    assert problems == [
        "adapter engram_backend, gate DSV41_ENGRAM_DRM_MIB: unknown key 'neds'; fix: did you mean 'needs'? "
        '(a dependency is a rule now: add { when = ["<this gate>"], needs = "..." } to the adapter\'s rules)'
    ]
    problems = refused(lambda d: gate(d, "DSV41_FAST_LOAD").update(defualt="1"))
    assert problems == ["adapter fast_load, gate DSV41_FAST_LOAD: unknown key 'defualt'; fix: did you mean 'default'?"]


def test_an_unknown_key_elsewhere_is_named_too():
    assert refused(lambda d: adapter(d, "fast_load").update(sumary="x")) == [
        "adapter fast_load: unknown key 'sumary'; fix: did you mean 'summary'?"
    ]
    assert refused(lambda d: adapter(d, "eager_glue")["rules"][1].update(lvl="warning")) == [
        "adapter eager_glue, rule 2 (when DSV41_EAGER_GLUE~fence): unknown key 'lvl'; fix: did you mean 'level'?"
    ]
    assert refused(lambda d: adapter(d, "engine")["boot"][0].update(requried=False)) == [
        "adapter engine, boot line 1: unknown key 'requried'; fix: did you mean 'required'?"
    ]
    assert refused(lambda d: d.update(forbiden_lines=[])) == [
        "top level: unknown key 'forbiden_lines'; fix: did you mean 'forbidden_lines'?"
    ]
    # keys tp4 fills from the adapter are not keys of a gate
    assert refused(lambda d: gate(d, "DSV41_FAST_LOAD").update(adapter="other")) == [
        "adapter fast_load, gate DSV41_FAST_LOAD: unknown key 'adapter'; fix: remove it (allowed: var, kind, image, values, pattern, form, min, max, off, default, forwarded)"
    ]


def test_the_old_layout_gets_the_new_form_as_its_fix():
    def old(d: dict[str, Any]) -> None:
        d["rule"] = [{"field": "gates.X", "when": ["X"], "needs": "Y"}]
        adapter(d, "ab_variant")["gate_prefixes"] = [{"prefix": "DSV41_AB_V", "kind": "text"}]

    problems = refused(old)
    assert (
        "top level: unknown key 'rule'; fix: rules belong to an adapter now: move each to the rules of the adapter whose gate it checks"
        in problems
    )
    assert any(
        p.startswith("adapter ab_variant: unknown key 'gate_prefixes'; fix: a family is a gate whose var ends in <n>")
        for p in problems
    )
    assert refused(lambda d: d.update(schema=1)) == [
        "top level: schema 1 is not this layout (schema = 2); fix: migrate the file to schema 2 (see its header)"
    ]


def test_an_unknown_kind_is_refused_with_the_kind_it_meant():
    problems = refused(lambda d: gate(d, "DSV41_FAST_LOAD").update(kind="swtich"))
    assert problems == [
        "adapter fast_load, gate DSV41_FAST_LOAD: kind 'swtich' is not one of switch, int, float, enum, list, text, path; fix: did you mean 'switch'?"
    ]
    problems = refused(lambda d: adapter(d, "fast_load")["rules"][2].update(level="warn"))
    assert problems == [
        "adapter fast_load, rule 3 (when DSV41_FAST_LOAD, DSV41_FAST_LOAD_TP_SLICE=auto): level 'warn' is not one of error, warning; fix: did you mean 'warning'?"
    ]


@pytest.mark.parametrize(
    "key,value,what",
    [
        ("min", "1", "min must be a number (got '1')"),
        ("min", True, "min must be a number (got True)"),
        ("forwarded", "true", "forwarded must be true or false (got 'true')"),
        ("forwarded", 1, "forwarded must be true or false (got 1)"),
        ("default", 1, "default must be a string (got 1)"),
        ("values", "a,b", "values must be a list (got 'a,b')"),
        ("off", ["", 0], "off[1] must be a string (got 0)"),
    ],
)
def test_a_wrong_type_is_named_with_its_value(key, value, what):
    problems = refused(lambda d: gate(d, "DSV41_FAST_LOAD_SLAB_MB").update({key: value}))
    assert len(problems) == 1 and problems[0].startswith(
        f"adapter fast_load, gate DSV41_FAST_LOAD_SLAB_MB: {what}; fix: "
    ), problems


def test_a_gate_that_contradicts_itself_is_refused():
    assert refused(lambda d: gate(d, "DSV41_FAST_LOAD_SLAB_MB").update(values=["1"])) == [
        "adapter fast_load, gate DSV41_FAST_LOAD_SLAB_MB: values are only for enum and list gates (kind is int); fix: remove values or change kind"
    ]
    assert refused(lambda d: gate(d, "DSV41_FAST_LOAD_TP_SLICE").update(values=[])) == [
        "adapter fast_load, gate DSV41_FAST_LOAD_TP_SLICE: a enum gate needs values; fix: list the allowed values"
    ]
    assert refused(lambda d: gate(d, "DSV41_FAST_LOAD_SLAB_MB").update(max=0)) == [
        "adapter fast_load, gate DSV41_FAST_LOAD_SLAB_MB: min 1 is above max 0; fix: swap them"
    ]
    assert refused(lambda d: gate(d, "DSV41_LOOP_NGRAM").update(default="0")) == [
        "adapter loop_abort, gate DSV41_LOOP_NGRAM: default '0' must be at least 1; fix: give an allowed default"
    ]
    assert refused(lambda d: gate(d, "DSV41_LOOP_NGRAM").pop("default")) == [
        "adapter loop_abort, gate DSV41_LOOP_NGRAM: a forwarded gate needs the default the launcher passes; fix: add default, or remove forwarded"
    ]
    assert refused(lambda d: gate(d, "DSV41_CERT_HEAD_M").update(pattern="([0-9]")) == [
        "adapter cert_head, gate DSV41_CERT_HEAD_M: pattern '([0-9]' is not a regular expression (missing ), unterminated subpattern at position 0); fix: correct it"
    ]
    assert refused(lambda d: gate(d, "DSV41_AB_V<n>").update(default="x", forwarded=True)) == [
        "adapter ab_variant, gate DSV41_AB_V<n>: a family (DSV41_AB_V<n>) is never forwarded and has no default; fix: remove forwarded and default"
    ]


def test_a_duplicate_gate_names_both_adapters():
    problems = refused(lambda d: adapter(d, "hc_fused")["gates"].append({"var": "DSV41_FAST_LOAD", "kind": "switch"}))
    assert problems == ["adapter hc_fused, gate DSV41_FAST_LOAD: is also a gate of adapter fast_load; fix: keep one"]
    problems = refused(lambda d: adapter(d, "hc_fused")["gates"].append({"var": "DSV41_AB_V2"}))
    assert problems == [
        "adapter hc_fused, gate DSV41_AB_V2: is a member of the family DSV41_AB_V<n> (adapter ab_variant); fix: remove one"
    ]
    problems = refused(lambda d: d["adapter"].append({"name": "hc_fused"}))
    assert problems == ["adapter hc_fused: is listed twice; fix: give every adapter its own name"]


def test_a_bad_condition_is_named_with_the_forms_allowed():
    problems = refused(lambda d: adapter(d, "fast_load")["rules"][0].update(when=["DSV41_FAST_LOAD_TP_SLICE >= 1"]))
    assert problems == [
        "adapter fast_load, rule 1 (when DSV41_FAST_LOAD_TP_SLICE >= 1): bad condition 'DSV41_FAST_LOAD_TP_SLICE >= 1'; "
        "fix: write VAR, !VAR, VAR=value, VAR!=value, VAR~item, VAR>=N or VAR<=N"
    ]
    problems = refused(lambda d: adapter(d, "engine")["boot"][1].update(when=["SPEC_ALGO=DSPARK", "1X"]))
    assert problems == [
        "adapter engine, boot line 2: bad condition '1X'; fix: write VAR, !VAR, VAR=value, VAR!=value, VAR~item, VAR>=N or VAR<=N"
    ]
    problems = refused(lambda d: adapter(d, "ab_variant")["rules"][0].update(needs="DSV41_AB_VARIANTS>=two"))
    assert problems == [
        "adapter ab_variant, rule 1 (when DSV41_AB_ALLOW_AA): 'DSV41_AB_VARIANTS>=two' compares with 'two', not a number; fix: write DSV41_AB_VARIANTS>=<number>"
    ]
    problems = refused(lambda d: adapter(d, "eager_glue")["rules"][1].update(when=["DSV41_EAGER_GLUE~fense"]))
    assert problems == [
        "adapter eager_glue, rule 2 (when DSV41_EAGER_GLUE~fense): 'DSV41_EAGER_GLUE~fense' names no item of DSV41_EAGER_GLUE; fix: use one of fence, stage, vcap, vcapk, all"
    ]
    problems = refused(lambda d: adapter(d, "draft_tau")["rules"][0].update(needs="SGLANG_DSPARK_FOLDED_SAMPLING=3"))
    assert problems == [
        "adapter draft_tau, rule 1 (when DSV41_DRAFT_TAU): 'SGLANG_DSPARK_FOLDED_SAMPLING=3': '3' is not a value of SGLANG_DSPARK_FOLDED_SAMPLING; fix: use one of 0, 1, 2"
    ]
    problems = refused(lambda d: adapter(d, "fast_load")["rules"][0].update(when=[]))
    assert problems == ["adapter fast_load, rule 1: when must not be empty; fix: give at least one"]


def test_a_variable_that_is_no_gate_is_named_with_the_gate_it_meant():
    problems = refused(lambda d: adapter(d, "fast_load")["rules"][0].update(needs="DSV41_FAST_LAOD"))
    assert problems == [
        "adapter fast_load, rule 1 (when DSV41_FAST_LOAD_TP_SLICE): DSV41_FAST_LAOD is no gate and no fact; fix: did you mean DSV41_FAST_LOAD?"
    ]
    problems = refused(lambda d: adapter(d, "fast_load")["rules"][0].update(when=["QQQ_ZZZ"]))
    assert (
        problems[0]
        == "adapter fast_load, rule 1 (when QQQ_ZZZ): QQQ_ZZZ is no gate and no fact; fix: name a gate of the registry, or add a variable tp4 renders to facts"
    )
    problems = refused(
        lambda d: adapter(d, "engine")["boot"][0].update(line="chunked_prefill_size={CHUNKED_PREFIL_SIZE}")
    )
    assert problems == [
        "adapter engine, boot line 1: CHUNKED_PREFIL_SIZE is no gate and no fact; fix: did you mean CHUNKED_PREFILL_SIZE?"
    ]
    problems = refused(
        lambda d: adapter(d, "fast_load")["rules"].append({"when": ["DSV41_FAST_LOAD"], "needs": "EP_SIZE=1"})
    )
    assert problems == [
        "adapter fast_load, rule 4 (when DSV41_FAST_LOAD): needs 'EP_SIZE=1' names a fact, not a gate, so no fix can be generated; fix: give fix"
    ]


def test_a_family_is_named_only_where_it_stands_for_each_member():
    problems = refused(lambda d: adapter(d, "engine")["boot"][1].update(when=["DSV41_AB_V<n>"]))
    assert problems == [
        "adapter engine, boot line 2: names the family DSV41_AB_V<n>, which only a rule's when may name (the rule then holds for each member set); fix: name a member, e.g. DSV41_AB_V1"
    ]
    problems = refused(lambda d: adapter(d, "ab_variant")["rules"][0].update(field="gates.DSV41_AB_V<n>"))
    assert problems == [
        "adapter ab_variant, rule 1 (when DSV41_AB_ALLOW_AA): field gates.DSV41_AB_V<n> names a family its when does not; fix: start when with DSV41_AB_V<n>"
    ]


def test_a_misplaced_table_or_moe_key_is_named():
    assert refused(lambda d: d["moe"].update(alig=64)) == ["moe: unknown key 'alig'; fix: did you mean 'align'?"]
    assert refused(lambda d: d["moe"].update(experts=0)) == [
        "moe: experts must be greater than 0 (got 0); fix: give a positive number"
    ]
    assert refused(lambda d: d["adapter"].append("hc_fused")) == [
        f"adapter #{len(SHIPPED['adapter']) + 1}: must be a table (got 'hc_fused'); fix: write {{ key = value, ... }}"
    ]
    assert refused(lambda d: adapter(d, "hc_fused").update(gates={"var": "X"})) == [
        "adapter hc_fused: gates must be a list (got {'var': 'X'}); fix: write [ ... ]"
    ]


def test_several_mistakes_are_reported_at_once():
    def many(d: dict[str, Any]) -> None:
        gate(d, "DSV41_FAST_LOAD").update(kind="swtich")
        gate(d, "DSV41_HC_FUSED").update(neds=["X"])

    assert len(refused(many)) == 2


def test_the_parsed_gate_is_what_the_file_says():
    g = load_registry().gate("DSV41_DRAFT_TAU")
    assert isinstance(g, Gate)
    assert (g.kind, g.min, g.max, g.off, g.default, g.forwarded) == ("float", 0.01, 1.0, ("", "1", "1.0"), "1", True)
    assert g.check("0.7") is None and g.check("2") == "must be at most 1" and g.is_on("0.7") and not g.is_on("1")


# --- the JSON twin: the accepted document, read in place of the TOML while it is the same text ----


def test_the_json_twin_is_the_shipped_registry():
    import hashlib
    import json

    from tp4.line.registry import JSON_TWIN

    twin = json.loads(JSON_TWIN.read_text())
    fix = "registry.toml changed: run `python -m tp4.line.registry --write-json` (it parses it strictly first)"
    assert twin["source_sha256"] == hashlib.sha256(REGISTRY_PATH.read_bytes()).hexdigest(), fix
    # the same document, types included (1.0 stays a float, 1 an int)
    assert json.dumps(twin["document"], sort_keys=True) == json.dumps(SHIPPED, sort_keys=True), fix


def test_the_accepted_registry_is_built_as_the_strict_parse_builds_it():
    from tp4.line.registry import _construct

    fast, strict = _construct(SHIPPED), parse_registry(SHIPPED)
    assert fast == strict and repr(fast) == repr(strict)  # repr: also the types (1.0, not 1; tuples, not lists)
    assert fast.gates == strict.gates and fast.rules == strict.rules and fast.image_checks == strict.image_checks


def test_a_twin_of_other_text_is_not_read(tmp_path, monkeypatch):
    import json

    from tp4.line import registry

    twin = tmp_path / "registry.json"
    twin.write_text(json.dumps({"source_sha256": "0" * 64, "document": {"schema": 2, "adapter": []}}))
    monkeypatch.setattr(registry, "JSON_TWIN", twin)
    load_registry.cache_clear()
    try:
        assert load_registry() == parse_registry(SHIPPED)  # read from the TOML
    finally:
        load_registry.cache_clear()


def test_an_edited_registry_is_parsed_strictly(tmp_path):
    same = tmp_path / "same.toml"
    same.write_bytes(REGISTRY_PATH.read_bytes())
    assert load_registry(str(same)) == load_registry()
    edited = tmp_path / "edited.toml"
    edited.write_text(
        REGISTRY_PATH.read_text().replace(
            '{ var = "DSV41_FAST_LOAD", kind = "switch" }', '{ var = "DSV41_FAST_LOAD", kind = "swtich" }'
        )
    )
    with pytest.raises(InvalidInput) as exc:
        load_registry(str(edited))
    assert exc.value.problems == [
        "adapter fast_load, gate DSV41_FAST_LOAD: kind 'swtich' is not one of switch, int, float, enum, list, text, path; fix: did you mean 'switch'?"
    ]
    assert str(exc.value).startswith(f"adapter registry {edited} is not valid")


def test_an_unreadable_or_broken_registry_is_a_user_error(tmp_path):
    with pytest.raises(InvalidInput, match="cannot read the adapter registry"):
        load_registry(str(tmp_path / "missing.toml"))
    broken = tmp_path / "broken.toml"
    broken.write_text("schema = \n")
    with pytest.raises(InvalidInput, match=f"adapter registry {broken}: "):
        load_registry(str(broken))


def test_a_pattern_gate_says_its_form_in_words():
    """A refused value of a pattern gate is told the form in words with an example that the
    pattern itself accepts; a pattern without form is a registry error."""
    import re as _re

    reg = load_registry()
    pattern_gates = [g for g in reg.gates.values() if g.pattern is not None]
    assert pattern_gates
    for g in pattern_gates:
        assert g.form, g.var
        example = _re.search(r'e\.g\. "([^"]*)"', g.form)
        assert example and _re.fullmatch(g.pattern, example.group(1)), (g.var, g.form)
        reason = g.check("\u00e9 bad value")
        assert reason is not None and g.pattern not in reason and g.form in reason


def test_a_pattern_without_its_form_is_refused():
    problems = refused(lambda d: gate(d, "DSV41_CERT_HEAD_M").pop("form"))
    assert any("DSV41_CERT_HEAD_M" in p and "pattern and form go together" in p for p in problems), problems
