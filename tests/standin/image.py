"""The stand-in engine's test image: a docker-archive built from the host's files, no network.

One layer: Debian's /usr/bin/python3 with the shared libraries ldd finds for it and for its
lib-dynload modules, its standard library (/usr/lib/python3.X without test suites, __pycache__,
IDLE, tkinter and ensurepip), a static busybox with the applets a rank's stop needs (sh, pkill,
ps, kill, ...), the stand-in engine at the line image's entrypoint path (tp4/data/container.toml
`image.boot`, run as `python3 -u <boot> run`, as pkgs/image.nix does) with the registry beside it,
the stand-in Engram packer (tests/standin/pack_engram.py) at upstream's
/opt/dsv41/scripts/pack_engram.py (what `tp4 pack` runs), and the b12x_next source stamps
(SOURCE_COMMIT, SOURCE_PATCH) of sources.manifest.

``archive()`` builds it once per test session; ``load(env, tag)`` loads it into the podman store
that env names (CONTAINERS_STORAGE_CONF), once per store, and returns the image reference.
"""

from __future__ import annotations

import atexit
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

from nix_env import BUSYBOX

from tp4.core import process
from tp4.line.container import IMAGE
from tp4.hosts.pack import PACKER as PACK_SCRIPT

REPO = Path(__file__).resolve().parents[2]
ENGINE = Path(__file__).resolve().parent / "engine.py"
PACKER = Path(__file__).resolve().parent / "pack_engram.py"  # at upstream's path, /opt/dsv41/scripts/
REGISTRY = REPO / "python" / "tp4" / "data" / "registry.toml"
MANIFEST = REPO / "python" / "tp4" / "data" / "sources.manifest"
PYTHON = Path("/usr/bin/python3")
APPLETS = ("sh", "cat", "env", "kill", "ls", "pgrep", "pkill", "ps", "sleep", "true")
# not needed to run the engine, and large
SKIP_DIRS = {
    "__pycache__",
    "test",
    "tests",
    "idle_test",
    "idlelib",
    "tkinter",
    "turtledemo",
    "ensurepip",
    "lib2to3",
    "site-packages",
    "dist-packages",
}
REPOSITORY = "localhost/tp4-standin"

_built: dict[str, Path] = {}
_loaded: dict[tuple[str, str], str] = {}


def b12x_next_stamps() -> tuple[str, str]:
    """(SOURCE_COMMIT, SOURCE_PATCH) of the b12x_next tree, as sources.manifest pins them."""
    text = MANIFEST.read_text()
    commit = re.search(r"^b12x-main\s+([0-9a-f]{40})\s", text, re.M)
    patch = re.search(r"^tree b12x-next\s.*?expect-patch=([0-9a-f]{16})", text, re.M | re.S)
    assert commit and patch, "sources.manifest: no b12x-main row or b12x-next tree"
    return commit[1], patch[1]


def shared_libraries(paths: list[Path]) -> set[Path]:
    """What ldd names for these ELF files: libraries and the program interpreter."""
    found: set[Path] = set()
    for path in paths:
        out = subprocess.run(["ldd", str(path)], capture_output=True, text=True, check=False).stdout
        for line in out.splitlines():
            m = re.search(r"(?:=>\s*)?(/\S+)\s+\(0x", line)
            if m:
                found.add(Path(m[1]))
    return found


