"""``python -m tp4.image.sources fetch|hash``: what Nix derivations run, with the package on PYTHONPATH
and nothing of the CLI (click, tp4.cli): an edit to the CLI must not change the source of every
tree derivation (pkgs/src.nix ``transforms``) and so rebuild the image's layers. The same
functions as ``tp4 sources fetch`` / ``tp4 sources hash``; the other subcommands are the CLI's.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tp4.core.errors import EXIT_INVALID, Tp4Error


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tp4.image.sources", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    fetch = sub.add_parser("fetch", help="build NAME at DIR, as `tp4 sources fetch`")
    fetch.add_argument("name")
    fetch.add_argument("--to", required=True, metavar="DIR")
    fetch.add_argument("--manifest", metavar="FILE")
    fetch.add_argument("--input", dest="inputs", action="append", default=[], metavar="COMPONENT=PATH")
    fetch.add_argument("--offline", action="store_true")
    fetch.add_argument("-q", "--quiet", action="store_true")
    hashing = sub.add_parser("hash", help="the NAR hash of PATH, as `nix hash path`")
    hashing.add_argument("path")
    hashing.add_argument("--format", choices=["sri", "nix32", "hex"], default="sri")
    hashing.add_argument("--manifest", metavar="FILE", help="ignored (accepted as `tp4 sources hash` does)")
    try:
        opts = parser.parse_args(argv)
    except SystemExit as exc:  # argparse's usage error
        return EXIT_INVALID if exc.code else 0
    try:
        if opts.command == "hash":
            from tp4.image.sources import nar

            print(nar.encode(nar.nar_sha256(opts.path), opts.format))
            return 0
        from tp4.image.sources import fetch as fetching
        from tp4.image.sources import manifest as mf

        m = mf.load(mf.chosen_path(opts.manifest))
        mf.check(m)
        for line in fetching.fetch_named(
            m, opts.name, Path(opts.to), opts.inputs, offline=opts.offline, quiet=opts.quiet
        ):
            print(line)
        return 0
    except Tp4Error as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return exc.exit_code
    except OSError as exc:
        print(f"error: {exc.filename or ''}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_INVALID


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
