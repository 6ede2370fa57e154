"""The line's watchdog (`tp4 watch`).

It classifies each look at the line with :func:`tp4.serving.linestate.classify`, the one
classification `tp4 status` uses too (ready, busy, wedged, down, booting).

:class:`Watchdog` looks at the line every interval and acts only on a state it saw ``confirm``
consecutive times (default 3); after a look that found the line wedged or down, the confirming
looks follow every ``confirm_interval`` (default 2 s) instead. On ``wedged`` or ``down`` it saves
an evidence bundle under the
line's state directory, stops every rank, serves the line again and verifies it ready as `tp4
serve` does. Restarts are bounded (default 3 an hour) with a back-off that doubles with each
restart in the window; past the bound it stops the line, keeps the evidence and says so. It never
restarts a busy line, nor one found down that `tp4 stop` stopped on purpose (its stop record on
the head, tp4.serving.serve.read_stop): that one is left stopped until it is seen up again.
Every event goes to the echo (stderr), to a JSON-lines file, and to an optional webhook;
:class:`Metrics` serves the Prometheus text format on loopback.
"""

from __future__ import annotations

import http.client
import http.server
import json
import os
import stat
import threading
import time
import urllib.parse
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from tp4.core import privatefiles
from tp4.core.errors import InvalidInput, Tp4Error
from tp4.serving.linestate import STATE_VALUE, LineState, Verdict, classify, stop_words, stopped_on_purpose

if TYPE_CHECKING:
    from tp4.core.apikey import Secret
    from tp4.hosts.nodes import Node
    from tp4.line.plan import Plan
    from tp4.serving.api import Liveness, Tokens
    from tp4.serving.serve import Options as serve_Options

DEFAULT_INTERVAL = 15.0
# a wedge is confirmed within interval + confirm * probe timeout (+ the follow-up reads): 30 s, under
# the goal of 2 intervals + the probe timeout (35 s); docs/watch.md "How fast"
DEFAULT_PROBE_TIMEOUT = 5.0
DEFAULT_CONFIRM = 3
DEFAULT_CONFIRM_INTERVAL = 2.0
DEFAULT_MAX_RESTARTS = 3
DEFAULT_WINDOW = 3600.0
DEFAULT_BACKOFF = 30.0
DEFAULT_METRICS = "127.0.0.1:9478"
LOG_LINES = 200  # each rank's last log lines in an evidence bundle
HISTORY = 100  # the probes an evidence bundle keeps
EXIT_GAVE_UP = 3  # `tp4 watch` stopped the line past the restart bound (the unit does not restart it)

Echo = Callable[[str], None]


# --- a look at the line -------------------------------------------------------------------------


def rank_state(node: Node) -> str:
    """The rank container's state (running, exited, created...), ``absent`` when there is none,
    ``unreachable`` when ssh does not reach the node."""
    proc = node.run(
        [node.runtime, "container", "inspect", "--format", "{{.State.Status}}", node.container],
        check=False,
        timeout=30,
        purpose=f"reading the state of {node.container} on {node.name}",
    )
    if proc.returncode == 255:
        return "unreachable"
    return (proc.stdout.strip() or "absent") if proc.returncode == 0 else "absent"


def observe(
    plan: Plan,
    nodes: Sequence[Node],
    secrets: Mapping[str, Secret],
    probe_timeout: float,
    since: Tokens | None = None,
) -> tuple[dict[str, str], Liveness]:
    """One look at the line: each rank's container state (read in parallel, beside the probe)
    and the liveness probe (``since``: the previous look's reading of the token counters)."""
    from concurrent.futures import ThreadPoolExecutor

    from tp4.hosts.nodes import parallel
    from tp4.serving import api, serve

    with ThreadPoolExecutor(max_workers=1) as pool:
        reading = pool.submit(parallel, nodes, rank_state)
        live = api.probe(serve.endpoint(plan, secrets), probe_timeout, since=since)
        got = reading.result()
    ranks: dict[str, str] = {}
    for node in nodes:
        value = got[node.name]
        ranks[node.name] = "unreachable" if isinstance(value, BaseException) else (str(value or "") or "absent")
    return ranks, live


