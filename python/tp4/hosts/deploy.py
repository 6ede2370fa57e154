"""`tp4 deploy`: switch the line's NixOS hosts to the flake's systems, check each from here, and
switch back by generation number what fails.

The hosts are the plan's nodes of kind ``nixos`` (``--on`` picks some); every step runs on all of
them at once (:func:`tp4.hosts.nodes.parallel`), every command through :mod:`tp4.core.process`:

1. **build** the systems once, on this machine: one ``nix build --no-link --json`` of every host's
   ``nixosConfigurations.<node>.config.system.build.toplevel`` (``--json``, not
   ``--print-out-paths``: that flag came after Nix 2.8, Debian 12's; the JSON lists the paths in
   the order of the installables);
2. per host: **record** its current system generation (``nix-env --list-generations`` of
   /nix/var/nix/profiles/system, the ``(current)`` line), **copy** the closure, and check it
   arrived as a NixOS system (``<toplevel>/nixos-version``, as nixos-rebuild does). The copy is
   what nix-copy-closure does, through tp4's own ssh (the one funnel, its options and its host
   key check): the closure here (``nix-store --query --requisites``), the paths the host lacks
   (``nix-store --check-validity --print-invalid`` there, the paths on its stdin), then
   ``nix-store --export`` of those here piped into ``nix-store --import`` there (as root: an
   import by root checks no signature, and the paths built here carry none the host trusts).
   ``nix copy --to ssh://`` would start an ssh of its own, which Nix 2.8 run as root starts
   after a setns() into its saved mount namespace: in a chroot that leaves the chroot, and the
   ssh finds neither the key nor tp4's known_hosts. With ``--all-or-nothing`` a host that fails
   here stops the deploy before any host changes;
3. per host: **set** the system profile (``nix-env -p /nix/var/nix/profiles/system --set``, a new
   generation), then **switch** in a transient unit, ``systemd-run --unit=tp4-deploy-switch --wait
   --collect ... <toplevel>/bin/switch-to-configuration switch`` (as nixos-rebuild does since
   nixpkgs PR #258571): a restart of sshd, the network or RDMA during the switch cannot kill the
   activation with the ssh session that started it. The fixed unit name also refuses a second
   switch while one still runs on the host (``--collect`` unloads a finished one);
   When the switch's ssh connection ends (sshd or the network restarting), tp4 waits on a new
   connection until the unit has finished and lets the post-check judge;
4. the **post-check, from this machine**: ssh answers on a new connection (not the shared one,
   which outlives an sshd restart), :data:`RDMA_CHECK_UNIT` (the host module's oneshot check of the
   fabric ports and GIDs) is active, and doctor's blocking checks pass for the host
   (:func:`tp4.hosts.doctor.doctor` over every node of the line: some checks compare nodes), among them
   the weights (WEIGHTS.HEAD: the head's model.dir holds config.json and the shards;
   WEIGHTS.WORKER: the worker sees them through the plan's volume), reported as a check of its own;
5. a host whose switch or post-check fails is switched back **by generation number**:
   ``nix-env -p /nix/var/nix/profiles/system --switch-generation N``, then that generation's
   ``switch-to-configuration switch`` in the unit ``tp4-deploy-rollback``; the others stay, or with
   ``--all-or-nothing`` every host switched goes back;
6. Ctrl-C (TERM, HUP) after the copies: every host whose profile changed goes back the same way,
   once its switch unit has finished there (:func:`_interrupted`); then exit 130.

``--dry-run`` prints every command the run would run (the same argv lists, from the same
functions), with ``<toplevel:NODE>`` and ``<generation:NODE>`` where the run uses what the build
printed and the host said; it runs nothing.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from tp4.core import process

from tp4.hosts import doctor

from tp4.image import nix
from tp4.core.errors import InvalidInput, Tp4Error
from tp4.line import plan as plan_mod
from tp4.line.plan import Plan
from tp4.hosts.nodes import Node, parallel

Echo = Callable[[str], None]

SYSTEM_PROFILE = "/nix/var/nix/profiles/system"
# the host module's oneshot check of the fabric (ports ACTIVE, the RoCE v2 GID of each address):
# the name the plan gives it (service.host_units.rdma_check), which the module declares
RDMA_CHECK_UNIT = plan_mod.RDMA_CHECK_UNIT
SWITCH_UNIT = "tp4-deploy-switch"
ROLLBACK_UNIT = "tp4-deploy-rollback"
# nixos-rebuild's prefix (nixos-rebuild-ng nix.py SWITCH_TO_CONFIGURATION_CMD_PREFIX) with --wait:
# tp4 waits for the unit and takes its exit status; the locale archive of the session reaches it
SYSTEMD_RUN = (
    "systemd-run",
    "--wait",
    "--collect",
    "--pipe",
    "--quiet",
    "--no-ask-password",
    "--service-type=exec",
    "--setenv=LOCALE_ARCHIVE",
)
TOPLEVEL = "config.system.build.toplevel"
# doctor's checks whose result is the post-check's "weights" column
WEIGHTS_CHECKS = ("WEIGHTS.HEAD", "WEIGHTS.SHARD_FILES", "WEIGHTS.WORKER")
# seconds the post-check waits for ssh to answer and the RDMA check to settle after a switch
CHECK_TIMEOUT = 60.0
SWITCH_TIMEOUT = 1800.0
COPY_TIMEOUT = 7200.0

# what may stand in a Nix store address ssh://<user>@<host> (neither may start with '-' nor hold a
# space)
_HOST = re.compile(r"[A-Za-z0-9:][A-Za-z0-9._:-]*")
_USER = re.compile(r"[a-z_][a-z0-9_.-]*")
_ATTR = re.compile(r"[A-Za-z_][A-Za-z0-9_'-]*")

Result = Literal["deployed", "failed", "rolled back", "rollback failed", "unchanged"]


def toplevel_placeholder(node: str) -> str:
    return f"<toplevel:{node}>"


def generation_placeholder(node: str) -> str:
    return f"<generation:{node}>"


# --- the commands ---------------------------------------------------------------------------------


def attr_name(name: str) -> str:
    """A node name as one component of a flake attribute path (quoted unless a plain identifier:
    `spark.1` would be two components)."""
    if _ATTR.fullmatch(name):
        return name
    if any(c in name for c in '"\\$') or any(ord(c) < 0x20 for c in name):
        raise InvalidInput(
            f"node {name!r}: cannot name a nixosConfigurations attribute; fix: letters, digits, '.', '_' or '-' only"
        )
    return f'"{name}"'


def installable(flake: str, node: str) -> str:
    return f"{flake}#nixosConfigurations.{attr_name(node)}.{TOPLEVEL}"


def build_argv(flake: str, names: Sequence[str]) -> list[str]:
    """The one nix invocation that builds every host's system here (its log as JSON events, each
    build or download shown as a progress line)."""
    return [
        *nix.base(),
        "build",
        "--no-link",
        "--json",
        "--log-format",
        "internal-json",
        "-v",
        *(installable(flake, n) for n in names),
    ]


def build(flake: str, names: Sequence[str], progress: Echo) -> dict[str, str]:
    """Build the systems; node -> its toplevel. Each build or download nix starts is a progress
    line; a failure shows the end of nix's log."""
    argv = build_argv(flake, names)
    proc = process.start(argv, echo=progress, stdout=process.PIPE, stderr=process.PIPE, text=True, errors="replace")
    tail: list[str] = []
    try:
        assert proc.stderr is not None and proc.stdout is not None
        for line in proc.stderr:
            event = nix.log_event(line)
            if event is not None and event[0] == "progress":
                progress(f"nix: {event[1]}")
            elif event is not None:
                tail = (tail + [event[1]])[-20:]
        out = proc.stdout.read()
        proc.wait()
    except BaseException:  # Ctrl-C: nix goes with it
        process.stop(proc)
        raise
    if proc.returncode != 0:
        raise Tp4Error(
            f"building the systems (`nix build` of {', '.join(names)}) failed with exit code {proc.returncode}"
            + "".join(f"\n{line}" for line in tail)
        )
    return toplevels(out, names)


