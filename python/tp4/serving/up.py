"""`tp4 up`: one command from hosts that answer ssh to a verified serving line, from ONE plan.

The steps, in order (:data:`STEPS`), each the code path of its own command:

1. ``doctor``: doctor's checks on every node (tp4.hosts.doctor, as `tp4 prepare` runs them):
   a blocking failure stops here, but for what a later step makes (:data:`UP_MADE_BY`).
2. ``image``: the plan's image on the head. Present under the plan's tag (which `tp4 build`
   sets only once the image's checks passed): reused. Absent: built, checked and pushed to the
   head's image store (tp4.image.build.build, as `tp4 build --image VARIANT`).
3. ``distribute``: the workers that lack the head's image id get the layers they lack
   (tp4.image.distribute, as `tp4 distribute`); a worker that has it is skipped.
4. ``prepare``: download, share, pack (tp4.hosts.checkpoint, share, pack, as `tp4 prepare`),
   each skipping what is complete.
5. ``serve``: tp4.serving.serve.serve; a line running another plan is replaced (its ranks stop,
   this plan's start), as `tp4 serve --replace`.
6. ``smoke``: upstream's arithmetic check and a streamed completion (tp4.serving.api.smoke).

Before the first step, up reads which plan each rank runs (one `inspect` per node, the label
serve puts on every rank). A line that runs this plan on every rank is up: every step but smoke
is skipped, so a second `tp4 up` changes nothing. A line that runs another plan keeps serving
while the image, distribute and prepare steps run (each does only what the new plan lacks; when
the packer has work, the ranks stop before it runs: it reads the checkpoint into their memory);
doctor's checks then run in serve, once the old ranks have stopped (a running rank holds the
ports and the GPU doctor checks), and only the ranks restart.

A failing step stops up with its own message and the command that resumes there
(`tp4 up --from STEP`); a summary table (step, outcome, seconds) ends every run, an interrupted
one too (Ctrl-C: the step it stopped marked ``interrupted``, then the resume command). The same
summary as one document is :func:`report` (`tp4 up --json`, tp4.core.contracts.up_report)."""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from tp4.core.errors import Tp4Error

if TYPE_CHECKING:
    from tp4.core.apikey import Secret
    from tp4.core.contracts.up_report import StepName, StepOutcome, UpReport
    from tp4.hosts.doctor import Report as doctor_Report
    from tp4.hosts.nodes import Node
    from tp4.line.plan import Plan
    from tp4.line.profile.load import Loaded
    from tp4.serving.serve import Options as ServeOptions

Echo = Callable[[str], None]

STEPS: tuple[StepName, ...] = ("doctor", "image", "distribute", "prepare", "serve", "smoke")

# doctor's blocking checks that a later step makes pass: not a reason to stop before that step
# (a fresh line has no checkpoint and no shards yet); `tp4 prepare` uses the same table
MADE_BY = {
    "WEIGHTS.HEAD": "download",
    "WEIGHTS.SHARD_FILES": "download",
    "WEIGHTS.WORKER": "share",
    "ENGRAM.SHARDS": "pack",
}
# up's own steps make more: the head's image (the image step) and the workers' copies of it (distribute)
UP_MADE_BY = {**MADE_BY, "IMAGE.SAME": "image, distribute"}


@dataclass
class Line:
    """What every step reads: the profile, its plan, its nodes, its secrets."""

    loaded: Loaded
    plan: Plan
    nodes: list[Node]
    secrets: Mapping[str, Secret]


@dataclass
class Options:
    serve: ServeOptions
    start: str = "doctor"  # --from
    flake: Path | None = None  # where `tp4 build` finds the flake (default: nix.find_flake's rule)
    # the options of this run that a resume repeats (--profile, --flake, --timeout ...): the resume
    # command is the run's own, with --from
    again: tuple[str, ...] = ()


@dataclass
class Outcome:
    step: StepName
    status: StepOutcome
    seconds: float = 0.0
    detail: str = ""


@dataclass
class Run:
    """What a run did, also when it stopped: every step's outcome and the whole run's seconds."""

    outcomes: list[Outcome]
    seconds: float
    stopped_at: StepName | None = None
    error: str | None = None
    resume: str | None = None  # the command that resumes there; None when ok or when rerunning cannot help


