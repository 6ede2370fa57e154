#!/usr/bin/env python3
"""Benchmark of tp4 sources against the reference tools; prints two ratios, exits 1 if a target
is missed.

1. ``tp4 sources verify --download`` against a loopback HTTP server (a child process, sendfile)
   over >= 500 MB of files, vs ``sha256sum`` on the same files (page cache warm).
   Target: throughput >= 0.8x sha256sum.
2. The NAR hash of a 75 MB tree of ~3,000 files (the size of SGLang's python/): ``nar_hash()``
   vs the ``nix hash path`` process. Target: <= 1.5x its time. Also printed: the whole
   ``python -m tp4.image.sources hash`` process (interpreter and CLI start-up included).

    python bench/bench_sources.py [--total-mb 560] [--tree-mb 75] [--files 3000]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "python"))

from tp4.core import process  # noqa: E402
from tp4.image.sources import nar  # noqa: E402

COMMIT = "0123456789abcdef0123456789abcdef01234567"
NIX_ENV = {"NIX_CONFIG": "experimental-features = nix-command flakes\nsubstituters =\n"}


def best_of(n: int, fn) -> float:
    times = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def make_files(root: Path, total_mb: int, count: int = 5) -> list[Path]:
    block = os.urandom(1 << 20)
    per = total_mb // count
    files = []
    for i in range(count):
        path = root / "example.invalid" / COMMIT / f"blob{i}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as f:
            for j in range(per):
                f.write(block[j % 251 :] + block[: j % 251])
        files.append(path)
    return files


def bench_download(work: Path, total_mb: int) -> float:
    served = work / "served"
    files = make_files(served, total_mb)
    manifest = work / "bench.manifest"
    lines = []
    for path in files:
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        lines.append(f"{path.stem}  {COMMIT}  {digest}  https://example.invalid/{COMMIT}/{path.name}")
    manifest.write_text("\n".join(lines) + "\n")
    total = sum(p.stat().st_size for p in files)

    sha = best_of(3, lambda: process.run(["sha256sum", *map(str, files)]))
    port_file = work / "port"
    server = process.start(
        [sys.executable, str(REPO / "tests" / "sources_helpers" / "server.py"), str(served), str(port_file)],
        env={"PYTHONPATH": f"{REPO / 'python'}:{REPO / 'tests'}"},
    )
    try:
        for _ in range(200):
            if port_file.exists() and port_file.read_text():
                break
            time.sleep(0.05)
        env = {"TP4_SOURCES_MIRROR": f"http://127.0.0.1:{port_file.read_text()}", "PYTHONPATH": str(REPO / "python")}
        ours = best_of(
            3,
            lambda: process.run(
                [sys.executable, "-m", "tp4.image.sources", "verify", "--download", "--manifest", str(manifest)],
                env=env,
            ),
        )
    finally:
        server.terminate()
        server.wait()
    ratio = sha / ours
    print(
        f"download: {total / 1e6:.0f} MB; sha256sum {total / sha / 1e6:.0f} MB/s ({sha:.2f} s); "
        f"verify --download {total / ours / 1e6:.0f} MB/s ({ours:.2f} s)"
    )
    print(f"RATIO verify-download/sha256sum throughput = {ratio:.2f} (target >= 0.8)")
    return ratio


def make_tree(root: Path, total_mb: int, count: int) -> None:
    rng = random.Random(41)
    weights = [rng.paretovariate(1.2) for _ in range(count)]
    scale = total_mb * (1 << 20) / sum(weights)
    block = os.urandom(4 << 20)
    for i, w in enumerate(weights):
        depth = rng.randint(1, 5)
        directory = root.joinpath(*(f"pkg{rng.randint(0, 12)}" for _ in range(depth)))
        directory.mkdir(parents=True, exist_ok=True)
        size = min(int(w * scale), len(block))
        path = directory / f"mod_{i}.py"
        path.write_bytes(block[i % 1000 : i % 1000 + size])
        if i % 97 == 0:
            path.chmod(0o755)
        if i % 211 == 0:
            os.symlink(path.name, directory / f"link_{i}")


def bench_nar(work: Path, tree_mb: int, count: int) -> float:
    tree = work / "tree"
    make_tree(tree, tree_mb, count)
    size = sum(p.stat().st_size for p in tree.rglob("*") if p.is_file() and not p.is_symlink())
    files = sum(1 for p in tree.rglob("*") if p.is_file())
    expected = process.run(["nix", "hash", "path", str(tree)], env=NIX_ENV).stdout.strip()
    assert nar.nar_hash(tree) == expected, "NAR hash differs from nix hash path"
    nix_t = best_of(5, lambda: process.run(["nix", "hash", "path", str(tree)], env=NIX_ENV))
    cli_t = best_of(
        5,
        lambda: process.run(
            [sys.executable, "-m", "tp4.image.sources", "hash", str(tree)], env={"PYTHONPATH": str(REPO / "python")}
        ),
    )
    fn_t = best_of(5, lambda: nar.nar_hash(tree))
    print(
        f"nar: {size / 1e6:.0f} MB in {files} files; nix hash path {nix_t * 1000:.0f} ms; "
        f"python -m tp4.image.sources hash {cli_t * 1000:.0f} ms; nar_hash() in-process {fn_t * 1000:.0f} ms"
    )
    ratio = fn_t / nix_t
    print(
        f"RATIO python-nar-hash/nix-hash-path time = {ratio:.2f} (target <= 1.5; "
        f"as a process with start-up: {cli_t / nix_t:.2f})"
    )
    return ratio


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--total-mb", type=int, default=560)
    parser.add_argument("--tree-mb", type=int, default=75)
    parser.add_argument("--files", type=int, default=3000)
    args = parser.parse_args()
    if not shutil.which("nix") or not shutil.which("sha256sum"):
        print("bench_sources: needs nix and sha256sum on PATH", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="tp4-bench-sources-"))
    try:
        download_ratio = bench_download(work, args.total_mb)
        nar_ratio = bench_nar(work, args.tree_mb, args.files)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    ok = download_ratio >= 0.8 and nar_ratio <= 1.5
    print("bench_sources: " + ("all targets met" if ok else "TARGET MISSED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
