# The ONE list of argument names the nixpkgs builders accept, as recorded in
# shared/spec/nixpkgs-api.md (the current, 26.05-cycle column).  The stand-in (./default.nix)
# checks every call against it:
#   required  names that must be given
#   oneOf     groups of which exactly one name must be given
#   optional  names that may be given
#   open      true when the real function has `...`; the stand-in then still only lets through
#             the attributes stdenv.mkDerivation and the Python hooks read (`mkDerivation` below),
#             so a misspelt name fails here instead of becoming a silent environment variable
#   forbidden names the real function rejects with a message
{
  # Attributes of stdenv.mkDerivation (and the Python hooks) that builders with `...` pass on.
  mkDerivation = [
    "pname" "version" "name" "src" "srcs" "sourceRoot" "unpackPhase" "patches" "postPatch"
    "preBuild" "buildPhase" "postBuild" "installPhase" "preInstall" "postInstall" "fixupPhase"
    "postFixup" "dontUnpack" "dontBuild" "dontConfigure" "dontFixup" "dontStrip" "passthru" "meta"
    "nativeBuildInputs" "buildInputs" "propagatedBuildInputs" "outputs" "env" "strictDeps"
    "allowedReferences" "disallowedReferences" "allowedRequisites" "preferLocalBuild"
    "allowSubstitutes" "pythonImportsCheck" "pythonRelaxDeps" "pythonRemoveDeps" "disabledTests"
    "disabledTestPaths" "pytestFlags" "enabledTests" "enabledTestPaths" "installCheckPhase"
    "doInstallCheck" "checkPhase" "doCheck" "buildCommand" "dontPatchShebangs"
  ];

  # §2.1 pkgs/build-support/fetchurl (no `...`)
  fetchurl = {
    required = [ ];
    optional = [
      "curlOpts" "curlOptsList" "derivationArgs" "downloadToTemp" "executable" "hash" "meta" "name"
      "nativeBuildInputs" "netrcImpureEnvVars" "netrcPhase" "outputHash" "outputHashAlgo" "passthru"
      "pname" "postFetch" "preferLocalBuild" "recursiveHash" "sha1" "sha256" "sha512" "showURLs"
      "url" "urls" "version"
    ];
    oneOf = [ [ "url" "urls" ] ];
    open = false;
  };

  # §2.2 fetchzip (`...` goes to fetchurl)
  fetchzip = {
    required = [ ];
    optional = [
      "derivationArgs" "extension" "extraPostFetch" "name" "nativeBuildInputs" "postFetch"
      "stripRoot" "url" "urls"
    ];
    oneOf = [ [ "url" "urls" ] ];
    open = true;
  };

  # §2.4 fetchPypi with format = "wheel": the outer names plus the wheel URL builder's (no `...`)
  "python3Packages.fetchPypi" = {
    required = [ "pname" "version" ];
    optional = [ "format" "hash" "sha256" "abi" "dist" "platform" "python" "extension" ];
    oneOf = [ ];
    open = false;
  };

  # §1.1 dockerTools.pullImage (no `...`; exactly one of hash / sha256)
  "dockerTools.pullImage" = {
    required = [ "imageName" "imageDigest" ];
    optional = [ "arch" "finalImageName" "finalImageTag" "hash" "name" "os" "sha256" "tlsVerify" ];
    oneOf = [ [ "hash" "sha256" ] ];
    open = false;
  };

  # §1.4 dockerTools.streamLayeredImage (no `...`; `compressor` is NOT accepted)
  "dockerTools.streamLayeredImage" = {
    required = [ "name" ];
    optional = [
      "architecture" "config" "contents" "created" "debug" "enableFakechroot" "extraCommands"
      "fakeRootCommands" "fromImage" "gid" "gname" "includeNixDB" "includeStorePaths"
      "layeringPipeline" "maxLayers" "meta" "mtime" "passthru" "tag" "uid" "uname"
    ];
    oneOf = [ ];
    open = false;
  };

  # §3 buildPythonApplication (all optional, `...`; one of pyproject / format must be set)
  "python3Packages.buildPythonApplication" = {
    required = [ ];
    optional = [
      "build-system" "buildInputs" "catchConflicts" "checkInputs" "dependencies" "disabled"
      "doCheck" "dontUsePipInstall" "dontWrapPythonPrograms" "format" "makeWrapperArgs" "meta"
      "nativeBuildInputs" "nativeCheckInputs" "optional-dependencies" "outputs" "permitUserSite"
      "propagatedBuildInputs" "pyproject" "pythonPath" "removeBinBytecode" "strictDeps"
    ];
    oneOf = [ [ "pyproject" "format" ] ];
    open = true;
    forbidden = {
      pytestFlagsArray = "use pytestFlags or (enabled|disabled)(TestPaths|Tests|TestMarks)";
      stdenv = "pass stdenv through buildPythonPackage.override";
    };
  };
}
