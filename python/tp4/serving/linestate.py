"""The line's state, one classification for `tp4 status` and `tp4 watch` (tp4.serving.watch).

:func:`classify` turns what a look at the line found (each rank's container state, the liveness
probe of :func:`tp4.serving.api.probe`: a one-token completion with a deadline, read against
``/health`` and the engine's running and waiting request counts when it does not come) into one
of five states:

* ``ready``: every rank runs and a one-token completion came back in time;
* ``busy``: every rank runs, no completion in time, but requests are running or waiting and
  progressing (SGLang's token counters grew while the probe waited);
* ``wedged``: every rank runs, the API answers (or errs), no completion in time, and nothing
  running or waiting, or requests in flight of which none progresses (the wedge of b12x#313 and
  sparkring#215: ``/health`` at 200, nothing generated). When the engine has no ``/metrics``
  (no --enable-metrics), progress is unknown: requests in flight beyond the watcher's own
  timed-out probes count as busy, as the detail says;
* ``down``: a rank's container is gone, stopped or its node unreachable;
* ``booting``: every rank's container runs (or is being started) but the API takes no connection
  yet.

A line `tp4 stop` stopped on purpose is still ``down``: :func:`stopped_on_purpose` says so in
the detail, from the stop record `tp4 stop` leaves on the head (tp4.serving.serve.read_stop);
`tp4 status` shows it and `tp4 watch` leaves such a line stopped.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Literal, NamedTuple

if TYPE_CHECKING:
    from tp4.serving.api import Liveness

LineState = Literal["ready", "busy", "wedged", "down", "booting"]
STATES: tuple[LineState, ...] = ("ready", "busy", "wedged", "down", "booting")
# the value of tp4_line_state: one number per state (a gauge; the label carries the name too)
STATE_VALUE = {s: i for i, s in enumerate(STATES)}
# a container that is being started, not one that stopped (podman's and docker's words)
STARTING = ("created", "configured", "initialized", "restarting")


class Verdict(NamedTuple):
    state: LineState
    detail: str


def classify(ranks: Mapping[str, str], live: Liveness, *, own_in_flight: int = 0) -> Verdict:
    """The line's state from each rank's container state (node name -> ``running``, ``exited``,
    ``absent``, ``unreachable``, ...) and the liveness probe. A rank that does not run makes the
    line down whatever the API says (a wedged survivor would never recover alone).

    ``own_in_flight``: how many of the caller's own probes may still be in flight (a probe that
    timed out is abandoned, but a wedged engine still counts it as running or waiting: it never
    gets to the abort). When the probe could not tell progress (no /metrics), a line whose running
    and waiting requests could all be those probes has nothing in flight that progresses: wedged,
    not busy. When it could, progress alone decides."""
    gone = {name: s for name, s in ranks.items() if s != "running" and s not in STARTING}
    if gone:
        return Verdict("down", "; ".join(f"{name}: rank {s or 'absent'}" for name, s in gone.items()))
    starting = [name for name, s in ranks.items() if s in STARTING]
    if live.state == "alive":
        return Verdict("ready", live.detail)
    if live.state == "busy":
        if live.progress is False:
            return Verdict("wedged", f"requests in flight, but none progresses: {live.detail}")
        if live.progress is True:
            return Verdict("busy", f"requests in flight and progressing: {live.detail}")
        load = live.load
        if load is not None and load.running + load.waiting <= own_in_flight:
            return Verdict(
                "wedged",
                f"no completion in time, and the {load.running + load.waiting} request(s) running or waiting "
                f"may all be this watcher's own {own_in_flight} timed-out probe(s): nothing else is in flight",
            )
        return Verdict("busy", live.detail)
    if live.state == "down":  # no connection: the engine is not listening (yet)
        if starting:
            return Verdict("booting", f"{', '.join(starting)} starting; {live.detail}")
        return Verdict("booting", f"every rank runs, the API takes no connection yet ({live.detail})")
    # wedged, or the API answered with an error instead of a token
    return Verdict("wedged", live.detail)


def stop_words(record: Mapping[str, object]) -> str:
    """A stop record in words: ``stopped by tp4 stop at <UTC time> (<user>@<host>)``."""
    by, when, where = record.get("by") or "tp4 stop", record.get("when") or "an unknown time", record.get("from")
    return f"stopped by {by} at {when}" + (f" ({where})" if where else "")


def stopped_on_purpose(verdict: Verdict, record: Mapping[str, object] | None) -> Verdict:
    """A down line with a stop record (the ranks were stopped on purpose, not lost): still down,
    its detail saying so first. Any other verdict, or no record, is returned as it is."""
    if verdict.state != "down" or record is None:
        return verdict
    return Verdict("down", f"{stop_words(record)}, on purpose; {verdict.detail}")
