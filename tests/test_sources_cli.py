"""`tp4 sources` as a user runs it: output, exit codes, messages (never a traceback)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from sources_helpers.build import write_tree

from tp4 import process
from tp4.sources import manifest as mf
from tp4.sources import nar


def test_verify_passes_on_the_committed_manifest_and_reports_unlocked(tp4_cli) -> None:
    code, out, err = tp4_cli("sources", "verify")
    assert code == 0, err
    assert "24 rows checked (2 unlocked), 5 trees: ok" in out
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
    code, _, err = tp4_cli("sources", "fetch", "b12x-next", "--to", tmp_path / "o", "--input", "nope=/x",
                           "--input", "b12x-main")
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
    old.write_text(text.replace("tree dsv41-runtime", "tree dsv41-old").replace(
        "e2d070850d50fb365a01f82f16e3f582a53e7ad1c6e3d657b50babb68814635d", "unlocked"))
    code, out, _ = tp4_cli("sources", "diff", old)
    assert code == 0
    assert "- tree dsv41-old" in out and "+ tree dsv41-runtime" in out
    assert "~ row b12x-main\n    sha256: unlocked -> e2d07085" in out
    code, out, _ = tp4_cli("sources", "diff", repo / "sources.manifest", repo / "sources.manifest")
    assert out.strip() == "no changes"


def test_python_m_tp4_sources(tmp_path: Path, repo: Path) -> None:
    """What a Nix derivation runs: the package on PYTHONPATH, no console script."""
    write_tree(tmp_path / "t", {"a": b"1"})
    proc = process.run([sys.executable, "-m", "tp4.sources", "hash", str(tmp_path / "t"),
                        "--manifest", str(repo / "sources.manifest")],
                       env={"PYTHONPATH": str(repo / "python")})
    assert proc.stdout.strip() == nar.nar_hash(tmp_path / "t")
    proc = process.run([sys.executable, "-m", "tp4.sources", "fetch", "dsv41-runtime", "--to", str(tmp_path / "o")],
                       env={"PYTHONPATH": str(repo / "python"), "NIX_BUILD_TOP": str(tmp_path)}, check=False)
    assert proc.returncode == 1 and proc.stderr.startswith("error: source row 'dsv41'")


def test_transform_modules_import_nothing_heavy(repo: Path) -> None:
    code = ("import sys, tp4.sources.transforms, tp4.sources.nar, tp4.sources.manifest, tp4.sources.fetch; "
            "heavy = [m for m in ('requests', 'pydantic', 'git', 'urllib3') if m in sys.modules]; "
            "print(heavy)")
    proc = process.run([sys.executable, "-c", code], env={"PYTHONPATH": str(repo / "python")})
    assert proc.stdout.strip() == "[]"
