"""`tp4 watch`'s core without a cluster: the classification `tp4 status` shares (progress read from
SGLang's token counters), the confirmation of a wedge over consecutive looks and its timing, the
restart bound and its back-off, the events (file, webhook read from a file of mode 0600), the
Prometheus text on loopback, a line `tp4 stop` stopped on purpose left stopped."""

from __future__ import annotations

import http.server
import json
import os
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tp4.core.errors import InvalidInput, Tp4Error
from tp4.serving import api
from tp4.serving.api import Liveness, Load, Tokens
from tp4.serving import watch as w
from tp4.serving.linestate import classify, stopped_on_purpose

RUNNING = {"a": "running", "b": "running"}
ALIVE = Liveness("alive", "one token in 0.05 s", 0.05, 200)
BUSY = Liveness("busy", "no completion within 2 s, but 4 running and 1 waiting", 2.0, 200, Load(4, 1))
WEDGED = Liveness(
    "wedged", "health 200 but no completion within 2 s, and nothing running or waiting", 2.0, 200, Load(0, 0)
)
NOCONN = Liveness("down", "connection refused", 0.0)
ERROR = Liveness("error", "HTTP 503", 0.1, 200)


@pytest.mark.parametrize(
    ("ranks", "live", "state"),
    [
        (RUNNING, ALIVE, "ready"),
        (RUNNING, BUSY, "busy"),
        (RUNNING, WEDGED, "wedged"),
        (RUNNING, ERROR, "wedged"),
        (RUNNING, NOCONN, "booting"),
        ({"a": "running", "b": "created"}, NOCONN, "booting"),
        ({"a": "running", "b": "exited"}, ALIVE, "down"),  # a survivor answering does not make the line ready
        ({"a": "running", "b": "absent"}, WEDGED, "down"),
        ({"a": "running", "b": "unreachable"}, BUSY, "down"),
        ({"a": "exited", "b": "exited"}, NOCONN, "down"),
    ],
)
def test_one_classification(ranks: dict[str, str], live: Liveness, state: str) -> None:
    got = classify(ranks, live)
    assert got.state == state
    if state == "down":
        assert all(f"{n}: rank" in got.detail for n, s in ranks.items() if s not in ("running", "created"))


def test_requests_that_may_all_be_the_probes_own_are_no_progress() -> None:
    one = Liveness("busy", "no completion within 2 s, but 1 running and 0 waiting", 2.0, 200, Load(1, 0))
    assert classify(RUNNING, one).state == "busy"
    got = classify(RUNNING, one, own_in_flight=1)
    assert got.state == "wedged" and "own 1 timed-out probe(s)" in got.detail
    assert classify(RUNNING, BUSY, own_in_flight=3).state == "busy"  # 5 in flight: others' too
    assert classify(RUNNING, BUSY, own_in_flight=5).state == "wedged"


def test_the_watchdog_counts_its_own_stuck_probes(tmp_path: Path) -> None:
    stuck = [Liveness("busy", "x", 2.0, 200, Load(n, 0)) for n in (1, 2, 3)]
    fake = Fake([(RUNNING, ALIVE)] + [(RUNNING, s) for s in stuck] + [(RUNNING, ALIVE)])
    dog, _ = fake.dog(tmp_path)
    dog.run(looks=5)
    assert fake.restarts == 1 and fake.bundles[0] == ("wedged", ["ready", "wedged", "wedged", "wedged"])


def test_a_wedge_is_acted_on_only_after_k_consecutive_looks() -> None:
    c = w.Confirm(3)
    assert [c.see(s) for s in ("wedged", "wedged", "busy", "wedged", "wedged")] == [False] * 5
    assert c.see("wedged") is True
    c = w.Confirm(3)
    assert [c.see(s) for s in ("busy",) * 10] == [False] * 10  # busy is never acted on
    c = w.Confirm(2)
    assert [c.see(s) for s in ("down", "down")] == [False, True]


def test_the_restart_budget_backs_off_and_is_bounded() -> None:
    b = w.RestartBudget(limit=3, window=3600, backoff=30)
    assert b.allowed(0) and b.wait(0) == 0
    b.record(0)
    assert b.wait(10) == 30
    b.record(40)
    assert b.wait(50) == 60
    b.record(110)
    assert not b.allowed(120)
    assert b.allowed(3601) and b.wait(3601) == 60  # the first restart left the window