def resume_command(step: str, again: Sequence[str] = ()) -> str:
    """The command that resumes at ``step``: this run's own options (quoted for a shell), then
    --from."""
    return shlex.join(["tp4", "up", *again, "--from", step])


@dataclass
class State:
    """What up learnt before the first step: each rank's state and the plan digest it runs."""

    running: dict[str, tuple[str, str]] = field(default_factory=dict)

    def runs(self, plan: Plan) -> bool:
        """Every rank runs, from this plan."""
        return bool(self.running) and all(s == "running" and d == plan.digest for s, d in self.running.values())

    def other(self, plan: Plan) -> list[str]:
        """The digests of the ranks that run but not from this plan ('' when one carries none)."""
        return sorted({d for s, d in self.running.values() if s == "running" and d != plan.digest})

    def any_running(self) -> bool:
        return any(s == "running" for s, _ in self.running.values())


class Skip(Exception):
    """A step that has nothing to do: its reason."""


class Stopped(Tp4Error):
    """A step failed: its own message, then the command that resumes there. ``run``: the summary
    so far (the failed step, then ``not run`` for the rest)."""

    def __init__(self, step: str, message: str, exit_code: int, run: Run, *, fix: str = ""):
        i = STEPS.index(step)
        super().__init__(
            "\n".join(summary(run.outcomes, run.seconds))
            + f"\nup: stopped at step {i + 1}/{len(STEPS)} ({step}): {message}\n"
            + (fix or f"fix: the fix above, then `{run.resume}` (or `tp4 up`: the steps done are skipped)"),
            exit_code=exit_code,
        )
        self.step = step
        self.run = run


class Interrupted(KeyboardInterrupt):
    """Ctrl-C (or another stopping signal) during a run: the summary so far, the interrupted step
    marked. A KeyboardInterrupt, so the CLI says `interrupted` and exits 130 as for any command."""

    def __init__(self, run: Run):
        super().__init__(run.stopped_at)
        self.run = run


def read_state(line: Line) -> State:
    from tp4.serving import serve as serve_mod

    return State(serve_mod.running_digests(line.nodes))


# --- the steps --------------------------------------------------------------------------------------


def _doctor(line: Line, opts: Options, state: State, out: Echo) -> str:
    from tp4.hosts import doctor as doctor_mod

    if state.any_running():
        raise Skip(
            "the line runs"
            + (
                f" plan {', '.join(d or 'without a digest' for d in state.other(line.plan))}"
                if state.other(line.plan)
                else ""
            )
            + ": serve runs doctor's blocking checks once its ranks stop"
        )
    limits = doctor_mod.Limits.of_profile(line.loaded.profile, sysfs=opts.serve.sysfs)
    report = doctor_mod.doctor(line.plan, line.nodes, limits)
    for text in doctor_mod.table(line.plan, report.results):
        out(text)
    problem, later = gate(report, UP_MADE_BY)
    if problem:
        raise Tp4Error(problem)
    return "no blocking failure" + (f" but what later steps make: {', '.join(later)}" if later else "")


def gate(report: doctor_Report, made_by: Mapping[str, str]) -> tuple[str | None, list[str]]:
    """Doctor's blocking failures as `tp4 up` and `tp4 prepare` stop on them: those no later step
    makes pass, told in one message (None when there are none), and the others, each with the
    step that makes it (``CHECK (step)``)."""
    blocking = [r for r in report.blocking if r.check not in made_by]
    problem = (
        f"{len(blocking)} blocking failure(s):\n"
        + "\n".join(f"  - {r.check} on {r.node}: {r.detail}" + (f"; fix: {r.fix}" if r.fix else "") for r in blocking)
        if blocking
        else None
    )
    return problem, sorted({f"{r.check} ({made_by[r.check]})" for r in report.blocking if r.check in made_by})


def head_image(line: Line) -> str | None:
    """The id of the plan's image on the head (rank 0), None when it has none."""
    from tp4.image import runtime_cli

    head = line.nodes[0]
    found = runtime_cli.inspect(head.runtime, line.plan.image.tag, remote=head.remote)
    return None if found is None else runtime_cli.normalize_id(found[0])