# --- confirmation and the restart bound ----------------------------------------------------------


@dataclass
class Confirm:
    """A state is acted on only after ``count`` consecutive looks found it (wedged and down; a
    ready, busy or booting look ends the streak)."""

    count: int = DEFAULT_CONFIRM
    state: LineState | None = None
    streak: int = 0

    def see(self, state: LineState) -> bool:
        """Record a look; True when ``state`` is wedged or down and now confirmed."""
        if state == self.state:
            self.streak += 1
        else:
            self.state, self.streak = state, 1
        return state in ("wedged", "down") and self.streak >= self.count


@dataclass
class RestartBudget:
    """At most ``limit`` restarts in any ``window`` seconds; the n-th restart in the window
    waits ``backoff * 2**(n-1)`` seconds first (n from 1)."""

    limit: int = DEFAULT_MAX_RESTARTS
    window: float = DEFAULT_WINDOW
    backoff: float = DEFAULT_BACKOFF
    times: list[float] = field(default_factory=list)

    def recent(self, now: float) -> list[float]:
        self.times = [t for t in self.times if now - t < self.window]
        return self.times

    def allowed(self, now: float) -> bool:
        return len(self.recent(now)) < self.limit

    def wait(self, now: float) -> float:
        """Seconds to wait before the next restart."""
        n = len(self.recent(now))
        return 0.0 if n == 0 else self.backoff * 2 ** (n - 1)

    def record(self, now: float) -> None:
        self.times.append(now)


# --- events ----------------------------------------------------------------------------------------


