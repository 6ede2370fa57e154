"""Hostile values on every option of every command (issue 25, "Tests"). The command tree is read
from tp4.cli (LazyGroup.list_commands/get_command, recursively through every group), so an option
added tomorrow is walked without editing this file: its kind (a number, an input or output file or
directory, a choice, text) is read from its click type, metavar, name and default, and it gets
generated values of every class of hostile input that fits that kind. Every run must:

* exit 1 or 2 (0 only for a value of a class that is fine for that kind of option, e.g. a label
  starting with a dash), never 70 (tp4's "internal error"), 130, a crash or a hang;
* when it refuses the input (exit 2), say so naming the option (a flag, the argument's name) or
  showing the value (a path, a row's name); a value no option of that kind may take (a number past
  64 bits or of 4,300 digits, nan, "true", "٣", "=5", a FIFO, a device, a file nested 5,000 deep,
  a 64 MiB file, a directory where a file goes...) must be refused so, not met with exit 1 later;
* print no traceback, no "internal error", and no secret of the test's key files (the API key,
  the ssh identity);
* change nothing outside its scratch directory: HOME and the XDG directories are scratch; the
  repository tree is compared after the walk; the top of / and of the real HOME, and the devices
  the test links to, after every case; the test's inputs are hashed; a file the test made as the
  value (a FIFO, a link) must not be replaced; a refusal leaves no new file; a process a case
  leaves running (an image store) is stopped and, after a failure, reported.

No real host is reached: the profile's nodes are 127.0.0.1-4 on port 9 (discard, nothing listens:
a connect is refused at once), trusted in a scratch known_hosts so commands get past the host-key
check and fail reaching them (exit 1); the API is on port 9 too; HF_ENDPOINT, TP4_GITHUB_API and
TP4_SOURCES_MIRROR point at it; TP4_FLAKE is a flake without outputs (nix fails at once); commands
with --dry-run get it. Every run is in-process (tp4.cli.main) under SIGALRM (CASE_SECONDS) and an
address-space cap, so a hang on a FIFO or a read of /dev/zero is reported, not fatal.

Size: 17 classes (leading dash, control character, very long, past 64 bits, 4,300+ digits, not
finite, boolean, unicode digits, =value form, device, fifo, wrong kind of file, dangling symlink,
missing or read-only directory, nested 5,000 deep, huge file, a key file) over 173 value options
and arguments of 40 commands: 1,567 (option, class) pairs, each run on its canonical example and
MAX_EXAMPLES generated values (no shrinking: a failure shows the value as run). One walk makes
about 4,350 invocations (printed at its end: "hostile CLI walk: N invocations"), ~2 minutes on 2
cores. A failure says the command line, the class, the kind of option, the exit code and the last
lines of the output; the test id is "COMMAND OPTION [CLASS]".

Files named by the environment (TP4_KNOWN_HOSTS, TP4_PROFILE, TP4_SOURCES_MANIFEST: every TP4_*
variable in the source is either walked or listed as no file) get 6 file classes each: 18 cases.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import io
import json
import os
import re
import resource
import shutil
import signal
import stat
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import click
import pytest
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

REPO = Path(__file__).resolve().parent.parent
ENV_FILE = REPO / "tests" / "fixtures" / "env.tp4.production"
MANIFEST = REPO / "sources.manifest"
SECRET = "sk-tp4WALKERsecret-0f9e8d7c6b5a"
SECRETS = [SECRET]  # and the body of the ssh identity, once made
CASE_SECONDS = 8
MAX_EXAMPLES = int(os.environ.get("TP4_HOSTILE_CLI_EXAMPLES", "2"))
INTERNAL = ("Traceback (most recent call last)", "internal error", "rerun with -v for the traceback")
MEMORY_HEADROOM = 3 << 30  # address space a case may map beyond what pytest has
CLOSED_PORT = 9  # discard: nothing listens on it here, a connect is refused at once

# --- the command tree ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Param:
    command: tuple[str, ...]
    param: click.Parameter
    kind: str  # int, number, file-in, file-out, dir-in, dir-out, choice, text

    @property
    def id(self) -> str:
        return f"{' '.join(self.command)} {self.flag}"

    @property
    def flag(self) -> str:
        if isinstance(self.param, click.Option):
            return max(self.param.opts, key=len)
        return self.param.human_readable_name

    def names(self) -> list[str]:
        """What a message naming this parameter says: any of its flags, its name, its metavar."""
        p = self.param
        out = [*p.opts, *getattr(p, "secondary_opts", []), p.human_readable_name]
        if isinstance(p, click.Argument):
            out += [p.name or "", (p.name or "").upper(), (p.name or "").replace("_", " ")]
        if p.metavar:
            out.append(p.metavar.strip("[].").split("|")[0])
        return [n for n in out if n and len(n) > 1]


def walk() -> Iterator[tuple[tuple[str, ...], click.Command]]:
    from tp4.cli import cli

    def go(cmd: click.Command, path: tuple[str, ...], ctx: click.Context):
        if isinstance(cmd, click.Group):
            for name in cmd.list_commands(ctx):  # LazyGroup imports the module of each here
                sub = cmd.get_command(ctx, name)
                assert sub is not None, name
                yield from go(sub, (*path, name), click.Context(sub, parent=ctx, info_name=name))
        else:
            yield path, cmd

    yield from go(cli, (), click.Context(cli, info_name="tp4"))


NUMERIC_METAVAR = re.compile(r"^(\[PHASE=\])?(N|SECONDS|FRACTION|PCT|TOKENS/S|N\[k\|M\],\.\.\.)$")
OUT_NAME = re.compile(r"(^|_)(out|output|to|json_path|out_dir|out_file|root)$")
DIR_NAME = re.compile(r"(^|_)(dir|root|flake_dir|corpus|head_checkout|to|out_dir)$")


# What no rule can tell from the option's type, name or metavar: a path on another machine is text.
KIND_OVERRIDES = {("profile", "import", "head_checkout"): "text"}


def kind_of(p: click.Parameter, path: tuple[str, ...] = ()) -> str:
    if (*path, p.name) in KIND_OVERRIDES:
        return KIND_OVERRIDES[(*path, p.name)]
    t, name, mv = p.type, p.name or "", (p.metavar or "")
    if isinstance(t, click.Choice):
        return "choice"
    if isinstance(t, click.types.IntParamType) or mv == "N":
        return "int"
    if isinstance(t, click.types.FloatParamType) or NUMERIC_METAVAR.match(mv):
        return "number"
    if mv == "LIST" and isinstance(p.default, str) and re.fullmatch(r"[0-9,]+", p.default):
        return "number"
    if isinstance(p.default, str) and re.fullmatch(r"[0-9]+(\.[0-9]+)?", p.default):
        return "number"
    is_path = isinstance(t, (click.Path, click.File)) or mv.split("|")[-1] in ("FILE", "DIR", "RESULT...")
    is_path = is_path or name in ("old", "new", "manifest_file", "api_key_file")
    if not is_path and not DIR_NAME.search(name):
        return "text"
    is_dir = (isinstance(t, click.Path) and not t.file_okay) or mv == "DIR" or bool(DIR_NAME.search(name))
    out = bool(OUT_NAME.search(name))
    return ("dir-" if is_dir else "file-") + ("out" if out else "in")


def all_params() -> list[Param]:
    out = []
    for path, cmd in walk():
        for p in cmd.params:
            if isinstance(p, click.Option) and (p.is_flag or p.count or p.hidden and p.name == "help"):
                continue
            out.append(Param(path, p, kind_of(p, path)))
    return out


PARAMS = all_params()

# --- the classes of hostile values ---------------------------------------------------------------

K = 1024
CONTROL = ["\x00", "\n", "\r", "\x1b", "\x7f", "\u2028", "\x85", "\t"]


class Hostile(str):
    """A value whose repr stays short in hypothesis' report (the failure message shows it whole)."""

    def __repr__(self) -> str:
        r = str.__repr__(self)
        return r if len(r) <= 80 else f"{r[:40]}...<{len(self)} chars>"


