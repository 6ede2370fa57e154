"""The importer reads a bash-syntax profile as bash does, or refuses it with the line and a reason:
never a different value. Checked against real bash run the way the upstream launcher sources its
profile (`set -euo pipefail; set -a; source FILE`)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tp4.core.errors import InvalidInput
from tp4.line.profile.legacy import import_env_text, parse_env_text

pytestmark = pytest.mark.unit

NAMES = ("A", "B", "C", "Z")  # Z is never assigned directly: a ${Z:=...} side effect would show
FIXTURE = Path(__file__).parent / "fixtures" / "env.tp4.production"


def bash_values(path: Path, user: str = "zurih") -> tuple[bool, dict[str, str]]:
    """(bash sourced the file without an error, the values of NAMES it set)."""
    script = (
        'set -euo pipefail; set -a; source "$1"; '
        'for n in A B C Z; do if [ -n "${!n+x}" ]; then printf "%s=%s\\0" "$n" "${!n}"; fi; done'
    )
    home = "/root" if user == "root" else f"/home/{user}"
    env = {"HOME": home, "USER": user, "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    run = subprocess.run(
        ["bash", "-c", script, "bash", str(path)], env=env, cwd=path.parent, capture_output=True, timeout=20
    )
    values = {}
    for item in run.stdout.split(b"\0"):
        if item:
            name, _, value = item.partition(b"=")
            values[name.decode()] = value.decode("utf-8", "surrogateescape")
    return run.returncode == 0 and not run.stderr, values


def ours(text: str) -> dict[str, str]:
    assignments, _ = parse_env_text(text, "gen.env")
    return {a.name: a.value for a in assignments if a.name in NAMES}


def check_against_bash(path: Path, text: str, user: str = "zurih") -> None:
    path.write_bytes(text.encode())
    ok, expected = bash_values(path, user)
    try:
        got = ours(text)
    except InvalidInput as exc:
        # refusing is allowed, but always with the line and never for a file that is only a comment
        assert re.search(r"gen\.env line \d+: ", str(exc)), str(exc)
        number = int(re.search(r"line (\d+)", str(exc)).group(1))
        assert 1 <= number <= text.count("\n") + 1
        return
    assert ok, f"bash refuses what was read: {text!r}"
    assert got == expected, (text, got, expected)


# fragments of values bash reads one way, and (RISKY) fragments the importer may only refuse
SAFE = [
    "x",
    "a1",
    "/",
    ":",
    "-",
    ".",
    "=",
    "#",
    ",",
    "@",
    "%",
    "+",
    "^",
    "{",
    "}",
    "[",
    "]",
    "*",
    "?",
    "!",
    "é",
    "~",
    "~/",
    ":~",
    ":~/",
    " ",
    "\t",
    ";",
    " #c",
    "\n",
    "\f",
    "'q w'",
    "'$A'",
    "''",
    "'~'",
    '"d q"',
    '"$A"',
    '"${A}"',
    '"\\$"',
    '"\\\\"',
    '"\\x"',
    '"a\\"b"',
    '""',
    '"~/"',
    '"$"',
    "\\ ",
    "\\$",
    "\\\\",
    "\\'",
    '\\"',
    "\\\n",
    "\\",
    "\\~",
    "\\:",
    "$A",
    "${A}",
    "${A:-d}",
    "${A-d}",
    "${A:+p}",
    "${A+p}",
    "${Z:-z}",
    "${Z-z}",
    "${Z:+z}",
    "${Z+z}",
    "${Z:-a b}",
    "${Z:-$A}",
    "$HOME",
    "${HOME}",
    "$USER",
    "${USER:-u}",
    "$",
    "$/",
    "$:",
    "$'a\\tb'",
    "$'\\x41'",
    "$'\\x4'",
    "$'\\101'",
    "$'\\7'",
    "$'\\z'",
    "$'\\''",
    "$'\\\"'",
    "$'\\x'",
    "$'\\e'",
    "$'\\n'",
    "$'\\r'",
    "$''",
    "$'~'",
]
RISKY = [
    "~x",
    "~+",
    "~-",
    "\r",
    "\r\n",
    "${A:=d}",
    "${Z:=d}",
    "${Z?}",
    "${#A}",
    "${!A}",
    "${A/x/y}",
    "${A:0:1}",
    "$Z",
    "$UNSET",
    "$'\\0'",
    "$'\\x00'",
    "$'\\u00e9'",
    "$'\\cA'",
    "$'\\400'",
    "$'\\xff'",
    "$1",
    "$$",
    "$@",
    "$#",
    "$?",
    "$!",
    "$-",
    "$_",
    "$0",
    "$*",
    "${1}",
    "${#}",
    "${@}",
    '$"t"',
    "$(echo x)",
    "`echo x`",
    "$((1+1))",
    "$[1]",
    "&",
    "|",
    "<",
    ">",
    "(",
    ")",
]


@st.composite
def values(draw: st.DrawFn) -> str:
    parts = draw(st.lists(st.sampled_from(SAFE), max_size=4))
    if draw(st.integers(0, 5)) == 0:  # now and then one fragment that must be refused
        parts.insert(draw(st.integers(0, len(parts))), draw(st.sampled_from(RISKY)))
    return "".join(parts)


NAME = st.sampled_from(["A", "B", "C"])
VALUE = values()


@st.composite
def lines(draw: st.DrawFn) -> str:
    out = [draw(st.sampled_from(["A=a", "A='a b'", "# A unset"]))]
    for _ in range(draw(st.integers(1, 4))):
        prefix = draw(st.sampled_from(["", "", "export ", "  ", "# c\n"]))
        words = [
            f"{draw(NAME)}{draw(st.sampled_from(['=', '=', '+=']))}{draw(VALUE)}"
            for _ in range(draw(st.integers(1, 2)))
        ]
        out.append(prefix + draw(st.sampled_from([" ", ";", "; "])).join(words))
    return "\n".join(out) + draw(st.sampled_from(["\n", "\n", "\n", "\n", "", "\r\n", " # end\n"]))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=lines())
@example("A=$'a\\tb\\x41\\101\\z'\n")
@example("A=x:~/y:~\nB=~\n")
@example("A=1 B=$A\n")
@example("A=a\nexport A= A=$A\n")  # export expands every argument before it assigns
@example("A=x\r\n")
@example("A=a\nA=~\\\n\n")  # a continuation is removed before bash reads words: ~ ends the word
@example("B=q\nA=$\\\nB\n")
@example("# comment \\\nA=1\n")  # no continuation in a comment
@example("A=\\\\\nB=2\n")
def test_the_parser_gives_the_value_bash_gives_or_refuses_with_the_line(tmp_path, text):
    check_against_bash(tmp_path / "gen.env", text)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(user=st.sampled_from(["root", "bob", "zurih"]), value=VALUE)
def test_home_and_user_are_those_of_worker_user(tmp_path, user, value):
    # WORKER_USER set after its first use still decides $HOME (the launcher runs as that user)
    # (a blank line between: a continuation at the end of the value must not swallow WORKER_USER)
    check_against_bash(tmp_path / "gen.env", f"A={value}\n\nWORKER_USER={user}\n", user)


@pytest.mark.parametrize(
    "text,value",
    [
        ("A=$'tab\\there'\n", "tab\there"),
        ("A=$'\\x41\\102\\z\\x'\n", "AB\\z\\x"),
        ("A=$'it\\'s'\n", "it's"),
        ("A=a:~/b\n", "a:/home/zurih/b"),
        ("A=x=~/b\n", "x=~/b"),
        ('A="~/b"\n', "~/b"),
        ("A=~'/b'\n", "~/b"),
        ("A=1; B=2; A+=$B\n", "12"),
        ("A=1 B=2\nA=$A$B\n", "12"),
        ("A=x#y # comment\n", "x#y"),
        ("A=$/$:$\n", "$/$:$"),
        ("A=${Z:+set}${Z-unset}\n", "unset"),
        ("A=x\\\n", "x"),
        ("A=x\\", "x\\"),
    ],
)
def test_bash_values(tmp_path, text, value):
    path = tmp_path / "gen.env"
    path.write_text(text)
    assert bash_values(path)[1]["A"] == value  # the case really is bash's behaviour
    assert ours(text)["A"] == value


@pytest.mark.parametrize(
    "text,needle",
    [
        ("A=$1\n", "special parameter"),
        ("A=$$\n", "special parameter"),
        ("A=$@\n", "special parameter"),
        ("A=$#\n", "special parameter"),
        ("A=$?\n", "special parameter"),
        ("A=$!\n", "special parameter"),
        ("A=${1}\n", "special parameter"),
        ("A=$_\n", "special parameter"),
        ('A="x$-"\n', "special parameter"),
        ("A=1\r\n", "carriage return"),
        ("A='1'\r\n", "carriage return"),
        ("\r\n", "carriage return"),
        ("A=$'\\0'\n", "NUL"),
        ("A=$'\\u00e9'\n", "locale"),
        ("A=$'\\cA'\n", "locale"),
        ("A=$'\\xff'\n", "0x7f"),
        ("A=$UNSET\n", "set -u"),
        ("A=${UNSET}\n", "set -u"),
        ("A=${Z:=1}\n", "side effect"),
        ("A=${#B}\n", "not read"),
        ("A=~bob/x\n", "~user"),
        ('A=$"t"\n', "translated"),
        ("A=1;;\n", "syntax error"),
        ("; A=1\n", "syntax error"),
        ("A=1 echo\n", "as a command"),
        ("HOME=/x\n", "change what $HOME"),
        ("export USER=x\n", "change what $HOME"),
        ("A=$[1]\n", "arithmetic"),
        ("A=$((1))\n", "not supported"),
    ],
)
def test_what_bash_would_read_differently_is_refused_with_the_line(text, needle):
    with pytest.raises(InvalidInput) as exc:
        parse_env_text("# header\n" + text, "p.env")
    assert "p.env line 2: " in str(exc.value) and needle in str(exc.value), str(exc.value)


def test_a_nul_byte_is_refused_with_its_line():
    with pytest.raises(InvalidInput, match=r"p\.env line 3: a NUL byte"):
        parse_env_text("A=1\nB=2\nC=a\x00b\n", "p.env")


def test_a_crlf_profile_is_refused_at_its_first_assignment():
    text = FIXTURE.read_text().replace("\n", "\r\n")
    first = next(
        i for i, t in enumerate(FIXTURE.read_text().splitlines(), 1) if not t.startswith("#")
    )  # a blank CRLF line is a command "\r" to bash
    with pytest.raises(InvalidInput) as exc:
        import_env_text(text, ".env.tp4")
    assert f".env.tp4 line {first}: a carriage return" in str(exc.value) and "dos2unix" in str(exc.value)


def test_the_fixture_reads_exactly_as_bash_reads_it(tmp_path):
    path = tmp_path / ".env.tp4"
    path.write_text(FIXTURE.read_text())
    script = 'set -euo pipefail; set -a; source "$1"; env -0'
    env = {"HOME": "/home/zurih", "USER": "zurih", "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    run = subprocess.run(["bash", "-c", script, "bash", str(path)], env=env, capture_output=True, check=True)
    bash = dict(item.split("=", 1) for item in run.stdout.decode().split("\0") if "=" in item)
    assignments, _ = parse_env_text(FIXTURE.read_text())
    assert {a.name: a.value for a in assignments} == {a.name: bash[a.name] for a in assignments}
