"""Benchmark of `tp4 distribute`: the whole-archive path (parallel vs one vs sequential copies,
a no-op run) and the registry path (bytes and time of a one-layer update, a no-change run).

    sudo .venv/bin/python bench/bench_distribute.py [--size-mb 1024] [--base-mb 1024] [--layer-mb 8] [--rate 200mbit]

Starts three netns hosts with real sshd on a private bridge, rate-limits each host's veth with
tc tbf, and times `tp4 distribute` as a command. The head is this process, with its own podman
store; every store uses --storage-driver (overlay by default, as on the nodes; vfs copies every
layer whole, which a layer-skipping pull would pay for on disk).

Archive part (`--method archive`, a synthetic image of --size-mb random bytes built with nix
from a busybox image flake; its archive is written once before the timings, as the first real
run would, so every timing is the transfer, the remote load and the verification):

  single      to one worker
  parallel    to three workers at once (goal: <= 1.3 x single)
  sequential  three single copies one after the other (about 3 x single)
  no-op       again with every worker up to date (goal: <= 2 s)

Registry part (`--method registry`, the head's registry of tp4.image.imagestore, reached by the
workers through ssh tunnels): an image of two layers built with podman, a base of --base-mb
random bytes and an upper layer of --layer-mb. After a first distribution the upper layer
changes (a new build), and

  bytes/layer   bytes the registry served for the update (tp4.image.imagestore.served_bytes, before
                and after) / 3 workers (the registry counts all pulls together), divided by the
                size of the changed layer as the registry stores it (goal: <= 1.1); each
                worker's link bytes (tc counters: ssh, TCP and Ethernet included) are printed too
  update/archive  the update's time over the time `--method archive` takes for the same update
                (goal: <= 0.1; it applies with a base of at least 1 GB, else it is only printed)
  no-change     `--method registry` again with all three workers up to date (goal: <= 2 s)

Head part (`tp4 build`'s load into the head's runtime, no workers): the test image flake with a
base of --base-mb random bytes (a docker-archive, as dockerTools.pullImage fetches) and a data
tree of --layer-mb, built by nix twice (the second build changes the data tree only); each build
is loaded into the head's podman store, once as the OCI layout of pkgs/oci.nix (skopeo, the
route `tp4 build` takes) and once as a stream script like streamLayeredImage's (`stream | podman
load`, the route before it), each into a store that has the first build:

  rebuild/stream  the layout's rebuild load over the stream's rebuild load (goal: <= 0.1 with a
                  base of at least 1 GB, else only printed)
  rebuild/first   the layout's rebuild load over its first load (printed)

Prints every measurement with its goal; exits 1 when a goal is missed, 2 when the machine lacks
something. Needs root, nix, podman, skopeo, sshd, tc, and for the registry part tp4.image.imagestore
and Debian's docker-registry.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "python"), str(REPO / "tests")]

import shutil  # noqa: E402

from netns_hosts import SSHD, Host, NetnsHosts, storage_conf  # noqa: E402
from nix_env import BUSYBOX, image_flake, image_nix_config  # noqa: E402
from tp4.core import process  # noqa: E402
from tp4.image import build, distribute  # noqa: E402

REF = "tp4-bench:latest"
REG_REF = "tp4-bench-reg:latest"
BASE_REF = "tp4-bench-base:latest"
GB = 10**9
MiB = 2**20


@dataclass(frozen=True)
class Goal:
    """One measurement against its goal (value <= goal); ``binding`` False: printed, not judged."""

    name: str
    value: float
    goal: float
    unit: str = ""
    note: str = ""
    binding: bool = True

    @property
    def met(self) -> bool:
        return self.value <= self.goal

    def line(self) -> str:
        verdict = ("ok" if self.met else "MISSED") if self.binding else "not judged"
        text = f"{self.name:<16} {self.value:9.3f}{self.unit}  goal <= {self.goal:g}{self.unit}  {verdict}"
        return text + (f"  ({self.note})" if self.note else "")


def report(goals: Sequence[Goal], out: Callable[[str], None] = print) -> int:
    """Print every goal; 1 when a binding one is missed, else 0."""
    for g in goals:
        out(g.line())
    missed = [g.name for g in goals if g.binding and not g.met]
    if missed:
        out(f"missed: {', '.join(missed)}")
    return 1 if missed else 0


def missing_prerequisites(parts: str = "all") -> list[str]:
    """What this machine lacks for the benchmark (empty when it can run)."""
    missing = [] if os.geteuid() == 0 else ["root (network namespaces, tc)"]
    missing += [tool for tool in ("nix", "podman", "ip", "tc", "ssh") if shutil.which(tool) is None]
    missing += [path for path in (SSHD, BUSYBOX) if not os.access(path, os.X_OK)]
    if parts in ("all", "registry"):
        missing += [tool for tool in ("skopeo", "docker-registry") if shutil.which(tool) is None]
        try:
            import tp4.image.imagestore  # noqa: F401
        except ModuleNotFoundError:
            missing.append("tp4.image.imagestore (the head's registry, issue 9)")
    return missing


def tp4(*args: object) -> float:
    start = time.monotonic()
    process.run([sys.executable, "-m", "tp4", *map(str, args)], capture=False)
    return time.monotonic() - start


def podman(*argv: object) -> str:
    return process.run(["podman", *map(str, argv)]).stdout


def use_driver(conf: Path, driver: str) -> Path:
    """A storage.conf of tests/netns_hosts.py (vfs) with another driver, before its store is used."""
    conf.write_text(conf.read_text().replace('driver = "vfs"', f'driver = "{driver}"'))
    return conf


def random_file(path: Path, size_mb: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        for _ in range(size_mb):
            f.write(os.urandom(MiB))


def link_bytes(hosts: NetnsHosts) -> list[int]:
    """Bytes each worker's link has carried towards it (the tbf qdisc on the bridge side)."""
    counts = []
    for i in range(len(hosts)):
        out = process.run(["tc", "-s", "-j", "qdisc", "show", "dev", f"{hosts.prefix}v{i}"]).stdout
        counts.append(sum(int(q.get("bytes", 0)) for q in json.loads(out) if q.get("root")))
    return counts


