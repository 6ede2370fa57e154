"""Hostile input (issue 8, §4): whatever a profile, a path or an argument holds, tp4 refuses it
as a user error naming the field, with no traceback, no internal marker, and nothing written."""

from __future__ import annotations

import copy
import os
import resource
import subprocess
import sys
from pathlib import Path
from typing import Annotated, Literal, get_args, get_origin

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from tp4.core.errors import InvalidInput
from tp4.line.profile import models
from tp4.line.profile.load import parse_document, toml_key
from tp4.line.profile.toml import dumps

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parent.parent
ENV_FILE = REPO / "tests" / "fixtures" / "env.tp4.production"
CLUSTER = {
    "head": {"name": "spark1", "ip": "10.0.0.1"},
    "workers": [{"name": f"spark{i}", "ip": f"10.0.0.{i}"} for i in (2, 3, 4)],
}
# What a user must never see: a traceback, pydantic's own words or its location markers.
INTERNAL = (
    "Traceback",
    "internal error",
    "[key]",
    "function-",
    "Value error",
    "String should match",
    "Input should be",
    "pydantic",
    "errors.pydantic.dev",
)


def doc(**sections) -> dict:
    d = {"preset": "production", "cluster": copy.deepcopy(CLUSTER)}
    d.update(copy.deepcopy(sections))
    return d


def at(d: dict, path: str, value) -> dict:
    """d with value set at a dotted path (`cluster.head.ip`)."""
    *parents, leaf = path.split(".")
    cur = d
    for part in parents:
        cur = cur.setdefault(part, {})
    cur[leaf] = value
    return d


def problems(d: dict) -> list[str]:
    with pytest.raises(InvalidInput) as exc:
        parse_document(d, "t.toml")
    assert exc.value.exit_code == 2
    for p in exc.value.problems:
        assert not any(m in p for m in INTERNAL), p
    return exc.value.problems


def refused(d: dict, field: str, *words: str) -> str:
    found = problems(d)
    mine = [p for p in found if p.startswith(f"{field}:")]
    assert mine, (field, found)
    assert all(w in mine[0] for w in words), (words, mine[0])
    return mine[0]


def assert_user_error(code: int, out: str, err: str) -> None:
    assert code == 2, (code, out, err)
    assert err.startswith("error:") or "Error:" in err, err
    assert not any(m in out + err for m in INTERNAL), err


# --- 1. ssh destinations: no host, address or user that reads as an option ----------------------

HOST_FIELDS = ["cluster.head.ip", "cluster.head.ssh", "cluster.workers.0.ip", "cluster.workers.2.ssh"]


def _set(d: dict, path: str, value) -> dict:
    parts = path.split(".")
    cur = d
    for part in parts[:-1]:
        cur = cur[int(part)] if part.isdigit() else cur.setdefault(part, {})
    cur[parts[-1]] = value
    return d


def _field(path: str) -> str:
    return ".".join(f"[{p}]" if p.isdigit() else p for p in path.split(".")).replace(".[", "[")


@pytest.mark.parametrize("value", ["-Jevil.example.com", "-L2222:localhost:22", "-oProxyCommand=id", "-"])
@pytest.mark.parametrize("path", HOST_FIELDS)
def test_a_host_starting_with_a_dash_is_refused(path, value):
    refused(_set(doc(), path, value), _field(path), repr(value), "fix:")


@given(path=st.sampled_from(HOST_FIELDS), rest=st.text(max_size=30))
@settings(max_examples=60, deadline=None)
def test_no_host_starting_with_a_dash_passes(path, rest):
    value = "-" + rest
    refused(_set(doc(), path, value), _field(path))


@pytest.mark.parametrize("path", ["cluster.user", "cluster.head.user", "cluster.workers.1.user"])
def test_an_empty_user_is_refused(path):
    refused(_set(doc(), path, ""), _field(path), "user name", "fix:")


# --- 2. the cluster-wide ssh defaults are checked like the per-node ones -------------------------

