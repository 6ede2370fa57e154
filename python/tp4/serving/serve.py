"""Serving the line from its Plan: start every rank, prove the line ready, stop it, report it.

Everything here is driven by :class:`tp4.line.plan.Plan`: the container flags come from each rank's
``run`` spec, its environment from ``env`` (written to the node as an env file of mode 0600, so
neither argv nor a log ever holds it), where it runs from ``service`` (a plain host: tp4 runs the
container with the node's runtime; a NixOS host: tp4 writes the env file and starts the module's
unit). Every command goes through :mod:`tp4.core.process` (one ssh connection per node, reused).

* :func:`serve` checks the nodes (a NixOS node's unit must have been built from this plan:
  :func:`check_deployed`), writes the env files, pushes the speculative tables, starts the
  workers in parallel (a plain head's container is created beside them, podman's initialized
  too) and then the head,
  follows the head's log through the boot phases, and
  calls the line ready only when the head printed ``Ready: API on port <PORT>``, a real
  one-token completion answers, and the boot log of every rank passes the registry's checks. On
  any failure (or Ctrl-C) it stops every rank it started and says which node failed which check,
  with that rank's last log lines.
* :func:`stop` stops every rank of the line, also what a crashed serve left, and checks that the
  API is down and no container of the line is left.
* :func:`status` reports each node and the line (a real completion, the engine's load, the boot
  signature of the current boot).
"""

from __future__ import annotations

import collections
import fcntl
import hashlib
import json
import os
import queue
import re
import shlex
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

from tp4.core import privatefiles, process

from tp4.image import runtime_cli
from tp4.core.errors import InvalidInput, Tp4Error
from tp4.line.container import Health
from tp4.hosts.nodes import Node, parallel
from tp4.core.bootphases import BOOT_TIMEOUTS
from tp4.line.plan import Plan, RankPlan
from tp4.line.profile.models import ENV_KEY, has_unsafe_chars

if TYPE_CHECKING:
    from tp4.serving.api import Endpoint as api_Endpoint
    from tp4.serving.api import Liveness
    from tp4.core.apikey import Secret
    from tp4.hosts.doctor import Result as doctor_Result

Echo = Callable[[str], None]

# what `tp4 stop` sends first, inside the container (upstream's stop.sh), before the runtime's stop
ENGINE_PATTERNS = ("sglang.launch_server", "sglang.srt")
STOP_GRACE = 10  # seconds between TERM and KILL
REMOVE_TIMEOUT = 30
LOG_TAIL = 20
# the boot phases of the head, in order, and how long each may take by default (seconds)
PHASES = ("start", "weights", "graphs", "smoke", "warmup", "ready")  # "start": before the head's first phase line
# the boot phases' bounds live with the plan (a NixOS rank's readiness sums them)
DEFAULT_TIMEOUTS = dict(BOOT_TIMEOUTS)
# what a rank prints when it goes down because another did (torch's NCCL process group)
FOLLOWER_MARKS = ("communicator was aborted", "a peer left the group")
LINE_LABEL = "tp4.line"
RANK_LABEL = "tp4.rank"
# the digest of the plan the rank was started from (tp4.line.plan digest_of; modules/lib/rank.nix too)
PLAN_LABEL = "tp4.plan"


class NodeFailure(Tp4Error):
    """A rank failed a check: the node, the check and the rank's last log lines."""

    def __init__(self, node: str, check: str, detail: str, log_tail: Sequence[str] = ()):
        text = f"{node}: {check}: {detail}"
        if log_tail:
            text += f"\nlast log lines of {node}:\n" + "\n".join(f"  | {line}" for line in log_tail)
        super().__init__(text)
        self.node, self.check = node, check


def _raise_first(results: dict[str, object | BaseException]) -> None:
    for value in results.values():
        if isinstance(value, BaseException):
            raise value


# --- the container of a rank ----------------------------------------------------------------------


def run_argv(rank: RankPlan, *, line: str, create: bool = False, digest: str = "") -> list[str]:
    """`<runtime> run -d` of the rank, exactly as its run spec says (upstream start.sh's flags),
    its environment from the env file; ``create``: `<runtime> create` with the same flags;
    ``digest``: the plan's, as the label PLAN_LABEL."""
    spec = rank.run
    runtime = rank.service.runtime
    argv = [
        runtime,
        *(["create"] if create else ["run", "-d"]),
        "--name",
        spec.container,
        "--label",
        f"{LINE_LABEL}={line}",
        "--label",
        f"{RANK_LABEL}={rank.rank}",
        *(["--label", f"{PLAN_LABEL}={digest}"] if digest else []),
        "--network",
        spec.network,
        "--ipc",
        spec.ipc,
    ]
    if spec.privileged:
        argv.append("--privileged")
    for cap in spec.cap_add:
        argv += ["--cap-add", cap]
    argv += runtime_cli.GPU_FLAGS[runtime]
    # podman refuses --shm-size with the host's IPC namespace (the host's /dev/shm is used)
    if not (runtime == "podman" and spec.ipc == "host"):
        argv += ["--shm-size", spec.shm_size]
    argv += ["--ulimit", f"memlock={spec.ulimits.memlock}", "--ulimit", f"stack={spec.ulimits.stack}"]
    for device in spec.devices:
        argv += ["--device", device]
    for m in spec.mounts:
        argv += ["-v", f"{m.source}:{m.target}" + (":ro" if m.read_only else "")]
    # the image's health check (run.health): podman reads none from an OCI image's config, only
    # from a Docker-format one (podman pull requests #4986, #6024; issue #5680), so it gets the
    # check as flags. docker reads it from the image config (pkgs/image.nix writes it there from
    # the same table); docker's --health-cmd would be a shell command (CMD-SHELL, docker/cli
    # cli/command/container/opts.go), not the image's exec form, so docker gets no flags.
    if runtime == "podman":
        argv += health_flags(spec.health)
    argv += ["--restart", spec.restart, "--env-file", rank.service.env_file, spec.image, *spec.command]
    return argv


def health_flags(health: Health) -> list[str]:
    """podman's flags for a health check: the command as a JSON array (podman's exec form, run
    without a shell), the durations in seconds (modules/lib/rank.nix renders the same)."""
    return [
        "--health-cmd",
        json.dumps(list(health.cmd), separators=(",", ":"), ensure_ascii=False),
        "--health-interval",
        f"{health.interval}s",
        "--health-timeout",
        f"{health.timeout}s",
        "--health-start-period",
        f"{health.start_period}s",
        "--health-retries",
        str(health.retries),
    ]


def env_file_text(rank: RankPlan, secrets: Mapping[str, Secret]) -> str:
    """The rank's env file (docker's and podman's ``--env-file``; a NixOS unit's container reads
    the same file): one KEY=VALUE a line, sorted by key, taken literally. The head's also
    holds the secrets (API_KEY): the one place tp4 reveals the key, into the text that is written
    to the node's file of mode 0600 through stdin, never an argv.

    The one writer of an env file. A key that is not a variable name, or a value with a control
    character or line separator (a line-based reader would split on it, or cut it at a NUL), is
    refused with InvalidInput naming the rank and the key (never the value)."""
    env = dict(rank.env)
    if rank.rank == 0:
        env.update({key: secret.reveal() for key, secret in secrets.items()})
    lines = []
    for key in sorted(env):
        value = env[key]
        if not ENV_KEY.fullmatch(key):
            raise InvalidInput(
                f"{rank.name}: env key {key!r} is not a variable name, which an env file cannot carry; "
                "fix: use letters, digits and _ (not first a digit)"
            )
        if has_unsafe_chars(value):
            raise InvalidInput(
                f"{rank.name}: the value of {key} holds a control character or a line break, which an env file "
                "cannot carry; fix: remove it from the profile"
            )
        lines.append(f"{key}={value}")
    return "\n".join(lines) + "\n"


