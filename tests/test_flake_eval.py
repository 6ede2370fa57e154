"""The flake evaluates against the recording stand-in for nixpkgs (tests/nixpkgs-stub).

The real flake.nix is evaluated (`nix eval path:<copy>#...`) with nixpkgs and nixos-dgx-spark
overridden; every builder call is checked against tests/nixpkgs-stub/api.nix and recorded, so the
assertions below read back what the flake passes to dockerTools, fetchPypi, buildPythonApplication.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from nix_env import empty_flake, flake_copy, locked_flake_copy, nix, stub_inputs
from tp4.line import registry
from tp4.line.container import HEALTH
from tp4.image.sources import manifest as mf

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("flake-eval")


@pytest.fixture(scope="module")
def flake(work):
    """A copy of the flake whose manifest has every row locked (fake hashes)."""
    return locked_flake_copy(REPO, work / "locked")


def evaluate(work: Path, flake: Path, attr: str, apply: str | None = None, *, ok: bool = True):
    argv = ["eval", "--json", f"path:{flake}#{attr}", *stub_inputs(REPO, empty_flake(work / "empty"))]
    if apply:
        argv += ["--apply", apply]
    proc = nix(argv, work)
    if ok:
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)
    assert proc.returncode != 0
    return proc.stderr


# What a test reads back from the stand-in's records (derivations print as their outPath).
IMAGE = """img: let step = d: { inherit (d) name; out = d.outPath; inherit (d.stub) builder; script = d.stub.args.buildCommand;
    graph = d.stub.args.exportReferencesGraph or [ ]; path = d.stub.args.PYTHONPATH; }; in {
  inherit (img) name;
  image = step img;
  spec = builtins.fromJSON img.stub.args.TP4_OCI_CONFIG;
  base = img.passthru.base.stub;
  baseOut = "${img.passthru.base.outPath}";
  baseLayers = step img.passthru.baseLayers;
  storeLayers = map step img.passthru.storeLayers;
  links = step img.passthru.links;
  layers = map (l: { path = l.path or null; sitePackages = l.sitePackages or false; tree = l.tree.name; out = l.tree.outPath; subdir = l.subdir or ""; }) img.passthru.layers;
  ref = img.passthru.lineRef;
}"""


@pytest.fixture(scope="module")
def real(work):
    """A copy of the flake as committed: three rows unlocked, as on every fresh clone."""
    return flake_copy(REPO, work / "real")


@pytest.fixture(scope="module")
def image(work, flake):
    return evaluate(work, flake, "packages.aarch64-linux.image", IMAGE)


@pytest.fixture(scope="module")
def manifest():
    return mf.load(REPO / "sources.manifest")


def test_image_base_is_the_pinned_digest(image, manifest):
    base_row = next(r for r in manifest.rows if r.kind == "image")
    assert image["base"]["builder"] == "dockerTools.pullImage"
    args = image["base"]["args"]
    assert args["imageDigest"] == base_row.image()["digest"]
    assert args["imageName"] == "lmsysorg/sglang"
    assert args["arch"] == "arm64"
    # its docker-archive becomes one blob per layer, once (a derivation of its own)
    assert f"python3 -m tp4.image.oci 'base' '--archive' '{image['baseOut']}'" in image["baseLayers"]["script"]


def test_image_layers_in_order_of_change(image):
    assert [(layer["path"], layer["tree"]) for layer in image["layers"]] == [
        (None, "dsv41-wheels"),
        ("/sgl-workspace/sglang/python", "sglang-tree"),
        ("/opt/b12x", "b12x"),
        ("/opt/b12x_next", "b12x-next"),
        ("/opt/dsv41", "tp4-runtime-519a3988"),
    ]
    # one derivation per tree, bottom first: the closure of its tree (graph-i) less the closures
    # of the trees below it, so an unchanged tree keeps its layer's store path and digest
    outs = [layer["out"] for layer in image["layers"]]
    for i, layer in enumerate(image["storeLayers"]):
        assert layer["builder"] == "runCommand"
        assert layer["graph"] == [x for j in range(i + 1) for x in (f"graph-{j}", outs[j])]
        below = "".join(f" '--below' 'graph-{j}'" for j in range(i))
        assert f"python3 -m tp4.image.oci 'layer' '--graph' 'graph-{i}'{below} --out \"$out\"" in layer["script"]
        assert layer["path"].endswith("-tp4-oci/python")
    # the top layer links each path to its tree; the wheels go into the base's site-packages, as
    # upstream's pip install puts them (tp4.image.oci links --install, with what the base holds)
    assert [layer["sitePackages"] for layer in image["layers"]] == [True, False, False, False, False]
    for layer in image["layers"][1:]:
        assert f"'--link' '{layer['path']}={layer['out']}{layer['subdir']}'" in image["links"]["script"]
    wheels = image["layers"][0]["out"]
    assert f"'--install' '{wheels}' '--base' '{image['baseLayers']['out']}' --out \"$out\"" in image["links"]["script"]
    assert f"'--link' '{wheels}" not in image["links"]["script"] and "=" + wheels not in image["links"]["script"]
    # the layout: the base's layers, then each tree's, then the links
    layers = "".join(f" '--layer' '{d['out']}'" for d in [*image["storeLayers"], image["links"]])
    assert (
        f"python3 -m tp4.image.oci 'image' '--name' 'dsv41-4x-spark' '--base' '{image['baseLayers']['out']}'"
        f'{layers} --out "$out"'
    ) in image["image"]["script"]


def test_each_path_points_at_what_upstream_copies_there(image, manifest):
    """/sgl-workspace/sglang/python must hold sglang/ (the tree keeps python/ at its top),
    /opt/b12x must hold b12x/, /opt/b12x_next b12x_next/ (their trees keep those dirs)."""
    subdirs = {layer["path"]: layer["subdir"] for layer in image["layers"]}
    assert subdirs["/sgl-workspace/sglang/python"] == "/python"
    assert manifest.tree_by_name["sglang-line"].attrs["keep"] == "python"
    assert subdirs["/opt/b12x"] == subdirs["/opt/b12x_next"] == subdirs["/opt/dsv41"] == ""
    assert manifest.tree_by_name["b12x"].attrs["keep"] == "b12x,LICENSE"
    assert manifest.tree_by_name["b12x-next"].attrs["stamp"] == "b12x_next"


def test_image_config_as_upstream(image):
    config = image["spec"]["config"]
    assert config["Entrypoint"] == ["python3", "-u", "/opt/dsv41/boot.py"]
    assert config["Cmd"] == ["run"]
    assert config["WorkingDir"] == "/opt/dsv41"
    assert config["ExposedPorts"] == {"8888/tcp": {}}
    env = dict(e.split("=", 1) for e in config["Env"])
    # upstream's, exactly: the wheels are in site-packages
    assert env["PYTHONPATH"] == "/opt/dsv41/adapter:/opt/b12x:/opt/b12x_next"
    assert env["MODEL_PATH"] == "/models/DeepSeek-V4.1-Flash"
    assert env["STATE_PATH"] == "/state" and env["OFFLOAD_MODE"] == "nvme"
    health = config["Healthcheck"]
    assert health["Test"] == ["CMD", "python3", "-S", "/opt/dsv41/boot.py", "health"]
    assert (health["Interval"], health["Timeout"], health["StartPeriod"], health["Retries"]) == (
        30 * 10**9,
        30 * 10**9,
        1800 * 10**9,
        3,
    )
    # from the one table the plan also carries to podman (run.health; podman reads no health check
    # from an OCI image's config)
    assert health == {
        "Test": ["CMD", *HEALTH.cmd],
        "Interval": HEALTH.interval * 10**9,
        "Timeout": HEALTH.timeout * 10**9,
        "StartPeriod": HEALTH.start_period * 10**9,
        "Retries": HEALTH.retries,
    }
    assert image["spec"]["architecture"] == "arm64"


def test_image_is_loaded_under_a_content_tag_and_names_the_line_reference(image):
    """The layout names the image dsv41-4x-spark:<tag from its config's hash> (python -m tp4.image.oci,
    tests/test_oci.py), so loading it never moves the line's tag; `tp4 build` tags it
    dsv41-4x-spark:canary-roce after its checks pass."""
    assert image["name"] == "dsv41-4x-spark"
    assert "'--name' 'dsv41-4x-spark'" in image["image"]["script"] and "tag" not in image["spec"]
    assert image["ref"] == "dsv41-4x-spark:canary-roce"
    assert image["spec"]["config"]["Labels"]["tp4.line.ref"] == image["ref"]


def test_image_carries_the_registry_checks(image):
    """Label tp4.checks is the registry's [[image_check]] list as JSON, which tp4 build parses
    with the same strict parser as the registry."""
    checks = json.loads(image["spec"]["config"]["Labels"]["tp4.checks"])
    registry_toml = tomllib.loads((REPO / "python" / "tp4" / "data" / "registry.toml").read_text())
    assert checks == registry_toml["image_check"]
    parsed = registry.parse_image_checks(checks, "label")
    assert parsed == registry.load_registry().image_checks
    names = {c.name for c in parsed}
    assert {
        "import-sglang",
        "import-b12x",
        "import-b12x_next",
        "loop_abort",
        "moe_b12x_next_cpu",
        "block_verify",
        "indexer_chunked_v3",
    } <= names
    assert any(c.gpu for c in parsed) and sum(not c.gpu for c in parsed) >= 20


def test_image_labels_carry_every_pin_and_the_flake_revision(image, manifest):
    labels = image["spec"]["config"]["Labels"]
    for row in manifest.rows:
        assert labels[f"tp4.pin.{row.name}"] == row.commit
    assert labels["tp4.flake.rev"] == labels["org.opencontainers.image.revision"]
    assert labels["tp4.flake.rev"]  # a path: flake has no rev; the real flake sets rev or dirtyRev


def test_trees_run_the_transforms_of_tp4_sources(work, flake, manifest):
    trees = evaluate(
        work,
        flake,
        "packages.x86_64-linux",
        """p: builtins.mapAttrs (n: t: {
      inherit (t.stub) builder; script = t.stub.args.buildCommand; inherit (t) target inputs;
      pythonpath = t.stub.args.PYTHONPATH; }) { inherit (p) sglang-tree b12x b12x-next; }""",
    )
    for pname, target in {"sglang-tree": "sglang-line", "b12x": "b12x", "b12x-next": "b12x-next"}.items():
        tree = trees[pname]
        assert tree["builder"] == "runCommand" and tree["target"] == target
        assert f"python3 -m tp4.image.sources fetch '{target}' --to \"$out\" --offline" in tree["script"]
        assert tree["inputs"] == [r.name for r in manifest.inputs(target)]
        for row in manifest.inputs(target):
            assert f"'--input' '{row.name}=/nix/store/" in tree["script"]
        assert tree["pythonpath"].endswith("-tp4-transforms/python")


def test_wheels_fetched_with_fetchpypi_by_hash(work, flake, manifest):
    wheels = evaluate(
        work,
        flake,
        "packages.aarch64-linux.wheels",
        """w: {
      fetched = map (x: x.src.stub // { inherit (x) file; inherit (x.src) name; }) w.wheels;
      script = w.stub.args.buildCommand; }""",
    )
    rows = [r for r in manifest.rows if r.kind == "wheel"]
    assert [w["builder"] for w in wheels["fetched"]] == ["python3Packages.fetchPypi"] * len(rows)
    for w, row in zip(wheels["fetched"], rows, strict=True):
        assert w["args"]["format"] == "wheel" and w["args"]["sha256"] == row.sha256
        assert w["args"]["version"] == row.commit and w["args"]["platform"] == row.wheel()["platform"]
        # installed under its file name (installer reads name and version from it), which is
        # also the name nixpkgs gives the fetched file
        assert w["file"] == w["name"] == row.url.removeprefix("pypi:")
        assert f"\"$TMPDIR\"/dist/'{w['file']}'" in wheels["script"]


def test_cli_package_from_the_poetry_pyproject(work, flake):
    pyproject = tomllib.loads((REPO / "python" / "pyproject.toml").read_text())
    cli = evaluate(
        work,
        flake,
        "packages.x86_64-linux.tp4",
        """p: {
      inherit (p.stub) builder; args = builtins.removeAttrs p.stub.args [ "src" ];
      deps = map (d: d.pname) p.stub.args.dependencies; build = map (d: d.pname) p.stub.args.build-system; }""",
    )
    assert cli["builder"] == "python3Packages.buildPythonApplication"
    assert cli["args"]["pyproject"] is True
    assert cli["args"]["version"] == pyproject["tool"]["poetry"]["version"]
    assert cli["build"] == ["poetry-core"]
    wanted = {d.lower() for d in pyproject["tool"]["poetry"]["dependencies"] if d != "python"}
    assert set(cli["deps"]) == wanted
    assert cli["args"]["sourceRoot"] == "tp4-source/python"
    assert cli["args"]["meta"]["mainProgram"] == "tp4"


def test_flake_outputs(work, flake, manifest):
    out = evaluate(work, flake, "apps", "a: builtins.mapAttrs (s: v: v.default.program) a")
    assert all(p.endswith("-tp4-0.1.0/bin/tp4") for p in out.values()) and set(out) == {"aarch64-linux", "x86_64-linux"}
    # nix run .#serve -- [--profile FILE]: a script that execs `tp4 serve "$@"` (and up, stop, status)
    for name in ("up", "serve", "stop", "status"):
        app = evaluate(work, flake, f"apps.aarch64-linux.{name}", "a: { inherit (a) type program; }")
        assert app["type"] == "app" and app["program"].endswith(f"-tp4-{name}")
    text = (REPO / "pkgs" / "outputs.nix").read_text()
    assert '''writeShellScript "tp4-${name}" ''exec ${tp4} ${name} "$@"''' "" in text
    names = evaluate(work, flake, "packages", "p: builtins.mapAttrs (s: builtins.attrNames) p")
    assert set(names["aarch64-linux"]) == {
        "image",
        "image-canary",
        "image-local",
        "tp4",
        "default",
        "sglang-tree",
        "b12x",
        "b12x-next",
        "tp4-runtime",
        "wheels",
    }
    assert "image" not in names["x86_64-linux"] and "tp4-runtime" not in names["x86_64-linux"]
    sources = evaluate(work, flake, "legacyPackages.aarch64-linux.sources", "builtins.attrNames")
    assert sorted(sources) == sorted(r.name for r in manifest.rows)
    checks = evaluate(work, flake, "checks", "c: builtins.mapAttrs (s: builtins.attrNames) c")
    assert {"eval", "formatting", "unit", "tp4", "wheels"} <= set(checks["x86_64-linux"])
    assert "sources-unlocked" not in checks["x86_64-linux"]
    # the Sparks' own: the image, its runtime tree and the NixOS checks (tests/test_nixos_vm.py)
    assert set(checks["aarch64-linux"]) == set(checks["x86_64-linux"]) | {
        "image",
        "image-canary",
        "image-local",
        "tp4-runtime",
        "spark-host-vm",
    } | {f"nixos-spark{i}" for i in range(1, 5)}
    assert evaluate(work, flake, "devShells.x86_64-linux.default.stub.builder") == "mkShell"
    assert evaluate(work, flake, "formatter.aarch64-linux.name") == "nixfmt-tree"


def test_eval_check_instantiates_every_output_of_every_system(work, flake):
    """checks.eval is a file of the .drv paths of every package, dev shell, source and
    formatter, on both systems, written without depending on any of them."""
    got = evaluate(
        work,
        flake,
        "checks.x86_64-linux.eval",
        """e: {
      inherit (e.stub) builder; listed = builtins.fromJSON e.stub.args.text;
      context = builtins.hasContext e.stub.args.text; }""",
    )
    assert got["builder"] == "writeText" and got["context"] is False
    listed = got["listed"]
    for system in ("aarch64-linux", "x86_64-linux"):
        packages = evaluate(work, flake, f"packages.{system}", "p: builtins.mapAttrs (n: d: d.drvPath) p")
        assert {n: p for n, p in listed.items() if n.startswith(f"{system}.packages.")} == {
            f"{system}.packages.{n}": p for n, p in packages.items()
        }
        assert f"{system}.devShells.default" in listed and f"{system}.formatter.default" in listed
        assert f"{system}.sources.base-image" in listed
    assert "aarch64-linux.packages.image" in listed and all(p.endswith(".drv") for p in listed.values())


def test_formatting_check_is_nixfmt_over_the_nix_files(work, flake):
    """The project handed to treefmt's check is a real copy (builtins.path) of the Nix files alone."""
    got = evaluate(
        work,
        flake,
        "checks.x86_64-linux.formatting",
        """f: {
      inherit (f.stub) builder; project = f.stub.args.project; }""",
    )
    assert got["builder"] == "nixfmt-tree.check"
    project = Path(got["project"])
    copied = sorted(str(p.relative_to(project)) for p in project.rglob("*") if not p.is_dir())
    assert copied == sorted(str(p.relative_to(flake)) for p in flake.rglob("*.nix"))
    assert "flake.nix" in copied and "pkgs/checks.nix" in copied


def test_unit_check_runs_the_unit_modules_with_the_test_python(work, flake):
    unit = evaluate(
        work,
        flake,
        "checks.x86_64-linux.unit",
        """u: {
      script = u.stub.args.buildCommand;
      inputs = map (p: p.name) u.stub.args.nativeBuildInputs;
      python = map (p: p.pname or p.name) (builtins.head u.stub.args.nativeBuildInputs).stub.args.packages; }""",
    )
    assert "grep -l '^pytestmark = pytest.mark.unit$' tests/test_*.py" in unit["script"]
    assert "python3 -m pytest -q -p no:cacheprovider --hypothesis-seed=0 -m unit $modules" in unit["script"]
    assert unit["inputs"] == ["python3-3.13.14-env", "git"]
    pyproject = tomllib.loads((REPO / "python" / "pyproject.toml").read_text())["tool"]["poetry"]
    wanted = {d for d in pyproject["dependencies"] if d != "python"} | set(pyproject["group"]["dev"]["dependencies"])
    assert set(unit["python"]) == wanted and "installer" in wanted and "ruff" in wanted


def test_dev_shell_builds_from_the_package_and_keeps_busybox_off_path(work, flake):
    shell = evaluate(
        work,
        flake,
        "devShells.x86_64-linux.default",
        """s: {
      inputsFrom = map (p: p.name) s.stub.args.inputsFrom;
      packages = map (p: p.name) s.stub.args.packages;
      busybox = s.stub.args.env.TP4_TEST_BUSYBOX; }""",
    )
    assert shell["inputsFrom"] == ["tp4-0.1.0"]
    assert not any("busybox" in p for p in shell["packages"])
    assert {"python3-3.13.14-env", "iproute2", "gnupatch", "nix", "git"} <= set(shell["packages"])
    assert shell["busybox"].startswith("/nix/store/") and shell["busybox"].endswith(
        "-busybox-static-x86_64-unknown-linux-musl-1.37.0/bin/busybox"
    )


LOCK_ALL = "tp4 sources lock dsv41 dsv41/runtime/roce_tp4_adapt.py base-image"


def test_unlocked_rows_are_refused_with_the_lock_command(work, real):
    err = evaluate(work, real, "legacyPackages.aarch64-linux.image.passthru.base.outPath", ok=False)
    assert "source row 'base-image'" in err and LOCK_ALL in err


def test_a_fresh_clone_passes_flake_check_without_the_outputs_of_unlocked_rows(work, real):
    """The committed manifest has three unlocked rows: `nix flake check` passes all the same;
    what needs them is out of `packages` and `checks` (in legacyPackages, which flake check skips),
    and checks.sources-unlocked passes, naming them and the command."""
    proc = nix(["flake", "check", "--no-build", f"path:{real}", *stub_inputs(REPO, empty_flake(work / "empty"))], work)
    assert proc.returncode == 0, proc.stderr
    assert LOCK_ALL in proc.stderr and "aarch64-linux.packages.image" in proc.stderr
    names = evaluate(work, real, "packages", "p: builtins.mapAttrs (s: builtins.attrNames) p")
    assert (
        set(names["aarch64-linux"]) == set(names["x86_64-linux"]) == {"tp4", "default", "b12x", "b12x-next", "wheels"}
    )
    legacy = evaluate(work, real, "legacyPackages", "p: builtins.mapAttrs (s: builtins.attrNames) p")
    assert set(legacy["aarch64-linux"]) == {
        "sources",
        "image",
        "image-canary",
        "image-local",
        "sglang-tree",
        "tp4-runtime",
    }
    checks = evaluate(work, real, "checks", "c: builtins.mapAttrs (s: builtins.attrNames) c")
    assert {"eval", "formatting", "unit", "tp4", "b12x", "b12x-next", "wheels", "sources-unlocked"} <= set(
        checks["x86_64-linux"]
    )
    assert not {"image", "image-canary", "image-local", "tp4-runtime", "sglang-tree"} & set(checks["aarch64-linux"])
    unlocked = evaluate(
        work,
        real,
        "checks.aarch64-linux.sources-unlocked",
        """c: {
      inherit (c) unlocked leftOut lockCommand; script = c.stub.args.buildCommand; }""",
    )
    assert unlocked["unlocked"] == ["dsv41", "dsv41/runtime/roce_tp4_adapt.py", "base-image"]
    assert (
        unlocked["lockCommand"] == LOCK_ALL and LOCK_ALL in unlocked["script"] and 'touch "$out"' in unlocked["script"]
    )
    # the real files the lock rewrites, not the root's links (`git commit LINK` commits the link)
    assert "(git commit python/tp4/data/sources.manifest python/tp4/data/sources.manifest.json)" in unlocked["script"]
    assert "aarch64-linux.packages.image" in unlocked["leftOut"] and "x86_64-linux.sources.dsv41" in unlocked["leftOut"]
    listed = evaluate(work, real, "checks.x86_64-linux.eval", "e: builtins.fromJSON e.stub.args.text")
    assert "aarch64-linux.packages.b12x" in listed and "x86_64-linux.sources.b12x-main" in listed
    assert not set(unlocked["leftOut"]) & set(listed)


def test_building_the_image_on_an_unlocked_clone_fails_at_evaluation_with_the_one_command(work, real):
    proc = nix(
        [
            "build",
            "--dry-run",
            "--option",
            "system",
            "aarch64-linux",
            f"path:{real}#image",
            *stub_inputs(REPO, empty_flake(work / "empty")),
        ],
        work,
    )
    assert proc.returncode != 0
    err = " ".join(proc.stderr.split())
    assert "is not locked" in err and LOCK_ALL in err
    # what it downloads, how large, and that the change is to be committed
    assert "It downloads:" in err and "- base-image: the whole base image docker://lmsysorg/sglang:dev-dsv41@" in err
    assert "about ~33GB" in err and "- dsv41: the archive https://github.com/MiaAI-Lab/" in err
    assert (
        "commit the change (git commit python/tp4/data/sources.manifest python/tp4/data/sources.manifest.json)" in err
    )


def test_wheels_is_a_check_on_every_system(work, flake):
    """What catches a wheel-name break on an x86_64 machine: the wheels package is built by
    `nix flake check` there too."""
    for system in ("x86_64-linux", "aarch64-linux"):
        got = evaluate(work, flake, f"checks.{system}.wheels", "w: { inherit (w) name; b = w.stub.builder; }")
        assert got == {"name": "dsv41-wheels", "b": "runCommand"}


def test_runtime_library_is_compiled_as_upstream_and_self_contained(work, flake):
    rt = evaluate(
        work,
        flake,
        "packages.aarch64-linux.tp4-runtime",
        "r: { inherit (r.stub.args) buildPhase allowedReferences dontPatchShebangs; src = r.stub.args.src.name; }",
    )
    assert "-O2 -Wall -Wextra -Werror -std=c++17 -shared -fPIC -pthread" in rt["buildPhase"]
    assert "adapter/row_store.cpp -o adapter/librow_store.so" in rt["buildPhase"]
    assert rt["allowedReferences"] == [] and rt["dontPatchShebangs"] is True
    assert rt["src"] == "runtime-tree"


def test_every_image_of_the_registry_is_a_check_on_a_locked_clone(work, flake):
    """The rollback presets' images (image-canary, image-local) are built by `nix flake check`
    like the line's own, once every row is locked; none is a check of x86_64."""
    got = evaluate(
        work,
        flake,
        "checks.aarch64-linux",
        'c: builtins.filter (n: builtins.substring 0 5 n == "image") (builtins.attrNames c)',
    )
    assert got == ["image", "image-canary", "image-local"]
    got = evaluate(
        work,
        flake,
        "checks.x86_64-linux",
        'c: builtins.filter (n: builtins.substring 0 5 n == "image") (builtins.attrNames c)',
    )
    assert got == []
