"""Import of an upstream bash-syntax profile (.env.tp4) into a tp4 profile.

The upstream launcher runs `set -euo pipefail; set -a; source .env.tp4`, so the file is bash. We
read its assignments without running bash, and every value is either exactly the value bash gives
or refused with the line and the reason (tests/test_legacy_bash.py compares against real bash):

- read: `NAME=value` and `NAME+=value` (several on one line, optionally after `export`), `;`,
  comments, single and double quotes, backslash escapes and line continuations, `$'...'` (ANSI-C:
  the escapes of printable ASCII and the usual control letters), `$VAR`, `${VAR}`,
  `${VAR:-word}`, `${VAR-word}`, `${VAR:+word}`, `${VAR+word}`, and `~` where bash expands it
  (at the start of a value and after an unquoted `:`);
- refused: command and arithmetic substitution, the special parameters (`$1`, `$$`, `$@`, `$#`,
  `$?`, `$!`, `$-`, `$_`, `$0`, ...), `${VAR:=...}`/`${VAR:?...}` and the other `${...}` forms,
  `$"..."`, `~user`/`~+`/`~-`, a variable that is not set earlier in the file (the launcher runs
  under `set -u` and stops there), carriage returns (a Windows line ending: bash keeps the `\\r`
  in the value) and NUL bytes, `HOME=`/`USER=` (they would change what `~` means), and anything
  that is not an assignment.

`$HOME` and `~` are the home of the user running the launcher, and `$USER` that user. tp4 runs
every node as `cluster.user` (WORKER_USER), so they read as WORKER_USER's home (`/home/<user>`,
`/root` for root) and name, exactly as bash gives them when the launcher runs as that user, and
the importer says so in a note. Host paths under that home are then written `~/...`, which tp4
expands to each node's own home; anything else (container env, engine arguments) keeps the
literal path, as upstream passes it.

The variables are then mapped onto the profile fields that render the same container env and
engine argv (upstream `start.sh`, `files/nccl.sh`, `boot.py`). The result sits on the
`launcher-defaults` preset, so every value comes from the file or from the launcher's defaults.
The head's working directory is the checkout holding the file (its state-tp4/ is the head's
/state), unless told otherwise. Anything that looks like a credential (API_KEY, SGLANG_API_KEY,
HF_TOKEN, *_SECRET, *_PASSWORD, also as EXTRA_CONTAINER_ENV items; in EXTRA_SGLANG_ARGS every flag
that takes a secret: --api-key, --admin-api-key, any flag whose name holds key, token, secret or
password) is dropped with a note saying where it goes instead; it never reaches the profile, a
message or a plan. Messages name the file's variable, value and line, and the profile field.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from tp4.core.errors import InvalidInput
from tp4.line.knobs import KNOBS, LAUNCHER_VARS, Imports

if TYPE_CHECKING:
    from tp4.line.registry import Registry

# Internal markers for $HOME / ~ and $USER while the file is read: replaced by the home and the
# name of WORKER_USER before parse_env_text returns (WORKER_USER may be set after its first use).
# A file never holds NUL (refused), so a marker cannot be confused with text.
_HOME = "\x00HOME\x00"
_USER = "\x00USER\x00"
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_EXTRA_ITEM = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
OFF_KEYS = ("", "none", "off", "dummy", "0")
# upstream's launcher defaults for WORKER_USER and SSH_IDENTITY (the author's own login): an
# imported file without them is written with them; a tp4 profile's own defaults are the local user's
DEFAULT_USER = "zurih"
DEFAULT_IDENTITY = "~/.ssh/id_ed25519_shared"
# bash's blanks: only space and tab separate words (a form feed or \v is part of a word)
_BLANKS = " \t"
_WORD_END = ("", "\n", ";", " ", "\t")
_CR = (
    "a carriage return (a Windows line ending): bash keeps it in the value (TP_SIZE=4\\r is not 4); "
    "fix: convert the file to Unix line endings (dos2unix {file})"
)
# Bounds on what expansion may build: `X=$X$X` forty times is ~150 bytes of file and 2 TB of value.
# No setting of a profile is near these (the kernel takes at most 128 KiB in one argv word or env
# value); a file past them is refused naming the line and variable, before the memory is spent.
MAX_VALUE_BYTES = 1 << 20  # one expanded value
MAX_EXPANDED_BYTES = 16 << 20  # every value of the file together
MAX_NESTING = 32  # ${A:-${B:-...}} inside one another

_ANSI = {
    "a": "\a",
    "b": "\b",
    "e": "\x1b",
    "E": "\x1b",
    "f": "\f",
    "n": "\n",
    "r": "\r",
    "t": "\t",
    "v": "\v",
    "\\": "\\",
    "'": "'",
    '"': '"',
    "?": "?",
}


@dataclass
class Assignment:
    name: str
    value: str
    line: int


def _is_name_start(ch: str) -> bool:
    return ch == "_" or ("a" <= ch <= "z") or ("A" <= ch <= "Z")


def _is_name_char(ch: str) -> bool:
    return _is_name_start(ch) or ("0" <= ch <= "9")


def redact(text: str) -> str:
    """Text shown in a message, with anything that looks like a credential's value hidden."""
    from tp4.line.profile.models import looks_like_secret, secret_flag

    # an engine flag that takes a secret (--api-key, --admin-api-key, --hf-token...): its value
    text = re.sub(
        r"(--[A-Za-z0-9_-]+)([= ]+)\S+",
        lambda m: f"{m.group(1)}{m.group(2)}<hidden>" if secret_flag(m.group(1)) else m.group(0),
        text,
    )
    return re.sub(
        r"\b([A-Za-z_][A-Za-z0-9_]*)=(\S*)",
        lambda m: f"{m.group(1)}=<hidden>" if looks_like_secret(m.group(1)) else m.group(0),
        text,
    )


def _shown(value: str, limit: int = 60) -> str:
    """A value as a message shows it: control characters escaped, secrets hidden, cut short."""
    text = value if value.isprintable() else repr(value)[1:-1]
    text = redact(text)
    return text if len(text) <= limit else text[:limit] + "..."


def _join_lines(text: str) -> tuple[str, list[int]]:
    """The text with bash's line continuations (a backslash before a newline) removed, as bash
    removes them before it reads words (a continuation between `$` and `A` still gives `$A`), and
    the line of each character left. Not in single quotes, $'...' or comments; an escaped
    backslash (two of them) is no continuation."""
    out: list[str] = []
    lines: list[int] = []
    line = 1
    state = "plain"  # plain | double | single | ansi | comment
    i = 0

    def put(ch: str) -> None:
        nonlocal line
        out.append(ch)
        lines.append(line)
        if ch == "\n":
            line += 1

    while i < len(text):
        ch = text[i]
        nxt = text[i + 1] if i + 1 < len(text) else ""
        if state in ("plain", "double") and ch == "\\":
            if nxt == "\n":
                line += 1
                i += 2
                continue
            put(ch)
            if nxt:
                put(nxt)
            i += 2
            continue
        if state == "ansi" and ch == "\\":
            put(ch)
            if nxt:
                put(nxt)
            i += 2
            continue
        if state == "plain":
            if ch == "'":
                state = "single"
            elif ch == '"':
                state = "double"
            elif ch == "$" and nxt == "'":
                put(ch)
                ch, i, state = nxt, i + 1, "ansi"
            elif ch == "#" and (not out or out[-1] in " \t\n;&|()<>"):
                state = "comment"
        elif (
            (state == "double" and ch == '"')
            or (state in ("single", "ansi") and ch == "'")
            or (state == "comment" and ch == "\n")
        ):
            state = "plain"
        put(ch)
        i += 1
    return "".join(out), lines


