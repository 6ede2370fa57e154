"""A plan committed as a file (`tp4 plan --json -o plan.json`): what a NixOS host configuration
reads instead of the profile. Written whole or not at all; `tp4 plan --check` says, field by field,
where a committed file differs from the plan the profile renders now."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from tp4.core.errors import InvalidInput

if TYPE_CHECKING:
    from tp4.line.plan import Json, Plan


def plan_text(plan: Plan) -> str:
    return json.dumps(plan.to_json(), indent=2) + "\n"


def write_plan(path: Path, plan: Plan) -> None:
    """Replace `path` with the plan's JSON: a temporary file in the same directory, renamed over it."""
    from tp4.core.userfiles import check_output

    text = plan_text(plan)
    # an existing path is replaced only when it is a regular file (never /dev/zero, a FIFO or a
    # link to nothing: as root, a rename over a device replaces the device)
    check_output(path, "plan -o", force=True)
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise InvalidInput(f"-o {path}: {parent} is not a directory; fix: create it, or write the plan elsewhere")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def read_plan_json(path: Path) -> dict[str, Json]:
    """A plan file's JSON object (bad input: exit 2 naming the file and the fix)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InvalidInput(f"{path}: no such file; fix: write it with tp4 plan --json -o {path}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InvalidInput(f"{path}: not a plan file ({e}); fix: write it with tp4 plan --json -o {path}") from None
    if (
        not isinstance(data, dict)
        or not isinstance(data.get("schema"), str)
        or not data["schema"].startswith("tp4.plan/")
    ):
        raise InvalidInput(
            f"{path}: not a tp4 plan (no tp4.plan/ schema); fix: write it with tp4 plan --json -o {path}"
        )
    return data


def _show(v: Json) -> str:
    text = json.dumps(v)
    return text if len(text) <= 120 else text[:117] + "..."


def _line(where: str, old: Json, new: Json) -> str:
    if new is None:
        return f"{where}: in the file, no longer rendered"
    if old is None:
        return f"{where}: missing from the file, rendered as {_show(new)}"
    return f"{where}: the file has {_show(old)}, the profile renders {_show(new)}"


def stale(path: Path, plan: Plan) -> list[str]:
    """The differences between the plan file at `path` and `plan` ([] when the file is current)."""
    from tp4.line.plan import differences

    return [_line(*d) for d in differences(read_plan_json(path), plan.to_json())]


def _value(tp: object, data: object, where: str) -> object:
    """`data` (JSON) as a value of the plan type `tp`; a value of the wrong shape fails naming it."""
    import types
    from typing import Annotated, Any, Literal, Union, get_args, get_origin, get_type_hints

    from tp4.line import plan as planmod

    origin, args = get_origin(tp), get_args(tp)
    if origin is Annotated:
        return _value(args[0], data, where)
    if origin in (Union, types.UnionType):
        if data is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _value(inner, data, where)
    if origin is Literal:
        if data not in args:
            raise ValueError(f"{where}: {data!r} is not one of {list(args)}")
        return data
    if origin is tuple:
        if not isinstance(data, list):
            raise ValueError(f"{where}: not an array")
        return tuple(_value(args[0], v, f"{where}[{i}]") for i, v in enumerate(data))
    if origin is dict:
        if not isinstance(data, dict):
            raise ValueError(f"{where}: not an object")
        return {str(k): _value(args[1], v, f"{where}.{k}") for k, v in data.items()}
    if isinstance(tp, type) and issubclass(tp, tuple) and hasattr(tp, "_fields"):
        if not isinstance(data, dict):
            raise ValueError(f"{where}: not an object")
        hints = get_type_hints(tp, vars(planmod), include_extras=True)
        part: Any = tp  # a plan part: a NamedTuple class
        fields: tuple[str, ...] = part._fields
        defaults: dict[str, object] = part._field_defaults
        missing = [f for f in fields if f not in data and f not in defaults]
        if missing:
            raise ValueError(f"{where}: no {missing[0]} (a plan of an older schema)")
        return tp(**{f: _value(hints[f], data[f], f"{where}.{f}" if where else f) for f in fields if f in data})
    if tp is bool or tp is int or tp is str:
        if type(data) is not tp:
            raise ValueError(f"{where}: {data!r} is not a {tp.__name__}")
        return data
    raise ValueError(f"{where}: no reader for {tp!r}")


def load_plan(path: Path) -> Plan:
    """The Plan a plan file holds (`tp4 plan --json -o FILE`), typed as build_plan returns it."""
    from tp4.line.plan import Plan

    data = read_plan_json(path)
    body = {k: v for k, v in data.items() if k != "schema"}
    try:
        value = _value(Plan, body, "")
    except ValueError as e:
        raise InvalidInput(f"{path}: {e}; fix: write it again with this tp4 (tp4 plan --json -o {path})") from None
    assert isinstance(value, Plan)
    return value
