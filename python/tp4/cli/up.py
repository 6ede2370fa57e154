"""`tp4 up`: doctor, image, distribute, prepare, serve and smoke from one plan (tp4.serving.up)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from tp4.cli.common import (
    boot_timeout_option,
    flake_option,
    dry_run_option,
    err,
    json_option,
    load_served,
    out,
    profile_option,
    ssh_option,
    strict_option,
    sysfs_option,
    sysfs_root,
    timeouts as parse_timeouts,
)
from tp4.core import schemas
from tp4.core.errors import InvalidInput
from tp4.serving.up import STEPS


@click.command("up")
@profile_option
@click.option(
    "--from",
    "start",
    type=click.Choice(STEPS),
    default="doctor",
    show_default=True,
    help="Start at this step (what a stopped run says to resume with); the earlier ones are skipped.",
)
@dry_run_option
@json_option(
    f"The summary as one JSON object on stdout (schema {schemas.UP}): each step's outcome and seconds, the "
    "plan's digest, the total and, when a step stopped the run or it was interrupted, that step, why and the "
    "command to resume; printed then too. Progress and the steps' own output go to stderr."
)
@flake_option("the image step builds from when the head lacks the plan's image")
@boot_timeout_option("of the serve step ")
@sysfs_option
@ssh_option
@strict_option
def up(
    profile_path: str | None,
    start: str,
    dry_run: bool,
    as_json: bool,
    flake_dir: Path | None,
    timeouts: tuple[str, ...],
    sysfs: str,
    ssh_options: tuple[str, ...],
    strict: bool,
) -> None:
    """From hosts that answer ssh to a verified serving line, from one plan: doctor's blocking
    checks, the image (reused when the head has the plan's image, else built, checked and
    pushed), distribute (the layers the workers lack), prepare (download, share, pack: each skips
    what is complete), serve, smoke. Each step prints its progress and time on stderr; a table of
    every step ends the run on stdout (on stderr with --json: the document is all of stdout). A failing step stops the run with its own message and the
    command that resumes there (`tp4 up --from STEP`). A line that already runs this plan is left
    as it is (only smoke runs); a line that runs another plan keeps serving until the serve step
    restarts its ranks. --dry-run prints every step's commands, host by host, and runs nothing.
    Ctrl-C prints the summary so far (the interrupted step marked) and the command to resume, and
    exits 130. Run it on the head, as `tp4 build` and `tp4 distribute`. Exit 0 when the line is up
    and its smoke passed, else the failing step's code (1: a check or a step failed; 2: bad input
    or a refused host key)."""
    from tp4.serving import serve as serve_mod
    from tp4.serving import up as up_mod

    if as_json and dry_run:
        raise InvalidInput("--json reports a run and --dry-run runs nothing: use one of them")
    sysfs = sysfs_root(sysfs)
    if flake_dir is not None:  # refused before anything is read or asked, a dry run too
        from tp4.image import nix

        flake_dir = nix.find_flake(flake_dir)
    served = load_served(profile_path, strict, ssh_options)
    loaded = served.line.loaded
    serve_opts = serve_mod.Options(
        timeouts=parse_timeouts(timeouts),
        tty=sys.stderr.isatty(),
        sysfs=sysfs,
        volume_kind="nfs" if loaded.profile.nfs.share else "local",
        expected_shards=loaded.profile.model.expected_shards,
    )
    line = up_mod.Line(loaded, served.plan, served.nodes, served.secrets)
    opts = up_mod.Options(serve=serve_opts, start=start, flake=flake_dir, again=_given(click.get_current_context()))
    if dry_run:
        for text in up_mod.rehearse(line, opts):
            out(text)
        return
    if not as_json:
        up_mod.run(line, opts, out, err)
        return

    def document(done: up_mod.Run) -> None:  # built through its contract (tp4.core.contracts.up_report)
        out(json.dumps(up_mod.report(line.plan, done).model_dump(mode="json", by_alias=True), indent=2))

    try:  # stdout holds the document only: the steps' own output goes to stderr with the progress
        done = up_mod.run(line, opts, err, err)
    except up_mod.Stopped as stopped:
        document(stopped.run)
        raise
    except up_mod.Interrupted as interrupted:
        document(interrupted.run)
        raise
    document(done)


# the options a resume does not repeat: it sets its own --from, and prints the summary as the run did
_NOT_REPEATED = {"start", "dry_run", "as_json"}


def _given(ctx: click.Context) -> tuple[str, ...]:
    """What a resume repeats: this run's options as they were given on the command line (every
    option up takes, so one added later is repeated too), in the order the command lists them."""
    args: list[str] = []
    for param in ctx.command.params:
        name = param.name or ""
        if not isinstance(param, click.Option) or name in _NOT_REPEATED:
            continue
        if ctx.get_parameter_source(name) is not click.core.ParameterSource.COMMANDLINE:
            continue
        flag = next(o for o in param.opts if o.startswith("--"))
        value = ctx.params[name]
        if param.is_flag:
            args += [flag] if value else []
        else:
            args += [a for v in (value if param.multiple else (value,)) for a in (flag, str(v))]
    return tuple(args)
