"""sources.manifest: the committed file, upstream compatibility, validation, round trips."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sources_helpers.strategies import layouts, manifests
from tp4.core.errors import InvalidInput
from tp4.image.sources import companion
from tp4.image.sources import manifest as mf

UPSTREAM = Path(__file__).resolve().parents[2] / "shared" / "spec" / "upstream-sources.manifest"
UPSTREAM_TEXT = """\
# upstream-format rows (four columns, `local` rows), as in MiaAI-Lab's runtime/sources.manifest
sglang-canary  f80c91a4b97e52e17fbcff088aa6b47b6270f6b9  9968fcff7fa8218b8246a4553d72933b08f4846550e7c5b6a891bdc3bdc881a8  https://github.com/sgl-project/sglang/archive/f80c91a4b97e52e17fbcff088aa6b47b6270f6b9.tar.gz
b12x-main  a7d7d29b2ef8869086e0ceaa787321f17544e3c9  e2d070850d50fb365a01f82f16e3f582a53e7ad1c6e3d657b50babb68814635d  https://github.com/local-inference-lab/b12x/archive/a7d7d29b2ef8869086e0ceaa787321f17544e3c9.tar.gz
local  runtime/sglang-rocenante.patch  e813f97a87539681a5951f055b4d0b78f14630437f7c0adaa7e012f7adc5c704  -
local  scripts/b12x_next-barrier-zero.patch  dbec8235975450bf2963bf31e4949b369016fc3f93890ac4d7fe470ad02a4b60  -
"""


@pytest.fixture(scope="module")
def committed(repo: Path) -> mf.Manifest:
    return mf.load(repo / "sources.manifest")


def upstream_text() -> str:
    return UPSTREAM.read_text() if UPSTREAM.exists() else UPSTREAM_TEXT


def test_committed_manifest_verifies(committed: mf.Manifest) -> None:
    report = mf.validate(committed)
    assert report.errors == []
    unlocked = {r.name for r in committed.rows if not r.locked}
    assert unlocked == {"dsv41", "dsv41/runtime/roce_tp4_adapt.py", "base-image"}
    assert all("unlocked" in w for w in report.warnings) and len(report.warnings) == 3


def test_every_upstream_pin_is_present(committed: mf.Manifest) -> None:
    upstream = mf.parse(upstream_text())
    ours = committed.by_name
    for row in upstream.rows:
        if row.component == "local":
            mine = ours[f"dsv41/{row.commit}"]
            assert mine.sha256 == row.sha256 and mine.commit == "519a39884ac9ec017c6a361ad1ba97f5d9203d21"
            assert mine.url.endswith(f"/519a39884ac9ec017c6a361ad1ba97f5d9203d21/{row.commit}")
        else:
            mine = ours[row.component]
            assert (mine.commit, mine.sha256, mine.url) == (row.commit, row.sha256, row.url)
    assert len([r for r in upstream.rows if r.component.startswith("roce-ring/")]) == 9


def test_committed_manifest_covers_the_image(committed: mf.Manifest) -> None:
    rows = committed.by_name
    image = rows["base-image"]
    assert (
        image.kind == "image"
        and image.image()
        == {
            "name": "lmsysorg/sglang",
            "tag": "dev-dsv41",
            "digest": "sha256:3dbc313030a6ef2c5d7de8ecf48e9aece722694a82182cb618cc82b588816349",
        }
        and image.attrs["arch"] == "arm64"
    )
    assert rows["sglang-kernel"].wheel() == {
        "pname": "sglang_kernel",
        "version": "0.4.7",
        "python": "cp310",
        "abi": "abi3",
        "platform": "manylinux2014_aarch64",
    }
    assert rows["sgl-deep-gemm"].wheel()["version"] == "0.2.0"
    assert rows["dsv41"].commit == "519a39884ac9ec017c6a361ad1ba97f5d9203d21"
    trees = committed.tree_by_name
    assert set(trees) >= {"sglang-python", "sglang-line", "b12x", "b12x-next", "dsv41-runtime"}
    assert trees["b12x-next"].patches == [
        f"dsv41/scripts/b12x_next-{p}.patch"
        for p in ("compact-n64-m64", "prequant-input", "barrier-zero", "det-triton-planner")
    ]
    assert trees["b12x-next"].attrs["expect-patch"] == "da662ccc7e2372b5"
    assert len(committed.inputs("b12x")) == 12


def test_the_json_copy_nix_reads_is_current(repo: Path) -> None:
    """pkgs/sources.nix reads sources.manifest.json, never the manifest's grammar: it must be the
    parse of the committed manifest (fix: `tp4 sources json`, then commit both files)."""
    why = companion.stale(repo / "sources.manifest")
    assert why is None, why
    link = repo / "sources.manifest.json"
    assert link.is_symlink() and link.resolve() == companion.path_of(repo / "sources.manifest")


def test_the_parse_carries_what_nix_would_otherwise_derive() -> None:
    digest = "sha256:" + "3" * 64
    m = mf.parse(
        f"w  0.4.7  unlocked  pypi:sglang_kernel-0.4.7-cp310-abi3-manylinux2014_aarch64.whl\n"
        f"img  {digest}  unlocked  docker://lmsysorg/sglang@{digest}\n"
        f"img2  {digest}  unlocked  docker://lmsysorg/sglang:t@{digest}\n  arch=amd64\n"
        f"g  {'a' * 40}  unlocked  git+https://example.invalid/o/r.git@{'a' * 40}\n"
        "bad  1  unlocked  pypi:not-a-wheel.zip\n"
        f"a  {'a' * 40}  unlocked  https://example.invalid/{'a' * 40}/x.tar.gz?raw=1\n"
        f"tree t  from=a  add=w:x/\n"
    )
    rows = {r["name"]: r for r in m.to_json()["rows"]}
    assert rows["w"]["wheel"] == {
        "pname": "sglang_kernel",
        "version": "0.4.7",
        "python": "cp310",
        "abi": "abi3",
        "platform": "manylinux2014_aarch64",
    }
    assert rows["w"]["file_name"] == "sglang_kernel-0.4.7-cp310-abi3-manylinux2014_aarch64.whl"
    assert rows["img"]["image"] == {"name": "lmsysorg/sglang", "tag": "latest", "digest": digest, "arch": "arm64"}
    assert rows["img2"]["image"]["arch"] == "amd64" and rows["img2"]["image"]["tag"] == "t"
    assert rows["g"]["git"] == {"url": "https://example.invalid/o/r.git", "rev": "a" * 40}
    assert rows["bad"]["kind"] == "wheel" and rows["bad"]["wheel"] is None  # validation says why
    assert rows["a"]["file_name"] == "x.tar.gz" and rows["a"]["wheel"] is rows["a"]["image"] is rows["a"]["git"] is None
    assert m.to_json()["trees"] == [
        {"name": "t", "attrs": {"from": "a", "add": "w:x/"}, "line": 8, "inputs": ["w", "a"]}
    ]


def test_no_registry_host_in_the_repository(repo: Path) -> None:
    hosts = ("pypi" + ".org", "pythonhosted" + ".org", "deb.debian" + ".org", "registry.npmjs" + ".org")
    mine = [
        repo / "sources.manifest",
        repo / "pkgs" / "sources.nix",
        repo / "docs" / "sources.md",
        *(repo / "python" / "tp4" / "image" / "sources").glob("*.py"),
        repo / "python" / "tp4" / "cli" / "sources.py",
        *(repo / "tests").glob("test_sources_*.py"),
        *(repo / "tests" / "sources_helpers").glob("*.py"),
    ]
    assert len([p for p in mine if p.suffix == ".py" and "image" in p.parts]) > 5, (
        "the sources package moved: fix the paths"
    )
    for path in mine:
        if path.exists():
            text = path.read_text()
            assert not any(h in text for h in hosts), path


def test_upstream_manifest_reads_as_is() -> None:
    m = mf.parse(upstream_text())
    assert mf.validate(m).errors == []
    local = [r for r in m.rows if r.component == "local"]
    assert local and all(r.kind == "local" and r.name == f"local:{r.commit}" for r in local)
    assert m.by_name["sglang-canary"].kind == "archive"


def bad(text: str) -> list[str]:
    return mf.validate(mf.parse(text)).errors


GOOD = "x  " + "a" * 40 + "  " + "b" * 64 + "  https://github.com/o/r/archive/" + "a" * 40 + ".tar.gz"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (GOOD.replace("a" * 40, "A" * 40, 1), "not 40 lowercase hex"),
        (GOOD.replace("b" * 64, "b" * 63), "neither 64 lowercase hex"),
        (
            GOOD.replace("https://github.com/o/r/archive/" + "a" * 40, "https://github.com/o/r/archive/main"),
            "does not name the commit",
        ),
        (GOOD.replace("https://", "http://"), "must start with https://"),
        (GOOD + "\n" + GOOD, "duplicate component"),
        (GOOD + " strip=x", "not a non-negative integer"),
        (GOOD + " colour=blue", "unknown attribute 'colour'"),
        (GOOD + "\ntree x from=x", "already used"),
        (GOOD + "\ntree t from=nope", "names no row"),
        (GOOD + "\ntree t from=x keep=../etc", "not relative"),
        (GOOD + "\ntree t from=x patches=x", "not a patch"),
        (GOOD + "\ntree t from=x add=x:y", "not a file"),
        (GOOD + "\ntree t from=x add=g/*:d/", "no row's component starts with"),
        (GOOD + "\ntree t from=x expect-patch=zz", "16 hex"),
        (
            "p  "
            + "a" * 40
            + "  "
            + "b" * 64
            + "  https://e.invalid/"
            + "a" * 40
            + "/x.patch\n"
            + GOOD
            + "\ntree t from=x",
            "in no tree's patches= list",
        ),
        ("w  1.0  " + "b" * 64 + "  pypi:w-2.0-py3-none-any.whl", "must equal the wheel's version"),
        (
            "i  sha256:" + "c" * 64 + "  " + "b" * 64 + "  docker://a/b@sha256:" + "d" * 64,
            "must equal the URL's digest",
        ),
        ("g  " + "a" * 40 + "  " + "b" * 64 + "  git+https://e.invalid/r.git", "names its commit"),
    ],
)
def test_bad_rows_are_named(text: str, message: str) -> None:
    errors = bad(text)
    assert any(message in e for e in errors), errors


def test_unlocked_branch_row_is_a_warning_not_an_error() -> None:
    m = mf.parse("x  dsv4.1  unlocked  https://github.com/o/r/archive/dsv4.1.tar.gz")
    report = mf.validate(m)
    assert report.errors == [] and "tp4 sources lock x" in report.warnings[0]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("  x y z w", "continuation line"),
        ("x y z", "four columns"),
        (GOOD + " notkeyvalue", "is not key=value"),
        (GOOD + " strip=1\n    strip=2", "given twice"),
        ("tree", "needs a name"),
    ],
)
def test_syntax_errors(text: str, message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        mf.parse(text)


def test_continuations_comments_and_line_numbers() -> None:
    text = "# head\n\n" + GOOD + "\n  # between\n\n\t strip=1\n    kind=archive\ntree t  from=x\n  keep=a,b\n"
    m = mf.parse(text)
    (row,) = m.rows
    assert dict(row.attrs) == {"strip": "1", "kind": "archive"} and (row.line, row.end_line) == (3, 7)
    assert m.trees[0].attrs == {"from": "x", "keep": "a,b"} and m.trees[0].line == 8


def test_replace_rows_keeps_everything_else(committed: mf.Manifest) -> None:
    row = committed.by_name["dsv41"]
    new = mf.Row(row.component, row.commit, "f" * 64, row.url, attrs={"strip": "1"})
    text = mf.replace_rows(committed, {"dsv41": new})
    again = mf.parse(text)
    assert again.by_name["dsv41"].sha256 == "f" * 64
    assert [r for r in again.rows if r.name != "dsv41"] == [r for r in committed.rows if r.name != "dsv41"]
    assert again.trees == committed.trees
    assert text.count("\n#") == committed.text.count("\n#")


@settings(max_examples=200, deadline=None)
@given(manifests())
def test_render_parse_round_trip(m: mf.Manifest) -> None:
    again = mf.parse(m.render())
    assert again == m
    assert again.render() == m.render()


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_any_layout_parses_to_the_same_entries(data) -> None:
    m = data.draw(manifests())
    assert mf.parse(data.draw(layouts(m))) == m
