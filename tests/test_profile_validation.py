"""Every rule between profile fields (upstream's `files/nccl.sh` config check and the constraints
of `.env.tp4.example`, docs/upstream.md) rejects its invalid combination, naming the field; a
measured performance caveat is a warning, which never blocks."""

from __future__ import annotations

import copy
import logging
import os

import pytest

from tp4.core.apikey import read_key
from tp4.core.errors import InvalidInput
from tp4.line.profile.load import parse_document, strict

pytestmark = pytest.mark.unit

CLUSTER = {
    "head": {"name": "spark1", "ip": "10.0.0.1"},
    "workers": [{"name": f"spark{i}", "ip": f"10.0.0.{i}"} for i in (2, 3, 4)],
}


def doc(preset="production", **sections):
    d = {"preset": preset, "cluster": copy.deepcopy(CLUSTER)}
    for key, value in sections.items():
        d[key] = value
    return d


def problems(d) -> list[str]:
    with pytest.raises(InvalidInput) as exc:
        parse_document(d, "t.toml")
    assert exc.value.exit_code == 2
    return exc.value.problems


def ring(**extra):
    fabric = {"mode": "ring", "nccl": {"mount": "overlay", "max_nchannels": 4, "min_nchannels": 4}}
    out = doc(
        fabric=fabric,
        nfs={"share": False},
        gates={"DSV41_ROCE_RING": "1", "SGLANG_ROCE_MAX_SIZE": "262144", "DSV41_ROCE_GATHER": "262144"},
    )
    out.update(extra)
    return out


def test_production_and_every_preset_are_valid():
    for preset in ("launcher-defaults", "base", "canary", "canary-roce", "production"):
        d = doc(preset)
        if preset == "launcher-defaults":
            d["engine"] = {"tp": 4}
        parse_document(d, preset)


def test_a_valid_ring_profile():
    parse_document(ring(), "ring")


