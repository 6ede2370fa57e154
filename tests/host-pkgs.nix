# The few pkgs attributes a pkgs/ file needs, made of the host's tools, so a test can build that
# file's derivation for real with Nix 2.8 (`--option sandbox false`, no nixpkgs): runCommand is
# busybox sh with the inputs' bin/ first on PATH and busybox's applets after them,
# python3.withPackages is the test's Python (which has every package the tests use); passthru is
# merged into the result as nixpkgs does.
{
  # a directory with bin/busybox (copied into the store)
  busybox,
  # a Python environment with bin/python3, as a string so it stays where it is
  python,
  # directories whose bin/ stands in for what stdenv puts on PATH (bash, GNU patch, ...)
  stdenvPath ? [ ],
  # more attributes (host tools as directories with bin/, fetchers)
  extra ? { },
}:
extra
// {
  python3.withPackages = _: python;
  runCommand =
    name: env: script:
    (env.passthru or { })
    // derivation (
      removeAttrs env [
        "nativeBuildInputs"
        "passthru"
      ]
      // {
        inherit name;
        system = builtins.currentSystem;
        builder = "${busybox}/bin/busybox";
        args = [
          "sh"
          "-euc"
          ''
            busybox mkdir "$TMPDIR/busybox"
            busybox --install -s "$TMPDIR/busybox"
            export PATH="$PATH:$TMPDIR/busybox"
            ${script}
          ''
        ];
        PATH = builtins.concatStringsSep ":" (
          map (p: "${p}/bin") ((env.nativeBuildInputs or [ ]) ++ stdenvPath)
        );
      }
    );
}
