"""Hostile input, bounded (issue 25, items 6-8): what a file or the environment holds never makes
tp4 build an unbounded value, read without end, wait on a FIFO, run out of stack, convert an
endless number, or lose an update to a run beside it. Each is a user error (exit 2, the file, the
line or field, and the fix), or a plain failure (exit 1), never a traceback or exit 70."""

from __future__ import annotations

import dataclasses
import gzip
import io
import os
import resource
import stat
import subprocess
import sys
import tarfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tp4.core.errors import Tp4Error
from tp4.image.sources import manifest as mf

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parent.parent
EXAMPLE_PROFILE = REPO / "python" / "tp4" / "data" / "default-profile.toml"
INTERNAL = ("Traceback", "internal error", "RecursionError", "MemoryError", "KeyError", "Exception ignored")


def _tp4(
    *args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 60, **kw
) -> subprocess.CompletedProcess:
    """The real CLI in a child with a 1 GiB address-space cap: an unbounded read or expansion
    fails there as MemoryError (exit 70) in a second, not after filling the machine."""

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))

    return subprocess.run(
        [sys.executable, "-m", "tp4", *args],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(REPO / "python"), **(env or {})},
        capture_output=kw.pop("capture_output", "stdout" not in kw),
        text=True,
        timeout=timeout,
        preexec_fn=cap,
        check=False,
        **kw,
    )


def assert_user_error(proc: subprocess.CompletedProcess, *words: str) -> None:
    err = proc.stderr
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-2000:], err[-2000:])
    assert err.startswith("error: "), err[-2000:]
    assert not any(m in err for m in INTERNAL), err[-2000:]
    assert len(err) < 4000, len(err)  # the message names the problem, it does not echo the file
    assert all(w in err for w in words), (words, err)


# --- 6. the .env importer bounds what expansion builds -------------------------------------------


def _doubling(n: int) -> str:
    return "X=ab\n" + "X=$X$X\n" * n


ENV_BOMBS = {
    # ~150 bytes doubling one variable 40 times: 2 TB if expanded
    "doubling": (_doubling(40), ("line 21", "X:", "more than 1048576 bytes")),
    # the same within one line: $X forty times over a value of 64 KiB
    "one line": ("X=" + "a" * 65536 + "\nY=" + "$X" * 40 + "\n", ("line 2", "Y:", "more than 1048576 bytes")),
    "double quotes": ("X=" + "a" * 65536 + '\nY="' + "$X" * 40 + '"\n', ("line 2", "Y:")),
    "default word": ("X=" + "a" * 65536 + "\nY=${UNSET:-" + "$X" * 40 + "}\n", ("line 2", "Y:")),
    "append": ("X=" + "a" * 600_000 + "\nX+=$X\n", ("line 2", "X:")),
    # many variables, each under the cap, together past it
    "many": (
        "X=" + "a" * 1000 + "\nX=" + "$X" * 1000 + "\n" + "".join(f"Y{i}=$X\n" for i in range(40)),
        ("line 18", "Y15:", "more than 16777216 bytes together"),
    ),
    # ~ and $HOME stand for WORKER_USER's home: a long user name multiplies them
    "home": ("WORKER_USER=" + "u" * 600_000 + "\nX=~:~:~\n", ("line 2", "X:")),
    # ${UNSET:- nested 2,000 deep: Python's stack, not the file, would give out
    "nested": ("X=" + "${UNSET:-" * 2000 + "x" + "}" * 2000 + "\n", ("line 1", "X:", "nested more than 32 deep")),
}


@pytest.mark.parametrize("case", sorted(ENV_BOMBS))
def test_an_env_file_cannot_expand_without_bound(tmp_path, case):
    text, words = ENV_BOMBS[case]
    (tmp_path / "bomb.env").write_text(text)
    proc = _tp4("profile", "import", "bomb.env", "-o", "out.toml", cwd=tmp_path)
    assert_user_error(proc, "bomb.env", "fix:", *words)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bomb.env"]


def test_expansion_below_the_bounds_still_works():
    from tp4.line.profile.legacy import parse_env_text

    found, _ = parse_env_text(_doubling(15) + "Y=" + "${UNSET:-" * 30 + "$X" + "}" * 30 + "\n")
    assert len(found[-1].value) == 2 << 15 and found[-1].name == "Y"