# one constant script; the file's path is its argument (never part of the script): a private
# directory's file of mode 0600, never through a path another user may plant (tp4.core.privatefiles)
_WRITE_PRIVATE = privatefiles.WRITE_PRIVATE


def write_private(node: Node, path: str, text: str) -> None:
    """Write ``text`` to ``path`` on the node, mode 0600, through stdin (never argv)."""
    node.run(
        node.privileged(["sh", "-c", _WRITE_PRIVATE, "sh", path]), input=text, purpose=f"writing {path} on {node.name}"
    )


def container_state(node: Node) -> str | None:
    """The state of the rank's container (running, exited, created...), None when there is none."""
    proc = node.run(
        [node.runtime, "inspect", "--format", "{{.State.Status}}", node.container],
        check=False,
        purpose=f"reading the state of {node.container} on {node.name}",
    )
    if proc.returncode != 0:
        return None
    return proc.stdout.strip() or None


def log_tail(node: Node, lines: int = LOG_TAIL) -> list[str]:
    proc = node.run([node.runtime, "logs", "--tail", str(lines), node.container], check=False, timeout=30)
    text = (proc.stdout or "") + (proc.stderr or "")
    return [line for line in text.splitlines() if line.strip()][-lines:]


def full_log(node: Node) -> str:
    proc = node.run([node.runtime, "logs", node.container], check=False, timeout=120)
    return (proc.stdout or "") + (proc.stderr or "")


# --- the lock -------------------------------------------------------------------------------------


def _state_dir() -> Path:
    from tp4.core import dirs

    return dirs.state_dir()


def line_id(plan: Plan) -> str:
    """A name for the line: its head and API (two profiles of one head share the line)."""
    return plan.line.id


@contextmanager
def line_lock(plan: Plan, what: str, *, kind: str = "lock") -> Iterator[None]:
    """One serve or stop of a line at a time (a lock on the head, where tp4 runs): the second is
    refused naming the holder's pid and start time. The lock is an flock, so a holder that died
    releases it and the next run takes it over. ``kind``: another lock of the line (`tp4 up`
    holds ``up.lock`` around its steps, serve's own inside it)."""
    path = _state_dir() / "lines" / f"{line_id(plan)}.{kind}"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as exc:
        raise Tp4Error(f"cannot create the line's lock {path}: {exc.strerror}") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another tp4"
            raise Tp4Error(
                f"the line {line_id(plan)} is busy: {holder} holds {path}; wait for it, or stop it "
                "(Ctrl-C in its terminal)"
            ) from None
        stale = os.pread(fd, 200, 0).decode(errors="replace").strip()
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"tp4 {what} (pid {os.getpid()}, started {time.strftime('%Y-%m-%d %H:%M:%S')})\n".encode(), 0)
        if stale:
            process.log.debug("took over the line's lock from a process that is gone: %s", stale)
        yield
    finally:
        os.close(fd)


# --- what a boot left: the run record -------------------------------------------------------------


def runs_dir(plan: Plan) -> Path:
    return _state_dir() / "runs" / line_id(plan)


def save_run(plan: Plan, record: dict[str, object]) -> Path:
    d = runs_dir(plan)
    d.mkdir(parents=True, exist_ok=True)
    path = d / "current.json"
    privatefiles.replace_file(path, json.dumps(record, indent=2, sort_keys=True) + "\n")
    if record.get("ok"):
        privatefiles.replace_file(d / "last-good.json", json.dumps(record, indent=2, sort_keys=True) + "\n")
    return path