class _Parser:
    def __init__(self, text: str, source: str) -> None:
        nul = text.find("\x00")
        if nul >= 0:
            raise InvalidInput(
                f"{source} line {text.count(chr(10), 0, nul) + 1}: a NUL byte; bash drops it, so the value "
                "would differ; fix: remove it"
            )
        self.text, self.lines = _join_lines(text)
        self.source = source
        self.pos = 0
        self.vars: dict[str, str] = {}
        self.out: list[Assignment] = []
        self.home_lines: list[int] = []
        self.name = ""  # the variable being assigned, for a refusal's message
        self.expanded = 0  # the bytes of every value so far (MAX_EXPANDED_BYTES)
        self.nesting = 0  # ${...} open around the parser's position (MAX_NESTING)

    def fail(self, line: int, msg: str) -> NoReturn:
        raise InvalidInput(f"{self.source} line {line}: {msg}")

    def too_long(self, line: int, size: int) -> NoReturn:
        self.fail(
            line,
            f"{self.name}: its value expands to more than {MAX_VALUE_BYTES} bytes ({size} so far; "
            "$-expansions repeat what earlier lines set); no setting is that long (the kernel takes at most "
            f"128 KiB in one argument); fix: write {self.name}'s value without repeating expansions",
        )

    def grown(self, line: int, parts: list[str], size: int, piece: str) -> int:
        """parts with piece appended, and their new size: refused past MAX_VALUE_BYTES before any
        join builds the string."""
        size += len(piece)
        if size > MAX_VALUE_BYTES:
            self.too_long(line, size)
        parts.append(piece)
        return size

    def cr(self) -> NoReturn:
        self.fail(self.line, _CR.format(file=self.source))

    def peek(self, n: int = 0) -> str:
        i = self.pos + n
        return self.text[i] if i < len(self.text) else ""

    @property
    def line(self) -> int:
        if self.pos < len(self.lines):
            return self.lines[self.pos]
        return self.lines[-1] if self.lines else 1

    def advance(self) -> str:
        ch = self.text[self.pos]
        self.pos += 1
        return ch

    def skip_blanks(self) -> int:
        n = 0
        while self.peek() and self.peek() in _BLANKS:
            self.advance()
            n += 1
        return n

    def skip_comment(self) -> None:
        while self.peek() and self.peek() != "\n":
            self.advance()

    def rest_of_line(self) -> str:
        end = self.text.find("\n", self.pos)
        return self.text[self.pos : end if end >= 0 else len(self.text)]

    def parse(self) -> list[Assignment]:
        while self.pos < len(self.text):
            ch = self.peek()
            if ch in _BLANKS or ch == "\n":
                self.advance()
            elif ch == "#":
                self.skip_comment()
            elif ch == "\r":
                self.cr()
            elif ch == ";":
                self.fail(self.line, "a ';' with no command before it is a bash syntax error; fix: remove it")
            else:
                self._command()
        return self.out

    def _name(self) -> str:
        start = self.pos
        if _is_name_start(self.peek()):
            while _is_name_char(self.peek()):
                self.advance()
        return self.text[start : self.pos]

    def _not_assignment(self, line: int, text: str) -> NoReturn:
        from tp4.line.profile.models import looks_like_secret

        shown = _shown(text.strip())
        secret = next((m for m in re.finditer(r"[A-Za-z_][A-Za-z0-9_]*", shown) if looks_like_secret(m.group(0))), None)
        if secret is not None:  # HF_TOKEN hf_...: the rest may be the secret itself
            shown = shown[: secret.end()] + " <rest hidden>"
        self.fail(line, f"not a KEY=VALUE assignment: {shown!r}; only assignments (and comments) are read")

    def _command(self) -> None:
        """One simple command made only of assignments (bash performs them left to right)."""
        start_line = self.line
        start = self.pos
        word = self._name()
        exported = word == "export" and self.peek() in _BLANKS
        if exported:
            self.skip_blanks()
            start = self.pos
            word = self._name()
        if not word or not (self.peek() == "=" or (self.peek() == "+" and self.peek(1) == "=")):
            self.pos = start
            self._not_assignment(start_line, self.rest_of_line())
        done: list[Assignment] = []
        try:
            self._assignments(word, exported, done)
        finally:
            # `export` expands all its arguments before it assigns any (`export A= B=$A` sees the old A)
            for a in done:
                self.vars[a.name] = a.value
            self.out.extend(done)

    def _assignments(self, word: str, exported: bool, done: list[Assignment]) -> None:
        while True:
            line = self.line
            append = self.peek() == "+"
            if append and exported:
                self.fail(line, "`export NAME+=value` is not read; fix: write NAME+=value without export")
            if word in ("HOME", "USER"):
                self.fail(
                    line,
                    f"{word}=...: it would change what $HOME, ~ and $USER mean for the rest of the file; tp4 reads "
                    "them as the home and name of WORKER_USER; fix: remove the line (set WORKER_USER)",
                )
            self.advance()
            if append:
                self.advance()
            self.name = word
            value = self._value(line)
            if append:
                before = self.vars.get(word, "")
                if len(before) + len(value) > MAX_VALUE_BYTES:
                    self.too_long(line, len(before) + len(value))
                value = before + value
            self.expanded += len(value)
            if self.expanded > MAX_EXPANDED_BYTES:
                self.fail(
                    line,
                    f"{word}: the file's values expand to more than {MAX_EXPANDED_BYTES} bytes together "
                    "($-expansions repeat what earlier lines set); a profile is a few KiB; "
                    f"fix: write {word}'s value without repeating expansions",
                )
            done.append(Assignment(word, value, line))
            if not exported:
                self.vars[word] = value
            blanks = self.skip_blanks()
            ch = self.peek()
            if ch in ("", "\n"):
                return
            if ch == "#":  # a value ends only at a blank, ';' or a line end, so this '#' starts a word
                self.skip_comment()
                return
            if ch == ";":
                self.advance()
                self.skip_blanks()
                if self.peek() == ";":
                    self.fail(self.line, "';;' is a bash syntax error here; fix: remove one ';'")
                return
            if ch == "\r":
                self.cr()
            if blanks and _is_name_start(ch):
                word = self._name()
                if not (self.peek() == "=" or (self.peek() == "+" and self.peek(1) == "=")):
                    from tp4.line.profile.models import looks_like_secret

                    shown = "the next word" if looks_like_secret(done[-1].name) else repr(word)
                    self.fail(
                        line,
                        f"a value with spaces must be quoted: bash would run {shown} as a command, with the "
                        "assignments in its environment only; fix: quote the value, or put each assignment on its own line",
                    )
                continue
            if blanks:
                self.fail(
                    line,
                    "a value with spaces must be quoted (bash would run the rest as a command); fix: quote the value",
                )
            self.fail(line, f"unexpected {ch!r}; only plain assignments are read")

    def _value(self, line: int) -> str:
        parts: list[str] = []
        size = 0
        tilde_here = True  # bash expands ~ at the start of an assignment's value and after an unquoted ':'
        while True:
            ch = self.peek()
            if ch in _WORD_END:
                break
            if ch == "\r":
                self.cr()
            if tilde_here and ch == "~":
                nxt = self.peek(1)
                self.advance()
                tilde_here = False
                if nxt in _WORD_END or nxt in "/:":
                    parts.append(_HOME)
                    self.home_lines.append(line)
                elif nxt in "\"'\\":
                    parts.append("~")  # a quoted character in the tilde-prefix: bash leaves it as it is
                else:
                    self.fail(
                        line,
                        f"'~{_shown(nxt)}...': bash would expand ~user, ~+ or ~- from the launcher's system; "
                        "fix: write the path literally (~/ is read as the home of WORKER_USER)",
                    )
                continue
            tilde_here = False
            if ch == "'":
                self.advance()
                size = self.grown(line, parts, size, self._single(line))
            elif ch == '"':
                self.advance()
                size = self.grown(line, parts, size, self._double(line))
            elif ch == "\\":
                self.advance()
                nxt = self.peek()
                if nxt == "":
                    parts.append("\\")  # bash keeps a backslash at the very end of the file
                elif nxt == "\r":
                    self.cr()
                else:
                    parts.append(self.advance())
            elif ch == "$":
                size = self.grown(line, parts, size, self._dollar(line, quoted=False))
            elif ch == "`":
                self.fail(line, "command substitution is not supported; write the value literally")
            elif ch in "()<>|&":
                self.fail(line, f"unexpected {ch!r}; only plain assignments are read")
            else:
                if ch == ":":
                    tilde_here = True
                size = self.grown(line, parts, size, self.advance())
        return "".join(parts)

    def _single(self, line: int) -> str:
        start = self.pos
        while self.peek() != "'":
            if self.peek() == "":
                self.fail(line, "unterminated single quote")
            if self.peek() == "\r":
                self.cr()
            self.advance()
        text = self.text[start : self.pos]
        self.advance()
        return text

    def _double(self, line: int) -> str:
        parts: list[str] = []
        size = 0
        while True:
            ch = self.peek()
            if ch == "":
                self.fail(line, "unterminated double quote")
            if ch == "\r":
                self.cr()
            if ch == '"':
                self.advance()
                return "".join(parts)
            if ch == "\\":
                self.advance()
                nxt = self.peek()
                if nxt == "":
                    self.fail(line, "unterminated double quote")
                if nxt == "\r":
                    self.cr()
                self.advance()
                parts.append(nxt if nxt in '$`"\\' else "\\" + nxt)
            elif ch == "$":
                size = self.grown(line, parts, size, self._dollar(line, quoted=True))
            elif ch == "`":
                self.fail(line, "command substitution is not supported; write the value literally")
            else:
                parts.append(self.advance())

    def _special(self, line: int, shown: str) -> NoReturn:
        self.fail(
            line,
            f"{shown} is a special parameter of the shell running the launcher (its arguments, process ids, "
            "last status or flags), so its value depends on how the launcher is run; fix: write the value literally",
        )

    def _dollar(self, line: int, *, quoted: bool) -> str:
        self.advance()  # '$'
        ch = self.peek()
        if ch == "(":
            self.fail(line, "command substitution and $((...)) are not supported; write the value literally")
        if ch == "[":
            self.fail(line, "$[...] arithmetic is not supported; write the number literally")
        if ch == "{":
            self.advance()
            if self.nesting >= MAX_NESTING:
                self.fail(
                    line,
                    f"{self.name}: ${{...}} nested more than {MAX_NESTING} deep inside one another; "
                    f"fix: set the defaults on lines of their own (A=${{B:-x}}, then C=${{A:-y}})",
                )
            self.nesting += 1
            try:
                return self._braced(line)
            finally:
                self.nesting -= 1
        if ch == "'" and not quoted:
            self.advance()
            return self._ansi_c(line)
        if ch == '"' and not quoted:
            self.fail(line, '$"..." (a translated string) is not read; fix: use plain double quotes')
        if ch and (ch.isdigit() or ch in "@*#?-$!"):
            self._special(line, f"${ch}")
        if _is_name_start(ch):
            name = self._name()
            if name == "_":
                self._special(line, "$_")
            return self._lookup(name, line)
        return "$"

    def _braced(self, line: int) -> str:
        ch = self.peek()
        if ch in ("#", "!"):
            self.fail(line, f"${{{ch}...}} is not read; use $VAR, ${{VAR}} or ${{VAR:-default}}")
        name = self._name()
        if not name or name == "_":
            if ch and (ch.isdigit() or ch in "@*#?-$!_"):
                self._special(line, f"${{{ch}...}}")
            self.fail(line, "unsupported ${...} expansion; use $VAR, ${VAR} or ${VAR:-default}")
        if self.peek() == "}":
            self.advance()
            return self._lookup(name, line)
        op = self.peek()
        if op == ":" and self.peek(1) in ("-", "+"):
            op = ":" + self.peek(1)
            self.advance()
            self.advance()
        elif op in ("-", "+"):
            self.advance()
        elif op in ("=", "?") or (op == ":" and self.peek(1) in ("=", "?")):
            self.fail(
                line,
                f"${{{name}{op}...}} assigns {name} or stops the launcher as a side effect; "
                f"fix: set {name} on its own line",
            )
        else:
            self.fail(
                line,
                "unsupported ${...} expansion; use $VAR, ${VAR}, ${VAR:-default}, ${VAR-default}, "
                "${VAR:+word} or ${VAR+word}",
            )
        word = self._brace_word(line)
        self.advance()  # '}'
        is_set = name in self.vars or name in ("HOME", "USER")
        value = self._lookup(name, line) if is_set else ""
        if op == ":-":
            return word if value == "" else value
        if op == "-":
            return value if is_set else word
        if op == ":+":
            return word if value != "" else ""
        return word if is_set else ""

    def _brace_word(self, line: int) -> str:
        parts: list[str] = []
        size = 0
        while True:
            ch = self.peek()
            if ch == "}":
                return "".join(parts)
            if ch in ("", "\n"):
                self.fail(line, "unterminated ${...}")
            if ch == "\r":
                self.cr()
            if ch == "$":
                if self.peek(1) in ("'", '"'):
                    self.fail(line, "quotes inside ${...:-...} are not read; fix: write the default without quotes")
                size = self.grown(line, parts, size, self._dollar(line, quoted=True))
            elif ch in "\"'\\`~{;&|<>()":
                self.fail(
                    line,
                    f"{ch!r} inside ${{...:-...}} is not read; fix: write the default without quotes, "
                    "escapes, ~ or shell operators",
                )
            else:
                parts.append(self.advance())

    def _ansi_c(self, line: int) -> str:
        parts: list[str] = []
        while True:
            ch = self.peek()
            if ch == "":
                self.fail(line, "unterminated $'...'")
            if ch == "\r":
                self.cr()
            if ch == "'":
                self.advance()
                return "".join(parts)
            if ch != "\\":
                parts.append(self.advance())
                continue
            self.advance()
            esc = self.peek()
            if esc in _ANSI:
                self.advance()
                parts.append(_ANSI[esc])
            elif esc in "01234567" and esc:
                digits = ""
                while len(digits) < 3 and self.peek() and self.peek() in "01234567":
                    digits += self.advance()
                parts.append(self._ansi_code(line, int(digits, 8), f"\\{digits}"))
            elif esc == "x":
                self.advance()
                digits = ""
                while len(digits) < 2 and self.peek() and self.peek() in "0123456789abcdefABCDEF":
                    digits += self.advance()
                parts.append(self._ansi_code(line, int(digits, 16), f"\\x{digits}") if digits else "\\x")
            elif esc and esc.isascii() and esc.isprintable() and esc not in "uUc":
                self.advance()
                parts.append("\\" + esc)  # bash keeps an escape it does not know
            else:
                self.fail(
                    line,
                    f"the escape \\{_shown(esc)} in $'...' is not read (\\u, \\U and \\c depend on the locale); "
                    "fix: write the character itself",
                )

    def _ansi_code(self, line: int, code: int, shown: str) -> str:
        if code == 0 or code > 0x7F:
            self.fail(
                line,
                f"{shown} in $'...': bash cuts the value at a NUL byte and keeps bytes above 0x7f raw; "
                "fix: write the character itself",
            )
        return chr(code)

    def _lookup(self, name: str, line: int) -> str:
        if name == "HOME":
            self.home_lines.append(line)
            return _HOME
        if name == "USER":
            self.home_lines.append(line)
            return _USER
        if name in self.vars:
            return self.vars[name]
        self.fail(
            line,
            f"${name} is not set earlier in the file: the launcher sources it under `set -u` and stops there "
            f"({name}: unbound variable), and tp4 reads the file alone, not the launcher's environment; "
            f"fix: set {name} above this line, use ${{{name}:-default}}, or write the value (an experiment arm "
            "that extends its base file's value: tp4 profile import .env.tp4 --overlay ARM.env)",
        )