def archive_part(opts: argparse.Namespace, tmp: Path, hosts: NetnsHosts, common: list[str]) -> list[Goal]:
    flake = image_flake(tmp / "flake", ref=REF, label="bench", size_mb=opts.size_mb)
    print(f"building and loading a {opts.size_mb} MiB image ...", flush=True)
    tp4("build", "--flake", flake, "--runtime", "podman")
    record = build.Built.load(build.record_path(flake, "image"))
    distribute.archive("podman", REF, record.id)
    args = [*common, "--method", "archive", "--flake", flake]

    def run(workers: Sequence[Host]) -> float:
        return tp4(*args, *(a for h in workers for a in ("--worker", h.address)))

    def clear() -> None:
        for h in hosts:
            h.run("podman", "rmi", "-f", REF, check=False)

    clear()
    single = run([hosts[0]])
    clear()
    parallel = run(list(hosts))
    clear()
    sequential = sum(run([h]) for h in hosts)
    noop = run(list(hosts))
    print(f"\narchive path: image {opts.size_mb} MiB, each worker link limited to {opts.rate}")
    print(f"single      {single:7.1f} s")
    print(f"parallel    {parallel:7.1f} s")
    print(f"sequential  {sequential:7.1f} s   ratio sequential/single {sequential / single:.2f}")
    print(f"no-op       {noop:7.2f} s")
    return [Goal("parallel/single", parallel / single, 1.3), Goal("archive no-op", noop, 2.0, " s")]


def _nix_build(flake: Path) -> str:
    proc = process.run(["nix", "build", "--json", "--no-link", f"path:{flake}#image"])
    return str(json.loads(proc.stdout)[0]["outputs"]["out"])


def _timed_load(out_path: str, store: Path) -> float:
    from tp4.image import runtime_cli

    os.environ["CONTAINERS_STORAGE_CONF"] = str(store)
    start = time.monotonic()
    runtime_cli.load(out_path, "podman")
    return time.monotonic() - start