def load_run(plan: Plan, which: str = "current") -> dict[str, object] | None:
    try:
        data = json.loads((runs_dir(plan) / f"{which}.json").read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


# --- spec tables --------------------------------------------------------------------------------


class SpecTable(NamedTuple):
    name: str  # dspark_sps.json
    host_path_of: dict[str, str]  # node name -> path on the host (the node's state dir)


def spec_tables(plan: Plan) -> list[str]:
    """The DSpark tables the plan's engine argv reads (file names under /state)."""
    names = []
    for arg in plan.nodes[0].argv:
        if arg.startswith("/state/") and arg.endswith(".json"):
            names.append(arg.removeprefix("/state/"))
    return names


def _state_host_dir(rank: RankPlan) -> str:
    for m in rank.run.mounts:
        if m.target == "/state":
            return m.source
    raise Tp4Error(f"{rank.name}: the run spec mounts no /state")


def push_spec_tables(nodes: Sequence[Node], names: Sequence[str], echo: Echo) -> None:
    """Copy each table from the head's state dir to every worker's, then check by hash that every
    node holds the same bytes: ranks with different tables build different verify schedules and
    hang. A node that differs fails serve, named."""
    head = nodes[0]
    for name in names:
        src = f"{_state_host_dir(head.rank)}/{name}"
        proc = head.run(["cat", "--", src], check=False, purpose=f"reading {src} on {head.name}")
        if proc.returncode != 0:
            raise NodeFailure(
                head.name,
                "spec table",
                f"{src} cannot be read: {proc.stderr.strip()}; "
                "fix: put the table in the head's state dir, or turn engine.use_*_table off",
            )
        data = proc.stdout
        want = hashlib.sha256(data.encode()).hexdigest()
        echo(f"spec table {name}: {want[:16]} from {head.name}")

        def copy(node: Node, data: str = data, name: str = name) -> str:
            path = f"{_state_host_dir(node.rank)}/{name}"
            if node is not head:
                node.run(
                    ["sh", "-c", privatefiles.WRITE_SHARED, "sh", path, "644"],
                    input=data,
                    check=False,
                    purpose=f"copying {name} to {node.name}",
                )
            got = node.run(["sha256sum", "--", path], check=False, purpose=f"hashing {path} on {node.name}")
            return (
                got.stdout.split()[0]
                if got.returncode == 0 and got.stdout.split()
                else f"unreadable ({got.stderr.strip()})"
            )

        results = parallel(nodes, copy)
        for node in nodes:
            got = results[node.name]
            if isinstance(got, BaseException):
                raise NodeFailure(node.name, "spec table", f"{name}: {got}")
            if got != want:
                raise NodeFailure(
                    node.name,
                    "spec table",
                    f"{name} there is {str(got)[:16]}, the head's is {want[:16]}: "
                    "ranks would build different verify schedules and hang; fix the node's state dir",
                )


# --- starting and stopping ------------------------------------------------------------------------


# makes the $2 directories that follow (a plain host's writable bind mounts), writes stdin to the
# env file $1 (mode 0600), then runs the rest of its arguments: one command per node starts the
# rank, its environment never on a command line
_WRITE_AND_RUN = (
    privatefiles.WRITE_PRIVATE_SH
    + 'f=$1 n=$2; shift 2; while [ "$n" -gt 0 ]; do mkdir -p -- "$1" || exit 125; n=$((n-1)); shift; done; '
    'umask 077 && write_private "$f" && exec "$@"'
)


def made_dirs(rank: RankPlan) -> list[str]:
    """The host directories serve creates before a plain host's run: its writable bind mounts
    (state, cache, Engram), never the checkpoint (tp4 download makes it) nor a read-only mount
    (the ring's NCCL library is a file). A NixOS host's come from the module."""
    if rank.service.kind != "plain":
        return []
    return [d.path for d in rank.service.directories]


def _wrapped(node: Node, start: Sequence[str]) -> list[str]:
    dirs = made_dirs(node.rank)
    return ["sh", "-c", _WRITE_AND_RUN, "sh", node.rank.service.env_file, str(len(dirs)), *dirs, *start]


def start_argv(node: Node, *, line: str, digest: str = "") -> list[str]:
    """What starts the rank, after making its directories and writing its env file from stdin:
    its container (a plain host), or its NixOS unit, whose container the module declares from
    the same plan and which reads the env file serve wrote."""
    if node.rank.service.kind == "nixos":
        unit = node.rank.service.unit
        assert unit is not None
        return node.privileged(_wrapped(node, ["systemctl", "start", unit]))
    return _wrapped(node, run_argv(node.rank, line=line, digest=digest))


def start_rank(node: Node, *, line: str, secrets: Mapping[str, Secret], digest: str = "") -> None:
    node.run(
        start_argv(node, line=line, digest=digest),
        input=env_file_text(node.rank, secrets),
        timeout=300,
        purpose=f"starting the rank of {node.name}",
    )


# runs the rest of its arguments (`podman create ...`), then `podman container init` of the
# container $1: what `podman start` does before the OCI runtime's start, done ahead of it
_THEN_INIT = 'ctn=$1; shift; "$@" >/dev/null && exec "$1" container init -- "$ctn"'


def create_argv(node: Node, *, line: str, digest: str = "") -> list[str]:
    """What creates a plain host's rank container (not started), after writing its env file from
    stdin: `<runtime> create` with the flags of its run; podman's is initialized too."""
    assert node.rank.service.kind == "plain"
    create = run_argv(node.rank, line=line, create=True, digest=digest)
    if node.runtime == "podman":
        create = ["sh", "-c", _THEN_INIT, "sh", node.container, *create]
    return _wrapped(node, create)


def create_rank(node: Node, *, line: str, secrets: Mapping[str, Secret], digest: str = "") -> None:
    node.run(
        create_argv(node, line=line, digest=digest),
        input=env_file_text(node.rank, secrets),
        timeout=300,
        purpose=f"creating the rank of {node.name}",
    )


# stops the rank container $2 of runtime $1 (grace $3 s): TERM to the engine inside, the
# runtime's stop (TERM, KILL after the grace), removal; then lists the line's containers left
_STOP = r"""
rt=$1 ctn=$2 grace=$3 label=$4
state=$($rt container inspect --format '{{.State.Status}}' "$ctn" 2>/dev/null)
if [ "$state" = running ]; then
  $rt exec -w / "$ctn" sh -c 'pkill -TERM -f sglang.launch_server; pkill -TERM -f sglang.srt' >/dev/null 2>&1
  $rt stop -t "$grace" "$ctn" >/dev/null 2>&1
fi
if [ -n "$state" ]; then $rt rm -f "$ctn" >/dev/null 2>&1 || echo "rm-failed=$ctn"; fi
for c in $($rt ps -a --filter "label=$label" --format '{{.Names}}'); do
  $rt rm -f "$c" >/dev/null 2>&1
done
echo "left=$($rt ps -a --filter "label=$label" --format '{{.Names}}' | tr '
' ' ')"
"""


def stop_argv(node: Node, *, grace: int = STOP_GRACE) -> list[str]:
    if node.rank.service.kind == "nixos":
        unit = node.rank.service.unit
        assert unit is not None
        return node.privileged(["systemctl", "stop", unit])
    return ["sh", "-c", _STOP, "tp4-stop", node.runtime, node.container, str(grace), LINE_LABEL]


def stop_rank(node: Node, *, grace: int = STOP_GRACE) -> str | None:
    """Stop the rank in one command (:data:`_STOP`; a NixOS unit: stopped), also every other
    container of a line on the node. Idempotent; returns what could not be done, or None."""
    proc = node.run(
        stop_argv(node, grace=grace),
        check=False,
        timeout=grace + 2 * REMOVE_TIMEOUT,
        purpose=f"stopping the rank of {node.name}",
    )
    if proc.returncode == 255:
        raise Tp4Error(f"cannot reach {node.name} over ssh: {proc.stderr.strip()}")
    if node.rank.service.kind == "nixos":
        return None if proc.returncode == 0 else f"systemctl stop {node.rank.service.unit}: {proc.stderr.strip()}"
    left = [line.partition("=")[2].split() for line in proc.stdout.splitlines() if line.startswith("left=")]
    failed = [line.partition("=")[2] for line in proc.stdout.splitlines() if line.startswith("rm-failed=")]
    if failed or (left and left[0]):
        return f"still has {', '.join(left[0] if left else failed)}"
    return None


def stop_nodes(nodes: Sequence[Node], echo: Echo, *, grace: int = STOP_GRACE) -> list[str]:
    """Stop every node's rank in parallel; the problems, one per node that could not be stopped."""
    results = parallel(nodes, lambda n: stop_rank(n, grace=grace))
    problems = []
    for node in nodes:
        got = results[node.name]
        if isinstance(got, BaseException):
            why = getattr(got, "message", str(got))
            unreachable = "cannot reach" in why or "ssh" in why.split("\n", 1)[0]
            problems.append(
                f"{node.name}: could not stop its rank ({why.splitlines()[0] if why else got!r})"
                + ("; the node is unreachable: the GPU there may still be busy" if unreachable else "")
            )
        elif got:
            problems.append(f"{node.name}: {got}")
        else:
            echo(f"{node.name}: stopped")
    return problems


# --- following the head's boot -------------------------------------------------------------------


@dataclass
class Follower:
    """Reads a log stream (`<runtime> logs -f`, or the output of `podman start --attach`) in a
    thread; lines arrive on a queue, the last ones are kept in ``tail``."""

    proc: process.Popen[str]
    lines: queue.Queue[str | None] = field(default_factory=queue.Queue)
    thread: threading.Thread | None = None
    tail: collections.deque[str] = field(default_factory=lambda: collections.deque(maxlen=LOG_TAIL))

    def start(self) -> Follower:
        def pump() -> None:
            assert self.proc.stdout is not None
            for line in self.proc.stdout:
                self.tail.append(line.rstrip("\n"))
                self.lines.put(line.rstrip("\n"))
            self.lines.put(None)

        self.thread = threading.Thread(target=pump, daemon=True)
        self.thread.start()
        return self

    def stop(self) -> None:
        process.stop(self.proc, remote_first=True)


def follow(node: Node, *, since: str | None = None) -> Follower:
    argv = [node.runtime, "logs", "-f"]
    if since:
        argv += ["--since", since]
    proc = process.start(
        [*argv, node.container],
        remote=node.remote,
        stdout=process.PIPE,
        stderr=process.STDOUT,
        text=True,
        errors="replace",
    )
    return Follower(proc).start()


def start_attached(node: Node) -> Follower:
    """Start the node's created container with its output attached (podman), as a Follower."""
    argv = [node.runtime, "start", "--attach", "--sig-proxy=false", node.container]
    proc = process.start(
        argv, remote=node.remote, stdout=process.PIPE, stderr=process.STDOUT, text=True, errors="replace"
    )
    return Follower(proc).start()


# a container not started yet (`podman start --attach` is under way), not one that stopped
NOT_STARTED = ("created", "configured", "initialized")


def phase_of(line: str) -> str | None:
    from tp4.serving import bootlog

    return bootlog.phase_of(line)


def quote(argv: Sequence[str]) -> str:
    return shlex.join(argv)


# --- rehearsals (--dry-run) ------------------------------------------------------------------------
# What serve and stop would run, host by host, from the plan alone: nothing is run, no host is asked.


def _as_run(node: Node, argv: Sequence[str], note: str = "") -> str:
    """One command as it would run on the node: ``ssh … -- DEST '<cmd>'`` (quoted once), or local."""
    return f"{node.name}: {shlex.join(process.full_argv(argv, node.remote))}{note}"


def rehearse_serve(plan: Plan, nodes: Sequence[Node]) -> list[str]:
    """The commands `tp4 serve` runs to start the line, in order (the workers in parallel, then
    the head), after doctor's read-only checks; each env file goes on stdin, never in argv."""
    line, digest = line_id(plan), plan.digest
    head, workers = nodes[0], list(nodes[1:])
    env = "  < env file on stdin (mode 0600)"
    lines = [_as_run(n, start_argv(n, line=line, digest=digest), env) for n in workers]
    if head.rank.service.kind == "plain":
        lines.append(_as_run(head, create_argv(head, line=line, digest=digest), env))
        if head.runtime == "podman":
            lines.append(_as_run(head, [head.runtime, "start", "--attach", "--sig-proxy=false", head.container]))
        else:
            lines.append(_as_run(head, [head.runtime, "start", head.container]))
    else:
        lines.append(_as_run(head, start_argv(head, line=line, digest=digest), env))
    return lines


def rehearse_stop(nodes: Sequence[Node], *, grace: int = STOP_GRACE, record: bool = True) -> list[str]:
    """The stop record `tp4 stop` writes on the head, then the command it runs on every node (in
    parallel). ``record=False``: a stop that serves again (:func:`stop_nodes`), without the record."""
    stops = [_as_run(n, stop_argv(n, grace=grace)) for n in nodes]
    if not record:
        return stops
    return [_as_run(nodes[0], record_stop_argv(nodes[0]), "  < the stop record on stdin (who, when)"), *stops]


# --- serve ----------------------------------------------------------------------------------------


@dataclass
class Options:
    force: bool = False  # start although the head's GPU has compute apps
    timeouts: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_TIMEOUTS))
    on_slow_boot: str = "report"  # or "restart" (once)
    slow_floor: float | None = None  # warm-up input throughput (token/s) below which a boot is slow
    tty: bool = False
    sysfs: str = "/sys"  # the sysfs root doctor's checks read on every node
    # the kind the workers' weights volume must be (the profile's nfs.share: "nfs", else "local")
    volume_kind: Literal["nfs", "local"] | None = None
    expected_shards: int = 48  # the profile's model.expected_shards
    replace: bool = False  # stop a line already running (from this plan or another) and serve this plan


