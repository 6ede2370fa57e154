"""Hostile values (issue 25, items 9 and 10): values that passed but must not (numbers the consumer
reads differently, addresses that are not addresses, words longer than the kernel takes) and
messages that misled. Each is refused as a user error naming the field, with the fix."""

from __future__ import annotations

import json
import os

import pytest

from test_hostile_input import assert_user_error, at, doc, problems, refused

pytestmark = pytest.mark.unit


def refused_with(d: dict, field: str, *words: str) -> str:
    """Some problem on field holds every word (a gate may fail a rule as well as its own check)."""
    mine = [p for p in problems(d) if p.startswith(f"{field}:")]
    assert any(all(w in p for w in words) for p in mine), (field, words, mine)
    return mine[0]


# --- gate values: parsed as the launcher reads them (ASCII digits, finite floats, bounded) -------

INT_GATE = "DSV41_ENGRAM_DRM_LAYER"  # kind int, min 0 (adapters/registry.toml)
FLOAT_GATE = "DSV41_L2_PREFETCH_MB"  # kind float, min 0.0


@pytest.mark.parametrize("value", ["٣", " 3", "3 ", "+3", "3_000", "-0", "007", "9" * 4000, "0x10", "3.0", "１"])
def test_an_integer_gate_takes_plain_ascii_digits_only(value):
    refused_with(doc(gates={INT_GATE: value}), f"gates.{INT_GATE}", "whole number", "ASCII")


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e400", "NaN", " 1", "1_0", "٣.5", "0x1p3", "1e"])
def test_a_float_gate_takes_finite_ascii_numbers_only(value):
    refused_with(doc(gates={FLOAT_GATE: value}), f"gates.{FLOAT_GATE}", "finite number")


def test_a_negative_where_the_gate_has_a_minimum_names_the_minimum():
    refused_with(doc(gates={INT_GATE: "-3"}), f"gates.{INT_GATE}", "at least 0")


@pytest.mark.parametrize("value", ["0", "3", "123456789012345678"])
def test_plain_integers_still_pass(value):
    from tp4.line.registry import load_registry

    assert load_registry().gate(INT_GATE).check(value) is None


@pytest.mark.parametrize("value", ["0", "0.5", "12.", ".5", "1e3", "2.5E-1"])
def test_plain_floats_still_pass(value):
    from tp4.line.registry import load_registry

    assert load_registry().gate(FLOAT_GATE).check(value) is None


# --- addresses: parsed with ipaddress, host names by RFC 1123; IPv6 in brackets in every URL ------


@pytest.mark.parametrize(
    "value", [":", "999.999.999.999", "0", "a-", "10.0.0", "10.0.0.256", "0.0.0.0", "::", "fe80::1%eth0", "spark1"]
)
@pytest.mark.parametrize("path", ["cluster.head.ip", "cluster.workers.1.ip"])
def test_a_fabric_ip_is_an_ip_address(path, value):
    from test_hostile_input import _field, _set

    refused(_set(doc(), path, value), _field(path), repr(value), "fix:")


@pytest.mark.parametrize("value", [":", "999.999.999.999", "0", "a-", "-a", "a..b", "a_b", "x" * 64, "1.2.3"])
def test_an_ssh_address_is_an_ip_address_or_a_host_name(value):
    refused(at(doc(), "cluster.head.ssh", value), "cluster.head.ssh", repr(value), "fix:")


@pytest.mark.parametrize("value", ["10.0.0.9", "fd00::9", "spark9", "spark9.lan", "spark9.lan.", "a-b.c0"])
def test_good_ssh_addresses_pass(value):
    from tp4.line.profile.load import parse_document

    parse_document(at(doc(), "cluster.head.ssh", value), "t.toml")


def _v6_profile(tmp_path, head: str = "fd00::1", port: int = 8888):
    text = f'preset = "production"\n[cluster]\nport = {port}\n[cluster.head]\nname = "spark1"\nip = "{head}"\n'
    for i in (2, 3, 4):
        text += f'[[cluster.workers]]\nname = "spark{i}"\nip = "fd00::{i}"\n'
    path = tmp_path / "v6.toml"
    path.write_text(text)
    return path


