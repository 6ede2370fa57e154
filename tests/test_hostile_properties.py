"""Hostile input as classes (issue 8, §4, "Done when"): whatever host name, user, identity path,
env key or value a profile holds, and whatever kind of file it names, loading it either succeeds
with a safe value or fails with InvalidInput naming the field; never another exception, a
traceback, an internal marker or a NUL, and nothing is written. In-process through
tp4.line.profile.load, and for a few examples through `python -m tp4 profile check FILE`."""

from __future__ import annotations

import copy
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tp4.core.apikey import Secret
from tp4.core.errors import InvalidInput
from tp4.line.plan import build_plan
from tp4.line.profile import load_file
from tp4.line.profile.load import load_default, load_text, parse_document, toml_key
from tp4.line.profile.models import has_unsafe_chars
from tp4.line.profile.toml import dumps
from tp4.serving.serve import env_file_text

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parent.parent
CLUSTER = {
    "head": {"name": "spark1", "ip": "10.0.0.1"},
    "workers": [{"name": f"spark{i}", "ip": f"10.0.0.{i}"} for i in (2, 3, 4)],
}
# What a user must never see: a traceback, pydantic's own words, its location markers, the
# importer's internal markers (\x00NAME\x00), a raw NUL.
INTERNAL = (
    "Traceback",
    "internal error",
    "[key]",
    "function-",
    "Value error",
    "String should match",
    "Input should be",
    "pydantic",
    "\x00",
)
FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# text with the characters hostile input is made of, beside ordinary ones
HOSTILE = st.text(
    st.sampled_from(
        list("aZ09._-/~:@=$`'\"\\ ;|&()!*?#") + ["\n", "\r", "\t", "\x00", "\x1b", "\x7f", "\u2028", "\x85", "é", "ß"]
    ),
    max_size=24,
)
TEXT = st.one_of(HOSTILE, st.text(max_size=24))


def doc(**sections: object) -> dict:
    d: dict = {"preset": "production", "cluster": copy.deepcopy(CLUSTER)}
    d.update(copy.deepcopy(sections))
    return d


def _set(d: dict, path: str, value: object) -> dict:
    parts = path.split(".")
    cur = d
    for part in parts[:-1]:
        cur = cur[int(part)] if part.isdigit() else cur.setdefault(part, {})
    cur[parts[-1]] = value
    return d


def _field(path: str) -> str:
    return ".".join(f"[{p}]" if p.isdigit() else p for p in path.split(".")).replace(".[", "[")


def outcome(d: dict) -> tuple[object | None, list[str]]:
    """(profile, []) or (None, problems); anything but InvalidInput fails the test."""
    try:
        return parse_document(d, "t.toml").profile, []
    except InvalidInput as exc:
        assert exc.exit_code == 2
        for text in [str(exc), *exc.problems]:
            assert not any(m in text for m in INTERNAL), text
        return None, exc.problems


def refused_naming(d: dict, field: str) -> list[str]:
    profile, problems = outcome(d)
    assert profile is None, field
    # every problem is about the field: the one bad value has no knock-on errors
    assert problems and all(p.startswith(f"{field}:") and "; fix: " in p for p in problems), (field, problems)
    return problems


# --- values in fields -------------------------------------------------------------------------

HOST_FIELDS = ["cluster.head.ip", "cluster.head.ssh", "cluster.workers.0.ip", "cluster.workers.2.ssh"]
USER_FIELDS = ["cluster.user", "cluster.head.user", "cluster.workers.1.user"]
IDENTITY_FIELDS = ["cluster.identity", "cluster.head.identity", "cluster.workers.2.identity"]
HOST_OK = re.compile(r"[A-Za-z0-9:][A-Za-z0-9._:-]*")


@given(path=st.sampled_from(HOST_FIELDS), value=TEXT)
@FAST
def test_any_host_name_is_safe_or_refused_naming_the_field(path, value):
    profile, problems = outcome(_set(doc(), path, value))
    if profile is None:
        assert problems and all(p.startswith(f"{_field(path)}:") or "is also used by" in p for p in problems), problems
    else:
        assert HOST_OK.fullmatch(value), value


@given(path=st.sampled_from(USER_FIELDS), value=TEXT)
@FAST
def test_any_user_is_a_plain_user_name_or_refused(path, value):
    profile, _ = outcome(_set(doc(), path, value))
    if profile is None:
        refused_naming(_set(doc(), path, value), _field(path))
    else:
        assert re.fullmatch(r"[a-z_][a-z0-9_.-]{0,31}", value), value


