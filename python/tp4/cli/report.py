"""`tp4 report RESULT…`: bench results against a reference (tables on stdout, PNG charts)."""

from __future__ import annotations

from pathlib import Path

import click

from tp4.measuring import report as report_mod
from tp4.core.errors import InvalidInput


@click.command("report")
@click.argument("results", nargs=-1, required=True, metavar="RESULT...")
@click.option(
    "--reference",
    default=report_mod.DEFAULT_REFERENCE,
    show_default=True,
    metavar="NAME|FILE",
    help="A shipped reference (v2.1: the published line), a reference data file, or a result file to compare with.",
)
@click.option(
    "--tolerance",
    default="5",
    show_default=True,
    metavar="PCT",
    help="Flag differences from the reference beyond this many percent.",
)
@click.option(
    "--fail-on-regression",
    "fail_on",
    default=None,
    metavar="PCT",
    help="Exit 1 when a judged value is worse than the reference by more than PCT percent (exactly PCT is not).",
)
@click.option(
    "--out",
    "out_dir",
    default=None,
    metavar="DIR",
    help="Where the PNG charts go (default: the current directory; never beside a RESULT, which may be an archive or the checkout).",
)
@click.option("--no-charts", is_flag=True, help="Write no chart.")
@click.option("--json", "as_json", is_flag=True, help="Print the comparison as JSON.")
def report(
    results: tuple[str, ...],
    reference: str,
    tolerance: str,
    fail_on: str | None,
    out_dir: str | None,
    no_charts: bool,
    as_json: bool,
) -> None:
    """Compare bench results (tp4 bench's or sparkDash's result.json, or the directories holding
    them) with a reference: aggregate and per-stream decode tok/s and TTFT by prompt type and
    concurrency, prefill tok/s by length, each with the difference in percent (docs/report.md)."""
    if out_dir == "":
        raise InvalidInput("--out: the directory is empty; fix: name a directory, or leave --out out")
    tol = report_mod.parse_percent(tolerance, "--tolerance")
    threshold = None if fail_on is None else report_mod.parse_percent(fail_on, "--fail-on-regression")
    runs = [report_mod.read_result(arg) for arg in results]
    ref = report_mod.read_reference(reference)
    compared = report_mod.compare(runs, ref, tol, threshold)
    charts: list[Path] = []
    if not no_charts:
        from tp4.measuring.charts import write_charts

        charts = write_charts(compared, Path(out_dir).expanduser() if out_dir is not None else Path("."))
    if as_json:
        click.echo(report_mod.render_json(compared, charts), nl=False)
    else:
        click.echo(report_mod.render_text(compared), nl=False)
        for chart in charts:
            click.echo(f"chart: {chart}")
    if compared.regressions:
        click.echo(
            f"regression: {len(compared.regressions)} value(s) worse than the reference by more than "
            f"{float(threshold or 0):g} %",
            err=True,
        )
        raise SystemExit(1)
