"""Where model-generated code runs: a throwaway container on a worker, never on the head.

The head serves the API with the checkpoint, the key and the engine's state at hand; code a
model wrote is untrusted input, so it never runs there, nor on the machine running tp4 unless
that machine is not the API's host. Each program runs in a container of its own, started
through the one funnel (:mod:`tp4.core.process`; a remote command quoted once), the program on stdin
(never in a shell string or an argv word):

* ``--network=none``: no interface but loopback; nothing can be reached, not even the host's sshd;
* ``--read-only`` root, and (podman) ``--read-only-tmpfs=false``: the only writable path is the
  container's own ``/tmp``, a size-bounded tmpfs (``nosuid,nodev``) that goes with the container;
  nothing is bind-mounted from the host, so nothing on the host can be written; ``--ipc=none``:
  no /dev/shm either (the IPC namespace stays the container's own);
* ``--cap-drop=all``, ``--security-opt no-new-privileges``, user 65534:65534 (nobody);
* ``--cpus``, ``--memory`` (= ``--memory-swap``: no swap), ``--pids-limit`` (a fork bomb stops
  at it), the runner's RLIMIT_CPU, podman's ``--timeout`` and the funnel's wall-clock timeout;
  on a timeout the container is removed (``rm -f``) by its unique name;
* its output is read up to 1 MiB (:data:`OUTPUT_CAP`; more stops it), so a flood cannot fill
  the memory of the machine running tp4;
* ``--rm``: gone afterwards, also when killed; :meth:`Sandbox.run` checks that and removes what
  is left.

The image is any image with ``python3`` (default: the line's image, which every node holds).
"""

from __future__ import annotations

import ipaddress
import math
import os
import re
import secrets
import selectors
import socket
import threading
import time
from dataclasses import dataclass

from tp4.core import process
from tp4.core.errors import InvalidInput, Tp4Error
from tp4.measuring.qeval.checks import Outcome

PREFIX = "tp4-qeval-"
# seconds allowed beyond the program's limit for starting and removing the container
STARTUP = 60.0
# exit codes of podman/docker itself (the container did not run) and of ssh (no connection)
_RUNTIME_FAILED = (125, 126, 127, 255)
_STARTED = '"started": true'
# what a program may write to the sandbox's stdout (the runner writes a line or two)
OUTPUT_CAP = 1 << 20


@dataclass(frozen=True)
class Limits:
    seconds: float = 10.0
    cpus: float = 1.0
    memory_mib: int = 256
    pids: int = 64
    tmpfs_mib: int = 16


class SandboxError(Tp4Error):
    """The sandbox itself failed (no runtime, no image, no connection): no task's fault."""


@dataclass(frozen=True)
class Sandbox:
    """Containers on ``remote`` (None: this machine) with ``runtime`` (podman or docker)."""

    image: str
    where: str  # the node's name, for messages
    remote: process.Remote | None
    runtime: str = "podman"
    limits: Limits = Limits()

    def __post_init__(self) -> None:
        if self.runtime not in ("podman", "docker"):
            raise InvalidInput(
                f"sandbox runtime: {self.runtime!r} is neither podman nor docker; fix: name the node's container runtime"
            )
        check_image(self.image)

    def argv(self, name: str) -> list[str]:
        lim = self.limits
        argv = [self.runtime, "run", "--rm", "-i", "--name", name, "--network=none", "--read-only"]
        if self.runtime == "podman":
            # podman lays tmpfs over /run, /tmp and /var/tmp of a read-only container by default
            argv += ["--read-only-tmpfs=false", f"--timeout={math.ceil(lim.seconds)}"]
        argv += [
            "--tmpfs",
            f"/tmp:rw,nosuid,nodev,size={lim.tmpfs_mib}m,mode=1777",
            "--cap-drop=all",
            "--security-opt",
            "no-new-privileges",
            "--user",
            "65534:65534",
            "--workdir",
            "/tmp",
            f"--cpus={lim.cpus:g}",
            f"--memory={lim.memory_mib}m",
            f"--memory-swap={lim.memory_mib}m",
            f"--pids-limit={lim.pids}",
            "--ipc=none",
            "--log-driver=none",
            "--entrypoint",
            "python3",
            "--",
            self.image,
            "-I",
            "-B",
            "-",
        ]
        return argv

    def run(self, program: str) -> Outcome:
        """Run ``program`` (Python source, on stdin) in a fresh container; its outcome. A failure
        of the sandbox itself (the runtime, the image, ssh) is a :class:`SandboxError`."""
        name = PREFIX + secrets.token_hex(6)
        started = time.monotonic()
        popen = process.start(
            self.argv(name), remote=self.remote, stdin=process.PIPE, stdout=process.PIPE, stderr=process.PIPE
        )
        try:
            code, out, err, stopped, first = _collect(popen, program.encode(), started + self.limits.seconds + STARTUP)
        finally:
            if popen.poll() is None:
                process.stop(popen)
        seconds = time.monotonic() - started
        self._remove(name)
        text = out.decode(errors="replace")
        if code in _RUNTIME_FAILED and _STARTED not in text:
            raise SandboxError(
                f"sandbox on {self.where}: `{self.runtime} run` of {self.image} failed (exit code {code}) "
                f"before the program started; fix: check that {self.where} is reachable, runs {self.runtime} "
                f"and holds the image (--sandbox-image){_err_tail(err.decode(errors='replace'))}"
            )
        timed_out = stopped == "time"
        # podman's --timeout (conmon kills it; podman run then exits 255): the program ran (from
        # its first output, the runner's "started") up to the limit; a memory kill comes sooner
        ran = time.monotonic() - first if first is not None else 0.0
        if code in (137, 255) and ran >= self.limits.seconds - 0.5:
            timed_out = True
        return Outcome(code, text, timed_out, seconds, stopped == "output")

    def _remove(self, name: str) -> None:
        """The container is gone (--rm), or is removed now; left behind, it is an error."""
        for _ in range(3):
            proc = process.run(
                [self.runtime, "ps", "-a", "-q", "--filter", f"name=^{name}$"],
                remote=self.remote,
                check=False,
                timeout=STARTUP,
                purpose=f"checking that the sandbox container {name} is gone",
            )
            if proc.returncode == 0 and not proc.stdout.strip():
                return
            process.run(
                [self.runtime, "rm", "-f", "-t", "0", name]
                if self.runtime == "podman"
                else [self.runtime, "rm", "-f", name],
                remote=self.remote,
                check=False,
                timeout=STARTUP,
                purpose=f"removing the sandbox container {name}",
            )
            time.sleep(0.5)
        raise SandboxError(
            f"sandbox on {self.where}: the container {name} is still there after `{self.runtime} rm -f`; "
            f"fix: remove it by hand (`{self.runtime} rm -f {name}`) and check the runtime"
        )