CASES = [
    # EP vs image variant and expert width (`.env.tp4.example`'s EP comment, the TP8 rule of `start.sh`)
    ("EP 1 on the canary image", doc("canary", engine={"ep": 1}), "engine.ep", "FlashInfer"),
    (
        "b12x_next on a canary image",
        doc("canary", engine={"ep": 1}, gates={"DSV41_MOE_B12X_NEXT": "1"}),
        "gates.DSV41_MOE_B12X_NEXT",
        "canary-roce",
    ),
    ("EP 1 at TP 8 with b12x_next (288-wide)", doc(engine={"tp": 8, "ep": 1}), "engine.ep", "288"),
    ("EP 3 does not divide TP 4", doc(engine={"ep": 3}), "engine.ep", "divide"),
    ("production without b12x_next", doc(gates={"DSV41_MOE_B12X_NEXT": "0"}), "engine.ep", "576"),
    # chunk 4096 needs the chunked indexer
    (
        "chunk 4096 without the chunked indexer",
        doc(gates={"DSV41_INDEXER_CHUNKED": "0", "SPARK_PREFILL_TP_SPLIT": "0"}),
        "engine.chunked_prefill_size",
        "DSV41_INDEXER_CHUNKED",
    ),
    # the SPS table kills the first mixed batch: harm, so an error
    ("SPS table", doc(engine={"use_sps_table": True}), "engine.use_sps_table", "false"),
    # gate dependencies
    (
        "draft tau without folded sampling 2",
        doc(gates={"SGLANG_DSPARK_FOLDED_SAMPLING": "1"}),
        "gates.DSV41_DRAFT_TAU",
        "SGLANG_DSPARK_FOLDED_SAMPLING",
    ),
    # gates the profile sets itself (the production preset's own dependents are dropped instead: test_rollback.py)
    (
        "router live without verify cap",
        doc("canary-roce", gates={"DSV41_ROUTER_LIVE": "1"}),
        "gates.DSV41_ROUTER_LIVE",
        "DSV41_VERIFY_CAP",
    ),
    (
        "wo_a mid without wo_a",
        doc("canary-roce", gates={"DSV41_WO_A_W8_MID": "1"}),
        "gates.DSV41_WO_A_W8_MID",
        "DSV41_WO_A_W8",
    ),
    (
        "wo_a drop without wo_a",
        doc("canary-roce", gates={"DSV41_WO_A_W8_DROP": "1"}),
        "gates.DSV41_WO_A_W8_DROP",
        "DSV41_WO_A_W8",
    ),
    (
        "eager glue fence with the fence turned off",
        doc(gates={"DSV41_FOLDED_FENCE": "0"}),
        "gates.DSV41_EAGER_GLUE",
        "DSV41_FOLDED_FENCE",
    ),
    (
        "eager glue fence without the folded fence",
        doc(gates={"DSV41_FOLDED_FENCE": "0"}),
        "gates.DSV41_EAGER_GLUE",
        "DSV41_FOLDED_FENCE",
    ),
    (
        "eager glue vcap without verify cap",
        doc(gates={"DSV41_VERIFY_CAP": "off", "DSV41_ROUTER_LIVE": "0"}),
        "gates.DSV41_EAGER_GLUE",
        "DSV41_VERIFY_CAP",
    ),
    (
        "roce gather on the canary image",
        doc("canary", gates={"DSV41_ROCE_GATHER": "2097152"}),
        "gates.DSV41_ROCE_GATHER",
        "canary-roce",
    ),
    (
        "L2 prefetch on the canary image",
        doc("canary", gates={"DSV41_L2_PREFETCH": "1"}),
        "gates.DSV41_L2_PREFETCH",
        "canary-roce",
    ),
    (
        "RoCE all-reduce on the base image",
        doc("base", gates={"SGLANG_ROCE_ALLREDUCE": "1"}),
        "gates.SGLANG_ROCE_ALLREDUCE",
        "canary-roce",
    ),
    (
        "prefill TP split on the base image",
        doc("base", gates={"SPARK_PREFILL_TP_SPLIT": "1"}),
        "gates.SPARK_PREFILL_TP_SPLIT",
        "canary",
    ),
    (
        "prefill TP split threshold below 32768",
        doc(gates={"SPARK_PREFILL_TP_MIN_CONTEXT": "16384"}),
        "gates.SPARK_PREFILL_TP_MIN_CONTEXT",
        "32768",
    ),
    (
        "prefill TP split rows below 1024",
        doc(gates={"SPARK_PREFILL_TP_MIN_ROWS": "512"}),
        "gates.SPARK_PREFILL_TP_MIN_ROWS",
        "1024",
    ),
    # compile cache dirs differ; fast-load EP equals EP
    (
        "b12x_next cache dir equals RoCEnante's",
        doc(gates={"B12X_NEXT_COMPILE_CACHE_DIR": "/state/b12x-compile"}),
        "gates.B12X_NEXT_COMPILE_CACHE_DIR",
        "B12X_COMPILE_CACHE_DIR",
    ),
    (
        "fast-load EP differs from EP",
        doc(gates={"DSV41_FAST_LOAD_EP_SIZE": "2"}),
        "gates.DSV41_FAST_LOAD_EP_SIZE",
        "engine.ep",
    ),
    # context bounds
    ("context below 4096", doc(engine={"context_length": 2048}), "engine.context_length", "4096"),
    ("context above 1048576", doc(engine={"context_length": 2097152}), "engine.context_length", "1048576"),
    # cluster shape: one Spark per rank, unique names and addresses, equal-length worker lists
    (
        "three nodes at TP 4",
        doc(cluster={"head": CLUSTER["head"], "workers": CLUSTER["workers"][:2]}),
        "cluster.workers",
        "engine.tp",
    ),
    (
        "duplicate fabric IP",
        doc(cluster={"head": CLUSTER["head"], "workers": [*CLUSTER["workers"][:2], {"name": "x", "ip": "10.0.0.2"}]}),
        "cluster.workers[2].ip",
        "10.0.0.2",
    ),
    (
        "duplicate name",
        doc(
            cluster={
                "head": CLUSTER["head"],
                "workers": [*CLUSTER["workers"][:2], {"name": "spark1", "ip": "10.0.0.9"}],
            }
        ),
        "cluster.workers[2].name",
        "spark1",
    ),
    (
        "NFS servers neither one nor one per worker",
        doc(nfs={"server_ips": ["10.0.22.1", "10.0.23.1"]}),
        "nfs.server_ips",
        "one per worker",
    ),
    # values of gates
    ("switch gate with a bad value", doc(gates={"DSV41_HC_FUSED": "yes"}), "gates.DSV41_HC_FUSED", "0 or 1"),
    ("unknown gate", doc(gates={"DSV41_MOE_B12X_NXT": "1"}), "gates.DSV41_MOE_B12X_NXT", "DSV41_MOE_B12X_NEXT"),
    ("rank key as env", doc(env={"NODE_RANK": "3"}), "env.NODE_RANK", "rank"),
    ("gate in [env]", doc(env={"DSV41_HC_FUSED": "1"}), "env.DSV41_HC_FUSED", "[gates]"),
    ("typed key in [env]", doc(env={"CONTEXT_LENGTH": "4096"}), "env.CONTEXT_LENGTH", "engine.context_length"),
    (
        "engine flag owned by a field",
        doc(engine={"extra_args": ["--foo", "1", "--tp", "8"]}),
        "engine.extra_args[2]",
        "engine.tp",
    ),
    (
        "api key in extra args",
        doc(engine={"extra_args": ["--foo", "1", "--api-key=abc"]}),
        "engine.extra_args[2]",
        "api.key_file",
    ),
    # ring rules (files/nccl.sh: nccl_validate_config, the ring comment of `.env.tp4.example`)
    (
        "ring without the NCCL overlay",
        ring(fabric={"mode": "ring", "nccl": {"mount": "none", "max_nchannels": 4}}),
        "fabric.nccl.mount",
        "overlay",
    ),
    (
        "ring with NCCL_ALGO Tree",
        ring(fabric={"mode": "ring", "nccl": {"mount": "overlay", "algo": "Tree", "max_nchannels": 4}}),
        "fabric.nccl.algo",
        "Ring",
    ),
    (
        "ring with socket transport",
        ring(fabric={"mode": "ring", "nccl": {"mount": "overlay", "net": "Socket", "max_nchannels": 4}}),
        "fabric.nccl.net",
        "IB",
    ),
    (
        "ring with IB disabled",
        ring(fabric={"mode": "ring", "nccl": {"mount": "overlay", "ib_disable": 1, "max_nchannels": 4}}),
        "fabric.nccl.ib_disable",
        "0",
    ),
    (
        "ring without subnet-aware routing",
        ring(fabric={"mode": "ring", "nccl": {"mount": "overlay", "ib_subnet_aware_routing": 0, "max_nchannels": 4}}),
        "fabric.nccl.ib_subnet_aware_routing",
        "1",
    ),
    (
        "ring with min channels above max",
        ring(fabric={"mode": "ring", "nccl": {"mount": "overlay", "min_nchannels": 8, "max_nchannels": 4}}),
        "fabric.nccl.min_nchannels",
        "max_nchannels",
    ),
    ("ring with the NFS share", ring(nfs={"share": True}), "nfs.share", "local checkpoint"),
    (
        "ring RoCEnante without the mesh",
        ring(gates={"DSV41_ROCE_RING": "0", "SGLANG_ROCE_MAX_SIZE": "262144", "DSV41_ROCE_GATHER": "262144"}),
        "gates.SGLANG_ROCE_ALLREDUCE",
        "DSV41_ROCE_RING",
    ),
    ("ring RoCE size above the cap", ring(gates={"DSV41_ROCE_RING": "1"}), "gates.SGLANG_ROCE_MAX_SIZE", "262144"),
    (
        "ring cap at the default hairpin queue",
        ring(fabric={"mode": "ring", "ring_hairpin_queue": 1024, "nccl": {"mount": "overlay", "max_nchannels": 4}}),
        "gates.DSV41_ROCE_GATHER",
        "81920",
    ),
    (
        "ring with five nodes",
        ring(
            cluster={"head": CLUSTER["head"], "workers": [*CLUSTER["workers"], {"name": "s5", "ip": "10.0.0.5"}]},
            engine={"tp": 5},
        ),
        "fabric.mode",
        "four nodes",
    ),
    ("NCCL worker dir relative", doc(fabric={"nccl": {"worker_dir": "nccl"}}), "fabric.nccl.worker_dir", "absolute"),
    # model-level field checks
    ("memory fraction above 1", doc(engine={"mem_fraction_static": 1.5}), "engine.mem_fraction_static", "at most 1"),
    ("unknown field with a suggestion", doc(engine={"contex_length": 4096}), "engine.contex_length", "context_length"),
    ("an API key in the profile", doc(api={"key": "sk-123"}), "api.key", "api.key_file"),
    ("ram offload", doc(engine={"offload_mode": "ram"}), "engine.offload_mode", "nvme"),
    ("served name that reads as a flag", doc(model={"served_name": "--x"}), "model.served_name", "pattern"),
]