class Refused(Tp4Error):
    """Doctor's blocking checks failed: serve starts nothing and shows doctor's table."""

    def __init__(self, plan: Plan, results: Sequence[doctor_Result], blocking: Sequence[doctor_Result]):
        from tp4.hosts import doctor

        nodes = sorted({r.node for r in blocking}, key=[n.name for n in plan.nodes].index)
        head = (
            f"serve refused: {len(blocking)} blocking check(s) failed on {', '.join(nodes)}: "
            + ", ".join(dict.fromkeys(r.check for r in blocking))
            + "; nothing was started"
        )
        super().__init__("\n".join([head, *doctor.table(plan, results)]))
        self.blocking = list(blocking)


# the check --force overrides (upstream's FORCE=1: another stack's compute apps on the GPU)
FORCED_CHECK = "GPU.NO_FOREIGN_APPS"


def _state_of(node: Node) -> str:
    """The rank container's state ('' when there is none) and, after a space, the digest of the
    plan it was started from (PLAN_LABEL; none on a container started before plans had one); read-only."""
    proc = node.run(
        [node.runtime, "container", "inspect", "--format", _STATE_AND_PLAN, node.container],
        check=False,
        timeout=60,
        purpose=f"reading the state of {node.container} on {node.name}",
    )
    return proc.stdout.strip() if proc.returncode == 0 else ""


_STATE_AND_PLAN = '{{.State.Status}} {{index .Config.Labels "' + PLAN_LABEL + '"}}'


def preflight(nodes: Sequence[Node], plan: Plan, opts: Options, echo: Echo) -> None:
    """Doctor's blocking checks on every node (tp4.hosts.doctor; one facts command per node, all in
    parallel, without the non-blocking jumbo ping and counter interval), and no rank of the line
    already running. Refuses (:class:`Refused`, with doctor's table) before anything changes on
    any node; then removes what a crashed run left."""
    from tp4.hosts import doctor

    limits = doctor.Limits(
        sysfs=opts.sysfs, interval=0.0, ping=False, volume_kind=opts.volume_kind, expected_shards=opts.expected_shards
    )

    def read(node: Node) -> tuple[doctor.Facts, str]:
        facts = doctor.gather_one(plan, doctor._target(node), limits)
        return facts, (_state_of(node) if facts.error is None else "")

    got = parallel(nodes, read)
    facts: dict[str, doctor.Facts] = {}
    states: dict[str, str] = {}
    for node in nodes:
        value = got[node.name]
        if isinstance(value, BaseException):
            if not isinstance(value, Exception):
                raise value
            facts[node.name], states[node.name] = (
                doctor.Facts(error=getattr(value, "message", str(value)).splitlines()[0]),
                "",
            )
        else:
            assert isinstance(value, tuple)
            facts[node.name], states[node.name] = value
    for node in nodes:  # before the doctor's table: a running rank holds the ports and the GPU
        state, _, running = states[node.name].partition(" ")
        if state == "running":
            raise NodeFailure(node.name, "already running", already_running(plan, node, _label_value(running)))
        states[node.name] = state
    if not opts.replace:  # serve checked it before stopping the running line
        check_deployed(plan, nodes)
    results = doctor.evaluate(plan, facts, limits)
    blocking = [
        r for r in results if r.blocking and r.status == "fail" and not (opts.force and r.check == FORCED_CHECK)
    ]
    if blocking:
        raise Refused(plan, results, blocking)
    stale = [n for n in nodes if states[n.name]]
    if stale:  # what a crashed run left (created, exited): removed, now that serve goes on
        _raise_first(
            parallel(
                stale,
                lambda n: n.run(
                    [n.runtime, "rm", "-f", n.container],
                    timeout=REMOVE_TIMEOUT,
                    purpose=f"removing the stale {n.container} on {n.name}",
                ),
            )
        )
    head_id = doctor.image_id(facts[nodes[0].name]) or "?"
    forced = [r for r in results if r.check == FORCED_CHECK and r.status == "fail"]
    for r in forced:
        echo(f"warning: {r.node}: {r.detail} (--force: serving anyway)")
    warned = sorted({r.check for r in results if r.status in ("warn", "fail") and not r.blocking})
    echo(
        f"checks: doctor's blocking checks pass on {len(nodes)} nodes, image {head_id[:12]} on every node"
        + (f"; warnings: {', '.join(warned)} (tp4 doctor shows them)" if warned else "")
    )


