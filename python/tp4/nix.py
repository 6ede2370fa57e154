"""Every call of the nix CLI.

tp4 needs Nix >= 2.4: the flake (``nix build .#image``, ``nix eval``, ``nix path-info``) and its
lock file (format version 7) came with 2.4. Every call passes ``--extra-experimental-features
'nix-command flakes'`` so a Nix that has not enabled flakes in its configuration works too.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tp4 import process
from tp4.errors import Tp4Error

MIN_VERSION = (2, 4)
WHY_MIN_VERSION = "flakes and the flake.lock format (version 7) arrived in Nix 2.4"
FEATURES = ["--extra-experimental-features", "nix-command flakes"]


def base() -> list[str]:
    return ["nix", *FEATURES]


def parse_version(text: str) -> tuple[int, ...]:
    """``nix (Nix) 2.8.0`` -> (2, 8, 0)."""
    m = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", text)
    if not m:
        raise Tp4Error(f"cannot read the Nix version from `nix --version` output {text.strip()!r}")
    return tuple(int(g) for g in m.groups() if g is not None)


def require() -> tuple[int, ...]:
    """The installed Nix version; a clear error when Nix is missing or older than MIN_VERSION."""
    need = ".".join(map(str, MIN_VERSION))
    if shutil.which("nix") is None:
        raise Tp4Error(
            f"nix is not installed: tp4 build needs Nix >= {need} ({WHY_MIN_VERSION}); "
            "install Nix (Debian/Ubuntu: apt-get install nix-bin) and retry"
        )
    version = parse_version(process.run(["nix", "--version"]).stdout)
    if version < MIN_VERSION:
        have = ".".join(map(str, version))
        raise Tp4Error(
            f"nix {have} is too old: tp4 build needs Nix >= {need} ({WHY_MIN_VERSION}); "
            "upgrade Nix and retry"
        )
    return version


def installable(flake: str, attr: str, system: str | None = None) -> str:
    """`<flake>#<attr>` (nix picks the host's system), or `<flake>#packages.<system>.<attr>`."""
    return f"{flake}#packages.{system}.{attr}" if system else f"{flake}#{attr}"


def build_argv(target: str, out_link: Path, *, progress: bool = True) -> list[str]:
    argv = [*base(), "build", target, "--json", "--out-link", str(out_link)]
    if progress:
        argv += ["--log-format", "internal-json", "-v"]
    return argv


def eval_json(target: str, *, apply: str | None = None) -> object:
    argv = [*base(), "eval", "--json", target]
    if apply:
        argv += ["--apply", apply]
    return json.loads(process.run(argv).stdout)


def eval_raw(target: str) -> str:
    return process.run([*base(), "eval", "--raw", target]).stdout


def derivation(target: str) -> str:
    """The .drv of an installable, without building it."""
    return process.run([*base(), "path-info", "--derivation", target]).stdout.strip()


@dataclass(frozen=True)
class Plan:
    """What `nix build --dry-run` says: derivations to build and paths to fetch."""

    build: tuple[str, ...]
    fetch: tuple[str, ...]


def dry_run(target: str) -> Plan:
    """Derivations `nix build` would build (and paths it would fetch); nothing is built."""
    err = process.run([*base(), "build", "--dry-run", target, "--no-link"]).stderr
    build: list[str] = []
    fetch: list[str] = []
    current: list[str] | None = None
    for line in err.splitlines():
        if "will be built" in line:
            current = build
        elif "will be fetched" in line:
            current = fetch
        elif line.startswith("  /nix/store/") and current is not None:
            current.append(line.strip())
        else:
            current = None
    return Plan(tuple(build), tuple(fetch))


def build(target: str, out_link: Path, *, echo: Callable[[str], None]) -> str:
    """Build one installable with a progress display; returns its output path.

    nix-output-monitor renders the log when it is installed and stderr is a terminal; otherwise
    nix's internal-json log is read here and each build or download is echoed as one line.
    """
    argv = build_argv(target, out_link)
    echo(f"$ {shlex.join(argv)}")
    proc = process.start(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    nom = shutil.which("nom") if sys.stderr.isatty() else None
    tail: list[str] = []
    if nom:
        viewer = process.start([nom, "--json"], stdin=proc.stderr)
        out = proc.stdout.read() if proc.stdout else ""
        proc.wait()
        viewer.wait()
    else:
        assert proc.stderr is not None
        for line in proc.stderr:
            event = log_event(line)
            if event is None:
                continue
            kind, text = event
            if kind == "progress":
                echo(text)
            else:
                tail = (tail + [text])[-20:]
        out = proc.stdout.read() if proc.stdout else ""
        proc.wait()
    if proc.returncode != 0:
        raise Tp4Error(f"`nix build {target}` failed with exit code {proc.returncode}\n" + "\n".join(tail))
    return json.loads(out)[0]["outputs"]["out"]


def log_event(line: str) -> tuple[str, str] | None:
    """One line of nix's internal-json log -> ("progress", text) for a build, download or copy
    starting; ("detail", text) for an error, a builder's log line or plain stderr (kept to
    explain a failure); None otherwise."""
    if not line.startswith("@nix "):
        return ("detail", line.rstrip()) if line.strip() else None
    try:
        event = json.loads(line[5:])
    except json.JSONDecodeError:
        return None
    if event.get("action") == "msg" and event.get("level", 9) <= 0:
        return "detail", _plain(event.get("msg", ""))
    # result type 101 = a line of a builder's log
    if event.get("action") == "result" and event.get("type") == 101 and event.get("fields"):
        return "detail", _plain(str(event["fields"][0]))
    # activity types: 100 = copy path, 101 = file transfer, 105 = build
    if event.get("action") == "start" and event.get("type") in (100, 101, 105) and event.get("text"):
        return "progress", _plain(event["text"])
    return None


def _plain(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", text)
