"""The two wheels go into the base image's site-packages, as upstream's `pip install` puts them.

* ``tp4.image.oci`` reads what the base's site-packages hold once its layers are stacked (whiteouts and
  opaque directories included) and installs a tree of wheels there: a link per entry, a whiteout
  for each dist-info pip would uninstall or whose files the tree replaces;
* end to end, in real podman: an image made by the repository's pkgs/oci.nix on a base whose
  site-packages hold an older sglang-kernel (its dist-info, its package, a stale dist-info of the
  old name claiming the same package) runs the registry's own `wheels` check under `tp4 build`;
  it passes with the wheels installed, and fails when they are linked beside the base (the old
  /opt/dsv41-wheels on PYTHONPATH): `python3 -I` loads the base's older copy there.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import tarfile
import tempfile
from pathlib import Path

import pytest

from nix_env import image_flake
from standin import image as standin
from test_build import check, env, line_id  # noqa: F401  (env is a fixture)
from tp4.image import oci
from tp4.line.registry import load_registry

SP = "/usr/local/lib/python3.11/dist-packages"  # where Debian's python3 has pip put packages


def tar_of(entries: dict[str, str | None]) -> bytes:
    """A layer: path -> file text (None: a directory)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for path, text in entries.items():
            info = tarfile.TarInfo(path.lstrip("/"))
            if text is None:
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            else:
                data = text.encode()
                info.size, info.mode = len(data), 0o644
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def record(*paths: str) -> str:
    return "".join(f"{p},sha256=x,1\n" for p in paths)


OLD = {  # the base: sglang-kernel 0.3.0, a stale `sgl-kernel` dist-info claiming the same package, torch
    f"{SP}/sgl_kernel/__init__.py": "__version__ = '0.3.0'\n",
    f"{SP}/sgl_kernel/old_only.py": "",
    f"{SP}/sgl_kernel.libs/libold.so": "",
    f"{SP}/sglang_kernel-0.3.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: sglang-kernel\nVersion: 0.3.0\n",
    f"{SP}/sglang_kernel-0.3.0.dist-info/RECORD": record(
        "sgl_kernel/__init__.py",
        "sgl_kernel/old_only.py",
        "sgl_kernel.libs/libold.so",
        "sglang_kernel-0.3.0.dist-info/RECORD",
        "../../../bin/sgl-old",
    ),
    f"{SP}/sgl_kernel-0.2.9.dist-info/METADATA": "Metadata-Version: 2.1\nName: sgl-kernel\nVersion: 0.2.9\n",
    f"{SP}/sgl_kernel-0.2.9.dist-info/RECORD": record("sgl_kernel/__init__.py", "sgl_kernel-0.2.9.dist-info/RECORD"),
    f"{SP}/torch/__init__.py": "",
    f"{SP}/torch-2.9.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: torch\nVersion: 2.9.0\n",
    f"{SP}/torch-2.9.0.dist-info/RECORD": record("torch/__init__.py", "torch-2.9.0.dist-info/RECORD"),
}

NEW = {  # the tree pkgs/wheels.nix makes: the two pinned wheels, installed
    "sgl_kernel/__init__.py": "__version__ = '0.4.7'\n",
    "sglang_kernel-0.4.7.dist-info/METADATA": "Metadata-Version: 2.1\nName: sglang-kernel\nVersion: 0.4.7\n",
    "sglang_kernel-0.4.7.dist-info/RECORD": record("sgl_kernel/__init__.py", "sglang_kernel-0.4.7.dist-info/RECORD"),
    "sglang_kernel-0.4.7.dist-info/top_level.txt": "sgl_kernel\n",
    "deep_gemm/__init__.py": "",
    "sgl_deep_gemm-0.2.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: sgl-deep-gemm\nVersion: 0.2.0\n",
    "sgl_deep_gemm-0.2.0.dist-info/RECORD": record("deep_gemm/__init__.py", "sgl_deep_gemm-0.2.0.dist-info/RECORD"),
}


# --- tp4.image.oci: the base's site-packages, and the install -----------------------------------------