class Ready(NamedTuple):
    seconds: float
    signature: dict[str, object]
    warnings: list[str]


def unit_plan_argv(node: Node) -> list[str]:
    """What reads the Environment of a NixOS node's rank unit (its TP4_PLAN, modules/tp4-line.nix)."""
    unit = node.rank.service.unit
    assert unit is not None
    return ["systemctl", "show", "-p", "Environment", "--value", "--", unit]


def unit_plan(environment: str) -> str | None:
    """TP4_PLAN of a unit's Environment as `systemctl show -p Environment --value` prints it
    (space-separated assignments, a value with spaces in double quotes); None when it has none."""
    try:
        words = shlex.split(environment)
    except ValueError:
        words = environment.split()
    found = [w.partition("=")[2] for w in words if w.startswith("TP4_PLAN=")]
    return found[-1] if found else None


def check_deployed(plan: Plan, nodes: Sequence[Node]) -> None:
    """A NixOS node's unit runs the container of the plan its host configuration was built from
    (the committed plan file), with the env file serve writes: serve refuses, before anything
    changes, a plan other than the one a unit was built from (its TP4_PLAN), which would run that
    plan's container with this plan's environment. A unit that cannot be read or names no plan is
    left to the start (preflight names an unreachable node)."""
    nixos = [n for n in nodes if n.rank.service.kind == "nixos"]
    got = parallel(
        nixos,
        lambda n: n.run(
            unit_plan_argv(n), check=False, timeout=30, purpose=f"reading the plan of {n.rank.service.unit} on {n.name}"
        ),
    )
    wrong: list[tuple[Node, str]] = []
    for n in nixos:
        proc = got[n.name]
        if isinstance(proc, BaseException) or not isinstance(proc, process.CompletedProcess) or proc.returncode != 0:
            continue
        built = unit_plan(proc.stdout)
        if built is not None and built != plan.digest:
            wrong.append((n, built))
    if not wrong:
        return
    first, built = wrong[0]
    others = [n.name for n, _ in wrong[1:]]
    raise NodeFailure(
        first.name,
        "deployed plan",
        f"its NixOS unit {first.rank.service.unit} was built from plan {built}, not this plan ({plan.digest})"
        + (f"; so were the units of {', '.join(others)}" if others else "")
        + f" ({len(wrong)} NixOS node(s)): a start would run that plan's container with this plan's env file; "
        "fix: write this plan's file (tp4 plan --json -o plan.json), commit it and deploy the hosts "
        "(tp4 deploy), then serve",
    )


def serve(
    plan: Plan, nodes: Sequence[Node], secrets: Mapping[str, Secret], opts: Options, out: Echo, progress: Echo
) -> Ready:
    """Bring the line up, verified, or leave nothing running (module docstring)."""
    with line_lock(plan, "serve"):
        if opts.replace:  # before the running line is stopped (preflight checks it otherwise)
            check_deployed(plan, nodes)
            replace_running(plan, nodes, progress)
        preflight(nodes, plan, opts, progress)
        for attempt in (1, 2):
            ready = _boot(plan, nodes, secrets, opts, out, progress)
            slow = [w for w in ready.warnings if w.startswith("slow boot")]
            if slow and opts.on_slow_boot == "restart" and attempt == 1:
                progress("slow boot: restarting it once (--on-slow-boot restart)")
                stop_nodes(nodes, progress)
                continue
            return ready
    raise AssertionError("unreachable")


def _boot(
    plan: Plan, nodes: Sequence[Node], secrets: Mapping[str, Secret], opts: Options, out: Echo, progress: Echo
) -> Ready:
    line, digest = line_id(plan), plan.digest
    started: list[Node] = []
    follower: Follower | None = None
    began = time.monotonic()
    try:
        for n in nodes:  # refused before anything starts
            env_file_text(n.rank, secrets)
        tables = spec_tables(plan)
        if tables:
            push_spec_tables(nodes, tables, progress)
        write_running_plans(plan, nodes)
        workers, head = list(nodes[1:]), nodes[0]
        clear_stop(head)  # served again: no longer stopped on purpose
        # from here a failure (or Ctrl-C mid-start) stops every node: a start cut short can leave
        # a created container, and the checks made sure none of the line ran before.
        # The workers start in parallel, then the head; a plain head's container is created
        # (env file written; podman's also initialized: storage mounted, the OCI runtime's
        # create run) beside the workers' starts, so that only its start follows them.
        started = list(nodes)
        ahead = head.rank.service.kind == "plain"

        def first(n: Node) -> None:
            (create_rank if n is head else start_rank)(n, line=line, secrets=secrets, digest=digest)

        results = parallel(nodes if ahead else workers, first)
        for n in nodes if ahead else workers:
            if isinstance(results[n.name], BaseException):
                exc = results[n.name]
                raise NodeFailure(n.name, "create" if n is head else "start", getattr(exc, "message", str(exc)))
        progress(f"started {len(workers)} workers: " + ", ".join(n.name for n in workers) if workers else "no workers")
        if ahead and head.runtime == "podman":
            # the start and the follower in one: `podman start --attach` streams the output from
            # the first line on, as it is written (`podman logs -f` polls its file every 250 ms);
            # without --sig-proxy, stopping the follower leaves the container running
            follower = start_attached(head)
        else:
            try:
                if ahead:
                    head.run(
                        [head.runtime, "start", head.container],
                        timeout=300,
                        purpose=f"starting the rank of {head.name}",
                    )
                else:
                    start_rank(head, line=line, secrets=secrets, digest=digest)
            except Tp4Error as exc:
                raise NodeFailure(head.name, "start", exc.message) from None
            follower = follow(head)
        progress(f"started the head {head.name}; following its log")
        _wait_ready(plan, nodes, follower, opts, progress)
        seconds = time.monotonic() - began  # from the first rank's start
        # the follower's stop (its remote process group over a second ssh) runs beside the checks
        stopping = threading.Thread(target=follower.stop, daemon=True)
        stopping.start()
        follower = None
        try:
            return _verify_ready(plan, nodes, secrets, opts, seconds, out, progress)
        finally:
            stopping.join(60)
    except BaseException:
        if follower is not None:
            follower.stop()
        if started:
            progress(f"stopping the {len(started)} ranks this serve started ...")
            with process.cleanup():
                for problem in stop_nodes(started, lambda _: None):
                    progress(f"warning: {problem}")
        raise


