"""The plan's digest (python/tp4/line/plan.py digest_of): sha256 of the canonical JSON of the plan
without `digest` and `source`, in `tp4 plan --json`; and the fields two plans differ in."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from tp4.hosts.nodes import Node
from tp4.line.plan import build_plan, canonical_json, differences, digest_of
from tp4.line.profile import load_default, load_file

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parent.parent
DEFAULT = REPO / "python/tp4/data/default-profile.toml"


def test_the_digest_is_the_sha256_of_the_canonical_json_without_itself_and_the_source() -> None:
    plan = build_plan(load_default())
    doc = plan.to_json()
    body = {k: v for k, v in doc.items() if k not in ("digest", "source")}
    want = "sha256:" + hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    assert doc["digest"] == plan.digest == digest_of(doc) == want
    assert canonical_json({"b": 1, "a": [1, {"d": "é", "c": None}]}) == '{"a":[1,{"c":null,"d":"é"}],"b":1}'.encode()
    assert list(doc)[:2] == ["schema", "digest"]


def test_one_profile_under_two_paths_has_one_digest_and_a_change_another(tmp_path: Path) -> None:
    a, b = tmp_path / "a.toml", tmp_path / "b" / "profile.toml"
    b.parent.mkdir()
    a.write_text(DEFAULT.read_text())
    b.write_text(DEFAULT.read_text())
    pa, pb = build_plan(load_file(a)), build_plan(load_file(b))
    assert pa.source != pb.source and pa.digest == pb.digest == build_plan(load_default()).digest
    c = tmp_path / "c.toml"
    c.write_text(DEFAULT.read_text() + '\n[env]\nMY_NOTE = "x"\n')
    pc = build_plan(load_file(c))
    assert pc.digest != pa.digest
    paths = [path for path, _, _ in differences(pa.to_json(), pc.to_json())]
    assert paths == [f"nodes[{r}].env.MY_NOTE" for r in range(4)]
    assert differences(pa.to_json(), pb.to_json()) == []  # the source is not a difference


def test_the_digest_holds_no_secret(tmp_path: Path) -> None:
    """The plan names the key file; the key never enters it, so the digest is the same whatever
    the key is (and changes when the file named changes)."""
    key = tmp_path / "api.key"
    prof = tmp_path / "p.toml"
    prof.write_text(DEFAULT.read_text() + f'\n[api]\nkey_file = "{key}"\n')
    key.write_text("sk-one\n")
    first = build_plan(load_file(prof))
    key.write_text("sk-two\n")
    second = build_plan(load_file(prof))
    assert first.digest == second.digest and "sk-" not in json.dumps(first.to_json())


def test_differences_name_lists_and_one_sided_fields() -> None:
    got = differences({"a": [1, 2], "b": {"x": 1}, "digest": "d1"}, {"a": [1], "b": {"y": 2}, "digest": "d2"})
    assert got == [("a[1]", 2, None), ("b.x", 1, None), ("b.y", None, 2)]


def test_serve_leaves_the_plan_beside_each_env_file_and_reads_it_back(tmp_path: Path) -> None:
    """On this machine (a Node without a remote): the plan JSON at <env file>.plan.json, mode 0600,
    as the ssh user of a plain host (no sudo); compare_running names the fields of a changed plan."""
    from tp4.serving import serve

    text = DEFAULT.read_text().replace("[cluster.head]\n", f'[cluster.head]\nworkdir = "{tmp_path}/w0"\n', 1)
    prof = tmp_path / "p.toml"
    prof.write_text(text)
    plan = build_plan(load_file(prof))
    head = Node(plan.nodes[0], None)
    assert plan.nodes[0].service.kind == "plain"
    serve.write_running_plans(plan, [head])
    stored = Path(serve.running_plan_path(plan.nodes[0]))
    assert stored == tmp_path / "w0" / "dsv41-head.plan.json" and stored.stat().st_mode & 0o777 == 0o600
    assert serve.read_running_plan(head, plan.digest) == plan.to_json()
    assert serve.read_running_plan(head, "sha256:" + "0" * 64) is None  # not the plan of that digest
    prof.write_text(text + '\n[env]\nMY_NOTE = "x"\n')
    changed = build_plan(load_file(prof))
    got = serve.compare_running(changed, [head], {head.name: ("running", plan.digest)})
    assert got["same"] is False and got["running"] == [plan.digest]
    assert got["fields"] == [
        'nodes[0].env.MY_NOTE: running null, this plan "x"',
        'nodes[1].env.MY_NOTE: running null, this plan "x"',
        'nodes[2].env.MY_NOTE: running null, this plan "x"',
        'nodes[3].env.MY_NOTE: running null, this plan "x"',
    ]
    assert serve.compare_running(plan, [head], {head.name: ("running", plan.digest)})["same"] is True
    unknown = serve.compare_running(changed, [head], {head.name: ("running", "")})
    assert unknown["same"] is False and "a plan without a digest" in str(unknown["summary"])
