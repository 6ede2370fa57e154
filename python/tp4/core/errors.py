"""The one user-facing error type.

Anything a user can cause (bad input, a missing tool, a failed remote command) is raised as a
Tp4Error; the CLI prints its text after ``error:`` and exits with its code, never a traceback.
"""

from __future__ import annotations

# Exit codes: 1 for a failed action, 2 for invalid input (profile, manifest, arguments).
EXIT_FAILED = 1
EXIT_INVALID = 2


class Tp4Error(Exception):
    """An error whose message tells the user what went wrong and what to do about it."""

    exit_code = EXIT_FAILED

    def __init__(self, message: str, *, exit_code: int | None = None) -> None:
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
        self.problems = list(problems or [])
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
