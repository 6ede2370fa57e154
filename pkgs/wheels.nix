# The two wheels of the final stage (sglang-kernel, sgl-deep-gemm), fetched by hash through
# pkgs/sources.nix and installed without network, --no-deps as upstream.  They go to their own
# directory on PYTHONPATH (/opt/dsv41-wheels) instead of the base image's site-packages: a layer
# cannot uninstall the base image's older dist-info, and a path entry wins over site-packages.
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