def _stdlib() -> Path:
    out = subprocess.run(
        [str(PYTHON), "-c", "import sysconfig; print(sysconfig.get_paths()['stdlib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    return Path(out)


def _files() -> dict[str, Path | bytes | str]:
    """Path in the image -> a host file to copy, bytes to write, or a str: a symlink's target."""
    python = PYTHON.resolve()
    stdlib = _stdlib()
    files: dict[str, Path | bytes | str] = {str(python): python}
    if PYTHON.name != python.name:
        files[str(PYTHON)] = python.name
    for dirpath, dirnames, filenames in os.walk(stdlib):
        # config-3.X-<triplet> holds the static libpython of python3-dev
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not d.startswith("config-"))
        for name in sorted(filenames):
            src = Path(dirpath) / name
            if name.startswith(("_test", "xxlimited")) or not src.exists():  # a dangling link (Debian's sitecustomize)
                continue
            files[str(src)] = src.resolve()
    dynload = [Path(p) for p in files.values() if isinstance(p, Path) and p.suffix == ".so"]
    for lib in shared_libraries([python, *dynload]):
        files[str(lib)] = lib.resolve()
    files["/bin/busybox"] = Path(BUSYBOX)
    for applet in APPLETS:
        files[f"/bin/{applet}"] = "busybox"
    files[IMAGE.boot] = ENGINE
    files[str(Path(IMAGE.boot).parent / "registry.toml")] = REGISTRY
    files[PACK_SCRIPT] = PACKER
    commit, patch = b12x_next_stamps()
    files[f"{IMAGE.b12x_next}/b12x_next/SOURCE_COMMIT"] = f"{commit}\n".encode()
    files[f"{IMAGE.b12x_next}/b12x_next/SOURCE_PATCH"] = f"{patch}\n".encode()
    files["/tmp/.keep"] = b""
    return files


def _layer(files: dict[str, Path | bytes | str], out: Path) -> None:
    dirs: set[str] = set()
    for path in files:
        parts = Path(path.lstrip("/")).parts
        dirs.update("/".join(parts[:i]) for i in range(1, len(parts)))
    with tarfile.open(out, "w", format=tarfile.GNU_FORMAT) as tar:
        for d in sorted(dirs):
            info = tarfile.TarInfo(d)
            info.type, info.mode = tarfile.DIRTYPE, 0o1777 if d == "tmp" else 0o755
            tar.addfile(info)
        for path, what in sorted(files.items()):
            info = tarfile.TarInfo(path.lstrip("/"))
            if isinstance(what, str):
                info.type, info.linkname, info.mode = tarfile.SYMTYPE, what, 0o777
                tar.addfile(info)
            elif isinstance(what, bytes):
                info.size, info.mode = len(what), 0o644
                tar.addfile(info, io.BytesIO(what))
            else:
                info.size, info.mode = what.stat().st_size, what.stat().st_mode & 0o755 | 0o444
                with open(what, "rb") as fh:
                    tar.addfile(info, fh)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def archive() -> tuple[Path, str]:
    """The image as a docker-archive, built once per session; (path, reference it carries)."""
    if "archive" not in _built:
        work = Path(tempfile.mkdtemp(prefix="tp4-standin-"))
        atexit.register(shutil.rmtree, work, True)
        layer = work / "layer.tar"
        _layer(_files(), layer)
        diff = _sha256(layer)
        arch = {"x86_64": "amd64", "aarch64": "arm64"}.get(os.uname().machine, os.uname().machine)
        config = json.dumps(
            {
                "architecture": arch,
                "os": "linux",
                "config": {
                    "Entrypoint": ["python3", "-u", IMAGE.boot],
                    "Cmd": ["run"],
                    "WorkingDir": IMAGE.runtime,
                    "Env": ["PATH=/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE=1"],
                    "Labels": {"tp4.standin": diff[:16]},
                },
                "rootfs": {"type": "layers", "diff_ids": [f"sha256:{diff}"]},
            }
        ).encode()
        cfg = hashlib.sha256(config).hexdigest()
        ref = f"{REPOSITORY}:{diff[:16]}"
        (work / diff).mkdir()
        layer.rename(work / diff / "layer.tar")
        (work / f"{cfg}.json").write_bytes(config)
        (work / "manifest.json").write_text(
            json.dumps([{"Config": f"{cfg}.json", "RepoTags": [ref], "Layers": [f"{diff}/layer.tar"]}])
        )
        out = work / "tp4-standin.tar"
        with tarfile.open(out, "w") as tar:
            for name in ("manifest.json", f"{cfg}.json", f"{diff}/layer.tar"):
                tar.add(work / name, arcname=name)
        shutil.rmtree(work / diff)
        _built["archive"], _built["ref"] = out, Path(ref)
    return _built["archive"], str(_built["ref"])


def load(env: dict[str, str], tag: str | None = None) -> str:
    """Load the image into the podman store of env (CONTAINERS_STORAGE_CONF etc.), once per store;
    tag it `tag` too when given. Returns the reference to run."""
    path, ref = archive()
    store = env.get("CONTAINERS_STORAGE_CONF", "")
    if (store, ref) not in _loaded:
        process.run(["podman", "load", "-q", "-i", str(path)], env=env)
        _loaded[(store, ref)] = ref
    if tag:
        process.run(["podman", "tag", ref, tag], env=env)
        return tag
    return ref