def test_an_ipv6_head_is_bracketed_in_the_api_url_and_the_dist_init_address(tmp_path):
    from tp4.hosts.doctor import rendezvous
    from tp4.line.plan import build_plan
    from tp4.line.profile import load_file
    from tp4.serving.api import Endpoint

    plan = build_plan(load_file(str(_v6_profile(tmp_path)), "fix"))
    assert plan.line.api == "http://[fd00::1]:8888"
    assert plan.line.dist_init_addr == "[fd00::1]:20000"
    assert plan.nodes[0].env["DIST_INIT_ADDR"] == "[fd00::1]:20000"
    assert rendezvous(plan) == ("fd00::1", 20000)
    assert Endpoint.from_plan(plan.line.api, {}, None).url == "http://[fd00::1]:8888"


def test_smoke_accepts_the_plan_of_an_ipv6_head(tmp_path, tp4_cli):
    # nothing listens on [::1]:1: the smoke runs and finds the API down (exit 1), never refusing its plan
    code, out, err = tp4_cli("smoke", "--profile", _v6_profile(tmp_path, head="::1", port=1))
    assert code == 1, (code, out, err)
    assert "http://[::1]:1: API down" in out, out  # refused, or unreachable where there is no IPv6
    assert "not an API address" not in out + err


# --- the fleet router's bind: an address or host, the port separate ------------------------------

FLEET_BASE = """preset = "production"
[cluster.head]
name = "s1"
ip = "10.0.0.1"
[[cluster.workers]]
name = "s2"
ip = "10.0.0.2"
[engine]
tp = 2
[nfs]
share = false
"""
FLEET_LINE_B = """[lines.set.cluster.head]
name = "s3"
ip = "10.0.0.3"
[[lines.set.cluster.workers]]
name = "s4"
ip = "10.0.0.4"
"""


def fleet_problems(tmp_path, router: str = "", b: str = FLEET_LINE_B) -> list[str]:
    from tp4.core.errors import InvalidInput
    from tp4.serving import fleet

    (tmp_path / "base.toml").write_text(FLEET_BASE)
    path = tmp_path / "fleet.toml"
    path.write_text(f'base = "base.toml"\n[[lines]]\nname = "a"\n\n[[lines]]\nname = "b"\n{b}\n[router]\n{router}\n')
    with pytest.raises(InvalidInput) as exc:
        fleet.load(path)
    assert exc.value.exit_code == 2
    return exc.value.problems


@pytest.mark.parametrize(
    "bind,words",
    [
        ("0.0.0.0:1", ("holds a port", "bind = '0.0.0.0' and port = 1")),
        ("[::]:30000", ("holds a port", "bind = '::'")),
        ("localhost:8080", ("holds a port",)),
        ("999.999.999.999", ("not an IPv4",)),
        (":", ("not an IPv4",)),
        ("[::1]", ("brackets",)),
        ("a-", ("not a host name",)),
        ("224.0.0.1", ("multicast",)),
    ],
)
def test_a_router_bind_is_an_address_without_a_port(tmp_path, bind, words):
    found = [p for p in fleet_problems(tmp_path, f"bind = {bind!r}".replace("'", '"')) if p.startswith("router.bind:")]
    assert found and all(w in found[0] for w in words), found


@pytest.mark.parametrize("bind", ["0.0.0.0", "::", "10.0.0.9", "fd00::9", "localhost", "router.lan"])
def test_a_router_bind_of_an_address_or_a_host_passes(bind):
    from tp4.serving import fleet

    assert fleet.Router.model_validate({"bind": bind}).bind == bind


# --- lengths: no argv word or environment string longer than the kernel takes -------------------

BIG = "x" * 131072  # with its NUL one byte over MAX_ARG_STRLEN


@pytest.mark.parametrize(
    "path,value,field",
    [
        ("env.MY_FLAG", BIG, "env.MY_FLAG"),
        ("engine.extra_args", ["--served-model-name", BIG], "engine.extra_args[1]"),
        ("model.dir", "/" + BIG, "model.dir"),
        ("cluster.head.workdir", "/" + BIG, "cluster.head.workdir"),
    ],
    ids=["env", "extra_args", "model.dir", "workdir"],
)
def test_a_word_longer_than_the_kernel_takes_is_refused_naming_the_field(path, value, field):
    refused_with(at(doc(), path, value), field, "MAX_ARG_STRLEN", "fix:")