@given(path=st.sampled_from(IDENTITY_FIELDS), value=TEXT)
@FAST
def test_any_identity_path_is_plain_or_refused(path, value):
    profile, _ = outcome(_set(doc(), path, value))
    if profile is None:
        refused_naming(_set(doc(), path, value), _field(path))
    else:
        assert value.startswith(("/", "~/")) or value == "~"
        assert not has_unsafe_chars(value) and not any(c in value for c in "'\"$`\\:,")


ENV_KEYS = st.one_of(TEXT, st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,12}", fullmatch=True))


@given(table=st.sampled_from(["env", "gates"]), key=ENV_KEYS)
@FAST
def test_any_env_key_is_a_variable_name_or_refused_naming_it(table, key):
    d = doc(**{table: {key: "1"}})
    profile, _ = outcome(d)
    if profile is None:
        refused_naming(d, f"{table}.{toml_key(key)}")
    else:
        assert re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key), key


@given(key=st.from_regex(r"TP4_TEST_[A-Z]{1,8}", fullmatch=True), value=TEXT)
@FAST
def test_any_env_value_is_one_line_of_text_or_refused_naming_it(key, value):
    d = doc(env={key: value})
    profile, _ = outcome(d)
    if profile is None:
        problems = refused_naming(d, f"env.{key}")
        assert "control character" in problems[0]
    else:
        assert profile.env[key] == value and not has_unsafe_chars(value)


HEAD, WORKER = build_plan(load_default()).nodes[:2]
ENV_LINE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=[^\x00-\x08\x0a-\x1f\x7f\x85\u2028\u2029]*")


@given(key=ENV_KEYS, value=TEXT, key_text=st.from_regex(r"sk-[!-~]{12,30}", fullmatch=True))
@FAST
def test_the_env_file_serve_writes_holds_each_pair_on_one_line_or_is_refused_naming_the_key(key, value, key_text):
    """tp4.serving.serve.env_file_text, the one writer of an env file (serve writes its text to the node's
    file of mode 0600): whatever key or value reaches it past the loader, the file holds exactly
    the rank's environment (the head's also the API key, revealed there), one KEY=VALUE a line
    that no line-based reader splits, or it is refused naming the rank and the key, never a
    value or the key's text."""
    secrets = {"API_KEY": Secret(key_text)}
    for rank in (HEAD, WORKER):
        rank = rank._replace(env={**rank.env, key: value})
        try:
            text = env_file_text(rank, secrets)
        except InvalidInput as exc:
            assert exc.exit_code == 2
            if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
                assert has_unsafe_chars(value)
                assert str(exc) == (
                    f"{rank.name}: the value of {key} holds a control character or a line break, which an "
                    "env file cannot carry; fix: remove it from the profile"
                )
            else:
                assert str(exc) == (
                    f"{rank.name}: env key {key!r} is not a variable name, which an env file cannot carry; "
                    "fix: use letters, digits and _ (not first a digit)"
                )
            continue
        lines = text.split("\n")
        assert lines.pop() == "" and text.splitlines() == lines and all(ENV_LINE.fullmatch(line) for line in lines)
        want = {**rank.env, "API_KEY": key_text} if rank.rank == 0 else rank.env
        assert dict(line.split("=", 1) for line in lines) == want and len(lines) == len(want)
        assert (key_text in text) == (rank.rank == 0)


@given(
    path=st.sampled_from(HOST_FIELDS + USER_FIELDS + IDENTITY_FIELDS + ["engine.ep", "engine.tp", "api.key_file"]),
    value=st.one_of(
        st.integers(min_value=-(2**70), max_value=2**70),
        st.booleans(),
        st.floats(allow_nan=False),
        st.lists(st.integers(), max_size=2),
        st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    ),
)
@FAST
def test_a_value_of_the_wrong_kind_is_reported_once_with_a_fix(path, value):
    profile, problems = outcome(_set(doc(), path, value))
    if profile is None:
        mine = [p for p in problems if p.startswith(f"{_field(path)}:")]
        assert len(mine) == 1 and "; fix: " in mine[0], problems


# --- through TOML text and the CLI --------------------------------------------------------------


def _tree(root: Path) -> list[tuple[str, int]]:
    return sorted((str(p.relative_to(root)), p.lstat().st_mode) for p in root.rglob("*"))


