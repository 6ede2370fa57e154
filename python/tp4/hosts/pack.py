"""`tp4 pack`: the packed Engram row shards of every rank, made by the image's own packer on every
node at once (upstream `start.sh pack` goes node by node, 4-10 min each).

On each node, as upstream runs it (the mounts are the rank's run spec: the head binds model.dir,
a worker uses its weights volume; the output is the rank's engram dir)::

    <runtime> run --rm --network host -v <model>:/models/DeepSeek-V4.1-Flash:ro -v <engram dir>:/engram
        -e DSV41_SOURCE=/models/DeepSeek-V4.1-Flash --entrypoint python3 <image>
        /opt/dsv41/scripts/pack_engram.py --rank <r> --tp <tp> --out /engram

The packer writes ``engram-l<layer>-r<rank>of<tp>.bin`` for the Engram layers 1 and 14 (a
``.partial`` first, renamed when complete). A shard starts with six little-endian u64: magic,
layer, row_lo, row_hi, rows, row_bytes, then rows * row_bytes bytes; the table's rows are split
between the ranks as total * rank // tp. A node whose two shards are complete is skipped; a shard
that is not (short, another layer or slice) is removed first, so the packer makes it again. After
the packers, every shard of every node is read again and checked, the slices of the ranks
together too (they tile the table, one magic)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NamedTuple

from tp4.core.errors import Tp4Error

if TYPE_CHECKING:
    from tp4.line.plan import Plan, RankPlan
    from tp4.hosts.nodes import Node

Echo = Callable[[str], None]

PACKER = "/opt/dsv41/scripts/pack_engram.py"
LAYERS = (1, 14)
HEADER_BYTES = 48  # six little-endian u64
TAIL = 12  # lines of a failed packer's output shown

# one line per shard: "<name> <size> <six header words>" (fewer words: a short file), or "<name> absent"
_READ = r"""set -f
dir=$1; shift
for f; do
  if [ -f "$dir/$f" ]; then
    echo "$f $(stat -c %s -- "$dir/$f") $(od -An -tu8 --endian=little -N48 -- "$dir/$f" | tr -s ' \n' '  ')"
  else
    echo "$f absent"
  fi
done
"""


class Shard(NamedTuple):
    """One packed shard as a node holds it: size None when absent, the header words read (all six
    when the file has them)."""

    name: str
    layer: int
    size: int | None
    header: tuple[int, ...]

    @property
    def magic(self) -> int:
        return self.header[0]

    @property
    def row_lo(self) -> int:
        return self.header[2]

    @property
    def row_hi(self) -> int:
        return self.header[3]


def shard_names(plan: Plan, rank: RankPlan) -> tuple[str, ...]:
    """The two shards of the rank (the names tp4.hosts.doctor checks)."""
    from tp4.hosts.doctor import engram_files

    return engram_files(plan, rank)


def _mount(rank: RankPlan, target: str) -> str:
    for m in rank.run.mounts:
        if m.target == target:
            return m.source
    raise Tp4Error(
        f"{rank.name}: the run spec has no mount at {target}; fix: check the profile (tp4 plan shows the mounts)"
    )


def engram_dir(rank: RankPlan) -> str:
    from tp4.line.plan import ENGRAM_MOUNT

    return _mount(rank, ENGRAM_MOUNT)


def packer_argv(plan: Plan, rank: RankPlan) -> list[str]:
    """The packer's run on the rank's node, as upstream's `start.sh pack` runs it."""
    from tp4.line.plan import ENGRAM_MOUNT, MODEL_MOUNT

    return [
        rank.service.runtime,
        "run",
        "--rm",
        "--network",
        "host",
        "-v",
        f"{_mount(rank, MODEL_MOUNT)}:{MODEL_MOUNT}:ro",
        "-v",
        f"{engram_dir(rank)}:{ENGRAM_MOUNT}",
        "-e",
        f"DSV41_SOURCE={MODEL_MOUNT}",
        "--entrypoint",
        "python3",
        rank.run.image,
        PACKER,
        "--rank",
        str(rank.rank),
        "--tp",
        str(plan.line.tp),
        "--out",
        ENGRAM_MOUNT,
    ]