def _image(line: Line, opts: Options, state: State, out: Echo, progress: Echo) -> str:
    from tp4.image import build as build_mod
    from tp4.image import nix, runtime_cli

    tag = line.plan.image.tag
    have = head_image(line)
    if have is not None:
        raise Skip(f"the head has {tag} ({have[:12]}), built and checked: reused")
    flake = nix.find_flake(opts.flake)
    attr = build_mod.image_attr(line.plan.image.variant)
    head = line.nodes[0]
    built = build_mod.build(flake, attr, head.runtime, out, progress)
    if not build_mod.Pushed.load(build_mod.store_record_path(flake, attr)):
        progress("image: not in the head's image store; distribute pushes it")
    # the build is this machine's; the ranks run what the head has: the same store only when tp4
    # runs on the head as the head's ssh user (a rootless podman store is per user)
    found = head_image(line)
    if found != runtime_cli.normalize_id(built.id):
        where = f"{head.name} (over ssh as {head.rank.ssh.user})" if head.remote is not None else head.name
        has = f"has no {tag}" if found is None else f"has {tag} as {found[:12]}"
        if not runtime_cli.same_ref(built.ref, tag):
            fix = (
                f"the image names the line's reference {built.ref}, not the plan's image {tag}; fix: build the "
                "plan's image variant from a flake that tags it so (image.tag and image.variant of the profile)"
            )
        else:
            fix = (
                f"the build went into this machine's {head.runtime} store, which is not the one the head's ranks "
                f"run from; fix: run tp4 up on the head, as the head's ssh user ({head.rank.ssh.user})"
            )
        raise Tp4Error(f"built {built.ref} ({built.id[:12]}) here, but the head {where} {has}: {fix}")
    return f"built, checked and tagged {built.ref} ({built.id[:12]})"


def _distribute(line: Line, opts: Options, state: State, out: Echo) -> str:
    from tp4.image import build as build_mod
    from tp4.image import distribute as distribute_mod
    from tp4.image import nix

    workers = line.nodes[1:]
    if not workers:
        raise Skip("no workers")
    tag = line.plan.image.tag
    image_id = head_image(line)
    if image_id is None:
        raise Tp4Error(f"the head has no image {tag}: run `tp4 up --from image`")
    runtime = line.nodes[0].runtime
    remotes = [n.remote for n in workers if n.remote is not None]
    if len(remotes) < len(workers):  # a plan's worker is always reached over ssh (tp4.hosts.nodes)
        raise Tp4Error("a worker without an ssh address: distribute reaches workers over ssh")
    before = distribute_mod.check(tag, image_id, remotes, runtime)
    if all(o.status == "present" for o in before):
        raise Skip(f"every worker has {image_id[:12]}")
    digest = None
    try:
        flake = nix.find_flake(opts.flake)
        pushed = build_mod.Pushed.load(
            build_mod.store_record_path(flake, build_mod.image_attr(line.plan.image.variant))
        )
        if pushed is not None and pushed.id.removeprefix("sha256:") == image_id.removeprefix("sha256:"):
            digest = pushed.digest
    except Tp4Error:
        pass  # no flake here: distribute pushes the image to the store itself
    outcomes = distribute_mod.distribute(tag, image_id, remotes, runtime, out, method="registry", digest=digest)
    bad = [o for o in outcomes if not o.ok]
    if bad:
        raise Tp4Error("; ".join(f"{o.node}: {o.status} ({o.detail})" for o in bad))
    copied = sum(1 for o in before if o.status != "present")
    return f"{copied} of {len(workers)} workers got {image_id[:12]}"


def unpacked(line: Line) -> list[str]:
    """The nodes where `tp4 pack` has work: a shard of the rank missing or not complete (pack's
    own reading and checks); a node that cannot be read counts as one."""
    from tp4.hosts import pack as pack_mod
    from tp4.hosts.nodes import parallel

    got = parallel(line.nodes, lambda n: pack_mod.read_shards(line.plan, n))
    names = []
    for n in line.nodes:
        shards = got[n.name]
        if not isinstance(shards, list) or any(
            pack_mod.shard_problem(line.plan, n.rank, s) is not None for s in shards
        ):
            names.append(n.name)
    return names