# --- 6. files named by the environment: regular files of bounded size only ----------------------


@pytest.mark.parametrize("kind", ["/dev/zero", "fifo", "directory"])
@pytest.mark.parametrize("command", [["hosts", "list"], ["hosts", "forget", "spark2"]])
def test_known_hosts_from_the_environment_is_only_a_regular_file(tmp_path, kind, command):
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "directory").mkdir()
    named = kind if kind.startswith("/") else str(tmp_path / kind)
    proc = _tp4(*command, cwd=tmp_path, env={"TP4_KNOWN_HOSTS": named}, timeout=30)
    assert_user_error(proc, named, "TP4_KNOWN_HOSTS", "regular file")
    assert (tmp_path / "fifo").is_fifo() and not list((tmp_path / "directory").iterdir())
    # nothing made beside it either (forget's lock file would go beside /dev/zero, in /dev)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["directory", "fifo"]


def test_a_missing_known_hosts_is_still_an_empty_one(tmp_path):
    proc = _tp4("hosts", "list", cwd=tmp_path, env={"TP4_KNOWN_HOSTS": str(tmp_path / "none")})
    assert proc.returncode == 0 and "no host keys recorded" in proc.stderr, proc.stderr


@pytest.mark.parametrize("kind", ["/dev/zero", "fifo"])
def test_a_plan_file_is_only_a_regular_file(tmp_path, kind):
    os.mkfifo(tmp_path / "fifo")
    named = kind if kind.startswith("/") else str(tmp_path / kind)
    proc = _tp4("plan", "--check", named, "--profile", str(EXAMPLE_PROFILE), cwd=tmp_path, timeout=30)
    assert_user_error(proc, named, "regular file", "tp4 plan --json -o")


# --- 7. nesting and number length: the file's fault, said plainly ---------------------------------

DEEP_TOML = "a = " + "[" * 5000 + "]" * 5000 + "\n"
DOTTED_TOML = "a" + ".a" * 5000 + " = 1\n"
DEEP_JSON = '{"a": ' * 5000 + "1" + "}" * 5000
LONG = "1" * 5000


def _bench_out(tmp_path: Path, text: str) -> list[str]:
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "result.json").write_text(text)
    return ["bench", "decode", "--url", "http://127.0.0.1:9", "--out", "out"]


def _file(name: str, *args: str):
    """A maker: write the text to tmp_path/name, return the command's arguments."""

    def make(tmp_path: Path, text: str) -> list[str]:
        (tmp_path / name).write_text(text)
        return list(args)

    return make


FILES = {
    "profile": (_file("f.toml", "profile", "check", "f.toml"), "f.toml"),
    "plan --profile": (_file("f.toml", "plan", "--profile", "f.toml"), "f.toml"),
    "fleet": (_file("f.toml", "fleet", "plan", "--fleet", "f.toml"), "f.toml"),
}
JSON_FILES = {
    "bench resume": (_bench_out, "out/result.json"),
    "qeval baseline": (_file("b.json", "qeval", "--baseline", "b.json"), "b.json"),
    "plan --check": (
        _file("plan.json", "plan", "--check", "plan.json", "--profile", str(EXAMPLE_PROFILE)),
        "plan.json",
    ),
}
DEEP_CASES = [(f, DEEP_TOML) for f in FILES] + [(f, DOTTED_TOML) for f in FILES] + [(f, DEEP_JSON) for f in JSON_FILES]


@pytest.mark.parametrize("name,text", DEEP_CASES, ids=[f"{f}-{t[:6]}" for f, t in DEEP_CASES])
def test_a_document_nested_5000_deep_is_a_user_error(tmp_path, name, text):
    make, shown = {**FILES, **JSON_FILES}[name]
    args = make(tmp_path, text)
    before = sorted(tmp_path.rglob("*"))
    proc = _tp4(*args, cwd=tmp_path)
    assert_user_error(proc, shown, "nested more than 64 levels", "fix:")
    assert sorted(tmp_path.rglob("*")) == before


