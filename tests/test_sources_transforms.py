"""The transforms on synthetic inputs: unpack/keep/add/rename/patch/drop/stamp, through
`tp4 sources fetch --input` (offline, as a Nix derivation runs it)."""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sources_helpers.build import b12x_next_patches, b12x_sources, sha256, tar_gz, unified_diff
from tp4.core.errors import Tp4Error
from tp4.image.sources import manifest as mf
from tp4.image.sources import nar, transforms

pytestmark = pytest.mark.unit

C40 = "0123456789abcdef0123456789abcdef01234567"
BASE = f"https://raw.githubusercontent.com/o/r/{C40}"


def row(name: str, data: bytes, path: str, *attrs: str) -> str:
    return f"{name}  {C40}  {sha256(data)}  {BASE}/{path}" + ("\n    " + " ".join(attrs) if attrs else "")


def _real_row_attrs(name: str) -> str:
    """The attribute line of a row of the shipped manifest (python/tp4/data/sources.manifest)."""
    lines = (Path(mf.__file__).parents[2] / "data" / "sources.manifest").read_text().splitlines()
    i = next(i for i, line in enumerate(lines) if line.startswith(name + "  "))
    return lines[i + 1].strip()


REAL_RING_PATCH_ATTRS = _real_row_attrs("dsv41/scripts/roce_ring-sparkring-f16b5f4.patch")


@pytest.fixture
def b12x_case(tmp_path: Path):
    """Manifest + input files for a b12x_next-like tree (archive, two patches) and a b12x-like
    tree (group of CRLF files added, a patch applied inside them)."""
    files: dict[str, bytes] = {}
    files["b12x-main"] = tar_gz(b12x_sources())
    p1, p2 = (p.encode() for p in b12x_next_patches())
    files["p/one.patch"], files["p/two.patch"] = p1, p2
    files["ring/api.py"] = b"from .x import y\r\nROCE = 'roce'\r\n"
    files["ring/x.py"] = b"y = 1\r\n"
    # upstream's patch names roce_ring/<file> (it runs from the directory holding roce_ring/);
    # the row's p= and dir= are the real manifest's
    ring_patch = unified_diff(
        "roce_ring/api.py", "from .x import y\nROCE = 'roce'\n", "from .x import y\nROCE = 'roce_ring'\n", prefix="ab"
    ).encode()
    files["p/ring.patch"] = ring_patch
    text = "\n".join(
        [
            f"b12x-main  {C40}  {sha256(files['b12x-main'])}  https://github.com/o/b12x/archive/{C40}.tar.gz  strip=1",
            row("p/one.patch", p1, "one.patch", "p=0"),
            row("p/two.patch", p2, "two.patch", "p=0"),
            row("ring/api.py", files["ring/api.py"], "api.py", "eol=lf"),
            row("ring/x.py", files["ring/x.py"], "x.py", "eol=lf"),
            row("p/ring.patch", ring_patch, "ring.patch", REAL_RING_PATCH_ATTRS),
            "tree b12x-next  from=b12x-main  require=b12x,LICENSE  keep=b12x,LICENSE  rename=b12x:b12x_next",
            "    patches=p/one.patch,p/two.patch  drop=b12x_next/sequence/engram  stamp=b12x_next",
            f"    expect-patch={hashlib.sha256(p1 + p2).hexdigest()[:16]}",
            "tree b12x  from=b12x-main  keep=b12x,LICENSE  add=ring/*:b12x/comm/roce_ring/  patches=p/ring.patch",
            "",
        ]
    )
    manifest = tmp_path / "sources.manifest"
    manifest.write_text(text)
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    args = []
    for name, data in files.items():
        path = inputs / name.replace("/", "_")
        path.write_bytes(data)
        args += ["--input", f"{name}={path}"]
    return manifest, args, files


