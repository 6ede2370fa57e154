"""One image per preset: the registry's `[images.<variant>]` table is the one place that names
each variant's flake attribute and reference; pkgs/default.nix builds each from the same trees
(the layers they share are the same derivations), `tp4 build --image VARIANT` builds that
attribute, and each preset's plan runs the reference the flake builds for it."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from nix_env import empty_flake, locked_flake_copy, nix, stub_inputs
from tp4.line.plan import build_plan
from tp4.line.profile.load import DEFAULT_PROFILE, merge, parse_document
from tp4.line.registry import load_registry

REPO = Path(__file__).resolve().parent.parent
REGISTRY = tomllib.loads((REPO / "adapters" / "registry.toml").read_text())

READ = """img: let drv = d: { inherit (d) name drvPath; args = builtins.removeAttrs d.stub.args [ "passthru" ]; }; in {
  image = { inherit (img) name drvPath; };
  base = drv img.passthru.baseLayers;
  layers = map drv img.passthru.storeLayers;
  links = drv img.passthru.links;
  trees = map (l: { path = l.path or null; tree = l.tree.name; }) img.passthru.layers;
  ref = img.passthru.lineRef;
  inherit (img.passthru) variant;
  checks = map (c: c.name) img.passthru.checks;
  env = (builtins.fromJSON img.stub.args.TP4_OCI_CONFIG).config.Env;
}"""


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    work = tmp_path_factory.mktemp("images")
    flake = locked_flake_copy(REPO, work / "locked")
    out = {}
    for variant, built in REGISTRY["images"].items():
        argv = [
            "eval",
            "--json",
            f"path:{flake}#packages.aarch64-linux.{built['attr']}",
            "--apply",
            READ,
            *stub_inputs(REPO, empty_flake(work / "empty")),
        ]
        proc = nix(argv, work)
        assert proc.returncode == 0, proc.stderr
        out[variant] = json.loads(proc.stdout)
    return out


def test_one_image_per_variant_named_by_the_registry(images):
    assert list(REGISTRY["images"]) == REGISTRY["image_order"]
    assert [REGISTRY["images"][v]["attr"] for v in REGISTRY["image_order"]] == ["image-local", "image-canary", "image"]
    for variant, img in images.items():
        assert img["variant"] == variant and img["ref"] == REGISTRY["images"][variant]["ref"]
    assert len({img["image"]["drvPath"] for img in images.values()}) == 3


def test_each_image_holds_the_trees_of_its_dockerfile(images):
    trees = {
        v: [t["tree"].removeprefix("dsv41-").split("-519a3988")[0] for t in img["trees"]] for v, img in images.items()
    }
    assert trees["canary-roce"] == ["wheels", "sglang-tree", "b12x", "b12x-next", "tp4-runtime"]
    # Dockerfile.canary: the dsv4.1 branch (no RoCEnante patch) and the two wheels
    assert trees["canary"] == ["wheels", "sglang-branch-tree", "tp4-runtime"]
    # Dockerfile: the stock image's SGLang, upstream's adapters and boot.py
    assert trees["base"] == ["tp4-runtime"]
    env = {v: next(e for e in img["env"] if e.startswith("PYTHONPATH=")) for v, img in images.items()}
    # upstream's ENV PYTHONPATH: the wheels are in the base's site-packages, not on it
    assert env["canary-roce"] == "PYTHONPATH=/opt/dsv41/adapter:/opt/b12x:/opt/b12x_next"
    assert env["canary"] == "PYTHONPATH=/opt/dsv41/adapter"
    assert env["base"] == "PYTHONPATH=/opt/dsv41/adapter"


def test_shared_layers_are_the_same_derivations_and_the_others_differ(images):
    roce, canary, local = images["canary-roce"], images["canary"], images["base"]
    # the pinned base image's layers: one derivation for all three
    assert roce["base"] == canary["base"] == local["base"]
    # the wheels at the bottom of both canary images: one derivation
    assert roce["layers"][0] == canary["layers"][0] and roce["layers"][0]["name"].endswith("-wheels")
    # the SGLang trees differ (RoCEnante or not), and so does everything above them
    assert roce["layers"][1]["drvPath"] != canary["layers"][1]["drvPath"]
    assert "sglang-tree" in roce["layers"][1]["name"] and "sglang-branch-tree" in canary["layers"][1]["name"]
    assert roce["layers"][4]["args"] != canary["layers"][2]["args"]
    assert len({img["links"]["drvPath"] for img in images.values()}) == 3


def test_each_image_carries_the_checks_for_its_variant(images):
    roce = {c["name"] for c in REGISTRY["image_check"]}
    assert set(images["canary-roce"]["checks"]) == roce
    assert images["base"]["checks"] == ["thinking_alias", "max_new_tokens", "loop_abort"]
    assert set(images["canary"]["checks"]) == {
        "wheels",
        "import-sglang",
        "thinking_alias",
        "max_new_tokens",
        "loop_abort",
        "indexer_chunked_v3",
    }
    assert load_registry().image_checks[0].images == ("canary", "canary-roce")


@pytest.mark.parametrize("preset", ["base", "canary", "canary-roce", "production"])
def test_each_presets_plan_runs_the_image_the_flake_builds_for_it(preset):
    doc = merge(tomllib.loads(DEFAULT_PROFILE.read_text()), {"preset": preset})
    doc.pop("image", None)
    plan = build_plan(parse_document(doc, preset))
    assert plan.image.tag == REGISTRY["images"][plan.image.variant]["ref"]
    assert plan.image.variant == {"base": "base", "canary": "canary"}.get(preset, "canary-roce")


def test_a_profiles_own_tag_wins():
    doc = merge(tomllib.loads(DEFAULT_PROFILE.read_text()), {"preset": "canary", "image": {"tag": "mine:1"}})
    assert build_plan(parse_document(doc, "own")).image.tag == "mine:1"


def test_registry_refuses_an_images_table_that_misses_a_variant():
    from tp4.core.errors import InvalidInput
    from tp4.line.registry import parse_registry

    doc = dict(REGISTRY)
    doc["images"] = {k: v for k, v in REGISTRY["images"].items() if k != "canary"}
    with pytest.raises(InvalidInput) as exc:
        parse_registry(doc)
    assert any("give one [images.<variant>] for each of image_order" in p for p in exc.value.problems)