def _text(max_size: int = 12) -> st.SearchStrategy[str]:
    return st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=max_size)


# class -> (the kinds it is fed to, the kinds that must refuse it, its canonical example, strategy)
# A "path:" value is made in the case's scratch directory by make_path().
CLASSES: dict[str, tuple[set[str], set[str], str, st.SearchStrategy[str]]] = {
    "leading dash": (
        {"int", "number", "choice", "text", "file-in", "file-out", "dir-in", "dir-out"},
        {"int", "number", "choice"},
        "-oProxyCommand=x",
        st.sampled_from(["-oProxyCommand=x", "--help", "-", "--", "-1"]) | st.builds("-{}".format, _text()),
    ),
    "control character": (
        {"int", "number", "choice", "text", "file-in", "file-out", "dir-in", "dir-out"},
        {"int", "number", "choice", "file-in", "dir-in"},
        "a\nb",
        # starts with a letter: a relative path, in the case's scratch directory, never under /
        st.builds(lambda a, c, b: "v" + a + c + b, _text(6), st.sampled_from(CONTROL), _text(6)),
    ),
    "very long": (
        {"int", "number", "choice", "text", "file-in", "file-out", "dir-in", "dir-out"},
        {"int", "number", "choice", "file-in", "dir-in"},
        "x" * (128 * K + 1),
        # past the kernel's bound on one argv word (no shell passes it), and under it (a shell does)
        st.builds(
            lambda n, c: c * n,
            st.sampled_from([128 * K + 1, 256 * K, 4097, 64 * K]),
            st.sampled_from(["x", "9", "a/", "é"]),  # never "/" alone: `--root ////` is / itself
        ),
    ),
    "past 64 bits": (
        {"int", "number", "choice", "text"},
        {"int", "number", "choice"},
        str(2**64 + 1),
        st.integers(2**63, 2**200).map(str) | st.integers(max_value=-(2**63), min_value=-(2**200)).map(str),
    ),
    "4,300+ digits": (
        {"int", "number", "choice", "text"},
        {"int", "number", "choice"},
        "9" * 4301,
        st.builds(lambda n, d: d * n, st.integers(4301, 6000), st.sampled_from(["9", "1"])),
    ),
    "not finite": (
        {"int", "number", "choice"},
        {"int", "number", "choice"},
        "nan",
        st.sampled_from(["nan", "inf", "-inf", "1e400", "NaN", "Infinity", "-1e999", "infinity"]),
    ),
    "boolean": (
        {"int", "number", "choice"},
        {"int", "number", "choice"},
        "true",
        st.sampled_from(["true", "false", "True", "yes", "on"]),
    ),
    "unicode digits": (
        {"int", "number", "choice", "text"},
        {"int", "number", "choice"},
        "٣",
        st.sampled_from(["٣", "３", "³", "߃", "𝟑", " 3", "+3", "3_000", "-0", "3\u200b", "1_0.5"]),
    ),
    "=value form": (
        {"int", "number", "choice", "text", "file-in", "file-out", "dir-in", "dir-out"},
        {"int", "number", "choice"},
        "=5",
        st.sampled_from(["=5", "=", "==5", "=nan"]) | st.builds("={}".format, _text(8)),
    ),
    "device": (
        {"file-in", "file-out", "dir-in", "dir-out"},
        {"file-in", "file-out", "dir-in", "dir-out"},
        "path:link-to-dev-zero",
        # through links in scratch, never the device's own path: run as root, a writer that replaces
        # its target (a temporary file renamed over it) would replace /dev/zero itself
        st.sampled_from(["path:link-to-dev-full", "path:link-to-dev-urandom", "path:link-to-dev-null"]),
    ),
    "fifo": (
        {"file-in", "file-out", "dir-in", "dir-out"},
        {"file-in", "file-out", "dir-in", "dir-out"},
        "path:fifo",
        st.just("path:fifo"),
    ),
    "wrong kind of file": (  # a directory where a file goes, a file where a directory goes
        {"file-in", "file-out", "dir-in", "dir-out"},
        {"file-in", "file-out", "dir-in", "dir-out"},
        "path:wrong-kind",
        st.just("path:wrong-kind"),
    ),
    "dangling symlink": (
        {"file-in", "file-out", "dir-in", "dir-out"},
        {"file-in", "dir-in"},
        "path:dangling",
        st.just("path:dangling"),
    ),
    "missing or read-only directory": (
        {"file-in", "file-out", "dir-in", "dir-out"},
        {"file-in", "file-out", "dir-in", "dir-out"},
        "path:missing/x",
        st.sampled_from(["path:missing/x", "/proc/tp4-hostile/x", "/proc/1/tp4-hostile"]),
    ),
    "nested 5,000 deep": (
        {"file-in"},
        {"file-in"},
        "path:nested.json",
        st.sampled_from(["path:nested.json", "path:nested.toml", "path:nested-table.toml"]),
    ),
    "huge file": (
        {"file-in"},
        {"file-in"},
        "path:huge",
        st.just("path:huge"),
    ),
    "a key file": (  # a secret where another file goes: never echoed
        {"file-in", "dir-in"},
        set(),
        "path:key",
        st.just("path:key"),
    ),
}