def _prepare(line: Line, opts: Options, state: State, out: Echo, progress: Echo) -> str:
    from tp4.hosts import checkpoint as checkpoint_mod
    from tp4.hosts import pack as pack_mod
    from tp4.hosts import share as share_mod
    from tp4.serving import serve as serve_mod

    def pack() -> None:
        to_pack = unpacked(line) if state.any_running() else []
        if not to_pack:
            pack_mod.pack(line.plan, line.nodes, out)
            return
        # the packer reads the checkpoint into the memory the running rank holds: the ranks stop
        # first, under the line's lock `tp4 serve` and `tp4 stop` take, held until the packer is
        # done, so a `tp4 serve` cannot start ranks between the stop and the packer
        with serve_mod.line_lock(line.plan, "up (prepare: stopping the ranks for the packer)"):
            progress(
                f"up: prepare: pack has work on {', '.join(to_pack)} while the line runs another plan: "
                "stopping its ranks first"
            )
            problems = serve_mod.stop_nodes(line.nodes, progress)
            if problems:
                raise Tp4Error("not everything stopped:\n" + "\n".join(f"  {p}" for p in problems))
            state.running = {}
            pack_mod.pack(line.plan, line.nodes, out)

    for name, run in (
        ("download", lambda: checkpoint_mod.download(line.loaded.profile)),
        ("share", lambda: share_mod.share(line.loaded.profile, line.plan, line.nodes, out)),
        ("pack", pack),
    ):
        out(f"up: prepare: {name}")
        try:
            run()
        except Tp4Error as exc:
            raise Tp4Error(f"{name}: {exc.message}", exit_code=exc.exit_code) from None
    return "download, share and pack complete"


def _serve(line: Line, opts: Options, state: State, out: Echo, progress: Echo) -> str:
    import dataclasses

    from tp4.serving import serve as serve_mod

    served = dataclasses.replace(opts.serve, replace=state.any_running())
    ready = serve_mod.serve(line.plan, line.nodes, line.secrets, served, out, progress)
    return f"ready after {ready.seconds:.1f} s" + (
        " (the ranks of the other plan stopped first)" if served.replace else ""
    )


def _smoke(line: Line, opts: Options, state: State, out: Echo) -> str:
    from tp4.serving import api
    from tp4.serving import serve as serve_mod

    results = api.smoke(serve_mod.endpoint(line.plan, line.secrets), full=False)
    for r in results:
        out(f"{'ok' if r.ok else 'FAIL':<4} {r.name:<12} {r.seconds:5.1f} s  {r.detail}")
    failed = [r.name for r in results if not r.ok]
    if failed:
        raise Tp4Error(f"smoke failed: {', '.join(failed)}")
    return ", ".join(r.name for r in results) + " passed"


def run(line: Line, opts: Options, out: Echo, progress: Echo) -> Run:
    """Every step from ``opts.start`` on; raises :class:`Stopped` at the first that fails and
    :class:`Interrupted` on Ctrl-C (after printing the summary so far and the resume command on
    ``progress``). One `tp4 up` of a line at a time (a second is refused naming the first)."""
    from tp4.serving import serve as serve_mod

    with serve_mod.line_lock(line.plan, "up", kind="up.lock"):
        return _run(line, opts, out, progress)


