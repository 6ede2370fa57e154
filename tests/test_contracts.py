"""The contracts of what others read (python/tp4/core/contracts/): docs/contracts.md and
docs/schemas/*.schema.json are generated from the models and current; each producer's real
output conforms to its generated JSON Schema and names no key its contract does not; a result
file that breaks the contract is refused by `tp4 report` naming the file, the field and a fix."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from pydantic import BaseModel
from test_bench import Standin, load, tp4

from tp4.hosts import doctor

from tp4.serving import fleet
from tp4.image import images as images_mod
from tp4.core.contracts import generate
from tp4.core.contracts.bench_result import BenchResult
from tp4.line.plan import build_plan
from tp4.line.profile import load_default

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"


def schema(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((DOCS / "schemas" / f"{name}.schema.json").read_text())
    return loaded


def conforms(doc: object, name: str) -> None:
    jsonschema.Draft202012Validator(schema(name)).validate(doc)


# --- the generated files --------------------------------------------------------------------------


def test_the_docs_and_schemas_are_generated_from_the_models() -> None:
    files = generate.generate()
    for name, text in files.items():
        path = DOCS / name
        assert path.exists() and path.read_text() == text, (
            f"docs/{name} is stale: run `python -m tp4.core.contracts docs`"
        )
    committed = {f"schemas/{p.name}" for p in (DOCS / "schemas").iterdir()}
    assert committed == {n for n in files if n.startswith("schemas/")}, "docs/schemas holds a file no contract writes"


@pytest.mark.parametrize("contract", generate.CONTRACTS, ids=lambda c: c.name)
def test_each_schema_is_a_valid_json_schema_with_every_field_described(contract: generate.Contract) -> None:
    s = schema(contract.name)
    jsonschema.Draft202012Validator.check_schema(s)
    for part in [s, *s.get("$defs", {}).values()]:
        for field, prop in part.get("properties", {}).items():
            assert prop.get("description"), f"{contract.name}: {field} has no meaning"


def test_the_contracts_import_nothing_of_tp4_but_themselves() -> None:
    """Every layer reads them (report, bench, fleet, doctor, the CLI): they sit below all of it. The
    one other module they read is tp4.core.schemas (the versions, which imports nothing)."""
    import ast

    wrong = []
    paths = sorted((REPO / "python" / "tp4" / "core" / "contracts").glob("*.py"))
    assert len(paths) >= 6, "the contracts package moved: fix the path"
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [f"{node.module}.{a.name}" for a in node.names]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            wrong += [
                f"{path.name} imports {n}"
                for n in names
                if n.startswith("tp4") and not n.startswith("tp4.core.contracts.") and n != "tp4.core.schemas"
            ]
    assert wrong == []


# --- the bench result -----------------------------------------------------------------------------


@pytest.fixture
def standins(tmp_path: Path) -> Iterator[Callable[..., Standin]]:
    started: list[Standin] = []

    def go(**env: str) -> Standin:
        s = Standin(tmp_path, env)
        started.append(s)
        return s

    try:
        yield go
    finally:
        for s in started:
            s.stop()


def undeclared(model: BaseModel, where: str = "") -> list[str]:
    """Keys of a validated document that no model of its contract names (sparkDash's objects
    allow them: tp4's own output must have none)."""
    out = [f"{where}.{k}" for k in (model.model_extra or {})]
    for name in type(model).model_fields:
        value = getattr(model, name)
        if isinstance(value, BaseModel):
            out += undeclared(value, f"{where}.{name}")
        elif isinstance(value, list | dict):
            for key, item in enumerate(value) if isinstance(value, list) else value.items():
                if isinstance(item, BaseModel):
                    out += undeclared(item, f"{where}.{name}[{key!r}]")
    return out


def test_what_tp4_bench_writes_is_the_contract(standins: Callable[..., Standin], tmp_path: Path) -> None:
    s = standins(TP4_STANDIN_DECODE_TPS="300", TP4_STANDIN_TOKENS_PER_EVENT="3", TP4_STANDIN_PREFILL_TPS="8000")
    proc = tp4(
        "bench",
        "decode",
        "--url",
        s.url,
        "--levels",
        "1,2",
        "--max-tokens",
        "9",
        "--prompt-types",
        "prose",
        "--c1-runs",
        "1",
        "--warmup",
        "0",
        "--out",
        tmp_path / "decode",
    )
    assert proc.returncode == 0, proc.stderr
    proc = tp4("bench", "prefill", "--url", s.url, "--sizes", "600", "--passes", "1", "--out", tmp_path / "prefill")
    assert proc.returncode == 0, proc.stderr
    # with --profile the result records the plan, its digest, the image and the pins
    text = (REPO / "python/tp4/data/default-profile.toml").read_text().replace("10.0.0.", "127.0.0.")
    profile = tmp_path / "profile.toml"
    profile.write_text(text.replace("[cluster]\n", f"[cluster]\nport = {s.port}\n", 1))
    proc = tp4(
        "bench",
        "decode",
        "--profile",
        profile,
        "--levels",
        "1",
        "--max-tokens",
        "4",
        "--prompt-types",
        "json",
        "--c1-runs",
        "1",
        "--warmup",
        "0",
        "--out",
        tmp_path / "profiled",
    )
    assert proc.returncode == 0, proc.stderr
    for out, kind in (("decode", "decode"), ("prefill", "prefill"), ("profiled", "decode")):
        doc = load(tmp_path / out)
        conforms(doc, "bench-result")
        model = BenchResult.model_validate(doc)
        assert model.tp4 is not None and model.tp4.kind == kind
        assert undeclared(model) == [], (
            "tp4 bench writes keys its contract (tp4.core.contracts.bench_result) does not name"
        )
    profiled = BenchResult.model_validate(load(tmp_path / "profiled")).tp4
    assert (
        profiled is not None and (profiled.plan_digest or "").startswith("sha256:") and profiled.plan and profiled.pins
    )
    doc = load(tmp_path / "decode")
    doc["decode"][0]["job"]["results"][0]["tp4"]["colour"] = "red"
    with pytest.raises(jsonschema.ValidationError, match="colour"):
        conforms(doc, "bench-result")


def test_a_result_breaking_the_contract_is_refused_naming_file_and_field(tmp_path: Path, tp4_cli) -> None:
    from test_report import tp4_result, write

    cases = [
        (
            ("decode", 0, "job", "results", 0, "tp4", "invalidd"),
            "x",
            "decode[0].job.results[0].tp4.invalidd",
            "is not a field of this document",
        ),
        (("tp4", "levels_done"), "prose/1/1", "tp4.levels_done", "is the string 'prose/1/1', not an array"),
        (("prefill", 0, "tp4", "invalid"), 3, "prefill[0].tp4.invalid", "is the number 3, not a string"),
        (("tp4", "interrupted"), "yes", "tp4.interrupted", "is the string 'yes', not a boolean"),
    ]
    for i, (path, value, where, reason) in enumerate(cases):
        doc = tp4_result()
        cur: Any = doc
        for k in path[:-1]:
            cur = cur[k]
        cur[path[-1]] = value
        f = write(tmp_path, f"bad{i}", doc)
        code, out, err = tp4_cli("report", f, "--no-charts")
        assert code == 2 and out == "" and "Traceback" not in err, err
        assert f"{f}: {where}: {reason}" in err and "; fix: " in err, err


# --- the fleet plan -------------------------------------------------------------------------------


def test_the_fleet_plan_is_its_contract(tmp_path: Path) -> None:
    from test_fleet import BASE, fleet_of

    key = tmp_path / "key"
    key.write_text("sk-x\n")
    key.chmod(0o600)
    f = fleet.load(
        fleet_of(
            tmp_path,
            router='service = "unit"\npython = "/opt/r/bin/python"',
            base=BASE + f'[api]\nkey_file = "{key}"\n',
        )
    )
    data = json.loads(json.dumps(fleet.plan_json(f)))
    conforms(data, "fleet-plan")
    assert data["schema"] == "tp4.fleet/1" and data["router"]["service"] == "unit"
    data["router"]["policy"] = "fastest"
    with pytest.raises(jsonschema.ValidationError, match="fastest"):
        conforms(data, "fleet-plan")


# --- doctor's evidence ----------------------------------------------------------------------------


def test_doctors_evidence_is_its_contract() -> None:
    plan = build_plan(load_default())
    facts = {
        r.name: doctor.Facts(sections={"date": ["1000.0"], "uname": ["6.8.0"]}, received=1000.0, seconds=0.25)
        for r in plan.nodes
    }
    facts[plan.nodes[2].name] = doctor.Facts(error="ssh: connect to host spark3: Connection refused")
    facts[plan.nodes[1].name].derived["gid_index"] = {"rocep1s0f1": 3}
    report = doctor.Report(facts, doctor.evaluate(plan, facts), 1.5)
    data = json.loads(json.dumps(report.evidence()))
    conforms(data, "doctor-evidence")
    assert data["schema"] == doctor.SCHEMA and len(data["checks"]) == len(doctor.CHECKS) * len(plan.nodes)
    data["checks"][0]["status"] = "maybe"
    with pytest.raises(jsonschema.ValidationError, match="maybe"):
        conforms(data, "doctor-evidence")


# --- tp4 images --json ----------------------------------------------------------------------------


def test_tp4_images_json_is_its_contract(monkeypatch: pytest.MonkeyPatch, tp4_cli) -> None:
    from tp4.cli import images as cli_images
    from tp4.core.process import Remote

    created = datetime(2026, 12, 1, 10, 0, tzinfo=timezone.utc)
    line = images_mod.Image(
        "sha256:" + "a" * 64,
        ("dsv41-4x-spark:canary-roce",),
        ("localhost/tp4-line@sha256:" + "b" * 64,),
        created,
        49_000_000_000,
        {
            images_mod.LINE_REF_LABEL: "dsv41-4x-spark:canary-roce",
            images_mod.FLAKE_REV_LABEL: "0123abc",
            images_mod.PIN_PREFIX + "sglang": "c0ffee",
        },
        ("sha256:" + "c" * 64,),
        ("tp4-rank0",),
    )
    old = line.__class__(
        "sha256:" + "d" * 64,
        (),
        (),
        created,
        48_000_000_000,
        {images_mod.LINE_REF_LABEL: "dsv41-4x-spark:canary-roce"},
        (),
    )
    worker = Remote(host="10.0.0.2")
    nodes = [
        images_mod.NodeImages("head", None, (line, old)),
        images_mod.NodeImages("10.0.0.2", worker, (old,)),
        images_mod.NodeImages("10.0.0.3", Remote(host="10.0.0.3"), error="ssh: no route to host"),
    ]
    monkeypatch.setattr(cli_images, "_resolve", lambda opts: ("podman", [worker]))
    monkeypatch.setattr(images_mod, "inventory", lambda runtime, workers: nodes)
    monkeypatch.setattr(images_mod, "running_store", lambda: (None, "not running"))
    code, out, err = tp4_cli("images", "--json")
    assert code == 1 and "10.0.0.3" in err  # a node that cannot be asked: listed, and exit 1
    data = json.loads(out)
    conforms(data, "images")
    assert data["schema"] == "tp4.images/1" and [n["node"] for n in data["nodes"]] == ["head", "10.0.0.2", "10.0.0.3"]
    assert data["nodes"][0]["images"][0]["pins"] == {"sglang": "c0ffee"} and data["nodes"][1]["differs"]


# --- tp4 up --json --------------------------------------------------------------------------------


def test_tp4_up_json_is_its_contract() -> None:
    """What up.report makes of a run that ended, one a step stopped and one Ctrl-C stopped, is
    the generated schema's (tests/test_up.py checks `tp4 up --json` itself on the netns cluster)."""
    from tp4.serving import up

    plan = build_plan(load_default())
    done = up.Run([up.Outcome(name, "skipped", 0.0, "the line runs this plan") for name in up.STEPS[:5]], 1.25)
    done.outcomes.append(up.Outcome("smoke", "done", 1.2, "arithmetic, stream passed"))
    stopped = up.Run(
        [up.Outcome("doctor", "failed", 2.5, "1 blocking failure(s):")]
        + [up.Outcome(name, "not run") for name in up.STEPS[1:]],
        2.5,
        stopped_at="doctor",
        error="1 blocking failure(s):\n  - RDMA.LINK_LAYER on spark2: InfiniBand",
        resume="tp4 up --from doctor",
    )
    cut = up.Run(
        [up.Outcome("doctor", "done", 2.0, "no blocking failure"), up.Outcome("image", "interrupted", 3.0)]
        + [up.Outcome(name, "not run") for name in up.STEPS[2:]],
        5.0,
        stopped_at="image",
        error="interrupted",
        resume="tp4 up --from image",
    )
    for run, ok in ((done, True), (stopped, False), (cut, False)):
        data = json.loads(json.dumps(up.report(plan, run).model_dump(mode="json", by_alias=True)))
        conforms(data, "up")
        assert data["schema"] == "tp4.up/1" and data["plan"] == plan.digest and data["ok"] is ok
        assert [s["name"] for s in data["steps"]] == list(up.STEPS)
    data["steps"][1]["outcome"] = "half done"
    with pytest.raises(jsonschema.ValidationError, match="half done"):
        conforms(data, "up")