def test_the_index_stacks_the_layers_with_their_whiteouts(tmp_path):
    low = tmp_path / "0.tar"
    low.write_bytes(
        tar_of(
            {
                **OLD,
                "/usr/lib/python3/dist-packages/apt/__init__.py": "",
                f"{SP}/gone/__init__.py": "",
                "/opt/venv/lib/python3.11/site-packages/x.py": "",
            }
        )
    )
    high = tmp_path / "1.tar"  # deletes `gone`, empties the venv's site-packages, adds a module
    high.write_bytes(
        tar_of(
            {
                f"{SP}/.wh.gone": "",
                "/opt/venv/lib/python3.11/site-packages/.wh..wh..opq": "",
                "/opt/venv/lib/python3.11/site-packages/y.py": "",
                f"{SP}/z.py": "",
            }
        )
    )

    index = oci.site_packages_index([low, high])

    assert sorted(index) == ["/opt/venv/lib/python3.11/site-packages", "/usr/lib/python3/dist-packages", SP]
    assert index["/opt/venv/lib/python3.11/site-packages"]["entries"] == ["y.py"]
    assert index[SP]["entries"] == [
        "sgl_kernel",
        "sgl_kernel-0.2.9.dist-info",
        "sgl_kernel.libs",
        "sglang_kernel-0.3.0.dist-info",
        "torch",
        "torch-2.9.0.dist-info",
        "z.py",
    ]
    assert index[SP]["records"]["sglang_kernel-0.3.0.dist-info"] == [
        "sgl_kernel",
        "sgl_kernel.libs",
        "sglang_kernel-0.3.0.dist-info",
    ]  # ../../../bin is outside it


def test_the_install_links_every_entry_and_hides_what_pip_would_uninstall(tmp_path):
    layer = tmp_path / "0.tar"
    layer.write_bytes(tar_of({**OLD, "/usr/lib/python3/dist-packages/apt/__init__.py": ""}))
    tree = tmp_path / "wheels"
    for rel, text in NEW.items():
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        (tree / rel).write_text(text)

    links, hidden = oci.site_install(str(tree), oci.site_packages_index([layer]))

    assert links == [(f"{SP}/{e}", f"{tree}/{e}") for e in sorted(os.listdir(tree))]
    # the old version of the same distribution and what it alone owned; the stale dist-info of
    # the old name claims the package the tree replaces; torch stays
    assert hidden == [
        f"{SP}/sgl_kernel-0.2.9.dist-info",
        f"{SP}/sgl_kernel.libs",
        f"{SP}/sglang_kernel-0.3.0.dist-info",
    ]

    # as a layer: the links, and an empty .wh.<name> file beside each hidden entry
    out = tmp_path / "links"
    base = tmp_path / "base"
    base.mkdir()
    (base / oci.SITE_INDEX).write_text(json.dumps(oci.site_packages_index([layer])))
    oci.links_layer(["/opt/x=/nix/store/x"], out, [str(tree)], base)
    with tarfile.open(out / "layer.tar") as tar:
        members = {m.name: m for m in tar}
    assert members[f"{SP}/.wh.sglang_kernel-0.3.0.dist-info"].isfile()
    assert members[f"{SP}/.wh.sglang_kernel-0.3.0.dist-info"].size == 0
    assert members[f"{SP}/sgl_kernel"].issym() and members[f"{SP}/sgl_kernel"].linkname == f"{tree}/sgl_kernel"
    assert f"{SP}/.wh.torch" not in members and f"{SP}/.wh.sgl_kernel" not in members
    assert json.loads((out / "layer.json").read_text())["whiteouts"] == hidden


def test_a_site_packages_behind_a_symlink_is_refused(tmp_path):
    """Linking into it would put a directory where the base has the link, hiding all it holds."""
    layer = tmp_path / "0.tar"
    buf = tar_of({"/opt/real/lib/python3.11/site-packages/torch/__init__.py": ""})
    layer.write_bytes(buf)
    link = tmp_path / "1.tar"
    with tarfile.open(link, "w") as tar:
        info = tarfile.TarInfo("usr/local/lib/python3.11")
        info.type, info.linkname = tarfile.SYMTYPE, "/opt/real/lib/python3.11"
        tar.addfile(info)
        for name in ("usr/local/lib/python3.11/dist-packages/torch/__init__.py",):
            data = tarfile.TarInfo(name)
            tar.addfile(data, io.BytesIO(b""))
    tree = tmp_path / "wheels"
    (tree / "sgl_deep_gemm-0.2.0.dist-info").mkdir(parents=True)
    index = oci.site_packages_index([layer, link])
    assert index[SP]["links"] == ["/usr/local/lib/python3.11"]
    with pytest.raises(oci.OciError, match="is reached through a symlink"):
        oci.site_install(str(tree), {SP: index[SP]})