# What an option takes by design although its kind refuses it: `sources hash PATH` hashes any file,
# directory or symlink (a link to a device is hashed as the link, as nix does); `image-store
# stop|status --root` of a directory that is not there says "not running".
ACCEPTS = {
    ("sources", "hash", "path"): {"wrong kind of file", "nested 5,000 deep", "huge file", "a key file", "device"},
    ("image-store", "stop", "root"): {"missing or read-only directory"},
    ("image-store", "status", "root"): {"missing or read-only directory"},
}
CASES = [(p, c) for p in PARAMS for c, (kinds, *_rest) in CLASSES.items() if p.kind in kinds]

# --- the scratch world -----------------------------------------------------------------------------

PROFILE = f"""\
preset = "production"
[cluster]
identity = "{{root}}/id_ed25519"
port = {CLOSED_PORT}
[cluster.head]
name = "spark1"
ip = "127.0.0.1"
ssh_port = {CLOSED_PORT}
"""
PROFILE += "".join(
    f'[[cluster.workers]]\nname = "spark{i}"\nip = "127.0.0.{i}"\nssh_port = {CLOSED_PORT}\n' for i in (2, 3)
)
# one NixOS node, so `tp4 deploy` has a host to act on
PROFILE += f'[[cluster.workers]]\nname = "spark4"\nip = "127.0.0.4"\nssh_port = {CLOSED_PORT}\nkind = "nixos"\n'
PROFILE += '[api]\nkey_file = "{root}/api-key"\n'

FLEET = f"""\
base = "profile.toml"
[[lines]]
name = "a"
[router]
host = "local"
port = {CLOSED_PORT}
state_dir = "{{root}}/router"
"""


