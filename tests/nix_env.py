"""Nix for tests, offline: configuration, a copy of the repository's flake, and tiny image flakes.

* ``nix_config(dir)``: NIX_CONFIG with flakes on, no substituters and a local, empty flake
  registry (nothing is looked up on the network); the one tests/sources_helpers writes.
* ``flake_copy(repo, dest)``: the files the flake reads, copied to a directory (a ``path:`` flake
  sees exactly them, committed or not; a git checkout would hide untracked files);
  ``locked_flake_copy`` also fills every `unlocked` hash of the manifest with a fake one.
* ``STUB_INPUTS``: ``--override-input`` arguments that replace nixpkgs by the recording stand-in
  (tests/nixpkgs-stub) and nixos-dgx-spark by an empty flake.
* ``image_flake(dir, ...)``: a flake with no inputs whose ``packages.<system>.image`` is a stream
  script (like dockerTools.streamLayeredImage's) writing a docker-archive, built with busybox only;
  like pkgs/image.nix it carries its in-image checks (label tp4.checks) and the line's reference.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from sources_helpers.build import nix_env as sources_nix_env
from tp4.core import process

# a static busybox: `nix develop` names it (its busybox stays off PATH, where its `ip` and `patch`
# would shadow iproute2 and GNU patch); elsewhere the one on PATH (Debian's busybox-static)
BUSYBOX = os.environ.get("TP4_TEST_BUSYBOX") or shutil.which("busybox") or "/bin/busybox"
SYSTEM = f"{os.uname().machine}-linux"
REPO = Path(__file__).resolve().parent.parent
FLAKE_FILES = (
    "flake.nix",
    "flake.lock",
    "pkgs",
    "sources.manifest",
    "sources.manifest.json",
    "adapters",
    "python",
    "modules",
    "examples",
)
IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache", "*.egg-info", ".hypothesis")


def nix_config(workdir: Path) -> str:
    workdir.mkdir(parents=True, exist_ok=True)
    return sources_nix_env(workdir)["NIX_CONFIG"]


def image_nix_config(workdir: Path) -> str:
    """nix_config for building image_flake's layouts: their tp4.image.oci steps run the host's python3,
    which a sandboxed build cannot see."""
    return nix_config(workdir) + "sandbox = false\n"


# the host's python3 for the layout steps: Debian's, which every build user can run (the test
# venv's may live under a directory only root can enter)
HOST_PYTHON = shutil.which("python3", path="/usr/bin:/bin") or os.path.realpath(sys.executable)


def flake_copy(repo: Path, dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    for name in FLAKE_FILES:
        src = repo / name
        if src.is_dir():
            shutil.copytree(src, dest / name, symlinks=True, ignore=IGNORE)
        elif src.exists():
            # sources.manifest(.json) are links into python/tp4/data: keep them links
            shutil.copy2(src, dest / name, follow_symlinks=False)
    return dest


def lock_all(text: str) -> str:
    """A manifest with every `unlocked` hash replaced by a fake one (evaluation never fetches)."""
    return re.sub(r"^(\S+\s+\S+\s+)unlocked(\s)", rf"\g<1>{'0' * 64}\g<2>", text, flags=re.M)


def locked_flake_copy(repo: Path, dest: Path) -> Path:
    """flake_copy with every manifest row locked, so every output evaluates (the manifest and the
    JSON copy Nix reads, both written as `tp4 sources lock` writes them)."""
    from tp4.image.sources import companion

    copy = flake_copy(repo, dest)
    companion.write(copy / "sources.manifest", lock_all((repo / "sources.manifest").read_text()))
    return copy


def empty_flake(dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "flake.nix").write_text("{ outputs = _: { }; }\n")
    return dest


def stub_inputs(repo: Path, empty: Path) -> list[str]:
    return [
        "--override-input",
        "nixpkgs",
        f"path:{repo / 'tests' / 'nixpkgs-stub'}",
        "--override-input",
        "nixos-dgx-spark",
        f"path:{empty}",
        "--no-write-lock-file",
    ]


def busybox_dir(dest: Path) -> Path:
    """bin/busybox and bin/sh, so a store copy can be a builder and a shebang."""
    (dest / "bin").mkdir(parents=True, exist_ok=True)
    shutil.copy2(BUSYBOX, dest / "bin" / "busybox")
    if not (dest / "bin" / "sh").exists():
        os.symlink("busybox", dest / "bin" / "sh")
    return dest


IMAGE_FLAKE = r"""{
  outputs = { self }:
    let
      system = "@system@";
      bb = ./bb;
      sh = "${bb}/bin/busybox";
      mk = name: script: derivation {
        inherit name system;
        builder = sh;
        args = [ "sh" "-euc" script ];
        PATH = "${bb}/bin";
      };
      # as pkgs/image.nix: the checks come from [[image_check]] entries read with fromTOML and
      # travel as JSON in the tp4.checks label; the line's reference in tp4.line.ref
      checks = if builtins.pathExists ./checks.toml
        then [ (builtins.fromTOML (builtins.readFile ./checks.toml)).image_check or [ ] ] else [ ];
      lineRef = if "@line_ref@" == "" then [ ] else [ "@line_ref@" ];
      labels = {
        "tp4.flake.rev" = "@label@";
        "tp4.pin.demo" = "0123456789abcdef0123456789abcdef01234567";
      }
      // builtins.listToAttrs (map (c: { name = "tp4.checks"; value = builtins.toJSON c; }) checks)
      // builtins.listToAttrs (map (r: { name = "tp4.line.ref"; value = r; }) lineRef);
      labelsJSON = builtins.toJSON labels;
      # like nixpkgs' tag = null: a tag derived from the image's content
      tag = builtins.substring 0 32 (builtins.hashString "sha256"
        (builtins.unsafeDiscardStringContext "${labelsJSON} ${./dsv41} @size_mb@ @base_layers@"));
      # layers below the image's own one: /opt/base<i>/blob of <mb> MiB of random bytes each
      baseLayers = builtins.genList (i: let mb = builtins.elemAt @base_layers@ i; in mk "tp4-test-layer-${toString i}-${toString mb}mb" ''
        busybox --install -s "$PWD/tools"; export PATH="$PWD/tools:$PATH"
        mkdir -p root/opt/base${toString i}
        head -c $((${toString mb} * 1048576)) /dev/urandom > root/opt/base${toString i}/blob
        (cd root && tar -cf "$out" opt)
      '') (builtins.length @base_layers@);
      archive = mk "tp4-test-image.tar" ''
        busybox --install -s "$PWD/tools"; export PATH="$PWD/tools:$PATH"
        mkdir -p root/bin root/opt/data layer
        cp ${bb}/bin/busybox root/bin/busybox
        ln -s busybox root/bin/sh
        # the runtime tree; its tests/*.py are shell scripts, run by a python3 that is sh
        cp -r ${./dsv41} root/opt/dsv41
        printf '#!/bin/sh\nexec /bin/sh "$@"\n' > root/bin/python3
        chmod -R u+w root; chmod +x root/bin/python3
        echo @label@ > root/opt/data/label
        if [ @size_mb@ -gt 0 ]; then head -c $((@size_mb@ * 1048576)) /dev/urandom > root/opt/data/blob; fi
        (cd root && tar -cf ../layer.tar bin opt)
        diff=$(sha256sum layer.tar | cut -d' ' -f1)
        mkdir "$diff"; mv layer.tar "$diff/layer.tar"
        # the base layers first (each its own derivation: the same bytes in every build)
        ids=""; tars=""; dirs=""
        for l in ${toString baseLayers}; do
          d=$(sha256sum "$l" | cut -d' ' -f1); mkdir -p "$d"; cp "$l" "$d/layer.tar"
          ids="$ids\"sha256:$d\","; tars="$tars\"$d/layer.tar\","; dirs="$dirs $d"
        done
        printf '{"architecture":"@arch@","os":"linux","config":{"Entrypoint":["/bin/sh","-c","echo entrypoint not overridden; exit 97"],"Cmd":["run"],"WorkingDir":"/opt/dsv41","Labels":%s},"rootfs":{"type":"layers","diff_ids":[%s"sha256:%s"]}}' "$(cat ${builtins.toFile "labels.json" labelsJSON})" "$ids" "$diff" > config.json
        cfg=$(sha256sum config.json | cut -d' ' -f1)
        mv config.json "$cfg.json"
        printf '[{"Config":"%s.json","RepoTags":["@name@:${tag}"],"Layers":[%s"%s/layer.tar"]}]' "$cfg" "$tars" "$diff" > manifest.json
        tar -cf "$out" manifest.json "$cfg.json" $dirs "$diff"
      '';
      image = mk "stream-tp4-test" ''
        printf '#!%s/bin/sh\nexec %s cat %s\n' ${bb} ${sh} ${archive} > "$out"
        ${sh} chmod +x "$out"
      '';
    in {
      packages.${system} = { inherit image archive; default = image; };
    };
}
"""

LAYOUT_FLAKE = r"""{
  outputs = { self }:
    let
      system = "@system@";
      bb = ./bb;
      sh = "${bb}/bin/busybox";
      mk = name: script: derivation {
        inherit name system;
        builder = sh;
        args = [ "sh" "-euc" script ];
        PATH = "${bb}/bin";
      };
      # pkgs/oci.nix's `mk`: its steps run tp4.image.oci with the host's python3 (so these builds need
      # sandbox = false), where the flake has pkgs.runCommand and nixpkgs' python3; passthru is
      # kept out of the derivation and put on its value, as stdenv.mkDerivation does
      mkPy = name: attrs: script: derivation ({
        inherit name system;
        builder = sh;
        args = [ "sh" "-euc" script ];
        PATH = "${bb}/bin:@python_dir@";
        PYTHONPATH = "${./oci}/python";
      } // builtins.removeAttrs attrs [ "passthru" ]) // (attrs.passthru or { });
      checks = if builtins.pathExists ./checks.toml
        then [ (builtins.fromTOML (builtins.readFile ./checks.toml)).image_check or [ ] ] else [ ];
      lineRef = if "@line_ref@" == "" then [ ] else [ "@line_ref@" ];
      labels = {
        "tp4.flake.rev" = "@label@";
        "tp4.pin.demo" = "0123456789abcdef0123456789abcdef01234567";
      }
      // builtins.listToAttrs (map (c: { name = "tp4.checks"; value = builtins.toJSON c; }) checks)
      // builtins.listToAttrs (map (r: { name = "tp4.line.ref"; value = r; }) lineRef);
      # the base: a docker-archive (as dockerTools.pullImage fetches one) of layers of <mb> MiB of
      # random bytes each at /opt/base<i>/blob, each built once per (position, size)
      baseLayers = builtins.genList (i: let mb = builtins.elemAt @base_layers@ i; in mk "tp4-test-layer-${toString i}-${toString mb}mb" ''
        busybox mkdir tools; busybox --install -s "$PWD/tools"; export PATH="$PWD/tools:$PATH"
        mkdir -p root/opt/base${toString i}
        head -c $((${toString mb} * 1048576)) /dev/urandom > root/opt/base${toString i}/blob
        (cd root && tar -cf "$out" opt)
      '') (builtins.length @base_layers@);
      # ./base.tar when the test gives one (a docker-archive it wrote), else the random layers
      base = if builtins.pathExists ./base.tar then mk "tp4-test-given-base.tar" "${sh} cp ${./base.tar} $out" else if baseLayers == [ ] then null else mk "tp4-test-base.tar" ''
        busybox mkdir tools; busybox --install -s "$PWD/tools"; export PATH="$PWD/tools:$PATH"
        ids=""; names=""; files=""
        for l in ${toString baseLayers}; do
          d=$(sha256sum "$l" | cut -d' ' -f1); cp "$l" "$d.tar"
          ids="$ids\"sha256:$d\","; names="$names\"$d.tar\","; files="$files $d.tar"
        done
        printf '{"architecture":"@arch@","os":"linux","config":{"Env":["TP4_TEST_BASE=1","PATH=/usr/bin"]},"rootfs":{"type":"layers","diff_ids":[%s]}}' "''${ids%,}" > config.json
        cfg=$(sha256sum config.json | cut -d' ' -f1); mv config.json "$cfg.json"
        printf '[{"Config":"%s.json","RepoTags":["tp4-test-base:1"],"Layers":[%s]}]' "$cfg" "''${names%,}" > manifest.json
        tar -cf "$out" manifest.json "$cfg.json" $files
      '';
      # the trees, each its own layer: busybox with `python3` = sh; the runtime tree, whose
      # tests/*.py are shell scripts; the label and size_mb of random bytes (what changes)
      tools = mk "tp4-test-tools" ''
        ${sh} mkdir -p "$out/bin"
        ${sh} cp ${bb}/bin/busybox "$out/bin/busybox"
        ${sh} ln -s busybox "$out/bin/sh"
        printf '#!/bin/sh\nexec /bin/sh "$@"\n' > "$out/bin/python3"
        ${sh} chmod +x "$out/bin/python3"
      '';
      runtime = mk "tp4-test-dsv41" ''
        ${sh} cp -r ${./dsv41} "$out"
      '';
      data = mk "tp4-test-data" ''
        ${sh} mkdir -p "$out"
        echo @label@ > "$out/label"
        if [ @size_mb@ -gt 0 ]; then ${sh} head -c $((@size_mb@ * 1048576)) /dev/urandom > "$out/blob"; fi
      '';
      wheels = mk "tp4-test-wheels" ''
        ${sh} cp -r ${./wheels} "$out"
      '';
      image = import ./oci.nix {
        mk = mkPy;
        name = "@name@";
        inherit base;
        # what tp4 build reads from the base first (pkgs/image.nix's baseFacts), when the test gives it
        passthru = if builtins.pathExists ./base-facts.json
          then { baseFacts = builtins.fromJSON (builtins.readFile ./base-facts.json); } else { };
        # ./wheels (a tree laid out as site-packages), when the test gives one: installed into the
        # base's site-packages as pkgs/default.nix does, or (@wheels_at@ set) linked there instead
        layers = (if builtins.pathExists ./wheels then [
          (if "@wheels_at@" == "" then { sitePackages = true; tree = wheels; } else { path = "@wheels_at@"; tree = wheels; })
        ] else [ ]) ++ [
          { path = "/bin"; tree = tools; subdir = "/bin"; }
          { path = "/opt/dsv41"; tree = runtime; }
          { path = "/opt/data"; tree = data; }
        ];
        spec = {
          architecture = "@arch@";
          config = {
            Entrypoint = [ "/bin/sh" "-c" "echo entrypoint not overridden; exit 97" ];
            Cmd = [ "run" ];
            WorkingDir = "/opt/dsv41";
            Env = [ @env@ ];
            Labels = labels;
          };
        };
      };
    in {
      packages.${system} = { inherit image; default = image; };
    };
}
"""

# The test image's runtime tree (/opt/dsv41): "Python" tests that are shell scripts.
TEST_FILES = {
    "tests/test_pass.py": 'echo "checking something"\necho "3/3 PASS"\n',
    "tests/test_fail.py": 'echo "checking something"\necho "AssertionError: failing on purpose" >&2\nexit 1\n',
    # what the container saw: working directory, arguments, network interfaces, environment
    # (cwd: /opt/dsv41/tests when it is that directory, which in a layout image is a link away)
    "tests/test_env.py": (
        'd=$(pwd -P); [ "$d" = "$(cd /opt/dsv41/tests 2>/dev/null && pwd -P)" ] && d=/opt/dsv41/tests\n'
        "echo \"cwd=$d args=$* net=$(ls /sys/class/net | tr '\\n' ' ')"
        'CVD=[${CUDA_VISIBLE_DEVICES-unset}] BV_TEST_N=${BV_TEST_N-unset}"\n'
    ),
}


def image_flake(
    dest: Path,
    *,
    ref: str | None = "tp4-test:latest",
    label: str = "v1",
    size_mb: int = 0,
    checks: str | None = "",
    files: dict[str, str] | None = None,
    base_layers_mb: tuple[int, ...] = (),
    stream: bool = False,
    base_archive: Path | None = None,
    wheels: dict[str, str] | None = None,
    wheels_at: str = "",
    env: tuple[str, ...] = ("PATH=/bin",),
    base_facts: dict | None = None,
) -> Path:
    """A flake whose ``image`` is an OCI layout made by the repository's pkgs/oci.nix and
    tp4.image.oci, as the line's image is (build it with :func:`image_nix_config`): busybox at /bin
    with ``python3`` = sh, a runtime tree at /opt/dsv41 with ``TEST_FILES`` plus ``files``, and
    /opt/data with a label file and size_mb of random bytes, each a layer of its own; a different
    ``label`` gives a different image id and changes only the /opt/data layer (and the links).

    ``base_layers_mb`` gives it a base image (a docker-archive, as dockerTools.pullImage fetches)
    of layers of that many MiB of random bytes each, built once per (position, size): images that
    differ in their label share them byte for byte, as a rebuild of the line shares its base.

    ``base_archive``: a docker-archive to use as the base instead. ``wheels``: files of a tree
    laid out as site-packages, installed into the base's site-packages as pkgs/default.nix
    installs the line's wheels (``sitePackages = true``), or linked at ``wheels_at`` when given.
    ``env``: the image's own Env. ``base_facts``: what `tp4 build` expects of the base
    (``{"row": ..., "attrs": {...}}``, pkgs/image.nix's ``baseFacts``).

    ``stream``: instead, a stream script (like dockerTools.streamLayeredImage's) writing a
    one-layer docker-archive on top of the base layers, built with busybox only.

    It is loaded under a content-derived tag of ``ref``'s repository; ``ref`` itself is the line's
    reference (label tp4.line.ref; None: no such label). ``checks`` is TOML with
    ``[[image_check]]`` entries that become the tp4.checks label ("": an empty list; None: no label)."""
    dest.mkdir(parents=True, exist_ok=True)
    busybox_dir(dest / "bb")
    for rel, text in {**TEST_FILES, **(files or {})}.items():
        (dest / "dsv41" / rel).parent.mkdir(parents=True, exist_ok=True)
        (dest / "dsv41" / rel).write_text(text)
    for name in ("base.tar", "wheels", "base-facts.json"):
        if (dest / name).is_dir():
            shutil.rmtree(dest / name)
        elif (dest / name).exists():
            (dest / name).unlink()
    if base_archive is not None:
        shutil.copy2(base_archive, dest / "base.tar")
    if base_facts is not None:
        (dest / "base-facts.json").write_text(json.dumps(base_facts))
    for rel, text in (wheels or {}).items():
        (dest / "wheels" / rel).parent.mkdir(parents=True, exist_ok=True)
        (dest / "wheels" / rel).write_text(text)
    if checks is not None:
        (dest / "checks.toml").write_text(checks)
    elif (dest / "checks.toml").exists():
        (dest / "checks.toml").unlink()
    name = ref.rsplit(":", 1)[0] if ref else "tp4-test"
    arch = {"x86_64": "amd64", "aarch64": "arm64"}.get(os.uname().machine, os.uname().machine)
    if not stream:
        shutil.copy2(REPO / "pkgs" / "oci.nix", dest / "oci.nix")
        (dest / "oci" / "python" / "tp4" / "image").mkdir(parents=True, exist_ok=True)
        for module in ("__init__.py", "image/__init__.py", "image/oci.py"):
            shutil.copy2(REPO / "python" / "tp4" / module, dest / "oci" / "python" / "tp4" / module)
    template = IMAGE_FLAKE if stream else LAYOUT_FLAKE.replace("@python_dir@", os.path.dirname(HOST_PYTHON))
    text = (
        template.replace("@line_ref@", ref or "")
        .replace("@name@", name)
        .replace("@label@", label)
        .replace("@system@", SYSTEM)
        .replace("@size_mb@", str(size_mb))
        .replace("@arch@", arch)
        .replace("@base_layers@", "[ " + " ".join(str(int(mb)) for mb in base_layers_mb) + " ]")
        .replace("@wheels_at@", wheels_at)
        .replace("@env@", " ".join(f'"{e}"' for e in env))
    )
    (dest / "flake.nix").write_text(text)
    return dest


def nix(argv: list[str], workdir: Path, **kwargs) -> subprocess.CompletedProcess:
    """Run nix with the offline test configuration (tests only; tp4 itself goes through tp4.image.nix)."""
    return process.run(["nix", *argv], env={"NIX_CONFIG": nix_config(workdir)}, check=False, **kwargs)
