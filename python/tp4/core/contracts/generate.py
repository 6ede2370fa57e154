"""docs/contracts.md and docs/schemas/*.schema.json, generated from the contract models; a test
keeps the committed files equal to what this writes (`python -m tp4.core.contracts DOCS_DIR`)."""

from __future__ import annotations

import json
from typing import Any, Literal, NamedTuple

from pydantic import BaseModel

from tp4.core.contracts import (
    bench_result,
    distribute_check,
    doctor_evidence,
    fleet_plan,
    host_keys,
    image_store_status,
    images_listing,
    profile_check,
    smoke_report,
    sources_report,
    up_report,
)
from tp4.core.contracts.base import JsonSchema, json_schema


class Contract(NamedTuple):
    name: str  # the schema file's stem
    title: str
    root: type[BaseModel]
    models: tuple[type[BaseModel], ...]
    written_by: str
    read_by: str
    notes: str = ""
    # serialization: what tp4 writes (every field there); validation: what the reader takes
    mode: Literal["validation", "serialization"] = "serialization"


CONTRACTS: tuple[Contract, ...] = (
    Contract(
        "bench-result",
        "bench result (`result.json`)",
        bench_result.BenchResult,
        bench_result.MODELS,
        "`tp4 bench decode --out DIR`, `tp4 bench prefill --out DIR` (python/tp4/measuring/throughput/result.py, run.py)",
        "`tp4 report` (python/tp4/measuring/report.py), a resumed `tp4 bench`, sparkDash's readers",
        "sparkDash's `result.json`: its field names, so a report reads sparkDash's own files too, and tp4's additions "
        "under keys named `tp4` only. sparkDash's objects may hold keys this page does not name (they are kept and "
        "not read); a `tp4` object holds exactly the fields named. Every field may be missing but a level's "
        "`concurrency`, a prefill row's `targetTokens` and a decode entry's `job`. A file that does not fit is "
        "refused with its path and the field's (`result.json: decode[0].job.results[2].aggregateDecodeTps: "
        "true (a boolean), not a number; fix: …`), exit 2.",
        "validation",
    ),
    Contract(
        "fleet-plan",
        "fleet plan (`tp4 fleet plan --json`)",
        fleet_plan.FleetPlan,
        fleet_plan.MODELS,
        "`tp4 fleet plan --json` (python/tp4/serving/fleet.py plan_json)",
        "operators, scripts",
        "No secret: the API key is named by its file.",
    ),
    Contract(
        "doctor-evidence",
        "doctor's evidence (`tp4 doctor --json`, `-o FILE`)",
        doctor_evidence.DoctorEvidence,
        doctor_evidence.MODELS,
        "`tp4 doctor --json` (stdout) or `-o FILE` (python/tp4/hosts/doctor.py Report.evidence)",
        "operators, bug reports",
        "The check ids and what each checks are in docs/doctor.md.",
    ),
    Contract(
        "images",
        "image listing (`tp4 images --json`)",
        images_listing.ImagesListing,
        images_listing.MODELS,
        "`tp4 images --json` (python/tp4/cli/images.py)",
        "operators, scripts",
    ),
    Contract(
        "host-keys",
        "host keys (`tp4 hosts list --json`)",
        host_keys.HostKeys,
        host_keys.MODELS,
        "`tp4 hosts list --json` (python/tp4/cli/hosts.py)",
        "operators, scripts",
        "Fingerprints only: the keys themselves stay in the known_hosts file.",
    ),
    Contract(
        "profile-check",
        "profile check (`tp4 profile check --json`)",
        profile_check.ProfileCheck,
        profile_check.MODELS,
        "`tp4 profile check --json` (python/tp4/cli/profile.py)",
        "operators, scripts, CI",
        "Printed for an invalid profile too (`ok` false, every problem listed), then exit 2.",
    ),
    Contract(
        "smoke",
        "smoke check (`tp4 smoke --json`)",
        smoke_report.SmokeReport,
        smoke_report.MODELS,
        "`tp4 smoke --json` (python/tp4/cli/serve.py)",
        "operators, scripts, CI",
        "No secret: the API key is never in it.",
    ),
    Contract(
        "sources-verify",
        "sources check (`tp4 sources verify --json`)",
        sources_report.SourcesVerify,
        sources_report.VERIFY_MODELS,
        "`tp4 sources verify --json` (python/tp4/cli/sources.py)",
        "operators, scripts, CI",
    ),
    Contract(
        "sources-diff",
        "sources diff (`tp4 sources diff --json`)",
        sources_report.SourcesDiff,
        sources_report.DIFF_MODELS,
        "`tp4 sources diff --json` (python/tp4/cli/sources.py)",
        "operators, scripts, CI",
    ),
    Contract(
        "image-store",
        "image store status (`tp4 image-store status --json`)",
        image_store_status.ImageStoreStatus,
        image_store_status.MODELS,
        "`tp4 image-store status --json` (python/tp4/cli/build.py)",
        "operators, scripts",
    ),
    Contract(
        "distribute-check",
        "workers' images (`tp4 distribute --check --json`)",
        distribute_check.DistributeCheck,
        distribute_check.MODELS,
        "`tp4 distribute --check --json` (python/tp4/cli/build.py)",
        "operators, scripts",
    ),
    Contract(
        "up",
        "the run of `tp4 up` (`tp4 up --json`)",
        up_report.UpReport,
        up_report.MODELS,
        "`tp4 up --json` (python/tp4/serving/up.py report)",
        "operators, scripts, CI",
        "Printed when a step stops the run (exit that step's code) and on Ctrl-C (exit 130) too; the steps' own "
        "output and progress go to stderr.",
    ),
)