def parse_shards(text: str, names: Sequence[str]) -> list[Shard]:
    """_READ's output -> the shards, in the order of names (one missing from the output: absent)."""
    seen: dict[str, tuple[int | None, tuple[int, ...]]] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 2 or parts[0] not in names:
            continue
        if parts[1] == "absent" or not parts[1].isdigit():
            seen[parts[0]] = (None, ())
        else:
            seen[parts[0]] = (int(parts[1]), tuple(int(x) for x in parts[2:8] if x.isdigit()))
    out = []
    for name, layer in zip(names, LAYERS, strict=True):
        size, header = seen.get(name, (None, ()))
        out.append(Shard(name, layer, size, header))
    return out


def read_shards(plan: Plan, node: Node) -> list[Shard]:
    names = shard_names(plan, node.rank)
    proc = node.run(
        ["sh", "-c", _READ, "tp4-pack", engram_dir(node.rank), *names],
        purpose=f"reading the Engram shards of {node.name}",
    )
    return parse_shards(proc.stdout, names)


def shard_problem(plan: Plan, rank: RankPlan, s: Shard) -> str | None:
    """Why the shard is not complete for the rank, None when it is (the header's own checks)."""
    if s.size is None:
        return f"{s.name} missing"
    if len(s.header) < 6:
        return f"{s.name} has no header ({s.size} bytes)"
    magic, layer, row_lo, row_hi, rows, row_bytes = s.header
    if magic == 0:
        return f"{s.name}: no magic in its header"
    if layer != s.layer:
        return f"{s.name}: its header says layer {layer}, not {s.layer}"
    if row_hi < row_lo or row_hi - row_lo != rows or rows == 0 or row_bytes == 0:
        return f"{s.name}: its header's slice [{row_lo}, {row_hi}) does not hold its {rows} rows of {row_bytes} bytes"
    if rank.rank == 0 and row_lo != 0:
        return f"{s.name}: rank 0's slice starts at row {row_lo}, not 0"
    need = HEADER_BYTES + rows * row_bytes
    if s.size != need:
        return f"{s.name} is {'incomplete' if s.size < need else 'too long'} ({s.size} of {need} bytes)"
    return None


def line_problems(plan: Plan, shards: dict[str, list[Shard]]) -> dict[str, list[str]]:
    """What the ranks' complete shards say together: one magic, and per layer the slices
    [total * rank // tp, total * (rank + 1) // tp) of one table of total rows. Node -> problems."""
    tp = plan.line.tp
    out: dict[str, list[str]] = {}
    ranks = {r.name: r for r in plan.nodes}
    magics = {s.magic for ss in shards.values() for s in ss if len(s.header) == 6}
    if len(magics) > 1:
        first = next(iter(shards.values()))[0].magic if shards else 0
        for name, ss in shards.items():
            for s in ss:
                if len(s.header) == 6 and s.magic != first:
                    out.setdefault(name, []).append(
                        f"{s.name}: magic {s.magic:#x}, another node's shards have {first:#x}"
                    )
    if len(shards) != len(plan.nodes):
        return out
    for i, layer in enumerate(LAYERS):
        last = shards[plan.nodes[-1].name][i]
        total = last.row_hi
        for name, ss in shards.items():
            s, r = ss[i], ranks[name].rank
            lo, hi = total * r // tp, total * (r + 1) // tp
            if (s.row_lo, s.row_hi) != (lo, hi):
                out.setdefault(name, []).append(
                    f"{s.name}: slice [{s.row_lo}, {s.row_hi}) of layer {layer}, rank {r} of {tp} "
                    f"of the {total} rows is [{lo}, {hi})"
                )
    return out


def _fmt_failure(exc: BaseException) -> str:
    return exc.message if isinstance(exc, Tp4Error) else f"{type(exc).__name__}: {exc}"


