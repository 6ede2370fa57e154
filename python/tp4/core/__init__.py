"""The floor every stage stands on.

Owns: tp4's errors (errors), its state and cache directories (dirs), reading user-named files
safely (userfiles), the one funnel through which every program starts, locally and over ssh,
logged with secrets redacted (process), tp4's known_hosts (knownhosts), API keys as secrets
(apikey), the versions of the JSON documents tp4 prints (schemas) and their typed models,
with the JSON Schema and docs/contracts.md generated from them (contracts).

May import: nothing of tp4 outside tp4.core.
"""
