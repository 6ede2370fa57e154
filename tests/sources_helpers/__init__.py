"""Helpers for the tests of tp4.image.sources: a loopback HTTP server, tree and manifest builders, nix."""
