"""The image: from pinned third-party sources to an OCI image on every node.

Owns: the sources manifest, fixed-output fetches and transforms (sources), the Nix driver (nix),
OCI layout assembly with the standard library alone (oci), the base image probe (baseimage), the
ELF check of built libraries (elf), the container runtime's command line (runtime_cli), `tp4
build` (build), the head's image store (imagestore), layer distribution to the workers
(distribute) and `tp4 images` (images).

May import: tp4.core, tp4.line.
"""
