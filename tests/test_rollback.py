"""Rollback is one change (the seed's "Rollback" section): every row is a profile change that
leaves a valid plan whose env and argv are what upstream's launcher gives for the same change to
the production .env.tp4 (tests/upstream_oracle.py over real bash).

A gate the preset sets that needs a gate the change turns off is dropped from the plan with a
note (upstream's adapter does nothing then); the upstream .env of a row leaves those items out of
EXTRA_CONTAINER_ENV, and the test also states exactly where that differs from the literal
one-line upstream change."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from tp4.core.errors import InvalidInput
from tp4.line.plan import build_plan
from tp4.line.profile.load import DEFAULT_PROFILE, merge, parse_document, strict
from upstream_oracle import bash_source, upstream_argv, upstream_env

pytestmark = pytest.mark.unit

FIXTURE = Path(__file__).parent / "fixtures" / "env.tp4.production"
EXTRA_LINE_1 = "DSV41_INDEXER_CHUNKED=1"
EXTRA_LINE_2 = "DSV41_INDEXER_CHUNKED=1 SGLANG_DSPARK_FOLDED_SAMPLING=2 SGLANG_RUST_BUILD_MODE=never"


def production_extra() -> list[tuple[str, str]]:
    """The last active EXTRA_CONTAINER_ENV line of the fixture, as (key, value) items."""
    line = [ln for ln in FIXTURE.read_text().splitlines() if ln.startswith('EXTRA_CONTAINER_ENV="')][-1]
    return [tuple(item.split("=", 1)) for item in line.split('"')[1].split()]  # type: ignore[misc]


def upstream_rollback(tmp_path: Path, variables: dict[str, str], extra: dict[str, str | None] | str) -> dict[str, str]:
    """The production .env.tp4 with variables reassigned (bash: the last assignment wins) and
    EXTRA_CONTAINER_ENV items changed in place (None removes an item), or replaced by a line."""
    if isinstance(extra, str):
        line = extra
    else:
        items = [(k, extra.get(k, v)) for k, v in production_extra() if extra.get(k, v) is not None]
        items += [(k, v) for k, v in extra.items() if v is not None and k not in dict(production_extra())]
        line = " ".join(f"{k}={v}" for k, v in items)
    text = FIXTURE.read_text() + "".join(f"{k}={v}\n" for k, v in variables.items()) + f'EXTRA_CONTAINER_ENV="{line}"\n'
    path = tmp_path / f"rollback{len(list(tmp_path.iterdir()))}.env"
    path.write_text(text)
    return bash_source(str(path))


def tp4_plan(change: dict):
    doc = merge(tomllib.loads(DEFAULT_PROFILE.read_text()), change)
    return build_plan(parse_document(doc, "rollback"))


# (row of the seed, profile change, upstream variables, upstream EXTRA_CONTAINER_ENV change,
#  gates the plan drops, gates that follow the change)
ROWS = [
    (
        "EP_SIZE=2 without DSV41_MOE_B12X_NEXT returns the routed MoE to FlashInfer",
        {"engine": {"ep": 2}, "gates": {"DSV41_MOE_B12X_NEXT": "0"}},
        {"EP_SIZE": "2"},
        {"DSV41_MOE_B12X_NEXT": "0"},
        {"DSV41_MOE_B12X_NEXT_DETERMINISTIC", "DSV41_FAST_LOAD_TP_SLICE"},
        {"DSV41_FAST_LOAD_EP_SIZE": "2"},
    ),
    (
        "DSV41_FAST_LOAD=0 restores the stock loader",
        {"gates": {"DSV41_FAST_LOAD": "0"}},
        {},
        {"DSV41_FAST_LOAD": "0"},
        {"DSV41_FAST_LOAD_TP_SLICE"},
        {},
    ),
    (
        "SGLANG_ROCE_ALLREDUCE=0 drops the RDMA transport",
        {"gates": {"SGLANG_ROCE_ALLREDUCE": "0"}},
        {},
        {"SGLANG_ROCE_ALLREDUCE": "0"},
        {"SGLANG_ROCE_MAX_SIZE", "DSV41_ROCE_GATHER"},
        {},
    ),
    (
        "SPARK_PREFILL_TP_SPLIT=0 drops the row split",
        {"gates": {"SPARK_PREFILL_TP_SPLIT": "0"}},
        {},
        {"SPARK_PREFILL_TP_SPLIT": "0"},
        set(),
        {},
    ),
    (
        "IMAGE=dsv41-4x-spark:canary drops the RoCEnante overlay",
        {"preset": "canary"},
        {"IMAGE": "dsv41-4x-spark:canary", "BUILD_DOCKERFILE": "Dockerfile.canary", "EP_SIZE": "2"},
        EXTRA_LINE_2,
        set(),
        {},
    ),
    (
        "IMAGE=dsv41-4x-spark:local drops the branch",
        {"preset": "base"},
        {"IMAGE": "dsv41-4x-spark:local", "BUILD_DOCKERFILE": "Dockerfile", "EP_SIZE": "2"},
        EXTRA_LINE_1,
        set(),
        {},
    ),
    # EXTRA_CONTAINER_ENV="" leaves DSV41_INDEXER_CHUNKED unset, which its adapter reads as off;
    # the profile says so with "0" over the base preset's "1", the same as the line below
    (
        "the earlier TP4 example",
        {
            "preset": "base",
            "engine": {"max_running_requests": 8, "chunked_prefill_size": 1024, "dspark_block_size": 3, "ep": 4},
            "engram": {"cache_gib": 0},
            "gates": {"DSV41_INDEXER_CHUNKED": "0"},
        },
        {
            "IMAGE": "dsv41-4x-spark:local",
            "BUILD_DOCKERFILE": "Dockerfile",
            "MAX_RUNNING_REQUESTS": "8",
            "CHUNKED_PREFILL_SIZE": "1024",
            "DSPARK_BLOCK_SIZE": "3",
            "EP_SIZE": "4",
            "DSV41_CACHE_GIB": "0",
        },
        "DSV41_INDEXER_CHUNKED=0",
        set(),
        {},
    ),
]


def gate_notes(notes):
    """The plan's notes about gates (the others say where each extra engine argument comes from)."""
    return [n for n in notes if not n.startswith("engine.extra_args: ")]


