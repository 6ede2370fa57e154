"""``python -m tp4.sources ...``: the ``tp4 sources`` group without the rest of the CLI, for Nix
derivations that have the package on PYTHONPATH but not the console script.

``hash PATH`` alone (what derivations and scripts call most) skips the CLI's imports: the NAR
hash needs only the standard library, so start-up stays small next to `nix hash path`.
"""

import os
import sys

if len(sys.argv) == 3 and sys.argv[1] == "hash" and not sys.argv[2].startswith("-") and os.path.lexists(sys.argv[2]):
    from tp4.sources.nar import nar_hash

    print(nar_hash(sys.argv[2]))
    sys.exit(0)

from tp4.cli.sources import run_standalone  # noqa: E402

run_standalone()