def test_b12x_next_tree(tmp_path: Path, tp4_cli, b12x_case) -> None:
    manifest, args, files = b12x_case
    out = tmp_path / "out"
    code, stdout, err = tp4_cli("sources", "fetch", "b12x-next", "--to", out, "--manifest", manifest, *args)
    assert code == 0, err
    top = sorted(p.name for p in out.iterdir())
    assert top == ["LICENSE", "b12x_next"]
    pkg = out / "b12x_next"
    init = (pkg / "__init__.py").read_text()
    assert "from b12x_next.comm import roce" in init
    assert "from b12x_next import kernels as b12x_kernels" in init
    assert "b12x-source" in init  # followed by '-': left alone
    assert '"B12X_NEXT_CACHE_DIR"' in init and '"B12X_NEXT_KNOB"' in init and "B12X_NEXT_NEXT" not in init
    assert 'NAME = "b12x_next"' in init
    assert "#define B12X_NEXT_TILE 64" in (pkg / "kernels/tile.c").read_text()
    assert "static int b12x_tile(void)" in (pkg / "kernels/tile.c").read_text()
    assert "b12x in a txt file" in (pkg / "docs/notes.txt").read_text()
    assert "tiles.insert(0, 32)" in (pkg / "moe/plan.py").read_text()
    assert "columns=None" in (pkg / "comm/__init__.py").read_text()
    assert not (pkg / "sequence" / "engram").exists() and not (pkg / "__pycache__").exists()
    assert (pkg / "SOURCE_COMMIT").read_text() == C40 + "\n"
    expected = hashlib.sha256(files["p/one.patch"] + files["p/two.patch"]).hexdigest()[:16]
    assert (pkg / "SOURCE_PATCH").read_text() == expected + "\n"
    assert f"SOURCE_PATCH {expected}" in stdout
    assert f"{out} {nar.nar_hash(out)}" in stdout
    assert not any(p.name.endswith((".orig", ".rej")) for p in out.rglob("*"))
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_b12x_tree_with_group_and_crlf(tmp_path: Path, tp4_cli, b12x_case) -> None:
    manifest, args, _ = b12x_case
    out = tmp_path / "out"
    code, _, err = tp4_cli("sources", "fetch", "b12x", "--to", out, "--manifest", manifest, *args)
    assert code == 0, err
    ring = out / "b12x" / "comm" / "roce_ring"
    assert (ring / "api.py").read_bytes() == b"from .x import y\nROCE = 'roce_ring'\n"
    assert (ring / "x.py").read_bytes() == b"y = 1\n"
    assert "import b12x" in (out / "b12x" / "comm" / "__init__.py").read_text()


def test_same_inputs_same_tree_hash(tmp_path: Path, tp4_cli, b12x_case) -> None:
    manifest, args, _ = b12x_case
    hashes = []
    for n in range(2):
        out = tmp_path / f"out{n}"
        assert tp4_cli("sources", "fetch", "b12x-next", "--to", out, "--manifest", manifest, *args)[0] == 0
        hashes.append(nar.nar_hash(out))
    assert hashes[0] == hashes[1]


def test_wrong_input_bytes_are_refused(tmp_path: Path, tp4_cli, b12x_case) -> None:
    manifest, args, _ = b12x_case
    evil = tmp_path / "evil.patch"
    evil.write_text("--- x\n+++ x\n")
    args = [a if not a.startswith("p/one.patch=") else f"p/one.patch={evil}" for a in args]
    code, _, err = tp4_cli("sources", "fetch", "b12x-next", "--to", tmp_path / "out", "--manifest", manifest, *args)
    assert code == 1 and "does not match the pin" in err and "p/one.patch" in err
    assert not (tmp_path / "out").exists()


def test_missing_input_offline_is_refused(tmp_path: Path, tp4_cli, b12x_case) -> None:
    manifest, args, _ = b12x_case
    code, _, err = tp4_cli(
        "sources", "fetch", "b12x-next", "--to", tmp_path / "out", "--manifest", manifest, "--offline", *args[:2]
    )
    assert code == 1 and "no --input" in err


def test_expect_patch_mismatch_fails_and_leaves_nothing(tmp_path: Path, tp4_cli, b12x_case) -> None:
    manifest, args, _ = b12x_case
    manifest.write_text(re.sub(r"expect-patch=\w+", "expect-patch=0000000000000000", manifest.read_text()))
    code, _, err = tp4_cli("sources", "fetch", "b12x-next", "--to", tmp_path / "out", "--manifest", manifest, *args)
    assert code == 1 and "SOURCE_PATCH is" in err
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.*"))