def _result_json() -> str:
    spec = importlib.util.spec_from_file_location("_tp4_test_report", REPO / "tests" / "test_report.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return json.dumps(module.tp4_result())


@pytest.fixture(scope="module")
def world(tmp_path_factory, request) -> Iterator[Path]:
    """HOME, XDG dirs, the profile, fleet, manifest, key files: all in scratch; network ends on
    closed loopback ports; the repository tree hashed before and compared after every case."""
    root = tmp_path_factory.mktemp("hostile-cli")
    inputs = root / "inputs"
    inputs.mkdir()
    for d in ("home", "state", "cache", "config", "data", "runtime"):
        (root / d).mkdir(mode=0o700)
    (inputs / "api-key").write_text(SECRET + "\n")
    (inputs / "api-key").chmod(0o600)
    # a real key pair: the identity of every node, and the host key tp4 trusts for each (so a
    # command gets past the host-key check and fails reaching the closed port, exit 1)
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "", "-f", str(inputs / "id_ed25519")], check=True
    )
    key_body = (inputs / "id_ed25519").read_text().splitlines()[1]
    SECRETS.append(key_body)
    public = (inputs / "id_ed25519.pub").read_text().split()[:2]
    (root / "state" / "tp4").mkdir(parents=True)
    (root / "state" / "tp4" / "known_hosts").write_text(
        "".join(f"[127.0.0.{i}]:{CLOSED_PORT} {' '.join(public)}\n" for i in (1, 2, 3, 4))
    )
    # the flake build, distribute and deploy find: it has no outputs, so nix fails at once
    (root / "flake").mkdir()
    (root / "flake" / "flake.nix").write_text("{ outputs = { self }: { }; }\n")
    (inputs / "profile.toml").write_text(PROFILE.format(root=inputs))
    (inputs / "fleet.toml").write_text(FLEET.format(root=root / "state"))
    shutil.copy(ENV_FILE, inputs / "env.production")
    shutil.copy(MANIFEST, inputs / "sources.manifest")
    (inputs / "result.json").write_text(_result_json())
    (inputs / "plain.txt").write_text("hello\n")
    env = {
        "HOME": root / "home",
        "XDG_STATE_HOME": root / "state",
        "XDG_CACHE_HOME": root / "cache",
        "XDG_CONFIG_HOME": root / "config",
        "XDG_DATA_HOME": root / "data",
        "XDG_RUNTIME_DIR": root / "runtime",
        "TP4_SOURCES_MANIFEST": inputs / "sources.manifest",
        "TP4_SOURCES_CACHE": root / "cache" / "sources",
        "TP4_SOURCES_RETRIES": "0",
        "TP4_SOURCES_MIRROR": f"http://127.0.0.1:{CLOSED_PORT}",
        "TP4_GITHUB_API": f"http://127.0.0.1:{CLOSED_PORT}",
        "HF_ENDPOINT": f"http://127.0.0.1:{CLOSED_PORT}",
        "HF_HOME": root / "cache" / "hf",
        "HF_HUB_OFFLINE": "1",
        "DOCKER_HOST": f"tcp://127.0.0.1:{CLOSED_PORT}",
        "NO_PROXY": "*",
        "TP4_FLAKE": root / "flake",
    }
    gone = ("TP4_PROFILE", "TP4_KNOWN_HOSTS", "GITHUB_TOKEN", "http_proxy", "https_proxy")
    saved = {k: os.environ.get(k) for k in [*env, *gone]}
    os.environ.update({k: str(v) for k, v in env.items()})
    for k in gone:
        os.environ.pop(k, None)
    cwd = os.getcwd()
    # the plan bootlog reads, made by tp4 itself
    from tp4.cli import main

    os.chdir(inputs)
    with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
        main(["plan", "--profile", str(inputs / "profile.toml"), "-o", str(inputs / "plan.json")])
    assert (inputs / "plan.json").is_file()
    os.chdir(cwd)
    repo_before = _tree_hash(REPO)
    try:
        yield root
    finally:
        os.chdir(cwd)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        from tp4.image import imagestore

        with contextlib.suppress(Exception):
            imagestore.stop(root / "state" / "tp4" / "registry")
        _stop_our_processes(root)
        plugins = request.config.pluginmanager
        reporter, capture = plugins.get_plugin("terminalreporter"), plugins.get_plugin("capturemanager")
        if RUNS and reporter is not None and capture is not None:  # the size of the walk, for the record
            with capture.global_and_fixture_disabled():
                reporter.write_line(
                    f"\nhostile CLI walk: {len(RUNS)} invocations, {len(set(RUNS))} classes, {len(PARAMS)} options"
                )
        assert _tree_hash(REPO) == repo_before, "the walk changed a file of the repository"


SKIP_DIRS = {".git", ".venv", "__pycache__", ".hypothesis", ".pytest_cache", ".ruff_cache", "result"}


