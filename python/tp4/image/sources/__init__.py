"""Pinned sources: the manifest (``sources.manifest``), NAR hashing, downloads and the transforms
that turn fetched sources into the trees the image contains.

The modules here import only the standard library at import time (``requests`` and ``git`` are
imported where a download or a git lock needs them), so ``python -m tp4.image.sources`` runs inside a
Nix build sandbox with nothing but python3, click and GNU patch.
"""
