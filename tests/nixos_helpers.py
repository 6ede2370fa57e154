"""Helpers of the NixOS tests: the plan of a profile (the real CLI), and Nix evaluations of
modules/lib with Debian's Nix, offline (tests/sources_helpers' NIX_CONFIG: no substituters, an
empty local flake registry; --readonly-mode: nothing is written to the store)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from sources_helpers.build import nix_env

REPO = Path(__file__).resolve().parent.parent
LIB = REPO / "modules" / "lib"
EXAMPLE = REPO / "examples" / "spark-line"

# boot.kernelPackages.kernel as nixos-dgx-spark builds it (hardware.dgx-spark.useNvidiaKernel, its
# default): modules/dgx-spark.nix lines 28-35 at f1ebf94 override nixpkgs' linux_6_17 with
# version = "${nvidiaKernelVersion}-nvidia" and modDirVersion = nvidiaKernelVersion, and
# kernel-configs/nvidia-kernel-source.nix line 4 sets nvidiaKernelVersion = "6.17.13"
NVIDIA_KERNEL = {"version": "6.17.13-nvidia", "modDirVersion": "6.17.13"}


def plan_file(profile: Path, dest: Path) -> Path:
    """`tp4 plan --json --profile PROFILE` into dest (the CLI of this checkout)."""
    proc = subprocess.run(
        [sys.executable, "-m", "tp4", "plan", "--json", "--profile", str(profile)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO / "python")},
    )
    assert proc.returncode == 0, proc.stderr
    dest.write_text(proc.stdout)
    return dest


def nix_eval(expr: str, tmp: Path) -> tuple[object | None, str]:
    """(the JSON value, "") when the expression evaluates, else (None, nix's error text)."""
    tmp.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        ["nix-instantiate", "--eval", "--strict", "--json", "--readonly-mode", "-E", expr],
        capture_output=True,
        text=True,
        env={**nix_env(tmp), "PATH": os.environ.get("PATH", "/usr/bin:/bin")},
    )
    if proc.returncode != 0:
        return None, proc.stderr
    return json.loads(proc.stdout), ""


def nix_path(p: Path) -> str:
    """A Nix path literal (absolute; quoted through a string when it needs it)."""
    return f"(/. + {json.dumps(str(p.resolve()))})"


def toml(p: Path) -> str:
    return f"(builtins.fromTOML (builtins.readFile {nix_path(p)}))"


def json_file(p: Path) -> str:
    return f"(builtins.fromJSON (builtins.readFile {nix_path(p)}))"


def hosts_expr(plan: Path, hosts: Path | None, **extra: str) -> str:
    """Every host of the line whose plan file is ``plan``: { <name> = lib.host { ... }; };
    ``extra`` are more arguments of lib.host, as Nix expressions. The profile is never read."""
    args = " ".join(f"{k} = {v};" for k, v in extra.items())
    hosts_arg = f"hostsFile = {toml(hosts)};" if hosts else ""
    return (
        f"let l = import {nix_path(LIB)}; plan = {json_file(plan)}; in "
        f"builtins.listToAttrs (map (name: {{ inherit name; value = l.host {{ inherit plan name; {hosts_arg} {args} }}; }}) "
        "(l.hostNames plan))"
    )


def nix_attrs(values: dict[str, str]) -> str:
    """A flat attrset of strings as a Nix expression."""
    return "{ " + " ".join(f"{k} = {json.dumps(v)};" for k, v in values.items()) + " }"


def systemd_exec_argv(line: str) -> list[str]:
    """The argv systemd runs for an Exec* line whose words are double-quoted with C escapes (what
    nixpkgs' utils.escapeSystemdExecArgs writes: JSON strings, `%%` and `$$`), per
    systemd.service(5) "Command lines" and systemd.syntax(7). A word that is not quoted, or a lone
    `%` or `$` (a specifier or variable systemd would expand), is refused: the line was not
    escaped for systemd."""
    words, i = [], 0
    while i < len(line):
        if line[i] == " ":
            i += 1
            continue
        if line[i] != '"':
            raise ValueError(f"unquoted word at {i}: {line[i : i + 40]!r}")
        j = i + 1
        while line[j] != '"':
            j += 2 if line[j] == "\\" else 1
        raw = json.loads(line[i : j + 1])
        for sign in "%$":
            parts = raw.split(sign * 2)
            if any(sign in part for part in parts):
                raise ValueError(f"a lone {sign!r} systemd would expand in {raw!r}")
            raw = sign.join(parts)
        words.append(raw)
        i = j + 1
    return words