def test_rejected_hunk_fails(tmp_path: Path) -> None:
    (tmp_path / "f.py").write_text("a\nb\nc\n")
    patch = tmp_path / "p.patch"
    patch.write_text(unified_diff("f.py", "a\nX\nc\n", "a\nY\nc\n"))
    with pytest.raises(Tp4Error, match="did not apply cleanly"):
        transforms.apply_patch(tmp_path, patch, strip=0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.py", "p.patch"]


def test_fuzz_beyond_the_row_fails_and_within_passes(tmp_path: Path) -> None:
    before = "".join(f"line {i}\n" for i in range(20))
    after = before.replace("line 10\n", "line ten\n")
    patch = tmp_path / "p.patch"
    patch.write_text(unified_diff("f.py", before, after))
    drifted = before.replace("line 7\n", "line seven\n")  # a context line changed
    (tmp_path / "f.py").write_text(drifted)
    with pytest.raises(Tp4Error):
        transforms.apply_patch(tmp_path, patch, strip=0, fuzz=0)
    out = transforms.apply_patch(tmp_path, patch, strip=0, fuzz=2)
    assert "fuzz" in out and "line ten" in (tmp_path / "f.py").read_text()


def test_already_applied_patch_fails(tmp_path: Path) -> None:
    (tmp_path / "f.py").write_text("a\nY\nc\n")
    patch = tmp_path / "p.patch"
    patch.write_text(unified_diff("f.py", "a\nX\nc\n", "a\nY\nc\n"))
    with pytest.raises(Tp4Error):
        transforms.apply_patch(tmp_path, patch, strip=0)


def test_unrenamed_reference_left_by_a_patch_fails(tmp_path: Path, tp4_cli, b12x_case) -> None:
    manifest, args, files = b12x_case
    bad = unified_diff("b12x_next/moe/plan.py", "def plan(n):\n", "import b12x\ndef plan(n):\n").encode()
    path = tmp_path / "bad.patch"
    path.write_bytes(bad)
    text = manifest.read_text().replace(sha256(files["p/two.patch"]), sha256(bad))
    manifest.write_text(re.sub(r"\n    expect-patch=\w+", "", text))
    args = [a if not a.startswith("p/two.patch=") else f"p/two.patch={path}" for a in args]
    code, _, err = tp4_cli("sources", "fetch", "b12x-next", "--to", tmp_path / "out", "--manifest", manifest, *args)
    assert code == 1 and "unrenamed references to b12x remain" in err and "plan.py:1" in err


def test_keep_require_drop_and_strip(tmp_path: Path) -> None:
    archive = tmp_path / "a.tar.gz"
    archive.write_bytes(
        tar_gz(
            {
                "top/python/sglang/__init__.py": "x",
                "top/docs/a.md": "d",
                "top/README": "r",
                "top/python/bin/run": "#!/bin/sh\n",
            },
            modes={"top/python/bin/run": 0o755},
            symlinks={"top/python/link": "sglang/__init__.py"},
        )
    )
    work = tmp_path / "w"
    transforms.unpack_archive(archive, work, strip=1)
    transforms.keep(work, ["python"], "t")
    assert sorted(p.name for p in work.iterdir()) == ["python"]
    assert os.access(work / "python/bin/run", os.X_OK) and (work / "python/link").is_symlink()
    transforms.drop(work, ["python/bin"])
    assert not (work / "python/bin").exists()
    with pytest.raises(Tp4Error, match="lacks"):
        transforms.require(work, ["python/nope"], "t")
    with pytest.raises(Tp4Error, match="leaves the tree"):
        transforms.drop(work, ["../x"])


def test_archive_escaping_the_tree_is_refused(tmp_path: Path) -> None:
    archive = tmp_path / "evil.tar.gz"
    archive.write_bytes(tar_gz({"top/ok": "x"}, symlinks={"top/link": "/etc/passwd"}))
    with pytest.raises(Tp4Error, match="cannot unpack"):
        transforms.unpack_archive(archive, tmp_path / "w", strip=1)
    with pytest.raises(Tp4Error, match="strip=2"):
        transforms.unpack_archive(tmp_path / "evil.tar.gz", tmp_path / "w2", strip=2)


def test_patch_id_is_sha256_prefix_of_the_concatenation() -> None:
    assert transforms.patch_id([b"ab", b"c"]) == hashlib.sha256(b"abc").hexdigest()[:16]


ident = st.text("abcxyzB12X_-.0123 \n()=\"'", max_size=60)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.one_of(ident, st.sampled_from(["b12x", "B12X_", "b12x-", "b12x_next", "B12X_NEXT_", "xb12x"])), max_size=12
    )
)
def test_rename_is_idempotent_and_complete(parts: list[str]) -> None:
    text = "".join(parts).encode()
    once = transforms.rename_text(text, "b12x", "b12x_next")
    assert transforms.rename_text(once, "b12x", "b12x_next") == once
    assert not re.search(rb"\bb12x\b(?!-)", once)
    assert not re.search(rb"\bB12X_(?!NEXT_)", once)
    # only renames: removing the inserted text gives the input back
    assert once.replace(b"b12x_next", b"b12x").replace(b"B12X_NEXT_", b"B12X_") == text.replace(
        b"b12x_next", b"b12x"
    ).replace(b"B12X_NEXT_", b"B12X_")


