"""The running line: starting it, proving it ready, talking to it, growing it.

Owns: `tp4 serve`, status and stop (serve), the boot-log check (bootlog) and its wait on a NixOS
host (rankready), the OpenAI-compatible API client (api), and several lines behind SGLang's
router (fleet), the line's state shared by status and the watchdog (linestate), and the
watchdog of `tp4 watch` (watch).

May import: tp4.core, tp4.line, tp4.image, tp4.hosts.
"""
