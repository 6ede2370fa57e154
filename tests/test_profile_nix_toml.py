"""Profiles, presets and the adapter registry stay plain TOML that Nix 2.8's builtins.fromTOML reads
the same way tomllib does (the NixOS module reads the same files)."""

from __future__ import annotations

import json
import shutil
import subprocess
import tomllib
from pathlib import Path


from hypothesis import given, settings
from hypothesis import strategies as st

from tp4.line.profile.legacy import import_env_text
from tp4.line.profile.load import PRESETS
from tp4.line.profile.toml import dumps

NIX = shutil.which("nix-instantiate") or "nix-instantiate"  # installed by tests/run
FIXTURE = Path(__file__).parent / "fixtures" / "env.tp4.production"


def nix_from_toml(paths: list[Path]) -> list:
    expr = (
        "[ " + " ".join(f"(builtins.fromTOML (builtins.readFile {json.dumps(str(p.resolve()))}))" for p in paths) + " ]"
    )
    out = subprocess.run(
        [NIX, "--eval", "--strict", "--json", "--expr", expr],
        capture_output=True,
        text=True,
        check=True,
        env={"NIX_CONFIG": "substituters =", "PATH": "/usr/bin:/bin"},
    )
    return json.loads(out.stdout)


def test_registry_presets_and_default_profile_read_the_same_in_nix(repo):
    files = [
        repo / "adapters" / "registry.toml",
        *sorted(PRESETS.glob("*.toml")),
        repo / "python" / "tp4" / "data" / "default-profile.toml",
    ]
    assert nix_from_toml(files) == [tomllib.loads(f.read_text()) for f in files]


def test_an_imported_profile_reads_the_same_in_nix(tmp_path):
    out = tmp_path / "imported.toml"
    out.write_text(import_env_text(FIXTURE.read_text(), "fixture").toml)
    assert nix_from_toml([out]) == [tomllib.loads(out.read_text())]


scalars = st.one_of(
    st.integers(-(2**62), 2**62),
    st.booleans(),  # Nix strings cannot hold NUL; profiles refuse it
    st.text(st.characters(codec="utf-8", exclude_categories=("Cs",), exclude_characters="\x00"), max_size=20),
    # Nix prints floats with 6 significant digits; profile floats are fractions like 0.80
    st.integers(-99999, 99999).map(lambda i: i / 1000),
)
keys = st.from_regex(r"[A-Za-z_][A-Za-z0-9_-]{0,10}", fullmatch=True)
tables = st.recursive(
    st.dictionaries(keys, st.one_of(scalars, st.lists(st.integers(0, 9), max_size=3)), max_size=4),
    lambda inner: st.dictionaries(keys, inner, max_size=3),
    max_leaves=12,
)


@settings(max_examples=6, deadline=None)
@given(st.lists(tables, min_size=8, max_size=8))
def test_the_profile_writer_emits_toml_nix_reads_back_identically(tmp_path_factory, docs):
    folder = tmp_path_factory.mktemp("toml")
    paths = []
    for i, doc in enumerate(docs):
        path = folder / f"doc{i}.toml"
        path.write_text(dumps(doc))
        assert tomllib.loads(path.read_text()) == doc
        paths.append(path)
    assert nix_from_toml(paths) == [json.loads(json.dumps(d)) for d in docs]
