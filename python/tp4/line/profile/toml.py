"""A small TOML writer for profiles: tables, arrays of tables, strings, numbers, booleans and
arrays of scalars; the output is plain TOML that tomllib and Nix's builtins.fromTOML both read."""

from __future__ import annotations

import re
from typing import TypeAlias, TypeGuard

# What the writer takes: a table maps keys to scalars, arrays and tables; a key whose value is
# None is left out (an unset optional field).
TomlValue: TypeAlias = "str | int | float | bool | None | list[TomlValue] | dict[str, TomlValue]"
TomlTable: TypeAlias = "dict[str, TomlValue]"

_BARE = re.compile(r"[A-Za-z0-9_-]+")


def _key(k: str) -> str:
    return k if _BARE.fullmatch(k) else _string(k)


def _string(s: str) -> str:
    out = ['"']
    for ch in s:
        code = ord(ch)
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ch == "\r":
            out.append("\\r")
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\u{code:04x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def _value(v: TomlValue) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, str):
        return _string(v)
    if isinstance(v, list):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    raise TypeError(f"cannot write {type(v).__name__} to TOML")


def _is_table_array(v: TomlValue) -> TypeGuard[list[TomlTable]]:
    return isinstance(v, list) and bool(v) and all(isinstance(x, dict) for x in v)


def _emit(doc: TomlTable, path: list[str], out: list[str]) -> None:
    for k, v in doc.items():
        if v is None or isinstance(v, dict) or _is_table_array(v):
            continue
        out.append(f"{_key(k)} = {_value(v)}")
    for k, v in doc.items():
        sub = [*path, _key(k)]
        if isinstance(v, dict):
            out.append("")
            out.append(f"[{'.'.join(sub)}]")
            _emit(v, sub, out)
        elif _is_table_array(v):
            for item in v:
                out.append("")
                out.append(f"[[{'.'.join(sub)}]]")
                _emit(item, sub, out)


def dumps(doc: TomlTable) -> str:
    out: list[str] = []
    _emit(doc, [], out)
    text = "\n".join(out).lstrip("\n")
    return text + "\n"
