"""Lists in a profile layer visibly: engine.extra_args adds to the presets' flags, removing an
inherited flag is explicit (engine.drop_args, of a flag a lower layer sets), a flag given twice is an
error naming both layers, and the plan notes the layer of every extra argument. Every list field
of the profile says how it layers, in one table (models.LIST_MERGE)."""

from __future__ import annotations

import copy
import typing

import pytest
from pydantic import BaseModel

from tp4.core.errors import InvalidInput
from tp4.line.plan import build_plan
from tp4.line.profile import models
from tp4.line.profile.load import PRESETS, parse_document

pytestmark = pytest.mark.unit

CLUSTER = {
    "head": {"name": "spark1", "ip": "10.0.0.1"},
    "workers": [{"name": f"spark{i}", "ip": f"10.0.0.{i}"} for i in (2, 3, 4)],
}
# the production stack's flags, all set by preset base (python/tp4/data/presets/base.toml)
PRESET_ARGS = [
    "--fp8-gemm-backend",
    "flashinfer_cutlass",
    "--watchdog-timeout",
    "1800",
    "--min-free-slots-delay",
    "1",
    "--enable-deepseek-v4-fp4-indexer",
    "--enable-cache-report",
    "--sleep-on-idle",
]
BASE_FILE = f"preset base ({PRESETS / 'base.toml'})"


def doc(**engine) -> dict:
    return {"preset": "production", "cluster": copy.deepcopy(CLUSTER), "engine": engine}


def problems(d: dict) -> list[str]:
    with pytest.raises(InvalidInput) as exc:
        parse_document(d, "/srv/line/profile.toml")
    assert exc.value.exit_code == 2
    return exc.value.problems


def test_a_profile_flag_adds_to_the_presets_flags():
    loaded = parse_document(doc(extra_args=["--log-level", "debug"]), "p.toml")
    assert loaded.profile.engine.extra_args == [*PRESET_ARGS, "--log-level", "debug"]
    env = build_plan(loaded).nodes[0].env
    assert env["EXTRA_SGLANG_ARGS"] == " ".join([*PRESET_ARGS, "--log-level", "debug"])


def test_the_watchdog_example_no_longer_drops_the_presets_flags():
    """`engine.extra_args = ["--watchdog-timeout", "1800"]` used to replace the preset's list,
    losing --fp8-gemm-backend flashinfer_cutlass, --enable-deepseek-v4-fp4-indexer and
    --sleep-on-idle. The preset sets --watchdog-timeout itself: giving it again is an error that
    names both layers; changing its value is a drop and an add, and keeps every other flag."""
    found = problems(doc(extra_args=["--watchdog-timeout", "1800"]))
    assert found == [
        f"engine.extra_args: --watchdog-timeout is given by {BASE_FILE} and again by /srv/line/profile.toml; "
        'fix: to change the inherited value, add "--watchdog-timeout" to engine.drop_args in '
        "/srv/line/profile.toml and keep yours; otherwise remove yours"
    ]
    loaded = parse_document(doc(drop_args=["--watchdog-timeout"], extra_args=["--watchdog-timeout", "3600"]), "p.toml")
    args = loaded.profile.engine.extra_args
    assert args == [
        "--fp8-gemm-backend",
        "flashinfer_cutlass",
        "--min-free-slots-delay",
        "1",
        "--enable-deepseek-v4-fp4-indexer",
        "--enable-cache-report",
        "--sleep-on-idle",
        "--watchdog-timeout",
        "3600",
    ]


def test_drop_args_removes_an_inherited_flag_with_its_values():
    loaded = parse_document(doc(drop_args=["--sleep-on-idle", "--fp8-gemm-backend"]), "p.toml")
    assert loaded.profile.engine.extra_args == [
        "--watchdog-timeout",
        "1800",
        "--min-free-slots-delay",
        "1",
        "--enable-deepseek-v4-fp4-indexer",
        "--enable-cache-report",
    ]
    assert loaded.profile.engine.drop_args == ["--sleep-on-idle", "--fp8-gemm-backend"]


@pytest.mark.parametrize("item", ["--no-such-flag", "flashinfer_cutlass", "--sleep-on-idle=1", "sleep-on-idle", "-x"])
def test_drop_args_of_a_flag_no_lower_layer_sets_is_an_error(item):
    found = problems(doc(drop_args=["--sleep-on-idle", item]))
    assert found == [
        f"engine.drop_args[1]: {item!r} in /srv/line/profile.toml is not a flag a lower layer sets in "
        "engine.extra_args, so there is nothing to drop; fix: name one of --enable-cache-report, "
        "--enable-deepseek-v4-fp4-indexer, --fp8-gemm-backend, --min-free-slots-delay, --sleep-on-idle, "
        "--watchdog-timeout (a flag, without its value), or remove it"
    ]