def store_uri(node: Node) -> str:
    """``ssh://<user>@<host>``: the node as a Nix store address (its nix-copy-closure name); refuses
    a host or user no store address can hold, before anything runs."""
    ssh = node.rank.ssh
    if not _HOST.fullmatch(ssh.host):
        raise InvalidInput(
            f"{node.name}: ssh address {ssh.host[:80]!r} cannot be a nix store address; fix: a host name or "
            "IP address of letters, digits, '.', '-' or ':', not starting with '-'"
        )
    if not _USER.fullmatch(ssh.user):
        raise InvalidInput(
            f"{node.name}: ssh user {ssh.user[:40]!r} is not a user name; fix: lower-case letters, digits, "
            "'_', '.' or '-', starting with a letter or '_'"
        )
    return f"ssh://{ssh.user}@{ssh.host}"


def closure_argv(toplevel: str) -> list[str]:
    """The closure of the system here, dependencies first."""
    return ["nix-store", "--query", "--requisites", toplevel]


# the paths on stdin (one per line) that the host's store lacks; a constant script, the paths
# never on a command line (a system's closure is too long for one)
_MISSING = "xargs -r nix-store --check-validity --print-invalid"


def missing_argv() -> list[str]:
    return ["sh", "-c", _MISSING]


def export_argv(paths: Sequence[str]) -> list[str]:
    return ["nix-store", "--export", *paths]


