"""The JSON documents tp4 writes for others to read, as typed models: the bench result
(``bench_result``: sparkDash's result.json with tp4's additions under ``tp4`` keys), the fleet
plan (``fleet_plan``: `tp4 fleet plan --json`), doctor's evidence (``doctor_evidence``:
`tp4 doctor --json`, `-o FILE`) and the image listing (``images_listing``: `tp4 images --json`).

Each producer builds its JSON through its model (or validates it against it) and each reader
reads through it, so what is written, what is read and what is documented cannot drift apart.
`python -m tp4.core.contracts` writes docs/schemas/*.schema.json and docs/contracts.md from the
models; a test keeps the committed files current.

These modules import pydantic, the standard library and each other only, so every layer of
tp4 may import them (tests/test_contracts.py checks it).
"""