HOSTILE_TEXT = ["a\nb", "zurih'", 'zu"rih', "$(id)", "a\x00b", "a\x1b[31m", "-oProxyCommand=id", "ZURIH"]


@pytest.mark.parametrize("value", HOSTILE_TEXT)
@pytest.mark.parametrize("path", ["cluster.user", "cluster.head.user", "cluster.workers.0.user"])
def test_hostile_users_are_refused(path, value):
    refused(_set(doc(), path, value), _field(path), "user name")


@pytest.mark.parametrize(
    "value",
    [
        "~/.ssh/a\nb",
        "~/.ssh/'k'",
        '~/.ssh/"k"',
        "~/.ssh/$(id)",
        "~/.ssh/a\x00b",
        "~/.ssh/\x1b[31m",
        "~/.ssh/`id`",
        "",
        "-i/etc/shadow",
    ],
)
@pytest.mark.parametrize("path", ["cluster.identity", "cluster.head.identity", "cluster.workers.2.identity"])
def test_hostile_identities_are_refused(path, value):
    refused(_set(doc(), path, value), _field(path))


@given(
    path=st.sampled_from(["cluster.user", "cluster.identity", "cluster.head.user", "cluster.head.identity"]),
    head=st.text(max_size=8),
    bad=st.sampled_from(list("\n\r\x00\x1b'\"$`\x7f\u2028")),
    tail=st.text(max_size=8),
)
@settings(max_examples=80, deadline=None)
def test_no_user_or_identity_with_a_control_or_shell_character_passes(path, head, bad, tail):
    refused(_set(doc(), path, f"~/{head}{bad}{tail}"), _field(path))


def test_the_cluster_defaults_still_accept_ordinary_values():
    parse_document(doc(cluster={**CLUSTER, "user": "ops_1.x", "identity": "/home/ops/.ssh/id_ed25519"}), "t")


# --- 3. [env] and [gates]: names, and no secrets ------------------------------------------------


@pytest.mark.parametrize("key", ["1ABC", "A=B", "", "BAD KEY", "A-B", "ÄB", "A\nB"])
@pytest.mark.parametrize("table", ["env", "gates"])
def test_a_bad_environment_name_is_refused_naming_it(table, key):
    found = problems(doc(**{table: {key: "1"}}))
    # the key as TOML writes it: quoted unless bare (env."A=B", env."")
    assert found == [
        f"{table}.{toml_key(key)}: {key[:60]!r} is not an environment variable name; fix: use letters, "
        "digits and '_', not starting with a digit (e.g. MY_FLAG)"
    ], found


SECRET_NAMES = [
    "HF_TOKEN",
    "OPENAI_API_KEY",
    "MY_PASSWORD",
    "AWS_SECRET_ACCESS_KEY",
    "GITHUB_TOKEN",
    "DB_PASSWD",
    "API_KEY_FILE_CONTENTS",
    "hf_token",
    "SLACK_APIKEY",
    "CLIENT_SECRET",
    "WORKER_PASS",
]


@pytest.mark.parametrize("key", SECRET_NAMES)
@pytest.mark.parametrize("table", ["env", "gates"])
def test_a_secret_looking_name_never_reaches_a_profile(table, key):
    value = "hf_sEcReTvAlUe123"
    message = refused(doc(**{table: {key: value}}), f"{table}.{key}", "secret", "file", "fix:")
    assert value not in message


@given(
    prefix=st.from_regex(r"([A-Z][A-Z0-9]{0,5}_){0,2}", fullmatch=True),
    word=st.sampled_from(["KEY", "TOKEN", "SECRET", "PASSWORD", "APIKEY", "PASSWD"]),
    suffix=st.from_regex(r"(_[A-Z][A-Z0-9]{0,5}){0,2}", fullmatch=True),
)
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_no_secret_looking_name_passes(prefix, word, suffix):
    key = f"{prefix}{word}{suffix}"
    message = refused(doc(env={key: "s3cr3t-value"}), f"env.{key}", "secret")
    assert "s3cr3t-value" not in message


