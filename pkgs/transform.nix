# The build script of one transformed tree (builtins only).  It runs the transform code of
# `tp4 sources fetch`, offline, on rows Nix has already fetched and hash-checked
# (pkgs/sources.nix `fetchArgs`), so the CLI and the image can never disagree; nothing here
# re-implements a rename or a patch step.  pkgs/tree.nix builds this text for real, and so does
# tests/test_flake_transforms.py with busybox and file:// fetches.
{
  # the manifest tree to build (e.g. "sglang-line")
  target,
  # [ "--manifest" <file> "--input" "<row>=<fetched>" ... ] from pkgs/sources.nix
  fetchArgs,
}:
let
  quote = s: "'" + builtins.replaceStrings [ "'" ] [ "'\\''" ] s + "'";
in
''
  set -eu
  export HOME="$PWD" PYTHONDONTWRITEBYTECODE=1
  python3 -m tp4.image.sources fetch ${quote target} --to "$out" --offline \
    ${builtins.concatStringsSep " " (map quote fetchArgs)}
''
