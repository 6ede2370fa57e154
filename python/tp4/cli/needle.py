"""`tp4 bench needle`: the long-context check (tp4.measuring.needle) against the line or any
OpenAI-compatible endpoint. The `bench` group (tp4.cli.bench) attaches this command."""

from __future__ import annotations

import json
import os
import secrets as secrets_mod
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import click

from tp4.cli.common import load_served, parse_number, profile_option, ssh_option, strict_option
from tp4.core.errors import InvalidInput, Tp4Error, clip

if TYPE_CHECKING:
    from tp4.measuring import needle as needle_mod
    from tp4.serving.api import Endpoint, Json
    from tp4.line.plan import Plan
    from tp4.hosts.nodes import Node

METHOD = (
    "One chat completion per length at temperature 0 with thinking off: an intro, varied filler made from a seed "
    "(sentence templates filled from word lists, names and numbers; never one repeated token), one sentence giving a "
    "secret passphrase at the set depth of the prompt, and the question for the passphrase. PASS when the answer "
    "contains the passphrase. Prompts are sized in tokens from two calibration requests (usage.prompt_tokens of the "
    "prompt without filler and with a sample of filler); each answer's usage gives the real count. Each length has "
    "its own filler and passphrase, so no prompt shares a prefix with another."
)


def _number(text: str, name: str, low: float, high: float, fix: str, *, integer: bool = False) -> float:
    try:
        return parse_number(text, low, high, integer=integer)
    except ValueError:
        raise InvalidInput(
            f"{name} {clip(text, 40)}: expected {'a whole number' if integer else 'a number'} from {low:g} to {high:g}; fix: {fix}"
        ) from None


def _out_path(value: str | None) -> Path | None:
    if value is None:
        return None
    path = Path(value)
    parent = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise InvalidInput(f"--out {value}: is a directory; fix: name the JSON file to write")
    if path.exists() and not path.is_file():  # the result replaces the file: never a device or a FIFO
        raise InvalidInput(f"--out {value}: is not a regular file; fix: name the JSON file to write")
    if not parent.is_dir():
        raise InvalidInput(f"--out {value}: the directory {parent} does not exist; fix: create it or name another file")
    if not os.access(parent, os.W_OK):
        raise InvalidInput(
            f"--out {value}: the directory {parent} is not writable; fix: name a file in a writable directory"
        )
    return path


def _endpoint(
    url: str | None,
    model: str | None,
    key_file: str | None,
    profile_path: str | None,
    strict: bool,
    ssh_options: tuple[str, ...],
    watch_memory: bool,
) -> tuple[Endpoint, Plan | None, Node | None]:
    from tp4.core import apikey
    from tp4.serving import api

    if url is None:
        for name, given in (("--model", model), ("--api-key-file", key_file)):
            if given is not None:
                raise InvalidInput(
                    f"{name}: only with --url; fix: give --url too, or drop {name} to use the profile's API"
                )
        from tp4.serving import serve

        served = load_served(profile_path, strict, ssh_options)
        plan, nodes, secrets = served.plan, served.nodes, served.secrets
        return serve.endpoint(plan, secrets), plan, nodes[0] if watch_memory else None
    if profile_path is not None:
        raise InvalidInput("--url: with --profile too; fix: give either --url (any endpoint) or --profile (the line)")
    if watch_memory:
        raise InvalidInput(
            "--watch-memory: needs the line's head node, which --url does not name; fix: use --profile instead of --url"
        )
    if not model:
        raise InvalidInput("--model: needed with --url; fix: give the served model name (GET /v1/models lists it)")
    try:
        ep = api.Endpoint.of(url, model)
    except InvalidInput:
        raise InvalidInput(
            f"--url {url[:80]!r}: not an API address of the form http://HOST:PORT; "
            "fix: give the endpoint's address and port, e.g. http://127.0.0.1:8888"
        ) from None
    return ep._replace(key=apikey.read_key(key_file) if key_file else None), None, None


def plan_digest(plan: Plan) -> str:
    return plan.digest


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("tp4")
    except PackageNotFoundError:
        return "unknown"


def document(
    run: needle_mod.Run, ep: Endpoint, plan: Plan | None, config: dict[str, Json], started: str, finished: str
) -> dict[str, Json]:
    import urllib.parse

    release = _version()
    return {
        "status": run.status,
        "label": "needle",
        "started": started,
        "finished": finished,
        "source": {"repo": "tp4", "commit": release, "release": release},
        "node": urllib.parse.urlsplit(ep.url).hostname,
        "config": config,
        "method": METHOD,
        "calibration": run.calibration.to_json() if run.calibration is not None else None,
        "results": [r.to_json() for r in run.results],
        "tp4": {
            "version": release,
            "kind": "needle",
            "plan_digest": plan_digest(plan) if plan is not None else None,
            "image": plan.image.tag if plan is not None else None,
            "profile": plan.source if plan is not None else None,
            "stopped": run.stopped,
            "lengths_done": [r.target_tokens for r in run.results],
        },
    }


def table(run: needle_mod.Run) -> list[str]:
    from tp4.measuring import needle as needle_mod

    watch = any(r.memory is not None for r in run.results)
    head = (
        f"{'length':>10}  {'prompt tokens':>22}  {'depth':>6}  {'time':>9}  {'result':<6}"
        + ("  low-water " if watch else "")
        + "  answer"
    )
    lines = [head]
    for r in run.results:
        dev = r.deviation
        tokens = "-" if r.prompt_tokens is None else f"{r.prompt_tokens:,} ({dev:+.1%})"
        took = "-" if r.seconds is None else f"{r.seconds:.1f} s"
        low = needle_mod.gib(r.memory.low_water if r.memory is not None else None)
        shown = repr(needle_mod.preview(r.answer, 60)) if r.error is None or r.answer else r.error
        lines.append(
            f"{r.target_tokens:>10,}  {tokens:>22}  {r.depth:>6.1%}  {took:>9}  {r.status:<6}"
            + (f"  {low:>10}" if watch else "")
            + f"  {shown}"
        )
    for length in run.lengths[len(run.results) :]:
        lines.append(
            f"{length:>10,}  {'-':>22}  {'-':>6}  {'-':>9}  {'-':<6}" + (f"  {'-':>10}" if watch else "") + "  not run"
        )
    return lines


