"""The hosts: the four Sparks as tp4 reaches, checks and prepares them.

Owns: node handles and parallel work over them (nodes), `tp4 doctor` (doctor), the NFS weights
share (share), offline packs (pack), the pinned checkpoint download (checkpoint), NixOS deploys
(deploy) and host-key trust (trust).

May import: tp4.core, tp4.line, tp4.image.
"""