def head_part(opts: argparse.Namespace, tmp: Path) -> list[Goal]:
    """The head's load of a rebuild: the layout (skopeo, unchanged layers skipped unread) against
    the stream (every layer regenerated and read again), each into a store with the first build."""
    head_conf = os.environ["CONTAINERS_STORAGE_CONF"]
    print(
        f"building a {opts.base_mb} MiB base and a {opts.layer_mb} MiB tree, twice, as a layout and as a stream ...",
        flush=True,
    )
    outs: dict[tuple[bool, str], str] = {}
    for stream in (False, True):
        for label in ("one", "two"):
            flake = image_flake(
                tmp / ("stream" if stream else "layout"),
                ref=REF,
                label=f"head-{label}",
                size_mb=opts.layer_mb,
                base_layers_mb=(opts.base_mb,),
                stream=stream,
            )
            outs[stream, label] = _nix_build(flake)
    times: dict[tuple[bool, str], float] = {}
    try:
        for stream in (False, True):
            store = use_driver(storage_conf(tmp / ("store-stream" if stream else "store-layout")), opts.storage_driver)
            for label in ("one", "two"):
                times[stream, label] = _timed_load(outs[stream, label], store)
            podman("rmi", "-a", "-f")
    finally:
        os.environ["CONTAINERS_STORAGE_CONF"] = head_conf
    print(f"\nhead load: base {opts.base_mb} MiB, changed tree {opts.layer_mb} MiB, {opts.storage_driver} store")
    print(
        f"layout  first {times[False, 'one']:6.2f} s   rebuild {times[False, 'two']:6.2f} s   (skopeo copy oci: containers-storage:)"
    )
    print(f"stream  first {times[True, 'one']:6.2f} s   rebuild {times[True, 'two']:6.2f} s   (stream | podman load)")
    big = opts.base_mb * MiB >= GB
    return [
        Goal(
            "rebuild/stream",
            times[False, "two"] / times[True, "two"],
            0.1,
            binding=big,
            note="head load of a one-tree rebuild, layout over stream"
            + ("" if big else "; the goal applies with >= 1 GB"),
        ),
        Goal(
            "rebuild/first",
            times[False, "two"] / times[False, "one"],
            1.0,
            binding=False,
            note="the layout's rebuild load over its first load",
        ),
    ]


def build_upper(tmp: Path, label: str, layer_mb: int) -> str:
    """REG_REF: the base and an upper layer of ``layer_mb`` fresh random bytes; its image id."""
    ctx = tmp / f"ctx-{label}"
    random_file(ctx / "upper", layer_mb)
    (ctx / "Containerfile").write_text(
        f'FROM {BASE_REF}\nCOPY upper /opt/upper/blob\nLABEL tp4.line.ref="{REG_REF}" tp4.flake.rev="{label}"\n'
    )
    podman("build", "-q", "--layers=false", "-t", REG_REF, "-f", ctx / "Containerfile", ctx)
    return podman("image", "inspect", "--format", "{{.Id}}", REG_REF).strip()


def manifest_layers(url: str, repo: str, digest: str) -> dict[str, int]:
    """Layer digest -> size, from the registry's manifest."""
    raw = process.run(["skopeo", "inspect", "--raw", "--tls-verify=false", f"docker://{url}/{repo}@{digest}"]).stdout
    return {layer["digest"]: int(layer["size"]) for layer in json.loads(raw)["layers"]}


