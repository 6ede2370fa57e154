"""``python -m tp4.sources ...``: the ``tp4 sources`` group without the rest of the CLI, for Nix
derivations that have the package on PYTHONPATH but not the console script."""

from tp4.cli.sources import run_standalone

run_standalone()