def _run_packer(plan: Plan, node: Node, stale: Sequence[str], out: Echo) -> float:
    rank = node.rank
    d = engram_dir(rank)
    began = time.monotonic()
    # upstream's docker creates a missing bind source; podman refuses it: make it first. A shard
    # that is not complete goes, so the packer (which skips what it finds) makes it again.
    node.run(
        ["sh", "-c", 'd=$1; shift; mkdir -p -- "$d" && cd -- "$d" && rm -f -- "$@"', "tp4-pack", d, *stale],
        purpose=f"preparing the Engram dir of {node.name}",
    )
    out(f"pack: {node.name}: rank {rank.rank} of {plan.line.tp}: started")
    proc = node.run(
        packer_argv(plan, rank), check=False, timeout=None, purpose=f"packing the Engram shards of {node.name}"
    )
    seconds = time.monotonic() - began
    if proc.returncode != 0:
        text = (proc.stdout or "") + (proc.stderr or "")
        tail = [line for line in text.splitlines() if line.strip()][-TAIL:]
        out(
            f"pack: {node.name}: FAILED in {seconds:.0f} s (exit {proc.returncode})"
            + "".join(f"\n  | {line}" for line in tail)
        )
        raise Tp4Error(f"the packer exited {proc.returncode}" + (f": {tail[-1]}" if tail else ""))
    out(f"pack: {node.name}: done in {seconds:.0f} s")
    return seconds


def rehearse(plan: Plan, nodes: Sequence[Node]) -> list[str]:
    """`tp4 pack --dry-run`: the packer each node runs when a shard of its rank is missing or
    incomplete (a dry run asks no node which), as it would run there; nothing is run."""
    import shlex

    from tp4.core import process

    return [
        f"{n.name}: {shlex.join(process.full_argv(packer_argv(plan, n.rank), n.remote))}  (when a shard is not complete)"
        for n in nodes
    ]


def pack(plan: Plan, nodes: Sequence[Node], out: Echo) -> None:
    """The whole command: raises Tp4Error (exit 1) naming every node that failed."""
    from tp4.hosts.nodes import parallel

    began = time.monotonic()
    ranks = {n.name: n.rank for n in nodes}

    def one(node: Node) -> str:
        shards = read_shards(plan, node)
        problems = [p for s in shards if (p := shard_problem(plan, node.rank, s)) is not None]
        if not problems:
            out(f"pack: {node.name}: skipped ({', '.join(s.name for s in shards)} complete)")
            return "skipped"
        stale = [s.name for s in shards if s.size is not None and shard_problem(plan, node.rank, s) is not None]
        _run_packer(plan, node, stale, out)
        return "packed"

    results = parallel(nodes, one)
    failed: dict[str, str] = {name: _fmt_failure(v) for name, v in results.items() if isinstance(v, BaseException)}

    # every shard again, on every node the packer did not fail on
    checked = parallel([n for n in nodes if n.name not in failed], lambda n: read_shards(plan, n))
    shards: dict[str, list[Shard]] = {}
    for name, value in checked.items():
        if isinstance(value, BaseException):
            failed[name] = _fmt_failure(value)
            continue
        assert isinstance(value, list)
        problems = [p for s in value if (p := shard_problem(plan, ranks[name], s)) is not None]
        if problems:
            failed[name] = "; ".join(problems)
        else:
            shards[name] = value
    for name, problems in line_problems(plan, shards).items():
        failed[name] = "; ".join(problems)
    if failed:
        order = [n.name for n in nodes if n.name in failed]
        raise Tp4Error(
            f"pack: {len(order)} of {len(nodes)} nodes failed:\n"
            + "\n".join(f"  - {name}: {failed[name]}" for name in order)
            + "\nfix: see each node's output above; rerun `tp4 pack`: complete shards are kept"
        )
    packed = sum(1 for v in results.values() if v == "packed")
    out(
        f"pack: {2 * len(shards)} shards checked on {len(shards)} nodes ({packed} packed, {len(shards) - packed} skipped) "
        f"in {time.monotonic() - began:.1f} s"
    )