@pytest.mark.parametrize(
    "key",
    [
        "DSV41_MAX_NEW_TOKENS",
        "SGLANG_RUST_BUILD_MODE",
        "NCCL_IB_TC",
        "KEYBOARD_LAYOUT",
        "SGLANG_BYPASS_CHECK",
        "DSV41_PREFILL_EMPTY_CACHE_TOKENS",
    ],
)
def test_names_that_only_resemble_a_secret_are_not_secrets(key):
    assert not models.looks_like_secret(key)


def test_plan_of_a_profile_with_a_secret_fails_without_printing_it(tmp_path, tp4_cli):
    profile = tmp_path / "p.toml"
    profile.write_text(dumps(doc(env={"HF_TOKEN": "hf_abcdefSECRET"})))
    before = sorted(tmp_path.iterdir())
    code, out, err = tp4_cli("plan", "--profile", profile)
    assert_user_error(code, out, err)
    assert "env.HF_TOKEN" in err and "hf_abcdefSECRET" not in out + err
    assert sorted(tmp_path.iterdir()) == before


# --- 4. numbers: whole TOML integers within what the hardware allows ----------------------------


def _strip(ann):
    return get_args(ann)[0] if get_origin(ann) is Annotated else ann


def _int_fields(model: type[BaseModel], prefix: str = "") -> list[tuple[str, object]]:
    """(dotted path, annotation) of every integer field (int, Literal of ints, optional or not)."""
    out = []
    for name, info in model.model_fields.items():
        path = f"{prefix}{name}"
        ann = info.annotation
        options = [_strip(a) for a in (get_args(ann) if get_origin(ann) not in (Literal, None) else ())] or [ann]
        nested = [a for a in options if isinstance(a, type) and issubclass(a, BaseModel)]
        if nested and name != "workers":
            out += _int_fields(nested[0], path + ".")
        elif any(a is int or (get_origin(a) is Literal and all(type(v) is int for v in get_args(a))) for a in options):
            out.append((path, ann))
    return out


INT_FIELDS = [path for path, _ in _int_fields(models.Profile)]


def test_every_integer_field_is_found():
    assert {
        "engine.tp",
        "engine.ep",
        "engram.cache_gib",
        "cluster.head.ssh_port",
        "fabric.nccl.ib_disable",
        "fabric.nccl.cross_nic",
        "runtime.skip_smoke",
    } <= set(INT_FIELDS)
    assert len(INT_FIELDS) >= 35


@given(
    path=st.sampled_from(INT_FIELDS),
    value=st.one_of(
        st.booleans(),
        st.integers(min_value=2**63),
        st.integers(max_value=-(2**63)),
        st.floats(allow_nan=True),
        st.text(alphabet="0123456789", min_size=1, max_size=4),
    ),
)
@settings(max_examples=200, deadline=None)
def test_no_boolean_huge_fractional_or_quoted_number_passes(path, value):
    refused(at(doc(), path, value), path)


@pytest.mark.parametrize(
    "path,value,words",
    [
        ("engine.ep", True, ("whole number", "true")),
        ("engine.tp", True, ("whole number",)),
        ("runtime.skip_smoke", False, ("whole number", "false")),
        ("engine.tp", 5001, ("5001", "at most 8")),
        ("engine.ep", 5001, ("at most 8",)),
        ("engram.cache_gib", 99999999999, ("99999999999", "at most 128")),
        ("engine.max_running_requests", 2**64 + 1, (str(2**64 + 1),)),
        ("fabric.nccl.buffsize", 2**70, ("at most",)),
        ("model.expected_shards", 4.0, ("whole number", "4.0")),
        ("cluster.shm_size", "99999999999g", ("128",)),
    ],
)
def test_absurd_numbers_are_refused_naming_the_field(path, value, words):
    refused(at(doc(), path, value), path, *words)


def test_more_nodes_than_the_line_supports_is_refused():
    workers = [{"name": f"w{i}", "ip": f"10.0.1.{i}"} for i in range(8)]
    refused(
        doc(cluster={"head": CLUSTER["head"], "workers": workers}, engine={"tp": 8}),
        "cluster.workers",
        "8 items",
        "at most 7",
    )