class Fake:
    """A line for the watchdog: a script of looks; restarts and stops recorded."""

    def __init__(
        self,
        looks: list[tuple[dict[str, str], Liveness]],
        fail_restart: bool = False,
        records: dict[int, dict[str, object]] | None = None,
    ) -> None:
        self.looks, self.restarts, self.stops, self.bundles = list(looks), 0, 0, []
        self.fail_restart = fail_restart
        self.records = records or {}  # look number (from 0) -> the stop record `tp4 stop` left then
        self.looked, self.read_records = 0, 0
        self.now = 1000.0
        self.slept: list[float] = []
        self.sinces: list[Tokens | None] = []
        self.restarted_at: list[float] = []

    def look(self, since: Tokens | None = None) -> tuple[dict[str, str], Liveness]:
        self.looked += 1
        self.sinces.append(since)
        ranks, live = self.looks.pop(0)
        self.now += live.seconds  # the probe takes its time (its deadline when it timed out)
        return ranks, live

    def stopped(self) -> dict[str, object] | None:
        self.read_records += 1
        return self.records.get(self.looked - 1)

    def restart(self) -> None:
        from tp4.core.errors import Tp4Error

        self.restarts += 1
        self.restarted_at.append(self.now)
        if self.fail_restart:
            raise Tp4Error("node2: rank exited: boom")

    def stop(self) -> list[str]:
        self.stops += 1
        return []

    def evidence(self, state: str, history: list[w.Look]) -> Path:
        self.bundles.append((state, [h.verdict.state for h in history]))
        return Path(f"/evidence/{len(self.bundles)}")

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.now += s

    def dog(self, tmp_path: Path, **settings: float) -> tuple[w.Watchdog, list[str]]:
        echoed: list[str] = []
        events = w.Events(echoed.append, tmp_path / "events.jsonl", clock=lambda: self.now)
        dog = w.Watchdog(
            w.Settings(**settings),  # type: ignore[arg-type]
            events,
            w.Gauges(line="l"),
            look=self.look,
            restart=self.restart,
            stop=self.stop,
            evidence=self.evidence,
            stopped=self.stopped,
            clock=lambda: self.now,
            sleep=self.sleep,
        )
        return dog, echoed


def events(tmp_path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]


def test_a_busy_line_is_never_restarted(tmp_path: Path) -> None:
    fake = Fake([(RUNNING, BUSY)] * 20)
    dog, _ = fake.dog(tmp_path, interval=15)
    dog.run(looks=20)
    assert fake.restarts == 0 and fake.bundles == []
    assert [(e["event"], e["state"]) for e in events(tmp_path)] == [("state", "busy"), ("armed", "busy")]
    assert fake.slept == [13.0] * 19  # each busy probe took its 2 s deadline of the 15 s interval


def test_a_wedge_confirmed_three_times_saves_the_evidence_and_restarts(tmp_path: Path) -> None:
    fake = Fake(
        [(RUNNING, ALIVE), (RUNNING, WEDGED), (RUNNING, WEDGED), (RUNNING, BUSY)]
        + [(RUNNING, WEDGED)] * 3
        + [(RUNNING, ALIVE)]
    )
    dog, echoed = fake.dog(tmp_path)
    dog.run(looks=8)
    assert fake.restarts == 1
    assert fake.bundles == [("wedged", ["ready", "wedged", "wedged", "busy", "wedged", "wedged", "wedged"])]
    kinds = [(e["event"], e["state"]) for e in events(tmp_path)]
    assert kinds == [
        ("state", "ready"),
        ("armed", "ready"),
        ("state", "wedged"),
        ("state", "busy"),
        ("state", "wedged"),
        ("confirmed", "wedged"),
        ("restart", "wedged"),
        ("ready", "ready"),
    ]
    assert any("evidence in /evidence/1" in line for line in echoed)
    assert dog.gauges.wedges == 1 and dog.gauges.restarts == 1