@pytest.mark.parametrize("name,document,field,hint", CASES, ids=[c[0] for c in CASES])
def test_invalid_combination_is_rejected_with_its_field(name, document, field, hint):
    found = problems(document)
    matching = [p for p in found if p.startswith(field + ":")]
    assert matching, f"no problem for {field}: {found}"
    assert any(hint in p for p in matching), matching


@pytest.mark.parametrize("size", [4096, 8192])
def test_the_chunk_size_message_names_the_size(size):
    found = problems(doc(engine={"chunked_prefill_size": size}, gates={"DSV41_INDEXER_CHUNKED": "0"}))
    matching = [p for p in found if p.startswith("engine.chunked_prefill_size:")]
    assert len(matching) == 1, found
    assert f"a {size}-row chunk without the chunked indexer" in matching[0]
    assert 'fix: set gates.DSV41_INDEXER_CHUNKED = "1", or engine.chunked_prefill_size = 1024' in matching[0]


# --- two levels: an error cannot boot or does harm; a warning is a measured performance caveat ---

SLOTS_WARNING = (
    "engine.extra_args: max_running_requests = 16 without --min-free-slots-delay 1: DSpark's admission delayer "
    'holds 2-3 slots free; fix: add "--min-free-slots-delay", "1" to engine.extra_args, or lower '
    "engine.max_running_requests below 8"
)