def _run(line: Line, opts: Options, out: Echo, progress: Echo) -> Run:
    began = time.monotonic()
    outcomes: list[Outcome] = []
    current: tuple[StepName, float] | None = None  # the step running and when it started
    try:
        state = read_state(line)
        first = STEPS.index(opts.start)
        up_already = state.runs(line.plan)
        if up_already:
            progress(f"up: the line runs this plan ({line.plan.digest}) on every rank: only smoke verifies it")
        elif state.any_running():
            progress(
                f"up: the line runs another plan ({', '.join(d or 'no digest' for d in state.other(line.plan))}); "
                f"this plan is {line.plan.digest}: only what the change needs is redone, then the ranks restart"
            )
        steps: dict[str, Callable[[], str]] = {
            "doctor": lambda: _doctor(line, opts, state, out),
            "image": lambda: _image(line, opts, state, out, progress),
            "distribute": lambda: _distribute(line, opts, state, out),
            "prepare": lambda: _prepare(line, opts, state, out, progress),
            "serve": lambda: _serve(line, opts, state, out, progress),
            "smoke": lambda: _smoke(line, opts, state, out),
        }
        for i, name in enumerate(STEPS):
            if i < first:
                outcomes.append(Outcome(name, "skipped", 0.0, f"--from {opts.start}"))
                continue
            if up_already and name != "smoke":
                outcomes.append(Outcome(name, "skipped", 0.0, f"the line runs this plan ({line.plan.digest})"))
                continue
            progress(f"up: step {i + 1}/{len(STEPS)}: {name}")
            started = time.monotonic()
            current = (name, started)
            try:
                detail = steps[name]()
                status: StepOutcome = "done"
            except Skip as why:
                detail, status = str(why), "skipped"
            except Tp4Error as exc:
                current = None
                outcomes.append(Outcome(name, "failed", time.monotonic() - started, exc.message.splitlines()[0]))
                outcomes += [Outcome(rest, "not run") for rest in STEPS[i + 1 :]]
                # a line that runs this plan and fails its smoke is not fixed by running smoke again
                fix = (
                    "fix: the line runs this plan but does not answer as it should: `tp4 status` tells busy from "
                    "wedged; `tp4 serve --replace` restarts its ranks"
                    if up_already
                    else ""
                )
                stopped = Run(
                    outcomes,
                    time.monotonic() - began,
                    stopped_at=name,
                    error=exc.message,
                    resume=None if fix else resume_command(name, opts.again),
                )
                raise Stopped(name, exc.message, exc.exit_code, stopped, fix=fix) from None
            seconds = time.monotonic() - started
            current = None
            outcomes.append(Outcome(name, status, seconds, detail))
            progress(f"up: {name}: {status} in {seconds:.1f} s: {detail}")
    except KeyboardInterrupt:
        raise _interrupted(outcomes, current, opts, began, progress) from None
    done = Run(outcomes, time.monotonic() - began)
    for text in summary(done.outcomes, done.seconds):
        out(text)
    return done


def _interrupted(
    outcomes: list[Outcome], current: tuple[StepName, float] | None, opts: Options, began: float, progress: Echo
) -> Interrupted:
    """The summary so far on ``progress``: the step that ran marked ``interrupted`` (when none
    ran, the next one: it is where to resume), the rest ``not run``; then the resume command."""
    now = time.monotonic()
    first = STEPS.index(opts.start)
    seen = {o.step for o in outcomes}
    outcomes += [Outcome(name, "skipped", 0.0, f"--from {opts.start}") for name in STEPS[:first] if name not in seen]
    rest = [name for name in STEPS[first:] if name not in seen]
    at = current[0] if current is not None else (rest[0] if rest else STEPS[-1])
    if at in rest:
        outcomes.append(Outcome(at, "interrupted", now - current[1] if current is not None else 0.0, "interrupted"))
    outcomes += [Outcome(name, "not run") for name in rest if name != at]
    stopped = Run(outcomes, now - began, stopped_at=at, error="interrupted", resume=resume_command(at, opts.again))
    try:
        for text in summary(stopped.outcomes, stopped.seconds):
            progress(text)
        progress(
            f"up: interrupted at step {STEPS.index(at) + 1}/{len(STEPS)} ({at}); resume with "
            f"`{stopped.resume}` (or `tp4 up`: the steps done are skipped)"
        )
    except OSError:  # the terminal is gone: the document (--json) and the exit code still say it
        pass
    return Interrupted(stopped)


def summary(outcomes: Sequence[Outcome], total: float) -> list[str]:
    """The table that ends every run: step, outcome, seconds, what it did."""
    rows = [f"{'step':<11} {'outcome':<11} {'seconds':>8}  detail"]
    for o in outcomes:
        rows.append(f"{o.step:<11} {o.status:<11} {o.seconds:8.1f}  {o.detail}")
    rows.append(f"{'total':<11} {'':<11} {total:8.1f}")
    return rows


def report(plan: Plan, done: Run) -> UpReport:
    """The run as `tp4 up --json` prints it (tp4.core.contracts.up_report)."""
    from tp4.core.contracts.up_report import UpReport, UpStep

    return UpReport(
        plan=plan.digest,
        ok=done.stopped_at is None,
        steps=[
            UpStep(name=o.step, outcome=o.status, seconds=round(o.seconds, 3), detail=o.detail) for o in done.outcomes
        ],
        seconds=round(done.seconds, 3),
        stopped_at=done.stopped_at,
        error=done.error,
        resume=done.resume,
    )


