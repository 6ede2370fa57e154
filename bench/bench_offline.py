"""Benchmark of failing offline: how long tp4 takes to say a source cannot be fetched.

    .venv/bin/python bench/bench_offline.py

Each command runs as a user would run it on a machine whose names do not resolve (this one, or a
name under the reserved .invalid domain), and must fail in under 2 s naming the host:

  download    tp4 sources fetch of a GitHub archive row
  pip         tp4 sources verify --download of a wheel row, pip's index unresolvable
  flake       tp4 build --dry-run --system aarch64-linux on the line's flake whose inputs are not in
              the store (with a `nix` that reports 2.24, so the Nix version check passes)

Prints seconds and the ratio to the 2 s target (<= 1.00 passes); exits 1 if any misses.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TP4 = [sys.executable, "-m", "tp4"]
TARGET = 2.0


def timed(argv: list[str], env: dict[str, str], cwd: Path) -> tuple[float, str]:
    start = time.monotonic()
    proc = subprocess.run(
        argv,
        env={**os.environ, "PYTHONPATH": str(REPO / "python"), **env},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )
    seconds = time.monotonic() - start
    if proc.returncode == 0 or "looks offline" not in proc.stderr:
        sys.exit(f"error: {' '.join(argv)} did not fail as offline:\n{proc.stderr[-800:]}")
    return seconds, proc.stderr.strip().splitlines()[-1]


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="tp4-bench-") as tmp_name:
        tmp = Path(tmp_name)
        manifest = tmp / "sources.manifest"
        shutil.copy(REPO / "sources.manifest", manifest)
        flake = tmp / "flake"
        flake.mkdir()
        for name in ("flake.nix", "flake.lock"):
            shutil.copy(REPO / name, flake / name)
        shim = tmp / "bin" / "nix"
        shim.parent.mkdir()
        shim.write_text('#!/bin/sh\n[ "$1" = --version ] && exec echo "nix (Nix) 2.24.9"\nexit 99\n')
        shim.chmod(0o755)
        pip_offline = {
            "PIP_CONFIG_FILE": os.devnull,
            "PIP_INDEX_URL": "https://tp4-offline.invalid/simple",
            "PIP_FIND_LINKS": "",
            "PIP_EXTRA_INDEX_URL": "",
        }
        cases = {
            "download": (
                [*TP4, "sources", "fetch", "b12x-next", "--to", str(tmp / "out"), "--manifest", str(manifest)],
                {"TP4_SOURCES_MIRROR": "https://tp4-offline.invalid", "TP4_SOURCES_CACHE": str(tmp / "c")},
            ),
            "pip": (
                [*TP4, "sources", "verify", "--download", "sglang-kernel", "--manifest", str(manifest)],
                pip_offline,
            ),
            "flake": (
                [*TP4, "build", "--dry-run", "--system", "aarch64-linux", "--flake", str(flake), "--runtime", "podman"],
                {"PATH": f"{shim.parent}:{os.environ['PATH']}"},
            ),
        }
        worst = 0.0
        for name, (argv, env) in cases.items():
            seconds, said = timed(argv, env, tmp)
            worst = max(worst, seconds / TARGET)
            print(f"{name:<9} {seconds:5.2f} s   ratio to {TARGET:.0f} s {seconds / TARGET:.2f}   {said[:110]}")
    sys.exit(0 if worst <= 1.0 else 1)


if __name__ == "__main__":
    main()