@given(path=st.sampled_from(HOST_FIELDS + USER_FIELDS + IDENTITY_FIELDS), value=HOSTILE)
@settings(max_examples=25, deadline=None)
def test_load_text_of_a_written_profile_behaves_the_same(path, value):
    d = _set(doc(), path, value)
    try:
        load_text(dumps(d), "p.toml")
        assert outcome(d)[0] is not None
    except InvalidInput as exc:
        assert exc.problems == outcome(d)[1]


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(cwd),
        "PYTHONPATH": str(REPO / "python"),
        "LANG": "C.UTF-8",
    }
    return subprocess.run(
        [sys.executable, "-m", "tp4", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=60, check=False
    )


CLI_CASES = [
    ("cluster.head.ssh", "-Jevil.example.com"),
    ("cluster.user", "$(id)"),
    ("cluster.workers.0.user", "zurih\nroot"),
    ("cluster.identity", "~/.ssh/a\x00b"),
    ("env.TP4_TEST_X", "a\x1b[31mb"),
    ("env.A=B", "1"),
    ("engine.ep", True),
]


@pytest.mark.parametrize("path,value", CLI_CASES, ids=[c[0] for c in CLI_CASES])
def test_profile_check_refuses_in_plain_words_and_writes_nothing(tmp_path, path, value):
    if path.startswith("env."):
        d = doc(env={path[4:]: value})
        field = f"env.{toml_key(path[4:])}"
    else:
        d = _set(doc(), path, value)
        field = _field(path)
    profile = tmp_path / "p.toml"
    profile.write_text(dumps(d))
    before = _tree(tmp_path)
    proc = _cli("profile", "check", str(profile), cwd=tmp_path)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert proc.stdout == "" and proc.stderr.startswith("error: ")
    assert not any(m in proc.stderr for m in INTERNAL), proc.stderr
    assert f"  - {field}:" in proc.stderr and "; fix: " in proc.stderr
    assert _tree(tmp_path) == before


# --- file kinds --------------------------------------------------------------------------------

KINDS = [
    "regular",
    "regular garbage",
    "empty",
    "directory",
    "fifo",
    "device",
    "missing",
    "unreadable",
    "dangling link",
    "link loop",
    "under a file",
    "not utf-8",
]


def _make(root: Path, kind: str) -> Path:
    path = root / "profile.toml"
    if kind == "regular":
        path.write_text(dumps(doc()))
    elif kind == "regular garbage":
        path.write_text("[cluster\nhead = ")
    elif kind == "empty":
        path.write_text("")
    elif kind == "directory":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "device":
        path.symlink_to("/dev/null")
    elif kind == "unreadable":
        path.write_text("[cluster\n")  # unreadable to a normal user; garbage to root, who reads it anyway
        path.chmod(0)
    elif kind == "dangling link":
        path.symlink_to(root / "nowhere")
    elif kind == "link loop":
        path.symlink_to(path)
    elif kind == "under a file":
        (root / "file").write_text("x")
        path = root / "file" / "profile.toml"
    elif kind == "not utf-8":
        path.write_bytes(b'preset = "\xff\xfe"\n')
    return path


@given(kind=st.sampled_from(KINDS))
@settings(max_examples=30, deadline=None)
def test_any_kind_of_file_is_loaded_or_refused_naming_it(kind):
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        path = _make(root, kind)
        before = _tree(root)
        try:
            loaded = load_file(path)
            assert kind == "regular", kind
            assert loaded.profile.engine.tp == 4
        except InvalidInput as exc:
            assert kind != "regular", exc
            assert exc.exit_code == 2 and str(path) in str(exc)
            assert not any(m in str(exc) for m in INTERNAL), exc
        assert _tree(root) == before


@pytest.mark.parametrize("kind", ["fifo", "device", "directory", "link loop"])
def test_profile_check_of_a_special_file_is_a_user_error(tmp_path, kind):
    path = _make(tmp_path, kind)
    before = _tree(tmp_path)
    proc = _cli("profile", "check", str(path), cwd=tmp_path)
    # tp4's own message (what the path is and the fix), not click's usage error
    assert proc.returncode == 2 and proc.stderr.startswith("error: ") and f"profile {path}" in proc.stderr
    assert "; fix: " in proc.stderr and "Usage:" not in proc.stderr
    assert "Traceback" not in proc.stderr and "--profile" not in proc.stderr
    assert _tree(tmp_path) == before
