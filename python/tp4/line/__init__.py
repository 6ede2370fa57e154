"""The line's description: what the operator writes and what tp4 renders from it.

Owns: the typed profile and its loader, presets and rules (profile), the adapter registry
(registry), the table of environment knobs (knobs), the container's fixed facts (container), and
the one renderer, the Plan, with its file form and schema (plan, planfile, planschema).

May import: tp4.core.
"""