@pytest.mark.parametrize(
    ("before", "after"),
    [
        ("import b12x", "import b12x_next"),
        ("from b12x.comm import x", "from b12x_next.comm import x"),
        ("b12x-source.tar.gz", "b12x-source.tar.gz"),
        ("b12x_kernels", "b12x_kernels"),
        ("xb12x", "xb12x"),
        ("b12xy", "b12xy"),
        ("'b12x'", "'b12x_next'"),
        ("B12X_ROCE_HCA", "B12X_NEXT_ROCE_HCA"),
        ("B12X_NEXT_ROCE_HCA", "B12X_NEXT_ROCE_HCA"),
        ("MY_B12X_X", "MY_B12X_X"),
        ("_B12X_TIMING", "_B12X_TIMING"),
        ("VLLM_B12X_TIMING", "VLLM_B12X_TIMING"),
        ("os.environ['B12X_TIMING']", "os.environ['B12X_NEXT_TIMING']"),
        ("b12x_next", "b12x_next"),
    ],
)
def test_rename_word_boundaries(before: str, after: str) -> None:
    assert transforms.rename_text(before.encode(), "b12x", "b12x_next").decode() == after


def test_rename_only_touches_source_files(tmp_path: Path) -> None:
    (tmp_path / "b12x").mkdir()
    for name in ("a.py", "a.c", "a.cpp", "a.h", "a.txt", "a.cu"):
        (tmp_path / "b12x" / name).write_text("b12x\n")
    transforms.rename_package(tmp_path, "b12x", "b12x_next")
    got = {p.name: p.read_text() for p in (tmp_path / "b12x_next").iterdir()}
    assert got == {
        "a.py": "b12x_next\n",
        "a.c": "b12x_next\n",
        "a.cpp": "b12x_next\n",
        "a.h": "b12x_next\n",
        "a.txt": "b12x\n",
        "a.cu": "b12x\n",
    }


def test_inputs_of_a_tree(b12x_case) -> None:
    manifest, _, _ = b12x_case
    m = mf.load(manifest)
    assert [r.name for r in m.inputs("b12x")] == ["b12x-main", "ring/api.py", "ring/x.py", "p/ring.patch"]


