"""What every contract shares: the model bases, the JSON Schema of a model, and a pydantic
ValidationError said as tp4 says bad input (the field's path, what it is, what it should be)."""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

JsonSchema = dict[str, Any]


class Closed(BaseModel):
    """A document tp4 alone writes: every field named, no other key."""

    model_config = ConfigDict(
        extra="forbid", strict=True, frozen=True, json_schema_serialization_defaults_required=True
    )


class Open(BaseModel):
    """An object of a format tp4 shares with another program (sparkDash): the fields tp4 writes
    and reads are named and typed; other keys are kept as they are."""

    model_config = ConfigDict(extra="allow", strict=True)


def version(schema: str) -> Any:
    """A document's `schema` field: the version from tp4.core.schemas, checked against the field's
    Literal at every construction (mypy wants the Literal spelled out; a mismatch fails at once)."""
    return Field(schema, alias="schema", validate_default=True, description="This document's version.")


class Bad:
    """A JSON value no finite 64-bit number holds (NaN, 1e400, a 30-digit integer), kept by the
    reader (tp4.measuring.report) so the model refuses it with its field's name."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def __repr__(self) -> str:
        return f"Bad({self.reason!r})"


def describe(value: object) -> str:
    """A value as an error message names it."""
    if isinstance(value, Bad):
        return value.reason
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"{'true' if value else 'false'} (a boolean)"
    if isinstance(value, str):
        return "a string" if len(value) > 40 else f"the string {value!r}"
    if isinstance(value, list | tuple):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, int | Fraction) or (isinstance(value, float) and math.isfinite(value)):
        return f"the number {float(value):g}"
    return type(value).__name__


def where(loc: tuple[int | str, ...]) -> str:
    """A pydantic error location as a path: ``decode[0].job.results[2].aggregateDecodeTps``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "the document"


_WANTS = {
    "model_type": "an object",
    "model_attributes_type": "an object",
    "dict_type": "an object",
    "list_type": "an array",
    "tuple_type": "an array",
    "string_type": "a string",
    "bool_type": "a boolean",
    "int_type": "a whole number",
    "float_type": "a number",
    "int_from_float": "a whole number",
}


def problem(error: Any) -> tuple[str, str]:
    """One pydantic error (an item of ``ValidationError.errors()``) as (the field's path, what is
    wrong with it)."""
    kind, value, loc = error["type"], error.get("input"), tuple(error["loc"])
    if kind == "missing" or (value is None and kind in _WANTS):
        return where(loc), "is missing"
    if kind == "extra_forbidden":
        return where(loc), "is not a field of this document"
    if kind in _WANTS:
        return where(loc), f"is {describe(value)}, not {_WANTS[kind]}"
    if kind == "literal_error":
        return where(loc), f"is {describe(value)}, not {error['ctx']['expected']}"
    if kind.startswith("tp4_"):
        return where(loc), str(error["msg"])
    return where(loc), f"is {describe(value)}: {error['msg']}"


def problems(exc: ValidationError) -> list[tuple[str, str]]:
    return [problem(e) for e in exc.errors()]


def json_schema(
    model: type[BaseModel],
    title: str,
    schema_id: str | None = None,
    mode: Literal["validation", "serialization"] = "serialization",
) -> JsonSchema:
    """The JSON Schema (draft 2020-12) of a model's JSON: what its writer writes (serialization:
    a field with a default is always there), or what its reader takes (validation)."""
    schema = model.model_json_schema(mode=mode)
    head: JsonSchema = {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": title}
    if schema_id:
        head["$id"] = schema_id
    schema.pop("title", None)
    return {**head, **schema}