def parse_env_text(text: str, source: str = "<env>") -> tuple[list[Assignment], list[str]]:
    """The assignments of a bash-syntax profile, each with the value bash gives it, and notes."""
    parser = _Parser(text, source)
    assignments = parser.parse()
    notes: list[str] = []
    user_lines = [a for a in assignments if a.name == "WORKER_USER"]
    user = user_lines[-1].value if user_lines else DEFAULT_USER
    if _HOME in user or _USER in user:
        parser.fail(
            user_lines[-1].line,
            "WORKER_USER: the user name cannot come from $HOME, $USER or ~ (tp4 reads them as "
            "WORKER_USER's own home and name); fix: write the name",
        )
    home = "/root" if user == "root" else f"/home/{user}"
    if parser.home_lines:
        lines = ", ".join(str(n) for n in sorted(set(parser.home_lines)))
        notes.append(
            f"{source} line {lines}: $HOME and ~ read as {home} and $USER as {user}: the home and name of WORKER_USER"
            f"{'' if user_lines else ' (not set: the launcher default)'}, as bash gives them when the launcher runs "
            "as that user; host paths under it are written ~/... (each node's own home)"
        )
    # $HOME, ~ and $USER stand for home and user: bound what replacing them builds, as expansion is
    total = 0
    for a in assignments:
        size = len(a.value) + a.value.count(_HOME) * (len(home) - 1) + a.value.count(_USER) * (len(user) - 1)
        total += size
        if size > MAX_VALUE_BYTES or total > MAX_EXPANDED_BYTES:
            parser.name = a.name
            if size > MAX_VALUE_BYTES:
                parser.too_long(a.line, size)
            parser.fail(
                a.line,
                f"{a.name}: the file's values expand to more than {MAX_EXPANDED_BYTES} bytes together with "
                f"$HOME, ~ and $USER read as {_shown(home)} and {_shown(user)}; fix: write the values without them",
            )
    out = [Assignment(a.name, a.value.replace(_HOME, home).replace(_USER, user), a.line) for a in assignments]
    return out, notes


# --- mapping onto the profile --------------------------------------------------------------------


def _words(v: str) -> list[str]:
    return [w for w in re.split(r"[ \t\n,]+", v) if w]


def _strict_int(var: str, v: str) -> int:
    # Python's int() would take " 4", "4\n", "+4", "4_0" and other digits; upstream passes the text as it is
    if not re.fullmatch(r"-?[0-9]{1,19}", v):
        raise ValueError(f"{var}={_shown(v)!r} is not a whole number")
    return int(v)