def test_an_environment_string_counts_its_key():
    # "MY_FLAG=" + value + NUL: a value 8 bytes shorter than the limit is still over it
    refused_with(doc(env={"MY_FLAG": "x" * (131072 - 8)}), "env.MY_FLAG", "environment string")
    from tp4.line.profile.load import parse_document

    parse_document(doc(env={"MY_FLAG": "x" * (131072 - 9)}), "t.toml")


def test_the_environment_and_arguments_together_are_bounded():
    env = {f"MY_FLAG_{i}": "x" * 100_000 for i in range(12)}
    refused_with(doc(env=env), "env", "together", "ARG_MAX")


def test_profile_check_refuses_a_word_over_the_limit(tmp_path, tp4_cli):
    path = tmp_path / "p.toml"
    path.write_text(
        'preset = "production"\n[cluster.head]\nname = "spark1"\nip = "10.0.0.1"\n'
        + "".join(f'[[cluster.workers]]\nname = "spark{i}"\nip = "10.0.0.{i}"\n' for i in (2, 3, 4))
        + f'[env]\nMY_FLAG = "{BIG}"\n'
    )
    code, out, err = tp4_cli("profile", "check", path)
    assert_user_error(code, out, err)
    assert "env.MY_FLAG" in err and "MAX_ARG_STRLEN" in err and len(err) < 2000, err[:3000]


# --- the sources manifest: no control or blank character in any field -----------------------------

HEX40, HEX64 = "a" * 40, "b" * 64


@pytest.mark.parametrize("char", ["\x0b", "\x0c", "\x00", "\x1b", "\x7f", "\x85", "\xa0", "\u2028", "\u200b", "\ufeff"])
@pytest.mark.parametrize("column", [0, 1, 2, 3, 4])
def test_a_manifest_field_with_a_control_character_is_refused(tmp_path, tp4_cli, char, column):
    fields = ["thing", HEX40, HEX64, f"https://example.org/thing/archive/{HEX40}.tar.gz", "strip=1"]
    fields[column] += char
    path = tmp_path / "m"
    path.write_text("  ".join(fields[:4]) + "\n    " + fields[4] + "\n")
    code, out, err = tp4_cli("sources", "verify", "--manifest", path)
    assert_user_error(code, out, err)
    assert "line 1:" in err and f"U+{ord(char):04X}" in err and "fix:" in err, err


def test_a_url_ending_in_a_vertical_tab_no_longer_reads_as_another_kind():
    from tp4.core.errors import InvalidInput
    from tp4.image.sources import manifest as mf

    text = f"thing  {HEX40}  {HEX64}  https://example.org/a.tar.gz\x0b\n"
    with pytest.raises(InvalidInput, match="control or blank"):
        mf.parse(text)
    assert mf.parse(text.replace("\x0b", "")).rows[0].kind == "archive"


# --- echoed values are clipped: one helper (tp4.core.errors.clip), and no message line over 1000 --


@pytest.mark.parametrize(
    "set_",
    [
        'preset = "{v}"',
        "{v} = 1",
        '[lines.set.gates]\nDSV41_L2_PREFETCH_MB = "{v}"',
        '[lines.set.cluster.head]\nname = "s3"\nip = "10.0.0.3"\nssh = "-{v}"',
        '[lines.set.cluster.head]\nname = "{v}"\nip = "10.0.0.3"',
    ],
    ids=["preset", "key", "gate", "ssh", "name"],
)
def test_a_fleet_set_error_never_echoes_a_long_value_in_full(tmp_path, tp4_cli, set_):
    (tmp_path / "base.toml").write_text(FLEET_BASE)
    body = set_.format(v="x" * 5000)
    table = "" if body.startswith("[") else "[lines.set]\n"
    path = tmp_path / "fleet.toml"
    path.write_text(f'base = "base.toml"\n[[lines]]\nname = "a"\n{table}{body}\n')
    code, out, err = tp4_cli("fleet", "plan", "--fleet", path)
    assert_user_error(code, out, err)
    assert "x" * 1000 not in err and len(err) < 2500, len(err)
    assert "lines[0] (a)" in err


def test_clip_quotes_a_short_value_whole_and_a_long_one_with_its_length():
    from tp4.core.errors import clip

    assert clip("abc") == "'abc'"
    assert clip("x" * 5000) == repr("x" * 80) + "... (5000 characters)"


