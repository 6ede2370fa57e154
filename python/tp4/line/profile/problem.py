"""One thing wrong with a profile. Its own module so that loading (load.py) and the rules between
fields (validate.py) both use it without importing each other."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a profile: the field, what is wrong, and how to fix it."""

    field: str
    reason: str
    fix: str = ""

    def __str__(self) -> str:
        return f"{self.field}: {self.reason}" + (f"; fix: {self.fix}" if self.fix else "")
