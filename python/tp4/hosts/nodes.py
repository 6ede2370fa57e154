"""The hosts of a line as tp4 reaches them: one :class:`Node` per rank of a Plan, and
:func:`parallel` to run a step on all of them at once.

Below doctor, serve, deploy, pack, share, fleet and needle (all of which act on hosts): it imports
only the Plan's types and :mod:`tp4.core.process`, never a module that acts on hosts."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass

from tp4.core import process
from tp4.line.plan import Plan, RankPlan


@dataclass(frozen=True)
class Node:
    """One rank's host, as tp4 reaches it."""

    rank: RankPlan
    remote: process.Remote | None  # None: this machine (tests and a single-host head)

    @property
    def name(self) -> str:
        return self.rank.name

    @property
    def runtime(self) -> str:
        return self.rank.service.runtime

    @property
    def container(self) -> str:
        return self.rank.run.container

    def run(
        self,
        argv: Sequence[str],
        *,
        check: bool = True,
        timeout: float | None = 60,
        purpose: str | None = None,
        input: str | None = None,
    ) -> process.CompletedProcess[str]:
        proc = process.run(
            list(argv),
            remote=self.remote,
            check=check,
            timeout=timeout,
            purpose=purpose or f"on {self.name}",
            input=input,
        )
        assert isinstance(proc.stdout, str)
        return proc

    def privileged(self, argv: Sequence[str]) -> list[str]:
        """``argv`` as root: NixOS units and /run/tp4 need it (sudo -n: never a password prompt)."""
        user = self.rank.ssh.user if self.remote is not None else None
        return list(argv) if user in (None, "root") else ["sudo", "-n", *argv]


def nodes_of(plan: Plan, *, ssh_options: Sequence[str] = (), local_head: bool = False) -> list[Node]:
    out = []
    for rank in plan.nodes:
        remote = (
            None
            if (local_head and rank.rank == 0)
            else process.Remote(
                host=rank.ssh.host,
                user=rank.ssh.user,
                identity=rank.ssh.identity,
                port=rank.ssh.port,
                options=tuple(ssh_options),
            )
        )
        out.append(Node(rank, remote))
    return out


# True: `parallel` runs fn on one node after another (bench/bench_serve.py's comparison)
SEQUENTIAL = False


def parallel(nodes: Sequence[Node], fn: Callable[[Node], object]) -> dict[str, object | BaseException]:
    """``fn`` on every node at once (one after another when SEQUENTIAL); node name -> result or
    the exception it raised."""
    results: dict[str, object | BaseException] = {}
    if not nodes:
        return results
    if SEQUENTIAL:
        for n in nodes:
            try:
                results[n.name] = fn(n)
            except Exception as exc:  # noqa: BLE001 - Ctrl-C goes on, as it does from the pool's wait below
                results[n.name] = exc
        return results
    with ThreadPoolExecutor(max_workers=len(nodes)) as pool:
        futures = {n.name: pool.submit(fn, n) for n in nodes}
        # Ctrl-C while waiting is the caller's (the SIGINT handler raises it here, in the main
        # thread), never a node's result: caught per future, it became the first node's failure
        # with an empty message. The pool's exit then waits for its threads, whose commands the
        # handler stopped.
        wait(futures.values())
        for name, future in futures.items():
            raised = future.exception()
            results[name] = raised if raised is not None else future.result()  # a node's: reported by the caller
    return results
