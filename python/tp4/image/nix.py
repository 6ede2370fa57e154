"""Every call of the nix CLI.

Flakes and the flake.lock format (version 7) need Nix >= 2.4, and that is all a flake with no
nixpkgs input needs (the tests' image flakes). A flake that pins nixpkgs needs what that nixpkgs
asks for: the generation tp4 pins refuses to evaluate on Nix older than 2.18
(``lib/minfeatures.nix``), so `tp4 build` on the line's flake asks for 2.18 before nix fails in
the middle of an evaluation. Every call passes ``--extra-experimental-features 'nix-command
flakes'`` so a Nix that has not enabled flakes in its configuration works too.

Before nix fetches a flake's locked inputs, :func:`require` checks that those not yet in the store
can be fetched at all: a host name that does not resolve is reported at once (nix would retry it
for seconds and then print a wall of warnings).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from tp4.core import process
from tp4.core.errors import InvalidInput, Tp4Error

MIN_VERSION = (2, 4)
WHY_MIN_VERSION = "flakes and the flake.lock format (version 7) arrived in Nix 2.4"
NIXPKGS_MIN_VERSION = (2, 18)
WHY_NIXPKGS_MIN_VERSION = "the nixpkgs this flake pins refuses to evaluate on older Nix (its lib/minfeatures.nix)"
INSTALL_HINT = (
    "install Nix 2.18 or newer (Debian 12's nix-bin is 2.8: use the Nix installer, or "
    "`nix profile install nixpkgs#nixVersions.latest` from an existing Nix) and retry"
)
FEATURES = ["--extra-experimental-features", "nix-command flakes"]


def find_flake(start: str | os.PathLike[str] | None = None) -> Path:
    """The directory holding flake.nix: ``start`` or its nearest parent (default: $TP4_FLAKE, else cwd)."""
    here = Path(start or os.environ.get("TP4_FLAKE") or os.getcwd()).resolve()
    for d in (here, *here.parents):
        if (d / "flake.nix").is_file():
            return d
    raise InvalidInput(f"no flake.nix in {here} or its parents: run tp4 in the tp4 repository or pass --flake")


@dataclass(frozen=True)
class LockedInput:
    """One locked input of flake.lock, as far as tp4 needs to know it."""

    name: str
    type: str
    # what nix downloads it from (None for local inputs), and where the unpacked tree lands
    url: str | None
    store_path: str | None
    nixpkgs: bool

    @property
    def host(self) -> str | None:
        from tp4.image.sources.download import host_of

        return host_of(self.url) if self.url else None

    @property
    def present(self) -> bool:
        return self.store_path is not None and os.path.exists(self.store_path)


def locked_inputs(flake: Path) -> list[LockedInput]:
    """The non-root nodes of ``flake/flake.lock`` (none without a lock file)."""
    lock_file = flake / "flake.lock"
    try:
        data = json.loads(lock_file.read_text())
        nodes = data["nodes"]
        root = data.get("root", "root")
    except FileNotFoundError:
        return []
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
        raise InvalidInput(f"{lock_file}: not a flake lock file ({exc}); regenerate it with `nix flake lock`") from None
    found = []
    for name, node in nodes.items():
        locked = node.get("locked") if isinstance(node, dict) and name != root else None
        if not isinstance(locked, dict):
            continue
        kind = str(locked.get("type", ""))
        found.append(
            LockedInput(
                name=name,
                type=kind,
                url=_fetch_url(locked),
                store_path=_store_path(locked),
                nixpkgs=kind == "github" and str(locked.get("repo", "")).lower() == "nixpkgs",
            )
        )
    return found


def _fetch_url(locked: Mapping[str, object]) -> str | None:
    kind = locked.get("type")
    if kind == "github":
        host = locked.get("host", "github.com")
        api = "api.github.com" if host == "github.com" else f"{host}/api/v3"
        return f"https://{api}/repos/{locked.get('owner')}/{locked.get('repo')}/tarball/{locked.get('rev')}"
    if kind == "gitlab":
        return (
            f"https://{locked.get('host', 'gitlab.com')}/api/v4/projects/{locked.get('owner')}%2F{locked.get('repo')}"
        )
    if kind in ("tarball", "file", "git", "hg"):
        url = str(locked.get("url", ""))
        return url if "://" in url and not url.startswith(("file://", "git+file://", "path:")) else None
    return None


def _store_path(locked: Mapping[str, object]) -> str | None:
    """Where nix keeps an input once fetched: fetchTree's `source` path of its narHash."""
    from tp4.image.sources import nar

    try:
        return nar.store_path("source", nar.parse_hash(str(locked["narHash"])))
    except (KeyError, ValueError, Tp4Error):
        return None


