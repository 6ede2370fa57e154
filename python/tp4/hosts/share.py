"""`tp4 share`: the head's checkpoint over NFSv4, read-only, to exactly the plan's workers, and on
each worker the weights volume the plan mounts (upstream `files/nfs-share.sh`).

* Switched fabric only: on a ring every node holds its own copy (``nfs.share`` is off there), and
  with ``nfs.share = false`` there is nothing to do.
* The export is the head's ``model.dir`` itself (no hard-linked tree, no NFSv4 root with
  ``fsid=0``): the worker volume's device is ``:<model.dir>``, a path the head really exports.
  Upstream's re-run took its "reuse" path and pointed workers at ``:/dsv41-native``, which did not
  exist (MiaAI-Lab#24); here the export is checked on the head before any volume names it.
* The export's clients are exactly the plan's workers, each by the address the head sees it
  from: the source address of the worker's route to its server address (``ip route get``), so a
  worker that reaches the head over the fabric is allowed by its fabric address. Upstream's
  ``NFS_CLIENTS`` (``nfs.clients``) also lets a whole /24 in; share does not use it.
* Server address per worker (upstream's `NFS_SERVER_IPS`): ``nfs.server_ips``, one address for
  all workers or one per worker. (Upstream's last fallback, the ``src`` of the head's ``ip route
  get`` toward the worker, is not reachable: the profile always has at least one address.)
* The server: the kernel's (``/etc/exports.d/tp4.exports`` + ``exportfs -ra``, the Sparks), or
  NFS-Ganesha where the head has no kernel server but ``ganesha.nfsd`` (tp4 writes its config
  under the head's workdir, ``nfs-ganesha/``, NFSv4 only, no rpcbind, and runs it detached).
* Idempotent: what exists is compared first (the export file's bytes, the volume's options from
  ``<runtime> volume inspect``); nothing is written or restarted when it matches. A volume with
  other options is replaced only when no container uses it.
* `tp4 stop` never touches the export or the volumes, so `stop → pack → serve` works
  (upstream's stop removed the exporter while workers had it mounted).
* NixOS hosts (kind "nixos"): the export and the volume come from the module; share only checks
  them.
* Then every worker must see ``config.json``: through the volume (a container of the plan's image
  mounting it) where the worker's kernel has an NFS client, else through the user-space client
  ``nfs-cat`` (libnfs) against the same server and path.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tp4.core import pidfile, process
from tp4.core.privatefiles import WRITE_SHARED
from tp4.core.errors import InvalidInput, Tp4Error
from tp4.line.plan import NFS_EXPORT_OPTIONS, NFS_MOUNT_OPTIONS, Plan, VolumeOptions, expand, home_of
from tp4.line.profile.models import Profile
from tp4.hosts.nodes import Node, parallel

Echo = Callable[[str], None]

# the worker volume's mount options (upstream files/nfs-share.sh), after addr=<server>
MOUNT_OPTIONS = ",".join(NFS_MOUNT_OPTIONS)
# the kernel server's export options (upstream's, without fsid=0: the path itself is exported)
EXPORT_OPTIONS = ",".join(NFS_EXPORT_OPTIONS)
KERNEL_EXPORTS = "/etc/exports.d/tp4.exports"
GANESHA_DIR = "nfs-ganesha"  # under the head's workdir
GANESHA_START_WAIT = 10.0  # seconds

# constant scripts; every value is an argument, never part of the script
_SERVER_KIND = (
    "if command -v exportfs >/dev/null 2>&1 && { [ -d /proc/fs/nfsd ] || grep -qw nfsd /proc/filesystems "
    "|| modinfo nfsd >/dev/null 2>&1; }; then echo kernel; "
    "elif command -v ganesha.nfsd >/dev/null 2>&1; then echo ganesha; else echo none; fi"
)
_CLIENT_KIND = (
    "if grep -qw nfs4\\? /proc/filesystems || modinfo nfs >/dev/null 2>&1; then echo kernel; "
    "elif command -v nfs-cat >/dev/null 2>&1; then echo libnfs; else echo none; fi"
)
# mode 0644 through a new file beside it (never a planted "$1.tmp"): tp4.core.privatefiles
_WRITE = "umask 022; " + WRITE_SHARED
_READ = '[ -f "$1" ] && cat -- "$1" || true'
_MODEL = 'if [ ! -d "$1" ]; then echo missing; elif [ ! -f "$1/config.json" ]; then echo no-config; else echo ok; fi'
# ganesha: alive when its pid file ($1, written by ganesha.nfsd itself) names the ganesha.nfsd
# tp4 started (tp4.core.pidfile.SAME_SH): a pid > 1 named ganesha (its comm) whose command line has
# `-p $1`, and whose start time is the one recorded in $1.start when tp4 first saw it running
# (recorded then; removed by a start and a stop). A pid file naming anything else: not running,
# and nothing is signalled.
_GANESHA_ALIVE = (
    pidfile.SAME_SH
    + 'alive() { [ -f "$1" ] && read -r p < "$1" || return 1; s=; [ -f "$1.start" ] && read -r s < "$1.start"; '
    + f'[ -n "$s" ] || s=$(set -- "$p"; {pidfile.START_SH}); '
    + 'same "$p" "$s" -qxF "$1" && grep -q ganesha /proc/"$p"/comm 2>/dev/null || return 1; '
    + '[ -f "$1.start" ] || (umask 077; set -C; echo "$s" > "$1.start") 2>/dev/null; return 0; }; '
)
_GANESHA_PID = _GANESHA_ALIVE + 'if alive "$1"; then echo "$p"; fi'
_GANESHA_STOP = (
    _GANESHA_ALIVE
    + 'if alive "$1"; then kill "$p"; i=0; while alive "$1" && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done; fi; '
    'rm -f -- "$1.start"'
)
_GANESHA_START = (
    'rm -f -- "$2" "$2.start"; exec ganesha.nfsd -f "$1" -p "$2" -L "$3" -N NIV_EVENT </dev/null >/dev/null 2>&1'
)


@dataclass(frozen=True)
class WorkerShare:
    node: Node
    server: str  # the head's address this worker mounts from (the plan's line.nfs.servers)
    client: str  # the worker's address as the head sees it
    volume: VolumeOptions  # the plan's weights volume of this worker (line.nfs.volumes)

    def volume_options(self) -> dict[str, str]:
        return self.volume._asdict()


def kernel_exports_text(export: str, clients: Sequence[str]) -> str:
    """The line of /etc/exports.d/tp4.exports: the path quoted once (exports(5)), one entry per client."""
    entries = " ".join(f"{c}({EXPORT_OPTIONS})" for c in clients)
    return (
        f"# written by tp4 share: the checkpoint, read-only, to the line's workers\n{_exports_path(export)} {entries}\n"
    )


def _exports_path(path: str) -> str:
    return f'"{path}"' if any(c.isspace() for c in path) else path


def ganesha_config(export: str, clients: Sequence[str], state_dir: str) -> str:
    """tp4's whole Ganesha configuration: NFSv4 only (no rpcbind, NLM, RQUOTA or UDP), one export of
    the checkpoint, read-only to the listed clients and to nobody else."""
    q = json.dumps  # a Ganesha string: double quotes, backslash escapes
    return (
        "# written by tp4 share: the checkpoint, read-only, to the line's workers\n"
        "NFS_CORE_PARAM { Protocols = 4; Enable_NLM = false; Enable_RQUOTA = false; Enable_UDP = false; NFS_Port = 2049; }\n"
        f"NFSV4 {{ Graceless = true; RecoveryBackend = fs; RecoveryRoot = {q(state_dir + '/recovery')}; }}\n"
        "EXPORT_DEFAULTS { Access_Type = None; }\n"
        "EXPORT {\n"
        "  Export_Id = 1;\n"
        f"  Path = {q(export)};\n"
        f"  Pseudo = {q(export)};\n"
        "  Access_Type = None;\n"
        "  Squash = No_Root_Squash;\n"
        "  Protocols = 4;\n"
        "  Transports = TCP;\n"
        "  SecType = sys;\n"
        "  FSAL { Name = VFS; }\n"
        f"  CLIENT {{ Clients = {', '.join(clients)}; Access_Type = RO; }}\n"
        "}\n"
    )


def _check_export_path(path: str) -> None:
    if any(c in path for c in '"\\') or any(c.isspace() and c != " " for c in path):
        raise InvalidInput(
            f"model.dir: {path!r} holds a quote, a backslash or a tab, which an NFS export line cannot carry; "
            "fix: move the checkpoint to a path without them"
        )


def _src_of_route(node: Node, target: str) -> str:
    proc = node.run(
        ["ip", "-o", "route", "get", target], check=False, purpose=f"the route from {node.name} to {target}"
    )
    words = proc.stdout.split()
    if proc.returncode != 0 or "src" not in words or words.index("src") + 1 >= len(words):
        raise Tp4Error(
            f"{node.name}: no route to {target} ({proc.stderr.strip() or proc.stdout.strip()}); "
            "fix: check the node's addresses, or set nfs.server_ips"
        )
    return words[words.index("src") + 1]


def _results(results: dict[str, object | BaseException]) -> None:
    errors = [v for v in results.values() if isinstance(v, BaseException)]
    if len(errors) == 1:
        raise errors[0]
    if errors:
        raise Tp4Error("\n".join(str(e) for e in errors), exit_code=max(getattr(e, "exit_code", 1) for e in errors))


def share(profile: Profile, plan: Plan, nodes: Sequence[Node], out: Echo) -> None:
    if plan.line.fabric == "ring":
        out("share: ring fabric: every node holds its own copy of the checkpoint; nothing to share")
        return
    if not profile.nfs.share:
        out("share: nfs.share = false: the workers use their own weights volume; nothing to share")
        return
    head, workers = nodes[0], list(nodes[1:])
    if not workers:
        out("share: the line has no workers; nothing to share")
        return
    export = plan.nodes[0].run.mounts[0].source
    _check_export_path(export)
    state = head.run(["sh", "-c", _MODEL, "sh", export], purpose=f"checking {export} on {head.name}").stdout.strip()
    if state == "missing":
        raise Tp4Error(
            f"model.dir: {export} does not exist on {head.name}; fix: tp4 download, or set model.dir to the checkpoint"
        )
    if state != "ok":
        raise Tp4Error(
            f"model.dir: {export} on {head.name} has no config.json; fix: tp4 download (the checkpoint is incomplete)"
        )
    nfs = plan.line.nfs
    if nfs is None:
        raise InvalidInput(
            "nfs.share: the plan has no NFS share for this line; fix: tp4 plan shows why (a ring, or one node)"
        )
    addrs = nfs.servers
    clients: dict[str, object | BaseException] = parallel(workers, lambda w: _src_of_route(w, addrs[workers.index(w)]))
    _results(clients)
    shares = [WorkerShare(w, addrs[i], str(clients[w.name]), nfs.volumes[i]) for i, w in enumerate(workers)]
    client_addrs = sorted(set(s.client for s in shares))

    kind = head.run(["sh", "-c", _SERVER_KIND], purpose=f"the NFS server of {head.name}").stdout.strip()
    if head.rank.service.kind == "nixos":
        _check_nixos_export(head, export, client_addrs, kind)
        out(f"{head.name}: export {export} to {', '.join(client_addrs)} (NixOS module): present")
    elif kind == "kernel":
        out(
            f"{head.name}: export {export} to {', '.join(client_addrs)} (kernel server): {_kernel_export(head, export, client_addrs)}"
        )
    elif kind == "ganesha":
        workdir = plan.nodes[0].run.workdir
        out(
            f"{head.name}: export {export} to {', '.join(client_addrs)} (NFS-Ganesha): "
            f"{_ganesha_export(head, export, client_addrs, f'{workdir}/{GANESHA_DIR}')}"
        )
    else:
        raise Tp4Error(
            f"{head.name}: no NFS server (neither exportfs with the kernel's nfsd nor ganesha.nfsd); "
            "fix: install nfs-kernel-server on the head"
        )

    volume = profile.nfs.volume
    image = plan.image.tag

    def worker(s: WorkerShare) -> str:
        changed = (
            _check_nixos_volume(s, volume, export)
            if s.node.rank.service.kind == "nixos"
            else _volume(s, volume, export)
        )
        how = _sees(s, volume, export, image)
        return (
            f"{s.node.name}: volume {volume} (addr={s.server}, device=:{export}): {changed}; config.json visible {how}"
        )

    done = parallel([s.node for s in shares], lambda n: worker(next(s for s in shares if s.node is n)))
    _results(done)
    for s in shares:
        out(str(done[s.node.name]))


# --- the head's export ----------------------------------------------------------------------------


def _read(node: Node, path: str) -> str:
    return node.run(node.privileged(["sh", "-c", _READ, "sh", path]), purpose=f"reading {path} on {node.name}").stdout


def _write(node: Node, path: str, text: str) -> None:
    node.run(
        node.privileged(["sh", "-c", _WRITE, "sh", path, "644"]), input=text, purpose=f"writing {path} on {node.name}"
    )


def _exported(node: Node) -> str:
    proc = node.run(node.privileged(["exportfs", "-v"]), check=False, purpose=f"the exports of {node.name}")
    return proc.stdout if proc.returncode == 0 else ""


def _exportfs_has(listing: str, export: str, clients: Sequence[str]) -> list[str]:
    """The clients ``exportfs -v`` does not list for ``export`` (it writes a space as \\040)."""
    path = export.replace(" ", "\\040")
    found: set[str] = set()
    words = listing.split()
    for i, word in enumerate(words):
        if word == path and i + 1 < len(words):
            found.add(words[i + 1].split("(", 1)[0])
    return [c for c in clients if c not in found]


def _kernel_export(head: Node, export: str, clients: Sequence[str]) -> str:
    text = kernel_exports_text(export, clients)
    changed = _read(head, KERNEL_EXPORTS) != text
    if changed:
        _write(head, KERNEL_EXPORTS, text)
        head.run(head.privileged(["exportfs", "-ra"]), purpose=f"exporting {export} on {head.name}")
    missing = _exportfs_has(_exported(head), export, clients)
    if missing:
        raise Tp4Error(
            f"{head.name}: the kernel server does not export {export} to {', '.join(missing)} after exportfs -ra; "
            f"fix: check {KERNEL_EXPORTS} and the other exports on the head (exportfs -v)"
        )
    return "written" if changed else "unchanged"


def ganesha_pid(head: Node, state_dir: str) -> str | None:
    pid = head.run(
        head.privileged(["sh", "-c", _GANESHA_PID, "sh", f"{state_dir}/ganesha.pid"]),
        purpose=f"the NFS-Ganesha of {head.name}",
    ).stdout.strip()
    return pid or None


def stop_ganesha(head: Node, state_dir: str) -> None:
    """Stop the NFS-Ganesha share started (its pid file's process only)."""
    head.run(
        head.privileged(["sh", "-c", _GANESHA_STOP, "sh", f"{state_dir}/ganesha.pid"]),
        purpose=f"stopping NFS-Ganesha on {head.name}",
    )


def _ganesha_export(head: Node, export: str, clients: Sequence[str], state_dir: str) -> str:
    import time

    conf = f"{state_dir}/ganesha.conf"
    text = ganesha_config(export, clients, state_dir)
    changed = _read(head, conf) != text
    running = ganesha_pid(head, state_dir)
    if not changed and running:
        return "unchanged"
    if changed:
        _write(head, conf, text)
        head.run(head.privileged(["mkdir", "-p", "--", f"{state_dir}/recovery"]))
    if running:
        stop_ganesha(head, state_dir)
    head.run(
        head.privileged(
            ["sh", "-c", _GANESHA_START, "sh", conf, f"{state_dir}/ganesha.pid", f"{state_dir}/ganesha.log"]
        ),
        purpose=f"starting NFS-Ganesha on {head.name}",
    )
    deadline = time.monotonic() + GANESHA_START_WAIT
    while not ganesha_pid(head, state_dir):
        if time.monotonic() > deadline:
            log = head.run(head.privileged(["tail", "-n", "20", "--", f"{state_dir}/ganesha.log"]), check=False).stdout
            raise Tp4Error(
                f"{head.name}: NFS-Ganesha did not start within {GANESHA_START_WAIT:.0f} s; its log:\n{log}"
                f"fix: see {state_dir}/ganesha.log on the head"
            )
        time.sleep(0.2)
    return ("written, " if changed else "") + ("restarted" if running else "started")


def _check_nixos_export(head: Node, export: str, clients: Sequence[str], kind: str) -> None:
    missing = _exportfs_has(_exported(head), export, clients) if kind == "kernel" else list(clients)
    if missing:
        raise Tp4Error(
            f"{head.name}: the NixOS host does not export {export} to {', '.join(missing)}; "
            f"fix: set the module's NFS export (services.nfs.server.exports) to {export} for exactly those "
            "workers and switch the host"
        )


# --- a worker's volume ------------------------------------------------------------------------------


def _inspect(node: Node, volume: str) -> tuple[str, dict[str, str]] | None:
    proc = node.run(
        [node.runtime, "volume", "inspect", "--format", "{{.Driver}} {{json .Options}}", "--", volume],
        check=False,
        purpose=f"the volume {volume} on {node.name}",
    )
    if proc.returncode != 0:
        return None
    driver, _, options = proc.stdout.strip().partition(" ")
    try:
        parsed = json.loads(options or "null") or {}
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict):
        raise Tp4Error(
            f"{node.name}: {node.runtime} volume inspect {volume} gave {proc.stdout.strip()[:200]!r}, not a driver and "
            f"its options; fix: check the volume by hand ({node.runtime} volume inspect {volume})"
        )
    return driver, {str(k): str(v) for k, v in parsed.items()}