@pytest.mark.parametrize("row,change,variables,extra,dropped,followed", ROWS, ids=[r[0] for r in ROWS])
def test_each_rollback_row_is_one_valid_change_with_upstreams_env(
    tmp_path, row, change, variables, extra, dropped, followed
):
    plan = tp4_plan(change)
    upstream_extra = extra if isinstance(extra, str) else {**extra, **dict.fromkeys(dropped), **followed}
    expected_vars = upstream_rollback(tmp_path, variables, upstream_extra)
    for node in plan.nodes:
        expected = upstream_env(expected_vars, node.rank)
        assert node.env == expected, {
            k: (node.env.get(k), expected.get(k))
            for k in set(node.env) | set(expected)
            if node.env.get(k) != expected.get(k)
        }
        assert list(node.argv) == upstream_argv(expected)
    # the plan says what it drops or adjusts, and nothing else (beside where each extra engine
    # argument comes from)
    assert sorted(n.split(":", 1)[0] for n in gate_notes(plan.notes)) == sorted(
        f"gates.{k}" for k in dropped | set(followed)
    )
    assert all("dropped" in n for n in plan.notes if n.split(":")[0][len("gates.") :] in dropped)
    if not isinstance(extra, str):
        # against the literal one-line upstream change, only the dropped and followed items differ
        literal = upstream_env(upstream_rollback(tmp_path, variables, extra), 0)
        head = plan.nodes[0].env
        assert {k for k in set(literal) | set(head) if literal.get(k) != head.get(k)} == dropped | set(followed)


def test_a_dependent_the_profile_sets_itself_is_still_an_error():
    with pytest.raises(InvalidInput) as exc:
        tp4_plan({"gates": {"SGLANG_ROCE_ALLREDUCE": "0", "SGLANG_ROCE_MAX_SIZE": "1048576"}})
    problems = exc.value.problems
    assert any(
        p.startswith("gates.SGLANG_ROCE_MAX_SIZE: needs SGLANG_ROCE_ALLREDUCE on; fix: set gates.SGLANG_ROCE_ALLREDUCE")
        for p in problems
    ), problems
    assert not any(p.startswith("gates.DSV41_ROCE_GATHER") for p in problems), problems