LONG_CASES = {
    "engine.tp": ("profile", f"[engine]\ntp = {LONG}\n", "line 2"),
    "router.port": ("fleet", f"[router]\nport = {LONG}\n", "line 2"),
    "gates underscore": ("profile", f"[gates]\nX = {'1_' * 4400}1\n", "line 2"),
    "bench resume": ("bench resume", '{"tp4": {"kind": "decode", "n": ' + LONG + "}}", "line 1"),
    "qeval baseline": ("qeval baseline", '{"tp4": {"kind": "qeval"}, "tasks": ' + LONG + "}", "line 1"),
}


@pytest.mark.parametrize("case", sorted(LONG_CASES))
def test_a_number_of_5000_digits_is_a_user_error(tmp_path, case):
    name, text, line = LONG_CASES[case]
    make, shown = {**FILES, **JSON_FILES}[name]
    proc = _tp4(*make(tmp_path, text), cwd=tmp_path)
    assert_user_error(proc, shown, "more than 4300 digits", line, "fix:")


def test_a_manifest_strip_of_5000_digits_is_refused_naming_the_row(tmp_path):
    path = tmp_path / "sources.manifest"
    path.write_text(f"a  {'a' * 40}  {'b' * 64}  https://example.invalid/{'a' * 40}/a.tar.gz\n    strip={LONG}\n")
    for args in (["verify"], ["fetch", "a", "--to", "out"]):
        proc = _tp4("sources", *args, "--manifest", str(path), cwd=tmp_path)
        assert_user_error(proc, "row 'a'", "strip=1111", "5000 digits", "fix:")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sources.manifest"]


def _tar_gz(members: list[tarfile.TarInfo], data: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for m in members:
            tar.addfile(m, io.BytesIO(data[m.name]) if m.name in data else None)
    return gzip.compress(buf.getvalue())


@pytest.mark.parametrize("target", ["other/secret", "top/missing", "top/later"])
def test_a_hard_link_to_a_file_not_in_the_archive_is_refused(tmp_path, target):
    from tp4.image.sources import transforms

    ok = tarfile.TarInfo("top/a")
    ok.size = 1
    link = tarfile.TarInfo("top/b")
    link.type, link.linkname = tarfile.LNKTYPE, target
    later = tarfile.TarInfo("top/later")
    later.size = 1
    archive = tmp_path / "a.tar.gz"
    archive.write_bytes(_tar_gz([ok, link, later], {"top/a": b"x", "top/later": b"y"}))
    with pytest.raises(Tp4Error, match=f"hard link 'b' points to '{target}', which is not a file earlier"):
        transforms.unpack_archive(archive, tmp_path / "w", strip=1)
    # a link to a file before it still unpacks as a link
    link.linkname = "top/a"
    archive.write_bytes(_tar_gz([ok, link], {"top/a": b"x"}))
    transforms.unpack_archive(archive, tmp_path / "w2", strip=1)
    assert os.path.samefile(tmp_path / "w2" / "a", tmp_path / "w2" / "b")


# --- 7. standard output that cannot be written ---------------------------------------------------

PRINTERS = [
    ["plan"],
    ["plan", "--json"],
    ["--help"],
    ["--version"],
    ["profile", "show-preset", "production"],
    ["profile", "reference"],
    ["sources", "list"],
]


@pytest.fixture
def full_device(tmp_path) -> Path:
    """A device every write to fails with ENOSPC, as /dev/full (char 1,7), made here: a test
    elsewhere that writes over /dev/full must not turn this one into a pass."""
    path = tmp_path / "full"
    try:
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 7))
    except PermissionError:  # not root: the machine's own /dev/full, which must be the device
        assert stat.S_ISCHR(os.stat("/dev/full").st_mode), "/dev/full is no device and none can be made here"
        return Path("/dev/full")
    return path


@pytest.mark.parametrize("args", PRINTERS, ids=" ".join)
def test_a_full_standard_output_is_said_plainly(full_device, args):
    with open(full_device, "w") as full:
        proc = _tp4(*args, cwd=REPO, stdout=full, stderr=subprocess.PIPE)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.startswith("error: cannot write standard output"), proc.stderr
    assert not any(m in proc.stderr for m in INTERNAL), proc.stderr
    assert proc.stderr.count("\n") == 1, proc.stderr


