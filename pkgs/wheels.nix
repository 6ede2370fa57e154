# The two wheels of the final stage (sglang-kernel, sgl-deep-gemm), fetched by hash through
# pkgs/sources.nix and installed without network, --no-deps as upstream, into a directory laid
# out as site-packages.  The image puts its entries into the base image's site-packages and hides
# the base's dist-info of the same distributions (whiteouts: pkgs/oci.nix `sitePackages`), so
# `python3 -I` and importlib.metadata see the pinned versions, as after upstream's pip install.
# installer reads the distribution's name and version from the wheel's file name, so each wheel
# is installed under its real name, not as its store path <hash>-<name> (nixpkgs' own wheel hook
# strips the hash the same way).
{
  pkgs,
  # [ { file = "<wheel file name>"; src = <the fetched wheel>; } ... ], in manifest order
  wheels,
}:
let
  quote = s: "'" + builtins.replaceStrings [ "'" ] [ "'\\''" ] s + "'";
  install = w: ''
    cp ${w.src} "$TMPDIR"/dist/${quote w.file}
    python3 -m installer --no-compile-bytecode --destdir "$TMPDIR/root" --prefix / \
      "$TMPDIR"/dist/${quote w.file}
  '';
in
pkgs.runCommand "dsv41-wheels"
  {
    nativeBuildInputs = [ (pkgs.python3.withPackages (ps: [ ps.installer ])) ];
    passthru = { inherit wheels; };
  }
  ''
    mkdir "$TMPDIR/dist"
    ${builtins.concatStringsSep "" (map install wheels)}
    mv "$TMPDIR"/root/lib/python3*/site-packages "$out"
  ''