@click.command("needle")
@profile_option
@click.option(
    "--url",
    default=None,
    metavar="http://HOST:PORT",
    help="Any OpenAI-compatible endpoint instead of the profile's line.",
)
@click.option("--model", default=None, metavar="NAME", help="The served model name (with --url).")
@click.option(
    "--api-key-file",
    default=None,
    metavar="FILE",
    help="The file holding the API key (with --url; the profile's api.key_file otherwise).",
)
@click.option(
    "--lengths",
    "lengths_text",
    default="99000,198000,746000,1011084",
    show_default=True,
    metavar="N[k|M],...",
    help="Prompt lengths in tokens, in the order they run.",
)
@click.option(
    "--depth",
    "depth_text",
    default="0.37",
    show_default=True,
    metavar="FRACTION",
    help="Where the passphrase sits: 0 the start, 1 the end.",
)
@click.option(
    "--seed",
    "seed_text",
    default=None,
    metavar="N",
    help="The filler's and passphrases' seed (default: a random one, shown in the JSON).",
)
@click.option(
    "--timeout",
    "timeout_text",
    default="1800",
    show_default=True,
    metavar="SECONDS",
    help="Seconds each length may take (the line's 1,011,084 tokens took 322-325 s).",
)
@click.option(
    "--max-tokens", "max_tokens_text", default="64", show_default=True, metavar="N", help="Tokens each answer may have."
)
@click.option(
    "--watch-memory",
    is_flag=True,
    help="Poll the head's MemAvailable during each request and record the low-water mark (the profile's head; not with --url).",
)
@click.option(
    "--memory-interval",
    "interval_text",
    default="5",
    show_default=True,
    metavar="SECONDS",
    help="Seconds between two reads of MemAvailable.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as one JSON object instead of the table.")
@click.option("--out", "out_file", default=None, metavar="FILE", help="Also write the result (JSON) to FILE.")
@ssh_option
@strict_option
def needle(
    profile_path: str | None,
    url: str | None,
    model: str | None,
    api_key_file: str | None,
    lengths_text: str,
    depth_text: str,
    seed_text: str | None,
    timeout_text: str,
    max_tokens_text: str,
    watch_memory: bool,
    interval_text: str,
    as_json: bool,
    out_file: str | None,
    ssh_options: tuple[str, ...],
    strict: bool,
) -> None:
    """The long-context check: one secret passphrase in varied filler at a set depth, at each
    length; PASS when the answer gives it back. Per length: the prompt tokens (usage), the time,
    PASS/FAIL, the answer; with --watch-memory the head's MemAvailable low-water mark. Exit 1 when
    a length fails."""
    from tp4.measuring import needle as needle_mod

    lengths = needle_mod.parse_lengths(lengths_text)
    depth = needle_mod.parse_depth(depth_text)
    seed = (
        int(_number(seed_text, "--seed", 0, 2**63 - 1, "a whole number from 0 to 2^63-1", integer=True))
        if seed_text is not None
        else secrets_mod.randbits(63)
    )
    timeout = _number(timeout_text, "--timeout", 1, 7 * 86400, "seconds from 1 to 604800")
    max_tokens = int(_number(max_tokens_text, "--max-tokens", 1, 4096, "a whole number from 1 to 4096", integer=True))
    interval = _number(interval_text, "--memory-interval", 0.2, 600, "seconds from 0.2 to 600")
    out_path = _out_path(out_file)
    ep, plan, head = _endpoint(url, model, api_key_file, profile_path, strict, ssh_options, watch_memory)
    config: dict[str, Json] = {
        "base": ep.url,
        "model": ep.model,
        "lengths": list(lengths),
        "depth": depth,
        "seed": seed,
        "maxTokens": max_tokens,
        "timeout": timeout,
        "temperature": 0,
        "thinking": False,
        "watchMemory": watch_memory,
        "memoryInterval": interval if watch_memory else None,
    }
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    result = needle_mod.run(
        ep,
        lengths,
        depth=depth,
        seed=seed,
        max_tokens=max_tokens,
        timeout=timeout,
        watch=head,
        interval=interval,
        progress=lambda line: click.echo(line, err=True),
    )
    doc = document(result, ep, plan, config, started, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    if out_path is not None:
        tmp = out_path.with_name(f".{out_path.name}.tmp{os.getpid()}")
        try:
            tmp.write_text(json.dumps(doc, indent=2) + "\n")
            tmp.replace(out_path)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise Tp4Error(f"--out {out_path}: cannot be written ({exc.strerror}); fix: name a writable file") from None
    if as_json:
        click.echo(json.dumps(doc, indent=2))
    else:
        for line in table(result):
            click.echo(line)
    if result.status != "PASS":
        failed = [f"{r.target_tokens:,}" for r in result.results if r.status != "PASS"]
        missing = len(result.lengths) - len(result.results)
        why = (f"FAIL at {', '.join(failed)} tokens" if failed else "") + (
            f"{'; ' if failed else ''}{missing} lengths not run ({result.stopped})" if missing else ""
        )
        sys.stdout.flush()
        raise Tp4Error(f"needle: {why}")