def test_slots_without_the_free_slots_delay_is_a_warning_not_an_error():
    loaded = parse_document(doc(engine={"drop_args": ["--min-free-slots-delay"]}), "t.toml")
    assert loaded.profile.engine.max_running_requests == 16
    assert loaded.warnings == [SLOTS_WARNING]
    with pytest.raises(InvalidInput) as exc:
        strict(loaded)
    assert exc.value.exit_code == 2 and exc.value.problems == [SLOTS_WARNING]
    assert "--strict" in str(exc.value)


def test_with_the_delay_there_is_no_warning_and_strict_passes():
    loaded = parse_document(doc(), "t.toml")
    assert loaded.warnings == [] and strict(loaded) is loaded


@pytest.mark.parametrize(
    "engine",
    [
        {"max_running_requests": 7, "extra_args": []},
        {"drop_args": ["--min-free-slots-delay"], "extra_args": ["--min-free-slots-delay=1"]},
    ],
)
def test_the_slots_warning_needs_both_conditions(engine):
    assert parse_document(doc(engine=engine), "t.toml").warnings == []


def test_harm_stays_an_error_beside_a_warning():
    """EP 1 without b12x_next and a 4096-row chunk at 1M context without the chunked indexer
    cannot boot: errors, whatever the warnings."""
    found = problems(
        doc(
            engine={"context_length": 1048576, "extra_args": []},
            gates={"DSV41_MOE_B12X_NEXT": "0", "DSV41_INDEXER_CHUNKED": "0", "SPARK_PREFILL_TP_SPLIT": "0"},
        )
    )
    assert [p.split(":", 1)[0] for p in found] == ["engine.ep", "engine.chunked_prefill_size"], found
    assert "a 4096-row chunk" in found[1]


def test_a_setting_without_effect_is_neither():
    assert parse_document(doc(engine={"spec_algo": "none", "use_sts_table": True}), "t.toml").warnings == []
    assert (
        parse_document(
            doc(cluster={**CLUSTER, "head_container": "dsv41", "worker_container": "dsv41"}), "t.toml"
        ).warnings
        == []
    )


# --- each bad field once, with its value and a fix; no knock-on errors -------------------------


def test_a_type_error_hides_nothing_and_is_reported_once():
    cluster = copy.deepcopy(CLUSTER)
    cluster["head"]["name"] = 5
    found = problems(doc(cluster=cluster, engine={"context_length": -1}))
    assert found == [
        'cluster.head.name: got 5; must be a string; fix: write it in quotes, e.g. "5"',
        "engine.context_length: -1 is below the minimum 1; fix: use a value of at least 1",
    ]