def required_version(flake: Path | None) -> tuple[tuple[int, ...], str]:
    """The least Nix version the flake can be evaluated with, and why."""
    if flake is not None and any(i.nixpkgs for i in locked_inputs(flake)):
        return NIXPKGS_MIN_VERSION, WHY_NIXPKGS_MIN_VERSION
    return MIN_VERSION, WHY_MIN_VERSION


def check_fetchable(flake: Path) -> None:
    """Every locked input that is not in the store yet has a host name that resolves."""
    failed: dict[str, list[str]] = {}
    for inp in locked_inputs(flake):
        host = inp.host
        if host is None or inp.present:
            continue
        if host not in failed:
            try:
                socket.getaddrinfo(host, 443, type=socket.SOCK_STREAM)
                failed[host] = []
                continue
            except (socket.gaierror, UnicodeError):
                failed[host] = [inp.name]
                continue
        if failed[host]:
            failed[host].append(inp.name)
    bad = {h: names for h, names in failed.items() if names}
    if bad:
        what = "; ".join(f"{', '.join(names)} from {host}" for host, names in bad.items())
        raise Tp4Error(
            f"the flake's inputs are not in the Nix store and cannot be fetched ({what}): cannot resolve "
            f"{', '.join(bad)}, this machine looks offline. Run it on a machine with network access, "
            "or copy the inputs here first (`nix flake archive --to ssh://THIS-HOST` from a machine that has them)"
        )


def base() -> list[str]:
    return ["nix", *FEATURES]


def parse_version(text: str) -> tuple[int, ...]:
    """``nix (Nix) 2.8.0`` -> (2, 8, 0)."""
    m = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", text)
    if not m:
        raise Tp4Error(f"cannot read the Nix version from `nix --version` output {text.strip()!r}")
    return tuple(int(g) for g in m.groups() if g is not None)


def require(flake: Path | None = None, *, what: str = "tp4 build") -> tuple[int, ...]:
    """The installed Nix version; a clear error when Nix is missing or older than the flake needs,
    or when the flake's missing inputs cannot be fetched (see :func:`check_fetchable`)."""
    minimum, why = required_version(flake)
    need = ".".join(map(str, minimum))
    hint = (
        INSTALL_HINT
        if minimum >= NIXPKGS_MIN_VERSION
        else "install Nix (Debian/Ubuntu: apt-get install nix-bin) and retry"
    )
    if shutil.which("nix") is None:
        raise Tp4Error(f"nix is not installed: {what} needs Nix >= {need} ({why}); {hint}")
    version = parse_version(process.run(["nix", "--version"]).stdout)
    if version < minimum:
        have = ".".join(map(str, version))
        raise Tp4Error(f"nix {have} is too old: {what} needs Nix >= {need} ({why}); {hint}")
    if flake is not None:
        check_fetchable(flake)
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
    proc = process.start(argv, echo=echo, stdout=process.PIPE, stderr=process.PIPE, text=True)
    nom = shutil.which("nom") if sys.stderr.isatty() else None
    tail: list[str] = []
    viewer = None
    try:
        if nom:
            viewer = process.start([nom, "--json"], stdin=proc.stderr, foreground=True)
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
    except BaseException:  # Ctrl-C: nix and the viewer go with it
        process.stop(proc)
        if viewer is not None:
            process.stop(viewer)
        raise
    if proc.returncode != 0:
        raise Tp4Error(f"`nix build {target}` failed with exit code {proc.returncode}\n" + "\n".join(tail))
    path = json.loads(out)[0]["outputs"]["out"]
    if not isinstance(path, str):
        raise Tp4Error(f"`nix build {target}` printed no output path: {out.strip()[:200]}")
    return path


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