def test_no_error_line_is_longer_than_the_bound():
    from tp4.core.errors import MAX_LINE_CHARS, InvalidInput

    exc = InvalidInput("head " + "y" * 5000 + " tail", ["field: " + "z" * 5000 + "; fix: do this"])
    assert all(len(line) <= MAX_LINE_CHARS for line in exc.message.split("\n"))
    assert exc.problems[0].startswith("field: ") and exc.problems[0].endswith("; fix: do this")
    assert "characters left out" in exc.problems[0]


# --- numbers on the command line: one click type (tp4.cli.common.Number), ASCII, finite, bounded ----


def _numeric_options():
    import click

    from tp4.cli import cli

    ctx = click.Context(cli)

    def walk(name, command):
        yield name, command
        if isinstance(command, click.Group):
            for sub in command.list_commands(ctx):
                yield from walk(f"{name} {sub}", command.get_command(ctx, sub))

    for name, command in walk("tp4", cli):
        for param in command.params:
            yield name, param


def test_every_numeric_option_uses_the_one_number_type():
    import click

    from tp4.cli.common import Number

    loose = (click.types.IntParamType, click.types.FloatParamType)  # INT, FLOAT, IntRange, FloatRange
    bad = [f"{name} {p.opts[0]}" for name, p in _numeric_options() if isinstance(p.type, loose)]
    assert not bad, f"use tp4.cli.common.Number (Int, Float, PORT) for: {bad}"
    ports = [(name, p) for name, p in _numeric_options() if p.opts and p.opts[0] == "--port"]
    assert ports and all(p.type.low == 1 and p.type.high == 65535 and p.type.integer for _, p in ports), ports
    assert all(isinstance(p.type, Number) for _, p in ports)


HOSTILE_NUMBERS = ["nan", "inf", "-inf", "1e400", "٣", " 3", "3 ", "+3", "3_000", "-0", "0x10", "", "9" * 4400]


@pytest.mark.parametrize("value", HOSTILE_NUMBERS, ids=lambda v: repr(v[:12]))
@pytest.mark.parametrize(
    "args",
    [
        ("serve", "--slow-floor"),
        ("images", "--port"),
        ("hosts", "trust", "--port"),
        ("plan", "--rank"),
        ("stop", "--grace"),
        ("qeval", "--timeout"),
    ],
    ids=" ".join,
)
def test_a_hostile_number_is_refused_naming_the_option(tp4_cli, args, value):
    code, out, err = tp4_cli(*args, value)
    assert code == 2, (code, out, err[-500:])
    assert f"Invalid value for '{args[-1]}'" in err and "fix:" in err, err[-500:]
    assert "Traceback" not in err and len(err) < 2000


@pytest.mark.parametrize("value", ["=5", "start=nan", "=", "start=", "٣", "1_0", "ready=inf", "start=1e400"])
def test_a_hostile_serve_timeout_is_refused(value):
    from tp4.cli.common import timeouts
    from tp4.core.errors import InvalidInput

    with pytest.raises(InvalidInput, match="--timeout"):
        timeouts((value,))


def test_plain_timeouts_still_work():
    from tp4.cli.common import timeouts

    assert timeouts(("start=30", "0.5"))["start"] == 0.5
    assert timeouts(("ready=1e3",))["ready"] == 1000.0


@pytest.mark.parametrize("text,integer,expected", [("22", True, 22), ("0.5", False, 0.5), ("2e3", False, 2000.0)])
def test_plain_numbers_still_parse(text, integer, expected):
    from tp4.cli.common import parse_number

    assert parse_number(text, 0, 65535, integer=integer) == expected


def test_a_port_out_of_range_is_refused_before_anything_suggests_it(tp4_cli):
    code, out, err = tp4_cli("images", "--worker", "192.0.2.1", "--port", "99999999999999999999")
    assert code == 2 and "Invalid value for '--port'" in err and "1 to 65535" in err, err


# --- images: a hostile --worker is refused before anything runs; failures say why, not "see above" --


@pytest.mark.parametrize("worker", ["-oProxyCommand=x", "a;b", "a/b", "$(id)", "a\x00b"])
def test_a_hostile_worker_is_refused_before_any_node_is_asked(tp4_cli, worker):
    code, out, err = tp4_cli("images", "--worker", worker)
    assert_user_error(code, out, err)
    assert err.startswith("error: --worker:") and "fix:" in err and out == "", err
    assert "see above" not in err


