"""What `tp4 build` reads from the base image before it builds anything on it.

The line's image stands on a pinned base (the `base-image` row of sources.manifest) whose contents
the build relies on without being able to see them in the Nix sandbox: its glibc (tp4-runtime's
library is checked against ``glibc=``), gcc and the RDMA verbs headers and library (b12x's RoCE
proxy compiles itself with ``-libverbs`` at first use), its Python (the wheels go into its
site-packages) and the packages it already holds (torch, FlashInfer, ...). The row states them as
attributes; `tp4 build` builds (fetches) only the base, loads it into the container runtime, reads
them in one throwaway container without network, and stops with every difference, naming the row
attribute and the fix, before the runtime layer or anything else is built on it.

The image derivation carries what to expect as ``baseFacts = { row; attrs; }`` (pkgs/image.nix,
from the row) and the base archive as ``base`` (pkgs/oci.nix); an image without ``baseFacts`` (a
flake of its own) is not probed.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tarfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from tp4.core import process

from tp4.image import nix, runtime_cli
from tp4.core.errors import Tp4Error

Echo = Callable[[str], None]
PROBE_TIMEOUT = 300

# One constant script, run with the base's /bin/sh: shell builtins only besides the tools it
# asks about, so a base without grep or head is still read. One `key=value` line per fact.
PROBE_SCRIPT = r"""
v=$(getconf GNU_LIBC_VERSION 2>/dev/null)
if [ -z "$v" ]; then v=$(ldd --version 2>&1 | { read -r line; echo "$line"; }); fi
echo "glibc=$v"
if command -v gcc >/dev/null 2>&1; then echo "gcc=$(gcc -dumpfullversion -dumpversion 2>/dev/null)"; else echo "gcc="; fi
if [ -f /usr/include/infiniband/verbs.h ]; then echo "verbs.h=/usr/include/infiniband/verbs.h"; else echo "verbs.h="; fi
lib=
for d in /usr/lib/*-linux-gnu /usr/lib64 /usr/lib /lib/*-linux-gnu /usr/local/lib; do
  if [ -z "$lib" ] && [ -e "$d/libibverbs.so" ]; then lib="$d/libibverbs.so"; fi
done
echo "libibverbs.so=$lib"
if command -v python3 >/dev/null 2>&1; then
  python3 -I -c 'import sys, importlib.metadata as m
print("python=%d.%d.%d" % sys.version_info[:3])
for d in m.distributions():
    print("package=%s==%s" % (d.metadata["Name"], d.version))'
else
  echo "python="
fi
echo "end=1"
"""

# the row attributes this reads, in the order they are reported
ATTRS = ("glibc", "python", "gcc", "verbs", "packages")


@dataclass(frozen=True)
class Facts:
    glibc: str  # MAJOR.MINOR, or "" when neither getconf nor ldd answered
    glibc_said: str
    python: str  # MAJOR.MINOR.PATCH or ""
    gcc: str  # gcc -dumpfullversion, or "" without gcc
    verbs_h: str  # its path, or ""
    libibverbs: str  # the unversioned libibverbs.so -libverbs links against, or ""
    packages: Mapping[str, str]  # normalized name -> version


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def parse(output: str) -> Facts:
    """The probe's output; an output cut short (no `end=1`) is an error."""
    values: dict[str, str] = {}
    packages: dict[str, str] = {}
    for line in output.splitlines():
        key, sep, value = line.partition("=")
        if not sep:
            continue
        if key == "package":
            name, _, version = value.partition("==")
            packages.setdefault(_norm(name), version)
        else:
            values.setdefault(key, value.strip())
    if values.get("end") != "1":
        raise Tp4Error(f"the base image's probe stopped before it finished; its output:\n{output.strip()[-2000:]}")
    said = values.get("glibc", "")
    found = re.findall(r"(\d+)\.(\d+)", said)
    glibc = ".".join(found[-1]) if found else ""
    return Facts(
        glibc=glibc,
        glibc_said=said,
        python=values.get("python", ""),
        gcc=values.get("gcc", ""),
        verbs_h=values.get("verbs.h", ""),
        libibverbs=values.get("libibverbs.so", ""),
        packages=packages,
    )


def _major_minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


def differences(facts: Facts, row: str, attrs: Mapping[str, str]) -> list[str]:
    """Each row attribute the base does not bear out, with what it has and the fix."""
    problems = []
    fix_row = (
        f"fix: set it on the row {row!r} of sources.manifest to what the pinned image has, or pin a base that has it"
    )
    if "glibc" in attrs and facts.glibc != attrs["glibc"]:
        has = (
            f"glibc {facts.glibc} ({facts.glibc_said})"
            if facts.glibc
            else "no glibc version (neither getconf nor ldd answered)"
        )
        problems.append(
            f"glibc={attrs['glibc']}: the base has {has}; {fix_row} (tp4-runtime's librow_store.so is "
            "checked against it)"
        )
    if "python" in attrs and _major_minor(facts.python) != attrs["python"]:
        has = f"Python {facts.python}" if facts.python else "no python3"
        problems.append(
            f"python={attrs['python']}: the base has {has}; {fix_row} (the wheels go into its site-packages)"
        )
    if "gcc" in attrs:
        want = attrs["gcc"]
        if not facts.gcc:
            problems.append(
                f"gcc={want}: the base has no gcc; b12x's RoCE proxy compiles itself with gcc at first use: "
                "pin a base with gcc"
            )
        elif facts.gcc.split(".")[: len(want.split("."))] != want.split("."):
            problems.append(f"gcc={want}: the base has gcc {facts.gcc}; {fix_row}")
    if attrs.get("verbs") == "yes":
        missing = [
            what
            for what, found in (
                ("/usr/include/infiniband/verbs.h", facts.verbs_h),
                ("libibverbs.so (what -libverbs links)", facts.libibverbs),
            )
            if not found
        ]
        if missing:
            problems.append(
                f"verbs=yes: the base lacks {' and '.join(missing)}; b12x's RoCE proxy compiles itself with "
                "-libverbs at first use: pin a base with libibverbs-dev"
            )
    for item in [i for i in attrs.get("packages", "").split(",") if i]:
        name, _, version = item.partition("==")
        held = facts.packages.get(_norm(name))
        if held is None:
            problems.append(
                f"packages=...{item}...: the base holds no {name} (python3 -I, importlib.metadata); {fix_row}"
            )
        elif version and held != version:
            problems.append(f"packages=...{item}...: the base holds {name} {held}; {fix_row}")
    return problems


@dataclass(frozen=True)
class Expected:
    row: str
    attrs: Mapping[str, str]


def expected(target: str) -> Expected | None:
    """The image's ``baseFacts`` (row name and attributes), or None when it carries none."""
    data = nix.eval_json(target, apply="i: i.baseFacts or (i.passthru or { }).baseFacts or null")
    if data is None:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("row"), str) or not isinstance(data.get("attrs"), dict):
        raise Tp4Error(
            f"{target}: baseFacts must be {{ row = <name>; attrs = {{ ... }}; }}, not {json.dumps(data)[:200]}"
        )
    return Expected(data["row"], {str(k): str(v) for k, v in data["attrs"].items() if k in ATTRS})


def archive_image_id(path: str) -> str | None:
    """The image id (its config's digest) of a docker-archive, read without reading its layers."""
    try:
        with tarfile.open(path) as tar:
            manifest = tar.extractfile("manifest.json")
            items = json.load(manifest) if manifest else None
            config = tar.extractfile(items[0]["Config"]) if isinstance(items, list) and items else None
            return "sha256:" + hashlib.sha256(config.read()).hexdigest() if config else None
    except (OSError, KeyError, ValueError, TypeError, tarfile.TarError):
        return None


def probe_argv(runtime: str, image: str, name: str) -> list[str]:
    return [
        runtime,
        "run",
        "--rm",
        "--network",
        "none",
        "--name",
        name,
        "--entrypoint",
        "/bin/sh",
        image,
        "-c",
        PROBE_SCRIPT,
    ]


def load_base(path: str, runtime: str, progress: Echo) -> str:
    """The base in the runtime: by its id when it is there already (a 33 GB base is not loaded
    again), else loaded from the archive."""
    image_id = archive_image_id(path)
    if image_id and runtime_cli.inspect(runtime, image_id) is not None:
        return image_id
    return runtime_cli.load(path, runtime, echo=progress)


def probe(runtime: str, image: str) -> Facts:
    name = f"tp4-base-probe-{os.getpid()}"
    try:
        proc = process.run(probe_argv(runtime, image, name), check=False, timeout=PROBE_TIMEOUT)
    except process.TimeoutExpired:
        runtime_cli.remove_container(runtime, name)
        raise Tp4Error(f"the base image's probe did not finish in {PROBE_TIMEOUT} s") from None
    except BaseException:
        runtime_cli.remove_container(runtime, name)
        raise
    if proc.returncode != 0 and "end=1" not in proc.stdout:
        raise Tp4Error(
            f"the base image's probe failed (exit code {proc.returncode}):\n{(proc.stderr or proc.stdout).strip()[-2000:]}"
        )
    return parse(proc.stdout)


def check(target: str, out_dir: Path, runtime: str, progress: Echo) -> Facts | None:
    """Build only the base, read it, and raise with every difference from its row; None when the
    image states no expectations."""
    want = expected(target)
    if want is None:
        return None
    base = nix.build(target + ".base", out_dir / "result-image-base", echo=progress)
    progress(f"reading the base image {base} (row {want.row!r} of sources.manifest)")
    image = load_base(base, runtime, progress)
    facts = probe(runtime, image)
    problems = differences(facts, want.row, want.attrs)
    if problems:
        lines = "\n".join(f"  {p}" for p in problems)
        raise Tp4Error(
            f"the base image differs from its row {want.row!r} of sources.manifest (docs/sources.md, "
            f'"The base image\'s row"), so nothing was built on it:\n{lines}'
        )
    progress(
        f"base image: glibc {facts.glibc}, Python {facts.python}, gcc {facts.gcc or '-'}, "
        f"verbs {'yes' if facts.verbs_h and facts.libibverbs else 'no'}, {len(facts.packages)} packages: as its row says"
    )
    return facts