def volume_options(node: Node, volume: str) -> dict[str, str] | None:
    found = _inspect(node, volume)
    return None if found is None else found[1]


def _users(node: Node, volume: str) -> list[str]:
    proc = node.run(
        [node.runtime, "ps", "-a", "--filter", f"volume={volume}", "--format", "{{.Names}}"],
        purpose=f"the containers using {volume} on {node.name}",
    )
    return [line for line in proc.stdout.split() if line]


def _create_argv(node: Node, volume: str, options: dict[str, str]) -> list[str]:
    argv = [node.runtime, "volume", "create", "--driver", "local"]
    for key in ("type", "o", "device"):
        argv += ["--opt", f"{key}={options[key]}"]
    return [*argv, "--", volume]


def _volume(s: WorkerShare, volume: str, export: str) -> str:
    node, want = s.node, s.volume_options()
    found = _inspect(node, volume)
    if found == ("local", want):
        return "unchanged"
    if found is not None:
        users = _users(node, volume)
        if users:
            raise Tp4Error(
                f"{node.name}: the volume {volume} has other options ({json.dumps(found[1], sort_keys=True)}) and "
                f"{', '.join(users)} use it; fix: tp4 stop (or remove those containers), then tp4 share again"
            )
        node.run([node.runtime, "volume", "rm", "--", volume], purpose=f"removing the old {volume} on {node.name}")
    node.run(_create_argv(node, volume, want), purpose=f"creating {volume} on {node.name}")
    return "replaced" if found is not None else "created"