def import_argv(node: Node) -> list[str]:
    return node.privileged(["nix-store", "--import"])


def generations_argv(node: Node) -> list[str]:
    return node.privileged(["nix-env", "-p", SYSTEM_PROFILE, "--list-generations"])


def is_system_argv(toplevel: str) -> list[str]:
    return ["test", "-f", f"{toplevel}/nixos-version"]


def set_argv(node: Node, toplevel: str) -> list[str]:
    return node.privileged(["nix-env", "-p", SYSTEM_PROFILE, "--set", toplevel])


def switch_argv(node: Node, toplevel: str, *, unit: str = SWITCH_UNIT) -> list[str]:
    return node.privileged([*SYSTEMD_RUN, f"--unit={unit}", f"{toplevel}/bin/switch-to-configuration", "switch"])


def generation_link(generation: int | str) -> str:
    """The profile's link of a generation (nix-env names them so): its system, by number."""
    return f"{SYSTEM_PROFILE}-{generation}-link"


def switch_generation_argv(node: Node, generation: int | str) -> list[str]:
    return node.privileged(["nix-env", "-p", SYSTEM_PROFILE, "--switch-generation", str(generation)])


def rollback_argv(node: Node, generation: int | str) -> list[str]:
    return switch_argv(node, generation_link(generation), unit=ROLLBACK_UNIT)


def ssh_check_argv() -> list[str]:
    return ["true"]


def unit_argv() -> list[str]:
    return unit_state_argv(RDMA_CHECK_UNIT)


def fresh(node: Node) -> Node:
    """The node over a new ssh connection of its own (not the shared one)."""
    assert node.remote is not None
    return Node(node.rank, dataclasses.replace(node.remote, share_connection=False))


def current_generation(text: str) -> int | None:
    """The number of the ``(current)`` line of `nix-env --list-generations`."""
    for line in text.splitlines():
        m = re.match(r"\s*(\d+)\s.*\(current\)\s*$", line)
        if m:
            return int(m.group(1))
    return None


def toplevels(text: str, names: Sequence[str]) -> dict[str, str]:
    """node -> its system's store path, from `nix build --json` (one entry per installable, in order)."""
    try:
        data = json.loads(text)
        paths = [entry["outputs"]["out"] for entry in data]
    except (ValueError, KeyError, TypeError) as exc:
        raise Tp4Error(f"nix build printed no output paths ({exc}): {text.strip()[:200]}") from None
    if len(paths) != len(names) or not all(isinstance(p, str) and p.startswith("/") for p in paths):
        raise Tp4Error(f"nix build printed {len(paths)} paths for {len(names)} systems: {text.strip()[:200]}")
    return dict(zip(names, paths, strict=True))


