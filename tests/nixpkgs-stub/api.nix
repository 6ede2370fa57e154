# The ONE list of the argument names the nixpkgs builders we call accept, each with the nixpkgs
# file it is read from and where it was read (`read`: shared/spec/nixpkgs-api.md, or a copy of
# nixpkgs of the pinned revision's cycle).  The stand-in (./default.nix) checks every call
# against it, so an argument nixpkgs does not take fails evaluation here as it does there:
#   required  names that must be given
#   optional  names that may be given
#   oneOf     groups of which exactly one name must be given (a non-empty value)
#   open      true when the real function has `...` and hands the rest to stdenv.mkDerivation:
#             the stand-in then lets through only the attributes listed in `mkDerivation`
#             (so a misspelt name fails here instead of becoming a silent environment variable)
#   forbidden names the real function rejects, with its message
{
  # Attributes stdenv.mkDerivation, its setup script and the hooks we use read, by file.  Any
  # other attribute of a derivation is an environment variable of its build; the stand-in allows
  # those only when they start with a capital letter (PYTHONPATH, TP4_TEST_BUSYBOX).
  mkDerivation = {
    "pkgs/stdenv/generic/make-derivation.nix" = [
      "allowSubstitutes"
      "allowedReferences"
      "allowedRequisites"
      "buildInputs"
      "disallowedReferences"
      "doCheck"
      "doInstallCheck"
      "env"
      "meta"
      "name"
      "nativeBuildInputs"
      "outputs"
      "passthru"
      "pname"
      "preferLocalBuild"
      "propagatedBuildInputs"
      "strictDeps"
      "version"
    ];
    "pkgs/stdenv/generic/setup.sh" = [
      "buildCommand"
      "buildPhase"
      "checkPhase"
      "dontBuild"
      "dontConfigure"
      "dontFixup"
      "dontUnpack"
      "fixupPhase"
      "installCheckPhase"
      "installPhase"
      "patches"
      "phases"
      "postBuild"
      "postFixup"
      "postInstall"
      "postPatch"
      "preBuild"
      "preInstall"
      "shellHook"
      "sourceRoot"
      "src"
      "srcs"
      "unpackPhase"
    ];
    # read by Nix itself (the manual's "Advanced Attributes"); closureInfo passes it through
    # stdenv.mkDerivation
    "pkgs/build-support/closure-info.nix" = [ "exportReferencesGraph" ];
    "pkgs/build-support/setup-hooks/strip.sh" = [ "dontStrip" ];
    "pkgs/build-support/setup-hooks/patch-shebangs.sh" = [ "dontPatchShebangs" ];
    "pkgs/development/interpreters/python/hooks/python-imports-check-hook.sh" = [
      "pythonImportsCheck"
    ];
  };

  fetchurl = {
    file = "pkgs/build-support/fetchurl/default.nix";
    read = "nixpkgs-api.md §2.1";
    required = [ ];
    optional = [
      "curlOpts"
      "curlOptsList"
      "derivationArgs"
      "downloadToTemp"
      "executable"
      "hash"
      "meta"
      "name"
      "nativeBuildInputs"
      "netrcImpureEnvVars"
      "netrcPhase"
      "outputHash"
      "outputHashAlgo"
      "passthru"
      "pname"
      "postFetch"
      "preferLocalBuild"
      "recursiveHash"
      "sha1"
      "sha256"
      "sha512"
      "showURLs"
      "url"
      "urls"
      "version"
    ];
    # nixpkgs falls back to lib.fakeHash without a hash, so the build can only fail: the
    # stand-in fails at evaluation instead
    oneOf = [
      [
        "url"
        "urls"
      ]
      [
        "hash"
        "outputHash"
        "sha1"
        "sha256"
        "sha512"
      ]
    ];
    open = false;
  };

  # Its outer pattern ends in `...`; the rest goes to the URL builder of the format, which has
  # no `...`: `formats` lists each builder's names, and any other format throws.
  "python3Packages.fetchPypi" = {
    file = "pkgs/build-support/fetchpypi/default.nix";
    read = "nixpkgs-api.md §2.4";
    required = [
      "pname"
      "version"
    ];
    optional = [
      "format"
      "hash"
      "sha256"
    ];
    # as for fetchurl, which it calls with both
    oneOf = [
      [
        "hash"
        "sha256"
      ]
    ];
    open = false;
    formats = {
      wheel = [
        "abi"
        "dist"
        "platform"
        "python"
      ];
      setuptools = [ "extension" ];
    };
  };

  "dockerTools.pullImage" = {
    file = "pkgs/build-support/docker/default.nix";
    read = "nixpkgs-api.md §1.1";
    required = [
      "imageName"
      "imageDigest"
    ];
    optional = [
      "arch"
      "finalImageName"
      "finalImageTag"
      "hash"
      "name"
      "os"
      "sha256"
      "tlsVerify"
    ];
    oneOf = [
      [
        "hash"
        "sha256"
      ]
    ];
    open = false;
  };

  # `compressor` is NOT accepted (only buildImage / buildLayeredImage take it)
  "dockerTools.streamLayeredImage" = {
    file = "pkgs/build-support/docker/default.nix";
    read = "nixpkgs-api.md §1.4";
    required = [ "name" ];
    optional = [
      "architecture"
      "config"
      "contents"
      "created"
      "debug"
      "enableFakechroot"
      "extraCommands"
      "fakeRootCommands"
      "fromImage"
      "gid"
      "gname"
      "includeNixDB"
      "includeStorePaths"
      "layeringPipeline"
      "maxLayers"
      "meta"
      "mtime"
      "passthru"
      "tag"
      "uid"
      "uname"
    ];
    oneOf = [ ];
    open = false;
  };

  # all optional, `...`; one of pyproject / format must be set
  "python3Packages.buildPythonApplication" = {
    file = "pkgs/development/interpreters/python/mk-python-derivation.nix";
    read = "nixpkgs-api.md §3";
    required = [ ];
    optional = [
      "build-system"
      "buildInputs"
      "catchConflicts"
      "checkInputs"
      "dependencies"
      "disabled"
      "doCheck"
      "dontUsePipInstall"
      "dontWrapPythonPrograms"
      "format"
      "makeWrapperArgs"
      "meta"
      "nativeBuildInputs"
      "nativeCheckInputs"
      "optional-dependencies"
      "outputs"
      "permitUserSite"
      "propagatedBuildInputs"
      "pyproject"
      "pythonPath"
      "removeBinBytecode"
      "strictDeps"
    ];
    oneOf = [
      [
        "pyproject"
        "format"
      ]
    ];
    open = true;
    forbidden = {
      pytestFlagsArray = "use pytestFlags or (enabled|disabled)(TestPaths|Tests|TestMarks)";
      stdenv = "pass stdenv through buildPythonPackage.override";
    };
  };

  # pkgs/build-support/testers/default.nix: runNixOSTest passes its argument, a test module, to
  # nixos/lib's runTest; these are the options of nixos/lib/testing/*.nix a test module may set.
  # `name` (name.nix) and `testScript` (testScript.nix) have no default; `nodes` (nodes.nix)
  # defaults to { }, which the stand-in refuses too: a VM test without a node tests nothing.
  # `node` is a set of its own options (nodes.nix: pkgs, pkgsReadOnly, specialArgs).
  "testers.runNixOSTest" = {
    file = "pkgs/build-support/testers/default.nix";
    # runNixOSTest read at 7b46e394; the options in nixos/lib/testing/nodes.nix at 003d5816,
    # name.nix at 127e5765, testScript.nix at 00f5ae06, driver.nix at 01fbdeef
    read = "NixOS/nixpkgs@7b46e394";
    required = [
      "name"
      "nodes"
      "testScript"
    ];
    # nodes.nix and driver.nix declare these; meta and passthru are the options driver.nix reads
    # (config.meta, config.passthru) and nodes.nix sets (passthru.nodes); imports is the module
    # system's
    optional = [
      "containerDefaults"
      "containers"
      "defaults"
      "enableOCR"
      "extraBaseModules"
      "extraBaseNodeModules"
      "extraDriverArgs"
      "extraPythonPackages"
      "globalTimeout"
      "hostPkgs"
      "imports"
      "logLevel"
      "meta"
      "node"
      "nodeDefaults"
      "passthru"
      "qemu"
      "skipLint"
      "skipTypeCheck"
      "sshBackdoor"
    ];
    oneOf = [ ];
    open = false;
    node = [
      "pkgs"
      "pkgsReadOnly"
      "specialArgs"
    ];
  };

  # lib.extendMkDerivation over stdenv.mkDerivation, `...`
  mkShell = {
    file = "pkgs/build-support/mkshell/default.nix";
    read = "Swarsel/nixpkgs@4aa6836a";
    required = [ ];
    optional = [
      "inputsFrom"
      "name"
      "packages"
    ];
    oneOf = [ ];
    open = true;
  };
}