def _int(var: str) -> Callable[[str], int]:
    return lambda v: _strict_int(var, v)


def _bit(var: str) -> Callable[[str], int]:
    def conv(v: str) -> int:
        if v not in ("0", "1"):
            raise ValueError(f"{var} must be 0 or 1, got {_shown(v)!r}")
        return int(v)

    return conv


def _fraction(var: str) -> Callable[[str], Any]:
    def conv(v: str) -> Any:
        if not re.fullmatch(r"[0-9]*\.?[0-9]+|[0-9]+\.", v):
            raise ValueError(f"{var}={_shown(v)!r} is not a number")
        f = float(v)
        whole, _, frac = repr(f).partition(".")
        return f if f"{whole}.{frac.ljust(2, '0')}" == v else v

    return conv


def _hcas(v: str) -> list[str]:
    # upstream passes IB_HCA verbatim as NCCL_IB_HCA; tp4 renders the names joined by ','
    items = v.split(",")
    if not v or any(not item or item != item.strip() for item in items):
        raise ValueError(f"IB_HCA={_shown(v)!r}: write the RDMA device names separated by ',' without spaces")
    return items


def _spec(v: str) -> str:
    return "none" if v.lower() in ("off", "none", "0", "") else v


def _converter(kind: Imports, var: str) -> Callable[[str], Any]:
    """The importer's conversion of an upstream value, by the knob table's `imports` name."""
    match kind:
        case "int":
            return _int(var)
        case "bit":
            return _bit(var)
        case "fraction":
            return _fraction(var)
        case "words":
            return _words
        case "hcas":
            return _hcas
        case "spec":
            return _spec
        case "args":
            return lambda v: re.split(r"[ \t\n]+", v.strip(" \t\n")) if v.strip(" \t\n") else []
        case "tokens":
            return lambda v: _strict_int(var, v) if v else 0
        case "ticks":
            return lambda v: _strict_int(var, v) * 10
        case "text" | "path":
            return str
    raise AssertionError(f"{var}: the importer has no conversion {kind!r}")


# legacy variable (or container env key set through EXTRA_CONTAINER_ENV) -> (profile path, converter):
# the knob table's container keys and the launcher's own variables (tp4.line.knobs)
TYPED: dict[str, tuple[tuple[str, ...], Callable[[str], Any]]] = {
    **{v.var: (tuple(v.field.split(".")), _converter(v.imports, v.var)) for v in LAUNCHER_VARS},
    **{
        k.env: (tuple(k.field.split(".")), _converter(k.imports, k.env))
        for k in KNOBS
        if k.imports is not None and k.imports != "fixed"
    },
}
# Host paths: under WORKER_USER's home they are written ~/..., which tp4 expands to each node's home.
HOME_RELATIVE = tuple(v.var for v in LAUNCHER_VARS if v.imports == "path")
# Values the launcher fixes; EXTRA_CONTAINER_ENV may only repeat them.
FIXED = {k.env: k.value for k in KNOBS if k.imports == "fixed" and k.value is not None}
# Read by the launcher itself, with no place in a tp4 profile.
LAUNCHER_ONLY = {
    "BUILD_DOCKERFILE": "the image variant is taken from it",
    "BUILD_ARGS": "tp4 builds the image with nix from pinned sources; no docker build arguments",
    "NNODES": "derived from the worker list",
    "WORKER_IPS": "imported as cluster.workers",
    "WORKER_HOSTS": "imported as cluster.workers",
    "GLOO_SOCKET_IFNAME": "imported as fabric.socket_ifname",
    "NCCL_SOCKET_IFNAME": "imported as fabric.socket_ifname",
    "NCCL_SWITCHLESS_RING_ONLY": "imported as fabric.mode",
    "NCCL_OVERLAY_PIP": "imported as fabric.nccl.mount",
    "NFS_SHARE": "imported as nfs.share",
    "NFS_SERVER_IP": "imported as nfs.server_ips",
    "WORKER_DIR": "imported as cluster.workers[].workdir",
    "WORKER_ENGRAM_DIR": "imported as cluster.workers[].engram_dir",
    "ENGRAM_DIR": "imported as cluster.head.engram_dir",
    "API_KEY": "keys are never imported",
    "WORKER_PASS": "passwords are never imported; tp4 uses ssh keys only",
    "EXTRA_CONTAINER_ENV": "imported as [gates] and [env]",
    "FORCE": "a per-run switch",
    "DOCTOR_STRICT": "a per-run switch",
    "REMOTE_TIMEOUT": "tp4 sets its own timeouts",
    "PULL_TIMEOUT": "tp4 sets its own timeouts",
    "BUILD_TIMEOUT": "tp4 sets its own timeouts",
    "NCCL_CONTAINER_DIR": "tp4 mounts a host NCCL at /nccl",
    "WORKER_FABRIC_IPS": "set nfs.server_ips per worker",
    "NFS_OPTS": "tp4 fixes the NFS mount options",
    "NFS_OPTS_CLIENT": "tp4 fixes the NFS mount options",
    "NFS_IMAGE": "not used",
    "NFS_CONTAINER": "not used",
    "HF_EXPORT_ROOT": "not used",
    "NFS_REUSE_EXPORT": "not used",
    "TP4_ENV_FILE": "not used",
    "STATE_DIR": "see cluster.head.state_dir",
    "LOG_DIR": "not used",
    "SERVE_LOG": "not used",
    "ENV_FILE": "not used",
    "ENV_EXAMPLE": "not used",
    "SGLANG_RUST_BUILD_MODE": "the launcher never forwards this line; it only acts inside EXTRA_CONTAINER_ENV",
    "DSV41_PREFILL_EMPTY_CACHE_TOKENS": "the launcher never forwards this line; it only acts inside EXTRA_CONTAINER_ENV",
}
# rendered per rank by tp4 from the cluster, never imported as values
RANK_KEYS = tuple(k.env for k in KNOBS if k.source == "rank" and k.imports is None)
# TYPED variables that act on the host (ssh, mounts, image, download): inside EXTRA_CONTAINER_ENV
# they are plain container env, not the knob
_HOST_SIDE = (*(v.var for v in LAUNCHER_VARS if v.var != "HEAD_MEM_FRACTION_STATIC"), "NCCL_IB_GID_INDEX")
# the variables that hold the serving API key (the launcher's own, and SGLang's)
API_KEY_NAMES = ("API_KEY", "SGLANG_API_KEY")
_VARIANTS = {"Dockerfile": "base", "Dockerfile.canary": "canary", "Dockerfile.canary-roce": "canary-roce"}


@dataclass
class ImportResult:
    toml: str
    document: dict[str, Any]
    summary: str
    notes: list[str] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    # one line per unknown variable: its line and, when one is close, the name it may mean
    unknown_text: list[str] = field(default_factory=list)


class ImportFailed(InvalidInput):
    """An import that gives no valid profile: the problems in the file's terms, and the
    variables it did not know (one of them may be the setting a problem says is missing)."""

    def __init__(self, message: str, problems: list[str], unknown: list[str]) -> None:
        super().__init__(message, problems)
        self.unknown = list(unknown)
        if self.unknown:
            self.message += (
                "\nnot imported (variables the TP4 launcher does not read, so nothing above counts them):\n"
                + "\n".join(f"  - {u}" for u in self.unknown)
            )
            self.args = (self.message,)


@dataclass(frozen=True)
class _Origin:
    line: int | None  # None: not a line of the file (the head's checkout)
    text: str  # the setting as the file has it, e.g. CHUNKED_PREFILL_SIZE=8192


