"""`tp4 bench decode|prefill|needle`: measure the line (docs/bench.md).

decode and prefill live here (the load generator is tp4.measuring.throughput); ``needle`` is
python/tp4/cli/needle.py's command, imported only when it is used, and left out of the group
when that module is not there."""

from __future__ import annotations

import importlib
import importlib.util
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

import click

from tp4.cli.common import parse_number, profile_option
from tp4.core.errors import InvalidInput, Tp4Error, clip

if TYPE_CHECKING:
    from tp4.measuring.throughput.run import Outcome, Target

# name -> (module, attribute, help); decode and prefill are this module's own
SUBCOMMANDS: dict[str, tuple[str, str, str]] = {
    "decode": (
        "tp4.cli.bench",
        "decode",
        "Decode tok/s and TTFT per prompt type and concurrency (sparkDash's method).",
    ),
    "prefill": (
        "tp4.cli.bench",
        "prefill",
        "Prefill tok/s by prompt length, on a varied filler or real documents (--corpus).",
    ),
    "needle": (
        "tp4.cli.needle",
        "needle",
        "Long-context retrieval: a phrase in filler at a set depth, at the published line's lengths.",
    ),
}

MAX_LEVEL = 256  # streams at once: one connection each (sparkDash allows 32, 128 with rhys101's patch)
MAX_TOKENS = 131072
MAX_PREFILL = 1 << 21
_COUNT = re.compile(r"[0-9]+")


class BenchGroup(click.Group):
    """The subcommands of SUBCOMMANDS, each imported when used; one whose module is absent is
    not offered."""

    def _present(self, name: str) -> bool:
        module = SUBCOMMANDS[name][0]
        try:
            return importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            return False

    def list_commands(self, ctx: click.Context) -> list[str]:
        return [name for name in SUBCOMMANDS if self._present(name)]

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        entry = SUBCOMMANDS.get(name)
        if entry is None or not self._present(name):
            return None
        module, attr, _ = entry
        command = getattr(importlib.import_module(module), attr, None)
        if not isinstance(command, click.Command):
            raise TypeError(f"tp4 bench {name}: {module}.{attr} is not a click command")
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        with formatter.section("Commands"):
            formatter.write_dl([(name, SUBCOMMANDS[name][2]) for name in self.list_commands(ctx)])


@click.group("bench", cls=BenchGroup)
def bench() -> None:
    """Measure the line: decode and prefill speed (sparkDash-compatible result.json), needle."""


# --- values -------------------------------------------------------------------------------------------


def count(field: str, text: str, low: int, high: int, fix: str) -> int:
    """A whole number in [low, high] written in digits ("0", "-1", "1e30", "true", a number
    beyond 64 bits: InvalidInput naming the field)."""
    value = text.strip()
    if not _COUNT.fullmatch(value):
        raise InvalidInput(f"{field}: {text[:40]!r} is not a whole number; fix: {fix}")
    if len(value) > 12:  # digits only, but far beyond any bound (and beyond 64 bits, perhaps)
        raise InvalidInput(f"{field}: {value[:20]}... ({len(value)} digits) is outside {low}..{high}; fix: {fix}")
    number = int(value)
    if not low <= number <= high:
        raise InvalidInput(f"{field}: {number} is outside {low}..{high}; fix: {fix}")
    return number


def counts(field: str, text: str, low: int, high: int, fix: str) -> tuple[int, ...]:
    items = [item.strip() for item in text.split(",")]
    if not text.strip() or any(not item for item in items):
        raise InvalidInput(f"{field}: {text!r} is not a comma-separated list of whole numbers; fix: {fix}")
    values = [count(field, item, low, high, fix) for item in items]
    seen: set[int] = set()
    for v in values:
        if v in seen:
            raise InvalidInput(f"{field}: {v} is given twice; fix: {fix}")
        seen.add(v)
    return tuple(values)


def seconds(field: str, text: str) -> float:
    try:
        return parse_number(text, 1, 86400)
    except ValueError:
        raise InvalidInput(
            f"{field}: {clip(text)} is not a number of seconds in 1..86400; fix: give e.g. {field} 360"
        ) from None