# --- profile import -o: a dangling symbolic link exists ----------------------------------------------


@pytest.mark.parametrize("force", [False, True])
def test_import_never_replaces_a_dangling_symlink(tmp_path, tp4_cli, force):
    from test_hostile_input import ENV_FILE

    target = tmp_path / "out.toml"
    target.symlink_to(tmp_path / "missing" / "victim.toml")
    code, out, err = tp4_cli("profile", "import", ENV_FILE, "-o", target, *(["--force"] if force else []))
    assert_user_error(code, out, err)
    assert "symbolic link" in err and "fix:" in err, err
    assert target.is_symlink() and os.readlink(target) == str(tmp_path / "missing" / "victim.toml")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.toml"]


# --- the image store's config.yml: its directory quoted as YAML, or refused -------------------------


@pytest.mark.parametrize("name", ["a#b", "a #b", "a: b", "a'b", 'a"b', "a\\b", "ü ß", "- x", "[x]", "{x}", "&x *y"])
def test_the_store_directory_reaches_config_yml_verbatim(name):
    from pathlib import Path

    from tp4.image import imagestore

    root = Path("/state") / name / "tp4" / "registry"
    text = imagestore.config_text(root, 5000)
    # a JSON string is a YAML double-quoted scalar (YAML 1.2 is a superset of JSON)
    (line,) = [x for x in text.splitlines() if x.strip().startswith("rootdirectory:")]
    assert json.loads(line.split(":", 1)[1]) == str(root / "data")
    try:
        import yaml
    except ImportError:  # not a dependency of tp4's tests; read where it is installed
        return
    parsed = yaml.safe_load(text)
    assert parsed["storage"]["filesystem"]["rootdirectory"] == str(root / "data")
    assert parsed["http"]["addr"] == "127.0.0.1:5000"


@pytest.mark.parametrize("char", ["\n", "\r", "\x1b", "\x85", "\u2028", "\x7f", "\udcff"])  # no path holds a NUL
def test_a_store_directory_config_yml_cannot_carry_is_refused_before_anything_is_made(tmp_path, char):
    from tp4.core.errors import InvalidInput
    from tp4.image import imagestore

    root = tmp_path / f"state{char}x" / "tp4" / "registry"
    with pytest.raises(InvalidInput, match="XDG_STATE_HOME"):
        imagestore.start(root)
    assert list(tmp_path.iterdir()) == []


# --- the checkpoint's common link: only a link is ever replaced ---------------------------------------


@pytest.mark.parametrize("kind", ["regular file", "directory", "link to a file", "fifo"])
def test_the_common_link_never_replaces_what_is_not_a_model_link(tmp_path, kind):
    from tp4.core.errors import InvalidInput
    from tp4.hosts.checkpoint import link

    model = tmp_path / "model"
    model.mkdir()
    common = tmp_path / "common"
    if kind == "regular file":
        common.write_text("someone's data")
    elif kind == "directory":
        common.mkdir()
    elif kind == "fifo":
        os.mkfifo(common)
    else:
        (tmp_path / "notes.txt").write_text("notes")
        common.symlink_to(tmp_path / "notes.txt")
    before = (common.is_symlink(), common.is_file(), common.is_dir())
    said = []
    with pytest.raises(InvalidInput, match="model.common_link") as exc:
        link(model, common, said.append)
    assert "fix:" in str(exc.value) and said == []
    assert (common.is_symlink(), common.is_file(), common.is_dir()) == before
    if kind == "regular file":
        assert common.read_text() == "someone's data"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


@pytest.mark.parametrize("kind", ["nothing", "link to another model", "dangling link"])
def test_the_common_link_is_made_or_moved_to_the_model(tmp_path, kind):
    from tp4.hosts.checkpoint import link

    model, old = tmp_path / "model", tmp_path / "old-model"
    model.mkdir()
    common = tmp_path / "common"
    if kind == "link to another model":
        old.mkdir()
        common.symlink_to(old)
    elif kind == "dangling link":
        common.symlink_to(tmp_path / "removed-model")
    said = []
    link(model, common, said.append)
    assert os.readlink(common) == str(model) and said


# --- outputs the CLI replaces: a regular file or a new path, never a device --------------------------