def test_a_required_field_with_a_bad_value_still_lets_the_rest_be_checked():
    """A bad node name or IP is left out and a stand-in takes its place while the other rules run:
    the bad gate, the rule error and the duplicate name are still reported, the stand-in never."""
    cluster = copy.deepcopy(CLUSTER)
    cluster["head"]["name"] = 5
    cluster["workers"][0]["ip"] = "-Jevil.example.com"
    cluster["workers"][2]["name"] = cluster["workers"][1]["name"]
    found = problems(doc(cluster=cluster, gates={"DSV41_VERIFY_CAP": "zz"}))
    fields = [p.split(":", 1)[0] for p in found]
    assert fields[:2] == ["cluster.head.name", "cluster.workers[0].ip"], found
    assert "gates.DSV41_VERIFY_CAP" in fields and "cluster.workers[2].name" in fields, found
    assert not any("stand-in" in p or "192.0.2." in p for p in found), found


@pytest.mark.parametrize("gate", ["DSV41_MOE_B12X_NEXT", "DSV41_INDEXER_CHUNKED", "DSV41_VERIFY_CAP"])
def test_a_control_character_in_one_gate_value_is_the_only_problem(gate):
    found = problems(doc(gates={gate: "1\x01"}))
    assert found == [
        f"gates.{gate}: '1\\x01' contains a control character or line break; fix: remove it (a value "
        "is one line of printable text)"
    ]


def test_a_bad_gate_value_drops_only_that_gate():
    """The profile's other gates still count: a real rule error about one of them is reported."""
    found = problems(doc(gates={"DSV41_HC_FUSED": "a\nb", "DSV41_FAST_LOAD_EP_SIZE": "2"}))
    assert [p.split(":", 1)[0] for p in found] == ["gates.DSV41_HC_FUSED", "gates.DSV41_FAST_LOAD_EP_SIZE"], found


@pytest.mark.parametrize(
    "bad,field",
    [
        # EP "2" dropped: the preset's EP 1 without b12x_next would fail, but that is not the user's EP
        (
            {
                "engine": {"ep": "2"},
                "gates": {
                    "DSV41_MOE_B12X_NEXT": "0",
                    "DSV41_MOE_B12X_NEXT_DETERMINISTIC": "0",
                    "DSV41_FAST_LOAD_EP_SIZE": "2",
                },
            },
            "engine.ep",
        ),
        # port "x" dropped: its default 8888 equals the dist_port the user set
        ({"cluster": {**CLUSTER, "port": "x", "dist_port": 8888}}, "cluster.port"),
        # workers not an array: no knock-on "1 node for TP 4"
        ({"cluster": {"head": CLUSTER["head"], "workers": 5}}, "cluster.workers"),
        # a chunk size as a string: the preset's 4096 would need the indexer the user turned off
        (
            {
                "engine": {"chunked_prefill_size": "1024"},
                "gates": {"DSV41_INDEXER_CHUNKED": "0", "SPARK_PREFILL_TP_SPLIT": "0"},
            },
            "engine.chunked_prefill_size",
        ),
    ],
)
def test_no_knock_on_errors_from_a_dropped_field(bad, field):
    found = problems(doc(**bad))
    assert [p.split(":", 1)[0] for p in found] == [field], found
    assert "; fix: " in found[0]


def test_a_real_rule_error_beside_a_type_error_is_still_reported():
    found = problems(doc(cluster={**CLUSTER, "port": 9000, "dist_port": 9000}, engine={"context_length": "big"}))
    assert [p.split(":", 1)[0] for p in found] == ["engine.context_length", "cluster.dist_port"], found


# --- api.key_file, checked on the machine running tp4 (metadata only, never the key) -----------


def _key_doc(path) -> dict:
    return doc(api={"key_file": str(path)})


def test_a_private_key_file_has_no_warning(tmp_path):
    key = tmp_path / "key"
    key.write_text("sk-1\n")
    key.chmod(0o600)
    assert parse_document(_key_doc(key), "t").warnings == []