# --- 5. files: read regular files only, bounded; write regular files or new paths only ----------


def _tp4(*args: str, cwd: Path, timeout: float = 30) -> subprocess.CompletedProcess:
    """The real CLI in a child with a 1 GiB address-space cap, so a read of /dev/zero fails fast."""

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))

    env = {**os.environ, "PYTHONPATH": str(REPO / "python")}
    return subprocess.run(
        [sys.executable, "-m", "tp4", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        preexec_fn=cap,
        check=False,
    )


READERS = [
    ["profile", "check"],
    ["plan", "--profile"],
    ["profile", "import", "-o", "out.toml"],
    ["sources", "verify", "--manifest"],
    ["sources", "diff"],
]
KINDS = ["/dev/zero", "fifo", "directory", "big", "empty path"]
# `--manifest ''` still means the default manifest (tp4.image.sources.manifest.chosen_path)
FILE_CASES = [(c, k) for c in READERS for k in KINDS if not (k == "empty path" and c[-1] == "--manifest")]


@pytest.mark.parametrize("command,kind", FILE_CASES, ids=[f"{' '.join(c)}-{k}" for c, k in FILE_CASES])
def test_only_regular_files_of_bounded_size_are_read(tmp_path, command, kind):
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "directory").mkdir()
    with open(tmp_path / "big", "wb") as f:
        f.truncate(64 << 20)
    name = {
        "fifo": str(tmp_path / "fifo"),
        "directory": str(tmp_path / "directory"),
        "big": str(tmp_path / "big"),
        "empty path": "",
    }.get(kind, kind)
    args = [*command, name] if command[1] != "import" else ["profile", "import", name, "-o", "out.toml"]
    before = sorted(tmp_path.iterdir())
    proc = _tp4(*args, cwd=tmp_path)
    assert_user_error(proc.returncode, proc.stdout, proc.stderr)
    assert sorted(tmp_path.iterdir()) == before


@pytest.mark.parametrize("kind", ["fifo", "link to /dev/full", "link to /dev/null"])
def test_import_never_replaces_a_special_file(tmp_path, tp4_cli, kind):
    target = tmp_path / "out"
    if kind == "fifo":
        os.mkfifo(target)
    else:
        target.symlink_to(kind.removeprefix("link to "))
    code, out, err = tp4_cli("profile", "import", ENV_FILE, "-o", target, "--force")
    assert_user_error(code, out, err)
    assert "regular file" in err
    assert target.is_fifo() if kind == "fifo" else target.is_symlink() and target.resolve().is_char_device()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


@pytest.mark.parametrize(
    "output,words",
    [
        ("missing-dir/p.toml", ("does not exist",)),
        ("/proc/tp4-test-profile.toml", ("cannot write",)),
        ("", ("empty",)),
        ("existing-dir", ("directory",)),
    ],
)
def test_import_output_problems_are_user_errors(tmp_path, tp4_cli, monkeypatch, output, words):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "existing-dir").mkdir()
    code, out, err = tp4_cli("profile", "import", ENV_FILE, "-o", output, "--force")
    assert_user_error(code, out, err)
    assert all(w in err for w in words), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["existing-dir"]
    assert list((tmp_path / "existing-dir").iterdir()) == []


def test_import_over_a_regular_file_with_force_still_works(tmp_path, tp4_cli):
    target = tmp_path / "p.toml"
    target.write_text("old")
    code, out, err = tp4_cli("profile", "import", ENV_FILE, "-o", target, "--force")
    assert code == 0, err
    text = target.read_text()
    assert text != "old" and "[cluster.head]" in text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.toml"]


# --- 6. messages say the value and the fix in words ---------------------------------------------


def _form_fields(model: type[BaseModel], prefix: str = "") -> list[str]:
    out = []
    for name, info in model.model_fields.items():
        ann = info.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            out += _form_fields(ann, f"{prefix}{name}.")
        elif any("Form" in getattr(getattr(m, "func", None), "__qualname__", "") for m in info.metadata):
            out.append(f"{prefix}{name}")
    return out