def test_past_the_bound_the_line_is_stopped_and_the_watchdog_says_so(tmp_path: Path) -> None:
    fake = Fake([(RUNNING, BUSY)] + [({"a": "running", "b": "exited"}, ALIVE)] * 6)
    dog, _ = fake.dog(tmp_path, confirm=1, max_restarts=2, backoff=30)
    with pytest.raises(w.GaveUp, match="after 2 restarts within 3600 s: stopped it; evidence in /evidence/3"):
        dog.run(looks=7)
    assert fake.restarts == 2 and fake.stops == 1
    assert 30.0 in fake.slept  # the second restart waited the back-off
    assert [e["event"] for e in events(tmp_path)][-1] == "gave-up"


def test_a_restart_that_fails_is_an_event_and_the_next_down_look_acts(tmp_path: Path) -> None:
    fake = Fake(
        [(RUNNING, ALIVE)] + [(RUNNING, WEDGED)] * 2 + [({"a": "absent", "b": "absent"}, NOCONN)] * 2, fail_restart=True
    )
    dog, _ = fake.dog(tmp_path, confirm=2, backoff=0)
    dog.run(looks=5)
    assert fake.restarts == 3  # after a failed restart each look that finds the line down acts
    assert [e["event"] for e in events(tmp_path)].count("restart-failed") == 3


def test_a_line_never_seen_up_is_not_healed_and_no_node_answering_is_an_error(tmp_path: Path) -> None:
    fake = Fake(
        [({"a": "absent", "b": "absent"}, NOCONN)] * 5
        + [(RUNNING, NOCONN), (RUNNING, ALIVE)]
        + [({"a": "exited", "b": "running"}, NOCONN)] * 3
    )
    dog, _ = fake.dog(tmp_path)
    dog.run(looks=10)
    assert fake.restarts == 1 and fake.bundles[0][0] == "down"
    assert [e["event"] for e in events(tmp_path)] == [
        *("state", "state", "state", "armed", "state"),
        *("confirmed", "restart", "ready"),
    ]
    fake = Fake([({"a": "unreachable", "b": "unreachable"}, NOCONN)])
    dog, _ = fake.dog(tmp_path)
    with pytest.raises(Tp4Error, match=r"no node of the line answers over ssh \(a, b\)"):
        dog.run(looks=1)


STOP = {"by": "tp4 stop", "when": "2026-12-04T16:10:05Z", "from": "op@head"}
GONE = {"a": "absent", "b": "absent"}


def test_a_line_stopped_on_purpose_is_still_down_and_says_so() -> None:
    down = classify(GONE, NOCONN)
    got = stopped_on_purpose(down, STOP)
    assert got.state == "down"
    assert got.detail.startswith("stopped by tp4 stop at 2026-12-04T16:10:05Z (op@head), on purpose; a: rank absent")
    assert stopped_on_purpose(down, None) == down
    ready = classify(RUNNING, ALIVE)
    assert stopped_on_purpose(ready, STOP) == ready  # a record does not make a line that is up down


def test_a_line_stopped_by_tp4_stop_is_not_healed_and_is_watched_again_once_served(tmp_path: Path) -> None:
    """ready; `tp4 stop` (the ranks gone, its record on the head): not healed however long it stays
    down, the event `stopped`, disarmed; `tp4 serve` (record gone, booting, ready): armed again;
    then a rank that is lost without a record is healed."""
    fake = Fake(
        [(RUNNING, ALIVE)]
        + [(GONE, NOCONN)] * 6
        + [(RUNNING, NOCONN), (RUNNING, ALIVE)]
        + [({"a": "running", "b": "exited"}, NOCONN)] * 2,
        records=dict.fromkeys(range(1, 7), STOP),
    )
    dog, echoed = fake.dog(tmp_path, confirm=2)
    dog.run(looks=9)
    assert fake.restarts == 0 and fake.bundles == [] and fake.stops == 0
    assert fake.read_records == 6  # read on the down looks only
    kinds = [(e["event"], e["state"]) for e in events(tmp_path)]
    assert kinds == [
        ("state", "ready"),
        ("armed", "ready"),
        ("state", "down"),
        ("stopped", "down"),
        ("state", "booting"),
        ("state", "ready"),
        ("armed", "ready"),
    ]
    stopped = next(e for e in events(tmp_path) if e["event"] == "stopped")
    assert stopped["detail"] == (
        "stopped by tp4 stop at 2026-12-04T16:10:05Z (op@head); not healed: "
        "the watch heals the line again once it is up (tp4 serve)"
    )
    down = next(e for e in events(tmp_path) if e["state"] == "down")
    assert "on purpose" in str(down["detail"]) and "a: rank absent" in str(down["detail"])
    assert [h.verdict.state for h in dog.history][1:7] == ["down"] * 6
    assert "on purpose" in dog.history[3].verdict.detail  # the evidence's probe history says so too
    assert any(line.startswith("watch: stopped: down: stopped by tp4 stop") for line in echoed)
    dog.run(looks=2)  # a rank lost after the serve, no record: healed
    assert fake.restarts == 1 and fake.bundles[0][0] == "down"
    assert [e["event"] for e in events(tmp_path)][-4:] == ["state", "confirmed", "restart", "ready"]


