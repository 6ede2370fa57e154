"""The one user-facing error type.

Anything a user can cause (bad input, a missing tool, a failed remote command) is raised as a
Tp4Error; the CLI prints its text after ``error:`` and exits with its code, never a traceback.
"""

from __future__ import annotations

# Exit codes: 1 for a failed action, 2 for invalid input (profile, manifest, arguments).
EXIT_FAILED = 1
EXIT_INVALID = 2


# How much of a user's value an error message echoes (clip), and the longest line any message
# prints (a line over it loses its middle: a 5,000-character value never floods the terminal).
SHOWN_CHARS = 80
MAX_LINE_CHARS = 1000


def clip(value: object, limit: int = SHOWN_CHARS) -> str:
    """A value as an error message echoes it: its repr, at most ``limit`` characters of it, and
    its length when it is longer. The one way tp4 quotes a value back to its user."""
    text = value if isinstance(value, str) else str(value)
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}... ({len(text)} characters)"


def bounded(text: str) -> str:
    """text with every line over MAX_LINE_CHARS cut in its middle (the start names the field, the
    end holds the fix: both stay)."""
    if len(text) <= MAX_LINE_CHARS and "\n" not in text:
        return text
    keep = MAX_LINE_CHARS // 2 - 20
    return "\n".join(
        line
        if len(line) <= MAX_LINE_CHARS
        else f"{line[:keep]} ...({len(line) - 2 * keep} characters left out)... {line[-keep:]}"
        for line in text.split("\n")
    )


class Tp4Error(Exception):
    """An error whose message tells the user what went wrong and what to do about it."""

    exit_code = EXIT_FAILED

    def __init__(self, message: str, *, exit_code: int | None = None) -> None:
        message = bounded(message)
        super().__init__(message)
        self.message = message
        if exit_code is not None:
            self.exit_code = exit_code

    def __str__(self) -> str:
        return self.message


class InvalidInput(Tp4Error):
    """Input (a profile, a manifest, an argument) that fails validation; exit code 2."""

    exit_code = EXIT_INVALID

    def __init__(self, message: str, problems: list[str] | None = None) -> None:
        self.problems = [bounded(p) for p in problems or []]
        if self.problems:
            message = message + "\n" + "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(message)


class HostKeyError(Tp4Error):
    """ssh refused a host because tp4's known_hosts lacks its key, or has another one (exit code 2:
    the user decides, with `tp4 hosts trust`). ``host`` is the name looked up (``[host]:port``
    for a port other than 22)."""

    exit_code = EXIT_INVALID

    def __init__(self, message: str, *, host: str, changed: bool) -> None:
        super().__init__(message)
        self.host = host
        self.changed = changed
