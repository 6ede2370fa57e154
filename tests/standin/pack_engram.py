"""The stand-in of the image's Engram packer (/opt/dsv41/scripts/pack_engram.py), part of the
stand-in image (tests/standin/image.py): the one allowed test double. Standard library only.

Same command line as upstream's packer (`--rank R --tp N --out DIR`, the checkpoint in
DSV41_SOURCE); it writes ``engram-l<layer>-r<rank>of<tp>.bin`` for the Engram layers 1 and 14
with upstream's header (six little-endian u64: magic, layer, row_lo, row_hi, rows, row_bytes; the
table's rows split as ROWS * rank // tp) and rows * ROW_BYTES bytes of payload, each through a
``.partial`` renamed when written. A shard that is already complete is skipped (upstream is
idempotent too); anything else at its name is replaced.

Test controls (the container's environment; not packer settings):
  TP4_STANDIN_PACK_SECONDS  sleep this long before writing (default 0)
  TP4_STANDIN_PACK_FAIL     1: print a few lines and exit 1 before writing anything
"""

from __future__ import annotations

import argparse
import os
import struct
import sys
import time
from pathlib import Path

MAGIC = 0x4D41524745  # b"EGRAM\0\0\0" little-endian
LAYERS = (1, 14)
ROWS = 1000  # rows of each layer's table (upstream: millions)
ROW_BYTES = 64


def complete(path: Path, layer: int, lo: int, hi: int) -> bool:
    try:
        with open(path, "rb") as fh:
            head = fh.read(48)
        size = path.stat().st_size
    except OSError:
        return False
    return (
        len(head) == 48
        and struct.unpack("<6Q", head) == (MAGIC, layer, lo, hi, hi - lo, ROW_BYTES)
        and size == 48 + (hi - lo) * ROW_BYTES
    )


def main() -> int:
    ap = argparse.ArgumentParser(prog="pack_engram.py")
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--tp", type=int, default=3)  # upstream's packer defaults to TP3 too
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    source = Path(os.environ.get("DSV41_SOURCE", ""))
    if not (source / "config.json").is_file():
        print(f"pack_engram: DSV41_SOURCE={source}: no config.json", file=sys.stderr)
        return 2
    if not 0 <= args.rank < args.tp:
        print(f"pack_engram: --rank {args.rank} is not a rank of --tp {args.tp}", file=sys.stderr)
        return 2
    if os.environ.get("TP4_STANDIN_PACK_FAIL") == "1":
        print(f"pack_engram: rank {args.rank}: reading the Engram tables of {source}")
        print("pack_engram: TP4_STANDIN_PACK_FAIL=1: failing as asked", file=sys.stderr)
        return 1
    time.sleep(float(os.environ.get("TP4_STANDIN_PACK_SECONDS") or 0))
    out = Path(args.out)
    lo, hi = ROWS * args.rank // args.tp, ROWS * (args.rank + 1) // args.tp
    for layer in LAYERS:
        path = out / f"engram-l{layer}-r{args.rank}of{args.tp}.bin"
        if complete(path, layer, lo, hi):
            print(f"pack_engram: {path.name}: complete, skipped")
            continue
        partial = path.with_name(path.name + ".partial")
        with open(partial, "wb") as fh:
            fh.write(struct.pack("<6Q", MAGIC, layer, lo, hi, hi - lo, ROW_BYTES))
            row = bytes((layer + i) % 256 for i in range(ROW_BYTES))
            for _ in range(hi - lo):
                fh.write(row)
        os.replace(partial, path)
        print(f"pack_engram: {path.name}: rows [{lo}, {hi}) of {ROWS}, {hi - lo} x {ROW_BYTES} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
