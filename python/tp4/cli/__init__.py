"""The ``tp4`` command. Subcommands live in their own modules and are imported only when used,
so ``tp4 plan`` does not pay for the imports of ``tp4 sources`` or ``tp4 build``; ``logging`` too
is imported only when -v asks for it (tp4.core.process imports it for the commands that run any).

Start-up cost is measured by bench/bench_plan.py (issue 8 §6: `tp4 plan` <= 150 ms, `tp4 --help`
<= 80 ms).

Owns: the commands, their shared options and the profile rule (common), and the one place a
Tp4Error becomes a message and an exit code.

May import: tp4.core, tp4.line, tp4.image, tp4.hosts, tp4.serving, tp4.measuring."""

from __future__ import annotations

import errno
import gc
import importlib
import os
import signal
import sys
from collections.abc import Callable
from types import FrameType
from typing import Any

# A tp4 run is short, and most of what it allocates is long-lived (the classes and functions of
# click, pydantic and the profile models), which every young-generation collection scans again for
# nothing: at the default threshold (700) the collector ran ~70 times in `tp4 plan`, 3-8 ms of
# its ~175 ms. Collect every 200000 allocations instead, as mypy
# does (mypy/build.py); still bounded for the long commands (build, sources fetch).
if sys.implementation.name == "cpython":
    gc.set_threshold(200_000, 30, 30)

import click  # after the collector is tuned: click's import is part of the cost

from tp4.core.errors import InvalidInput, Tp4Error