def test_drop_args_on_a_preset_without_extra_args_says_so():
    found = problems(
        {
            "preset": "launcher-defaults",
            "cluster": copy.deepcopy(CLUSTER),
            "engine": {"ep": 2, "drop_args": ["--sleep-on-idle"]},
        }
    )
    assert len(found) == 1 and found[0].startswith("engine.drop_args[0]: '--sleep-on-idle'")
    assert found[0].endswith("fix: remove it (the layers below set no extra_args)")


@pytest.mark.parametrize("args", [["--log-level", "debug", "--log-level=info"], ["--x", "--y", "--x"]])
def test_a_flag_twice_in_one_layer_is_an_error(args):
    flag = args[0]
    assert problems(doc(extra_args=args)) == [
        f"engine.extra_args: {flag} is given twice in /srv/line/profile.toml; fix: remove one of them"
    ]


def test_a_flag_the_preset_gives_in_another_form_is_still_the_same_flag():
    found = problems(doc(extra_args=["--sleep-on-idle=true"]))
    assert found[0].startswith(f"engine.extra_args: --sleep-on-idle is given by {BASE_FILE} and again by ")


def test_a_problem_of_the_profiles_own_item_names_its_own_index():
    """The merged list starts with the presets' flags; a problem names the profile's own index."""
    found = problems(doc(extra_args=["--log-level", "debug", "--tp", "8"]))
    assert [p.split(":")[0] for p in found] == ["engine.extra_args[2]"]


def test_the_plan_notes_the_layer_of_each_extra_argument():
    loaded = parse_document(doc(drop_args=["--sleep-on-idle"], extra_args=["--log-level", "debug"]), "p.toml")
    notes = [n for n in build_plan(loaded).notes if n.startswith("engine.extra_args:")]
    assert notes == [
        "engine.extra_args: --fp8-gemm-backend flashinfer_cutlass from preset base",
        "engine.extra_args: --watchdog-timeout 1800 from preset base",
        "engine.extra_args: --min-free-slots-delay 1 from preset base",
        "engine.extra_args: --enable-deepseek-v4-fp4-indexer from preset base",
        "engine.extra_args: --enable-cache-report from preset base",
        "engine.extra_args: --log-level debug from the profile",
        "engine.extra_args: --sleep-on-idle from preset base is dropped by the profile's engine.drop_args",
    ]


def test_tp4_plan_prints_the_layer_of_each_argument(tp4_cli, tmp_path, repo):
    profile = tmp_path / "profile.toml"
    profile.write_text(
        (repo / "python/tp4/data/default-profile.toml").read_text()
        + '\n[engine]\ndrop_args = ["--sleep-on-idle"]\nextra_args = ["--log-level", "debug"]\n'
    )
    code, out, err = tp4_cli("plan", "--profile", str(profile))
    assert code == 0, err
    assert "note: engine.extra_args: --log-level debug from the profile" in out.splitlines()
    assert "note: engine.extra_args: --fp8-gemm-backend flashinfer_cutlass from preset base" in out.splitlines()
    assert (
        "note: engine.extra_args: --sleep-on-idle from preset base is dropped by the profile's engine.drop_args"
        in out.splitlines()
    )


def test_the_other_lists_are_replaced_whole():
    d = doc()
    d["fabric"] = {"hcas": ["rocep1s0f1"]}
    d["nfs"] = {"clients": ["10.0.0.2"]}
    loaded = parse_document(d, "p.toml")
    assert loaded.profile.fabric.hcas == ["rocep1s0f1"]  # preset base lists rocep1s0f0, roceP2p1s0f0
    assert loaded.profile.nfs.clients == ["10.0.0.2"]


def _list_fields(model: type[BaseModel], prefix: str = "") -> list[str]:
    out = []
    for name, info in model.model_fields.items():
        ann = info.annotation
        if typing.get_origin(ann) is list:
            out.append(f"{prefix}{name}")
            continue
        sub = next((a for a in (ann, *typing.get_args(ann)) if isinstance(a, type) and issubclass(a, BaseModel)), None)
        if sub is not None:
            out += _list_fields(sub, f"{prefix}{name}.")
    return out


def test_every_list_field_says_how_it_layers_in_one_table():
    assert sorted(_list_fields(models.Profile)) == sorted(models.LIST_MERGE)
    for path, rule in models.LIST_MERGE.items():
        assert rule.why, path
        if rule.how == "add":
            assert rule.drop in models.LIST_MERGE and models.LIST_MERGE[rule.drop].how == "drop", path


def test_the_table_adds_only_what_the_loader_can_add():
    """Adding is the loader's merge of a flag list (engine.extra_args with engine.drop_args): a
    row marked "add" for another field, without the loader taught to add it, fails here."""
    added = [p for p, r in models.LIST_MERGE.items() if r.how == "add"]
    assert added == ["engine.extra_args"]


def test_a_drop_named_twice_is_an_error():
    assert problems(doc(drop_args=["--sleep-on-idle", "--sleep-on-idle"])) == [
        "engine.drop_args[1]: '--sleep-on-idle' is named twice in /srv/line/profile.toml; fix: remove one"
    ]