# --- choosing the hosts ---------------------------------------------------------------------------


def hosts_of(nodes: Sequence[Node], on: Sequence[str]) -> list[Node]:
    """The NixOS nodes to deploy: those named by --on (each must be a NixOS node of the line),
    else every NixOS node."""
    by_name = {n.name: n for n in nodes}
    for name in on:
        if name not in by_name:
            raise InvalidInput(f"--on {name!r}: no such node in the profile; fix: one of {', '.join(by_name)}")
        if by_name[name].rank.service.kind != "nixos":
            raise InvalidInput(
                f"--on {name}: the node is of kind plain, tp4 deploy switches NixOS hosts only; fix: "
                'kind = "nixos" in its profile entry (once it runs NixOS), or leave it out'
            )
    chosen = [n for n in nodes if n.name in on] if on else [n for n in nodes if n.rank.service.kind == "nixos"]
    if not chosen:
        raise InvalidInput(
            'the profile has no node of kind nixos: tp4 deploy switches NixOS hosts; fix: kind = "nixos" '
            "in the profile entries of the hosts that run the tp4 NixOS modules"
        )
    for n in chosen:
        if n.remote is None:
            raise InvalidInput(f"{n.name}: tp4 deploy reaches every host over ssh (this is a local node)")
    return chosen


# --- the run --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Options:
    flake: str
    on: tuple[str, ...] = ()
    all_or_nothing: bool = False
    skip_checks: frozenset[str] = frozenset()  # doctor check ids not to hold against a host
    limits: doctor.Limits = field(default_factory=doctor.Limits)
    check_timeout: float = CHECK_TIMEOUT


@dataclass
class HostState:
    """What happened on one host; the summary's row."""

    node: str
    toplevel: str | None = None
    before: int | None = None  # the generation recorded before the deploy
    after: int | None = None  # the generation the deploy set
    switched: bool = False  # the profile was set (a rollback is needed to undo it)
    result: Result = "unchanged"
    detail: str = ""
    checks: dict[str, str] = field(default_factory=dict)  # post-check part -> "ok" or why not


class HostFailed(Tp4Error):
    """A step failed on one host (its message names the step)."""


def _message(exc: BaseException) -> str:
    return (getattr(exc, "message", None) or str(exc) or type(exc).__name__).strip()


def _brief(exc: BaseException) -> str:
    """An error in one line: its first, and the last line of the command's stderr after it."""
    lines = [line.strip() for line in _message(exc).splitlines() if line.strip()]
    return lines[0] + (f": {lines[-1]}" if len(lines) > 1 else "") if lines else type(exc).__name__


def _run(
    node: Node, argv: Sequence[str], what: str, *, timeout: float = 120.0, check: bool = True, input: str | None = None
) -> process.CompletedProcess[str]:
    try:
        return node.run(argv, timeout=timeout, purpose=f"{what} on {node.name}", check=check, input=input)
    except Tp4Error as exc:
        raise HostFailed(f"{what}: {exc.message}") from None


def record(node: Node) -> int:
    """The node's current system generation."""
    out = _run(node, generations_argv(node), "reading the system generations").stdout
    gen = current_generation(out)
    if gen is None:
        raise HostFailed(
            f"{SYSTEM_PROFILE} has no current generation: not a NixOS host, or never installed; fix: install "
            'NixOS on it first (nixos-anywhere, or the installer), or set kind = "plain"'
        )
    return gen


