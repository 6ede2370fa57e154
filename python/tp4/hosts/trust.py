"""`tp4 hosts trust`: fetch each node's host keys, compare them with tp4's known_hosts, record them.

A node's keys are fetched with ``ssh-keyscan`` from where ssh really connects (its HostName and
port after the user's ssh configuration, :func:`tp4.core.process.endpoint`) and compared with what
:mod:`tp4.core.knownhosts` holds for the name ssh looks them up by: none recorded (new), one of them
recorded (already trusted), or a recorded key type now offered with another key (changed: never
recorded without ``replace``). What ssh-keyscan fetches is not authenticated: that is why the
fingerprints are shown before anything is recorded.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Literal

from tp4.core import knownhosts, process
from tp4.core.errors import HostKeyError, InvalidInput, Tp4Error

SCAN_TIMEOUT = 10  # seconds ssh-keyscan waits for a host


@dataclass(frozen=True)
class Key:
    keytype: str
    key: str  # base64

    @property
    def fingerprint(self) -> str:
        return knownhosts.fingerprint(self.key)

    def shown(self) -> str:
        return f"{knownhosts.kind(self.keytype)} {self.fingerprint}"


Status = Literal["new", "trusted", "changed"]


@dataclass(frozen=True)
class Verdict:
    """One node: the keys it offers against those recorded for its name."""

    remote: process.Remote
    name: str
    offered: tuple[Key, ...]
    recorded: tuple[Key, ...]
    status: Status


def scan(remote: process.Remote) -> tuple[str, tuple[Key, ...]]:
    """The name the node's key is looked up by and the keys ssh-keyscan fetched from it."""
    where = process.endpoint(remote)
    if knownhosts.host_problem(where.hostname) or any(c.isspace() or c in "#,|" for c in where.key_name):
        raise InvalidInput(
            f"{remote.host}: ssh's configuration makes it HostName {where.hostname[:80]!r}, its key "
            f"recorded as {where.key_name[:80]!r}, which is not a host name; fix: correct the Host block "
            "of ~/.ssh/config for it"
        )
    proc = process.run(
        ["ssh-keyscan", "-T", str(SCAN_TIMEOUT), "-p", str(where.port), "--", where.hostname],
        check=False,
        timeout=SCAN_TIMEOUT * 3,
        purpose=f"fetching the host keys of {where.key_name}",
    )
    keys = []
    for line in proc.stdout.splitlines():
        fields = line.split()
        if len(fields) >= 3 and not fields[0].startswith("#"):
            try:
                knownhosts.fingerprint(fields[2])
            except ValueError:
                continue
            keys.append(Key(fields[1], fields[2]))
    if not keys:
        said = "; ".join(line for line in proc.stderr.strip().splitlines() if not line.startswith("#"))
        raise Tp4Error(
            f"{where.key_name}: ssh-keyscan fetched no host key{' (' + said + ')' if said else ''}; "
            f"fix: check that the node is up and its sshd listens on port {where.port}"
        )
    return where.key_name, tuple(dict.fromkeys(keys))


def judge(offered: Sequence[Key], recorded: Sequence[Key]) -> Status:
    """new: nothing recorded; trusted: a key of a type recorded is the recorded one, and no type
    recorded is offered with another key; changed otherwise (ssh would refuse to connect)."""
    if not recorded:
        return "new"
    mine = {(k.keytype, k.key) for k in recorded}
    types = {k.keytype for k in recorded}
    same = [k for k in offered if (k.keytype, k.key) in mine]
    other = [
        k
        for k in offered
        if k.keytype in types and (k.keytype, k.key) not in mine and not any(s.keytype == k.keytype for s in same)
    ]
    return "trusted" if same and not other else "changed"


def _scan_each(remote: process.Remote) -> tuple[str, tuple[Key, ...]] | Tp4Error:
    try:
        return scan(remote)
    except Tp4Error as exc:
        return exc


def examine(remotes: Sequence[process.Remote], progress: Callable[[str], None] | None = None) -> list[Verdict]:
    """Every node's verdict, the nodes scanned in parallel; one node per known_hosts name. Each
    node is told to ``progress`` as its scan ends (done/total, its name, keys or failure). When
    nodes cannot be scanned, one error names every one of them (invalid input first: exit 2)."""
    unique = list({process.key_name(r): r for r in reversed(remotes)}.values())[::-1]
    results: list[tuple[str, tuple[Key, ...]] | Tp4Error | None] = [None] * len(unique)
    with ThreadPoolExecutor(max_workers=max(1, len(unique))) as pool:
        futures = {pool.submit(_scan_each, remote): i for i, remote in enumerate(unique)}
        for done, future in enumerate(as_completed(futures), 1):
            i = futures[future]
            results[i] = result = future.result()
            if progress is not None:
                said = (
                    "failed (named in the error at the end)"
                    if isinstance(result, Tp4Error)
                    else f"{len(result[1])} key{'s' if len(result[1]) != 1 else ''} fetched"
                )
                progress(f"[{done}/{len(unique)}] {unique[i].host}: {said}")
    errors = [r for r in results if isinstance(r, Tp4Error)]
    if len(errors) == 1:
        raise errors[0]
    if errors:
        code = max(e.exit_code for e in errors)
        raise Tp4Error(
            f"{len(errors)} of {len(unique)} nodes gave no host key:\n" + "\n".join(f"  - {e}" for e in errors),
            exit_code=code,
        )
    scanned = [r for r in results if r is not None and not isinstance(r, Tp4Error)]
    entries = knownhosts.read()
    verdicts = []
    for remote, (name, offered) in zip(unique, scanned, strict=True):
        recorded = tuple(Key(e.keytype, e.key) for e in knownhosts.keys_for(name, entries))
        verdicts.append(Verdict(remote, name, offered, recorded, judge(offered, recorded)))
    return verdicts


def refuse_changed(verdicts: Sequence[Verdict]) -> None:
    """A HostKeyError naming every node whose key changed, with both fingerprints."""
    changed = [v for v in verdicts if v.status == "changed"]
    if not changed:
        return
    lines = [
        f"the host key of {v.name} changed: recorded {', '.join(k.shown() for k in v.recorded)}; "
        f"now offered {', '.join(k.shown() for k in v.offered)}"
        for v in changed
    ]
    fix = " ".join(process.trust_command(v.remote, replace=True) for v in changed[:1])
    raise HostKeyError(
        "; ".join(lines) + f"; nothing was written to {knownhosts.path()}; if the change is expected "
        f"(the host was reinstalled), run `{fix}`"
        + (" for each of them" if len(changed) > 1 else "")
        + "; if not, someone may be intercepting the connection",
        host=changed[0].name,
        changed=True,
    )


def record(verdicts: Sequence[Verdict]) -> int:
    """Write the keys of the new and changed nodes (a changed node's old lines go); returns how
    many nodes were recorded."""
    todo = [v for v in verdicts if v.status in ("new", "changed")]
    if todo:
        knownhosts.update(
            [v.name for v in todo if v.status == "changed"],
            [(v.name, k.keytype, k.key) for v in todo for k in v.offered],
        )
    return len(todo)


def forget(remote: process.Remote) -> tuple[str, int]:
    """Remove the lines naming the remote's key name; the name and how many lines went."""
    name = process.key_name(remote)
    return name, knownhosts.update([name], [])