@pytest.mark.parametrize(
    "mode,how",
    [
        (0o644, "readable by its group and everyone"),
        (0o640, "readable by its group"),
        (0o604, "readable by everyone"),
        (0o620, "writable by its group"),
        (0o610, "usable by its group"),
    ],
)
def test_a_key_file_others_can_use_is_a_warning(tmp_path, mode, how, caplog):
    key = tmp_path / "key"
    key.write_text("sk-1\n")
    key.chmod(mode)
    loaded = parse_document(_key_doc(key), "t")
    assert loaded.warnings == [f"api.key_file: {key} is {how} (mode {mode:04o}); fix: chmod 600 {key}"]
    with pytest.raises(InvalidInput):
        strict(loaded)
    # one check of the key file: serve's reader finds the same, in the same words
    with caplog.at_level(logging.WARNING, logger="tp4.core.apikey"):
        assert read_key(key).reveal() == "sk-1"
    assert [r.getMessage() for r in caplog.records] == loaded.warnings


@pytest.mark.parametrize("make", [lambda p: None, lambda p: p.mkdir(), lambda p: os.mkfifo(p)])
def test_the_loader_and_the_reader_refuse_a_key_file_in_the_same_words(tmp_path, make):
    key = tmp_path / "key"
    make(key)
    [warning] = parse_document(_key_doc(key), "t").warnings
    with pytest.raises(InvalidInput) as err:
        read_key(key)
    assert str(err.value) == warning


def test_a_missing_key_file_is_a_warning(tmp_path):
    key = tmp_path / "nope"
    assert parse_document(_key_doc(key), "t").warnings == [
        f"api.key_file: {key} does not exist; fix: write the API key to {key} and chmod 600 {key}"
    ]


def test_a_key_file_that_is_a_directory_is_a_warning(tmp_path):
    assert parse_document(_key_doc(tmp_path), "t").warnings == [
        f"api.key_file: {tmp_path} is a directory, not a regular file; fix: name the file holding the API key"
    ]


def test_the_key_file_is_found_from_home_and_never_read(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    key = tmp_path / "k"
    key.write_text("sk-1\n")
    key.chmod(0o200)  # its owner cannot read it either: tp4 only looks at its mode
    assert parse_document(doc(api={"key_file": "~/k"}), "t").warnings == []


def test_all_problems_are_reported_at_once():
    found = problems(doc(engine={"context_length": 1, "ep": 3}, gates={"DSV41_HC_FUSED": "2", "NOPE": "1"}))
    fields = {p.split(":", 1)[0] for p in found}
    assert {"engine.context_length", "engine.ep", "gates.DSV41_HC_FUSED", "gates.NOPE"} <= fields


def test_secret_never_echoed_in_problems():
    found = problems(doc(api={"key": "sk-very-secret"}))
    assert not any("sk-very-secret" in p for p in found)


def test_rollback_is_one_change():
    """The seed's rollback: EP 2 without b12x_next returns the MoE to FlashInfer."""
    parse_document(
        doc(
            engine={"ep": 2},
            gates={
                "DSV41_MOE_B12X_NEXT": "0",
                "DSV41_MOE_B12X_NEXT_DETERMINISTIC": "0",
                "DSV41_FAST_LOAD_EP_SIZE": "2",
            },
        ),
        "rb",
    )
    parse_document(doc("canary-roce"), "rb2")


# --- generated from the registry: every gate dependency and image requirement is enforced ---------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from tp4.line.registry import load_registry  # noqa: E402

REG = load_registry()


def _on_value(gate):
    if gate.kind == "switch":
        return "1"
    if gate.kind in ("enum", "list"):
        return next(v for v in gate.values if v not in gate.off)
    if gate.kind == "int":
        return str(int(max(gate.min or 1, 1)))
    if gate.kind == "float":
        return "0.5" if (gate.max or 1) >= 0.5 else str(gate.max)
    if gate.kind == "path":
        return "/state/x"
    if gate.pattern and "conf" in gate.pattern:
        return "conf:0.1"
    if gate.pattern:
        return "6,12" if "0-9" in gate.pattern and "A-Z" not in gate.pattern else "wqkv_a"
    return "x"


def _violate(cond: str) -> tuple[str, str]:
    if ">=" in cond:
        var, n = cond.split(">=")
        return var, str(int(float(n)) - 1)
    if "~" in cond:
        var, item = cond.split("~")
        other = next(
            v
            for v in REG.gate(var).values
            if v not in (item, "all")
            and not (item == "vcap" and v == "vcapk")
            and not (item == "vcapk" and v == "vcap")
        )
        return var, other
    if "=" in cond:
        var, value = cond.split("=")
        gate = REG.gate(var)
        return var, next(v for v in gate.values if v != value) if gate.values else "0"
    return cond, "0"


# (a rule whose condition names another setting, {EP_SIZE}, has its own test)
NEEDS = [
    (g, cond) for a in REG.adapters for g in a.gates if not g.family for cond in REG.needs_of(g.var) if "{" not in cond
]


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(NEEDS))
def test_every_gate_dependency_in_the_registry_is_enforced(case):
    gate, cond = case
    var, bad = _violate(cond)
    gates = {gate.var: _on_value(gate), var: bad}
    # on launcher-defaults, which sets no gate: both are the profile's own
    found = problems(doc("launcher-defaults", gates=gates))
    assert any(p.startswith(f"gates.{gate.var}:") and "needs" in p for p in found), (gate.var, cond, found)


