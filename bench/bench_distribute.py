"""Benchmark of `tp4 distribute`: parallel copy vs one copy vs sequential copies, and a no-op run.

    sudo .venv/bin/python bench/bench_distribute.py [--size-mb 1024] [--rate 200mbit]

Builds a synthetic image of --size-mb random bytes with nix (a busybox image flake), loads it on
the "head" (this process, its own podman store), starts three netns hosts with real sshd on a
private bridge, rate-limits each host's veth with tc tbf, and times the `tp4 distribute` command:

  single      to one worker
  parallel    to three workers at once (target: <= 1.3 x single)
  sequential  three single copies one after the other (about 3 x single)
  no-op       again with every worker up to date (target: <= 2 s)

The image archive is written once before the timings (as the first real run would), so every
timing is the transfer, the remote load and the verification. Needs root, nix, podman, sshd, tc.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "python"), str(REPO / "tests")]

import shutil  # noqa: E402

from netns_hosts import SSHD, NetnsHosts, storage_conf  # noqa: E402
from nix_env import BUSYBOX, image_flake, nix_config  # noqa: E402
from tp4 import build, distribute, process  # noqa: E402

REF = "tp4-bench:latest"


def missing_prerequisites() -> list[str]:
    """What this machine lacks for the benchmark (empty when it can run)."""
    missing = [] if os.geteuid() == 0 else ["root (network namespaces, tc)"]
    missing += [tool for tool in ("nix", "podman", "ip", "tc", "ssh") if shutil.which(tool) is None]
    missing += [path for path in (SSHD, BUSYBOX) if not os.access(path, os.X_OK)]
    return missing


def tp4(*args: str) -> float:
    start = time.monotonic()
    process.run([sys.executable, "-m", "tp4", *map(str, args)], capture=False)
    return time.monotonic() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=1024)
    parser.add_argument("--rate", default="200mbit", help="tc tbf rate of each worker's link")
    opts = parser.parse_args()
    missing = missing_prerequisites()
    if missing:
        print(f"error: bench_distribute.py needs {', '.join(missing)}; set the machine up as the tests do "
              "(as root: bash python/setup.sh --test) and run it again", file=sys.stderr)
        sys.exit(2)

    with tempfile.TemporaryDirectory(prefix="tp4-bench-") as tmp_name:
        tmp = Path(tmp_name)
        os.environ["NIX_CONFIG"] = nix_config(tmp / "nix")
        os.environ["CONTAINERS_STORAGE_CONF"] = str(storage_conf(tmp / "head"))
        os.environ["XDG_CACHE_HOME"] = str(tmp / "cache")
        flake = image_flake(tmp / "flake", ref=REF, label="bench", size_mb=opts.size_mb)
        print(f"building and loading a {opts.size_mb} MiB image ...", flush=True)
        tp4("build", "--flake", flake, "--runtime", "podman")
        record = build.Built.load(build.record_path(flake, "image"))
        distribute.archive("podman", REF, record.id)

        with NetnsHosts(tmp / "hosts", count=3) as hosts:
            hosts.rate_limit(opts.rate)
            common = ["distribute", "--flake", flake, "--runtime", "podman", "--user", "root",
                      "--identity", hosts.key]
            for opt in hosts[0].remote.options:
                common += ["--ssh-option", opt]

            def run(workers) -> float:
                args = list(common)
                for h in workers:
                    args += ["--worker", h.address]
                return tp4(*args)

            def clear() -> None:
                for h in hosts:
                    h.run("podman", "rmi", "-f", REF, check=False)

            clear()
            single = run([hosts[0]])
            clear()
            parallel = run(hosts)
            clear()
            sequential = sum(run([h]) for h in hosts)
            noop = run(hosts)

    print()
    print(f"image {opts.size_mb} MiB, each worker link limited to {opts.rate}")
    print(f"single      {single:7.1f} s")
    print(f"parallel    {parallel:7.1f} s   ratio parallel/single   {parallel / single:.2f}  (target <= 1.30)")
    print(f"sequential  {sequential:7.1f} s   ratio sequential/single {sequential / single:.2f}")
    print(f"no-op       {noop:7.2f} s   (target <= 2.00)")


if __name__ == "__main__":
    main()