@pytest.mark.parametrize("args", [["plan"], ["sources", "list"]], ids=" ".join)
def test_a_closed_pipe_is_said_plainly(args):
    r, w = os.pipe()
    os.close(r)
    try:
        proc = _tp4(*args, cwd=REPO, stdout=w, stderr=subprocess.PIPE)
    finally:
        os.close(w)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.startswith("error: cannot write standard output"), proc.stderr
    assert not any(m in proc.stderr for m in INTERNAL), proc.stderr


def test_a_writable_standard_output_is_unchanged(tmp_path, tp4_cli):
    code, out, err = tp4_cli("plan", "--profile", EXAMPLE_PROFILE)
    assert code == 0 and out and not err
    assert sys.stdout is not None and type(sys.stdout).__name__ != "_Stdout"  # put back after the run


# --- 8. two `tp4 sources lock` at once both land ------------------------------------------------


class _Barrier(ThreadingHTTPServer):
    """Answers each download only once both runs asked for theirs: both read the manifest before
    either writes, every time (the race, made certain)."""

    daemon_threads = True

    def __init__(self, payloads: dict[str, bytes]) -> None:
        self.payloads = payloads
        self.barrier = threading.Barrier(len(payloads), timeout=60)
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:
                body = next((v for k, v in server.payloads.items() if self.path.endswith(k)), None)
                if body is None:
                    self.send_error(404)
                    return
                try:
                    server.barrier.wait()
                except threading.BrokenBarrierError:
                    pass
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        super().__init__(("127.0.0.1", 0), Handler)