def test_a_dependent_the_profile_sets_to_the_presets_value_is_still_its_own():
    """Setting a gate in the profile is the user's word even when the preset has the same value:
    turning its needed gate off is then an error, not a silent drop."""
    with pytest.raises(InvalidInput) as exc:
        tp4_plan({"gates": {"DSV41_WO_A_W8": "0", "DSV41_WO_A_W8_MID": "1"}})
    assert any(p.startswith("gates.DSV41_WO_A_W8_MID: needs DSV41_WO_A_W8 on") for p in exc.value.problems)
    plan = tp4_plan({"gates": {"DSV41_WO_A_W8": "0"}})
    assert plan.nodes[0].env.get("DSV41_WO_A_W8_MID", "0") == "0"  # dropped: the launcher's own default


def test_a_preset_gate_can_be_turned_off_with_zero():
    plan = tp4_plan({"gates": {"SGLANG_ROCE_ALLREDUCE": "0", "SGLANG_ROCE_MAX_SIZE": "0"}})
    assert plan.nodes[0].env["SGLANG_ROCE_MAX_SIZE"] == "0"
    assert [n.split(":")[0] for n in gate_notes(plan.notes)] == ["gates.DSV41_ROCE_GATHER"]


def test_the_fast_load_ep_follows_engine_ep_only_when_the_preset_set_it():
    # EP 2 alone keeps b12x_next on (valid: 576 * 2 is a multiple of its 64); the preset's fast-load
    # EP follows engine.ep
    plan = tp4_plan({"engine": {"ep": 2}})
    assert plan.nodes[0].env["DSV41_FAST_LOAD_EP_SIZE"] == "2" and plan.nodes[0].env["DSV41_MOE_B12X_NEXT"] == "1"
    assert [n.split(":")[0] for n in gate_notes(plan.notes)] == [
        "gates.DSV41_FAST_LOAD_TP_SLICE",
        "gates.DSV41_FAST_LOAD_EP_SIZE",
    ]
    with pytest.raises(InvalidInput) as exc:
        tp4_plan({"engine": {"ep": 2}, "gates": {"DSV41_FAST_LOAD_EP_SIZE": "4"}})
    assert any(
        p.startswith('gates.DSV41_FAST_LOAD_EP_SIZE: does not match engine.ep (2); fix: set it to "2"')
        for p in exc.value.problems
    ), exc.value.problems


@pytest.mark.parametrize("row,change", [(r[0], r[1]) for r in ROWS], ids=[r[0] for r in ROWS])
def test_each_rollback_row_is_clean_under_strict(row, change):
    """A rollback row is one change that leaves no warning: a preset gate that stops acting under
    it (DSV41_FAST_LOAD_TP_SLICE=auto only acts at EP 1) is dropped with a note, not warned about."""
    loaded = strict(parse_document(merge(tomllib.loads(DEFAULT_PROFILE.read_text()), change), "rollback"))
    assert loaded.warnings == []


def test_a_gate_the_profile_sets_that_stops_acting_is_still_warned_about():
    loaded = parse_document(
        merge(
            tomllib.loads(DEFAULT_PROFILE.read_text()),
            {"engine": {"ep": 2}, "gates": {"DSV41_MOE_B12X_NEXT": "0", "DSV41_FAST_LOAD_TP_SLICE": "auto"}},
        ),
        "rollback",
    )
    assert any(w.startswith("gates.DSV41_FAST_LOAD_TP_SLICE: auto only acts at EP 1") for w in loaded.warnings), (
        loaded.warnings
    )
    assert build_plan(loaded).nodes[0].env["DSV41_FAST_LOAD_TP_SLICE"] == "auto"


def test_tp4_plan_prints_and_carries_the_notes(tp4_cli, tmp_path):
    profile = tmp_path / "rollback.toml"
    profile.write_text(DEFAULT_PROFILE.read_text() + '\n[gates]\nSGLANG_ROCE_ALLREDUCE = "0"\n')
    code, out, err = tp4_cli("plan", "--profile", str(profile))
    assert code == 0, err
    assert (
        "note: gates.DSV41_ROCE_GATHER: the preset's DSV41_ROCE_GATHER=2097152 is dropped: it needs "
        "SGLANG_ROCE_ALLREDUCE, and the profile turns it off"
    ) in out
    code, out, err = tp4_cli("plan", "--profile", str(profile), "--json")
    assert code == 0, err
    notes = json.loads(out)["notes"]
    assert [n.split(":")[0] for n in gate_notes(notes)] == ["gates.DSV41_ROCE_GATHER", "gates.SGLANG_ROCE_MAX_SIZE"]
