"""The versions of the JSON documents tp4 prints, in a module that imports nothing, so help texts
(read at every start of the CLI) name the version the output really carries."""

from __future__ import annotations

# `tp4 plan --json` (python/tp4/line/plan.py; docs/plan-schema.md is generated from the models)
PLAN = "tp4.plan/1.10"
