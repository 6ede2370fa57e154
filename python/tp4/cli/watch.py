"""`tp4 watch`: the line's watchdog in the foreground (tp4.serving.watch)."""

from __future__ import annotations

import sys
from pathlib import Path

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
    default=5,
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
@click.option(
    "--confirm-interval",
    type=Float(0, 3600, low_open=True),
    default=None,
    help="Seconds between the looks that confirm a wedged or down look, at most --interval.  [default: 2, or --interval when shorter]",
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
@click.option(
    "--install",
    is_flag=True,
    help="Write the systemd unit tp4-watch.service (this watch, as you) into --unit-dir instead of watching.",
)
@click.option(
    "--unit-dir",
    default="/etc/systemd/system",
    show_default=True,
    metavar="DIR",
    help="Where --install writes the unit.",
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
    confirm_interval: float | None,
    max_restarts: int,
    window: float,
    backoff: float,
    events_out: str | None,
    webhook_file: str | None,
    metrics: str,
    install: bool,
    unit_dir: str,
    looks: int | None,
    sysfs: str,
    ssh_options: tuple[str, ...],
    strict: bool,
) -> None:
    """Watch the line and heal it: every interval, a one-token completion with a deadline, the
    engine's running and waiting requests, its token counters (/metrics: progress) and every
    rank's container state classify the line as ready, busy, wedged, down or booting (as `tp4
    status` does). Wedged or down on --confirm consecutive looks (--confirm-interval apart): the
    evidence is saved, every rank stopped, the line served again and verified ready. Never
    restarts a busy line, nor one `tp4 stop` stopped (until it is up again). Past --max-restarts
    in --window it stops the line and exits 3."""
    from tp4.serving import serve as serve_mod
    from tp4.serving import watch as w

    sysfs = sysfs_root(sysfs)
    if confirm_interval is None:
        confirm_interval = min(w.DEFAULT_CONFIRM_INTERVAL, interval)
    elif confirm_interval > interval:
        from tp4.core.errors import InvalidInput

        raise InvalidInput(
            f"--confirm-interval {confirm_interval:g}: longer than --interval {interval:g}; "
            "fix: a confirm interval of at most the interval (the looks that confirm a wedge come sooner, not later)"
        )
    if install or unit_dir != "/etc/systemd/system":
        _unit_dir(unit_dir)
    listen = w.parse_listen(metrics)
    webhook = w.read_webhook(webhook_file) if webhook_file else None
    if events_out:
        w.events_file(events_out)
    served = load_served(profile_path, strict, ssh_options)
    if install:
        from pathlib import Path

        options = [
            *("--interval", f"{interval:g}", "--probe-timeout", f"{probe_timeout:g}", "--confirm", str(confirm)),
            *("--confirm-interval", f"{confirm_interval:g}"),
            *("--max-restarts", str(max_restarts), "--window", f"{window:g}", "--backoff", f"{backoff:g}"),
            *(["--events", str(Path(events_out).resolve())] if events_out else []),
            *(["--webhook-file", str(Path(webhook_file).resolve())] if webhook_file else []),
            *("--metrics", metrics),
            *(["--sysfs", sysfs] if sysfs != "/sys" else []),
            *[f"--ssh-option={o}" for o in ssh_options],
            *(["--strict"] if strict else []),
        ]
        _install(unit_dir, served.line.choice.path, options)
        return
    plan, nodes, secrets = served.plan, served.nodes, served.secrets
    loaded = served.line.loaded
    opts = serve_mod.Options(
        tty=False,
        sysfs=sysfs,
        volume_kind="nfs" if loaded.profile.nfs.share else "local",
        expected_shards=loaded.profile.model.expected_shards,
        replace=True,
    )
    settings = w.Settings(interval, probe_timeout, confirm, max_restarts, window, backoff, confirm_interval)
    path = w.events_file(events_out) if events_out else w.watch_dir(plan) / "events.jsonl"
    events = w.Events(err, path, webhook)
    gauges = w.Gauges(line=serve_mod.line_id(plan))
    server = w.Metrics(gauges, listen) if listen else None
    dog = w.Watchdog(
        settings,
        events,
        gauges,
        look=lambda since: w.observe(plan, nodes, secrets, probe_timeout, since),
        restart=lambda: w.restart_line(plan, nodes, secrets, opts, err),
        stop=lambda: w.stop_line(nodes, err),
        evidence=lambda state, history: w.evidence(plan, nodes, secrets, state, history, sysfs=sysfs),
        stopped=lambda: serve_mod.read_stop(nodes[0]),
    )
    events.emit(
        "start",
        "",
        f"watching {plan.line.api} every {interval:g} s (probe {probe_timeout:g} s, confirm {confirm} "
        f"every {confirm_interval:g} s, "
        f"at most {max_restarts} restarts in {window:g} s)"
        + (f"; metrics on http://{listen[0]}:{server.port}/metrics" if listen and server else ""),
    )
    if "--enable-metrics" not in plan.nodes[0].argv:
        # busy is told from wedged by SGLang's token counters, which only --enable-metrics serves
        events.emit(
            "warning",
            "",
            "the line's engine runs without --enable-metrics, so its token counters (/metrics) cannot tell a "
            "wedge that holds requests running from a busy line: such a wedge is taken for busy and not healed; "
            'fix: engine.extra_args = ["--enable-metrics"] in the profile, then tp4 serve (or tp4 up)',
        )
    try:
        dog.run(looks=looks)
    except w.GaveUp as exc:
        err(f"error: {exc.message}")
        sys.exit(w.EXIT_GAVE_UP)
    finally:
        if server is not None:
            server.close()


def _install(unit_dir: str, profile: str | None, options: list[str]) -> None:
    """Write tp4-watch.service: this watch (its options as given, paths made absolute) as the
    current user, its state where that user's `tp4 status` reads it."""
    import getpass
    from pathlib import Path

    from tp4.core import dirs, privatefiles
    from tp4.core.errors import InvalidInput
    from tp4.serving import watch as w

    d = _unit_dir(unit_dir)
    if profile is None:
        raise InvalidInput("--install: the line's profile is the embedded example; fix: --profile FILE")
    argv = [sys.executable, "-m", "tp4", "watch", "--profile", str(Path(profile).resolve()), *options]
    text = w.unit_text(argv, user=getpass.getuser(), state_home=str(dirs.state_dir().parent))
    path = d / w.UNIT_NAME
    try:
        privatefiles.replace_file(path, text, 0o644)
    except OSError as exc:
        raise InvalidInput(
            f"--unit-dir {unit_dir}: cannot write {w.UNIT_NAME} ({exc.strerror}); fix: run as root, or another --unit-dir"
        ) from None
    click.echo(f"wrote {path}; start it: systemctl daemon-reload && systemctl enable --now {w.UNIT_NAME}")


def _unit_dir(unit_dir: str) -> Path:
    """--unit-dir, checked before anything runs: an existing directory."""
    import os
    import stat

    from tp4.core.errors import InvalidInput

    try:
        is_dir = stat.S_ISDIR(os.stat(unit_dir).st_mode)
    except (OSError, ValueError):
        is_dir = False
    if not is_dir:
        raise InvalidInput(
            f"--unit-dir {unit_dir!r}: not a directory; fix: the systemd unit directory (/etc/systemd/system)"
        )
    return Path(unit_dir)
