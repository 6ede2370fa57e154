"""The bounds of tp4 serve's boot phases, in seconds and in the order a boot passes them, in a
module that imports nothing: the plan reads them (a NixOS rank's readiness takes their sum from start
to its own last phase) and so do the `--timeout PHASE=SECONDS` options' help texts, read at every
start of the CLI."""

from __future__ import annotations

BOOT_TIMEOUTS = {
    "start": 600.0,
    "weights": 3600.0,
    "graphs": 1800.0,
    "smoke": 600.0,
    "warmup": 1800.0,
    "ready": 600.0,
    "completion": 180.0,
}
