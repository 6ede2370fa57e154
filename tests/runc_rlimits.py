#!/usr/bin/python3
"""The OCI runtime of tests/line_cluster.py's hosts: runc, with the container's RLIMIT_NOFILE and
RLIMIT_NPROC lowered to what this process may set (its hard limits) before ``runc create``.

Why: rootful podman 4.3 gives a container nofile and nproc limits of 1048576 unless the command
line sets them (containers.conf ``default_ulimits`` apply only when it sets no ``--ulimit`` at
all, and the plan's run sets memlock and stack), and a sandbox without CAP_SYS_RESOURCE cannot
raise a hard limit. Only those two limits, which the plan never sets, are touched; every other
limit (the plan's memlock and stack) goes to runc as podman wrote it, so a plan value the host
cannot take still fails. Usage (containers.conf): ``[engine] runtime = "tp4-runc"`` and
``[engine.runtimes] tp4-runc = ["<this file>"]``; TP4_TEST_RUNC names runc (default: on PATH).
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import sys

CLAMPED = {"RLIMIT_NOFILE": resource.RLIMIT_NOFILE, "RLIMIT_NPROC": resource.RLIMIT_NPROC}


def clamp(bundle: str) -> None:
    path = os.path.join(bundle, "config.json")
    with open(path) as fh:
        spec = json.load(fh)
    changed = False
    for limit in spec.get("process", {}).get("rlimits", []):
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


def main(argv: list[str]) -> None:
    runc = os.environ.get("TP4_TEST_RUNC") or shutil.which("runc") or "/usr/bin/runc"
    if "create" in argv or "run" in argv:
        for flag in ("--bundle", "-b"):
            if flag in argv[:-1]:
                clamp(argv[argv.index(flag) + 1])
        for arg in argv:
            if arg.startswith("--bundle="):
                clamp(arg.split("=", 1)[1])
    os.execv(runc, [runc, *argv])


if __name__ == "__main__":
    main(sys.argv[1:])