def prompt_types_of(text: str) -> tuple[str, ...]:
    from tp4.measuring.throughput.prompts import TYPES

    items = [item.strip() for item in text.split(",")]
    fix = f"give some of {','.join(TYPES)}, comma-separated"
    if not text.strip() or any(not item for item in items):
        raise InvalidInput(f"--prompt-types: {text!r} is not a comma-separated list; fix: {fix}")
    for item in items:
        if item not in TYPES:
            raise InvalidInput(f"--prompt-types: {item!r} is not a prompt type; fix: {fix}")
    if len(set(items)) != len(items):
        raise InvalidInput(f"--prompt-types: a type is given twice in {text!r}; fix: {fix}")
    return tuple(items)


def target(profile_path: str | None, url: str | None, model: str | None, key_file: str | None) -> Target:
    """The endpoint: the line's (--profile, as `tp4 smoke` finds it) or --url/--model/--api-key-file."""
    from tp4.measuring.throughput.run import Target

    if url is not None:
        if profile_path is not None:
            raise InvalidInput(
                "--url: given with --profile; fix: use one of them (--profile for the line, --url for any endpoint)"
            )
        from tp4.core import apikey
        from tp4.serving import api

        # sparkDash's --base names the /v1 root: take that form too
        base = url.rstrip("/")
        ep = api.Endpoint.of(base[:-3] if base.endswith("/v1") else url, model or "")
        key = apikey.read_key(key_file) if key_file is not None else None
        return Target(ep.url, model or None, key)
    if model is not None or key_file is not None:
        raise InvalidInput(
            f"{'--model' if model is not None else '--api-key-file'}: needs --url; fix: pass --url http://HOST:PORT too, or only --profile"
        )
    from tp4.serving import serve
    from tp4.cli.common import load_line, read_secrets

    plan = load_line(profile_path).plan
    ep = serve.endpoint(plan, read_secrets(plan))
    doc = plan.to_json()
    return Target(
        ep.url,
        ep.model,
        ep.key,
        plan_digest=plan.digest,
        plan=doc,
        image=plan.image.tag,
        pins=_pins(),
        profile=plan.source,
    )


def fleet_target(
    fleet_path: str, profile_path: str | None, url: str | None, model: str | None, key_file: str | None
) -> Target:
    """--fleet: the fleet's router as the endpoint (its URL, the lines' model and key), and each
    line's share of every level from the router's per-worker request counts (its metrics, read on
    the router's host)."""
    from tp4.serving import fleet as fleet_mod
    from tp4.measuring.throughput.run import Target

    given = [
        name
        for name, v in (("--profile", profile_path), ("--url", url), ("--model", model), ("--api-key-file", key_file))
        if v is not None
    ]
    if given:
        raise InvalidInput(
            f"--fleet: given with {given[0]}; fix: use --fleet alone (the router's address, model and key come from the fleet file)"
        )
    f = fleet_mod.load(fleet_path)
    secrets = fleet_mod.read_secrets(f)
    host = fleet_mod.RouterHost(f, fleet_mod.router_remote(f))
    lines = {line.api: line.name for line in f.lines}

    def per_line() -> dict[str, int]:
        text = host.metrics()
        if text is None:
            raise Tp4Error(
                f"--fleet: the router's metrics (http://127.0.0.1:{f.router.metrics.port}/metrics on {host.where}) could not be read; "
                "fix: check the router (`tp4 fleet status`), or bench its endpoint with --url instead"
            )
        return fleet_mod.requests_per_line(text, lines)

    served = f.lines[0].plan.nodes[0].env.get("SERVED_MODEL_NAME")
    key = secrets.get("API_KEY")
    return Target(
        f.url,
        served,
        key,
        image=f.lines[0].plan.image.tag,
        pins=_pins(),
        profile=f.source,
        per_line=per_line,
        lines=tuple(line.name for line in f.lines),
    )


def _pins() -> dict[str, str] | None:
    """component -> commit of the source manifest the image is built from (None when unreadable)."""
    try:
        from tp4.image.sources import manifest

        return {row.name: row.commit for row in manifest.load(manifest.default_path()).rows}
    except (Tp4Error, OSError, ValueError):
        return None