def _tree_hash(top: Path) -> dict[str, tuple[int, int, int]]:
    """path -> (mode, size, mtime_ns) of every file and directory under top (not .git, venvs, caches)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(top):
        dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS]
        for name in [*dirnames, *filenames]:
            p = os.path.join(dirpath, name)
            s = os.lstat(p)
            # a directory by its mode only: a temporary file made and removed again is no change
            kept = (s.st_mode, 0, 0) if stat.S_ISDIR(s.st_mode) else (s.st_mode, s.st_size, s.st_mtime_ns)
            out[os.path.relpath(p, top)] = kept
    return out


def _inputs_digest(inputs: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(inputs.iterdir()) if p.is_file()}


# --- one case --------------------------------------------------------------------------------------

NESTED_JSON = "[" * 5000 + "]" * 5000
NESTED_TOML = "a = " + "[" * 5000 + "]" * 5000 + "\n"
NESTED_TABLE = "a = " + "{b = " * 5000 + "1" + "}" * 5000 + "\n"


def make_path(value: str, case: Path, inputs: Path, kind: str) -> str:
    if not value.startswith("path:"):
        return value
    what = value.removeprefix("path:")
    p = case / what
    if what == "fifo":
        os.mkfifo(p)
    elif what == "wrong-kind":
        if kind.startswith("dir"):
            p.write_text("a file where a directory goes\n")
        else:
            p.mkdir()
    elif what == "dangling":
        p.symlink_to(case / "nowhere")
    elif what.startswith("link-to-dev-"):
        p.symlink_to("/dev/" + what.removeprefix("link-to-dev-"))
    elif what == "nested.json":
        p.write_text(NESTED_JSON)
    elif what == "nested.toml":
        p.write_text(NESTED_TOML)
    elif what == "nested-table.toml":
        p.write_text(NESTED_TABLE)
    elif what == "huge":
        with open(p, "wb") as f:
            f.truncate(64 << 20)  # sparse: 64 MiB of NULs, over every cap tp4 reads with
    elif what == "key":
        return str(inputs / "api-key")
    return str(p)


FILLERS = {
    "profile_path": "{inputs}/profile.toml",
    "fleet_path": "{inputs}/fleet.toml",
    "file": "{inputs}/profile.toml",
    "env_file": "{inputs}/env.production",
    "output": "{case}/imported.toml",
    "plan_file": "{inputs}/plan.json",
    "rank": "0",
    "host": "127.0.0.9",
    "name": "production",
    "to": "{case}/fetched",
    "path": "{inputs}/plain.txt",
    "old": "{inputs}/sources.manifest",
    "results": "{inputs}/result.json",
}
# a required value the command's own validation needs to be right, beside the hostile one
FILLER_BY_COMMAND = {("sources", "fetch", "name"): "sglang-canary"}  # a locked row: fetch gets to --to
# options given beside every hostile value of a command, so that it gets past a refusal of the
# test's own line: qeval refuses a code sandbox on this machine, and the line's workers are
# loopback addresses here; without code tasks it needs no sandbox and reaches its other options
EXTRA_BY_COMMAND = {("qeval",): ["--kind", "json"]}


class Hung(BaseException):
    """Raised by the alarm: a BaseException, so tp4's catch-all does not turn it into exit 70."""


def _alarm(signum, frame):
    raise Hung


def argv_for(p: Param, value: str, inputs: Path, case: Path) -> list[str]:
    command = _command(p.command)
    opts: list[str] = []
    args: list[str] = []
    has_profile = any(q.name == "profile_path" for q in command.params)  # --fleet goes alone
    for q in command.params:
        if isinstance(q, click.Option) and q.is_flag:
            if q.name == "dry_run":
                opts.append("--dry-run")
            continue
        if q is p.param:
            continue
        filler = FILLER_BY_COMMAND.get((*p.command, q.name or "")) or FILLERS.get(q.name or "")
        if isinstance(q, click.Argument) and q.required:
            args.append((filler or "x").format(inputs=inputs, case=case))
        elif isinstance(q, click.Option) and (
            q.required or q.name == "profile_path" or q.name == "fleet_path" and not has_profile
        ):
            opts += [max(q.opts, key=len), (filler or "x").format(inputs=inputs, case=case)]
    opts += EXTRA_BY_COMMAND.get(p.command, [])
    if isinstance(p.param, click.Option):
        opts += [p.flag, value]
    else:
        args.append(value)
    return [*p.command, *opts, "--", *args] if args else [*p.command, *opts]


_COMMANDS = {path: cmd for path, cmd in walk()}


def _command(path: tuple[str, ...]) -> click.Command:
    return _COMMANDS[path]


def run(argv: list[str], cwd: Path, capfd) -> tuple[int | str, str]:
    from tp4.cli import main

    capfd.readouterr()
    # a read of /dev/zero without a cap ends in MemoryError (reported), not in the OOM killer
    limit = resource.getrlimit(resource.RLIMIT_AS)
    with open("/proc/self/statm") as f:
        mapped = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    resource.setrlimit(resource.RLIMIT_AS, (mapped + MEMORY_HEADROOM, limit[1]))
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(CASE_SECONDS)
    here = os.getcwd()
    os.chdir(cwd)
    try:
        main(argv)
        code: int | str = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except Hung:
        code = f"hung (> {CASE_SECONDS} s)"
    except BaseException as exc:  # noqa: BLE001  a crash past tp4's own handler
        code = f"crashed ({type(exc).__name__}: {exc})"
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
        resource.setrlimit(resource.RLIMIT_AS, limit)
        os.chdir(here)
    captured = capfd.readouterr()
    return code, captured.out + captured.err


