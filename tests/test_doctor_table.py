"""Doctor's checks are a table: every CHECKS id has exactly one function (RUNS, registered by
@node_check / @line_check beside it), and evaluate runs each of them, in the order of CHECKS, each
adding results under its own id only. Fast: no cluster (tests/test_doctor.py runs them on one)."""

from __future__ import annotations

import inspect

import pytest

from tp4.hosts import doctor
from tp4.line.plan import build_plan
from tp4.line.profile import load_default

pytestmark = pytest.mark.unit


def test_every_check_id_has_exactly_one_function_and_every_function_an_id():
    ids = [c.id for c in doctor.CHECKS]
    assert len(ids) == len(set(ids))
    assert sorted(doctor.RUNS) == sorted(ids)
    functions = [run.run for run in doctor.RUNS.values()]
    assert len(functions) == len(set(functions)), "one function registered for two ids"


def test_a_node_check_takes_a_node_and_a_line_check_the_line():
    for check, run in doctor.RUNS.items():
        params = list(inspect.signature(run.run).parameters)
        assert params == (["ctx", "r", "f"] if run.per_node else ["ctx"]), (check, params)


@pytest.mark.parametrize("check", ["NO.SUCH_CHECK", "RDMA.MTU"])
def test_an_unknown_or_second_registration_is_refused(check):
    with pytest.raises(AssertionError):
        doctor.node_check(check)(lambda ctx, r, f: None)
    assert check not in doctor.RUNS or doctor.RUNS[check].run.__name__ != "<lambda>"


def _context(sections: dict[str, list[str]]) -> tuple[doctor.Context, dict[str, doctor.Facts]]:
    plan = build_plan(load_default())
    facts = {r.name: doctor.Facts(sections=dict(sections), received=1000.0) for r in plan.nodes}
    return doctor.Context(plan, facts, doctor.Limits(), ranks=list(plan.nodes), up=list(plan.nodes)), facts


@pytest.mark.parametrize("check", [c.id for c in doctor.CHECKS[1:]])
def test_each_function_judges_its_own_check_on_every_node(check):
    """Run alone on nodes that said nothing (but the time), a check gives one result per node, under
    its own id."""
    ctx, facts = _context({"date": ["1000.0"]})
    run = doctor.RUNS[check]
    if run.per_node:
        for r in ctx.up:
            run.run(ctx, r, facts[r.name])
    else:
        run.run(ctx)
    assert {x.check for x in ctx.results} == {check}
    assert sorted(x.node for x in ctx.results) == sorted(r.name for r in ctx.up)


def test_evaluate_gives_every_check_once_per_node_in_the_tables_order():
    plan = build_plan(load_default())
    facts = {r.name: doctor.Facts(sections={"date": ["1000.0"]}, received=1000.0) for r in plan.nodes}
    facts[plan.nodes[2].name] = doctor.Facts(error="ssh: connect to host spark3: Connection refused")
    results = doctor.evaluate(plan, facts)
    assert [(x.check, x.node) for x in results] == [(c.id, r.name) for c in doctor.CHECKS for r in plan.nodes]
    assert all(x.status == "n/a" for x in results if x.node == plan.nodes[2].name and x.check != "SSH.REACHABLE")