def test_a_stop_while_down_but_not_yet_confirmed_is_not_healed(tmp_path: Path) -> None:
    """A rank lost, then `tp4 stop` before the watch confirmed the loss: the operator's stop wins."""
    lost = {"a": "running", "b": "exited"}
    fake = Fake([(RUNNING, ALIVE), (lost, NOCONN), (GONE, NOCONN), (GONE, NOCONN)], records={2: STOP, 3: STOP})
    dog, _ = fake.dog(tmp_path, confirm=2)
    dog.run(looks=4)
    assert fake.restarts == 0 and [e["event"] for e in events(tmp_path)].count("stopped") == 1


@pytest.mark.parametrize("make", ["missing/x", "dir", "fifo", "link"])
def test_a_bad_events_file_is_refused(tmp_path: Path, make: str) -> None:
    p = tmp_path / make
    if make == "dir":
        p.mkdir()
    elif make == "fifo":
        os.mkfifo(p)
    elif make == "link":
        p.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(InvalidInput, match="--events"):
        w.events_file(str(p))
    assert w.events_file(str(tmp_path / "ok.jsonl")) == tmp_path / "ok.jsonl"


def test_the_events_file_is_private(tmp_path: Path) -> None:
    e = w.Events(lambda _: None, tmp_path / "d" / "events.jsonl")
    e.emit("state", "ready", "x")
    assert (tmp_path / "d" / "events.jsonl").stat().st_mode & 0o777 == 0o600


