"""Hostile values (issue 25, items 9 and 10): values that passed but must not (numbers the consumer
reads differently, addresses that are not addresses, words longer than the kernel takes) and
messages that misled. Each is refused as a user error naming the field, with the fix."""

from __future__ import annotations

import pytest

from test_hostile_input import INTERNAL, assert_user_error, at, doc, problems, refused

pytestmark = pytest.mark.unit


def refused_with(d: dict, field: str, *words: str) -> str:
    """Some problem on field holds every word (a gate may fail a rule as well as its own check)."""
    mine = [p for p in problems(d) if p.startswith(f"{field}:")]
    assert any(all(w in p for w in words) for p in mine), (field, words, mine)
    return mine[0]


# --- gate values: parsed as the launcher reads them (ASCII digits, finite floats, bounded) -------

INT_GATE = "DSV41_ENGRAM_DRM_LAYER"  # kind int, min 0 (adapters/registry.toml)
FLOAT_GATE = "DSV41_L2_PREFETCH_MB"  # kind float, min 0.0


@pytest.mark.parametrize("value", ["٣", " 3", "3 ", "+3", "3_000", "-0", "007", "9" * 4000, "0x10", "3.0", "１"])
def test_an_integer_gate_takes_plain_ascii_digits_only(value):
    refused_with(doc(gates={INT_GATE: value}), f"gates.{INT_GATE}", "whole number", "ASCII")


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e400", "NaN", " 1", "1_0", "٣.5", "0x1p3", "1e"])
def test_a_float_gate_takes_finite_ascii_numbers_only(value):
    refused_with(doc(gates={FLOAT_GATE: value}), f"gates.{FLOAT_GATE}", "finite number")


def test_a_negative_where_the_gate_has_a_minimum_names_the_minimum():
    refused_with(doc(gates={INT_GATE: "-3"}), f"gates.{INT_GATE}", "at least 0")


@pytest.mark.parametrize("value", ["0", "3", "123456789012345678"])
def test_plain_integers_still_pass(value):
    from tp4.line.registry import load_registry

    assert load_registry().gate(INT_GATE).check(value) is None


@pytest.mark.parametrize("value", ["0", "0.5", "12.", ".5", "1e3", "2.5E-1"])
def test_plain_floats_still_pass(value):
    from tp4.line.registry import load_registry

    assert load_registry().gate(FLOAT_GATE).check(value) is None