def _first_exit(stopped: Sequence[Node], states: dict[str, object | BaseException], phase: str) -> NodeFailure:
    """The rank that stopped first (the others often follow it: a peer that leaves the dist group
    takes the rest down), named with its exit code and last log lines; the others are listed."""
    finished: dict[str, tuple[str, str]] = {}
    for node in stopped:
        got = node.run(
            [node.runtime, "inspect", "--format", "{{.State.FinishedAt}}|{{.State.ExitCode}}", node.container],
            check=False,
        ).stdout.strip()
        when, _, code = got.partition("|")
        finished[node.name] = (when or "~", code)
    tails = {n.name: log_tail(n) for n in stopped}

    def follower(node: Node) -> bool:
        """It went down because a peer did (NCCL aborts the communicator of every rank then)."""
        return any(mark in line for line in tails[node.name] for mark in FOLLOWER_MARKS)

    first = min(stopped, key=lambda n: (follower(n), finished[n.name][0], n.rank.rank))
    code = finished[first.name][1]
    others = [n.name for n in stopped if n is not first]
    detail = (
        f"its container is {states[first.name] or 'gone'}"
        + (f" (exit code {code})" if code else "")
        + f" during the boot phase {phase}"
        + (f"; then {', '.join(others)} stopped too" if others else "")
    )
    return NodeFailure(first.name, "rank exited", detail, tails[first.name])


def _redraw(text: str) -> None:
    """One status line on the terminal, redrawn in place."""
    import sys

    sys.stderr.write("\r\033[K" + text)
    sys.stderr.flush()


def _wait_ready(plan: Plan, nodes: Sequence[Node], follower: Follower, opts: Options, progress: Echo) -> float:
    """Follow the head's log until `Ready: API on port <PORT>`; a phase over its timeout, a rank
    whose container stops, or the log ending first fail, naming the node."""
    port = int(plan.line.api.rsplit(":", 1)[1])
    began = phase_began = time.monotonic()
    phase = "start"
    # the ranks' states are read every 2 s from 2 s on: the first read would find the containers
    # just started, and its four runtime calls would slow the head's start (on shared cores)
    last_poll = began
    while True:
        now = time.monotonic()
        limit = opts.timeouts.get(phase, DEFAULT_TIMEOUTS.get(phase, 3600.0))
        if now - phase_began > limit:
            head = nodes[0]
            raise NodeFailure(head.name, f"boot phase {phase}", f"did not finish within {limit:g} s", log_tail(head))
        if now - last_poll > 2.0:
            last_poll = now
            states = parallel(nodes, container_state)
            for node in nodes:
                state = states[node.name]
                if isinstance(state, BaseException):
                    raise NodeFailure(node.name, "reachable", getattr(state, "message", str(state)).splitlines()[0])
            stopped = [n for n in nodes if states[n.name] != "running" and states[n.name] not in NOT_STARTED]
            if stopped:
                raise _first_exit(stopped, states, phase)
        try:
            line = follower.lines.get(timeout=0.5)
        except queue.Empty:
            continue
        if line is None:  # the head's container ended: which rank went first?
            time.sleep(1.0)
            states = parallel(nodes, container_state)
            head = nodes[0]
            if states[head.name] in NOT_STARTED:  # its `start --attach` failed
                raise NodeFailure(
                    head.name, "start", f"its container did not start (it is {states[head.name]})", list(follower.tail)
                )
            stopped = [
                n for n in nodes if states[n.name] != "running" and not isinstance(states[n.name], BaseException)
            ]
            if stopped:
                raise _first_exit(stopped, states, phase)
            head = nodes[0]
            raise NodeFailure(head.name, "log", "the head's log ended before Ready", log_tail(head))
        if opts.tty:
            shown = f"[{phase} {time.monotonic() - began:5.0f} s] {line}"[:100]
            _redraw(shown)
        else:
            progress(f"head| {line}")
        got = phase_of(line)
        if got == "ready":
            from tp4.serving import bootlog

            ready_on = bootlog.ready_port(line)
            if opts.tty:
                _redraw("")
            if ready_on != port:
                raise NodeFailure(
                    nodes[0].name, "ready", f"the head is ready on port {ready_on}, the plan's API is {port}"
                )
            progress(f"phase: ready (after {time.monotonic() - began:.0f} s): {line}")
            return time.monotonic() - began
        if got and got != phase and got in PHASES and PHASES.index(got) > PHASES.index(phase):
            if opts.tty:
                _redraw("")
            progress(f"phase: {got} (after {time.monotonic() - began:.0f} s)")
            phase, phase_began = got, time.monotonic()


