"""The versions of the JSON documents tp4 prints, in a module that imports nothing, so help texts
(read at every start of the CLI) name the version the output really carries."""

from __future__ import annotations

# `tp4 plan --json` (python/tp4/line/plan.py; docs/plan-schema.md is generated from the models)
PLAN = "tp4.plan/1.10"

# `tp4 doctor --json` (tp4.core.contracts.doctor_evidence)
DOCTOR = "tp4.doctor/1"

# `tp4 fleet plan --json` (tp4.core.contracts.fleet_plan)
FLEET = "tp4.fleet/1"

# `tp4 fleet status --json` (tp4.serving.fleet.status_document)
FLEET_STATUS = "tp4.fleet-status/1"

# `tp4 images --json` (tp4.core.contracts.images_listing)
IMAGES = "tp4.images/1"

# `tp4 hosts list --json` (tp4.core.contracts.host_keys)
HOST_KEYS = "tp4.host-keys/1"

# `tp4 profile check --json` (tp4.core.contracts.profile_check)
PROFILE_CHECK = "tp4.profile-check/1"

# `tp4 smoke --json` (tp4.core.contracts.smoke_report)
SMOKE = "tp4.smoke/1"

# `tp4 sources verify --json`, `tp4 sources diff --json` (tp4.core.contracts.sources_report)
SOURCES_VERIFY = "tp4.sources-verify/1"
SOURCES_DIFF = "tp4.sources-diff/1"

# `tp4 image-store status --json` (tp4.core.contracts.image_store_status)
IMAGE_STORE = "tp4.image-store/1"

# `tp4 distribute --check --json` (tp4.core.contracts.distribute_check)
DISTRIBUTE_CHECK = "tp4.distribute-check/1"

# `tp4 up --json` (tp4.core.contracts.up_report)
UP = "tp4.up/1"