def _collect(
    popen: process.Popen[bytes], program: bytes, deadline: float
) -> tuple[int | None, bytes, bytes, str | None, float | None]:
    """Feed the program, read stdout (at most OUTPUT_CAP bytes) and the tail of stderr until the
    command ends; (exit code, stdout, stderr, why it was stopped: "time", "output" or None, when
    the first stdout came)."""
    assert popen.stdin is not None and popen.stdout is not None and popen.stderr is not None
    stdin = popen.stdin

    def feed() -> None:
        try:
            stdin.write(program)
            stdin.close()
        except OSError:  # it ended before reading all of it
            pass

    threading.Thread(target=feed, daemon=True).start()
    out, err = bytearray(), bytearray()
    first: float | None = None
    with selectors.DefaultSelector() as sel:
        sel.register(popen.stdout, selectors.EVENT_READ, out)
        sel.register(popen.stderr, selectors.EVENT_READ, err)
        while sel.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                return None, bytes(out), bytes(err), "time", first
            for key, _ in sel.select(timeout=min(left, 1.0)):
                data = os.read(key.fd, 65536)
                if not data:
                    sel.unregister(key.fileobj)
                    continue
                buf: bytearray = key.data
                buf += data
                if first is None and buf is out:
                    first = time.monotonic()
                if len(out) > OUTPUT_CAP:
                    return None, bytes(out[:OUTPUT_CAP]), bytes(err), "output", first
                del err[:-OUTPUT_CAP]
    try:
        return popen.wait(timeout=max(0.1, deadline - time.monotonic())), bytes(out), bytes(err), None, first
    except process.TimeoutExpired:
        return None, bytes(out), bytes(err), "time", first


def _err_tail(err: str | None) -> str:
    lines = [line for line in (err or "").splitlines() if line.strip()][-3:]
    return ("\n" + "\n".join(f"  | {line}" for line in lines)) if lines else ""


_IMAGE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/:@+-]{0,254}")


def check_image(image: str) -> str:
    if not _IMAGE.fullmatch(image):
        raise InvalidInput(
            f"--sandbox-image {image[:80]!r}: not an image reference; fix: name an image with python3 on the worker, "
            "e.g. the line's image tag"
        )
    return image


_HOST = re.compile(
    r"(?:(?P<user>[A-Za-z_][A-Za-z0-9_.-]{0,31})@)?(?P<host>[A-Za-z0-9][A-Za-z0-9.-]{0,252}|\[[0-9A-Fa-f:.]+\])(?::(?P<port>[0-9]{1,5}))?"
)


def parse_host(text: str) -> process.Remote:
    """``[user@]host[:port]`` (an IPv6 address in brackets) as a Remote."""
    m = _HOST.fullmatch(text)
    port = int(m["port"]) if m and m["port"] else None
    if m is None or (port is not None and not 0 < port < 65536):
        raise InvalidInput(
            f"--sandbox-host {text[:80]!r}: expected [USER@]HOST[:PORT] (a worker's ssh address) or `local`; "
            "fix: name a worker, e.g. root@spark2"
        )
    return process.Remote(host=m["host"].strip("[]"), user=m["user"], port=port)