# name -> (module, attribute, one-line help shown in `tp4 --help` without importing the module)
SUBCOMMANDS: dict[str, tuple[str, str, str]] = {
    "plan": ("tp4.cli.plan", "plan", "Show the rendered line: env, engine argv and run spec per rank."),
    "profile": ("tp4.cli.profile", "profile", "Check, import and inspect profiles and presets."),
    "sources": ("tp4.cli.sources", "sources", "Pinned sources: list, verify, lock, fetch, diff, hash."),
    "build": ("tp4.cli.build", "build", "Build the OCI image with nix and load it on the head."),
    "distribute": ("tp4.cli.build", "distribute", "Copy the built image to the workers."),
    "images": ("tp4.cli.images", "images", "The tp4 images on every node (id, digest, pins); prune old builds."),
    "image-store": ("tp4.cli.build", "image_store", "The head's image store (registry) the workers pull from."),
    "serve": (
        "tp4.cli.serve",
        "serve",
        "Start the line and prove it ready (Ready, a completion, every boot log), or leave nothing running.",
    ),
    "up": (
        "tp4.cli.up",
        "up",
        "doctor, image, distribute, prepare, serve, smoke from one plan; a line already up is left as it is.",
    ),
    "stop": ("tp4.cli.serve", "stop", "Stop every rank of the line and check that nothing is left."),
    "status": (
        "tp4.cli.serve",
        "status",
        "Each node's rank and the line's liveness (a real completion; busy is not wedged).",
    ),
    "logs": ("tp4.cli.serve", "logs", "A rank's log."),
    "watch": (
        "tp4.cli.watch",
        "watch",
        "Watch the line: restart it when it is wedged or a rank is down (never when busy); metrics, events.",
    ),
    "bootlog": (
        "tp4.cli.bootlog",
        "bootlog",
        "One rank's boot-log check on its own node (the NixOS readiness unit runs it).",
    ),
    "smoke": ("tp4.cli.serve", "smoke", "Upstream's arithmetic check and a streamed completion against the API."),
    "download": (
        "tp4.cli.download",
        "download",
        "Download the pinned checkpoint into the head's model.dir, verified against the Hub's hashes.",
    ),
    "share": (
        "tp4.cli.prepare",
        "share",
        "Export the checkpoint read-only to the workers (NFSv4) and make their weights volumes.",
    ),
    "pack": (
        "tp4.cli.prepare",
        "pack",
        "Pack the Engram row shards of every rank on every node at once; check every shard's header.",
    ),
    "prepare": (
        "tp4.cli.prepare",
        "prepare",
        "Prepare the nodes: doctor, download, share, pack; stops at the first blocking failure.",
    ),
    "doctor": (
        "tp4.cli.doctor",
        "doctor",
        "Check every host requirement of the line, read-only; a fix for each failure.",
    ),
    "deploy": (
        "tp4.cli.deploy",
        "deploy",
        "Switch the NixOS hosts to the flake's systems, check each from here, roll back by generation what fails.",
    ),
    "qeval": (
        "tp4.cli.qeval",
        "qeval",
        "The quality suite: code (run in a sandbox on a worker), JSON, numeric, format and prose tasks; a score.",
    ),
    "fleet": (
        "tp4.cli.fleet",
        "fleet",
        "Several lines behind SGLang's router, from one fleet file: plan, serve, stop, status.",
    ),
    "hosts": (
        "tp4.cli.hosts",
        "hosts",
        "The ssh host keys tp4 trusts: trust (after showing fingerprints), list, forget.",
    ),
    "bench": (
        "tp4.cli.bench",
        "bench",
        "Measure the line: decode and prefill tok/s (sparkDash's method and result.json), needle.",
    ),
    "report": (
        "tp4.cli.report",
        "report",
        "Bench results against the published line (or another run): tables, PNG charts, regressions.",
    ),
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(SUBCOMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        entry = SUBCOMMANDS.get(name)
        if entry is None:
            return None
        module, attr, _ = entry
        command = getattr(importlib.import_module(module), attr)
        if not isinstance(command, click.Command):  # SUBCOMMANDS names a function, not a command
            raise TypeError(f"SUBCOMMANDS[{name!r}]: {module}.{attr} is not a click command")
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, SUBCOMMANDS[name][2]) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", is_flag=True, help="Log every external command as `$ ...` on stderr.")
@click.version_option(package_name="tp4", message="tp4 %(version)s")
def cli(verbose: bool) -> None:
    """tp4: build, deploy and serve DeepSeek-V4.1-Flash on four DGX Sparks at TP4.

    Shell completion: eval "$(_TP4_COMPLETE=bash_source tp4)" (zsh_source, fish_source).
    """
    global _verbose
    _verbose = verbose
    if verbose:
        import logging

        logging.basicConfig(level=logging.DEBUG, format="%(message)s", stream=sys.stderr)
    # without -v nothing is configured: logging's last-resort handler prints WARNING and above to
    # stderr as the bare message, which is what basicConfig(WARNING, "%(message)s") printed


_verbose = False


# the signals that stop tp4 (Ctrl-C, `kill`, the terminal closing): what it says, its exit code
STOPPING: dict[int, tuple[str, int]] = {
    signal.SIGINT: ("interrupted", 130),
    signal.SIGTERM: ("terminated", 143),
    signal.SIGHUP: ("hung up", 129),
}
_received: list[int] = []


def _interrupt(signum: int, frame: FrameType | None) -> None:
    """The funnel (when a command has loaded it) stops every child first, remote ones on their
    hosts too (tp4's children run in their own process groups, so only tp4 gets the signal);
    then KeyboardInterrupt, for every stopping signal."""
    _received.append(signum)
    process = sys.modules.get("tp4.core.process")
    if process is not None:
        # raises KeyboardInterrupt, or returns while a child it starts is not yet known: the start
        # raises it then
        process.on_interrupt(signum, frame)
        return
    raise KeyboardInterrupt


def _stopped() -> None:
    message, code = STOPPING.get(_received[-1] if _received else signal.SIGINT, STOPPING[signal.SIGINT])
    try:
        click.echo(message, err=True)
    except OSError:  # the terminal is gone
        pass
    sys.exit(code)


class StdoutUnwritable(Exception):
    """Standard output refused a write (`> /dev/full`, a closed pipe, a full disk): not an OSError,
    so neither click's EPIPE handling nor a command's own `except OSError` takes it for its own."""

    def __init__(self, cause: OSError) -> None:
        super().__init__(cause.strerror or str(cause))
        self.cause = cause


class _Stdout:
    """sys.stdout, with a failed write or flush raised as StdoutUnwritable; everything else is the
    stream's own (click sees its encoding and finds it writable, and uses it as it is)."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return int(self._stream.write(text))
        except OSError as exc:
            raise StdoutUnwritable(exc) from None

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError as exc:
            raise StdoutUnwritable(exc) from None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _cannot_write_stdout(exc: StdoutUnwritable) -> None:
    """Say so on stderr and exit 1; what is still buffered goes to /dev/null, so the interpreter's
    own flush at exit finds nothing to fail on (it would print a traceback and exit 120)."""
    stream = sys.stdout._stream if isinstance(sys.stdout, _Stdout) else sys.stdout
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):  # not a file (a test's capture): nothing buffered at exit
        fd = None
    if fd is not None:
        import os

        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, fd)
        os.close(null)
    try:
        click.echo(f"error: cannot write standard output ({exc}); tp4 stopped there", err=True)
    except OSError:  # stderr is gone too
        pass
    sys.exit(1)


def main(argv: list[str] | None = None) -> None:
    """Console entry point: Tp4Error becomes `error: ...` and its exit code, never a traceback;
    Ctrl-C stops every child, says `interrupted` and exits 130 (SIGTERM 143, SIGHUP 129); a
    standard output that cannot be written says so and exits 1."""
    _received.clear()
    previous: dict[int, Callable[[int, FrameType | None], Any] | int | None] = {}
    try:
        for sig in STOPPING:
            if signal.getsignal(sig) is not signal.SIG_IGN:  # `nohup tp4 …` stays immune to SIGHUP
                previous[sig] = signal.signal(sig, _interrupt)
    except ValueError:  # not the main thread (an embedding program): leave its handlers alone
        pass
    stdout = sys.stdout
    if stdout is not None and not isinstance(stdout, _Stdout):
        sys.stdout = _Stdout(stdout)
    try:
        try:
            _main(argv)
        finally:
            # what is still buffered is written now, while a failure can still be said plainly
            if sys.stdout is not None:
                sys.stdout.flush()
    except StdoutUnwritable as exc:
        _cannot_write_stdout(exc)
    finally:
        if isinstance(sys.stdout, _Stdout):
            sys.stdout = stdout
        for sig, handler in previous.items():
            if handler is not None:  # None: a handler not set from Python, which cannot be put back
                signal.signal(sig, handler)


def _host_key_refusals() -> list[Tp4Error]:
    """What ssh refused in this run for a host key (tp4.core.process, when a command loaded it)."""
    process = sys.modules.get("tp4.core.process")
    return list(process.host_key_failures.values()) if process is not None else []


def _exit_for_refusals(shown: str = "") -> None:
    """A host-key refusal decides the exit (2, the user must act) and is said once, even when the
    command only reported its node as failed."""
    refusals = _host_key_refusals()
    if not refusals:
        return
    for refusal in refusals:
        if refusal.message not in shown:
            click.echo(f"error: {refusal.message}", err=True)
    sys.exit(refusals[0].exit_code)


# The kernel's bound on one argv word (MAX_ARG_STRLEN, 32 pages, with its NUL): no exec passes a
# longer one, nor a NUL inside one; a caller in-process (tests, an embedding program) can.
MAX_ARG_BYTES = 32 * 4096 - 1


def _param_of(args: list[str], index: int) -> str:
    """How usage names the option or argument whose value is ``args[index]`` (``--port``,
    ``HOST``), read from the command tree the way click parses it; "an argument" when unsure."""
    cmd: click.Command = cli
    i, positional, dashdash = 0, 0, False
    while i < len(args):
        word = args[i]
        if not dashdash and word == "--":
            dashdash = True
        elif not dashdash and word.startswith("-") and len(word) > 1:
            name, eq, _ = word.partition("=")
            option = next((p for p in cmd.params if isinstance(p, click.Option) and name in p.opts), None)
            if option is not None and i == index:
                return name
            if option is not None and not eq and not option.is_flag and not option.count:
                if i + 1 == index:
                    return name
                i += 1
        elif isinstance(cmd, click.Group) and not dashdash:
            sub = cmd.get_command(click.Context(cmd), word)
            if sub is None or i == index:
                return "an argument"
            cmd = sub
        else:
            arguments = [p for p in cmd.params if isinstance(p, click.Argument)]
            taken = 0
            for argument in arguments:
                taken += argument.nargs if argument.nargs > 0 else len(args)
                if positional < taken:
                    if i == index:
                        return argument.human_readable_name
                    break
            positional += 1
        i += 1
    return "an argument"


def _check_words(args: list[str]) -> None:
    """Refuse, naming its option, a word no exec could have passed: one with a NUL, or longer
    than the kernel's bound on one argv word."""
    for index, word in enumerate(args):
        if "\x00" in word:
            raise InvalidInput(
                f"{_param_of(args, index)}: {word[:60]!r} holds a NUL character, which no argument can carry; "
                "fix: remove it"
            )
        size = len(word.encode("utf-8", "surrogateescape"))
        if size > MAX_ARG_BYTES:
            raise InvalidInput(
                f"{_param_of(args, index)}: a value of {size:,} bytes, more than the {MAX_ARG_BYTES + 1:,} the "
                f"kernel passes as one argument ({word[:40]!r}...); fix: shorten it"
            )


def _main(argv: list[str] | None) -> None:
    process = sys.modules.get("tp4.core.process")
    if process is not None:  # an earlier run in this interpreter (tests, an embedding program)
        process.host_key_failures.clear()
    try:
        if argv is not None:
            _check_words([str(a) for a in argv])
        rv = cli.main(args=argv, prog_name="tp4", standalone_mode=False)
    except Tp4Error as exc:
        click.echo(f"error: {exc.message}", err=True)
        _exit_for_refusals(exc.message)
        sys.exit(exc.exit_code)
    except click.exceptions.Abort as exc:  # click turns KeyboardInterrupt into Abort
        if isinstance(exc.__cause__, KeyboardInterrupt):
            _stopped()
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        _stopped()
    except StdoutUnwritable:
        raise  # main() says it, after the last flush
    except OSError as exc:
        if exc.errno != errno.ENAMETOOLONG or not _too_long(exc, sys.argv[1:] if argv is None else argv):
            _internal(exc)
        sys.exit(2)
    except Exception as exc:  # a bug in tp4: say so plainly, the traceback only with -v
        _internal(exc)
    _exit_for_refusals()
    sys.exit(rv if isinstance(rv, int) else 0)


def _too_long(exc: OSError, argv: list[str]) -> bool:
    """A path the system refuses as too long (ENAMETOOLONG) is the user's, whatever reads it: say
    which option gave it. False when no argument holds it (then it is tp4's own)."""
    name = str(exc.filename or "")
    args = [str(a) for a in argv]
    # the path the system refused holds the word, or (a parent being made) its start
    found = [
        i
        for i, word in enumerate(args)
        if len(word) > 32 and (word.split("=")[-1][:64] in name or os.path.basename(name)[:64] in word)
    ]
    if not found:
        return False
    index = max(found, key=lambda i: len(args[i]))
    click.echo(
        f"error: {_param_of(args, index)}: a path of {len(args[index]):,} characters, longer than the system "
        f"takes (255 bytes a name, 4,095 a path): {args[index][:40]!r}...; fix: shorten it",
        err=True,
    )
    return True


def _internal(exc: BaseException) -> None:
    """A bug in tp4: said plainly, the traceback only with -v; exit 70. Called in an except block."""
    if _verbose:
        import traceback

        traceback.print_exc()
    click.echo(
        f"error: internal error ({type(exc).__name__}: {exc}); rerun with -v for the traceback and report it",
        err=True,
    )
    sys.exit(70)