def _check_nixos_volume(s: WorkerShare, volume: str, export: str) -> str:
    found = _inspect(s.node, volume)
    want = s.volume_options()
    if found != ("local", want):
        raise Tp4Error(
            f"{s.node.name}: the NixOS host's volume {volume} is {'missing' if found is None else json.dumps(found[1], sort_keys=True)}, "
            f"not {json.dumps(want, sort_keys=True)}; fix: set the module's weights volume to that and switch the host"
        )
    return "present (NixOS module)"


def nfs_url(server: str, export: str, name: str = "config.json") -> str:
    """libnfs's URL of a file of the export (it takes the path as written, spaces included)."""
    return f"nfs://{server}{export.rstrip('/')}/{name}?version=4"


def _volume_test_argv(node: Node, volume: str, image: str) -> list[str]:
    """A container of the plan's image that mounts the volume and finds config.json in it."""
    mount = f"{volume}:/tp4-weights:ro"
    test = ["-f", "/tp4-weights/config.json"]
    return [
        node.runtime,
        "run",
        "--rm",
        "--pull=never",
        "--network",
        "none",
        "--entrypoint",
        "test",
        "-v",
        mount,
        image,
        *test,
    ]


def _sees(s: WorkerShare, volume: str, export: str, image: str) -> str:
    node = s.node
    kind = node.run(["sh", "-c", _CLIENT_KIND], purpose=f"the NFS client of {node.name}").stdout.strip()
    if kind == "kernel":
        argv = _volume_test_argv(node, volume, image)
        how = f"through the volume ({shlex.join(argv[:2])} of {image})"
    elif kind == "libnfs":
        argv = ["nfs-cat", nfs_url(s.server, export)]
        how = "through the user-space client (nfs-cat; no kernel NFS client on the node)"
    else:
        raise Tp4Error(
            f"{node.name}: no NFS client (no nfs in the kernel, no nfs-cat); fix: install nfs-common on the worker"
        )
    proc = node.run(argv, check=False, timeout=120, purpose=f"reading config.json on {node.name}")
    if proc.returncode != 0:
        raise Tp4Error(
            f"{node.name}: cannot read {export}/config.json from {s.server} {how.split(' (')[0]}: "
            f"{(proc.stderr.strip() or proc.stdout.strip())[-300:]}; fix: check that {s.server} is the head's "
            f"address toward {node.name} (nfs.server_ips) and that port 2049 is open"
        )
    return how