def read_webhook(path: str) -> str:
    """The webhook URL from its file: the file must be the caller's, mode 0600 (or stricter),
    and hold one http(s) URL. The URL is never shown (it may carry a token)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        raise InvalidInput(
            f"--webhook-file {path}: cannot be read ({exc.strerror}); fix: give a file of mode 0600"
        ) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise InvalidInput(f"--webhook-file {path}: not a regular file; fix: give a file of mode 0600")
        if info.st_mode & 0o077:
            raise InvalidInput(
                f"--webhook-file {path}: others may read it (mode {stat.S_IMODE(info.st_mode):04o}); "
                f"fix: chmod 600 {path}"
            )
        if info.st_uid != os.geteuid():
            raise InvalidInput(f"--webhook-file {path}: owned by another user; fix: a file of your own, mode 0600")
        text = os.read(fd, 8192).decode("utf-8", "replace").strip()
    finally:
        os.close(fd)
    parts = urllib.parse.urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname or any(c.isspace() for c in text):
        raise InvalidInput(f"--webhook-file {path}: does not hold one http(s) URL; fix: write only the URL into it")
    return text


def events_file(path: str) -> Path:
    """--events FILE, checked before the watch starts: its directory exists, and the file is a
    regular file (not a link) or not there yet."""
    p = Path(path)
    if not p.parent.is_dir():
        raise InvalidInput(f"--events {path}: its directory {p.parent} does not exist; fix: create it, or another path")
    try:
        info = p.lstat()
    except FileNotFoundError:
        if not os.access(p.parent, os.W_OK):
            raise InvalidInput(f"--events {path}: {p.parent} is not writable; fix: another path") from None
        return p
    except OSError as exc:
        raise InvalidInput(f"--events {path}: cannot be read ({exc.strerror}); fix: another path") from None
    if not stat.S_ISREG(info.st_mode):
        raise InvalidInput(f"--events {path}: not a regular file; fix: a file path (events are appended to it)")
    if not os.access(p, os.W_OK):
        raise InvalidInput(f"--events {path}: not writable; fix: another path")
    return p


class Events:
    """Where events go: the echo (one line each), a JSON-lines file (appended, mode 0600) and a
    webhook (a POST of the JSON object; a failure is an echoed warning without the URL)."""

    def __init__(
        self, echo: Echo, path: Path | None, webhook: str | None = None, *, clock: Callable[[], float] = time.time
    ) -> None:
        self.echo, self.path, self.webhook, self.clock = echo, path, webhook, clock
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)

    def emit(self, kind: str, state: str, detail: str, **extra: object) -> dict[str, object]:
        event: dict[str, object] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.clock())),
            "event": kind,
            "state": state,
            "detail": detail,
            **extra,
        }
        self.echo(f"watch: {kind}: {state}: {detail}")
        if self.path is not None:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
            try:
                os.write(fd, (json.dumps(event, sort_keys=True) + "\n").encode())
            finally:
                os.close(fd)
        if self.webhook is not None:
            problem = post_json(self.webhook, event)
            if problem:
                self.echo(f"watch: warning: the webhook did not take the event ({problem})")
        return event


def post_json(url: str, doc: object, timeout: float = 10.0) -> str | None:
    """POST ``doc`` as JSON to ``url`` (no proxy consulted); the problem in words (never the
    URL), or None."""
    parts = urllib.parse.urlsplit(url)
    cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    try:
        conn = cls(parts.hostname or "", parts.port, timeout=timeout)
        try:
            conn.request("POST", path, json.dumps(doc).encode(), {"Content-Type": "application/json"})
            resp = conn.getresponse()
            resp.read(65536)
            return None if 200 <= resp.status < 300 else f"HTTP {resp.status}"
        finally:
            conn.close()
    except (OSError, http.client.HTTPException) as exc:
        return type(exc).__name__


# --- metrics ---------------------------------------------------------------------------------------


@dataclass
class Gauges:
    """What the metrics endpoint shows (updated by the watchdog)."""

    line: str = ""
    state: LineState | None = None
    restarts: int = 0
    wedges: int = 0
    ttft: float | None = None  # the last probe's one-token completion time (seconds), when it came
    ranks: dict[str, int] = field(default_factory=dict)  # node -> 1 running, 0 not
    lock: threading.Lock = field(default_factory=threading.Lock)

    def text(self) -> str:
        """The Prometheus text exposition format (version 0.0.4)."""
        line = _label(self.line)
        with self.lock:
            out = [
                "# HELP tp4_line_state The line's state: 0 ready, 1 busy, 2 wedged, 3 down, 4 booting.",
                "# TYPE tp4_line_state gauge",
            ]
            if self.state is not None:
                out.append(f'tp4_line_state{{line="{line}",state="{self.state}"}} {STATE_VALUE[self.state]}')
            out += [
                "# HELP tp4_line_restarts_total Restarts of the line by the watchdog.",
                "# TYPE tp4_line_restarts_total counter",
                f'tp4_line_restarts_total{{line="{line}"}} {self.restarts}',
                "# HELP tp4_wedges_total Confirmed wedges of the line.",
                "# TYPE tp4_wedges_total counter",
                f'tp4_wedges_total{{line="{line}"}} {self.wedges}',
                "# HELP tp4_probe_ttft_seconds Time of the last probe's one-token completion.",
                "# TYPE tp4_probe_ttft_seconds gauge",
            ]
            if self.ttft is not None:
                out.append(f'tp4_probe_ttft_seconds{{line="{line}"}} {self.ttft:.6f}')
            out += ["# HELP tp4_rank_up A rank's container runs.", "# TYPE tp4_rank_up gauge"]
            for node, up in self.ranks.items():
                out.append(f'tp4_rank_up{{line="{line}",node="{_label(node)}"}} {up}')
        return "\n".join(out) + "\n"


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def parse_listen(text: str) -> tuple[str, int] | None:
    """--metrics HOST:PORT (a loopback address unless asked otherwise), or ``off``: None."""
    if text == "off":
        return None
    host, sep, port = text.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise InvalidInput(f"--metrics {text!r}: expected HOST:PORT (e.g. {DEFAULT_METRICS}) or off")
    return host, int(port)


class Metrics:
    """A loopback HTTP server of ``GET /metrics`` in a daemon thread."""

    def __init__(self, gauges: Gauges, listen: tuple[str, int]) -> None:
        gauges_ = gauges

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                if self.path.split("?")[0] != "/metrics":
                    self.send_error(404)
                    return
                body = gauges_.text().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002
                del format, args

        try:
            self.server = http.server.ThreadingHTTPServer(listen, Handler)
        except OSError as exc:
            raise Tp4Error(
                f"--metrics {listen[0]}:{listen[1]}: cannot listen there ({exc.strerror}); "
                "fix: another port, or --metrics off"
            ) from None
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


# --- the watchdog ---------------------------------------------------------------------------------


@dataclass
class Settings:
    interval: float = DEFAULT_INTERVAL
    probe_timeout: float = DEFAULT_PROBE_TIMEOUT
    confirm: int = DEFAULT_CONFIRM
    max_restarts: int = DEFAULT_MAX_RESTARTS
    window: float = DEFAULT_WINDOW
    backoff: float = DEFAULT_BACKOFF
    confirm_interval: float = DEFAULT_CONFIRM_INTERVAL


class GaveUp(Tp4Error):
    """Past the restart bound: the line was stopped and the evidence kept."""


class Look(NamedTuple):
    when: float
    ranks: dict[str, str]
    live: Liveness
    verdict: Verdict

    def to_json(self) -> dict[str, object]:
        return {
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.when)),
            "state": self.verdict.state,
            "detail": self.verdict.detail,
            "ranks": self.ranks,
            "probe": {
                "state": self.live.state,
                "seconds": round(self.live.seconds, 3),
                "health": self.live.health,
                "running": self.live.load.running if self.live.load else None,
                "waiting": self.live.load.waiting if self.live.load else None,
                "progress": self.live.progress,
            },
        }


def watch_dir(plan: Plan) -> Path:
    """The watchdog's directory under the line's state directory (events, evidence)."""
    from tp4.serving import serve

    return serve.runs_dir(plan) / "watch"


class Watchdog:
    """The loop of `tp4 watch` (module docstring). ``look`` and ``restart`` and ``evidence`` are
    the line's (:meth:`for_line`); tests give their own."""

    def __init__(
        self,
        settings: Settings,
        events: Events,
        gauges: Gauges,
        *,
        look: Callable[[Tokens | None], tuple[dict[str, str], Liveness]],
        restart: Callable[[], None],
        stop: Callable[[], list[str]],
        evidence: Callable[[str, Sequence[Look]], Path],
        stopped: Callable[[], Mapping[str, object] | None] = lambda: None,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.settings, self.events, self.gauges = settings, events, gauges
        self.look_, self.restart_, self.stop_, self.evidence_ = look, restart, stop, evidence
        self.stopped_ = stopped  # the line's stop record (`tp4 stop` on purpose), read on a down look
        self.clock, self.sleep = clock, sleep
        self.confirm = Confirm(settings.confirm)
        self.budget = RestartBudget(settings.max_restarts, settings.window, settings.backoff)
        self.history: deque[Look] = deque(maxlen=HISTORY)
        self.last: LineState | None = None
        # the watchdog heals only a line it has seen ready or busy (a line still booting, or one
        # stopped on purpose before the watch began, is left alone until it is up)
        self.armed = False
        self.looks = 0
        self.timed_out = 0
        # the last reading of the token counters, kept while looks time out: the next look's window
        # of progress starts there, so consecutive windows leave no gap (a ready look ends the chain,
        # so that the first look after a wedge is not measured from before it)
        self.since: Tokens | None = None

    def look(self) -> Look:
        ranks, live = self.look_(self.since)
        self.since = live.tokens if live.state in ("busy", "wedged") else None
        # the probes that timed out on consecutive looks, this one included, may all still be in
        # flight; counted up to the confirmation (a wedge is acted on by then), so that the late
        # answers of a slow but progressing line never outnumber its real requests
        self.timed_out = self.timed_out + 1 if live.state in ("busy", "wedged") else 0
        own = min(self.timed_out, self.settings.confirm)
        got = Look(self.clock(), ranks, live, classify(ranks, live, own_in_flight=own))
        self.history.append(got)
        with self.gauges.lock:
            self.gauges.state = got.verdict.state
            self.gauges.ranks = {name: int(s == "running") for name, s in ranks.items()}
            if live.state == "alive":
                self.gauges.ttft = live.seconds
        return got

    def step(self) -> Look:
        """One look, its events, and a restart when a wedge or a down line is confirmed."""
        got = self.look()
        state = got.verdict.state
        self.looks += 1
        if self.looks == 1 and all(s == "unreachable" for s in got.ranks.values()):
            raise Tp4Error(
                "watch: no node of the line answers over ssh ("
                + ", ".join(got.ranks)
                + "); fix: the profile's ssh settings (`tp4 doctor` shows each node)"
            )
        record = self.stopped_() if state == "down" else None
        if record is not None:
            got = got._replace(verdict=stopped_on_purpose(got.verdict, record))
            self.history[-1] = got
        confirmed = self.confirm.see(state)
        if state != self.last:
            self.events.emit("state", state, got.verdict.detail, previous=self.last)
            self.last = state
        if record is not None:  # `tp4 stop` since the last serve: left stopped, healed again once up
            self.confirm = Confirm(self.settings.confirm)
            if self.armed:
                self.armed = False
                self.events.emit(
                    "stopped",
                    state,
                    f"{stop_words(record)}; not healed: the watch heals the line again once it is up (tp4 serve)",
                )
            return got
        if state in ("ready", "busy") and not self.armed:
            self.armed = True
            self.events.emit("armed", state, "the line is up: a wedge or a rank that goes down is healed from now on")
        if confirmed and not self.armed:
            self.confirm = Confirm(self.settings.confirm)
            return got
        if confirmed:
            if state == "wedged":
                with self.gauges.lock:
                    self.gauges.wedges += 1
            self.heal(got)
        return got

    def heal(self, got: Look) -> None:
        state = got.verdict.state
        seen = f"{state} on {self.confirm.streak} consecutive looks: {got.verdict.detail}"
        # the moment of detection (the evidence takes seconds to gather before the restart event)
        self.events.emit("confirmed", state, seen)
        bundle = self.evidence_(state, list(self.history))
        now = self.clock()
        if not self.budget.allowed(now):
            problems = self.stop_()
            self.events.emit(
                "gave-up",
                state,
                f"{seen}; {len(self.budget.recent(now))} restarts within {self.settings.window:g} s already: "
                f"the line is stopped, the evidence is in {bundle}" + ("; " + "; ".join(problems) if problems else ""),
                evidence=str(bundle),
            )
            raise GaveUp(
                f"the line was {state} again after {self.settings.max_restarts} restarts within "
                f"{self.settings.window:g} s: stopped it; evidence in {bundle}; fix what the evidence shows, "
                "then `tp4 serve` and `tp4 watch` again"
            )
        wait = self.budget.wait(now)
        self.events.emit(
            "restart",
            state,
            f"{seen}; evidence in {bundle}; restarting the line" + (f" after {wait:g} s (back-off)" if wait else ""),
            evidence=str(bundle),
            backoff=wait,
        )
        if wait:
            self.sleep(wait)
        self.budget.record(self.clock())
        with self.gauges.lock:
            self.gauges.restarts += 1
        began = self.clock()
        try:
            self.restart_()
        except Tp4Error as exc:
            self.events.emit("restart-failed", "down", exc.message.splitlines()[0])
            self.confirm = Confirm(self.settings.confirm)
            self.confirm.state, self.confirm.streak = "down", self.settings.confirm - 1  # the next down look acts
            self.last = "down"
            return
        self.confirm = Confirm(self.settings.confirm)
        self.last = "ready"
        with self.gauges.lock:
            self.gauges.state = "ready"
        self.events.emit("ready", "ready", f"the line is ready again after {self.clock() - began:.1f} s")

    def confirming(self) -> bool:
        """Whether the next look confirms a wedged or down look (the line armed, the streak short
        of ``confirm``)."""
        c = self.confirm
        return self.armed and c.state in ("wedged", "down") and 0 < c.streak < self.settings.confirm

    def run(self, *, looks: int | None = None) -> None:
        """Look every interval, every confirm interval while confirming (each measured from the
        start of a look to the start of the next); ``looks``: that many, else until interrupted."""
        n = 0
        while looks is None or n < looks:
            began = self.clock()
            self.step()
            n += 1
            if looks is not None and n >= looks:
                return
            every = (
                min(self.settings.confirm_interval, self.settings.interval)
                if self.confirming()
                else self.settings.interval
            )
            self.sleep(max(0.0, every - (self.clock() - began)))


# --- the line's own look, restart and evidence -----------------------------------------------------


def evidence(
    plan: Plan, nodes: Sequence[Node], secrets: Mapping[str, Secret], state: str, history: Sequence[Look], *, sysfs: str
) -> Path:
    """Save what the line shows now under :func:`watch_dir`/evidence/<UTC time>-<state>: each
    rank's last log lines, `tp4 status`'s JSON, the boot record (its signature), the probe
    history, and the RoCE counters doctor reads on each node. Every part that cannot be read is
    noted in ``missing.txt``; nothing here raises for a node that does not answer."""
    from concurrent.futures import ThreadPoolExecutor

    from tp4.hosts import doctor
    from tp4.hosts.nodes import parallel
    from tp4.serving import serve

    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    d = watch_dir(plan) / "evidence" / f"{stamp}-{state}"
    n = 1
    while d.exists():
        n += 1
        d = d.with_name(f"{stamp}-{state}-{n}")
    d.mkdir(parents=True, mode=0o700)
    missing: list[str] = []

    def put(name: str, text: str) -> None:
        privatefiles.replace_file(d / name, text)

    put("probes.jsonl", "".join(json.dumps(h.to_json(), sort_keys=True) + "\n" for h in history))
    stuck = 0  # the watchdog's probes that timed out on the last looks: they may still be in flight
    for look in reversed(history):
        if look.live.state not in ("busy", "wedged"):
            break
        stuck += 1
    # the parts are read at once (the line is down or wedged until the restart: every second
    # here is a second of it); the status takes the last look's probe, made moments ago, instead
    # of a new one that a wedged line would hold for its whole deadline
    with ThreadPoolExecutor(max_workers=3) as pool:
        logs_ = pool.submit(parallel, nodes, lambda node: serve.log_tail(node, LOG_LINES))
        facts_ = pool.submit(
            doctor.gather, plan, nodes, doctor.Limits(sysfs=sysfs, interval=0.0, ping=False, timeout=30)
        )
        last = history[-1].live if history else None
        status_ = pool.submit(serve.status, plan, nodes, secrets, probe_timeout=5, others_in_flight=stuck, live=last)
        logs = logs_.result()
        try:
            put("status.json", json.dumps(status_.result(), indent=2, sort_keys=True))
        except Tp4Error as exc:
            missing.append(f"status: {exc.message.splitlines()[0]}")
        facts = facts_.result()
    for node in nodes:
        got = logs[node.name]
        if isinstance(got, BaseException):
            missing.append(f"{node.name}: log: {getattr(got, 'message', str(got)).splitlines()[0]}")
        else:
            put(f"log-rank{node.rank.rank}-{node.name}.txt", "\n".join(str(x) for x in got) + "\n")  # type: ignore[attr-defined]
    record = serve.load_run(plan)
    if record is not None:
        put("boot.json", json.dumps(record, indent=2, sort_keys=True) + "\n")
    else:
        missing.append("boot.json: no boot record of this line on this head")
    roce: dict[str, object] = {}
    for node in nodes:
        f = facts[node.name]
        if f.error:
            missing.append(f"{node.name}: RoCE counters: {f.error}")
            continue
        roce[node.name] = {k: v for k, v in f.sections.items() if k.startswith("counters ")}
    put("roce-counters.json", json.dumps(roce, indent=2, sort_keys=True) + "\n")
    if missing:
        put("missing.txt", "\n".join(missing) + "\n")
    return d


def restart_line(
    plan: Plan, nodes: Sequence[Node], secrets: Mapping[str, Secret], opts: serve_Options, progress: Echo
) -> None:
    """Stop every rank, then serve the line again and verify it ready as `tp4 serve` does; not
    when `tp4 stop` stopped the line meanwhile (during the back-off, the evidence or this stop):
    then a failed restart, and the next look finds the line stopped on purpose."""
    from tp4.serving import serve

    problems = serve.stop_nodes(nodes, progress)
    if problems:
        raise Tp4Error("the line did not stop: " + "; ".join(problems))
    record = serve.read_stop(nodes[0])
    if record is not None:
        raise Tp4Error(f"{stop_words(record)} during the restart: not served again")
    serve.serve(plan, nodes, secrets, opts, progress, progress)


def stop_line(nodes: Sequence[Node], progress: Echo) -> list[str]:
    from tp4.serving import serve

    return serve.stop_nodes(nodes, progress)


# --- the unit of a plain head ----------------------------------------------------------------------

UNIT_NAME = "tp4-watch.service"


def _unit_word(word: str, *, command: bool = False) -> str:
    """One word of a unit setting, quoted for systemd (systemd.service "Command lines",
    systemd.unit "Specifiers"): in double quotes, backslash and quote escaped, ``%`` doubled (a
    specifier); in a command line (``command``) ``$`` doubled too (a variable there). A word with
    a control character is refused (a unit file is line-based)."""
    if any(ord(c) < 32 or ord(c) == 127 for c in word):
        raise InvalidInput(f"--install: {word!r} holds a control character, which a unit file cannot carry")
    escaped = word.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%")
    if command:
        escaped = escaped.replace("$", "$$")
    return f'"{escaped}"'


def unit_text(argv: Sequence[str], *, user: str, state_home: str) -> str:
    """The systemd unit `tp4 watch --install` writes on a plain head: ``argv`` (the watch itself,
    without --install) as the operator ``user``, its state where that user's `tp4 status` reads it,
    restarted on failure but not after giving up (exit 3), with the sandboxing a service that only
    talks to the network and writes its state directory needs."""
    return "\n".join(
        [
            "# written by `tp4 watch --install` (docs/watch.md)",
            "[Unit]",
            "Description=tp4 watch: the line's watchdog",
            "Wants=network-online.target",
            "After=network-online.target",
            "",
            "[Service]",
            "Type=simple",
            f"User={user}",
            f"Environment={_unit_word('XDG_STATE_HOME=' + state_home)}",
            "ExecStart=" + " ".join(_unit_word(w, command=True) for w in argv),
            "Restart=on-failure",
            "RestartSec=30",
            f"RestartPreventExitStatus={EXIT_GAVE_UP}",
            "NoNewPrivileges=yes",
            "PrivateTmp=yes",
            "ProtectSystem=strict",
            "ProtectHome=read-only",
            f"ReadWritePaths={_unit_word(state_home)}",
            "ProtectKernelTunables=yes",
            "ProtectKernelModules=yes",
            "ProtectControlGroups=yes",
            "RestrictSUIDSGID=yes",
            "LockPersonality=yes",
            "",
            "[Install]",
            "WantedBy=multi-user.target",
            "",
        ]
    )