def test_two_locks_of_one_manifest_at_once_keep_both_pins(tmp_path):
    commit = "a" * 40
    path = tmp_path / "sources.manifest"
    path.write_text(
        "# two rows, locked by two runs at once\n"
        f"one  {commit}  unlocked  https://example.invalid/{commit}/one\n"
        f"two  {commit}  unlocked  https://example.invalid/{commit}/two\n"
    )
    server = _Barrier({"/one": b"first payload", "/two": b"second payload"})
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        env = {
            **os.environ,
            "PYTHONPATH": str(REPO / "python"),
            "TP4_SOURCES_MIRROR": f"http://127.0.0.1:{server.server_address[1]}",
        }
        runs = [
            subprocess.Popen(
                [sys.executable, "-m", "tp4", "sources", "lock", name, "--manifest", str(path)],
                cwd=tmp_path,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for name in ("one", "two")
        ]
        results = [(p.wait(timeout=120), *p.communicate()) for p in runs]
    finally:
        server.shutdown()
        server.server_close()
    assert [code for code, _, _ in results] == [0, 0], results
    import hashlib

    rows = mf.load(path).by_name
    assert rows["one"].sha256 == hashlib.sha256(b"first payload").hexdigest()
    assert rows["two"].sha256 == hashlib.sha256(b"second payload").hexdigest()
    assert path.read_text().startswith("# two rows, locked by two runs at once\n")
    from tp4.image.sources import companion

    assert companion.stale(path) is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sources.manifest", "sources.manifest.json"]


def test_a_row_both_runs_changed_is_refused_not_overwritten(tmp_path, monkeypatch):
    """The other run pinned the same row while this one downloaded: which pin is meant is the
    user's call, so this run writes nothing and says so."""
    from tp4.image.sources import lock as locking

    commit = "a" * 40
    path = tmp_path / "sources.manifest"
    path.write_text(f"one  {commit}  unlocked  https://example.invalid/{commit}/one\n")
    manifest = mf.load(path)
    theirs = f"one  {commit}  {'c' * 64}  https://example.invalid/{commit}/one\n"

    def download(row, *args, **kwargs):
        path.write_text(theirs)  # the other run, finishing first
        return dataclasses.replace(row, sha256="d" * 64)

    monkeypatch.setattr(locking, "lock_row", download)
    with pytest.raises(Tp4Error, match="the row changed .* while this run was locking it"):
        locking.lock(manifest, ["one"])
    assert path.read_text() == theirs


# --- 7. what tp4 reads that is not a user's file, but may be anything -----------------------------


def test_a_model_answer_nested_5000_deep_fails_its_task_not_the_run():
    from tp4.measuring.qeval.checks import Answer, JsonAnswer

    verdict = JsonAnswer({"type": "object"}).score(Answer("[" * 5000 + "]" * 5000))
    assert not verdict.passed and verdict.reason.startswith("not JSON")


@pytest.mark.parametrize("kind", ["fifo", "directory", "nested"])
def test_a_verification_cache_that_is_no_file_is_no_cache(tmp_path, kind):
    """The checkpoint's `.tp4-verified.json`: a FIFO there is not waited on, nesting not recursed."""
    from tp4.hosts import checkpoint

    cache = tmp_path / checkpoint.CACHE_NAME
    if kind == "fifo":
        os.mkfifo(cache)
    elif kind == "directory":
        cache.mkdir()
    else:
        cache.write_text("[" * 5000 + "]" * 5000)
    result: list[dict] = []
    reader = threading.Thread(target=lambda: result.append(checkpoint.load_cache(tmp_path, "org/model", "rev")))
    reader.start()
    reader.join(10)
    if reader.is_alive():  # waiting for a writer: give it one, so the test ends
        os.close(os.open(cache, os.O_WRONLY | os.O_NONBLOCK))
        reader.join()
        pytest.fail(f"load_cache waited on {kind}")
    assert result and result[0]["complete"] == [] and result[0]["files"] == {}


WRITERS = {
    "plan -o": ["plan", "--profile", str(EXAMPLE_PROFILE), "-o"],
    "doctor -o": ["doctor", "--profile", str(EXAMPLE_PROFILE), "-o"],
}


@pytest.mark.parametrize("writer", sorted(WRITERS))
@pytest.mark.parametrize("kind", ["device", "link to a device", "fifo"])
def test_an_output_file_never_replaces_what_is_not_a_regular_file(tmp_path, full_device, kind, writer):
    """`tp4 plan -o /dev/zero` renamed the plan over the device node itself (as root); doctor's
    --json did the same after a whole run, through FILE.tmp."""
    target = {"device": full_device, "fifo": tmp_path / "fifo"}.get(kind)
    if kind == "link to a device":
        target = tmp_path / "link"
        target.symlink_to(full_device)
    elif kind == "fifo":
        os.mkfifo(target)
    before = sorted(tmp_path.iterdir())
    proc = _tp4(*WRITERS[writer], str(target), cwd=tmp_path)
    assert_user_error(proc, str(target), "regular file")
    assert sorted(tmp_path.iterdir()) == before
    assert stat.S_ISCHR(os.stat(full_device).st_mode)


# --- the classes, not only the examples ------------------------------------------------------------

_TOKENS = st.sampled_from(["$A", "$B", "${A}", "${U:-$A$B}", '"$A$B$A"', "${A:+$B$B}", "xyz", "~", ":~"])
_LINE = st.tuples(st.sampled_from(["A", "B", "C"]), st.sampled_from(["=", "+="]), st.lists(_TOKENS, max_size=12))


@given(lines=st.lists(_LINE, min_size=1, max_size=30), user=st.integers(0, 3000))
@settings(max_examples=300, deadline=None)
def test_no_env_file_expands_past_the_bounds(lines, user):
    """Any file of assignments that repeat expansions: every value within the bound, the whole
    within its bound, or InvalidInput naming a line; nothing else (the bounds made small, so the
    refusals are reached quickly)."""
    from tp4.core.errors import InvalidInput
    from tp4.line.profile import legacy

    text = f"WORKER_USER={'u' * user}\nA=ab\nB=cd\n" + "".join(f"{n}{op}{''.join(t)}\n" for n, op, t in lines)
    built: list[int] = []  # the length of every string the parser's steps return: never past the bound

    def measured(step):
        def run(self, *args, **kwargs):
            out = step(self, *args, **kwargs)
            built.append(len(out))
            return out

        return run

    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(legacy, "MAX_VALUE_BYTES", 4096)
            mp.setattr(legacy, "MAX_EXPANDED_BYTES", 16384)
            for name in ("_value", "_double", "_dollar", "_brace_word"):
                mp.setattr(legacy._Parser, name, measured(getattr(legacy._Parser, name)))
            try:
                found, _ = legacy.parse_env_text(text, "t.env")
            finally:
                assert max(built, default=0) <= 4096, max(built)
    except InvalidInput as exc:
        assert exc.message.startswith("t.env line "), exc.message
        assert "fix:" in exc.message and len(exc.message) < 1000
        return
    assert all(len(a.value) <= 4096 for a in found)
    assert sum(len(a.value) for a in found) <= 16384


@given(depth=st.integers(1, 3000), shape=st.sampled_from(["[", "{", "."]))
@settings(max_examples=60, deadline=None)
def test_no_nesting_reaches_a_caller(depth, shape):
    """JSON and TOML of any depth: a value nested at most MAX_DEPTH deep, or InvalidInput."""
    from tp4.core import userfiles
    from tp4.core.errors import InvalidInput

    if shape == "[":
        docs = [("json", "[" * depth + "]" * depth), ("toml", "a = " + "[" * depth + "]" * depth)]
    elif shape == "{":
        docs = [("json", '{"a":' * depth + "1" + "}" * depth), ("toml", "a = " + "{a = " * depth + "1" + "}" * depth)]
    else:
        docs = [("toml", "a" + ".a" * depth + " = 1")]
    for kind, text in docs:
        parse = userfiles.parse_json if kind == "json" else userfiles.parse_toml
        try:
            parse(text, "t")
        except InvalidInput as exc:
            assert exc.message.startswith("t") and "fix:" in exc.message
            assert depth > userfiles.MAX_DEPTH - 2 or "not valid TOML" in exc.message, (depth, exc.message)
        else:
            assert depth <= userfiles.MAX_DEPTH, depth


@given(digits=st.integers(1, 9000), sign=st.sampled_from(["", "-"]), where=st.integers(0, 3))
@settings(max_examples=60, deadline=None)
def test_no_number_length_reaches_a_caller(digits, sign, where):
    """An integer of any length: a value, or InvalidInput naming its line; never ValueError."""
    from tp4.core import userfiles
    from tp4.core.errors import InvalidInput

    number = sign + "7" * digits
    for parse, text in (
        (userfiles.parse_json, "\n" * where + '{"a": ' + number + "}"),
        (userfiles.parse_toml, "\n" * where + "a = " + number),
    ):
        try:
            doc = parse(text, "t")
        except InvalidInput as exc:
            assert digits > userfiles.MAX_INT_DIGITS and f"(line {where + 1})" in exc.message, exc.message
        else:
            assert digits <= userfiles.MAX_INT_DIGITS and doc == {"a": int(number)}


def test_a_file_that_becomes_a_fifo_while_hashed_is_refused_not_waited_on(tmp_path):
    """nar hashes what lstat called a regular file; a FIFO put in its place before the open is
    refused on the descriptor instead of blocking `tp4 sources hash` for ever."""
    import hashlib

    from tp4.image.sources import nar

    fifo = tmp_path / "f"
    os.mkfifo(fifo)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            nar._Sink(hashlib.sha256()).file(os.fsencode(fifo), 10)
        except OSError as exc:
            errors.append(exc)

    reader = threading.Thread(target=run)
    reader.start()
    reader.join(10)
    if reader.is_alive():
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        reader.join()
        pytest.fail("the hash waited on a FIFO")
    assert errors and "no longer a regular file" in str(errors[0])


@pytest.mark.parametrize("kind", ["/dev/zero", "fifo", "dangling link"])
def test_a_fetch_input_that_is_no_file_is_refused(tmp_path, kind):
    """`--input ROW=/dev/zero` hashed zeros for ever; a FIFO waited for a writer."""
    path = tmp_path / "sources.manifest"
    path.write_text(f"a  {'a' * 40}  {'b' * 64}  https://example.invalid/{'a' * 40}/a\n")
    named = {"/dev/zero": "/dev/zero", "fifo": str(tmp_path / "fifo"), "dangling link": str(tmp_path / "link")}[kind]
    if kind == "fifo":
        os.mkfifo(named)
    elif kind == "dangling link":
        os.symlink(tmp_path / "nowhere", named)
    proc = _tp4(
        "sources",
        "fetch",
        "a",
        "--to",
        "out",
        "--input",
        f"a={named}",
        "--manifest",
        str(path),
        cwd=tmp_path,
        timeout=30,
    )
    assert_user_error(proc, f"--input a={named}", "fix:")
    assert not (tmp_path / "out").exists()
