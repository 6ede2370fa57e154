"""`tp4 watch`: the line's watchdog in the foreground (tp4.serving.watch)."""

from __future__ import annotations

import sys

import click

from tp4.cli.common import (
    Float,
    Int,
    err,
    load_served,
    profile_option,
    ssh_option,
    strict_option,
    sysfs_option,
    sysfs_root,
)


@click.command("watch")
@profile_option
@click.option("--interval", type=Float(0.1, 3600), default=15, show_default=True, help="Seconds between looks.")
@click.option(
    "--probe-timeout",
    type=Float(0.1, 600),
    default=10,
    show_default=True,
    help="Seconds the one-token completion may take before the line is busy or wedged.",
)
@click.option(
    "--confirm",
    type=Int(1, 100),
    default=3,
    show_default=True,
    help="Consecutive looks that must find the line wedged or down before it is restarted.",
)
@click.option("--max-restarts", type=Int(0, 100), default=3, show_default=True, help="Restarts allowed per window.")
@click.option("--window", type=Float(1, 7 * 86400), default=3600, show_default=True, help="The window, in seconds.")
@click.option(
    "--backoff",
    type=Float(0, 86400),
    default=30,
    show_default=True,
    help="Seconds before the 2nd restart in the window; doubles with each further one.",
)
@click.option(
    "--events",
    "events_out",
    default=None,
    metavar="FILE",
    help="The JSON-lines event file (default: events.jsonl in the line's watch directory).",
)
@click.option(
    "--webhook-file",
    default=None,
    metavar="FILE",
    help="A file (mode 0600) holding a URL that receives each event as a JSON POST.",
)
@click.option(
    "--metrics",
    default="127.0.0.1:9478",
    show_default=True,
    metavar="HOST:PORT|off",
    help="Where the Prometheus metrics are served (GET /metrics).",
)
@click.option("--looks", type=Int(1, 10**9), default=None, hidden=True, help="Stop after this many looks (tests).")
@sysfs_option
@ssh_option
@strict_option
def watch(
    profile_path: str | None,
    interval: float,
    probe_timeout: float,
    confirm: int,
    max_restarts: int,
    window: float,
    backoff: float,
    events_out: str | None,
    webhook_file: str | None,
    metrics: str,
    looks: int | None,
    sysfs: str,
    ssh_options: tuple[str, ...],
    strict: bool,
) -> None:
    """Watch the line and heal it: every interval, a one-token completion with a deadline, the
    engine's running and waiting requests and every rank's container state classify the line as
    ready, busy, wedged, down or booting (as `tp4 status` does). Wedged or down on --confirm
    consecutive looks: the evidence is saved, every rank stopped, the line served again and
    verified ready. Never restarts a busy line. Past --max-restarts in --window it stops the line
    and exits 3."""
    from tp4.serving import serve as serve_mod
    from tp4.serving import watch as w

    sysfs = sysfs_root(sysfs)
    listen = w.parse_listen(metrics)
    webhook = w.read_webhook(webhook_file) if webhook_file else None
    if events_out:
        w.events_file(events_out)
    served = load_served(profile_path, strict, ssh_options)
    plan, nodes, secrets = served.plan, served.nodes, served.secrets
    loaded = served.line.loaded
    opts = serve_mod.Options(
        tty=False,
        sysfs=sysfs,
        volume_kind="nfs" if loaded.profile.nfs.share else "local",
        expected_shards=loaded.profile.model.expected_shards,
        replace=True,
    )
    settings = w.Settings(interval, probe_timeout, confirm, max_restarts, window, backoff)
    path = w.events_file(events_out) if events_out else w.watch_dir(plan) / "events.jsonl"
    events = w.Events(err, path, webhook)
    gauges = w.Gauges(line=serve_mod.line_id(plan))
    server = w.Metrics(gauges, listen) if listen else None
    dog = w.Watchdog(
        settings,
        events,
        gauges,
        look=lambda: w.observe(plan, nodes, secrets, probe_timeout),
        restart=lambda: w.restart_line(plan, nodes, secrets, opts, err),
        stop=lambda: w.stop_line(nodes, err),
        evidence=lambda state, history: w.evidence(plan, nodes, secrets, state, history, sysfs=sysfs),
    )
    events.emit(
        "start",
        "",
        f"watching {plan.line.api} every {interval:g} s (probe {probe_timeout:g} s, confirm {confirm}, "
        f"at most {max_restarts} restarts in {window:g} s)"
        + (f"; metrics on http://{listen[0]}:{server.port}/metrics" if listen and server else ""),
    )
    try:
        dog.run(looks=looks)
    except w.GaveUp as exc:
        err(f"error: {exc.message}")
        sys.exit(w.EXIT_GAVE_UP)
    finally:
        if server is not None:
            server.close()