def _set(doc: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    cur = doc
    for part in path[:-1]:
        cur = cur.setdefault(part, {})
    cur[path[-1]] = value


def _secret_note(where: str, name: str, inside: str = "") -> str:
    if name in API_KEY_NAMES:
        fix = "write the key to a file (mode 600) and set api.key_file"
    else:
        fix = (
            "keep it in a file (mode 600) outside the profile; tp4 takes credentials only from files "
            "(the serving API key: api.key_file)"
        )
    return f"{where}: {inside}{name} looks like a secret: not imported, and never written to a profile, a message or a plan; fix: {fix}"


def _without_secret_flags(args: list[str]) -> tuple[list[str], list[str]]:
    """``args`` without the engine flags that take a secret (models.secret_flag), each with its
    value (``--flag value`` or ``--flag=value``); and those flags, in order."""
    from tp4.line.profile.models import secret_flag

    out: list[str] = []
    dropped: list[str] = []
    skip = False
    for arg in args:
        flag = secret_flag(arg)
        if skip:
            skip = False
        elif flag is not None:
            dropped.append(flag)
            skip = "=" not in arg
        else:
            out.append(arg)
    return out, dropped


@dataclass
class _Import:
    """One import under way: the file's assignments (the last of each name) and what they became."""

    source: str
    final: dict[str, Assignment]
    reg: Registry
    home: str
    head_checkout: str | None
    doc: dict[str, Any] = field(default_factory=lambda: {"preset": "launcher-defaults"})
    origin: dict[str, _Origin] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)
    unknown_text: list[str] = field(default_factory=list)
    # the workers' IPs and host names, once read (the head and NNODES are checked against them)
    ips: list[str] = field(default_factory=list)
    hosts: list[str] = field(default_factory=list)

    def where(self, a: Assignment) -> str:
        return f"{self.source} line {a.line}"

    def setting(self, a: Assignment) -> _Origin:
        return _Origin(a.line, f"{a.name}={_shown(a.value)}")

    def get(self, name: str) -> str | None:
        a = self.final.get(name)
        return a.value if a else None

    def typed(self, key: str, value: str, a: Assignment, at: _Origin) -> None:
        """A variable of the knob table's import rows (TYPED), through its row's converter."""
        path, conv = TYPED[key]
        try:
            converted = conv(value)
        except ValueError as exc:
            self.errors.append(f"{self.source} line {a.line}: {exc}")
            return
        if key in HOME_RELATIVE and isinstance(converted, str):
            converted = _home_rel(converted, self.home)
        _set(self.doc, path, converted)
        self.origin[".".join(path)] = at


# The importer's steps, in order: the variables each reads (the launcher's variables whose meaning
# spans more than one knob row) -> the step. The first converts every variable on its own: the knob
# table's import rows (TYPED), the launcher-only and rank variables, gates, secrets, unknown names.
_STEPS: list[tuple[tuple[str, ...], Callable[[_Import], None]]] = []


def _step(*variables: str) -> Callable[[Callable[[_Import], None]], Callable[[_Import], None]]:
    def register(fn: Callable[[_Import], None]) -> Callable[[_Import], None]:
        _STEPS.append((variables, fn))
        return fn

    return register


@_step()
def _each_variable(imp: _Import) -> None:
    """Every assignment on its own: a knob table import row, a launcher-only or rank variable, a
    gate, a fixed value, a secret, or unknown."""
    final, notes, where, setting, reg = imp.final, imp.notes, imp.where, imp.setting, imp.reg
    unknown, unknown_text, apply_typed = imp.unknown, imp.unknown_text, imp.typed
    doc, origin = imp.doc, imp.origin
    from tp4.line.profile.models import looks_like_secret

    known = [*TYPED, *LAUNCHER_ONLY, *reg.gates]
    for name, a in final.items():
        value = a.value
        if name in TYPED:
            apply_typed(name, value, a, setting(a))
        elif name in LAUNCHER_ONLY or name in RANK_KEYS or re.fullmatch(r"WORKER\d+_(IP|HOST)|NFS_SERVER_IP_\d+", name):
            reason = LAUNCHER_ONLY.get(name, "")
            if (
                reason
                and not reason.startswith("imported as")
                and name not in ("BUILD_DOCKERFILE", "NNODES", "EXTRA_CONTAINER_ENV", "API_KEY")
            ):
                notes.append(f"{where(a)}: {name} not imported: {reason}")
        elif reg.gate(name) is not None:
            gate = reg.gate(name)
            if (gate is not None and gate.forwarded) or name == "SGLANG_DSPARK_FOLDED_SAMPLING":
                doc.setdefault("gates", {})[name] = value
                origin[f"gates.{name}"] = setting(a)
            else:
                notes.append(
                    f"{where(a)}: {name} is an adapter gate the launcher only passes through EXTRA_CONTAINER_ENV; "
                    f"not imported (fix: move it into EXTRA_CONTAINER_ENV if it is meant)"
                )
        elif name in FIXED:
            continue
        elif looks_like_secret(name):
            notes.append(_secret_note(where(a), name))
        else:
            unknown.append(name)
            hint = difflib.get_close_matches(name, known, n=1, cutoff=0.7)
            unknown_text.append(
                f"{name} ({where(a)}) is not a variable the TP4 launcher reads; not imported"
                + (f" (did you mean {hint[0]}?)" if hint else "")
            )


@_step("WORKER_USER", "SSH_IDENTITY")
def _launcher_login(imp: _Import) -> None:
    """The ssh login upstream's launcher uses for a file without WORKER_USER or SSH_IDENTITY: its
    own defaults, facts of the imported file, written out (a profile without them logs in as the
    local user with ssh's own keys)."""
    for var, path, default in (
        ("WORKER_USER", ("cluster", "user"), DEFAULT_USER),
        ("SSH_IDENTITY", ("cluster", "identity"), DEFAULT_IDENTITY),
    ):
        if imp.get(var):
            continue
        _set(imp.doc, path, default)
        imp.notes.append(
            f"{imp.source}: {var} not set: upstream's launcher default {default} is written as {'.'.join(path)}, "
            "as the launcher logs in; fix: set it to your own (without it tp4 logs in "
            + ("as the local user)" if var == "WORKER_USER" else "with ssh's own keys)")
        )


@_step("WORKER_IPS", "WORKER_HOSTS", "WORKER_DIR", "WORKER_ENGRAM_DIR")
def _workers(imp: _Import) -> None:
    """cluster.workers: WORKER_IPS/WORKER_HOSTS or WORKERn_IP/WORKERn_HOST, with WORKER_DIR and WORKER_ENGRAM_DIR."""
    final, doc, origin, errors = imp.final, imp.doc, imp.origin, imp.errors
    get, setting, source, home = imp.get, imp.setting, imp.source, imp.home
    ips = _words(get("WORKER_IPS") or "")
    hosts = _words(get("WORKER_HOSTS") or "")
    ip_at = final.get("WORKER_IPS")
    host_at = final.get("WORKER_HOSTS")
    if not ips:
        n = 1
        while get(f"WORKER{n}_IP") is not None:
            ips.append(get(f"WORKER{n}_IP") or "")
            hosts.append(get(f"WORKER{n}_HOST") or get(f"WORKER{n}_IP") or "")
            ip_at = ip_at or final[f"WORKER{n}_IP"]
            host_at = host_at or final.get(f"WORKER{n}_HOST")
            n += 1
    if not hosts:
        hosts = list(ips)
        host_at = ip_at
    if len(ips) != len(hosts):
        errors.append(
            f"{source}: WORKER_IPS has {len(ips)} entries but WORKER_HOSTS has {len(hosts)}; fix: give one host name per IP, in rank order"
        )
    if not ips:
        errors.append(
            f"{source}: no workers; fix: set WORKER_IPS and WORKER_HOSTS (rank order), or, for an experiment "
            "arm, import its base file with the arm as an overlay: tp4 profile import .env.tp4 --overlay ARM.env"
        )
    workers: list[dict[str, Any]] = []
    for i, (ip, host) in enumerate(zip(ips, hosts, strict=False)):  # unequal lengths were reported above
        w: dict[str, Any] = {"name": host, "ssh": host, "ip": ip}
        for attr, src in (("name", host_at), ("ssh", host_at), ("ip", ip_at)):
            if src is not None:
                origin[f"cluster.workers[{i}].{attr}"] = setting(src)
        for var, attr in (("WORKER_DIR", "workdir"), ("WORKER_ENGRAM_DIR", "engram_dir")):
            if var in final:
                w[attr] = _home_rel(final[var].value, home)
                origin[f"cluster.workers[{i}].{attr}"] = setting(final[var])
        workers.append(w)
    if workers:
        doc.setdefault("cluster", {})["workers"] = workers
        if ip_at is not None:
            origin["cluster.workers"] = setting(ip_at)
    imp.ips, imp.hosts = ips, hosts


