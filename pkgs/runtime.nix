# The runtime tree of /opt/dsv41 (adapters, boot.py, scripts, tests, benchmarks) from the pinned
# upstream repository row, plus adapter/librow_store.so compiled with upstream's flags.
# The library is loaded by the base image's Python, not by anything from nixpkgs, so libstdc++ and
# libgcc are linked statically and no RUNPATH or store reference is left in it
# (allowedReferences = [ ]): it needs only the base image's libc.
{ pkgs, tree, version }:
pkgs.stdenv.mkDerivation {
  pname = "tp4-runtime";
  inherit version;
  src = tree;
  nativeBuildInputs = [ pkgs.patchelf ];
  dontConfigure = true;
  buildPhase = ''
    runHook preBuild
    $CXX -O2 -Wall -Wextra -Werror -std=c++17 -shared -fPIC -pthread -DDSV41_ROW_STORE_DRM \
      -static-libstdc++ -static-libgcc adapter/row_store.cpp -o adapter/librow_store.so
    patchelf --remove-rpath adapter/librow_store.so
    runHook postBuild
  '';
  installPhase = ''
    runHook preInstall
    cp -r . "$out"
    runHook postInstall
  '';
  # the scripts run under the base image's python3, so their shebangs must stay as upstream wrote them
  dontPatchShebangs = true;
  allowedReferences = [ ];
}