def test_patch_leaving_the_tree_fails(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    patch = tmp_path / "p.patch"
    patch.write_text("--- ../evil.py\n+++ ../evil.py\n@@ -0,0 +1 @@\n+x = 1\n")
    with pytest.raises(Tp4Error, match="outside the tree|did not apply"):
        transforms.apply_patch(tmp_path / "in", patch, strip=0)
    assert not (tmp_path / "evil.py").exists()


def test_fetch_refuses_a_non_empty_destination_before_any_work(tmp_path: Path, tp4_cli, b12x_case) -> None:
    manifest, args, _ = b12x_case
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep").write_text("mine")
    code, _, err = tp4_cli("sources", "fetch", "b12x-next", "--to", tmp_path / "out", "--manifest", manifest, *args)
    assert code == 1 and "not an empty directory" in err and (tmp_path / "out" / "keep").read_text() == "mine"


PYNCCL = "python/sglang/srt/distributed/device_communicators/pynccl.py"


def _line_case(tmp_path: Path, script: bytes, *script_attrs: str):
    """An sglang-line-like tree laid out as upstream's (python/sglang/srt/distributed/...), one
    patch, then a pinned adaptation script (with the row's attributes)."""
    archive = tar_gz({f"top/{PYNCCL}": "WORLD = 8\nENV = 'SGLANG8_ROCE_ALLREDUCE'\n", "top/docs/x": "d"})
    patch = unified_diff(
        PYNCCL,
        "WORLD = 8\nENV = 'SGLANG8_ROCE_ALLREDUCE'\n",
        "WORLD = 8\nENV = 'SGLANG8_ROCE_ALLREDUCE'\nROCE = True\n",
        prefix="ab",
    ).encode()
    files = {"src": archive, "p/overlay.patch": patch, "p/adapt.py": script}
    manifest = tmp_path / "m"
    manifest.write_text(
        "\n".join(
            [
                f"src  {C40}  {sha256(archive)}  https://github.com/o/s/archive/{C40}.tar.gz  strip=1",
                row("p/overlay.patch", patch, "overlay.patch", "p=1"),
                row("p/adapt.py", script, "adapt.py", *script_attrs),
                "tree line  from=src  keep=python  patches=p/overlay.patch  run=p/adapt.py",
                "",
            ]
        )
    )
    args = []
    for name, data in files.items():
        path = tmp_path / name.replace("/", "_")
        path.write_bytes(data)
        args += ["--input", f"{name}={path}"]
    return manifest, args


ADAPT = b"""import pathlib
p = pathlib.Path('python/sglang/srt/distributed/device_communicators/pynccl.py')
text = p.read_text()
assert text.count('WORLD = 8') == 1, 'anchor drifted'
p.write_text(text.replace('WORLD = 8', 'WORLD = (4, 8)'))
"""


def test_run_step_adapts_the_patched_tree(tmp_path: Path, tp4_cli) -> None:
    manifest, args = _line_case(tmp_path, ADAPT)
    code, _, err = tp4_cli("sources", "fetch", "line", "--to", tmp_path / "out", "--manifest", manifest, *args)
    assert code == 0, err
    text = (tmp_path / "out" / PYNCCL).read_text()
    assert text == "WORLD = (4, 8)\nENV = 'SGLANG8_ROCE_ALLREDUCE'\nROCE = True\n"
    assert mf.load(manifest).inputs("line")[-1].name == "p/adapt.py"


# as upstream's roce_tp4_adapt.py does (K a7ca3117 line 5): the file by its absolute path in the image
ABSOLUTE = b"""import pathlib
P = '/sgl-workspace/sglang/python/sglang/srt/distributed/device_communicators/pynccl.py'
p = pathlib.Path(P)
text = p.read_text()
assert text.count('WORLD = 8') == 1, 'anchor drifted'
p.write_text(text.replace('WORLD = 8', 'WORLD = (4, 8)'))
"""


def test_run_step_with_the_images_absolute_root_adapts_the_tree(tmp_path: Path, tp4_cli) -> None:
    """The row's root= (the shipped manifest's, for roce_tp4_adapt.py) points the script's absolute
    paths at the tree; without it the script finds no /sgl-workspace and the tree fails."""
    shipped = mf.load(Path(mf.__file__).parents[2] / "data" / "sources.manifest")
    root = shipped.row("dsv41/runtime/roce_tp4_adapt.py").attrs["root"]
    assert root == "/sgl-workspace/sglang"
    manifest, args = _line_case(tmp_path, ABSOLUTE, f"root={root}")
    code, _, err = tp4_cli("sources", "fetch", "line", "--to", tmp_path / "out", "--manifest", manifest, *args)
    assert code == 0, err
    assert (tmp_path / "out" / PYNCCL).read_text() == "WORLD = (4, 8)\nENV = 'SGLANG8_ROCE_ALLREDUCE'\nROCE = True\n"
    assert not list((tmp_path / "out").rglob("adapt.py"))  # the rooted copy ran outside the tree
    (tmp_path / "bare").mkdir()
    bare, args = _line_case(tmp_path / "bare", ABSOLUTE)
    code, _, err = tp4_cli("sources", "fetch", "line", "--to", tmp_path / "bare-out", "--manifest", bare, *args)
    assert code == 1 and "FileNotFoundError" in err and "/sgl-workspace/sglang" in err


def test_a_root_the_script_never_names_is_refused(tmp_path: Path, tp4_cli) -> None:
    manifest, args = _line_case(tmp_path, ADAPT, "root=/sgl-workspace/sglang")
    code, _, err = tp4_cli("sources", "fetch", "line", "--to", tmp_path / "out", "--manifest", manifest, *args)
    assert code == 1 and "names no path under root=/sgl-workspace/sglang" in err
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_root_rewrites_whole_path_components_only(tmp_path: Path) -> None:
    work = tmp_path / "tree"
    work.mkdir()
    data = b"a = '/sgl-workspace/sglang/python'\nb = '/sgl-workspace/sglang2/x'\nc = \"/sgl-workspace/sglang\"\n"
    out = transforms.rooted_script(data, "/sgl-workspace/sglang", work, name="s")
    assert out == (f"a = '{work}/python'\nb = '/sgl-workspace/sglang2/x'\nc = \"{work}\"\n").encode()


@pytest.mark.parametrize(
    "script,needle",
    [
        (b"raise SystemExit('anchor drifted')\n", "anchor drifted"),
        (b"pass\n", "changed nothing"),
    ],
)
def test_run_step_that_fails_or_does_nothing_fails_the_tree(tmp_path: Path, tp4_cli, script, needle) -> None:
    manifest, args = _line_case(tmp_path, script)
    code, _, err = tp4_cli("sources", "fetch", "line", "--to", tmp_path / "out", "--manifest", manifest, *args)
    assert code != 0 and needle in err
    assert not (tmp_path / "out").exists()