@_step("ENGRAM_DIR", "NNODES")
def _head(imp: _Import) -> None:
    """cluster.head: its name beside the workers', ENGRAM_DIR, NNODES checked against the workers, and the head's checkout."""
    final, doc, origin, errors, notes = imp.final, imp.doc, imp.origin, imp.errors, imp.notes
    get, where, setting, source, home = imp.get, imp.where, imp.setting, imp.source, imp.home
    ips, hosts, head_checkout = imp.ips, imp.hosts, imp.head_checkout
    head = doc.setdefault("cluster", {}).setdefault("head", {})
    head.setdefault("ip", "10.0.0.1")
    head["name"] = "head" if "head" not in hosts else "rank0"
    if "ENGRAM_DIR" in final:
        head["engram_dir"] = _home_rel(final["ENGRAM_DIR"].value, home)
        origin["cluster.head.engram_dir"] = setting(final["ENGRAM_DIR"])
    nnodes = get("NNODES")
    if nnodes is not None and nnodes != str(len(ips) + 1):
        errors.append(
            f"{where(final['NNODES'])}: NNODES={_shown(nnodes)} but there are {len(ips)} workers; fix: NNODES must be workers + 1 (or remove it)"
        )

    # The head's checkout: upstream runs from the checkout holding the file; its state-tp4/ is the head's /state.
    told = head_checkout is not None
    if head_checkout is not None and not head_checkout.strip():
        raise InvalidInput(
            "--head-checkout: the path is empty; fix: name the head's checkout (e.g. ~/dsv41-4x-spark), "
            "or leave the option out to use the directory of the imported file"
        )
    checkout = head_checkout if head_checkout is not None else os.path.dirname(os.path.abspath(source))
    if not checkout.startswith("~"):
        checkout = os.path.abspath(checkout)
    workdir = _home_rel(checkout, home)
    head["workdir"] = workdir
    how = (
        "from --head-checkout DIR"
        if told
        else f"the directory of {Path(source).name}; --head-checkout DIR names another"
    )
    origin["cluster.head.workdir"] = _Origin(None, f"the head's checkout {_shown(workdir, 1000)} ({how})")
    elsewhere = (
        ""
        if workdir.startswith("~")
        else (
            f"; it is not under {home}, the home of WORKER_USER as whom tp4 runs the head: if the head's user differs, "
            "set cluster.head.user and cluster.head.home"
        )
    )
    notes.append(
        f"the head's checkout is {_shown(workdir, 1000)} ({how}): upstream runs from the "
        f"checkout that holds the file, so the head's /state is {_shown(workdir, 1000)}/state-tp4 (API key, DSpark tables, "
        f"b12x caches){elsewhere}"
    )


@_step("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")
def _bootstrap_iface(imp: _Import) -> None:
    """fabric.socket_ifname from GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME, which must agree."""
    final, doc, origin = imp.final, imp.doc, imp.origin
    errors, get, setting, source = imp.errors, imp.get, imp.setting, imp.source
    gloo, nsock = get("GLOO_SOCKET_IFNAME"), get("NCCL_SOCKET_IFNAME")
    if gloo is not None and nsock is not None and gloo != nsock:
        errors.append(
            f"{source}: GLOO_SOCKET_IFNAME={_shown(gloo)} and NCCL_SOCKET_IFNAME={_shown(nsock)} differ; "
            "fix: give both the same interface (tp4 bootstraps both on fabric.socket_ifname)"
        )
    if gloo or nsock:
        _set(doc, ("fabric", "socket_ifname"), gloo or nsock)
        origin["fabric.socket_ifname"] = setting(final["GLOO_SOCKET_IFNAME" if gloo else "NCCL_SOCKET_IFNAME"])


@_step(
    "NCCL_SWITCHLESS_RING_ONLY",
    "NCCL_OVERLAY_PIP",
    "NFS_SHARE",
    "DSV41_SERIAL_WEIGHT_LOAD",
    "NCCL_WORKER_DIR",
    "NCCL_HOST_DIR",
)
def _switches(imp: _Import) -> None:
    """The launcher's 0/1 switches: fabric.mode, fabric.nccl.mount (upstream's default follows the ring), nfs.share."""
    final, doc, origin, errors = imp.final, imp.doc, imp.origin, imp.errors
    notes, get, where, setting = imp.notes, imp.get, imp.where, imp.setting
    # Launcher switches, 0 or 1 (files/nccl.sh); empty is the launcher's default, like unset.
    switch: dict[str, str] = {}
    for var in ("NCCL_SWITCHLESS_RING_ONLY", "NCCL_OVERLAY_PIP", "NFS_SHARE", "DSV41_SERIAL_WEIGHT_LOAD"):
        v = get(var)
        if v is None or v == "":
            continue
        if v not in ("0", "1"):
            errors.append(f"{where(final[var])}: {var} must be 0 or 1, got {_shown(v)!r}")
        else:
            switch[var] = v
    if "NCCL_SWITCHLESS_RING_ONLY" in switch:
        _set(doc, ("fabric", "mode"), "ring" if switch["NCCL_SWITCHLESS_RING_ONLY"] == "1" else "switched")
        origin["fabric.mode"] = setting(final["NCCL_SWITCHLESS_RING_ONLY"])
    # upstream: NCCL_OVERLAY_PIP defaults to the value of NCCL_SWITCHLESS_RING_ONLY (a ring needs the overlay)
    overlay_var = "NCCL_OVERLAY_PIP" if "NCCL_OVERLAY_PIP" in switch else "NCCL_SWITCHLESS_RING_ONLY"
    overlay = switch.get(overlay_var)
    if overlay is not None:
        _set(doc, ("fabric", "nccl", "mount"), "overlay" if overlay == "1" else "none")
        origin["fabric.nccl.mount"] = setting(final[overlay_var])
        if overlay_var != "NCCL_OVERLAY_PIP" and overlay == "1":
            notes.append(
                f"{where(final[overlay_var])}: NCCL_OVERLAY_PIP is not set, and upstream defaults it to "
                "NCCL_SWITCHLESS_RING_ONLY (1): the patched NCCL is bound over the image's pip NCCL "
                '(fabric.nccl.mount = "overlay")'
            )
    if "NFS_SHARE" in switch:
        _set(doc, ("nfs", "share"), switch["NFS_SHARE"] == "1")
        origin["nfs.share"] = setting(final["NFS_SHARE"])
    worker_dir = get("NCCL_WORKER_DIR")
    if worker_dir and not worker_dir.startswith("/"):
        errors.append(
            f"{where(final['NCCL_WORKER_DIR'])}: NCCL_WORKER_DIR={_shown(worker_dir)} must be absolute; fix: give an absolute path"
        )
    if overlay != "1" and get("NCCL_HOST_DIR"):
        notes.append(
            "NCCL_HOST_DIR: upstream mounts it at /nccl only when a library exists there; "
            'tp4 makes that explicit: set fabric.nccl.mount = "dir" if the host has one'
        )


@_step("NFS_SERVER_IP", "NFS_SERVER_IPS")
def _nfs_servers(imp: _Import) -> None:
    """nfs.server_ips from NFS_SERVER_IP_n or NFS_SERVER_IP when NFS_SERVER_IPS is not set."""
    final, doc, origin, get, setting = imp.final, imp.doc, imp.origin, imp.get, imp.setting
    if get("NFS_SERVER_IPS") is None:
        per: list[str] = []
        n = 1
        while (server := get(f"NFS_SERVER_IP_{n}")) is not None:
            per.append(server)
            n += 1
        if per:
            _set(doc, ("nfs", "server_ips"), per)
            origin["nfs.server_ips"] = setting(final["NFS_SERVER_IP_1"])
        elif get("NFS_SERVER_IP"):
            _set(doc, ("nfs", "server_ips"), [get("NFS_SERVER_IP")])
            origin["nfs.server_ips"] = setting(final["NFS_SERVER_IP"])


@_step("BUILD_DOCKERFILE", "IMAGE")
def _image_variant(imp: _Import) -> None:
    """image.variant from BUILD_DOCKERFILE, else from the IMAGE tag."""
    final, doc, origin = imp.final, imp.doc, imp.origin
    errors, get, where, setting = imp.errors, imp.get, imp.where, imp.setting
    dockerfile = get("BUILD_DOCKERFILE")
    tag = get("IMAGE") or ""
    if dockerfile is not None:
        if dockerfile not in _VARIANTS:
            errors.append(
                f"{where(final['BUILD_DOCKERFILE'])}: BUILD_DOCKERFILE={_shown(dockerfile)!r} is not one of {', '.join(_VARIANTS)}"
            )
        else:
            _set(doc, ("image", "variant"), _VARIANTS[dockerfile])
            origin["image.variant"] = setting(final["BUILD_DOCKERFILE"])
    else:
        _set(
            doc,
            ("image", "variant"),
            "canary-roce" if tag.endswith(":canary-roce") else "canary" if tag.endswith(":canary") else "base",
        )
        if "IMAGE" in final:
            origin["image.variant"] = _Origin(
                final["IMAGE"].line, f"IMAGE={_shown(tag)} (no BUILD_DOCKERFILE: the variant is read from the tag)"
            )


@_step("API_KEY")
def _api_key(imp: _Import) -> None:
    """API_KEY is never imported: a note says where the key goes."""
    final, notes, get, where = imp.final, imp.notes, imp.get, imp.where
    api = get("API_KEY")
    if api is not None and api.strip().lower() not in OFF_KEYS:
        notes.append(
            f"{where(final['API_KEY'])}: API_KEY: the key was not imported, and is never written to a profile, a message "
            "or a plan; fix: write it to a file (mode 600) and set api.key_file"
        )


