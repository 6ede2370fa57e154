"""`python -m tp4.core.contracts DOCS_DIR`: write docs/contracts.md and docs/schemas/*.schema.json
from the contract models (tp4.core.contracts.generate)."""

from __future__ import annotations

import sys
from pathlib import Path

from tp4.core.contracts.generate import generate


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        sys.stderr.write("usage: python -m tp4.core.contracts DOCS_DIR\n")
        return 2
    docs = Path(argv[0])
    for name, text in generate().items():
        path = docs / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        sys.stdout.write(f"wrote {path}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