def _verify_ready(
    plan: Plan,
    nodes: Sequence[Node],
    secrets: Mapping[str, Secret],
    opts: Options,
    seconds: float,
    out: Echo,
    progress: Echo,
) -> Ready:
    from tp4.serving import api, bootlog

    head = nodes[0]
    ep = endpoint(plan, secrets)
    # every rank's boot log is read while the completion runs (both after Ready)
    with ThreadPoolExecutor(max_workers=1) as pool:
        reading = pool.submit(parallel, nodes, full_log)
        try:
            api.complete(ep, "Reply with one word.", max_tokens=1, timeout=opts.timeouts["completion"])
        except Tp4Error as exc:
            reading.result()
            raise NodeFailure(
                head.name,
                "completion",
                f"Ready was printed, but a one-token completion failed: {exc.message}",
                log_tail(head),
            ) from None
        logs = reading.result()
    texts: dict[int, str] = {}
    for node in nodes:
        got = logs[node.name]
        texts[node.rank.rank] = got if isinstance(got, str) else ""
    problems = bootlog.check_boot_logs(plan, texts)
    if problems:
        first = problems[0]
        more = "".join(f"\n  {p.text()}" for p in problems[1:])
        raise NodeFailure(first.node, first.check, first.detail + more)
    sig = bootlog.boot_signature(texts[0], pin=bootlog.pin_of(plan), ready_seconds=seconds)
    last = load_run(plan, "last-good")
    last_sig = None
    if last and isinstance(last.get("signature"), dict):
        try:
            last_sig = bootlog.BootSignature.from_json(last["signature"])
        except ValueError:
            last_sig = None
    verdict = bootlog.judge(sig, last_good=last_sig, floor=opts.slow_floor)
    warnings = [
        ("slow boot: " if f.check == "slow-boot" else "") + f.text for f in verdict.findings if f.level != "note"
    ]
    record: dict[str, object] = {
        "ok": not verdict.slow,
        "ready_seconds": round(seconds, 2),
        "signature": sig.to_json(),
        "warnings": warnings,
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    save_run(plan, record)
    out(f"ready: {plan.line.api} after {seconds:.1f} s (Ready, a one-token completion, {len(nodes)} boot logs checked)")
    for w in warnings:
        out(f"warning: {w}")
    return Ready(seconds, dict(sig.to_json()), warnings)


def endpoint(plan: Plan, secrets: Mapping[str, Secret], *, url: str | None = None) -> api_Endpoint:
    from tp4.serving import api

    return api.Endpoint.from_plan(url or plan.line.api, plan.nodes[0].env, secrets.get("API_KEY"))


# --- stop -----------------------------------------------------------------------------------------
# `tp4 stop` leaves a stop record on the head, beside the head rank's env file and with the rights
# serve writes that file with, before it stops a rank; serve removes it before it starts one. So
# a line that is down with the record was stopped on purpose since its last serve: `tp4 watch`
# leaves it stopped and `tp4 status` says so. The record is on the head, not in the state
# directory of the machine tp4 runs on, so that every tp4 reads the same one: the operator's
# `tp4 stop` from any machine, and a NixOS head's tp4-watch.service, whose state directory
# (/var/lib/tp4-watch) is not the operator's. Stops that serve again (the watchdog's restart,
# `tp4 serve --replace`, `tp4 up`) stop the ranks without a record.


def stop_record_path(rank: RankPlan) -> str:
    """Where `tp4 stop` records the stop: beside the head rank's env file."""
    return rank.service.env_file.removesuffix(".env") + ".stopped.json"


def record_stop_argv(head: Node) -> list[str]:
    """What writes the stop record (from stdin, mode 0600, atomically: privatefiles)."""
    return _as_env_file(head, ["sh", "-c", _WRITE_PRIVATE, "sh", stop_record_path(head.rank)])


def record_stop(head: Node, by: str) -> str | None:
    """Record on the head that ``by`` (`tp4 stop`) stops the line on purpose; the problem, or None."""
    import getpass
    import socket

    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    record = {
        "by": by,
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "from": f"{user}@{socket.gethostname()}",
    }
    proc = head.run(
        record_stop_argv(head),
        input=json.dumps(record, sort_keys=True) + "\n",
        check=False,
        timeout=30,
        purpose=f"recording the stop on {head.name}",
    )
    if proc.returncode == 0:
        return None
    return (
        f"{head.name}: the stop could not be recorded in {stop_record_path(head.rank)} ({proc.stderr.strip()}): "
        "a `tp4 watch` of the line takes it for a line that is down and serves it again"
    )


def clear_stop(head: Node) -> None:
    """Remove the stop record: the line is served again (serve, before it starts a rank)."""
    head.run(
        _as_env_file(head, ["rm", "-f", "--", stop_record_path(head.rank)]),
        timeout=30,
        purpose=f"removing the stop record on {head.name}",
    )


def read_stop(head: Node) -> dict[str, object] | None:
    """The stop record on the head (``by``, ``when`` in UTC, ``from`` user@host), or None: none, or
    the head cannot be read (then nothing says the line was stopped on purpose)."""
    return _read_doc(head, stop_record_path(head.rank), "the stop record")


def _read_doc(node: Node, path: str, what: str) -> dict[str, Any] | None:
    """The JSON object serve left at ``path`` on ``node`` (read with the rights it was written
    with; its values as JSON gives them), or None: none there, not an object, or the node
    cannot be read."""
    proc = node.run(
        _as_env_file(node, ["cat", "--", path]), check=False, timeout=30, purpose=f"reading {what} on {node.name}"
    )
    try:
        doc = json.loads(proc.stdout) if proc.returncode == 0 else None
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def stop(
    plan: Plan,
    nodes: Sequence[Node],
    secrets: Mapping[str, Secret],
    out: Echo,
    progress: Echo,
    *,
    grace: int = STOP_GRACE,
    by: str = "tp4 stop",
) -> list[str]:
    """Stop every rank of the line (what a crashed serve left too), then check the API is down and
    no container of the line is left. The stop is recorded on the head first (:func:`record_stop`),
    so that a watchdog never takes the stopped line for one that is down. Returns the problems
    (empty: stopped)."""
    from tp4.serving import api

    with line_lock(plan, "stop"):
        problem = record_stop(nodes[0], by)
        problems = stop_nodes(nodes, progress, grace=grace)
        if problem and not any(p.startswith(f"{nodes[0].name}: ") for p in problems):
            problems.insert(0, problem)
        ep = endpoint(plan, secrets)
        if api.health(ep, 3) is not None:
            problems.append(f"{nodes[0].name}: the API {plan.line.api} still answers")
    if not problems:
        out(f"stopped: no rank of the line runs on {len(nodes)} nodes, the API is down")
    return problems


# --- the plan the line runs -----------------------------------------------------------------------
# Every rank's container carries the digest of the plan it was started from (PLAN_LABEL), and
# serve leaves that plan (JSON, no secret in it) beside the rank's env file, mode 0600: status
# and `tp4 plan --against-running` name the fields in which the running line differs.


def running_plan_path(rank: RankPlan) -> str:
    """Where serve leaves the plan it started the rank from: beside its env file."""
    return rank.service.env_file.removesuffix(".env") + ".plan.json"


def _as_env_file(node: Node, argv: list[str]) -> list[str]:
    """``argv`` with the rights serve writes the rank's env file with: root for a NixOS unit's
    (/run/tp4), the ssh user for a plain host's (its workdir)."""
    return node.privileged(argv) if node.rank.service.kind == "nixos" else argv


def write_running_plans(plan: Plan, nodes: Sequence[Node]) -> None:
    text = json.dumps(plan.to_json(), indent=1, sort_keys=True) + "\n"

    def write(n: Node) -> None:
        path = running_plan_path(n.rank)
        n.run(
            _as_env_file(n, ["sh", "-c", _WRITE_PRIVATE, "sh", path]), input=text, purpose=f"writing {path} on {n.name}"
        )

    _raise_first(parallel(nodes, write))


def _label_value(text: str) -> str:
    value = text.strip()
    return "" if value in ("", "<no value>") else value  # docker prints <no value> for a missing label


def running_digests(nodes: Sequence[Node]) -> dict[str, tuple[str, str]]:
    """node name -> (its rank container's state: '' when there is none, `unreachable`; the plan
    digest it carries, '' when none)."""
    got = parallel(nodes, _state_of)
    out: dict[str, tuple[str, str]] = {}
    for node in nodes:
        value = got[node.name]
        state, _, digest = ("unreachable" if isinstance(value, BaseException) else str(value)).partition(" ")
        out[node.name] = (state, _label_value(digest))
    return out


def read_running_plan(node: Node, digest: str) -> dict[str, object] | None:
    """The plan the node's rank was started from, as serve left it, when it is the one of
    ``digest``; None when it cannot be read or is not."""
    from tp4.line.plan import digest_of

    doc = _read_doc(node, running_plan_path(node.rank), "the running plan")
    if doc is None or doc.get("digest") != digest or digest_of(doc) != digest:
        return None
    return doc


def compare_running(plan: Plan, nodes: Sequence[Node], digests: dict[str, tuple[str, str]]) -> dict[str, object]:
    """The running line against the plan: ``same`` (every running rank carries the plan's digest),
    the digests that run, a ``summary`` line, and the ``fields`` that differ (from the first
    differing rank whose plan serve left on its node)."""
    from tp4.line.plan import differences

    want = plan.digest
    running = {name: d for name, (state, d) in digests.items() if state == "running"}
    other = {name: d for name, d in running.items() if d != want}
    result: dict[str, object] = {
        "digest": want,
        "running": sorted(set(running.values())),
        "same": not other,
        "fields": [],
        "summary": "",
    }
    if not running:
        result["summary"] = f"no rank runs; this plan is {want}"
        return result
    if not other:
        result["summary"] = f"the line runs this plan ({want})"
        return result
    name, theirs = next(iter(other.items()))
    node = next(n for n in nodes if n.name == name)
    doc = read_running_plan(node, theirs) if theirs else None
    started = f"another plan ({theirs})" if theirs else "a plan without a digest"
    ranks = ", ".join(other)
    if doc is None:
        result["summary"] = (
            f"{ranks} run(s) from {started}, not this plan ({want}); the fields cannot be named: "
            f"{node.name} holds no readable copy of that plan at {running_plan_path(node.rank)}"
        )
        return result
    diffs = differences(doc, plan.to_json())  # type: ignore[arg-type]
    result["fields"] = [f"{path}: running {json.dumps(a)}, this plan {json.dumps(b)}" for path, a, b in diffs]
    result["summary"] = (
        f"{ranks} run(s) from {started}, not this plan ({want}); {len(diffs)} field(s) differ: "
        + ", ".join(path for path, _, _ in diffs[:8])
        + (", ..." if len(diffs) > 8 else "")
    )
    return result


def already_running(plan: Plan, node: Node, digest: str) -> str:
    """Why serve refuses a line whose rank already runs on ``node``, with its plan's difference."""
    if digest == plan.digest:
        return (
            f"{node.container} is running there from this plan ({digest}); fix: `tp4 status` shows it; "
            "`tp4 stop` first, or `tp4 serve --replace` to restart it"
        )
    cmp = compare_running(plan, [node], {node.name: ("running", digest)})
    # a NixOS unit runs the plan its host was built from (check_deployed): that host is switched first
    deploy = (
        "write this plan's file (tp4 plan --json -o plan.json), commit it and deploy the hosts (tp4 deploy), then "
        if node.rank.service.kind == "nixos"
        else ""
    )
    return (
        f"{cmp['summary']}; fix: `tp4 plan --against-running` shows the difference; {deploy}"
        "`tp4 serve --replace` stops it and serves this plan"
    )


def replace_running(plan: Plan, nodes: Sequence[Node], progress: Echo) -> None:
    """--replace: stop what of the line runs (from whichever plan) before serving this plan."""
    digests = running_digests(nodes)
    running = sorted({d or "no digest" for state, d in digests.values() if state not in ("", "unreachable")})
    if not running:
        return
    progress(f"replacing the line's ranks (plan {', '.join(running)}) with this plan ({plan.digest})")
    problems = stop_nodes(nodes, progress)
    if problems:
        raise Tp4Error("--replace: the running line did not stop:\n" + "\n".join(f"  {p}" for p in problems))


# --- status ---------------------------------------------------------------------------------------


def _node_status(node: Node) -> dict[str, object]:
    fmt = '{{.State.Status}}|{{.State.StartedAt}}|{{.Image}}|{{index .Config.Labels "' + PLAN_LABEL + '"}}'
    proc = node.run([node.runtime, "inspect", "--format", fmt, node.container], check=False, timeout=20)
    if proc.returncode != 0:
        return {"node": node.name, "rank": node.rank.rank, "container": node.container, "state": "absent"}
    state, started, image, digest = (proc.stdout.strip().split("|") + ["", "", "", ""])[:4]
    info: dict[str, object] = {
        "node": node.name,
        "rank": node.rank.rank,
        "container": node.container,
        "state": state,
        "started": started,
        "image": runtime_cli.normalize_id(image),
        "plan": _label_value(digest) or None,
    }
    last = node.run([node.runtime, "logs", "--tail", "1", "--timestamps", node.container], check=False, timeout=20)
    text = ((last.stdout or "") + (last.stderr or "")).strip().splitlines()
    if text:
        stamp = text[-1].split(" ", 1)[0]
        age = _age(stamp)
        info["last_log_line"] = text[-1].split(" ", 1)[1] if " " in text[-1] else ""
        info["last_log_age_s"] = age
    return info


def meminfo(text: str) -> dict[str, int]:
    """The fields of a /proc/meminfo text, in bytes (the kernel gives kB: KiB)."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            out[name.strip()] = int(parts[0]) * (1024 if parts[1:] == ["kB"] else 1)
    return out


def mem_available(node: Node, *, timeout: float = 20) -> int | None:
    """The node's ``MemAvailable`` in bytes (its /proc/meminfo, through :meth:`Node.run`); None
    when it cannot be read. `tp4 bench needle --watch-memory` polls the head with it during a
    long prefill (the seed's low-water mark at 1M tokens was 7 GiB)."""
    proc = node.run(["cat", "/proc/meminfo"], check=False, timeout=timeout, purpose=f"the free memory of {node.name}")
    return meminfo(proc.stdout).get("MemAvailable") if proc.returncode == 0 else None


def _age(stamp: str) -> float | None:
    from datetime import datetime, timezone

    m = re.match(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:?\d\d)?", stamp)
    if not m:
        return None
    try:
        when = datetime.fromisoformat(
            m.group(1) + (m.group(2) or "")[:7] + ("+00:00" if m.group(3) in (None, "Z") else m.group(3))
        )
    except ValueError:
        return None
    return round((datetime.now(timezone.utc) - when).total_seconds(), 1)


def status(
    plan: Plan,
    nodes: Sequence[Node],
    secrets: Mapping[str, Secret],
    *,
    probe_timeout: float = 10.0,
    others_in_flight: int = 0,
    live: Liveness | None = None,
) -> dict[str, object]:
    """Each node's rank and the line's liveness, as JSON values. ``others_in_flight``: probes of
    the caller that timed out before this one and may still be in flight (the watchdog's).
    ``live``: a probe the caller has just made (the watchdog's last look, for its evidence),
    used instead of a new one: a wedged line would hold a new probe for its whole deadline."""
    from tp4.serving import api

    results = parallel(nodes, _node_status)
    node_info: list[object] = []
    for node in nodes:
        got = results[node.name]
        if isinstance(got, BaseException):
            node_info.append(
                {
                    "node": node.name,
                    "rank": node.rank.rank,
                    "state": "unreachable",
                    "error": getattr(got, "message", str(got)).splitlines()[0],
                }
            )
        else:
            node_info.append(got)
    own = 0 if live is not None else 1  # this call's own probe, when it makes one
    if live is None:
        live = api.probe(endpoint(plan, secrets), probe_timeout)
    record = load_run(plan)
    # the one classification `tp4 watch` acts on, and the stop record both read
    from tp4.serving.linestate import classify, stopped_on_purpose

    ranks = {str(i.get("node")): str(i.get("state") or "") for i in node_info if isinstance(i, dict)}
    # this probe's own request, when it timed out, and the caller's earlier ones
    verdict = classify(ranks, live, own_in_flight=own + others_in_flight)
    stopped = read_stop(nodes[0]) if verdict.state == "down" else None
    verdict = stopped_on_purpose(verdict, stopped)
    digests = {
        str(i.get("node")): (str(i.get("state") or ""), str(i.get("plan") or ""))
        for i in node_info
        if isinstance(i, dict) and i.get("state") not in ("absent", "unreachable")
    }
    return {
        "plan": compare_running(plan, nodes, digests),
        "line": line_id(plan),
        "api": plan.line.api,
        "nodes": node_info,
        "state": verdict.state,
        "state_detail": verdict.detail,
        "stopped": stopped,
        "liveness": {
            "state": live.state,
            "detail": live.detail,
            "running": live.load.running if live.load else None,
            "waiting": live.load.waiting if live.load else None,
            # a probe that timed out with requests in flight: whether SGLang's token counters grew
            # meanwhile (None: not asked, or no /metrics to tell)
            "progress": live.progress,
        },
        "boot": record,
    }