@_step("EXTRA_CONTAINER_ENV")
def _extra_container_env(imp: _Import) -> None:
    """EXTRA_CONTAINER_ENV items: gates, knob rows, or [env]."""
    final, doc, origin, errors, notes, where = imp.final, imp.doc, imp.origin, imp.errors, imp.notes, imp.where
    reg, apply_typed = imp.reg, imp.typed
    from tp4.line.profile.models import looks_like_secret

    extra = final.get("EXTRA_CONTAINER_ENV")
    if extra is not None:
        for item in re.split(r"[ \t\n]+", extra.value.strip(" \t\n")):
            if not item:
                continue
            if not _EXTRA_ITEM.match(item):
                errors.append(
                    f"{where(extra)}: EXTRA_CONTAINER_ENV item {_shown(item)!r} is not KEY=VALUE (the launcher "
                    "stops on it); fix: write NAME=value with a name of letters, digits and '_', not starting with a digit"
                )
                continue
            key, value = item.split("=", 1)
            at = _Origin(extra.line, f"EXTRA_CONTAINER_ENV item {key}={_shown(value)}")
            if key in API_KEY_NAMES or looks_like_secret(key):
                notes.append(_secret_note(where(extra), key, "EXTRA_CONTAINER_ENV item "))
            elif key in RANK_KEYS or key == "NCCL_IB_GID_INDEX":
                errors.append(
                    f"{where(extra)}: EXTRA_CONTAINER_ENV sets {key}, which tp4 renders per rank; fix: remove it"
                )
            elif key in FIXED:
                if value != FIXED[key]:
                    errors.append(
                        f"{where(extra)}: EXTRA_CONTAINER_ENV sets {key}={_shown(value)}; tp4 fixes it to {FIXED[key]}; fix: remove it"
                    )
            elif reg.gate(key) is not None:
                doc.setdefault("gates", {})[key] = value
                origin[f"gates.{key}"] = at
            elif key in TYPED and key not in _HOST_SIDE:
                apply_typed(key, value, extra, at)
            else:
                doc.setdefault("env", {})[key] = value
                origin[f"env.{key}"] = at
                hint = difflib.get_close_matches(key, list(reg.gates), n=1, cutoff=0.85)
                if hint:
                    notes.append(
                        f"{where(extra)}: EXTRA_CONTAINER_ENV item {key} is not an adapter gate, so it is imported "
                        f"into [env] as it is; did you mean {hint[0]}?"
                    )


@_step("EXTRA_SGLANG_ARGS")
def _no_key_in_args(imp: _Import) -> None:
    """Every engine flag that takes a secret (--api-key, --admin-api-key, any flag whose name
    holds key, token, secret or password) in EXTRA_SGLANG_ARGS is dropped with its value, with a
    note naming the flag, never the value, and the fix."""
    from tp4.line.profile.models import secret_flag_problem

    final, doc, notes, where = imp.final, imp.doc, imp.notes, imp.where
    args = doc.get("engine", {}).get("extra_args")
    if args:
        kept, dropped = _without_secret_flags(args)
        if dropped:
            doc["engine"]["extra_args"] = kept
        for flag in dict.fromkeys(dropped):
            if flag == "--api-key":
                notes.append(
                    _secret_note(where(final["EXTRA_SGLANG_ARGS"]), "--api-key", "EXTRA_SGLANG_ARGS ")
                    .replace("--api-key looks like a secret", "--api-key carries the API key")
                    .replace(
                        "fix: keep it in a file (mode 600) outside the profile; tp4 takes credentials only from files "
                        "(the serving API key: api.key_file)",
                        "fix: write the key to a file (mode 600) and set api.key_file",
                    )
                )
                continue
            reason, fix = secret_flag_problem(flag)
            notes.append(
                f"{where(final['EXTRA_SGLANG_ARGS'])}: EXTRA_SGLANG_ARGS {reason.split(':', 1)[0]}: not imported, and "
                f"never written to a profile, a message or a plan; fix: {fix}"
            )


def import_assignments(
    assignments: list[Assignment],
    source: str,
    parse_notes: list[str] | None = None,
    *,
    head_checkout: str | None = None,
    strict: bool = False,
    overlays: tuple[str, ...] = (),
) -> ImportResult:
    """Map the assignments of an upstream profile onto a tp4 profile, step by step (_STEPS).
    head_checkout: the head's checkout (cluster.head.workdir); default the directory of `source`.
    strict: warnings are errors. overlays: the files read after `source` (named in the header)."""
    from tp4.line.registry import load_registry

    reg = load_registry()
    final: dict[str, Assignment] = {}
    for a in assignments:
        final[a.name] = a  # bash: the last assignment wins
    _refuse_other_tp(final, source)
    user = final["WORKER_USER"].value if "WORKER_USER" in final and final["WORKER_USER"].value else DEFAULT_USER
    imp = _Import(
        source, final, reg, "/root" if user == "root" else f"/home/{user}", head_checkout, notes=list(parse_notes or [])
    )
    for _, run in _STEPS:
        run(imp)
    errors, notes, unknown, unknown_text, doc, origin = (
        imp.errors,
        imp.notes,
        imp.unknown,
        imp.unknown_text,
        imp.doc,
        imp.origin,
    )
    if errors:
        raise ImportFailed(f"{source}: {len(errors)} problem(s); nothing was imported", errors, unknown_text)

    from tp4.line.profile.load import parse_document
    from tp4.line.profile.toml import dumps

    def terms(problem: str) -> str:
        return _in_file_terms(problem, origin, source, reg.gates)

    try:
        loaded = parse_document(doc, source)
    except InvalidInput as exc:
        problems = [terms(str(p)) for p in exc.problems] or [str(exc)]
        raise ImportFailed(
            f"{source}: the imported profile is not valid ({len(problems)} problem(s)); nothing was written",
            problems,
            unknown_text,
        ) from None
    warnings = [terms(str(w)) for w in loaded.warnings]  # each `field: reason; fix: ...`
    if strict and warnings:
        raise ImportFailed(
            f"{source}: {len(warnings)} warning(s), which --strict makes errors; nothing was written",
            warnings,
            unknown_text,
        )
    p = loaded.profile
    header = (
        f"# Imported by `tp4 profile import` from {Path(source).name}"
        + "".join(f" + {Path(o).name}" for o in overlays)
        + (" (overlays read after it, as upstream's arm.sh appends an arm).\n" if overlays else ".\n")
        + f"# On the launcher-defaults preset: every value below comes from {'those files' if overlays else 'that file'}.\n"
    )
    summary = f"{len(p.nodes)} nodes, TP {p.engine.tp}, EP {p.ep}, image {p.image.tag} ({p.image.variant})"
    return ImportResult(header + dumps(doc), doc, summary, notes, unknown, warnings, unknown_text)


# --- messages in the terms of the imported file ------------------------------------------------------

# profile field -> the variable of the upstream profile that sets it (beyond TYPED's own rows)
_FIELD_VARS_EXTRA = {
    "fabric.mode": "NCCL_SWITCHLESS_RING_ONLY",
    "fabric.nccl.mount": "NCCL_OVERLAY_PIP",
    "nfs.share": "NFS_SHARE",
    "fabric.socket_ifname": "NCCL_SOCKET_IFNAME",
    "cluster.workers": "WORKER_IPS",
    "image.variant": "BUILD_DOCKERFILE",
    "cluster.head.engram_dir": "ENGRAM_DIR",
}
_SECTIONS = r"(?:cluster|fabric|model|nfs|image|engine|engram|runtime|api)"


def _field_vars() -> dict[str, str]:
    out: dict[str, str] = {}
    for var, (path, _) in TYPED.items():
        out.setdefault(".".join(path), var)  # the first row is the name the example profile uses (PORT, IB_HCA)
    out.update(_FIELD_VARS_EXTRA)
    return out