@pytest.mark.parametrize("kind", ["char device", "fifo", "dangling link"])
@pytest.mark.parametrize("command", [("plan", "-o"), ("doctor", "-o")], ids=" ".join)
def test_an_output_that_is_no_regular_file_is_never_replaced(tmp_path, tp4_cli, command, kind):
    target = tmp_path / "out"
    if kind == "char device":
        target.symlink_to("/dev/null")  # stands for any device: a rename over it replaces the device
    elif kind == "fifo":
        os.mkfifo(target)
    else:
        target.symlink_to(tmp_path / "nowhere")
    code, out, err = tp4_cli(*command, target)
    assert_user_error(code, out, err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert target.is_fifo() if kind == "fifo" else target.is_symlink()


@pytest.mark.parametrize("value", ["٣", " 5", "5 ", "nan", "1e3", "+5"])
def test_a_hostile_percentage_is_refused(value):
    from tp4.core.errors import InvalidInput
    from tp4.measuring.report import parse_percent

    with pytest.raises(InvalidInput, match="not a percentage"):
        parse_percent(value, "--fail-on-regression")


# --- the classes, not only the examples (hypothesis) -------------------------------------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@given(text=st.text(max_size=30))
@settings(max_examples=300, deadline=None)
def test_an_integer_gate_passes_exactly_the_canonical_ascii_integers(text):
    import re

    from tp4.line.registry import load_registry

    gate = load_registry().gate(INT_GATE)  # min 0
    canonical = re.fullmatch(r"0|[1-9][0-9]{0,17}", text, re.ASCII) is not None or text.lower() in gate.off
    assert (gate.check(text) is None) == canonical, text


@given(number=st.floats(allow_nan=True, allow_infinity=True), text=st.text(max_size=12))
@settings(max_examples=300, deadline=None)
def test_a_float_gate_never_passes_a_non_finite_or_non_ascii_number(number, text):
    import math

    from tp4.line.registry import load_registry

    gate = load_registry().gate(FLOAT_GATE)  # min 0.0
    for value in (repr(number), text):
        if gate.check(value) is None and value.lower() not in gate.off:  # an off value turns it off
            assert value.isascii() and value == value.strip() and "_" not in value
            assert math.isfinite(float(value)) and float(value) >= 0


@given(text=st.text(max_size=40))
@settings(max_examples=300, deadline=None)
def test_a_fabric_ip_is_accepted_only_as_an_ip_address(text):
    import ipaddress

    from tp4.line.profile.models import _check_ip

    try:
        _check_ip(text)
    except ValueError as exc:
        assert "fix:" in str(exc)
        return
    address = ipaddress.ip_address(text)
    assert not address.is_unspecified and not address.is_multicast


@given(text=st.text(max_size=40))
@settings(max_examples=300, deadline=None)
def test_an_ipv6_address_is_always_bracketed_in_a_url(text):
    import ipaddress

    from tp4.core import netaddr

    url = f"http://{netaddr.host_port(text, 8888)}"
    try:
        v6 = ipaddress.ip_address(text).version == 6
    except ValueError:
        v6 = False
    assert url.startswith(f"http://[{text}]:") == v6
    if v6:
        assert netaddr.split_host_port(netaddr.host_port(text, 8888)) == (text, "8888")


@given(text=st.text(max_size=30), integer=st.booleans())
@settings(max_examples=400, deadline=None)
def test_a_cli_number_is_accepted_only_in_its_ascii_form_and_bounds(text, integer):
    import math

    from tp4.cli.common import parse_number

    try:
        value = parse_number(text, 1, 65535, integer=integer)
    except ValueError as exc:
        assert "expected" in str(exc) or "is not" in str(exc)
        return
    assert text.isascii() and text == text.strip() and "_" not in text and "+" not in text[:1]
    assert math.isfinite(value) and 1 <= value <= 65535


@given(message=st.text(max_size=3000), problems=st.lists(st.text(max_size=3000), max_size=3))
@settings(max_examples=100, deadline=None)
def test_no_error_line_is_ever_longer_than_the_bound(message, problems):
    from tp4.core.errors import MAX_LINE_CHARS, InvalidInput

    exc = InvalidInput(message, problems)
    assert all(len(line) <= MAX_LINE_CHARS for line in exc.message.split("\n"))