F = TypeVar("F", bound=Callable[..., None])


def _options(options: list[Callable[[F], F]]) -> Callable[[F], F]:
    def apply(fn: F) -> F:
        for option in reversed(options):
            fn = option(fn)
        return fn

    return apply


endpoint_options: list[Callable[[F], F]] = [
    profile_option,
    click.option(
        "--url", default=None, metavar="http://HOST:PORT", help="Any OpenAI-compatible endpoint instead of the line's."
    ),
    click.option("--model", default=None, help="The model name with --url (default: the first of /v1/models)."),
    click.option("--api-key-file", default=None, metavar="FILE", help="The file holding the API key, with --url."),
]
result_options: list[Callable[[F], F]] = [
    click.option(
        "--out", default=None, metavar="DIR", help="Write DIR/result.json after every level; rerun on DIR to resume."
    ),
    click.option(
        "--force", is_flag=True, help="Start over in an --out DIR that holds a finished run or another configuration."
    ),
    click.option("--allow-foreign", is_flag=True, help="Exit 0 even when foreign traffic made a level invalid."),
    click.option("--label", default=None, metavar="TEXT", help="The result's label."),
]


def _check_out(out: str | None) -> None:
    """A bad --out (not a directory, not writable, a result.json that is no tp4 result) is
    refused before the endpoint is asked."""
    if out is not None:
        from tp4.measuring.throughput import result

        result.read(result.prepare_out(out, create=False))


def _done(outcome: Outcome, lines: list[str], allow_foreign: bool) -> None:
    """Print the summary; foreign traffic (unless allowed) or failed streams: exit 1."""
    for line in lines:
        click.echo(line)
    if outcome.path is not None:
        click.echo(f"result: {outcome.path}")
    problems: list[str] = []
    if outcome.invalid:
        problems.append(
            f"{len(outcome.invalid)} level(s) invalid (foreign traffic):\n  " + "\n  ".join(outcome.invalid)
        )
    if outcome.failed:
        problems.append(f"{len(outcome.failed)} level(s) with failed streams:\n  " + "\n  ".join(outcome.failed))
    if outcome.failed or (outcome.invalid and not allow_foreign):
        fix = (
            "fix: rerun when nothing else uses the line, or pass --allow-foreign to accept it"
            if outcome.invalid and not outcome.failed
            else "fix: check the line (`tp4 status`, `tp4 logs`) and rerun"
        )
        raise Tp4Error("\n".join(problems) + "\n" + fix)
    if outcome.invalid:
        click.echo("warning: " + problems[0], err=True)