def test_a_base_without_a_place_for_the_wheels_is_an_error_naming_what_it_found(tmp_path):
    layer = tmp_path / "0.tar"
    layer.write_bytes(tar_of({"/usr/lib/python3/dist-packages/apt/__init__.py": ""}))
    tree = tmp_path / "wheels"
    (tree / "sgl_deep_gemm-0.2.0.dist-info").mkdir(parents=True)
    with pytest.raises(oci.OciError) as err:
        oci.site_install(str(tree), oci.site_packages_index([layer]))
    assert "cannot tell which site-packages of the base image to install sgl-deep-gemm into" in str(err.value)
    assert "/usr/lib/python3/dist-packages" in str(err.value)
    with pytest.raises(oci.OciError, match="--install needs --base"):
        oci.links_layer([], tmp_path / "l", [str(tree)], None)


# --- end to end: tp4 build runs the registry's `wheels` check in podman ---------------------------


def base_archive(dest: Path, extra: dict[str, Path | bytes | str] | None = None) -> Path:
    """A docker-archive: Debian's python3 and its standard library (tests/standin/image.py), and
    site-packages holding the older sglang-kernel (OLD), as the line's base holds its own;
    ``extra`` files besides (path in the image -> host file, bytes, or a symlink's target)."""
    files: dict[str, Path | bytes | str] = {k: v for k, v in standin._files().items() if not k.startswith("/opt/")}
    files.update({k: v.encode() for k, v in OLD.items()})
    files.update(extra or {})
    work = Path(tempfile.mkdtemp(prefix="tp4-sp-", dir=dest))
    layer = work / "layer.tar"
    standin._layer(files, layer)
    diff = hashlib.sha256(layer.read_bytes()).hexdigest()
    config = json.dumps(
        {
            "architecture": {"x86_64": "amd64", "aarch64": "arm64"}.get(os.uname().machine),
            "os": "linux",
            "config": {"Env": ["PATH=/usr/bin:/bin"]},
            "rootfs": {"type": "layers", "diff_ids": [f"sha256:{diff}"]},
        }
    ).encode()
    cfg = hashlib.sha256(config).hexdigest()
    out = dest / "base.tar"
    with tarfile.open(out, "w") as tar:
        for name, data in (
            (
                "manifest.json",
                json.dumps(
                    [{"Config": f"{cfg}.json", "RepoTags": ["tp4-sp-base:1"], "Layers": [f"{diff}/layer.tar"]}]
                ).encode(),
            ),
            (f"{cfg}.json", config),
        ):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        tar.add(layer, arcname=f"{diff}/layer.tar")
    shutil.rmtree(work)
    return out


def wheels_check() -> str:
    """The registry's own `wheels` check, as TOML for the test flake."""
    entry = next(c for c in load_registry().image_checks if c.name == "wheels")
    return check("wheels", argv=list(entry.argv))


@pytest.mark.parametrize("how", ["installed", "on-pythonpath"])
def test_the_wheels_check_passes_only_when_python_I_sees_the_pinned_wheels(env, tp4_cli, how):  # noqa: F811
    archive = base_archive(env)
    at = "" if how == "installed" else "/opt/dsv41-wheels"
    flake = image_flake(
        env / "flake",
        ref="tp4-test:line",
        label=f"sp-{how}-{os.urandom(4).hex()}",
        checks=wheels_check(),
        base_archive=archive,
        wheels=NEW,
        wheels_at=at,
        env=("PATH=/usr/bin:/bin",) + (("PYTHONPATH=/opt/dsv41-wheels",) if at else ()),
    )

    code, stdout, stderr = tp4_cli("build", "--flake", flake, "--runtime", "podman")

    if how == "installed":
        assert code == 0, stdout + stderr
        ok = next(line for line in stdout.splitlines() if line.startswith("ok   wheels"))
        assert ok.endswith(f"  sglang-kernel 0.4.7, sgl-deep-gemm 0.2.0 in {SP}"), stdout
        assert line_id() is not None
    else:
        # PYTHONPATH wins for a plain python3, but a child started with -I gets the base's copy
        assert code == 1
        assert (f"| FAIL sglang-kernel: importlib.metadata finds 0.3.0 in {SP}; pinned 0.4.7") in stdout, stdout
        assert "| FAIL sgl-deep-gemm: importlib.metadata finds none; pinned 0.2.0" in stdout
        assert "error: 1 of 1 in-image checks failed (wheels)" in stderr
        assert line_id() is None
