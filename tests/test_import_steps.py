"""The importer is a table of steps (tp4.line.profile.legacy._STEPS): the first converts each variable
on its own through the knob table's import rows (TYPED); each later step names the launcher
variables it reads, which are the knob table's, the launcher's own, or adapter gates. Every
variable the importer says it imports into a field ("imported as ...") is read by a step."""

from __future__ import annotations

import pytest

from tp4.line.knobs import KNOBS, LAUNCHER_VARS
from tp4.line.profile import legacy
from tp4.line.registry import load_registry

pytestmark = pytest.mark.unit


def test_every_variable_imported_as_a_field_is_read_by_a_step():
    read = {v for variables, _ in legacy._STEPS for v in variables}
    imported = {k for k, why in legacy.LAUNCHER_ONLY.items() if why.startswith("imported as")}
    assert imported <= read, imported - read


def test_each_step_reads_only_variables_tp4_knows():
    known = {*legacy.TYPED, *legacy.LAUNCHER_ONLY, *legacy.FIXED, *load_registry().gates}
    for variables, step in legacy._STEPS:
        assert set(variables) <= known, (step.__name__, set(variables) - known)


def test_the_knob_tables_import_rows_are_the_typed_variables():
    rows = {v.var for v in LAUNCHER_VARS} | {k.env for k in KNOBS if k.imports not in (None, "fixed")}
    assert set(legacy.TYPED) == rows


def test_the_steps_run_in_a_fixed_order_each_once():
    names = [step.__name__ for _, step in legacy._STEPS]
    assert names[0] == "_each_variable" and len(names) == len(set(names))
