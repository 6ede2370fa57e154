# The two wheels of the final stage (sglang-kernel, sgl-deep-gemm), fetched by hash through
# pkgs/sources.nix and installed without network, --no-deps as upstream.  They go to their own
# directory on PYTHONPATH (/opt/dsv41-wheels) instead of the base image's site-packages: a layer
# cannot uninstall the base image's older dist-info, and a path entry wins over site-packages.
{ pkgs, wheels }:
pkgs.runCommand "dsv41-wheels"
  {
    nativeBuildInputs = [ (pkgs.python3.withPackages (ps: [ ps.installer ])) ];
    passthru = { inherit wheels; };
  }
  ''
    for wheel in ${builtins.concatStringsSep " " (map (w: "${w}") wheels)}; do
      python3 -m installer --no-compile-bytecode --destdir "$TMPDIR/root" --prefix / "$wheel"
    done
    mv "$TMPDIR"/root/lib/python3*/site-packages "$out"
  ''