def copy(node: Node, toplevel: str) -> int:
    """Copy the closure of ``toplevel`` to the node (module doc); the number of paths sent."""
    try:
        closure = process.run(
            closure_argv(toplevel), timeout=COPY_TIMEOUT, purpose="the closure of the system here"
        ).stdout.split()
        missing = set(
            _run(
                node, missing_argv(), "asking which paths the host lacks", input="\n".join(closure) + "\n"
            ).stdout.split()
        )
        todo = [p for p in closure if p in missing]
        if todo:
            process.pipe(
                [export_argv(todo), process.Step(import_argv(node), remote=node.remote)],
                timeout=COPY_TIMEOUT,
                purpose=f"copying {len(todo)} paths to {node.name}",
            )
    except Tp4Error as exc:
        raise HostFailed(f"copy: {exc.message}") from None
    if _run(node, is_system_argv(toplevel), "checking the copied system", check=False).returncode != 0:
        raise HostFailed(f"copy: {toplevel} is not a NixOS system on the host (no nixos-version) after the copy")
    return len(todo)


# the states of a unit that has not finished yet
UNFINISHED = ("active", "activating", "deactivating", "reloading", "refreshing")


def unit_state_argv(unit: str) -> list[str]:
    return ["systemctl", "is-active", "--", unit]


def switch(node: Node, toplevel: str, state: HostState, progress: Echo) -> None:
    """Set the profile (a new generation) and switch to it in the transient unit. When the ssh
    connection ends during the switch (it restarted sshd or the network: what the unit is for),
    wait on a new connection until the unit has finished; the post-check judges the result."""
    _run(node, set_argv(node, toplevel), "setting the system profile")
    state.switched = True
    state.after = record(node)
    proc = _run(
        node, switch_argv(node, toplevel), "switch-to-configuration switch", timeout=SWITCH_TIMEOUT, check=False
    )
    if proc.returncode == 0:
        return
    if proc.returncode != 255:
        why = (proc.stderr.strip().splitlines() or [""])[-1]
        raise HostFailed(
            f"switch-to-configuration switch failed with exit code {proc.returncode}" + (f": {why}" if why else "")
        )
    unit = f"{SWITCH_UNIT}.service"
    progress(
        f"{node.name}: the ssh connection ended during the switch (sshd or the network restarting); waiting for "
        f"{unit} to finish, on a new connection"
    )
    own = fresh(node)
    deadline = time.monotonic() + SWITCH_TIMEOUT
    while True:
        got = own.run(unit_state_argv(unit), check=False, timeout=30, purpose=f"the state of {unit} on {node.name}")
        now = (got.stdout.strip().splitlines() or [""])[-1]
        if got.returncode != 255 and now not in UNFINISHED:
            if now == "failed":
                raise HostFailed(
                    f"switch-to-configuration switch failed ({unit} failed; journalctl -u {unit} on the host)"
                )
            return
        if time.monotonic() > deadline:
            raise HostFailed(f"{unit} did not finish within {SWITCH_TIMEOUT:g} s after the connection ended")
        time.sleep(1.0)


