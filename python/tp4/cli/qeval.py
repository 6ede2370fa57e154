"""`tp4 qeval`: the quality suite against the line's API (or any OpenAI-compatible endpoint), its
code run in a throwaway container on a worker, never on the head (docs/qeval.md)."""

from __future__ import annotations

import json
import math
import urllib.parse
from typing import TYPE_CHECKING

import click

from tp4.cli.common import Float, Int, load_served, profile_option, ssh_option, strict_option
from tp4.core.errors import InvalidInput, Tp4Error

if TYPE_CHECKING:
    from collections.abc import Mapping

    from tp4.serving.api import Endpoint
    from tp4.core.apikey import Secret
    from tp4.line.plan import Plan
    from tp4.measuring.qeval.sandbox import Limits, Sandbox
    from tp4.measuring.qeval.suite import TaskResult
    from tp4.hosts.nodes import Node


def _ids(value: str | None) -> list[str]:
    if value is None:
        return []
    ids = [v.strip() for v in value.split(",")]
    if not all(ids):
        raise InvalidInput(
            f"--only {value[:80]!r}: an empty id; fix: a comma-separated list of task ids, e.g. code_rle,math_gcd"
        )
    return ids


def _head_names(plan: Plan | None, url: str) -> set[str]:
    names = {urllib.parse.urlsplit(url).hostname or ""} - {""}
    if plan is not None:
        head = plan.nodes[0]
        names |= {head.ssh.host, head.host} - {""}
    return names


def _worker(plan: Plan, nodes: list[Node], name: str | None) -> Node:
    workers = [n for n in nodes if n.rank.rank > 0]
    if name is None:
        if not workers:
            raise InvalidInput(
                "--sandbox-node: the profile has no worker, and model-generated code never runs on the head; "
                "fix: --sandbox-host a machine that is not the head"
            )
        return workers[0]
    found = [n for n in nodes if n.name == name]
    if not found:
        raise InvalidInput(
            f"--sandbox-node {name[:60]!r}: no node of that name; fix: one of the workers "
            f"{', '.join(n.name for n in workers) or '(none)'}"
        )
    if found[0].rank.rank == 0:
        raise InvalidInput(
            f"--sandbox-node {name}: {name} is the head (rank 0); model-generated code never runs on the head; "
            f"fix: name a worker: {', '.join(n.name for n in workers) or '(none)'}"
        )
    return found[0]


def _sandbox(
    plan: Plan | None,
    nodes: list[Node],
    ep: Endpoint,
    *,
    node_name: str | None,
    host: str | None,
    image: str | None,
    runtime: str,
    ssh_options: tuple[str, ...],
    limits: Limits,
) -> Sandbox | None:
    from dataclasses import replace

    from tp4.measuring.qeval import sandbox as sb

    if node_name is not None and host is not None:
        raise InvalidInput(
            "--sandbox-node and --sandbox-host: give one; fix: a worker of the profile (--sandbox-node) or an ssh target"
        )
    if node_name is not None and plan is None:
        raise InvalidInput(
            "--sandbox-node: names a worker of the profile, and --url was given without --profile; "
            "fix: add --profile, or use --sandbox-host"
        )
    remote = sb.parse_host(host) if host not in (None, "local") else None
    image = sb.check_image(image) if image is not None else (plan.image.tag if plan is not None else None)
    heads = _head_names(plan, ep.url)
    if host is None and plan is None:
        return None
    if image is None:
        raise InvalidInput(
            "--sandbox-image: no image to run code in (no profile gives the line's image); "
            "fix: name an image with python3 that the sandbox host holds"
        )
    if host == "local":
        # the head is this machine when the API's or the profile's head address is loopback,
        # unspecified or one of this machine's own
        if sb.this_machine({a for n in heads for a in sb.resolve(n)}) is not None:
            raise InvalidInput(
                f"--sandbox-host local: this machine serves the API ({ep.url}), so it is the head; model-generated "
                "code never runs on the head; fix: run tp4 qeval from a worker, or --sandbox-host a worker"
            )
        return sb.Sandbox(image, "this machine", None, runtime, limits)
    if remote is not None:
        remote = replace(remote, options=tuple(ssh_options))
        sb.refuse_head(remote.host, heads, f"--sandbox-host {host}")
        return sb.Sandbox(image, remote.destination, remote, runtime, limits)
    assert plan is not None
    node = _worker(plan, nodes, node_name)
    sb.refuse_head(node.rank.ssh.host, heads, f"--sandbox-node {node.name}")
    return sb.Sandbox(image, node.name, node.remote, node.runtime, limits)