@bench.command("decode")
@_options(endpoint_options)
@click.option(
    "--levels", metavar="LIST", default="1,2,4,8,16", show_default=True, help="Concurrencies, comma-separated."
)
@click.option(
    "--max-tokens",
    metavar="N",
    default="256",
    show_default=True,
    help="New tokens per stream (min_tokens = max_tokens).",
)
@click.option(
    "--prompt-types",
    metavar="LIST",
    default="structured,prose,code,json",
    show_default=True,
    help="Prompt types, comma-separated.",
)
@click.option("--trials", metavar="N", default="1", show_default=True, help="Runs of each level above c1.")
@click.option("--c1-runs", metavar="N", default="5", show_default=True, help="Runs of c1 (report their median).")
@click.option(
    "--warmup", metavar="N", default="2", show_default=True, help="Discarded warm-up requests per prompt type."
)
@click.option(
    "--same-prompts",
    is_flag=True,
    help="One prompt for every stream at every level (per-stream values compare across levels).",
)
@click.option(
    "--shared-prefix", is_flag=True, help="No salt line: streams share their prompt's prefix (sparkDash's behaviour)."
)
@click.option("--timeout", metavar="SECONDS", default="360", show_default=True, help="Seconds one stream may take.")
@click.option(
    "--fleet",
    "fleet_path",
    default=None,
    metavar="FILE",
    help="A fleet file (tp4 fleet): bench its router, and record each line's share of every level.",
)
@_options(result_options)
def decode(
    profile_path: str | None,
    url: str | None,
    model: str | None,
    api_key_file: str | None,
    levels: str,
    max_tokens: str,
    prompt_types: str,
    trials: str,
    c1_runs: str,
    warmup: str,
    same_prompts: bool,
    shared_prefix: bool,
    timeout: str,
    fleet_path: str | None,
    out: str | None,
    force: bool,
    allow_foreign: bool,
    label: str | None,
) -> None:
    """Decode speed as sparkDash measures it: per prompt type and concurrency, aggregate and
    per-stream tok/s and TTFT; result.json in sparkDash's format with --out."""
    from tp4.measuring.throughput.run import DecodeConfig, Progress, decode_summary, run_decode

    cfg = DecodeConfig(
        levels=counts(
            "--levels", levels, 1, MAX_LEVEL, f"give concurrencies in 1..{MAX_LEVEL}, comma-separated, e.g. 1,2,4,8,16"
        ),
        max_tokens=count(
            "--max-tokens", max_tokens, 2, MAX_TOKENS, f"give 2..{MAX_TOKENS} (decode tokens are completion tokens - 1)"
        ),
        types=prompt_types_of(prompt_types),
        trials=count("--trials", trials, 1, 1000, "give 1..1000"),
        c1_runs=count("--c1-runs", c1_runs, 1, 1000, "give 1..1000"),
        warmup=count("--warmup", warmup, 0, 100, "give 0..100"),
        same_prompts=same_prompts,
        shared_prefix=shared_prefix,
        timeout=seconds("--timeout", timeout),
    )
    _check_out(out)
    where = (
        fleet_target(fleet_path, profile_path, url, model, api_key_file)
        if fleet_path is not None
        else target(profile_path, url, model, api_key_file)
    )
    outcome = run_decode(cfg, where, out=out, force=force, label=label, progress=Progress())
    _done(outcome, decode_summary(outcome.doc), allow_foreign)


@bench.command("prefill")
@_options(endpoint_options)
@click.option(
    "--sizes",
    metavar="LIST",
    default="4096,16384,32768,65536,131072,262144",
    show_default=True,
    help="Prompt lengths in tokens, comma-separated.",
)
@click.option("--passes", metavar="N", default="2", show_default=True, help="Passes over the sizes.")
@click.option("--max-tokens", metavar="N", default="8", show_default=True, help="New tokens per request.")
@click.option(
    "--corpus", default=None, metavar="DIR", help="Real documents: the text files under DIR, joined to each length."
)
@click.option(
    "--timeout",
    metavar="SECONDS",
    default=None,
    help="Seconds one request may take (default: 60 + 8 ms per token, at least 90).",
)
@_options(result_options)
def prefill(
    profile_path: str | None,
    url: str | None,
    model: str | None,
    api_key_file: str | None,
    sizes: str,
    passes: str,
    max_tokens: str,
    corpus: str | None,
    timeout: str | None,
    out: str | None,
    force: bool,
    allow_foreign: bool,
    label: str | None,
) -> None:
    """Prefill speed by prompt length: one request at a time, a unique salt line first (no
    prefix-cache hit), a varied filler or --corpus text sized to each length; two passes."""
    from tp4.measuring.throughput.run import PrefillConfig, Progress, prefill_summary, run_prefill

    cfg = PrefillConfig(
        sizes=counts(
            "--sizes", sizes, 64, MAX_PREFILL, f"give prompt lengths in 64..{MAX_PREFILL} tokens, comma-separated"
        ),
        passes=count("--passes", passes, 1, 100, "give 1..100"),
        max_tokens=count("--max-tokens", max_tokens, 1, 1024, "give 1..1024"),
        corpus=corpus,
        timeout=None if timeout is None else seconds("--timeout", timeout),
    )
    from tp4.measuring.throughput.prompts import load_corpus

    documents = (
        load_corpus(corpus) if corpus is not None else None
    )  # a bad directory is refused before the endpoint is asked
    _check_out(out)
    where = target(profile_path, url, model, api_key_file)
    outcome = run_prefill(cfg, where, out=out, force=force, label=label, progress=Progress(), corpus=documents)
    _done(outcome, prefill_summary(outcome.doc), allow_foreign)
