"""Hypothesis strategies for manifests: rows and trees, and a random layout of them as text
(continuation lines, comments, blank lines, tabs) that must parse back to the same entries."""

from __future__ import annotations

from hypothesis import strategies as st
from tp4.image.sources.manifest import Manifest, Row, Tree

HEX = "0123456789abcdef"
hex40 = st.text(HEX, min_size=40, max_size=40)
hex64 = st.text(HEX, min_size=64, max_size=64)
word = st.text("abcdefghijklmnopqrstuvwxyz0123456789", min_size=1, max_size=8)
component = st.builds(
    lambda a, rest: a + rest,
    st.sampled_from("abcdefghijklmnopqrstuvwxyzABC0123"),
    st.text("abcdefghijklmnopqrstuvwxyz0123456789._+/-", max_size=16),
).filter(lambda c: c not in ("tree", "local"))
attr_key = st.builds(
    lambda a, rest: a + rest,
    st.sampled_from("abcdefghijklmnopqrstuvwxyz"),
    st.text("abcdefghijklmnopqrstuvwxyz0123456789-", max_size=8),
)
attr_value = st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=20)
attrs = st.dictionaries(attr_key, attr_value, max_size=4)


@st.composite
def rows(draw) -> Row:
    commit = draw(hex40)
    form = draw(st.sampled_from(["archive", "raw", "patch", "wheel", "image", "git", "local", "other"]))
    name = draw(component)
    sha = draw(st.one_of(hex64, st.just("unlocked")))
    if form == "archive":
        url = f"https://github.com/{draw(word)}/{draw(word)}/archive/{commit}.tar.gz"
    elif form == "raw":
        url = f"https://raw.githubusercontent.com/{draw(word)}/{draw(word)}/{commit}/{draw(word)}/{draw(word)}.py"
    elif form == "patch":
        url = f"https://raw.githubusercontent.com/o/r/{commit}/scripts/{draw(word)}.patch?x=1"
    elif form == "wheel":
        commit = draw(st.sampled_from(["0.4.7", "1.0", "2.0.0rc1"]))
        url = f"pypi:{draw(word)}-{commit}-cp310-abi3-manylinux2014_aarch64.whl"
    elif form == "image":
        commit = "sha256:" + draw(hex64)
        url = f"docker://{draw(word)}/{draw(word)}:{draw(word)}@{commit}"
    elif form == "git":
        url = f"git+https://example.invalid/{draw(word)}.git@{commit}"
    elif form == "local":
        return Row("local", f"{draw(word)}/{draw(word)}.patch", sha, "-")
    else:
        url = f"https://example.invalid/{draw(word)}/{commit}"
    return Row(name, commit, sha, url, attrs=draw(attrs))


@st.composite
def trees(draw) -> Tree:
    return Tree(draw(component), attrs=draw(attrs))


@st.composite
def manifests(draw) -> Manifest:
    row_list = draw(st.lists(rows(), max_size=8, unique_by=lambda r: r.name))
    tree_list = draw(st.lists(trees(), max_size=3, unique_by=lambda t: t.name))
    return Manifest(tuple(row_list), tuple(tree_list))


blank = st.sampled_from([" ", "  ", "\t", " \t "])
comment = st.sampled_from(["# a comment", "#", "   # indented comment", "#tree x from=y", ""])


@st.composite
def layouts(draw, manifest: Manifest) -> str:
    """Text for ``manifest`` with random separators, continuation lines and comments."""
    out: list[str] = []
    entries = [(r.component, r.commit, r.sha256, r.url, r.attrs) for r in manifest.rows]
    entries += [("tree", t.name, None, None, t.attrs) for t in manifest.trees]
    for head_a, head_b, sha, url, extra in entries:
        if draw(st.booleans()):
            out.append(draw(comment))
        head = [head_a, head_b] + ([sha, url] if sha is not None else [])
        tokens = [f"{k}={v}" for k, v in extra.items()]
        split = draw(st.integers(0, len(tokens)))
        line = head + tokens[:split]
        out.append(draw(blank).join(line) + draw(st.sampled_from(["", " ", "\t", "\r"])))
        rest = tokens[split:]
        while rest:
            take = draw(st.integers(1, len(rest)))
            if draw(st.booleans()):
                out.append(draw(comment))
            out.append(draw(blank) + draw(blank).join(rest[:take]))
            rest = rest[take:]
    return "\n".join(out) + draw(st.sampled_from(["", "\n", "\n\n"]))