def _shown(argv: list[str]) -> str:
    def word(w: str) -> str:
        w = w if len(w) <= 80 else f"{w[:40]}...<{len(w)} chars>...{w[-20:]}"
        return repr(w) if not re.fullmatch(r"[A-Za-z0-9_./:=@+,-]+", w) else w

    return "tp4 " + " ".join(word(w) for w in argv)


RUNS: list[str] = []  # one entry per invocation, counted at the end of the walk


def check_case(p: Param, cls: str, raw: str, world: Path, capfd) -> None:
    RUNS.append(cls)
    inputs = world / "inputs"
    case = world / "cases" / "c"
    if case.exists():
        shutil.rmtree(case)
    case.mkdir(parents=True)
    value = make_path(f"{raw!s}", case, inputs, p.kind)
    argv = argv_for(p, value, inputs, case)
    before = _inputs_digest(inputs)
    case_before = _tree_hash(case)
    outside_before = _outside()
    code, output = run(argv, case, capfd)
    tail = " | ".join(output.strip().splitlines()[-4:])
    if len(tail) > 1200:
        tail = tail[:600] + f"...<{len(tail)} chars>..." + tail[-400:]
    where = f"\n  command: {_shown(argv)}\n  class: {cls}; kind of option: {p.kind}; exit: {code}\n  output: {tail!r}"
    problems = []
    # a missing directory under an output is made (mkdir -p), as tools do; a read-only one must be refused
    creatable = p.kind.endswith("-out") and raw == "path:missing/x"
    accepted = cls in ACCEPTS.get((*p.command, p.param.name), ())
    must_refuse = p.kind in CLASSES[cls][1] and not creatable and not accepted
    if code not in (1, 2) and not (code == 0 and not must_refuse):
        problems.append(f"exit {code}, expected 1 or 2")
    if must_refuse and code == 1 and not _names(p, value, output):
        problems.append("a value of this class must be refused as bad input naming the option")
    if code == 2 and not _names(p, value, output):
        problems.append(f"the message names none of {p.names()}")
    if any(m in output for m in INTERNAL):
        problems.append("a traceback or an internal error")
    if any(secret in output for secret in SECRETS):
        problems.append("the secret of the test's key file is in the output")
    if _inputs_digest(inputs) != before:
        problems.append("a file of the test's inputs changed")
    case_after = _tree_hash(case)
    changed = sorted(k for k in case_before if case_after.get(k) != case_before[k])
    if changed:  # the hostile file itself (a FIFO, a link, a directory) replaced or removed
        problems.append(f"it replaced or removed {changed[:3]} (made by the test as the value)")
    new = sorted(set(case_after) - set(case_before))
    if code == 2 and new:
        problems.append(f"refused, yet it wrote in its working directory: {new[:3]}")
    outside = _outside() != outside_before
    if outside:
        problems.append(f"it changed the top of / or of the real HOME: {sorted(_outside() ^ outside_before)[:5]}")
    left = _stop_our_processes(world)
    if left and code != 0:
        problems.append(f"it failed, yet left processes running: {left[:2]}")
    assert not problems, "; ".join(problems) + where


REAL_HOME = Path(os.path.expanduser("~"))
DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/urandom")


def _outside() -> set[str]:
    """The names at the top of / and of the real HOME, where a path gone wrong (`--root ////`,
    an empty HOME) writes, and the devices the test's links name (still those devices)."""
    devices = {f"{d} {os.stat(d).st_mode:o} {os.stat(d).st_rdev}" for d in DEVICES}
    return {f"/{n}" for n in os.listdir("/")} | {f"~/{n}" for n in os.listdir(REAL_HOME)} | devices


