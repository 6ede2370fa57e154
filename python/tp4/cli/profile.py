"""`tp4 profile check | import | show-preset`."""

from __future__ import annotations

import json

import click

from tp4.core import schemas


@click.group()
def profile() -> None:
    """Check, import and inspect profiles and presets."""


@profile.command()
@click.argument("file", type=click.Path())  # tp4.core.userfiles says what a path that is not a file is
@click.option("--strict", is_flag=True, help="Treat warnings (performance caveats) as errors (exit 2).")
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help=f"The check as one JSON object on stdout (schema {schemas.PROFILE_CHECK}), also for an invalid profile.",
)
def check(file: str, strict: bool, as_json: bool) -> None:
    """Validate FILE; every problem is listed with the field and the fix (exit code 2). Warnings
    go to stderr and do not fail the check, unless --strict."""
    from tp4.core.contracts.profile_check import ProfileCheck
    from tp4.core.errors import InvalidInput
    from tp4.line.profile import load_file
    from tp4.line.profile.load import strict as require_no_warnings

    def emit(doc: ProfileCheck) -> None:
        click.echo(json.dumps(doc.model_dump(mode="json", by_alias=True), indent=2))

    try:
        loaded = load_file(
            file, "name an existing profile file (a TOML file such as the one `tp4 profile import` writes)"
        )
        if strict:
            require_no_warnings(loaded)
    except InvalidInput as exc:
        if as_json:  # the document first; the error (stderr, exit 2) as without --json
            emit(
                ProfileCheck(
                    file=file,
                    ok=False,
                    preset=None,
                    nodes=[],
                    tp=None,
                    ep=None,
                    image=None,
                    warnings=[],
                    problems=exc.problems or [exc.message],
                )
            )
        raise
    p = loaded.profile
    if as_json:
        for w in loaded.warnings:
            click.echo(f"warning: {w}", err=True)
        emit(
            ProfileCheck(
                file=file,
                ok=True,
                preset=p.preset,
                nodes=[n.name for n in p.nodes],
                tp=p.engine.tp,
                ep=p.ep,
                image=p.image.tag,
                warnings=list(loaded.warnings),
                problems=[],
            )
        )
        return
    for w in loaded.warnings:
        click.echo(f"warning: {w}", err=True)
    click.echo(f"ok: {file}: preset {p.preset}, {len(p.nodes)} nodes, TP {p.engine.tp}, EP {p.ep}, image {p.image.tag}")


@profile.command("show-preset")
@click.argument(
    "name",
    shell_complete=lambda ctx, param, incomplete: [
        n for n in __import__("tp4.line.profile.load", fromlist=["x"]).preset_names() if n.startswith(incomplete)
    ],
)
@click.option("--merged", is_flag=True, help="Show the preset with every layer below it merged in.")
def show_preset(name: str, merged: bool) -> None:
    """Show preset NAME as TOML: its own layer, or with --merged the whole stack."""
    from tp4.line.profile.load import PRESETS, merged_document, preset_layers
    from tp4.line.profile.toml import dumps

    layers = preset_layers(name)
    if merged:
        doc = merged_document({"preset": name})
        click.echo(f"# preset {name}: layers {' <- '.join(n for n, _ in layers)}")
        click.echo(dumps(doc), nl=False)
    else:
        click.echo((PRESETS / f"{name}.toml").read_text(), nl=False)


@profile.command("import")
@click.argument("env_file", type=click.Path(dir_okay=False))
@click.option("-o", "--output", type=click.Path(dir_okay=False), required=True, help="Profile TOML to write.")
@click.option("--force", is_flag=True, help="Overwrite OUTPUT if it exists.")
@click.option(
    "--head-checkout",
    metavar="DIR",
    help="The head's checkout of the upstream repository (its state-tp4/ is the head's /state); "
    "default: the directory of ENV_FILE.",
)
@click.option(
    "--overlay",
    "overlays",
    metavar="ARM.env",
    multiple=True,
    type=click.Path(dir_okay=False),
    help="An experiment arm (upstream's scripts/tp4/arms/*.env) read after ENV_FILE, as upstream's arm.sh "
    "appends it: its assignments win. Repeatable, in order.",
)
@click.option("--strict", is_flag=True, help="Treat warnings as errors: nothing is written if there is one.")
def import_(
    env_file: str, output: str, force: bool, head_checkout: str | None, overlays: tuple[str, ...], strict: bool
) -> None:
    """Import a bash-syntax upstream profile (.env.tp4) into a tp4 profile.

    The file is read as bash reads it (`set -a; source`), without running it: a construct whose
    value could differ from bash's is refused with its line. $HOME, ~ and $USER are the home and
    name of WORKER_USER, as whom tp4 runs the line; host paths under that home are written ~/...
    The result renders the same container env and engine argv as the upstream launcher would
    for ENV_FILE. Secrets are never imported; unknown variables are reported; warnings are shown
    (errors with --strict); nothing is written unless the result is valid. A file of a line tp4
    does not render (the TP3 .env.example, the TP8 .env.tp8, a GLM line's file) is refused as such.
    An experiment arm imports as an overlay on its base file: `tp4 profile import .env.tp4 --overlay
    scripts/tp4/arms/c-stack-ep1.env -o arm.toml`.
    """
    from tp4.line.profile.legacy import import_env_file
    from tp4.core.userfiles import check_output, write_output

    check_output(output, "profile", force=force)
    result = import_env_file(env_file, overlays=overlays, head_checkout=head_checkout, strict=strict)
    out = write_output(output, result.toml, "profile", force=force)
    click.echo(f"wrote {out}: {result.summary}")
    for note in result.notes:
        click.echo(f"note: {note}", err=True)
    for warning in result.warnings:
        click.echo(f"warning: {warning}", err=True)
    for text in result.unknown_text:
        click.echo(f"unknown: {text}", err=True)


@profile.command()
def reference() -> None:
    """Print the profile reference (Markdown) generated from the models and the adapter registry."""
    from tp4.line.profile.reference import generate

    click.echo(generate())
