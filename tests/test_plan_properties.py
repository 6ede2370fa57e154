"""Properties of the renderer over generated profiles (hypothesis)."""

from __future__ import annotations

import copy
import re
import shlex

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from tp4.core.errors import InvalidInput
from tp4.line.plan import build_plan
from tp4.serving.serve import env_file_text
from tp4.line.profile.load import parse_document

pytestmark = pytest.mark.unit

FIELD = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\[\]-]*: ")

names = st.from_regex(r"[a-z][a-z0-9-]{0,12}", fullmatch=True)
octets = st.integers(1, 254)


@st.composite
def valid_documents(draw):
    preset = draw(st.sampled_from(["base", "canary", "canary-roce", "production"]))
    node_names = draw(st.lists(names, min_size=4, max_size=4, unique=True))
    last = draw(st.lists(octets, min_size=4, max_size=4, unique=True))
    net = draw(st.sampled_from(["10.0.0", "192.168.7", "10.77.1"]))
    nodes = [
        {"name": n, "ip": f"{net}.{o}", "ssh": draw(st.sampled_from([n, f"{net}.{o}"]))}
        for n, o in zip(node_names, last, strict=True)
    ]
    doc = {
        "preset": preset,
        "cluster": {
            "head": nodes[0],
            "workers": nodes[1:],
            "user": draw(st.sampled_from(["zurih", "root", "ops"])),
            "dist_port": draw(st.integers(1024, 30000)),
            "port": draw(st.integers(30001, 65535)),
        },
    }
    engine = {
        "context_length": draw(st.integers(4096, 1048576)),
        "max_total_tokens": draw(st.integers(0, 8_000_000)),
        "dspark_block_size": draw(st.integers(1, 8)),
        "spec_algo": draw(st.sampled_from(["DSPARK", "none"])),
        "mem_fraction_static": draw(st.sampled_from([0.8, 0.75, "0.90", "0.944"])),
    }
    if draw(st.booleans()):
        engine["max_running_requests"] = draw(st.integers(1, 7))
    doc["engine"] = engine
    doc["engram"] = {"cache_gib": draw(st.integers(0, 32)), "cache_ways": draw(st.integers(1, 32))}
    if draw(st.booleans()):
        doc["env"] = {
            draw(st.from_regex(r"X_[A-Z0-9_]{1,10}", fullmatch=True)): draw(
                st.text(max_size=20).filter(lambda s: not any(c in s for c in "\n\r\0"))
            )
        }
    if draw(st.booleans()):
        doc["gates"] = {"DSV41_LOOP_NGRAM": str(draw(st.integers(1, 64)))}
    return doc


@settings(max_examples=60, deadline=None)
@given(valid_documents())
def test_any_valid_profile_renders_a_consistent_line(doc):
    try:
        loaded = parse_document(doc, "gen")
    except InvalidInput as exc:
        assert all(FIELD.match(p) for p in exc.problems), exc.problems
        assume(False)
    plan = build_plan(loaded)
    ranks = [n.env["NODE_RANK"] for n in plan.nodes]
    assert ranks == [str(i) for i in range(len(plan.nodes))] == ["0", "1", "2", "3"]
    assert len({n.env["DIST_INIT_ADDR"] for n in plan.nodes}) == 1
    assert plan.nodes[0].env["DIST_INIT_ADDR"] == f"{doc['cluster']['head']['ip']}:{doc['cluster']['dist_port']}"
    for node in plan.nodes:
        text = env_file_text(node, {})
        keys = [line.split("=", 1)[0] for line in text.splitlines()]
        assert len(keys) == len(set(keys)), "duplicate env key"
        assert node.argv.count("--node-rank") == 1
        flags = [a for a in node.argv if a.startswith("--")]
        assert len(flags) == len(set(flags)), "duplicate engine flag"
        assert node.argv[node.argv.index("--node-rank") + 1] == node.env["NODE_RANK"]
        assert node.env["HOST_IP"] == node.host


hostile = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=0, max_size=40)


@settings(max_examples=150, deadline=None)
@given(
    field=st.sampled_from(
        ["name", "ssh", "workdir", "engram_dir", "identity", "model_dir", "served_name", "env", "extra_arg", "hca"]
    ),
    value=hostile,
)
def test_arbitrary_strings_never_break_argv_or_env_file(field, value):
    doc = {
        "preset": "production",
        "cluster": {
            "head": {"name": "spark1", "ip": "10.0.0.1"},
            "workers": [{"name": f"spark{i}", "ip": f"10.0.0.{i}"} for i in (2, 3, 4)],
        },
    }
    target = doc["cluster"]["workers"][0]
    if field in ("name", "ssh", "workdir", "engram_dir", "identity"):
        target[field] = value
    elif field == "model_dir":
        doc["model"] = {"dir": value}
    elif field == "served_name":
        doc["model"] = {"served_name": value}
    elif field == "env":
        doc["env"] = {"X_FREE_TEXT": value}
    elif field == "extra_arg":
        doc["engine"] = {"extra_args": ["--min-free-slots-delay", "1", value]}
    else:
        doc["fabric"] = {"hcas": [value]}
    try:
        loaded = parse_document(copy.deepcopy(doc), "hostile")
    except InvalidInput as exc:
        assert exc.problems and all(FIELD.match(p) for p in exc.problems), exc.problems
        return
    plan = build_plan(loaded)
    for node in plan.nodes:
        text = env_file_text(node, {})
        parsed = dict(line.split("=", 1) for line in text.rstrip("\n").split("\n"))
        assert parsed == node.env
        assert shlex.split(shlex.join(node.argv)) == list(node.argv)
        assert all("\0" not in a for a in node.argv)
        for mount in node.run.mounts:
            assert ":" not in mount.source and "," not in mount.source and "\n" not in mount.source
        for i, arg in enumerate(node.argv[:-1]):
            if arg in ("--model-path", "--served-model-name", "--host", "--dist-init-addr"):
                assert node.argv[i + 1] and not node.argv[i + 1].startswith("--")
