"""tp4.image.oci, the steps that make the line's image an OCI layout of per-layer store paths: the
tars they write, the reference graphs they read, the base archive they split, the layout they
assemble, and the errors they give for inputs that are not what they must be."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
from pathlib import Path

import pytest

from tp4.image import oci

pytestmark = pytest.mark.unit


def tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def members(data: bytes) -> list[tarfile.TarInfo]:
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return tar.getmembers()


def store_tar(paths) -> bytes:
    buf = io.BytesIO()
    oci.write_store_tar(buf, [str(p) for p in paths])
    return buf.getvalue()


def test_a_store_tar_is_written_as_stream_layered_image_writes_its_layers(tmp_path):
    a = tree(tmp_path / "a", {"bin/tool": "x", "lib/z": "z", "lib/a": "a"})
    os.symlink("tool", a / "bin/link")
    os.link(a / "lib/a", a / "lib/hard")
    os.chmod(a / "bin/tool", 0o555)
    data = store_tar([a])
    got = members(data)
    assert [m.name for m in got[:2]] == ["/nix", "/nix/store"]
    assert all(m.mode == 0o755 and m.isdir() for m in got[:2])
    names = [m.name for m in got[2:]]
    prefix = "/" + str(a).lstrip("/")
    assert names == [
        prefix + p for p in ["", "/bin", "/bin/link", "/bin/tool", "/lib", "/lib/a", "/lib/hard", "/lib/z"]
    ]
    by_name = {m.name: m for m in got}
    assert all((m.uid, m.gid, m.uname, m.gname, m.mtime) == (0, 0, "root", "root", 1) for m in got)
    assert by_name[prefix + "/bin/link"].issym() and by_name[prefix + "/bin/link"].linkname == "tool"
    # a hard link is stored as the file it links, with its bytes
    hard = by_name[prefix + "/lib/hard"]
    assert hard.isfile() and hard.size == 1
    assert by_name[prefix + "/bin/tool"].mode & 0o777 == 0o555
    # the same paths give the same bytes (the layer's digest is its content's)
    assert store_tar([a]) == data


def test_a_store_path_that_is_a_file_or_a_link_is_one_entry(tmp_path):
    (tmp_path / "f").write_text("data")
    os.symlink("/nowhere", tmp_path / "l")
    names = [m.name for m in members(store_tar([tmp_path / "f", tmp_path / "l"]))]
    assert names[2:] == ["/" + str(tmp_path / "f").lstrip("/"), "/" + str(tmp_path / "l").lstrip("/")]


def graph(path: Path, entries: dict[str, list[str]]) -> Path:
    """An exportReferencesGraph file: per path, the path, an empty deriver line, the count of
    references and the references."""
    lines = []
    for p, refs in entries.items():
        lines += [p, "", str(len(refs)), *refs]
    path.write_text("\n".join(lines) + "\n")
    return path


S = "/nix/store/"


def test_a_reference_graph_gives_its_paths_sorted_and_once(tmp_path):
    g = graph(tmp_path / "g", {S + "b-x": [S + "a-y", S + "b-x"], S + "a-y": []})
    assert oci.read_graph(g) == [S + "a-y", S + "b-x"]


@pytest.mark.parametrize(
    "text, complaint",
    [
        ("", "empty"),
        ("/tmp/not-store\n\n0\n", "line 1"),
        (S + "a\n\nx\n", "line 1"),
        (S + "a\n\n2\n" + S + "b\n", "line 1"),
    ],
)
def test_a_reference_graph_that_is_not_one_is_refused(tmp_path, text, complaint):
    (tmp_path / "g").write_text(text)
    with pytest.raises(oci.OciError, match=complaint):
        oci.read_graph(tmp_path / "g")


def test_a_store_layer_leaves_out_what_the_layers_below_hold(tmp_path, monkeypatch):
    written: list[list[str]] = []
    monkeypatch.setattr(oci, "write_store_tar", lambda out, paths: written.append(list(paths)))
    own = graph(tmp_path / "own", {S + "app": [S + "lib"], S + "lib": [], S + "only-app": []})
    below = graph(tmp_path / "below", {S + "lib": []})
    blob = oci.store_layer(str(own), [str(below)], tmp_path / "out")
    assert written == [[S + "app", S + "only-app"]]
    meta = json.loads((tmp_path / "out" / "layer.json").read_text())
    assert meta["paths"] == [S + "app", S + "only-app"]
    data = (tmp_path / "out" / "layer.tar").read_bytes()
    assert blob == oci.Blob("sha256:" + hashlib.sha256(data).hexdigest(), len(data))
    assert (meta["digest"], meta["size"]) == (blob.digest, blob.size)


def test_the_links_layer_puts_parents_before_links(tmp_path):
    oci.links_layer(
        [
            "/opt/dsv41=/nix/store/x-rt",
            "/sgl-workspace/sglang/python=/nix/store/y-sg/python",
            "/opt/b12x=/nix/store/z-b",
        ],
        tmp_path / "out",
    )
    got = members((tmp_path / "out" / "layer.tar").read_bytes())
    assert [(m.name, m.type, m.linkname) for m in got] == [
        ("/opt", tarfile.DIRTYPE, ""),
        ("/opt/b12x", tarfile.SYMTYPE, "/nix/store/z-b"),
        ("/opt/dsv41", tarfile.SYMTYPE, "/nix/store/x-rt"),
        ("/sgl-workspace", tarfile.DIRTYPE, ""),
        ("/sgl-workspace/sglang", tarfile.DIRTYPE, ""),
        ("/sgl-workspace/sglang/python", tarfile.SYMTYPE, "/nix/store/y-sg/python"),
    ]
    assert all((m.uid, m.gid, m.mtime) == (0, 0, 1) for m in got)


@pytest.mark.parametrize("link", ["opt/x=/nix/store/a", "/opt/x", "/opt/x="])
def test_a_link_that_is_not_path_equals_target_is_refused(tmp_path, link):
    with pytest.raises(oci.OciError, match="expected /PATH=TARGET"):
        oci.links_layer([link], tmp_path / "out")


def layer_bytes(name: str, text: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        data = text.encode()
        info = tarfile.TarInfo(name)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def docker_archive(
    path: Path,
    layers: list[bytes],
    *,
    diff_ids: list[str] | None = None,
    env: list[str] | None = None,
    legacy_links: bool = False,
) -> Path:
    """A docker-archive as skopeo writes one (what dockerTools.pullImage fetches): <hex>.tar
    per layer, <hex>.json config, manifest.json (and legacy <id>/layer.tar links)."""
    hexes = [hashlib.sha256(data).hexdigest() for data in layers]
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Env": env or []},
            "rootfs": {"type": "layers", "diff_ids": diff_ids or [f"sha256:{h}" for h in hexes]},
        }
    ).encode()
    config_hex = hashlib.sha256(config).hexdigest()
    manifest = [
        {
            "Config": f"{config_hex}.json",
            "RepoTags": ["base:1"],
            "Layers": [f"legacy{i}/layer.tar" if legacy_links else f"{h}.tar" for i, h in enumerate(hexes)],
        }
    ]

    def add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))

    with tarfile.open(path, "w") as tar:
        for h, data in zip(hexes, layers, strict=True):
            add(tar, f"{h}.tar", data)
        if legacy_links:
            for i, h in enumerate(hexes):
                info = tarfile.TarInfo(f"legacy{i}/layer.tar")
                info.type = tarfile.SYMTYPE
                info.linkname = f"../{h}.tar"
                tar.addfile(info)
        add(tar, f"{config_hex}.json", config)
        add(tar, "manifest.json", json.dumps(manifest).encode())
    return path


@pytest.mark.parametrize("legacy_links", [False, True])
def test_the_base_archive_becomes_one_blob_per_layer_named_by_its_digest(tmp_path, legacy_links):
    layers = [layer_bytes("a", "base a"), layer_bytes("b", "base b")]
    archive = docker_archive(tmp_path / "base.tar", layers, env=["PATH=/usr/bin"], legacy_links=legacy_links)
    blobs = oci.base_layers(str(archive), tmp_path / "out")
    assert [b.size for b in blobs] == [len(x) for x in layers]
    for blob, data in zip(blobs, layers, strict=True):
        assert (tmp_path / "out" / "blobs" / "sha256" / blob.digest.removeprefix("sha256:")).read_bytes() == data
    assert json.loads((tmp_path / "out" / "layers.json").read_text()) == [b._asdict() for b in blobs]
    assert json.loads((tmp_path / "out" / "config.json").read_text())["config"]["Env"] == ["PATH=/usr/bin"]


def test_a_base_layer_that_is_not_its_diff_id_is_refused_by_digest(tmp_path):
    layers = [layer_bytes("a", "base a")]
    archive = docker_archive(tmp_path / "base.tar", layers, diff_ids=["sha256:" + "0" * 64])
    with pytest.raises(oci.OciError, match="has digest sha256:[0-9a-f]{64}, its config says sha256:0{64}"):
        oci.base_layers(str(archive), tmp_path / "out")
    assert not list((tmp_path / "out" / "blobs" / "sha256").glob("[0-9a-f]*"))


def test_a_base_archive_that_is_not_one_is_named(tmp_path):
    (tmp_path / "junk.tar").write_bytes(b"not a tar at all" * 100)
    with pytest.raises(oci.OciError, match="not a readable docker-archive"):
        oci.base_layers(str(tmp_path / "junk.tar"), tmp_path / "out")
    with tarfile.open(tmp_path / "empty.tar", "w"):
        pass
    with pytest.raises(oci.OciError, match="manifest.json is missing"):
        oci.base_layers(str(tmp_path / "empty.tar"), tmp_path / "out")


def built_layer(root: Path, name: str, text: str) -> Path:
    """A directory as a store layer step leaves it: layer.tar and layer.json."""
    data = layer_bytes(name, text)
    root.mkdir(parents=True)
    (root / "layer.tar").write_bytes(data)
    (root / "layer.json").write_text(
        json.dumps({"digest": "sha256:" + hashlib.sha256(data).hexdigest(), "size": len(data), "paths": [S + name]})
    )
    return root


SPEC = {
    "architecture": "arm64",
    "created": 1_700_000_000,
    "config": {"Entrypoint": ["python3"], "Env": ["PATH=/opt/bin", "MINE=1"], "Labels": {"tp4.flake.rev": "r1"}},
}


def layout(tmp_path: Path, spec=SPEC, text: str = "top") -> oci.Layout:
    base = tmp_path / "base"
    oci.base_layers(
        str(docker_archive(tmp_path / "base.tar", [layer_bytes("b", "base")], env=["PATH=/usr/bin", "BASE=1"])), base
    )
    layer = built_layer(tmp_path / f"layer-{text}", "app", text)
    return oci.image_layout(base, [layer], json.loads(json.dumps(spec)), "dsv41-4x-spark", tmp_path / f"img-{text}")


def test_the_layout_names_its_image_by_its_config_and_links_its_layers(tmp_path):
    got = layout(tmp_path)
    config_hex = got.config.digest.removeprefix("sha256:")
    assert got.ref == f"dsv41-4x-spark:{config_hex[:32]}"
    assert got.labels == {"tp4.flake.rev": "r1"}
    out = Path(got.path)
    assert json.loads((out / "oci-layout").read_text()) == {"imageLayoutVersion": "1.0.0"}
    config = json.loads((out / "blobs" / "sha256" / config_hex).read_bytes())
    # the base's Env stays, under the image's own (a key the image sets replaces the base's in place)
    assert config["config"]["Env"] == ["PATH=/opt/bin", "BASE=1", "MINE=1"]
    assert config["created"] == "2023-11-14T22:13:20+00:00" and config["os"] == "linux"
    assert config["architecture"] == "arm64"
    assert config["rootfs"]["diff_ids"] == list(got.diff_ids) and len(got.diff_ids) == 2
    assert [h["comment"] for h in config["history"]] == ["base image layer", f"store paths: ['{S}app']"]
    manifest = json.loads((out / "blobs" / "sha256" / got.manifest.digest.removeprefix("sha256:")).read_bytes())
    assert [layer["digest"] for layer in manifest["layers"]] == list(got.diff_ids)
    assert {layer["mediaType"] for layer in manifest["layers"]} == {oci.LAYER_TYPE}
    # each layer blob is a link to the step's output (absolute, as store paths are)
    for diff_id in got.diff_ids:
        link = out / "blobs" / "sha256" / diff_id.removeprefix("sha256:")
        assert link.is_symlink() and os.path.isabs(os.readlink(link))
        assert "sha256:" + hashlib.sha256(link.read_bytes()).hexdigest() == diff_id
    assert oci.is_layout(out) and not oci.is_layout(tmp_path)


def test_a_changed_layer_changes_the_reference_and_nothing_below_it(tmp_path):
    one, two = layout(tmp_path, text="one"), layout(tmp_path, text="two")
    assert one.ref != two.ref and one.config.digest != two.config.digest
    assert one.diff_ids[0] == two.diff_ids[0] and one.diff_ids[1] != two.diff_ids[1]


def test_a_tampered_blob_or_index_is_refused_when_read(tmp_path):
    got = layout(tmp_path)
    config = Path(got.path) / "blobs" / "sha256" / got.config.digest.removeprefix("sha256:")
    config.write_bytes(config.read_bytes() + b" ")
    with pytest.raises(oci.OciError, match="does not match its digest"):
        oci.read_layout(got.path)
    index = Path(got.path) / "index.json"
    entry = json.loads(index.read_text())["manifests"][0]
    index.write_text(json.dumps({"manifests": [entry, entry]}))
    with pytest.raises(oci.OciError, match="exactly one manifest"):
        oci.read_layout(got.path)
    index.write_text("{")
    with pytest.raises(oci.OciError, match="index.json cannot be read"):
        oci.read_layout(got.path)


@pytest.mark.parametrize("created", [True, 1.5, None, [1]])
def test_created_is_seconds_or_an_iso_time(tmp_path, created):
    with pytest.raises(oci.OciError, match="created"):
        layout(tmp_path, spec={**SPEC, "created": created})


def test_the_overlay_of_environments_keeps_order_and_lets_the_image_win():
    assert oci.overlay_env(["A=1", "B=2", "C"], ["B=3", "D=4"]) == ["A=1", "B=3", "C", "D=4"]


def test_a_step_that_fails_says_why_and_exits_1_without_a_traceback(tmp_path, capsys):
    (tmp_path / "g").write_text("garbage\n")
    assert oci.main(["layer", "--graph", str(tmp_path / "g"), "--out", str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("tp4.image.oci layer: ") and "line 1 is not a reference graph entry" in err
    assert "Traceback" not in err