def _stop_our_processes(world: Path) -> list[str]:
    """Stop every process whose command line names this test's scratch (an image store a case
    started): by its pid, each one ours. Returns their command lines."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(world) in cmdline:
            found.append(cmdline.strip())
            with contextlib.suppress(OSError):
                os.kill(int(pid), signal.SIGTERM)
    return found


def _names(p: Param, value: str, output: str) -> bool:
    """The message names the option, or shows the value it refuses (a path, a row's name), whole
    or its start (repr'd or not)."""
    if any(n in output for n in p.names()):
        return True
    if not value:
        return False
    shown = [value, repr(value), repr(value)[1:-1]]
    return any(v[:40] in output for v in shown if len(v) >= 3 or v == value)


# --- the walk ----------------------------------------------------------------------------------------


def test_the_walk_covers_every_option_with_every_class():
    commands = {p.command for p in PARAMS}
    assert len(commands) >= 40 and len(PARAMS) >= 170, (len(commands), len(PARAMS))
    assert {("plan",), ("fleet", "serve"), ("sources", "lock"), ("image-store", "stop")} <= commands
    kinds = {p.kind for p in PARAMS}
    assert kinds == {"int", "number", "choice", "text", "file-in", "file-out", "dir-in", "dir-out"}, kinds
    assert {c for _, c in CASES} == set(CLASSES)
    assert len(CLASSES) == 17 and len(CASES) >= 1200, len(CASES)


@pytest.mark.parametrize("p,cls", CASES, ids=[f"{p.id} [{c}]" for p, c in CASES])
def test_a_hostile_value_is_refused_in_plain_words(p, cls, world, capfd):
    kinds, must, canonical, strategy = CLASSES[cls]

    @given(raw=strategy.map(Hostile))
    @example(raw=Hostile(canonical))
    @settings(
        max_examples=MAX_EXAMPLES,
        deadline=None,
        database=None,
        derandomize=True,  # the same values on every run: CI fails or passes, it does not flicker
        # no shrinking: the report shows the value as run; a class of one value runs it once
        phases=[Phase.explicit] if repr(strategy).startswith("just(") else [Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    def inner(raw: str) -> None:
        check_case(p, cls, raw, world, capfd)

    inner()


# --- what the walk found that no other part of tp4 owns: words no exec passes, paths too long ------


@pytest.mark.parametrize(
    "argv,named",
    [
        (["plan", "--profile", "a\x00b"], "--profile"),
        (["plan", "--profile=a\x00b"], "--profile"),
        (["hosts", "forget", "--port", "22", "h\x00st"], "HOST"),
        (["sources", "diff", "--", "x", "y\x00"], "[NEW_MANIFEST]"),
        (["report", "--out", "x" * (128 * K)], "--out"),
        (["-v", "sources", "lock", "--", "-" + "é" * (64 * K)], "NAMES"),
    ],
)
def test_a_word_no_exec_could_pass_is_refused_naming_its_option(tp4_cli, argv, named):
    """A NUL inside an argument, or one longer than the kernel's bound on one (128 KiB): only a
    caller in-process can pass them; refused before the command runs, naming the option."""
    code, out, err = tp4_cli(*argv)
    assert code == 2 and out == "", (code, out, err)
    assert err.startswith(f"error: {named}: ") and "; fix: " in err and "internal error" not in err, err
    assert len(err) < 300


def test_a_path_longer_than_the_system_takes_is_a_user_error(tmp_path, tp4_cli, monkeypatch):
    monkeypatch.chdir(tmp_path)
    long = "d" * 5000
    code, out, err = tp4_cli("plan", "--output", f"{long}/plan.json")
    assert code == 2, (code, err)
    assert err.startswith("error: --output: a path of 5,010 characters") and "internal error" not in err, err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("kind", ["fifo", "link to /dev/null", "read-only directory"])
def test_plan_output_replaces_only_a_regular_file(tmp_path, tp4_cli, kind):
    """`tp4 plan -o` writes through tp4.core.userfiles: a FIFO or a device is never replaced (as root,
    a rename over `/dev/null` replaces the device), a directory it cannot write is a user error."""
    target = tmp_path / "plan.json"
    if kind == "fifo":
        os.mkfifo(target)
    elif kind == "link to /dev/null":
        target.symlink_to("/dev/null")
    else:
        target = Path("/proc/1/tp4-plan.json")
    code, out, err = tp4_cli("plan", "--output", target)
    assert code == 2 and "internal error" not in err, (code, err)
    assert str(target) in err and "; fix: " in err, err
    if kind == "fifo":
        assert target.is_fifo()
    elif kind == "link to /dev/null":
        assert target.is_symlink() and Path("/dev/null").is_char_device()
    assert sorted(p.name for p in tmp_path.iterdir()) == ([] if kind == "read-only directory" else ["plan.json"])


def test_distribute_checks_its_inputs_before_looking_for_the_image(tmp_path, tp4_cli, monkeypatch):
    """A bad --profile is named even on a head with no build yet (it was hidden behind `run tp4
    build first`, and found only after the build)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "flake.nix").write_text("{ outputs = { self }: { }; }\n")
    code, out, err = tp4_cli("distribute", "--profile", tmp_path / "missing.toml")
    assert code == 2 and "missing.toml" in err and "tp4 build" not in err, (code, err)


@pytest.mark.parametrize("kind", ["fifo", "link to /dev/null", "dangling link's directory missing"])
def test_doctor_output_is_checked_before_the_checks_and_never_replaces_a_special_file(tmp_path, tp4_cli, kind):
    profile = tmp_path / "profile.toml"
    profile.write_text(PROFILE.format(root=tmp_path))
    target = tmp_path / "evidence.json"
    if kind == "fifo":
        os.mkfifo(target)
    elif kind == "link to /dev/null":
        target.symlink_to("/dev/null")
    else:
        target = tmp_path / "no" / "evidence.json"
    code, out, err = tp4_cli("doctor", "--profile", profile, "-o", target)
    assert code == 2 and "--output" in err and "; fix: " in err and "internal error" not in err, (code, err)
    assert "SSH.REACHABLE" not in out, "the path is refused before any node is asked"
    if kind == "fifo":
        assert target.is_fifo()
    elif kind == "link to /dev/null":
        assert target.is_symlink() and Path("/dev/null").is_char_device()


def test_sources_hash_refuses_a_bad_store_name_before_printing_and_takes_no_manifest(tmp_path, tp4_cli):
    (tmp_path / "f").write_text("x\n")
    code, out, err = tp4_cli("sources", "hash", tmp_path / "f", "--store-path", "a\nb" + "x" * 5000)
    assert code == 2 and out == "", (code, out, err)
    assert err.startswith("error: --store-path 'a\\nbxx") and "; fix: " in err and len(err) < 300, err
    code, out, err = tp4_cli("sources", "hash", "--manifest", tmp_path / "f", tmp_path / "f")
    assert code == 2 and "--manifest" in err, (code, err)  # an option it ignored is no longer offered


@pytest.mark.parametrize("command", ["decode", "prefill"])
def test_bench_out_under_a_directory_nobody_can_write_is_refused_before_the_endpoint(tmp_path, tp4_cli, command):
    """`--out /proc/x/y`: access() says yes to root, the run failed only at its first write (after
    a level). Refused before the endpoint (a closed port here) is asked."""
    code, out, err = tp4_cli("bench", command, "--url", f"http://127.0.0.1:{CLOSED_PORT}", "--out", "/proc/tp4-x/y")
    assert code == 2 and err.startswith("error: --out: cannot create /proc/tp4-x/y") and "127.0.0.1" not in err, err


# --- files named by the environment ------------------------------------------------------------------

# Every TP4_* variable tp4 reads names a file it reads (with a command that reads it) or is not a
# file: a new one found in the source fails test_every_tp4_variable_is_walked_or_is_no_file until
# it is put in one of the two.
ENV_FILES = {
    "TP4_KNOWN_HOSTS": ["hosts", "list"],
    "TP4_PROFILE": ["plan"],
    "TP4_SOURCES_MANIFEST": ["sources", "list"],
}
ENV_NOT_FILES = {
    "TP4_FLAKE",  # a directory nix reads (walked as --flake)
    "TP4_GITHUB_API",
    "TP4_SOURCES_MIRROR",
    "TP4_SOURCES_RETRIES",
    "TP4_SOURCES_BACKOFF",
    "TP4_SOURCES_CACHE",  # a cache directory tp4 writes, not a file it reads
    "TP4_OCI_CONFIG",  # JSON text, in the image build's sandbox only
    "TP4_ENV_FILE",  # a name in the legacy importer's table, not read from the environment
}
# known_hosts is not JSON or TOML: like ssh, tp4 skips a line it cannot parse
ENV_ACCEPTS = {"TP4_KNOWN_HOSTS": {"nested 5,000 deep"}}
ENV_CLASSES = ["device", "fifo", "wrong kind of file", "nested 5,000 deep", "huge file", "a key file"]
ENV_CASES = [(var, cls) for var in ENV_FILES for cls in ENV_CLASSES]


def test_every_tp4_variable_is_walked_or_is_no_file():
    source = "\n".join(p.read_text() for p in (REPO / "python" / "tp4").rglob("*.py"))
    found = set(re.findall(r'"(TP4_[A-Z0-9_]+)"', source))
    assert found == set(ENV_FILES) | ENV_NOT_FILES, found ^ (set(ENV_FILES) | ENV_NOT_FILES)


@pytest.mark.parametrize("var,cls", ENV_CASES, ids=[f"${v} [{c}]" for v, c in ENV_CASES])
def test_a_hostile_file_named_by_the_environment_is_refused_in_plain_words(var, cls, world, capfd):
    """Issue 25 item 6: `TP4_KNOWN_HOSTS=/dev/zero` was read until memory ran out, a FIFO hung."""
    inputs = world / "inputs"
    case = world / "cases" / "env"
    if case.exists():
        shutil.rmtree(case)
    case.mkdir(parents=True)
    raw = CLASSES[cls][2]
    value = make_path(raw, case, inputs, "file-in")
    argv = ENV_FILES[var]
    saved = os.environ.get(var)
    os.environ[var] = value
    try:
        code, output = run(argv, case, capfd)
    finally:
        if saved is None:
            os.environ.pop(var, None)
        else:
            os.environ[var] = saved
    tail = " | ".join(output.strip().splitlines()[-4:])[:1200]
    where = f"\n  command: {var}={value} {_shown(argv)}\n  class: {cls}; exit: {code}\n  output: {tail!r}"
    assert not any(s in output for s in SECRETS), "the secret of the test's key file is in the output" + where
    if cls == "a key file" or cls in ENV_ACCEPTS.get(var, ()):  # taken, or refused: never shown
        assert code in (0, 1, 2) and not any(m in output for m in INTERNAL), where
        return
    assert code in (1, 2), "expected exit 1 or 2" + where
    assert var in output or value in output, "the message names neither the variable nor the path" + where
    assert not any(m in output for m in INTERNAL), "a traceback or an internal error" + where