def _endpoint(
    plan: Plan | None, secrets: Mapping[str, Secret], url: str | None, model: str | None, key_file: str | None
) -> Endpoint:
    from tp4.core import apikey
    from tp4.serving import api
    from tp4.serving import serve as serve_mod

    key = apikey.read_key(key_file) if key_file else None
    if plan is not None:
        ep = serve_mod.endpoint(plan, secrets, url=url)
        return api.Endpoint(ep.url, model or ep.model, key if key_file else ep.key)
    assert url is not None
    return api.Endpoint.of(url, model or "default", key)


def _line_of(result: TaskResult, width: int) -> str:
    return f"{'PASS' if result.passed else 'FAIL'} {result.id:<{width}} {result.seconds:6.1f} s  {result.reason}"


@click.command("qeval")
@profile_option
@click.option(
    "--url",
    default=None,
    metavar="http://HOST:PORT",
    help="The API (default: the profile's line.api); with --profile it overrides the profile's.",
)
@click.option(
    "--model",
    default=None,
    metavar="NAME",
    help="The served model name (default: the profile's SERVED_MODEL_NAME, else `default`).",
)
@click.option(
    "--api-key-file",
    type=click.Path(dir_okay=False),
    default=None,
    help="A file holding the API key (default: the profile's api.key_file).",
)
@click.option(
    "--sandbox-node",
    default=None,
    metavar="NAME",
    help="The worker of the profile that runs model-generated code (default: the first worker).",
)
@click.option(
    "--sandbox-host",
    default=None,
    metavar="[USER@]HOST[:PORT]|local",
    help="Run model-generated code over ssh on this host (never the head), or `local`: on this machine, when it does not serve the API.",
)
@click.option(
    "--sandbox-image",
    default=None,
    metavar="IMAGE",
    help="The image with python3 the code runs in (default: the line's image).",
)
@click.option(
    "--sandbox-runtime",
    type=click.Choice(["podman", "docker"]),
    default="podman",
    show_default=True,
    help="The container runtime of --sandbox-host (a profile's node: the node's runtime).",
)
@click.option(
    "--code-seconds",
    type=Float(1, 600),
    default=10.0,
    show_default=True,
    help="Wall-clock limit of one code task's run.",
)
@click.option("--only", default=None, metavar="ID,...", help="Only these tasks.")
@click.option(
    "--kind",
    "kinds",
    multiple=True,
    type=click.Choice(["code", "json", "numeric", "format", "prose"]),
    help="Only tasks of this kind; repeatable.",
)
@click.option(
    "--baseline",
    default=None,
    type=click.Path(dir_okay=False),
    metavar="FILE",
    help="Compare with a stored baseline: newly failing and newly passing tasks.",
)
@click.option(
    "--fail-below",
    type=Int(0, 100000),
    default=None,
    metavar="N",
    help="Exit 1 when fewer than N tasks pass.",
)
@click.option("--timeout", type=Float(1, 7200), default=300.0, show_default=True, help="Seconds one answer may take.")
@click.option("--label", default=None, help="A label stored with the results (default: the model and the API address).")
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print the results document (JSON) instead of the table; progress goes to stderr.",
)
@click.option(
    "--out",
    default=None,
    type=click.Path(dir_okay=False),
    metavar="FILE",
    help="Also write the results document to FILE (replaced atomically).",
)
@click.option("--list", "list_only", is_flag=True, help="List the tasks and exit.")
@ssh_option
@strict_option
def qeval(
    profile_path: str | None,
    url: str | None,
    model: str | None,
    api_key_file: str | None,
    sandbox_node: str | None,
    sandbox_host: str | None,
    sandbox_image: str | None,
    sandbox_runtime: str,
    code_seconds: float,
    only: str | None,
    kinds: tuple[str, ...],
    baseline: str | None,
    fail_below: int | None,
    timeout: float,
    label: str | None,
    as_json: bool,
    out: str | None,
    list_only: bool,
    ssh_options: tuple[str, ...],
    strict: bool,
) -> None:
    """Score the line on tp4's own quality suite (code run against hidden asserts, JSON checked
    against a schema, numeric answers, format constraints, prose checked for degeneration; no
    LLM judge). One request at a time, temperature 0, thinking off.

    Model-generated code runs only on a worker (rank > 0) inside a throwaway container: no
    network, read-only root, a tmpfs /tmp as its only writable path, CPU, memory, process and
    time limits, no capabilities. Exit 1 when fewer than --fail-below tasks pass."""
    from tp4.measuring.qeval import suite
    from tp4.measuring.qeval.checks import Code
    from tp4.measuring.qeval.sandbox import Limits
    from tp4.measuring.qeval.tasks import suite_digest

    tasks = suite.select(_ids(only), kinds)
    if list_only:
        width = max(len(t.id) for t in tasks)
        for t in tasks:
            click.echo(f"{t.id:<{width}}  {t.kind:<7} {t.max_tokens:>4}  {t.prompt[:90]}")
        return
    if fail_below is not None and fail_below > len(tasks):
        raise InvalidInput(
            f"--fail-below {fail_below}: only {len(tasks)} tasks are selected, so the run could never pass; "
            f"fix: at most {len(tasks)}"
        )
    if not math.isfinite(code_seconds):
        raise InvalidInput("--code-seconds: expected a number of seconds")
    base = suite.load_baseline(baseline) if baseline is not None else None
    if out is not None:
        from tp4.core.userfiles import check_output

        check_output(out, "--out", force=True)
    plan: Plan | None = None
    nodes: list[Node] = []
    secrets: dict[str, Secret] = {}
    if url is None or profile_path is not None:
        served = load_served(profile_path, strict, ssh_options)
        plan, nodes, secrets = served.plan, served.nodes, served.secrets
    ep = _endpoint(plan, secrets, url, model, api_key_file)
    needs_code = any(isinstance(t.scorer, Code) for t in tasks)
    sandbox = (
        _sandbox(
            plan,
            list(nodes),
            ep,
            node_name=sandbox_node,
            host=sandbox_host,
            image=sandbox_image,
            runtime=sandbox_runtime,
            ssh_options=ssh_options,
            limits=Limits(seconds=code_seconds),
        )
        if needs_code or sandbox_host or sandbox_node
        else None
    )
    if needs_code and sandbox is None:
        raise InvalidInput(
            "code tasks need a sandbox on a worker; fix: --profile (its first worker), --sandbox-host WORKER, "
            "or leave the code tasks out (--kind json --kind numeric ...)"
        )
    width = max(len(t.id) for t in tasks)

    def progress(result: TaskResult, i: int, n: int) -> None:
        line = _line_of(result, width)
        if as_json:
            click.echo(f"[{i}/{n}] {line}", err=True)
        else:
            click.echo(line)

    started = suite.now()
    results = suite.run(tasks, ep, sandbox, timeout=timeout, progress=progress)
    doc = suite.results_doc(
        results,
        ep=ep,
        sandbox=sandbox,
        started=started,
        finished=suite.now(),
        label=label if label is not None else f"{ep.model} at {ep.url}",
        baseline=base,
        baseline_path=baseline,
    )
    if out is not None:
        from tp4.core.userfiles import write_output

        write_output(out, json.dumps(doc, indent=2, ensure_ascii=False) + "\n", "--out", force=True)
    passed = sum(r.passed for r in results)
    if as_json:
        click.echo(json.dumps(doc, indent=2, ensure_ascii=False))
    else:
        kinds_line = ", ".join(f"{k} {p}/{t}" for k, (p, t) in suite.by_kind(results).items())
        click.echo(f"score: {passed}/{len(results)} passed ({kinds_line})")
        if base is not None:
            diff = suite.compare(base, results)
            click.echo(
                f"baseline {baseline} ({base.label or 'no label'}): "
                f"{len(diff.newly_failing)} newly failing, {len(diff.newly_passing)} newly passing"
                + (f", {len(diff.not_in_baseline)} not in the baseline" if diff.not_in_baseline else "")
            )
            for tid in diff.newly_failing:
                click.echo(f"  newly failing: {tid}")
            for tid in diff.newly_passing:
                click.echo(f"  newly passing: {tid}")
            if base.suite not in (None, suite_digest()):
                click.echo("  note: the baseline was recorded with another version of the suite (tp4.suite differs)")
    if fail_below is not None and passed < fail_below:
        raise Tp4Error(f"qeval: {passed} of {len(results)} tasks passed, below --fail-below {fail_below}")