# --- --dry-run ------------------------------------------------------------------------------------


def _indented(text: str) -> str:
    """A line of another command's rehearsal, indented under up's step (its continuation lines too)."""
    return "  " + text.replace("\n", "\n  ")


def _recorded_digest(line: Line, opts: Options) -> str | None:
    """The store digest `tp4 build` recorded for the plan's image when it is the build's own image
    (as `tp4 distribute --dry-run` reads it from the build records); None without a flake or record."""
    from tp4.image import build as build_mod
    from tp4.image import nix

    try:
        flake = nix.find_flake(opts.flake)
        attr = build_mod.image_attr(line.plan.image.variant)
        built = build_mod.Built.load(build_mod.record_path(flake, attr))
    except Tp4Error:
        return None
    pushed = build_mod.Pushed.load(build_mod.store_record_path(flake, attr))
    return pushed.digest if pushed is not None and pushed.id == built.id else None


def rehearse(line: Line, opts: Options) -> list[str]:
    """Every step's commands, host by host, from the plan alone: no host is asked, nothing runs.
    What a step runs only when something is missing says so."""
    from tp4.core import process
    from tp4.hosts import checkpoint as checkpoint_mod
    from tp4.hosts import doctor as doctor_mod
    from tp4.hosts import pack as pack_mod
    from tp4.hosts import share as share_mod
    from tp4.image import distribute as distribute_mod
    from tp4.serving import serve as serve_mod

    plan, nodes = line.plan, line.nodes
    head = nodes[0]
    tag = plan.image.tag

    def on(node: Node, argv: Sequence[str], note: str = "") -> str:
        return f"  {node.name}: {shlex.join(process.full_argv(list(argv), node.remote))}{note}"

    lines: list[str] = []
    first = STEPS.index(opts.start)
    inspect = [
        on(n, [n.runtime, "container", "inspect", "--format", serve_mod._STATE_AND_PLAN, n.container]) for n in nodes
    ]
    lines += ["before the steps: which plan each rank runs (a line running this plan: only smoke runs)", *inspect]
    for i, name in enumerate(STEPS):
        if i < first:
            continue
        lines.append(f"step {i + 1}/{len(STEPS)}: {name}")
        if name == "doctor":
            limits = doctor_mod.Limits.of_profile(line.loaded.profile, sysfs=opts.serve.sysfs)
            for n in nodes:
                argv = [
                    "sh",
                    "-c",
                    "<tp4.hosts.doctor.FACTS_SCRIPT>",
                    "tp4-doctor",
                    *doctor_mod.remote_args(plan, n.rank, limits),
                ]
                lines.append(on(n, argv, "  (read-only; skipped when the line runs)"))
        elif name == "image":
            lines.append(on(head, [head.runtime, "image", "inspect", "--format", "{{.Id}}", tag]))
            lines.append(
                f"  (absent: `tp4 build --image {plan.image.variant}` on the head: nix build, load, in-image checks, "
                "tag, push to the image store; `tp4 build --dry-run` prints its commands)"
            )
        elif name == "distribute":  # `tp4 distribute --dry-run`'s own rehearsal, of the copy _distribute runs
            remotes = [n.remote for n in nodes[1:] if n.remote is not None]
            rehearsed = distribute_mod.rehearse(
                tag, remotes, head.runtime, method="registry", digest=_recorded_digest(line, opts)
            )
            lines += [_indented(text) for text in rehearsed]
        elif name == "prepare":
            lines += [f"  download: {text}" for text in checkpoint_mod.rehearse(line.loaded.profile)]
            lines += [_indented(text) for text in share_mod.rehearse(line.loaded.profile, plan, nodes)]
            lines += [f"  {text}" for text in pack_mod.rehearse(plan, nodes)]
        elif name == "serve":
            lines.append("  (a line running another plan: its ranks stop first)")
            lines += [f"  {text}" for text in serve_mod.rehearse_stop(nodes, record=False)]
            lines.append("  then:")
            lines += [f"  {text}" for text in serve_mod.rehearse_serve(plan, nodes)]
        elif name == "smoke":
            lines.append(
                f"  POST {serve_mod.endpoint(plan, line.secrets).url}/v1/chat/completions (arithmetic, stream)"
            )
    return lines