@pytest.fixture
def hook() -> Iterator[tuple[str, list[dict[str, object]]]]:
    got: list[dict[str, object]] = []

    class H(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            got.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *a: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/hook?token=s3cret", got
    server.shutdown()


def test_the_webhook_gets_each_event_and_its_url_is_never_shown(
    tmp_path: Path, hook: tuple[str, list[dict[str, object]]]
) -> None:
    url, got = hook
    f = tmp_path / "hook"
    f.write_text(url + "\n")
    f.chmod(0o600)
    echoed: list[str] = []
    e = w.Events(echoed.append, tmp_path / "events.jsonl", w.read_webhook(str(f)))
    e.emit("restart", "wedged", "x")
    assert got and got[0]["event"] == "restart"
    bad = w.Events(echoed.append, None, "http://127.0.0.1:1/hook?token=s3cret")
    bad.emit("state", "down", "y")
    assert "the webhook did not take the event" in echoed[-1]
    assert not any("s3cret" in line for line in echoed)
    assert "s3cret" not in (tmp_path / "events.jsonl").read_text()


@pytest.mark.parametrize(
    ("mode", "text", "why"),
    [
        (0o644, "http://h/x", "others may read it (mode 0644); fix: chmod 600"),
        (0o600, "not a url", "does not hold one http(s) URL"),
        (0o600, "http://h/x http://other/", "does not hold one http(s) URL"),
    ],
)
def test_a_bad_webhook_file_is_refused(tmp_path: Path, mode: int, text: str, why: str) -> None:
    f = tmp_path / "hook"
    f.write_text(text)
    f.chmod(mode)
    with pytest.raises(InvalidInput, match="--webhook-file") as exc:
        w.read_webhook(str(f))
    assert why in exc.value.message and "h/x" not in exc.value.message
    with pytest.raises(InvalidInput, match="cannot be read"):
        w.read_webhook(str(tmp_path / "none"))
    os.symlink(f, tmp_path / "link")
    with pytest.raises(InvalidInput, match="cannot be read"):
        w.read_webhook(str(tmp_path / "link"))


def test_metrics_on_loopback(tmp_path: Path) -> None:
    fake = Fake([({"a": "running", "b": "running"}, ALIVE), ({"a": "running", "b": "exited"}, NOCONN)])
    dog, _ = fake.dog(tmp_path, confirm=5)
    server = w.Metrics(dog.gauges, ("127.0.0.1", 0))
    try:
        dog.step()
        text = urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics").read().decode()
        assert 'tp4_line_state{line="l",state="ready"} 0' in text
        assert 'tp4_probe_ttft_seconds{line="l"} 0.050000' in text
        assert 'tp4_rank_up{line="l",node="b"} 1' in text
        assert 'tp4_line_restarts_total{line="l"} 0' in text and 'tp4_wedges_total{line="l"} 0' in text
        dog.step()
        text = urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics").read().decode()
        assert 'tp4_line_state{line="l",state="down"} 3' in text and 'tp4_rank_up{line="l",node="b"} 0' in text
    finally:
        server.close()


@pytest.mark.parametrize("bad", ["9478", "host:", ":80", "h:0", "h:70000", "h:x"])
def test_a_bad_metrics_address_is_refused(bad: str) -> None:
    with pytest.raises(InvalidInput, match="--metrics"):
        w.parse_listen(bad)
    assert w.parse_listen("off") is None and w.parse_listen("127.0.0.1:9478") == ("127.0.0.1", 9478)


def test_install_writes_a_unit_systemd_accepts_with_the_watch_argv_intact(tmp_path: Path) -> None:
    """`tp4 watch --install` on a plain head: systemd-analyze verifies the unit, and systemd
    parses ExecStart= back into exactly the argv (a path with a space, % and $ included)."""
    import shutil
    import subprocess
    import sys

    assert shutil.which("systemd-analyze"), "systemd-analyze (package systemd) is needed"
    repo = Path(__file__).resolve().parent.parent
    units = tmp_path / "units"
    units.mkdir()
    odd = tmp_path / "ev 50%$HOME.jsonl"
    proc = subprocess.run(
        [sys.executable, "-m", "tp4", "watch", "--install", "--unit-dir", str(units)]
        + ["--profile", str(repo / "examples/fleet/profile.toml"), "--events", str(odd), "--interval", "5"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(repo / "python"), "XDG_STATE_HOME": str(tmp_path / "state")},
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    unit = units / "tp4-watch.service"
    assert f"wrote {unit}" in proc.stdout and unit.stat().st_mode & 0o777 == 0o644
    text = unit.read_text()
    assert "RestartPreventExitStatus=3" in text and "NoNewPrivileges=yes" in text
    assert f'ReadWritePaths="{tmp_path / "state"}"' in text
    verify = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert verify.returncode == 0, verify.stderr
    words = [w.replace("$$", "$").replace("%%", "%") for w in _exec_words(text)]
    assert words[:4] == [sys.executable, "-m", "tp4", "watch"]
    assert words[words.index("--events") + 1] == str(odd)
    assert words[words.index("--interval") + 1] == "5"


def _exec_words(text: str) -> list[str]:
    import shlex

    line = next(x for x in text.splitlines() if x.startswith("ExecStart="))
    return shlex.split(line.removeprefix("ExecStart="))


def test_a_word_a_unit_cannot_carry_is_refused() -> None:
    with pytest.raises(InvalidInput, match="control character"):
        w.unit_text(["tp4", "a\nb"], user="u", state_home="/s")


# --- progress: SGLang's token counters ------------------------------------------------------------

SGLANG_METRICS = """\
# HELP sglang:realtime_tokens_total Total number of tokens processed (updated on each log interval). mode: prefill_compute, prefill_cache, decode.
# TYPE sglang:realtime_tokens_total counter
sglang:realtime_tokens_total{engine_type="unified",model_name="m",pp_rank="0",tp_rank="0",mode="prefill_compute"} 300.0
sglang:realtime_tokens_total{engine_type="unified",model_name="m",pp_rank="0",tp_rank="0",mode="decode"} 40.0
sglang:realtime_tokens_total{model_name="a } \\" brace",mode="decode"} 2 1700000000000
# HELP sglang:generation_tokens_total Number of generation tokens processed.
# TYPE sglang:generation_tokens_total counter
sglang:generation_tokens_total{is_streaming="false",model_name="m"} 120.0
sglang:generation_tokens_total{is_streaming="true",model_name="m"} 1e3
sglang:generation_tokens_created{model_name="m"} 1.7e9
sglang:num_running_reqs{model_name="m"} 4.0
"""


def test_the_counters_are_summed_over_their_label_sets() -> None:
    got = api.parse_counters(SGLANG_METRICS)
    assert got == {"sglang:realtime_tokens_total": 342.0, "sglang:generation_tokens_total": 1120.0}
    assert "sglang:prompt_tokens_total" not in got  # a counter never exported is absent, not 0


@pytest.mark.parametrize(
    "line",
    [
        "sglang:prompt_tokens_total NaN",
        "sglang:prompt_tokens_total +Inf",
        "sglang:prompt_tokens_total -5",
        "sglang:prompt_tokens_total 1e400",  # beyond a float: infinite
        "sglang:prompt_tokens_total " + "9" * 5000,
        "sglang:prompt_tokens_total",  # no value
        'sglang:prompt_tokens_total{model_name="m" 5',  # labels never closed
        'sglang:prompt_tokens_total{model_name="m} 5',  # a quote never closed
        "sglang:prompt_tokens_total 5 6 7",
        "sglang:prompt_tokens_total 0x10",
        "sglang:prompt_tokens_total_extra 5",  # another metric with the counter's name as prefix
        "sglang:prompt_tokens_total\x005",
        "<html><body>404</body></html>",
        "\ufffd\ufffd garbage \x1b[31m",
    ],
)
def test_a_sample_that_is_no_finite_count_is_skipped(line: str) -> None:
    text = 'sglang:prompt_tokens_total{model_name="m"} 7\n' + line + "\n"
    assert api.parse_counters(text) == {"sglang:prompt_tokens_total": 7.0}


def test_hostile_bodies_give_no_counter_and_a_sum_never_overflows() -> None:
    assert api.parse_counters("") == {}
    assert api.parse_counters("\n".join(["# HELP x y", "garbage {{{", '"' * 10000, "}" * 10000])) == {}
    huge = "\n".join([f'sglang:decode{{r="{i}"}} 1' for i in range(3)] + ["sglang:prompt_tokens_total 1e308"] * 3)
    got = api.parse_counters(huge)
    assert got["sglang:prompt_tokens_total"] == 1e308  # the samples that would overflow are skipped
    # a long label value with many escapes is read in linear time (no backtracking blow-up)
    long = 'sglang:prompt_tokens_total{a="' + '\\"' * 200000 + '"} 3'
    assert api.parse_counters(long) == {"sglang:prompt_tokens_total": 3.0}


def test_progress_between_readings() -> None:
    before = Tokens({"sglang:realtime_tokens_total": 100.0}, 10.0)
    same = Tokens({"sglang:realtime_tokens_total": 100.0}, 15.0)
    assert api.progress(same, [before]) == (False, "no token counted in 5.0 s (SGLang's token counters stood still)")
    more = Tokens({"sglang:realtime_tokens_total": 100.0, "sglang:generation_tokens_total": 12.0}, 15.0)
    assert api.progress(more, [before]) == (True, "12 token(s) counted in the last 5.0 s")  # a counter appeared
    restarted = Tokens({"sglang:realtime_tokens_total": 3.0}, 15.0)
    assert restarted.since(before) == 0  # a counter that went down counts nothing
    # the earlier reading of the previous look widens the window: no gap between looks
    earlier = Tokens({"sglang:realtime_tokens_total": 90.0}, 2.0)
    assert api.progress(same, [earlier, before]) == (True, "10 token(s) counted in the last 13.0 s")
    assert api.progress(same, [None, None])[0] is None


def _in_flight(progress: bool | None, running: int = 4) -> Liveness:
    words = {True: "8 token(s) counted in the last 2.0 s", False: "no token counted in 2.0 s", None: "progress unknown"}
    return Liveness(
        "busy",
        f"no completion within 2 s, {running} running and 0 waiting; {words[progress]}",
        2.0,
        200,
        Load(running, 0),
        progress,
    )


def test_requests_in_flight_are_busy_only_while_they_progress() -> None:
    got = classify(RUNNING, _in_flight(True))
    assert got.state == "busy" and got.detail.startswith("requests in flight and progressing: ")
    got = classify(RUNNING, _in_flight(False))  # the wedge of b12x#313 under foreign traffic
    assert got.state == "wedged" and got.detail.startswith("requests in flight, but none progresses: ")
    assert "no token counted in 2.0 s" in got.detail
    # progress decides alone when it is known: many requests in flight do not make a stuck line busy,
    # and the watcher's own probes do not make a progressing line wedged
    assert classify(RUNNING, _in_flight(False, running=64), own_in_flight=1).state == "wedged"
    assert classify(RUNNING, _in_flight(True, running=1), own_in_flight=3).state == "busy"
    # unknown (no /metrics): the load against the watcher's own probes, as before
    assert classify(RUNNING, _in_flight(None, running=4), own_in_flight=3).state == "busy"
    assert classify(RUNNING, _in_flight(None, running=3), own_in_flight=3).state == "wedged"


# --- how fast a wedge and a lost rank are confirmed (a fake clock) -----------------------------------

STUCK = Liveness(
    "busy", "no completion within 5 s, 6 running and 0 waiting; no token counted", 5.0, 200, Load(6, 0), False
)
RANK_LOST = ({"a": "running", "b": "absent"}, Liveness("down", "connection refused", 0.01))


@pytest.mark.parametrize(("fault", "took"), [((RUNNING, STUCK), 5.0), (RANK_LOST, 0.01)])
def test_a_fault_is_confirmed_within_two_intervals_and_the_deadline(
    tmp_path: Path, fault: tuple[dict[str, str], Liveness], took: float
) -> None:
    """The goal of issue 27 point 8 with the defaults (interval 15 s, probe timeout 5 s, confirm 3,
    confirm interval 2 s): from the fault, just after a look found the line ready, to the restart."""
    fake = Fake([(RUNNING, ALIVE)] + [fault] * 3 + [(RUNNING, ALIVE)])
    dog, _ = fake.dog(tmp_path)
    settings = dog.settings
    assert (settings.interval, settings.probe_timeout, settings.confirm) == (15.0, 5.0, 3)
    dog.run(looks=5)
    fault_at = 1000.0 + ALIVE.seconds  # the worst moment: right after a ready look
    assert fake.restarts == 1
    detection = fake.restarted_at[0] - fault_at
    assert detection <= 2 * settings.interval + settings.probe_timeout
    # the next look a full interval later, then the confirming looks every 2 s (start to start),
    # each a real probe that takes its time
    assert fake.slept[:3] == pytest.approx([15.0 - ALIVE.seconds, max(0.0, 2.0 - took), max(0.0, 2.0 - took)])


def test_a_busy_or_ready_look_ends_the_fast_confirmation(tmp_path: Path) -> None:
    fake = Fake(
        [(RUNNING, ALIVE), (RUNNING, STUCK), (RUNNING, BUSY), (RUNNING, STUCK), (RUNNING, ALIVE), (RUNNING, STUCK)]
    )
    dog, _ = fake.dog(tmp_path, confirm_interval=1)
    dog.run(looks=6)
    assert fake.restarts == 0
    # ready: 15; stuck: confirming (1); busy: back to 15; stuck: 1; ready: 15
    assert fake.slept == pytest.approx([15 - 0.05, 0.0, 13.0, 0.0, 15 - 0.05])


def test_a_line_never_seen_up_is_looked_at_every_interval(tmp_path: Path) -> None:
    fake = Fake([RANK_LOST] * 4)
    dog, _ = fake.dog(tmp_path)
    dog.run(looks=4)
    assert fake.restarts == 0 and fake.slept == pytest.approx([15 - 0.01] * 3)  # not armed: nothing to confirm


def test_the_counter_reading_is_carried_only_from_a_look_that_timed_out(tmp_path: Path) -> None:
    first = Tokens({"sglang:realtime_tokens_total": 5.0}, 1.0)
    second = Tokens({"sglang:realtime_tokens_total": 9.0}, 2.0)
    looks = [
        (RUNNING, ALIVE._replace(tokens=first)),
        (RUNNING, STUCK._replace(tokens=first)),
        (RUNNING, BUSY._replace(tokens=second)),
        (RUNNING, ALIVE._replace(tokens=second)),
        (RUNNING, ALIVE),
    ]
    fake = Fake(looks)
    dog, _ = fake.dog(tmp_path)
    dog.run(looks=5)
    # a ready look ends the chain: the first look after a wedge is measured from its own probe,
    # not from before the wedge
    assert fake.sinces == [None, None, first, second, None]
