"""The ``tp4`` command. Subcommands live in their own modules and are imported only when used,
so ``tp4 plan`` does not pay for the imports of ``tp4 sources`` or ``tp4 build``; ``logging`` too
is imported only when -v asks for it (tp4.process imports it for the commands that run any).

Start-up cost is measured by bench/bench_plan.py (issue 8 §6: `tp4 plan` <= 150 ms, `tp4 --help`
<= 80 ms)."""

from __future__ import annotations

import gc
import importlib
import sys

# A tp4 run is short, and most of what it allocates is long-lived (the classes and functions of
# click, pydantic and the profile models), which every young-generation collection scans again for
# nothing: at the default threshold (700) the collector ran ~70 times in `tp4 plan`, 3-8 ms of
# its ~175 ms. Collect every 200000 allocations instead, as mypy
# does (mypy/build.py); still bounded for the long commands (build, sources fetch).
if sys.implementation.name == "cpython":
    gc.set_threshold(200_000, 30, 30)

import click  # after the collector is tuned: click's import is part of the cost

from tp4.errors import Tp4Error

# name -> (module, attribute, one-line help shown in `tp4 --help` without importing the module)
SUBCOMMANDS: dict[str, tuple[str, str, str]] = {
    "plan": ("tp4.cli.plan", "plan", "Show the rendered line: env, engine argv and run spec per rank."),
    "profile": ("tp4.cli.profile", "profile", "Check, import and inspect profiles and presets."),
    "sources": ("tp4.cli.sources", "sources", "Pinned sources: list, verify, lock, fetch, diff, hash."),
    "build": ("tp4.cli.build", "build", "Build the OCI image with nix and load it on the head."),
    "distribute": ("tp4.cli.build", "distribute", "Copy the built image to the workers."),
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(SUBCOMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        entry = SUBCOMMANDS.get(name)
        if entry is None:
            return None
        module, attr, _ = entry
        command: click.Command = getattr(importlib.import_module(module), attr)
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


def main(argv: list[str] | None = None) -> None:
    """Console entry point: Tp4Error becomes `error: ...` and its exit code, never a traceback."""
    try:
        rv = cli.main(args=argv, prog_name="tp4", standalone_mode=False)
    except Tp4Error as exc:
        click.echo(f"error: {exc.message}", err=True)
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        sys.exit(130)
    except BrokenPipeError:
        sys.exit(0)
    except Exception as exc:  # a bug in tp4: say so plainly, the traceback only with -v
        if _verbose:
            import traceback

            traceback.print_exc()
        click.echo(f"error: internal error ({type(exc).__name__}: {exc}); rerun with -v for the traceback "
                   "and report it", err=True)
        sys.exit(70)
    sys.exit(rv if isinstance(rv, int) else 0)
