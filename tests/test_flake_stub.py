"""The recording stand-in rejects what nixpkgs rejects; every .nix file parses; the builtins-only
files evaluate with plain nix-instantiate; flake.lock matches flake.nix."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from nix_env import empty_flake, flake_copy, locked_flake_copy, nix, nix_config, stub_inputs
from tp4.core import process

REPO = Path(__file__).resolve().parent.parent
STUB = REPO / "tests" / "nixpkgs-stub"
SPEC = REPO.parent / "shared" / "spec" / "nixpkgs-api.md"


def instantiate(expr: str, tmp: Path, *, ok: bool = True):
    proc = process.run(
        ["nix-instantiate", "--eval", "--strict", "--json", "-E", expr],
        env={"NIX_CONFIG": nix_config(tmp)},
        check=False,
    )
    if ok:
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)
    assert proc.returncode != 0, proc.stdout
    return proc.stderr


def stub_call(builder: str, args: str) -> str:
    return f"let p = import {STUB} {{ }}; in (p.{builder} {args}).stub.builder"


@pytest.mark.parametrize(
    "builder,args,complaint",
    [
        ("dockerTools.streamLayeredImage", '{ name = "x"; compressor = "zstd"; }', "does not accept compressor"),
        ("dockerTools.streamLayeredImage", '{ name = "x"; layeringPipline = [ ]; }', "does not accept layeringPipline"),
        ("dockerTools.streamLayeredImage", '{ tag = "t"; }', "requires name"),
        ("dockerTools.pullImage", '{ imageName = "a"; imageDigest = "sha256:0"; }', "exactly one of hash / sha256"),
        (
            "dockerTools.pullImage",
            '{ imageName = "a"; imageDigest = "sha256:0"; hash = ""; sha256 = ""; }',
            "exactly one of hash / sha256",
        ),
        ("dockerTools.pullImage", '{ imageName = "a"; sha256 = ""; }', "requires imageDigest"),
        ("fetchurl", '{ url = "https://x/y"; sha265 = ""; }', "does not accept sha265"),
        ("fetchurl", '{ sha256 = ""; }', "exactly one of url / urls"),
        (
            "python3Packages.fetchPypi",
            '{ pname = "a"; version = "1"; format = "wheel"; sha256 = ""; arch = "x"; }',
            "does not accept arch",
        ),
        (
            "python3Packages.buildPythonApplication",
            '{ pname = "a"; version = "1"; }',
            "exactly one of pyproject / format",
        ),
        (
            "python3Packages.buildPythonApplication",
            '{ pname = "a"; version = "1"; pyproject = true; dependancies = [ ]; }',
            "does not accept dependancies",
        ),
        (
            "python3Packages.buildPythonApplication",
            '{ pname = "a"; version = "1"; pyproject = true; pytestFlagsArray = [ ]; }',
            "pytestFlagsArray: use pytestFlags",
        ),
        (
            "python3Packages.buildPythonApplication",
            '{ pname = "a"; version = "1"; pyproject = true; dontPatchShebang = true; }',
            "does not accept dontPatchShebang",
        ),
        # fetchPypi hands what it does not take itself to the format's URL builder, which has no `...`
        (
            "python3Packages.fetchPypi",
            '{ pname = "a"; version = "1"; format = "wheel"; sha256 = "0"; extension = "zip"; }',
            "(format wheel) does not accept extension",
        ),
        (
            "python3Packages.fetchPypi",
            '{ pname = "a"; version = "1"; sha256 = "0"; abi = "abi3"; }',
            "(format setuptools) does not accept abi",
        ),
        (
            "python3Packages.fetchPypi",
            '{ pname = "a"; version = "1"; format = "egg"; sha256 = "0"; }',
            "Unsupported format egg",
        ),
        (
            "python3Packages.fetchPypi",
            '{ pname = "a"; version = "1"; format = "wheel"; }',
            "exactly one of hash / sha256",
        ),
        # nixpkgs would build with lib.fakeHash and fail; here evaluation fails
        ("fetchurl", '{ url = "https://x/y"; }', "exactly one of hash / outputHash / sha1 / sha256 / sha512"),
        (
            "fetchurl",
            '{ url = "https://x/y"; sha256 = ""; }',
            "exactly one of hash / outputHash / sha1 / sha256 / sha512",
        ),
        ("fetchurl", '{ url = "https://x/y"; sha256 = "0"; hash = "sha256-0"; }', "exactly one of hash / outputHash"),
        ("fetchurl", '{ url = "https://x/y"; outputHash = "0"; }', "outputHash without outputHashAlgo"),
        (
            "stdenv.mkDerivation",
            '{ pname = "a"; version = "1"; dontPatchShebang = true; }',
            "does not accept dontPatchShebang",
        ),
        ("runCommand", '"a" { nativeBuildInput = [ ]; } ""', "does not accept nativeBuildInput"),
        ("mkShell", "{ inputFrom = [ ]; }", "does not accept inputFrom"),
        # nixos/lib/testing: name and testScript have no default; the stand-in wants a node too
        ("testers.runNixOSTest", '{ nodes.machine = { }; testScript = ""; }', "requires name"),
        ("testers.runNixOSTest", '{ name = "t"; nodes.machine = { }; }', "requires testScript"),
        ("testers.runNixOSTest", '{ name = "t"; testScript = ""; }', "requires nodes"),
        (
            "testers.runNixOSTest",
            '{ name = "t"; nodes = { }; testScript = ""; }',
            "nodes must name at least one NixOS module",
        ),
        (
            "testers.runNixOSTest",
            '{ name = "t"; nodes.machine = 1; testScript = ""; }',
            "nodes.machine is not a NixOS module",
        ),
        (
            "testers.runNixOSTest",
            '{ name = "t"; nodes.machine = { }; testScript = [ ]; }',
            "testScript must be a string or a function",
        ),
        (
            "testers.runNixOSTest",
            '{ name = "t"; machines.m = { }; nodes.machine = { }; testScript = ""; }',
            "does not accept machines",
        ),
        (
            "testers.runNixOSTest",
            '{ name = "t"; nodes.machine = { }; testScript = ""; node.pkgsReadonly = false; }',
            "does not accept node.pkgsReadonly",
        ),
        ("testers.runNixOSTest", "(_: { })", "takes a test module as an attrset"),
    ],
)
def test_stub_rejects_what_nixpkgs_rejects(builder, args, complaint, tmp_path):
    err = instantiate(stub_call(builder, args), tmp_path, ok=False)
    assert complaint in err and builder in err


def test_stub_accepts_environment_variables_and_the_attributes_stdenv_reads(tmp_path):
    got = instantiate(
        f"""let p = import {STUB} {{ }}; in [
        (p.runCommand "a" {{ PYTHONPATH = "/x"; nativeBuildInputs = [ ]; passthru.t = 1; }} "").stub.builder
        (p.stdenv.mkDerivation {{ pname = "a"; version = "1"; dontPatchShebangs = true; allowedReferences = [ ]; }}).name
        (p.mkShell {{ inputsFrom = [ ]; packages = [ ]; env.TP4_X = "1"; }}).name
      ]""",
        tmp_path,
    )
    assert got == ["runCommand", "a-1", "nix-shell"]


def test_stub_accepts_a_vm_test_as_nixos_lib_testing_declares_it(tmp_path):
    got = instantiate(
        f"""let p = import {STUB} {{ }}; t = p.testers.runNixOSTest {{
        name = "t"; node.pkgsReadOnly = false; globalTimeout = 60; nodes.machine = {{ lib, ... }}: {{ }};
        testScript = {{ nodes, ... }}: "machine.wait_for_unit('multi-user.target')"; }}; in [ t.name t.stub.builder t.type ]""",
        tmp_path,
    )
    assert got == ["vm-test-run-t", "testers.runNixOSTest", "derivation"]


@pytest.mark.parametrize(
    "call,name",
    [
        # the file name of the wheel, as fetchPypi's URL ends in it and fetchurl names the path after it
        (
            'python3Packages.fetchPypi { pname = "sglang_kernel"; version = "0.4.7"; format = "wheel"; dist = "cp310"; '
            'python = "cp310"; abi = "abi3"; platform = "manylinux2014_aarch64"; sha256 = "0"; }',
            "sglang_kernel-0.4.7-cp310-abi3-manylinux2014_aarch64.whl",
        ),
        (
            'python3Packages.fetchPypi { pname = "a"; version = "1"; format = "wheel"; hash = "sha256-0"; }',
            "a-1-py2.py3-none-any.whl",
        ),
        ('python3Packages.fetchPypi { pname = "a"; version = "1"; sha256 = "0"; }', "a-1.tar.gz"),
        ('python3Packages.fetchPypi { pname = "a"; version = "1"; extension = "zip"; sha256 = "0"; }', "a-1.zip"),
        ('fetchurl { url = "https://e.invalid/o/r/archive/abc.tar.gz?x"; sha256 = "0"; }', "abc.tar.gz?x"),
        ('fetchurl { url = "https://e.invalid/f.patch"; sha256 = "0"; name = "p-0"; }', "p-0"),
        ('fetchurl { url = "https://e.invalid/f"; sha256 = "0"; pname = "f"; version = "2"; name = "n"; }', "f-2"),
        (
            'dockerTools.pullImage { imageName = "lmsysorg/sglang"; imageDigest = "sha256:0"; finalImageTag = "v1:x"; sha256 = "0"; }',
            "docker-image-lmsysorg-sglang-v1-x.tar",
        ),
        ('dockerTools.streamLayeredImage { name = "reg/dsv41"; }', "stream-dsv41"),
    ],
)
def test_store_names_are_the_ones_nixpkgs_gives(call, name, tmp_path):
    got = instantiate(f"let p = import {STUB} {{ }}; d = p.{call}; in [ d.name d.outPath ]", tmp_path)
    assert got[0] == name
    assert re.fullmatch(r"/nix/store/[0-9a-df-np-sv-z]{32}-" + re.escape(name), got[1])


def test_stub_records_accepted_calls(tmp_path):
    got = instantiate(
        f"""let p = import {STUB} {{ }}; i = p.dockerTools.streamLayeredImage {{
        name = "n"; tag = "t"; maxLayers = 2; }}; in {{ inherit (i.stub) builder args; inherit (i) imageTag; }}""",
        tmp_path,
    )
    assert got == {
        "builder": "dockerTools.streamLayeredImage",
        "args": {"name": "n", "tag": "t", "maxLayers": 2},
        "imageTag": "t",
    }


@pytest.mark.parametrize(
    "file,good,bad,complaint",
    [
        ("image.nix", "nativeBuildInputs =", "nativeBuildInput =", "does not accept nativeBuildInput"),
        ("oci.nix", "exportReferencesGraph =", "exportReferenceGraph =", "does not accept exportReferenceGraph"),
        ("tree.nix", "pkgs.gnupatch", "pkgs.gnupach", "attribute 'gnupach' missing"),
        ("tp4.nix", "build-system =", "buildSystem =", "does not accept buildSystem"),
        ("runtime.nix", "dontPatchShebangs =", "dontPatchShebang =", "does not accept dontPatchShebang"),
        ("outputs.nix", "inputsFrom =", "inputFrom =", "does not accept inputFrom"),
        ("sources.nix", "dist = w.python;", 'dist = w.python; extension = "whl";', "does not accept extension"),
    ],
)
def test_a_misspelt_name_in_pkgs_fails_the_flake_evaluation(tmp_path, file, good, bad, complaint):
    copy = locked_flake_copy(REPO, tmp_path / "flake")
    path = copy / "pkgs" / file
    assert good in path.read_text()
    path.write_text(path.read_text().replace(good, bad, 1))
    proc = nix(
        [
            "eval",
            "--json",
            f"path:{copy}#checks.aarch64-linux",
            "--apply",
            "c: builtins.mapAttrs (n: d: d.drvPath) c",
            *stub_inputs(REPO, empty_flake(tmp_path / "empty")),
        ],
        tmp_path,
    )
    assert proc.returncode != 0 and complaint in proc.stderr


def test_every_accepted_name_is_in_the_spec(tmp_path):
    """Each list of api.nix names the nixpkgs file it is read from; those read from
    shared/spec/nixpkgs-api.md hold only names (and files) that the spec gives."""
    assert SPEC.exists(), f"{SPEC} is missing: the workplace lays shared/ beside the repository (as CI does)"
    api = instantiate(f"import {STUB / 'api.nix'}", tmp_path)
    spec = SPEC.read_text()
    named = set(re.findall(r"`([A-Za-z][A-Za-z0-9-]*)(?: \?[^`]*)?`", spec))
    assert all(f.startswith("pkgs/") and names for f, names in api.pop("mkDerivation").items())
    from_spec = 0
    for builder, entry in api.items():
        assert entry["file"].startswith("pkgs/") and entry["read"], builder
        if not entry["read"].startswith("nixpkgs-api.md "):
            assert re.fullmatch(r"[\w-]+/nixpkgs@[0-9a-f]{8}", entry["read"]), builder
            continue
        from_spec += 1
        assert entry["file"] in spec, f"{builder}: {entry['file']} is not in nixpkgs-api.md"
        formats = entry.get("formats", {})
        for name in entry["required"] + entry["optional"] + [n for names in formats.values() for n in names]:
            assert name in named, f"{builder}: {name} is not in nixpkgs-api.md"
        assert set(formats) <= named
    assert from_spec == 5


def nix_files() -> list[Path]:
    skip = {".git", ".venv", "node_modules"}
    return sorted(p for p in REPO.rglob("*.nix") if not skip & set(p.relative_to(REPO).parts))


def test_every_nix_file_parses(tmp_path):
    files = nix_files()
    assert REPO / "flake.nix" in files and REPO / "pkgs" / "image.nix" in files
    for path in files:
        proc = process.run(
            ["nix-instantiate", "--parse", str(path)], env={"NIX_CONFIG": nix_config(tmp_path)}, check=False
        )
        assert proc.returncode == 0, f"{path}: {proc.stderr}"


def test_builtins_only_parts_evaluate_with_nix_instantiate(tmp_path):
    """sources.nix, line.nix, transform.nix and src.nix need no nixpkgs at all."""
    got = instantiate(
        f"""
      let
        sources = import {REPO}/pkgs/sources.nix {{ manifest = {REPO}/sources.manifest; fetchurl = a: "/fetched"; }};
        line = import {REPO}/pkgs/line.nix {{ inherit (sources) rows; }};
        script = import {REPO}/pkgs/transform.nix {{ target = "b12x"; fetchArgs = [ "--input" "it's=/x" ]; }};
        src = import {REPO}/pkgs/src.nix {{ root = {REPO}; }};
      in {{
        inherit (line) base wheels trees;
        labels = line.labels "abc";
        inherit script;
        keep = map (p: src.wanted [ "python/tp4/image/sources" ] ({REPO} + ("/" + p)) "regular")
          [ "python/tp4/image/sources/fetch.py" "python/tp4/cli/build.py" "python/tp4/image/sources/__pycache__/x.pyc" ];
        dir = src.wanted [ "python/tp4/image/sources" ] ({REPO} + "/python/tp4") "directory";
      }}""",
        tmp_path,
    )
    assert got["base"] == "base-image"
    assert got["wheels"] == ["sglang-kernel", "sgl-deep-gemm"]
    assert got["labels"]["tp4.flake.rev"] == "abc"
    assert "python3 -m tp4.image.sources fetch 'b12x' --to \"$out\" --offline" in got["script"]
    assert "'--input' 'it'\\''s=/x'" in got["script"]
    assert got["keep"] == [True, False, False] and got["dir"] is True


def test_flake_lock_matches_flake_inputs(tmp_path):
    lock = json.loads((REPO / "flake.lock").read_text())
    assert lock["version"] == 7 and lock["root"] == "root"
    inputs = instantiate(f"(import {REPO}/flake.nix).inputs", tmp_path)
    assert lock["nodes"]["root"]["inputs"] == {name: name for name in inputs}
    expected = {
        "nixpkgs": (
            "NixOS",
            "nixpkgs",
            "efa487181cc01970ebb09ed193fa71dfe94784b1",
            "sha256-+wJMIlgW+BB/G7Ed5qpB/oDv3Zp3oM80ZFaZOos1qKg=",
            1786839866,
        ),
        "nixos-dgx-spark": (
            "graham33",
            "nixos-dgx-spark",
            "f1ebf94a047a16d40f3ff811961574b92d9c4e1e",
            "sha256-lL6X+0XMdQOiT1FQRrerB9ACTnr3vdv9Wpz8U0RCkS8=",
            1787054876,
        ),
    }
    assert set(inputs) == set(expected)
    for name, (owner, repo, rev, nar, modified) in expected.items():
        node = lock["nodes"][name]
        url = inputs[name]["url"]
        assert url == f"github:{owner}/{repo}/{rev}"
        assert node["locked"] == {
            "type": "github",
            "owner": owner,
            "repo": repo,
            "rev": rev,
            "narHash": nar,
            "lastModified": modified,
        }
        assert node["original"] == {"type": "github", "owner": owner, "repo": repo, "rev": rev}
        assert node.get("flake", True) == inputs[name].get("flake", True)
    assert inputs["nixos-dgx-spark"]["flake"] is False


def test_nix_reads_the_lock_file(tmp_path):
    """Nix itself accepts the lock (version 7) and the inputs it pins."""
    copy = flake_copy(REPO, tmp_path / "flake")
    proc = nix(["flake", "metadata", "--json", f"path:{copy}", "--no-write-lock-file"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    meta = json.loads(proc.stdout)
    assert meta["locks"]["nodes"]["nixpkgs"]["locked"]["rev"] == "efa487181cc01970ebb09ed193fa71dfe94784b1"
    assert shutil.which("nix")


def test_every_check_instantiates_against_the_stand_in(tmp_path):
    """The control for the misspelling test: the same evaluation, forcing every argument, passes."""
    copy = locked_flake_copy(REPO, tmp_path / "flake")
    for system in ("aarch64-linux", "x86_64-linux"):
        proc = nix(
            [
                "eval",
                "--json",
                f"path:{copy}#checks.{system}",
                "--apply",
                "c: builtins.mapAttrs (n: d: d.drvPath) c",
                *stub_inputs(REPO, empty_flake(tmp_path / "empty")),
            ],
            tmp_path,
        )
        assert proc.returncode == 0, proc.stderr
        assert all(p.endswith(".drv") for p in json.loads(proc.stdout).values())


def test_nix_flake_check_accepts_the_outputs(tmp_path):
    """`nix flake check --no-build`: every output has the shape Nix expects (packages and checks
    are derivations, apps have type and program, devShells, formatter), on both systems."""
    copy = locked_flake_copy(REPO, tmp_path / "flake")
    check = ["flake", "check", "--no-build", f"path:{copy}", *stub_inputs(REPO, empty_flake(tmp_path / "empty"))]
    # no nixosConfigurations of its own (the line's flake, from the template, holds them beside each
    # Spark's generated hardware-configuration.nix: tests/test_nixos_example.py), so a clone
    # without hardware files passes
    assert not list((copy / "examples" / "spark-line").glob("hardware"))
    proc = nix(check, tmp_path)
    assert proc.returncode == 0, proc.stderr