IMAGE_GATES = [g for a in REG.adapters for g in a.gates if g.image != "base" and g.kind in ("switch", "int")]


@settings(max_examples=30, deadline=None)
@given(st.sampled_from(IMAGE_GATES), st.sampled_from(["base", "canary"]))
def test_every_gate_image_requirement_is_enforced(gate, preset):
    if REG.image_rank(gate.image) <= REG.image_rank(preset):
        return
    found = problems(doc(preset, gates={gate.var: _on_value(gate)}))
    assert any(p.startswith(f"gates.{gate.var}:") and gate.image in p for p in found), found


# --- engine flags that take a secret: never in a profile ------------------------------------------

SECRET_ARGS = [
    (["--admin-api-key", "sk-admin-topsecret"], "--admin-api-key", "the admin API stays off"),
    (["--admin-api-key=sk-admin-topsecret"], "--admin-api-key", "the admin API stays off"),
    (["--api-key", "sk-topsecret"], "--api-key", "set api.key_file"),
    (["--hf-token", "hf topsecret"], "--hf-token", "as api.key_file does"),
    (["--ssl-keyfile-password=topsecret"], "--ssl-keyfile-password", "as api.key_file does"),
    (["--Client_Secret", "topsecret"], "--Client_Secret", "as api.key_file does"),
    (["--db-passwd", "topsecret"], "--db-passwd", "as api.key_file does"),
]


@pytest.mark.parametrize(("args", "flag", "fix"), SECRET_ARGS)
def test_an_engine_flag_that_takes_a_secret_is_refused_naming_the_flag_never_the_value(
    args, flag, fix, tp4_cli, tmp_path
):
    got = problems(doc(engine={"extra_args": ["--foo", "1", *args]}))
    assert any(p.startswith(f"engine.extra_args[2]: {flag} takes ") and fix in p for p in got), got
    assert "topsecret" not in "\n".join(got)
    # engine.drop_args names flags: one that takes a secret is refused too, its value never shown
    dropped = problems(doc(engine={"drop_args": [args[0]]}))
    assert "topsecret" not in "\n".join(dropped) and any(flag in p for p in dropped), dropped
    # the CLI: profile check exits 2, the secret nowhere in its output
    path = tmp_path / "p.toml"
    words = ", ".join(f'"{w}"' for w in ["--foo", "1", *args])
    path.write_text(
        '[cluster.head]\nname = "h"\nip = "10.0.0.1"\n[[cluster.workers]]\nname = "w"\nip = "10.0.0.2"\n'
        f"[engine]\ntp = 2\nextra_args = [{words}]\n"
    )
    code, out, err = tp4_cli("profile", "check", path)
    assert code == 2 and flag in err and "topsecret" not in out + err, (code, out, err)
    code, out, err = tp4_cli("plan", "--profile", path)
    assert code == 2 and "topsecret" not in out + err


def test_flags_that_only_resemble_a_secret_pass():
    from tp4.line.profile.models import secret_flag

    for word in ("--ssl-keyfile", "--max-prefill-tokens", "--tokenizer-path", "--keep-mm-feature-on-device", "key"):
        assert secret_flag(word) is None, word
    for word in ("--api-key", "--admin-api-key=x", "-api-key", "--HF_TOKEN", "--kv-secret", "--password"):
        assert secret_flag(word) is not None, word