# seconds a name may take to resolve (getaddrinfo has no timeout of its own)
RESOLVE_TIMEOUT = 5.0

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


def _ip(text: str) -> Address | None:
    """``text`` as an address (an IPv4-mapped IPv6 address as its IPv4 one, a zone dropped)."""
    try:
        ip = ipaddress.ip_address(text.strip("[]").split("%", 1)[0])
    except ValueError:
        return None
    return ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped else ip


def resolve(host: str, timeout: float = RESOLVE_TIMEOUT) -> set[Address]:
    """The addresses ``host`` names, as the system resolves it (``0``, ``127.1`` and ``0x7f000001``
    too); empty when it does not resolve within ``timeout`` seconds."""
    literal = _ip(host)
    if literal is not None:
        return {literal}
    found: set[Address] = set()

    def lookup() -> None:
        try:
            infos = socket.getaddrinfo(host.strip("[]"), None)
        except (OSError, UnicodeError, ValueError):
            return
        found.update(ip for ip in (_ip(str(info[4][0])) for info in infos) if ip is not None)

    worker = threading.Thread(target=lookup, name="tp4-qeval-resolve", daemon=True)
    worker.start()
    worker.join(timeout)
    return set(found) if not worker.is_alive() else set()


def _proc_addresses() -> set[Address]:
    """This machine's interface addresses from the kernel (/proc/net: the IPv4 local routes of
    fib_trie, and if_inet6), without a subprocess; empty where /proc cannot be read."""
    found: set[Address] = set()
    try:
        with open("/proc/net/fib_trie", encoding="ascii", errors="replace") as f:
            last = ""
            for line in f:
                word = line.strip()
                if word.startswith("|-- "):
                    last = word[4:]
                elif word.startswith("/32 host LOCAL") and (ip := _ip(last)) is not None:
                    found.add(ip)
    except OSError:
        pass
    try:
        with open("/proc/net/if_inet6", encoding="ascii", errors="replace") as f:
            for line in f:
                hexa = (line.split() or [""])[0]
                if len(hexa) == 32 and (ip := _ip(":".join(hexa[i : i + 4] for i in range(0, 32, 4)))):
                    found.add(ip)
    except OSError:
        pass
    return found


def local_addresses() -> set[Address]:
    """Addresses of this machine: its interfaces' (/proc/net), its host name's, and the source
    address of a route out (no packet is sent: a UDP connect only picks the interface)."""
    found = _proc_addresses() | resolve(socket.gethostname())
    for family, target in ((socket.AF_INET, "192.0.2.1"), (socket.AF_INET6, "2001:db8::1")):
        try:
            with socket.socket(family, socket.SOCK_DGRAM) as s:
                s.connect((target, 9))
                ip = _ip(str(s.getsockname()[0]))
                if ip is not None:
                    found.add(ip)
        except OSError:
            pass
    return found


def this_machine(ips: set[Address], here: set[Address] | None = None) -> Address | None:
    """One of ``ips`` that reaches this machine: loopback (127.0.0.0/8, ::1), unspecified
    (0.0.0.0, ::) or an address of its own (``here``, default :func:`local_addresses`)."""
    here = local_addresses() if here is None else here
    return next((ip for ip in sorted(ips, key=str) if ip.is_loopback or ip.is_unspecified or ip in here), None)


def refuse_head(where: str, head_names: set[str], how: str) -> None:
    """Refuse (exit 2) a sandbox host over ssh that is the head or this machine: any of
    ``head_names`` (host names and addresses of rank 0 and of the API), compared by name and by
    resolved address; any loopback, unspecified or local address (this machine runs code only
    as ``--sandbox-host local``, which checks that it is not the head); a name that does not
    resolve (it cannot be checked)."""
    ours = resolve(where)
    head = set().union(*(resolve(n) for n in head_names))
    if where in head_names or ours & head:
        raise InvalidInput(
            f"{how}: {where} is the head (it serves the API); model-generated code never runs on the head; "
            "fix: name a worker (rank > 0) with --sandbox-node or --sandbox-host"
        )
    name = socket.gethostname().lower()
    if where.lower().rstrip(".") in {name, name.split(".")[0]}:  # this machine by its own name, resolvable or not
        raise InvalidInput(
            f"{how}: {where} is this machine (its host name); "
            "model-generated code runs here only with --sandbox-host local, and never on the head; "
            "fix: name a worker (rank > 0) with --sandbox-node or --sandbox-host"
        )
    if not ours:
        raise InvalidInput(
            f"{how}: {where} does not resolve here (within {RESOLVE_TIMEOUT:g} s), so it cannot be checked against "
            "the head; fix: name a worker by its address, or by a name this machine resolves"
        )
    mine = this_machine(ours)
    if mine is not None:
        raise InvalidInput(
            f"{how}: {where} is this machine (address {mine}: loopback, unspecified or one of its own); "
            "model-generated code runs here only with --sandbox-host local, and never on the head; "
            "fix: name a worker (rank > 0) with --sandbox-node or --sandbox-host"
        )
