# The build script of one transformed tree (builtins only).  It runs the transform code of
# `tp4 sources fetch`, offline, on inputs Nix has already fetched and hash-checked, so the CLI and
# the image can never disagree; nothing here re-implements a rename or a patch step.
# The same text is built for real by pkgs/tree.nix and, with busybox and file:// inputs, by
# tests/test_flake_transforms.py.
{
  # the target `tp4 sources fetch` builds (e.g. "sglang-canary")
  target,
  # component -> fetched file or tree (a derivation or a store path)
  inputs,
  # the manifest the pins come from
  manifest,
}:
let
  quote = s: "'" + builtins.replaceStrings [ "'" ] [ "'\\''" ] s + "'";
  inputArgs = map (c: "--input ${quote "${c}=${inputs.${c}}"}") (builtins.attrNames inputs);
in
''
  set -eu
  export HOME="$PWD" PYTHONDONTWRITEBYTECODE=1
  python3 -m tp4.sources fetch ${quote target} --to "$out" --manifest ${quote "${manifest}"} \
    ${builtins.concatStringsSep " \\\n    " inputArgs}
''
