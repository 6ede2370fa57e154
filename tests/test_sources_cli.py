"""`tp4 sources` as a user runs it: output, exit codes, messages (never a traceback)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from sources_helpers.build import sha256, write_tree
from sources_helpers.server import FileServer
from tp4.core import process
from tp4.image.sources import companion
from tp4.image.sources import manifest as mf
from tp4.image.sources import nar


def test_verify_passes_on_the_committed_manifest_and_reports_unlocked(tp4_cli) -> None:
    code, out, err = tp4_cli("sources", "verify")
    assert code == 0, err
    assert "25 rows checked (3 unlocked), 5 trees: ok" in out
    assert "warning: row 'dsv41' (line" in err and "unlocked (fill it in with `tp4 sources lock dsv41`)" in err
    assert "base-image" in err


def test_verify_lists_every_problem_with_exit_2(tp4_cli, tmp_path: Path) -> None:
    path = tmp_path / "m"
    path.write_text(f"a  nothex  {'b' * 64}  http://x/y\na  {'a' * 40}  short  https://x/{'a' * 40}\n")
    code, _, err = tp4_cli("sources", "verify", "--manifest", path)
    assert code == 2 and "Traceback" not in err
    assert "not 40 lowercase hex" in err and "must start with https://" in err
    assert "duplicate component" in err and "neither 64 lowercase hex" in err


def test_list_and_json(tp4_cli, repo: Path) -> None:
    code, out, _ = tp4_cli("sources", "list")
    assert code == 0 and "dsv41  " in out and "UNLOCKED" in out and "tree b12x-next: from b12x-main" in out
    code, out, _ = tp4_cli("sources", "list", "--json")
    assert json.loads(out) == mf.load(repo / "sources.manifest").to_json()


def test_fetch_refuses_unlocked_rows(tp4_cli, tmp_path: Path) -> None:
    code, _, err = tp4_cli("sources", "fetch", "dsv41-runtime", "--to", tmp_path / "o")
    assert code == 1
    assert "source row 'dsv41' (line" in err and "run `tp4 sources lock dsv41`" in err
    code, _, err = tp4_cli("sources", "fetch", "base-image", "--to", tmp_path / "o")
    assert code == 1 and "tp4 sources lock base-image" in err
    assert not (tmp_path / "o").exists()


def test_fetch_unknown_name_and_bad_input(tp4_cli, tmp_path: Path) -> None:
    code, _, err = tp4_cli("sources", "fetch", "b12x-nxt", "--to", tmp_path / "o")
    assert code == 2 and "did you mean" in err and "b12x-next" in err
    code, _, err = tp4_cli(
        "sources", "fetch", "b12x-next", "--to", tmp_path / "o", "--input", "nope=/x", "--input", "b12x-main"
    )
    assert code == 2 and "--input nope: no such row" in err and "is not COMPONENT=PATH" in err


def test_hash_prints_the_nar_hash(tp4_cli, tmp_path: Path) -> None:
    write_tree(tmp_path / "t", {"a": b"1", "x": ("x", b"2"), "l": ("l", "a"), "d": {}})
    code, out, _ = tp4_cli("sources", "hash", tmp_path / "t", "--store-path", "t")
    assert code == 0
    digest = nar.nar_sha256(tmp_path / "t")
    assert out.split() == [nar.sri(digest), nar.store_path("t", digest)]
    code, out, _ = tp4_cli("sources", "hash", "--format", "nix32", tmp_path / "t")
    assert out.strip() == nar.nix32(digest)


def test_diff(tp4_cli, tmp_path: Path, repo: Path) -> None:
    old = tmp_path / "old"
    text = (repo / "sources.manifest").read_text()
    old.write_text(
        text.replace("tree dsv41-runtime", "tree dsv41-old").replace(
            "e2d070850d50fb365a01f82f16e3f582a53e7ad1c6e3d657b50babb68814635d", "unlocked"
        )
    )
    code, out, _ = tp4_cli("sources", "diff", old)
    assert code == 0
    assert "- tree dsv41-old" in out and "+ tree dsv41-runtime" in out
    assert "~ row b12x-main\n    sha256: unlocked -> e2d07085" in out
    code, out, _ = tp4_cli("sources", "diff", repo / "sources.manifest", repo / "sources.manifest")
    assert out.strip() == "no changes"


def test_python_m_tp4_sources(tmp_path: Path, repo: Path) -> None:
    """What a Nix derivation runs: the package on PYTHONPATH, no console script."""
    write_tree(tmp_path / "t", {"a": b"1"})
    proc = process.run(
        [
            sys.executable,
            "-m",
            "tp4.image.sources",
            "hash",
            str(tmp_path / "t"),
            "--manifest",
            str(repo / "sources.manifest"),
        ],
        env={"PYTHONPATH": str(repo / "python")},
    )
    assert proc.stdout.strip() == nar.nar_hash(tmp_path / "t")
    proc = process.run(
        [sys.executable, "-m", "tp4.image.sources", "fetch", "dsv41-runtime", "--to", str(tmp_path / "o")],
        env={"PYTHONPATH": str(repo / "python"), "NIX_BUILD_TOP": str(tmp_path)},
        check=False,
    )
    assert proc.returncode == 1 and proc.stderr.startswith("error: source row 'dsv41'")


def test_transform_modules_import_nothing_heavy(repo: Path) -> None:
    code = (
        "import sys, tp4.image.sources.transforms, tp4.image.sources.nar, tp4.image.sources.manifest, tp4.image.sources.fetch; "
        "heavy = [m for m in ('requests', 'pydantic', 'git', 'urllib3') if m in sys.modules]; "
        "print(heavy)"
    )
    proc = process.run([sys.executable, "-c", code], env={"PYTHONPATH": str(repo / "python")})
    assert proc.stdout.strip() == "[]"


def test_wheel_rows_map_to_pip_flags_for_the_image(repo: Path) -> None:
    from tp4.image.sources.fetch import wheel_pip_args

    m = mf.load(repo / "sources.manifest")
    assert wheel_pip_args(m.by_name["sglang-kernel"]) == [
        "--only-binary=:all:",
        "--no-deps",
        "--python-version",
        "3.12",
        "--implementation",
        "cp",
        "--abi",
        "abi3",
        "--platform",
        "manylinux2014_aarch64",
        "sglang-kernel==0.4.7",
    ]
    assert wheel_pip_args(m.by_name["sgl-deep-gemm"])[-5:] == [
        "--abi",
        "none",
        "--platform",
        "manylinux2014_aarch64",
        "sgl-deep-gemm==0.2.0",
    ]


PREFETCH_FLAKE = r"""{
  outputs = { self }: {
    legacyPackages.@system@.nix-prefetch-docker = derivation {
      name = "nix-prefetch-docker";
      system = "@system@";
      builder = "${./bb}/bin/busybox";
      args = [ "sh" "-euc" ''
        ${./bb}/bin/busybox mkdir -p $out/bin
        ${./bb}/bin/busybox cp ${./prefetch} $out/bin/nix-prefetch-docker
      '' ];
    };
  };
}
"""


def test_lock_of_the_image_uses_the_pinned_nix_prefetch_docker(tp4_cli, tmp_path: Path, monkeypatch) -> None:
    """The base image is hashed by the flake's own nixpkgs' nix-prefetch-docker (`nix run
    --inputs-from`), not one on PATH: here a stand-in nixpkgs whose tool checks its argv."""
    from nix_env import SYSTEM, busybox_dir, nix_config

    digest = "sha256:" + "3" * 64
    nar32 = nar.nix32(bytes(range(32)))
    pkgs = tmp_path / "nixpkgs"
    busybox_dir(pkgs / "bb")
    (pkgs / "prefetch").write_text(
        f"#!{pkgs / 'bb' / 'bin' / 'sh'}\n"
        f'[ "$*" = "--json --image-name lmsysorg/sglang --image-digest {digest} --arch arm64 --os linux '
        f'--final-image-tag dev-dsv41" ] || {{ echo "bad argv: $*" >&2; exit 3; }}\n'
        f'echo \'{{"imageName": "lmsysorg/sglang", "sha256": "{nar32}"}}\'\n'
    )
    (pkgs / "prefetch").chmod(0o755)
    (pkgs / "flake.nix").write_text(PREFETCH_FLAKE.replace("@system@", SYSTEM))
    flake = tmp_path / "flake"
    flake.mkdir()
    (flake / "flake.nix").write_text(f'{{ inputs.nixpkgs.url = "path:{pkgs}"; outputs = _: {{ }}; }}\n')
    monkeypatch.setenv("NIX_CONFIG", nix_config(tmp_path / "nixcfg"))
    process.run(["nix", "flake", "lock", str(flake)])
    # a nix-prefetch-docker on PATH that must not be used
    decoy = tmp_path / "bin" / "nix-prefetch-docker"
    decoy.parent.mkdir()
    decoy.write_text('#!/bin/sh\necho \'{"sha256": "' + nar.nix32(bytes(32)) + "\"}'\n")
    decoy.chmod(0o755)
    monkeypatch.setenv("PATH", f"{decoy.parent}:{os.environ['PATH']}")
    path = flake / "sources.manifest"
    path.write_text(
        f"# the base\nbase-image  {digest}  unlocked  docker://lmsysorg/sglang:dev-dsv41@{digest}\n    arch=arm64\n"
    )
    code, out, err = tp4_cli("sources", "lock", "base-image", "--manifest", path)
    assert code == 0, err
    row = mf.load(path).by_name["base-image"]
    assert row.sha256 == bytes(range(32)).hex() and dict(row.attrs) == {"arch": "arm64"}
    assert path.read_text().startswith("# the base\n")


def test_lock_writes_through_the_manifest_link(tp4_cli, tmp_path: Path, monkeypatch) -> None:
    """The repository's sources.manifest links into the package: lock rewrites the file it points
    at and leaves the link a link."""
    real = tmp_path / "data" / "sources.manifest"
    real.parent.mkdir()
    with FileServer() as s:
        s.add(f"/example.invalid/{'a' * 40}/f", b"payload")
        monkeypatch.setenv("TP4_SOURCES_MIRROR", s.url(""))
        real.write_text(f"f  {'a' * 40}  unlocked  https://example.invalid/{'a' * 40}/f\n")
        link = tmp_path / "sources.manifest"
        link.symlink_to("data/sources.manifest")
        code, _, err = tp4_cli("sources", "lock", "f", "--manifest", link)
    assert code == 0, err
    assert link.is_symlink() and mf.load(real).by_name["f"].sha256 == sha256(b"payload")
    # the JSON copy goes beside the real file, and is its parse
    assert companion.stale(link) is None and not (tmp_path / "sources.manifest.json").exists()
    assert (tmp_path / "data" / "sources.manifest.json").is_file()


def test_json_writes_the_parse_and_check_says_when_it_is_stale(tp4_cli, tmp_path: Path) -> None:
    path = tmp_path / "sources.manifest"
    path.write_text(f"f  {'a' * 40}  {'b' * 64}  https://example.invalid/{'a' * 40}/f\n")
    twin = tmp_path / "sources.manifest.json"
    code, _, err = tp4_cli("sources", "json", "--check", "--manifest", path)
    assert code == 1 and f"{twin} does not exist; fix: run `tp4 sources json`" in err and not twin.exists()
    code, out, err = tp4_cli("sources", "json", "--manifest", path)
    assert code == 0 and out == f"wrote {twin}\n", err
    assert json.loads(twin.read_text())["rows"] == mf.load(path).to_json()["rows"]
    code, out, _ = tp4_cli("sources", "json", "--check", "--manifest", path)
    assert code == 0 and out == f"{twin}: current\n"
    path.write_text(path.read_text().replace("b" * 64, "c" * 64))
    code, _, err = tp4_cli("sources", "json", "--check", "--manifest", path)
    assert code == 1 and f"{twin} is not the parse of {path}; fix: run `tp4 sources json` and commit both" in err
    # a manifest validation refuses gets no JSON copy: Nix reads only what tp4 accepts
    before = twin.read_text()
    path.write_text(f"f  {'a' * 40}  {'b' * 64}  http://example.invalid/{'a' * 40}/f\n")
    code, _, err = tp4_cli("sources", "json", "--manifest", path)
    assert code == 2 and "must start with https://" in err and "Traceback" not in err
    assert twin.read_text() == before


def test_module_hash_fast_path_equals_the_cli(tmp_path, tp4_cli) -> None:
    import subprocess
    import sys

    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "f").write_text("x")
    os_link = tmp_path / "t" / "l"
    os_link.symlink_to("f")
    code, out, _ = tp4_cli("sources", "hash", tmp_path / "t")
    fast = subprocess.run(
        [sys.executable, "-m", "tp4.image.sources", "hash", str(tmp_path / "t")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert code == 0 and fast == out and fast.startswith("sha256-")
    missing = subprocess.run(
        [sys.executable, "-m", "tp4.image.sources", "hash", str(tmp_path / "nope")], capture_output=True, text=True
    )
    assert missing.returncode == 2 and "Traceback" not in missing.stderr


def test_manifest_paths_that_are_not_regular_files_are_refused(tp4_cli, tmp_path: Path, repo: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for bad, said in ((fifo, "not a regular file"), (tmp_path, "not a regular file"), ("", "the path is empty")):
        code, _, err = tp4_cli("sources", "list", "--manifest", bad)
        assert code == 2 and said in err and "Traceback" not in err, err
    # what Nix derivations run refuses the same way, without the CLI
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "tp4.image.sources",
            "fetch",
            "b12x",
            "--to",
            str(tmp_path / "o"),
            "--manifest",
            str(fifo),
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        env={**os.environ, "PYTHONPATH": str(repo / "python")},
    )
    assert proc.returncode == 2 and "not a regular file" in proc.stderr and not (tmp_path / "o").exists()
