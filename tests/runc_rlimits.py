#!/usr/bin/python3
"""The OCI runtime of tests/line_cluster.py's hosts (called by tests/runc_rlimits.sh where it has
work to do): runc, with the container's RLIMIT_NOFILE and RLIMIT_NPROC lowered to what this
process may set (its hard limits) before ``runc create``; and the faults a test asks for.

Why: rootful podman 4.3 gives a container nofile and nproc limits of 1048576 unless the command
line sets them (containers.conf ``default_ulimits`` apply only when it sets no ``--ulimit`` at
all, and the plan's run sets memlock and stack), and a sandbox without CAP_SYS_RESOURCE cannot
raise a hard limit. Only those two limits, which the plan never sets, are touched; every other
limit (the plan's memlock and stack) goes to runc as podman wrote it, so a plan value the host
cannot take still fails. The same for ``runc exec`` (``podman exec``: its process file).
TP4_TEST_RUNC names runc (default: on PATH).
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import sys

CLAMPED = {"RLIMIT_NOFILE": resource.RLIMIT_NOFILE, "RLIMIT_NPROC": resource.RLIMIT_NPROC}


def clamp(path: str, process_file: bool) -> None:
    """Lower nofile and nproc in a bundle's config.json (its `process`) or an exec's process file."""
    with open(path) as fh:
        spec = json.load(fh)
    proc = spec if process_file else spec.get("process", {})
    changed = False
    for limit in proc.get("rlimits") or []:
        which = CLAMPED.get(limit.get("type"))
        if which is None:
            continue
        hard = resource.getrlimit(which)[1]
        if hard == resource.RLIM_INFINITY:
            continue
        for key in ("hard", "soft"):
            if limit.get(key, 0) > hard:
                limit[key], changed = hard, True
    if changed:
        with open(path + ".tmp", "w") as fh:
            json.dump(spec, fh)
        os.replace(path + ".tmp", path)


def _value(argv: list[str], *flags: str) -> str | None:
    for i, arg in enumerate(argv):
        if arg in flags and i + 1 < len(argv):
            return argv[i + 1]
        for flag in flags:
            if flag.startswith("--") and arg.startswith(flag + "="):
                return arg.split("=", 1)[1]
    return None


def refused(config: str, step: str) -> str | None:
    """The test's fault: a container whose environment has TP4_TEST_RUNC_FAIL=<step> (create or
    start) and the NODE_RANK in TP4_TEST_RUNC_FAIL_RANK fails that step of the OCI runtime (what a
    runtime error looks like: `podman create` made the container; its `podman container init`
    runs `runc create`, its `podman start` `runc start`); the message, or None."""
    with open(config) as fh:
        env = dict(e.split("=", 1) for e in json.load(fh).get("process", {}).get("env", []) if "=" in e)
    if env.get("TP4_TEST_RUNC_FAIL") == step and env.get("NODE_RANK") == env.get("TP4_TEST_RUNC_FAIL_RANK", "0"):
        return f"runc {step}: refused for rank {env.get('NODE_RANK')} (TP4_TEST_RUNC_FAIL, a test's fault)"
    return None


def bundle_of(argv: list[str]) -> str | None:
    """The bundle of the container a `runc [--root DIR] start ID` names (runc's state.json keeps
    it among its labels as ``bundle=<dir>``)."""
    root = _value(argv, "--root") or "/run/runc"
    try:
        with open(os.path.join(root, argv[-1], "state.json")) as fh:
            labels = json.load(fh).get("config", {}).get("labels") or []
    except (OSError, ValueError):
        return None
    return next((label.split("=", 1)[1] for label in labels if label.startswith("bundle=")), None)


def main(argv: list[str]) -> None:
    runc = os.environ.get("TP4_TEST_RUNC") or shutil.which("runc") or "/usr/bin/runc"
    if "create" in argv or "run" in argv:
        bundle = _value(argv, "--bundle", "-b")
        if bundle:
            why = refused(os.path.join(bundle, "config.json"), "create")
            if why:
                print(why, file=sys.stderr)
                sys.exit(1)
            clamp(os.path.join(bundle, "config.json"), process_file=False)
    elif "start" in argv:  # here only for a container whose config asks for a fault at start
        bundle = bundle_of(argv)
        why = refused(os.path.join(bundle, "config.json"), "start") if bundle else None
        if why:
            print(why, file=sys.stderr)
            sys.exit(1)
    elif "exec" in argv:  # `podman exec`: runc exec --process <file>
        process = _value(argv, "--process", "-p")
        if process:
            clamp(process, process_file=True)
    os.execv(runc, [runc, *argv])


if __name__ == "__main__":
    main(sys.argv[1:])