def post_check(node: Node, timeout: float) -> dict[str, str]:
    """ssh on a new connection and the RDMA check unit (doctor's part comes after, for all hosts):
    part -> "ok", or what failed."""
    own = fresh(node)
    deadline = time.monotonic() + timeout
    checks: dict[str, str] = {}
    while True:
        proc = own.run(ssh_check_argv(), check=False, timeout=30, purpose=f"a new ssh connection to {node.name}")
        if proc.returncode == 0:
            checks["ssh"] = "ok"
            break
        if time.monotonic() > deadline:
            why = (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[-1]
            checks["ssh"] = f"a new ssh connection fails: {why}"
            return checks
        time.sleep(1.0)
    while True:
        proc = own.run(unit_argv(), check=False, timeout=30, purpose=f"the state of {RDMA_CHECK_UNIT} on {node.name}")
        state = (proc.stdout.strip().splitlines() or ["unknown"])[-1]
        if proc.returncode == 0 and state == "active":
            checks["rdma"] = "ok"
            break
        if state not in ("activating", "reloading") or time.monotonic() > deadline:
            checks["rdma"] = f"{RDMA_CHECK_UNIT} is {state} (journalctl -u {RDMA_CHECK_UNIT} on the host says why)"
            break
        time.sleep(1.0)
    return checks


def rollback(node: Node, state: HostState) -> None:
    assert state.before is not None
    gen = state.before
    _run(node, switch_generation_argv(node, gen), f"switching the profile back to generation {gen}")
    _run(node, rollback_argv(node, gen), f"switch-to-configuration switch of generation {gen}", timeout=SWITCH_TIMEOUT)
    now = record(node)
    if now != gen:
        raise HostFailed(f"after the rollback the current generation is {now}, not {gen}")


def _each(
    nodes: Sequence[Node], fn: Callable[[Node], object], states: dict[str, HostState], progress: Echo, step: str
) -> list[Node]:
    """``fn`` on every node at once; the nodes it failed on get their state's detail (and a
    progress line). Returns the nodes it passed on."""
    results = parallel(nodes, fn)
    passed = []
    for n in nodes:
        got = results[n.name]
        if isinstance(got, BaseException):
            if not isinstance(got, Exception):
                raise got
            states[n.name].detail = _brief(got) if isinstance(got, HostFailed) else f"{step}: {_brief(got)}"
            states[n.name].result = "failed"
            progress(f"{n.name}: FAILED: {states[n.name].detail}")
        else:
            passed.append(n)
    return passed


def deploy(plan: Plan, nodes: Sequence[Node], opts: Options, out: Echo, progress: Echo) -> list[HostState]:
    """Deploy the chosen NixOS hosts (module doc); one state per host, in the line's order."""
    hosts = hosts_of(nodes, opts.on)
    names = [n.name for n in hosts]
    for n in hosts:  # refused before anything runs
        store_uri(n)
    states = {n.name: HostState(n.name) for n in hosts}
    progress(f"building {len(hosts)} systems here: {', '.join(names)}")
    for name, path in build(opts.flake, names, progress).items():
        states[name].toplevel = path
        progress(f"{name}: {path}")

    def prepare(n: Node) -> None:
        st = states[n.name]
        st.before = record(n)
        progress(f"{n.name}: current generation {st.before}; copying the system")
        assert st.toplevel is not None
        copy(n, st.toplevel)
        progress(f"{n.name}: copied")

    ready = _each(hosts, prepare, states, progress, "prepare")
    if opts.all_or_nothing and len(ready) < len(hosts):
        for n in ready:
            states[n.name].detail = "not switched (--all-or-nothing: another host failed before any switch)"
        return _finish(hosts, states, out)

    def activate(n: Node) -> None:
        st = states[n.name]
        assert st.toplevel is not None
        switch(n, st.toplevel, st, progress)
        progress(f"{n.name}: switched to generation {st.after}; checking it from here")
        st.checks = post_check(n, opts.check_timeout)

    try:
        return _activate_and_check(plan, nodes, hosts, ready, activate, states, opts, out, progress)
    except KeyboardInterrupt:
        _interrupted(hosts, ready, states, out, progress)
        raise


def _activate_and_check(
    plan: Plan,
    nodes: Sequence[Node],
    hosts: Sequence[Node],
    ready: Sequence[Node],
    activate: Callable[[Node], None],
    states: dict[str, HostState],
    opts: Options,
    out: Echo,
    progress: Echo,
) -> list[HostState]:
    switched = _each(ready, activate, states, progress, "switch")
    # doctor over every node of the line (some checks compare nodes), read once for all hosts
    reachable = [n for n in switched if states[n.name].checks.get("ssh") == "ok"]
    if reachable:
        report = doctor.doctor(plan, nodes, opts.limits)
        for n in reachable:
            mine = [r for r in report.results if r.node == n.name]
            weights = [
                r for r in mine if r.check in WEIGHTS_CHECKS and r.status == "fail" and r.check not in opts.skip_checks
            ]
            states[n.name].checks["weights"] = (
                "ok" if not weights else "; ".join(f"{r.check}: {r.detail}" for r in weights)
            )
            blocking = [
                r
                for r in mine
                if r.blocking
                and r.status == "fail"
                and r.check not in opts.skip_checks
                and r.check not in WEIGHTS_CHECKS
            ]
            states[n.name].checks["doctor"] = (
                "ok" if not blocking else "; ".join(f"{r.check}: {r.detail}" for r in blocking)
            )
    for n in switched:
        st = states[n.name]
        bad = {k: v for k, v in st.checks.items() if v != "ok"}
        if bad:
            st.result = "failed"
            st.detail = "post-check: " + "; ".join(f"{k}: {v}" for k, v in bad.items())
            progress(f"{n.name}: FAILED {st.detail}")
        else:
            st.result = "deployed"
            progress(f"{n.name}: post-check passed (ssh, {RDMA_CHECK_UNIT}, weights, doctor)")
    failed = [n for n in hosts if states[n.name].result == "failed"]
    if failed:
        back = [
            n for n in hosts if states[n.name].switched and (opts.all_or_nothing or states[n.name].result == "failed")
        ]
        if back:
            progress(f"rolling back {', '.join(n.name for n in back)} by generation number")

        def undo(n: Node) -> None:
            rollback(n, states[n.name])

        results = parallel(back, undo)
        for n in back:
            st = states[n.name]
            got = results[n.name]
            why = (
                st.detail
                or f"rolled back with the others (--all-or-nothing; failed: {', '.join(f.name for f in failed)})"
            )
            if isinstance(got, BaseException):
                st.result = "rollback failed"
                st.detail = (
                    f"{why}; the rollback to generation {st.before} failed too: {_brief(got)}; fix: "
                    f"on the host, nix-env -p {SYSTEM_PROFILE} --switch-generation {st.before} and "
                    f"{generation_link(st.before or 0)}/bin/switch-to-configuration switch, or boot generation "
                    f"{st.before} from the boot menu"
                )
            else:
                st.result = "rolled back"
                st.detail = why
            progress(f"{n.name}: {st.result} to generation {st.before}")
    return _finish(hosts, states, out)


def wait_switch(node: Node, timeout: float = SWITCH_TIMEOUT) -> None:
    """Until the switch unit has finished on the host (it outlives the ssh command that started
    it: an interrupted deploy's switch goes on there), on a connection of its own."""
    unit = f"{SWITCH_UNIT}.service"
    own = fresh(node)
    deadline = time.monotonic() + timeout
    while True:
        got = own.run(unit_state_argv(unit), check=False, timeout=30, purpose=f"the state of {unit} on {node.name}")
        now = (got.stdout.strip().splitlines() or [""])[-1]
        if got.returncode != 255 and now not in UNFINISHED:
            return
        if time.monotonic() > deadline:
            raise HostFailed(f"{unit} did not finish within {timeout:g} s")
        time.sleep(0.5)


def _interrupted(
    hosts: Sequence[Node], ready: Sequence[Node], states: dict[str, HostState], out: Echo, progress: Echo
) -> None:
    """Ctrl-C (or TERM, HUP) after the copies: every host whose system profile changed goes back
    to its recorded generation, once its switch has finished there (the switch unit outlives the
    interrupted ssh command); the table says what each host is on. A second Ctrl-C gives the
    rollback up, and the hosts it had not reached are named."""

    def changed(n: Node) -> bool:
        st = states[n.name]
        if st.switched:
            return True
        # interrupted while the profile was being set: the generation tells
        return st.before is not None and record(n) != st.before

    def undo(n: Node) -> None:
        if not changed(n):
            states[n.name].result, states[n.name].detail = "unchanged", "not switched (interrupted before its switch)"
            return
        st = states[n.name]
        st.switched = True
        wait_switch(n)
        rollback(n, st)
        st.result, st.detail = "rolled back", "interrupted (Ctrl-C) during the deploy"
        progress(f"{n.name}: rolled back to generation {st.before}")

    progress(f"interrupted: taking {', '.join(n.name for n in ready)} back to their recorded generations")
    with process.cleanup():
        results = parallel(ready, undo)
    if any(isinstance(r, BaseException) and not isinstance(r, Exception) for r in results.values()):
        pending = [n.name for n in ready if states[n.name].result not in ("rolled back", "unchanged")]
        progress(
            f"interrupted again: the rollback was given up; {', '.join(pending) or 'no host'} may be on the new "
            f"generation (fix: tp4 deploy again, or on the host nix-env -p {SYSTEM_PROFILE} --switch-generation N "
            f"and {generation_link('N')}/bin/switch-to-configuration switch)"
        )
        raise KeyboardInterrupt
    for n in ready:
        got = results[n.name]
        st = states[n.name]
        if isinstance(got, BaseException):
            st.result = "rollback failed"
            st.detail = (
                f"interrupted (Ctrl-C); the rollback to generation {st.before} failed: {_brief(got)}; fix: on "
                f"the host, nix-env -p {SYSTEM_PROFILE} --switch-generation {st.before} and "
                f"{generation_link(st.before or 0)}/bin/switch-to-configuration switch"
            )
            progress(f"{n.name}: {st.detail}")
    _finish(hosts, states, out)


def _finish(hosts: Sequence[Node], states: dict[str, HostState], out: Echo) -> list[HostState]:
    rows = [states[n.name] for n in hosts]
    for line in table(rows):
        out(line)
    return rows


def table(rows: Sequence[HostState]) -> list[str]:
    """host, from generation, to generation, result; then a line per host that did not deploy."""

    def gen(v: int | None) -> str:
        return "-" if v is None else str(v)

    width = max([len("host")] + [len(r.node) for r in rows])
    lines = [f"{'host':<{width}}  {'from':>5}  {'to':>5}  result"]
    for r in rows:
        result = f"{r.result} to {r.before}" if r.result == "rolled back" else r.result
        lines.append(f"{r.node:<{width}}  {gen(r.before):>5}  {gen(r.after):>5}  {result}")
    for r in rows:
        if r.result != "deployed" and r.detail:
            lines.append(f"  {r.node}: {r.detail}")
    return lines


# --- dry run --------------------------------------------------------------------------------------


def dry_run(plan: Plan, nodes: Sequence[Node], opts: Options, out: Echo) -> None:
    """Print every command deploy would run (module doc), running nothing."""
    hosts = hosts_of(nodes, opts.on)
    names = [n.name for n in hosts]

    def show(argv: Sequence[str], node: Node | None = None) -> None:
        out("$ " + shlex.join(process.full_argv(argv, node.remote if node else None)))

    out(f"# build the {len(hosts)} systems here, once")
    show(build_argv(opts.flake, names))
    for n in hosts:
        top = toplevel_placeholder(n.name)
        gen = generation_placeholder(n.name)
        out(f"# {n.name} (in parallel with the other hosts): record the generation, copy, check the copy")
        show(generations_argv(n), n)
        show(closure_argv(top))
        show(missing_argv(), n)
        out(
            f"# {n.name}: (the closure on the last command's stdin) then, when the host lacks some of it: "
            f"{shlex.join(export_argv(['<paths it lacks>']))} | {shlex.join(process.full_argv(import_argv(n), n.remote))}"
        )
        show(is_system_argv(top), n)
        out(f"# {n.name}: set the profile and switch" + (" (once every host is copied)" if opts.all_or_nothing else ""))
        show(set_argv(n, top), n)
        show(generations_argv(n), n)
        show(switch_argv(n, top), n)
        out(f"# {n.name}: post-check from here, on a new ssh connection")
        show(ssh_check_argv(), fresh(n))
        show(unit_argv(), fresh(n))
        out(
            f"# {n.name}: and tp4 doctor's blocking checks for it, read on every node of the line (one facts command per "
            "node, as `tp4 -v doctor` logs it)"
            + (f"; not holding {', '.join(sorted(opts.skip_checks))} against it" if opts.skip_checks else "")
        )
        out(
            f"# {n.name}: on a failed switch or post-check"
            + (" (or another host's)" if opts.all_or_nothing else "")
            + f": back to {gen}"
        )
        show(switch_generation_argv(n, gen), n)
        show(rollback_argv(n, gen), n)
        show(generations_argv(n), n)