def _legacy_value(path: str, text: str) -> str:
    v = text[1:-1] if len(text) >= 2 and text[0] == text[-1] == '"' else text
    if path == "fabric.mode":
        return "1" if v == "ring" else "0"
    if path == "fabric.nccl.mount":
        return "1" if v == "overlay" else "0"
    if path == "nfs.share":
        return "1" if v == "true" else "0"
    if path == "image.variant":
        return {variant: name for name, variant in _VARIANTS.items()}.get(v, v)
    if path == "runtime.ready_timeout" and v.isdigit():
        return str(int(v) // 10)
    return v


def _translate(text: str, gates: Any) -> str:
    """Profile terms (gates.X = "1", engine.chunked_prefill_size = 1024) in the upstream profile's."""
    fields = _field_vars()
    text = re.sub(r'add "([^"]*)", "([^"]*)" to engine\.extra_args', r"add \1 \2 to EXTRA_SGLANG_ARGS", text)
    text = re.sub(r'gates\.(\w+) = "([^"]*)" or more', r"\1=\2 (or more) in EXTRA_CONTAINER_ENV", text)
    text = re.sub(
        r'gates\.(\w+) to a list containing "([^"]*)"', r"\1 to a list containing \2 in EXTRA_CONTAINER_ENV", text
    )
    text = re.sub(r'gates\.(\w+) = "([^"]*)"', r"\1=\2 in EXTRA_CONTAINER_ENV", text)
    text = re.sub(
        r'\b([A-Z][A-Z0-9_]+) = "([^"]*)"',
        lambda m: f"{m.group(1)}={m.group(2)} in EXTRA_CONTAINER_ENV" if m.group(1) in gates else m.group(0),
        text,
    )
    text = re.sub(r"\bgates\.(\w+)", r"\1 (in EXTRA_CONTAINER_ENV)", text)

    def assign(m: re.Match[str]) -> str:
        var = fields.get(m.group(1))
        return f"{var}={_legacy_value(m.group(1), m.group(2))}" if var else m.group(0)

    text = re.sub(rf'\b({_SECTIONS}(?:\.[a-z_0-9]+)+) = ("[^"]*"|[-\w.]+)', assign, text)
    return re.sub(rf"\b({_SECTIONS}(?:\.[a-z_0-9]+)+)", lambda m: fields.get(m.group(1), m.group(0)), text)


def _in_file_terms(problem: str, origin: dict[str, _Origin], source: str, gates: Any) -> str:
    """`engine.chunked_prefill_size: reason; fix: ...` as `FILE line 71: CHUNKED_PREFILL_SIZE=8192:
    reason; fix: ... (profile field engine.chunked_prefill_size)`."""
    fieldname, sep, rest = problem.partition(": ")
    if not sep:
        return f"{source}: {problem}"
    reason, _, fix = rest.partition("; fix: ")
    key = fieldname
    at = origin.get(key)
    while at is None and re.search(r"(\[\d+\]|\.[A-Za-z0-9_]+)$", key):
        key = re.sub(r"(\[\d+\]|\.[A-Za-z0-9_]+)$", "", key)
        at = origin.get(key)
    if at is not None:
        prefix = f"{source} line {at.line}: {at.text}" if at.line is not None else f"{source}: {at.text}"
    elif fieldname in _field_vars():
        prefix = f"{source}: {_field_vars()[fieldname]} (not set: the launcher's default)"
    else:
        prefix = f"{source}: {fieldname}"
    out = f"{prefix}: {_translate(reason, gates)}"
    if fix:
        out += f"; fix: {_translate(fix, gates)}"
    # values from the file are shown through _shown (secrets hidden); secrets never reach the validator
    return out + f" (profile field {fieldname})"


def _home_rel(path: str, home: str) -> str:
    if path == home or path.startswith(home + "/"):
        return "~" + path[len(home) :]
    return path


RENDERS = (
    "tp4 renders upstream's DeepSeek-V4.1-Flash TP4 line: 4 Sparks, TP_SIZE=4, the file start-tp4.sh reads "
    "(.env.tp4, from .env.tp4.example)"
)
# what a file of another upstream line holds that a DeepSeek-V4.1 .env never does: a bash array
# (the GLM lines' HOSTS=(...)), or a GLM / vLLM name in a setting
_ARRAY = re.compile(r"^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)\+?=\(")
_OTHER_MODEL = re.compile(r"glm|vllm", re.IGNORECASE)
# where a file says which model and engine it runs (not NFS_CONTAINER: a DeepSeek line may reuse a
# GLM line's running NFS exporter, glm53-nfs)
_MODEL_VARS = ("MODEL", "MODEL_DIR", "MODEL_PATH", "MODEL_NAME", "HF_REPO", "SERVED_MODEL_NAME", "IMAGE")
_ASSIGNED = re.compile(r"^(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=(.*)$")
_OTHER_TP = {
    "3": "upstream's 3-Spark TP3 profile (.env.example: heads padded 64->96 by tp3_pad, image dsv41-3x-spark)",
    "8": "upstream's 8-Spark TP8 line (.env.tp8, run by start-tp8.sh with its own state-tp8/ and logs-tp8/)",
}


def refuse_other_line(text: str, source: str) -> None:
    """Refuse a file of a line tp4 does not render, saying what it is, before it is read as a
    DeepSeek-V4.1 TP4 .env (a GLM line's file would otherwise fail on a parse detail)."""
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        array = _ARRAY.match(line)
        assigned = _ASSIGNED.match(line)
        named = None
        if assigned and assigned.group(1).startswith("VLLM_"):
            named = _OTHER_MODEL.search(assigned.group(1))
        elif assigned and assigned.group(1) in _MODEL_VARS:
            named = _OTHER_MODEL.search(assigned.group(2).split("#", 1)[0])
        if array or named:
            what = (
                f"{array.group(1)}=(...) is a bash array, which no DeepSeek-V4.1 .env holds (a GLM line's HOSTS=() is one)"
                if array
                else f"it names {named.group(0)!r}"  # type: ignore[union-attr]
            )
            raise InvalidInput(
                f"{source} line {number}: this is not a DeepSeek-V4.1 line: {what}; {RENDERS}; "
                "fix: import that line's .env.tp4"
            )


def _refuse_other_tp(final: dict[str, Assignment], source: str) -> None:
    tp = final.get("TP_SIZE")
    if tp is None or not re.fullmatch(r"[0-9]{1,4}", tp.value) or int(tp.value) == 4:
        return  # a value that is no plain number is refused by engine.tp's own check
    what = _OTHER_TP.get(str(int(tp.value)), f"a TP{int(tp.value)} line")
    raise InvalidInput(
        f"{source} line {tp.line}: TP_SIZE={_shown(tp.value)}: this is {what}, which tp4 does not render; {RENDERS}; "
        "fix: import the .env.tp4 of the TP4 line"
    )


def import_env_text(text: str, source: str, *, head_checkout: str | None = None, strict: bool = False) -> ImportResult:
    refuse_other_line(text, source)
    assignments, notes = parse_env_text(text, source)
    return import_assignments(assignments, source, notes, head_checkout=head_checkout, strict=strict)


def import_env_file(
    path: str, *, overlays: Sequence[str] = (), head_checkout: str | None = None, strict: bool = False
) -> ImportResult:
    """Import ``path``; each overlay (an experiment arm, upstream's scripts/tp4/arms/*.env) is read
    after it, in order, as upstream's arm.sh appends an arm to a copy of .env.tp4 (the last
    assignment wins, and an arm may use what the base set). Messages name each file's own lines."""
    from tp4.core.userfiles import read_input

    base = str(path)
    if not overlays:
        return import_env_text(read_input(base, "env file"), base, head_checkout=head_checkout, strict=strict)
    texts = [(base, read_input(base, "env file"))] + [(str(o), read_input(str(o), "overlay file")) for o in overlays]
    combined = ""
    starts: list[tuple[int, str]] = []  # (first line in the combined text, file)
    for name, text in texts:
        refuse_other_line(text, name)
        if text and not text.endswith("\n"):
            text += "\n"  # a file's last line ends there, not in the next file's first line
        starts.append((combined.count("\n") + 1, name))
        combined += text

    def at(number: int) -> str:
        first, name = next((f, n) for f, n in reversed(starts) if f <= number)
        return f"{name} line {number - first + 1}"

    def relabel(message: str) -> str:
        def lines(m: re.Match[str]) -> str:
            numbers = [int(n) for n in m.group(1).split(", ")]
            out: dict[str, list[str]] = {}
            for n in numbers:
                name, _, local = at(n).rpartition(" line ")
                out.setdefault(name, []).append(local)
            return "; ".join(f"{name} line {', '.join(ns)}" for name, ns in out.items())

        return re.sub(re.escape(base) + r" line ([0-9]+(?:, [0-9]+)*)", lines, message)

    if head_checkout is None:
        head_checkout = os.path.dirname(os.path.abspath(base))
    try:
        refuse_other_line(combined, base)
        assignments, notes = parse_env_text(combined, base)
        result = import_assignments(
            assignments, base, notes, head_checkout=head_checkout, strict=strict, overlays=tuple(map(str, overlays))
        )
    except InvalidInput as exc:
        exc.message = relabel(exc.message)
        exc.args = (exc.message,)
        exc.problems = [relabel(p) for p in exc.problems]
        if isinstance(exc, ImportFailed):
            exc.unknown = [relabel(u) for u in exc.unknown]
        raise
    result.notes = [relabel(n) for n in result.notes]
    result.warnings = [relabel(w) for w in result.warnings]
    result.unknown_text = [relabel(u) for u in result.unknown_text]
    return result