FORM_FIELDS = _form_fields(models.Profile)


def test_every_textual_form_field_is_found():
    assert {"model.served_name", "model.hf_repo", "image.tag", "engine.host", "fabric.nccl.proto"} <= set(FORM_FIELDS)


@given(path=st.sampled_from(FORM_FIELDS), value=st.sampled_from(["--x", " spaced value", "a\nb", "$(id)", "", "ÜBER"]))
@settings(max_examples=60, deadline=None)
def test_a_value_of_the_wrong_form_is_refused_with_the_value_and_the_fix(path, value):
    refused(at(doc(), path, value), path, repr(value)[:40], "fix: write it like")


# --- any value of any TOML type in any field: a plain answer, never an internal one -------------


def _leaf_fields(model: type[BaseModel], prefix: str = "") -> list[str]:
    out = []
    for name, info in model.model_fields.items():
        ann = info.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            out += _leaf_fields(ann, f"{prefix}{name}.")
        else:
            out.append(f"{prefix}{name}")
    return out


LEAF_FIELDS = _leaf_fields(models.Profile)
TOML_VALUES = st.recursive(
    st.one_of(st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=20)),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=6,
)


@given(path=st.sampled_from(LEAF_FIELDS), value=TOML_VALUES)
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_any_value_in_any_field_is_accepted_or_refused_in_plain_words(path, value):
    try:
        parse_document(at(doc(), path, value), "t.toml")
    except InvalidInput as exc:
        assert exc.problems
        for p in exc.problems:
            assert not any(m in p for m in INTERNAL), p
            # each problem says how to fix it in words
            assert "; fix: " in p, p


@pytest.mark.parametrize("name", ["", "../registry", "presets/production", "production.toml", "/etc/passwd"])
def test_a_preset_is_a_name_never_a_path(name):
    with pytest.raises(InvalidInput) as exc:
        parse_document({"preset": name}, "t.toml")
    assert exc.value.problems and exc.value.problems[0].startswith(f"preset: unknown preset {name!r}")


# --- engine.drop_args: names a flag a lower layer sets, nothing else ----------------------------


@pytest.mark.parametrize(
    "item",
    [
        "\x00",
        "--sleep-on-idle\x00",
        "--sleep-on-idle\n",
        "\n",
        "-",
        "--",
        "---sleep-on-idle",
        "-sleep-on-idle",
        " --sleep-on-idle",
        "--sleep-on-idle=1",
        "--SLEEP-ON-IDLE",
        "flashinfer_cutlass",
        "--api-key",
        "$(reboot)",
        "--" + "x" * 200,
    ],
)
def test_a_drop_of_anything_but_an_inherited_flag_is_refused_naming_it(item):
    problem = refused(
        doc(engine={"drop_args": [item]}),
        "engine.drop_args[0]",
        "is not a flag a lower layer sets",
        "; fix: name one of --enable-cache-report",
    )
    assert repr(item[:60]) in problem
    # shown escaped: no control character or line break of the item reaches the message
    assert not any(c in problem for c in "\x00\n\r")


@pytest.mark.parametrize("value", [3, "--sleep-on-idle", {"a": 1}, [1], [["--sleep-on-idle"]], [True]])
def test_a_drop_args_of_the_wrong_kind_is_refused_with_a_fix(value):
    found = problems(doc(engine={"drop_args": value}))
    assert found and all(p.startswith("engine.drop_args") and "; fix: " in p for p in found), found


@given(item=st.text(max_size=30))
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_any_drop_is_an_inherited_flag_or_refused_in_plain_words(item):
    try:
        loaded = parse_document(doc(engine={"drop_args": [item]}), "t.toml")
    except InvalidInput as exc:
        assert exc.problems[0].startswith("engine.drop_args[0]: ") and "; fix: " in exc.problems[0]
        assert not any(c in p for p in exc.problems for c in "\x00\n\r")
    else:
        assert item.startswith("--") and item not in loaded.profile.engine.extra_args
