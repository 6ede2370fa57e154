# The runtime tree of /opt/dsv41 (adapters, boot.py, scripts, tests, benchmarks) from the pinned
# upstream repository row, plus adapter/librow_store.so compiled with upstream's flags.
# The library is loaded by the base image's Python, not by anything from nixpkgs, so libstdc++ and
# libgcc are linked statically and no RUNPATH or store reference is left in it
# (allowedReferences = [ ]): it needs only the base image's libc.  That libc is older than
# nixpkgs' (against which it is linked), so the build fails if the library needs a symbol version
# the base image's glibc lacks (tp4.image.elf check-glibc), instead of the dlopen failing at boot.
{
  pkgs,
  tree,
  version,
  # the base image's glibc, MAJOR.MINOR (glibc= of its row of sources.manifest)
  glibc,
  # pkgs/src.nix: the check is picked from the repository with it
  src,
}:
let
  # tp4.image.elf and what it imports (standard library only), so only an edit to them rebuilds this
  elfCheck = builtins.path {
    path = src.root;
    name = "tp4-elf";
    filter = src.wanted [
      "python/tp4/__init__.py"
      "python/tp4/core/__init__.py"
      "python/tp4/core/errors.py"
      "python/tp4/image/__init__.py"
      "python/tp4/image/elf.py"
    ];
  };
in
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
    PYTHONPATH=${elfCheck}/python PYTHONDONTWRITEBYTECODE=1 ${pkgs.python3.interpreter} -m tp4.image.elf \
      check-glibc --max ${pkgs.lib.escapeShellArg glibc} adapter/librow_store.so
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