def ganesha_dir(plan: Plan) -> str:
    return f"{plan.nodes[0].run.workdir}/{GANESHA_DIR}"


def model_dir(profile: Profile) -> str:
    head = profile.cluster.head
    return expand(profile.model.dir, home_of(head, profile.cluster))


# --- dry run --------------------------------------------------------------------------------------


def rehearse(profile: Profile, plan: Plan, nodes: Sequence[Node]) -> list[str]:
    """`tp4 share --dry-run`: the commands share runs, host by host, in order, from the plan alone
    (no node asked). What runs next depends on what the hosts answer (the head's NFS server, each
    worker's address toward the head, the volume already there): each such step is said so."""

    def on(node: Node, argv: Sequence[str], note: str = "") -> str:
        return f"{node.name}: {shlex.join(process.full_argv(argv, node.remote))}{note}"

    if plan.line.fabric == "ring":
        return ["share: ring fabric: every node holds its own copy of the checkpoint; nothing to share"]
    if not profile.nfs.share:
        return ["share: nfs.share = false: the workers use their own weights volume; nothing to share"]
    head, workers = nodes[0], list(nodes[1:])
    nfs = plan.line.nfs
    if not workers or nfs is None:
        return ["share: the line has no workers; nothing to share"]
    export = plan.nodes[0].run.mounts[0].source
    _check_export_path(export)
    clients = [f"<{w.name}'s address toward {nfs.servers[i]}>" for i, w in enumerate(workers)]
    state = ganesha_dir(plan)
    conf = f"{state}/ganesha.conf"
    lines = [on(head, ["sh", "-c", _MODEL, "sh", export], "  (stops unless the checkpoint has config.json)")]
    lines += [
        on(w, ["ip", "-o", "route", "get", nfs.servers[i]], "  (its src: the export's client)")
        for i, w in enumerate(workers)
    ]
    lines.append(on(head, ["sh", "-c", _SERVER_KIND], "  (the head's NFS server; the next commands depend on it)"))
    if head.rank.service.kind == "nixos":
        lines.append(on(head, head.privileged(["exportfs", "-v"]), "  (NixOS: the module's export is only checked)"))
    else:
        lines += [
            "# when the head's server is the kernel's (and the file differs from what share writes):",
            on(head, head.privileged(["sh", "-c", _READ, "sh", KERNEL_EXPORTS])),
            on(
                head,
                head.privileged(["sh", "-c", _WRITE, "sh", KERNEL_EXPORTS, "644"]),
                "  < the export line on stdin:",
            )
            + "\n    "
            + kernel_exports_text(export, clients).rstrip("\n").replace("\n", "\n    "),
            on(head, head.privileged(["exportfs", "-ra"])),
            on(head, head.privileged(["exportfs", "-v"])),
            "# when it is NFS-Ganesha (the config written when it differs, the server (re)started when it changed):",
            on(head, head.privileged(["sh", "-c", _READ, "sh", conf])),
            on(head, head.privileged(["sh", "-c", _WRITE, "sh", conf, "644"]), "  < tp4's Ganesha config on stdin"),
            on(head, head.privileged(["mkdir", "-p", "--", f"{state}/recovery"])),
            on(
                head,
                head.privileged(
                    ["sh", "-c", _GANESHA_START, "sh", conf, f"{state}/ganesha.pid", f"{state}/ganesha.log"]
                ),
            ),
        ]
    volume, image = profile.nfs.volume, plan.image.tag
    for i, w in enumerate(workers):
        s = WorkerShare(w, nfs.servers[i], clients[i], nfs.volumes[i])
        lines.append(on(w, [w.runtime, "volume", "inspect", "--format", "{{.Driver}} {{json .Options}}", "--", volume]))
        if w.rank.service.kind != "nixos":
            lines.append(
                on(
                    w,
                    _create_argv(w, volume, s.volume_options()),
                    "  (unless the volume has these options; one with "
                    "others is removed first when no container uses it)",
                )
            )
        lines.append(on(w, ["sh", "-c", _CLIENT_KIND], "  (the worker's NFS client; the check below depends on it)"))
        lines.append(
            on(
                w,
                _volume_test_argv(w, volume, image),
                "  (a kernel NFS client)",
            )
        )
        lines.append(on(w, ["nfs-cat", nfs_url(s.server, export)], "  (else, the user-space client)"))
    return lines