def registry_part(opts: argparse.Namespace, tmp: Path, hosts: NetnsHosts, common: list[str]) -> list[Goal]:
    from tp4.image import imagestore
    from tp4.image.images import STORE_REPO, store_digests

    print(f"building a {opts.base_mb} MiB base layer and a {opts.layer_mb} MiB upper layer ...", flush=True)
    random_file(tmp / "base" / "opt" / "base" / "blob", opts.base_mb)
    process.run(["tar", "-C", tmp / "base", "-cf", tmp / "base.tar", "opt"])
    podman("import", "-q", tmp / "base.tar", BASE_REF)
    (tmp / "base.tar").unlink()
    args = [*common, "--image", REG_REF, *(a for h in hosts for a in ("--worker", h.address))]
    for h in hosts:
        h.run("podman", "rmi", "-f", REG_REF, check=False)

    v1 = build_upper(tmp, "reg-1", opts.layer_mb)
    first = tp4(*args, "--method", "registry")
    store = imagestore.running()
    if store is None:
        raise SystemExit("error: `tp4 distribute --method registry` left no registry running on the head")
    try:
        v2 = build_upper(tmp, "reg-2", opts.layer_mb)
        served, links = imagestore.served_bytes(store), link_bytes(hosts)
        update = tp4(*args, "--method", "registry")
        served = imagestore.served_bytes(store) - served
        links = [after - before for after, before in zip(link_bytes(hosts), links, strict=True)]
        no_change = tp4(*args, "--method", "registry")

        digests = store_digests(store, STORE_REPO)
        old, new = (manifest_layers(store.url, STORE_REPO, digests[v]) for v in (v1, v2))
        changed = sum(size for layer, size in new.items() if layer not in old)

        for h in hosts:  # the workers had the old image: the archive path sends the new one whole
            h.run("podman", "rmi", "-f", REG_REF, check=False)
        distribute.archive("podman", REG_REF, v2)
        whole = tp4(*args, "--method", "archive")
    finally:
        imagestore.stop(store.root)

    per_worker = served / len(hosts)
    base_bytes = sum(old.values()) - sum(size for layer, size in old.items() if layer not in new)
    print(
        f"\nregistry path: base {opts.base_mb} MiB, upper layer {opts.layer_mb} MiB, each worker link limited to {opts.rate}"
    )
    print(f"first distribution   {first:7.1f} s")
    print(
        f"one-layer update     {update:7.1f} s   changed layer {changed / MiB:.2f} MiB; the registry served "
        f"{served / MiB:.2f} MiB = {per_worker / MiB:.2f} MiB per worker (total / {len(hosts)})"
    )
    print(
        "  link bytes per worker: "
        + ", ".join(
            f"{h.address} {b / MiB:.2f} MiB ({b / changed:.2f} x layer)" for h, b in zip(hosts, links, strict=True)
        )
    )
    print(f"whole archive        {whole:7.1f} s   (--method archive, same update)")
    print(f"no change            {no_change:7.2f} s")
    big = base_bytes >= GB
    return [
        Goal(
            "bytes/layer",
            per_worker / changed,
            1.1,
            note=f"registry bytes served / {len(hosts)} workers / changed layer",
        ),
        Goal(
            "update/archive",
            update / whole,
            0.1,
            binding=big,
            note=f"base layer {base_bytes / GB:.2f} GB" + ("" if big else "; the goal applies with >= 1 GB"),
        ),
        Goal("no change", no_change, 2.0, " s", note=f"{len(hosts)} workers"),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=1024, help="image size of the archive part")
    parser.add_argument("--base-mb", type=int, default=1024, help="base layer of the registry part")
    parser.add_argument("--layer-mb", type=int, default=8, help="the upper layer that changes in the registry part")
    parser.add_argument("--rate", default="200mbit", help="tc tbf rate of each worker's link")
    parser.add_argument("--parts", choices=("all", "archive", "registry", "head"), default="all")
    parser.add_argument(
        "--storage-driver",
        choices=("overlay", "vfs"),
        default="overlay",
        help="containers-storage driver of every node's store",
    )
    opts = parser.parse_args()
    missing = missing_prerequisites(opts.parts)
    if missing:
        print(
            f"error: bench_distribute.py needs {', '.join(missing)}; set the machine up as the tests do "
            "(as root: bash python/setup.sh --test) and run it again",
            file=sys.stderr,
        )
        sys.exit(2)

    goals: list[Goal] = []
    with tempfile.TemporaryDirectory(prefix="tp4-bench-") as tmp_name:
        tmp = Path(tmp_name)
        os.environ["NIX_CONFIG"] = image_nix_config(tmp / "nix")
        os.environ["CONTAINERS_STORAGE_CONF"] = str(use_driver(storage_conf(tmp / "head"), opts.storage_driver))
        os.environ["XDG_CACHE_HOME"] = str(tmp / "cache")
        os.environ["XDG_STATE_HOME"] = str(tmp / "state")  # the head's registry lives here
        # `python -m tp4` runs this checkout's tp4, not an installed one
        os.environ["PYTHONPATH"] = os.pathsep.join(
            [str(REPO / "python"), *filter(None, [os.environ.get("PYTHONPATH")])]
        )
        try:
            if opts.parts in ("all", "head"):
                goals += head_part(opts, tmp / "head-part")
            if opts.parts == "head":
                print()
                sys.exit(report(goals))
            with NetnsHosts(tmp / "hosts", count=3) as hosts:
                for h in hosts:
                    use_driver(Path(h.env["CONTAINERS_STORAGE_CONF"]), opts.storage_driver)
                hosts.rate_limit(opts.rate)
                common = ["distribute", "--runtime", "podman", "--user", "root", "--identity", hosts.key]
                for opt in hosts[0].remote.options:
                    common += ["--ssh-option", opt]
                try:
                    if opts.parts in ("all", "archive"):
                        goals += archive_part(opts, tmp / "archive", hosts, common)
                    if opts.parts in ("all", "registry"):
                        goals += registry_part(opts, tmp / "registry", hosts, common)
                finally:
                    for h in hosts:
                        h.run("podman", "rmi", "-a", "-f", check=False)
        finally:
            process.run(["podman", "rmi", "-a", "-f"], check=False)  # overlay mounts go before the directory
    print()
    sys.exit(report(goals))


if __name__ == "__main__":
    main()