def schema_of(contract: Contract) -> JsonSchema:
    return json_schema(contract.root, f"tp4 {contract.title}", f"{contract.name}.schema.json", contract.mode)


def _ref_name(ref: str) -> str:
    return ref.rsplit("/", 1)[-1]


def _type_words(s: JsonSchema) -> str:
    """A property's JSON Schema in words, linking the models it holds."""
    if "$ref" in s:
        name = _ref_name(s["$ref"])
        if name == "JsonValue":
            return "any JSON value"
        return f"[{name}](#{name.lower()})"
    if "const" in s:
        return f"`{json.dumps(s['const'])}`"
    if "enum" in s:
        return " \\| ".join(f"`{json.dumps(v)}`" for v in s["enum"])
    if "anyOf" in s:
        return " or ".join(_type_words(x) for x in s["anyOf"])
    kind = s.get("type")
    if kind is None:
        return "any JSON value"
    if isinstance(kind, list):
        words = " or ".join(_type_words({**s, "type": k}) for k in kind)
        return words
    if kind == "array":
        return f"array of {_inner(s.get('items', {}))}"
    if kind == "object":
        extra = s.get("additionalProperties")
        return f"object of {_inner(extra)}" if isinstance(extra, dict) else "object"
    if kind in ("number", "integer") and "minimum" in s:
        return f"{kind} ≥ {s['minimum']}"
    return str(kind)


def _inner(s: JsonSchema) -> str:
    """An element's type, in parentheses when it has alternatives."""
    words = _type_words(s)
    return f"({words})" if " or " in words or "\\|" in words else words


def _table(name: str, s: JsonSchema) -> list[str]:
    out = [f"### {name}", ""]
    if s.get("description"):
        out += [" ".join(str(s["description"]).split()), ""]
    out += ["| field | type | required | meaning |", "|---|---|---|---|"]
    required = set(s.get("required", []))
    for field, prop in s.get("properties", {}).items():
        meaning = " ".join(str(prop.get("description", "")).split()).replace("|", "\\|")
        out.append(f"| `{field}` | {_type_words(prop)} | {'yes' if field in required else ''} | {meaning} |")
    if s.get("additionalProperties") is True:
        out.append("")
        out.append("Other keys are allowed (sparkDash's own) and kept as they are.")
    out.append("")
    return out


INTRO = """\
# Contracts: the JSON tp4 writes for others

<!-- generated by `python -m tp4.core.contracts docs` from python/tp4/core/contracts/; a test keeps it current -->

Besides the plan (docs/plan-schema.md), tp4 writes these JSON documents for people and programs
to read. Each has a typed model in python/tp4/core/contracts/, its writer builds (or checks) its JSON
through that model, its readers read through it, and this page and the JSON Schema files in
docs/schemas/ are generated from the models, so what is written, read and documented is one
thing. A document with a `schema` field carries its version; fields are added under a new
version, never renamed or removed within one.
"""


def generate_markdown() -> str:
    names = [m.__name__ for c in CONTRACTS for m in c.models]
    assert len(names) == len(set(names)), "two models of one name: their anchors would collide"
    out = [INTRO]
    out += ["| document | written by | read by | JSON Schema |", "|---|---|---|---|"]
    for c in CONTRACTS:
        out.append(
            f"| [{c.title}](#{c.name}) | {c.written_by} | {c.read_by} | "
            f"[schemas/{c.name}.schema.json](schemas/{c.name}.schema.json) |"
        )
    out.append("")
    for c in CONTRACTS:
        schema = schema_of(c)
        defs: dict[str, Any] = schema.get("$defs", {})
        out += [f'<a id="{c.name}"></a>', "", f"## The {c.title}", ""]
        if c.notes:
            out += [c.notes, ""]
        for model in c.models:
            s = schema if model is c.root else defs[model.__name__]
            out += _table(model.__name__, s)
        missing = set(defs) - {m.__name__ for m in c.models} - {"JsonValue"}
        assert not missing, f"{c.name}: models reached but not listed in MODELS: {sorted(missing)}"
    return "\n".join(out).rstrip("\n") + "\n"


def generate() -> dict[str, str]:
    """Path under the docs directory -> its text."""
    files = {
        f"schemas/{c.name}.schema.json": json.dumps(schema_of(c), indent=2, ensure_ascii=False) + "\n"
        for c in CONTRACTS
    }
    files["contracts.md"] = generate_markdown()
    return files
