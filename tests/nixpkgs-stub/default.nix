# A recording stand-in for nixpkgs, for evaluating the flake offline.  Every builder named in
# ./api.nix checks its arguments against that one list (unknown, missing or forbidden names
# throw) and returns a fake derivation that records the call under `stub`:
#   { type = "derivation"; name; outPath; stub = { builder; args; }; ... }
# so a test can read back what the flake passed (base digest, layer order, entrypoint, labels).
# Packages that are only referenced (python3, gnupatch, nix, ...) are plain fake derivations;
# an attribute that nixpkgs does not have here fails as it would in nixpkgs.
{ system ? "aarch64-linux" }:
let
  api = import ./api.nix;
  inherit (builtins) attrNames elem filter length concatStringsSep;

  check =
    builder: args:
    let
      spec = api.${builder};
      given = attrNames args;
      known = spec.required ++ spec.optional;
      unknown = filter (n: !(elem n known) && !(spec.open && elem n api.mkDerivation)) given;
      missing = filter (n: !(elem n given)) spec.required;
      groups = filter (g: length (filter (n: elem n given) g) != 1) spec.oneOf;
      forbidden = filter (n: elem n given) (attrNames (spec.forbidden or { }));
    in
    if forbidden != [ ] then
      let n = builtins.head forbidden; in throw "nixpkgs stand-in: ${builder}: ${n}: ${spec.forbidden.${n}}"
    else if unknown != [ ] then
      throw "nixpkgs stand-in: ${builder} does not accept ${concatStringsSep ", " unknown}"
    else if missing != [ ] then
      throw "nixpkgs stand-in: ${builder} requires ${concatStringsSep ", " missing}"
    else if groups != [ ] then
      throw "nixpkgs stand-in: ${builder} needs exactly one of ${concatStringsSep " / " (builtins.head groups)}"
    else
      args;

  # 32 characters of the Nix base-32 alphabet (which has no e, o, u, t), so fake paths parse as store paths
  hash = s: builtins.replaceStrings [ "e" ] [ "z" ] (builtins.substring 0 32 (builtins.hashString "sha256" s));
  fake =
    builder: name: args: extra:
    let
      self = {
        type = "derivation";
        inherit name system;
        # like a real derivation, its paths force every argument (a misspelt attribute deep in a
        # list fails when the derivation is instantiated, not only when that element is read)
        outPath = builtins.deepSeq args "/nix/store/${hash "${builder}|${name}|${builtins.toJSON (attrNames args)}"}-${name}";
        drvPath = builtins.deepSeq args "/nix/store/${hash "drv|${builder}|${name}"}-${name}.drv";
        outputs = [ "out" ];
        out = self;
        stub = { inherit builder args; };
        meta = args.meta or { };
        passthru = args.passthru or { };
      } // (args.passthru or { }) // extra;
    in
    self;
  pkg = name: fake "package" name { } { };
  # call a checked builder
  call = builder: name: args: extra: fake builder name (check builder args) extra;

  lib = import ./lib.nix;

  fetchurl =
    args:
    call "fetchurl" (args.name or (baseNameOf (args.url or (builtins.head args.urls)))) args {
      url = args.url or (builtins.head args.urls);
    };

  python3Packages = {
    fetchPypi =
      args:
      call "python3Packages.fetchPypi" "${args.pname}-${args.version}${if (args.format or "") == "wheel" then ".whl" else ".tar.gz"}" args { };
    buildPythonApplication =
      args:
      call "python3Packages.buildPythonApplication" "${args.pname}-${args.version}" args { };
  } // lib.genAttrs [
    "poetry-core" "pydantic" "click" "requests" "gitpython" "installer" "pytest" "hypothesis"
  ] pkg;

  python3 = pkg "python3-3.13" // {
    pkgs = python3Packages;
    pythonVersion = "3.13";
    interpreter = "/nix/store/${hash "python3"}-python3-3.13/bin/python3";
    withPackages = f: fake "python3.withPackages" "python3-3.13-env" { packages = f python3Packages; } { };
  };

  mkDerivation =
    builder: args:
    let a = if builtins.isFunction args then args a else args;
    in fake builder (a.name or "${a.pname}-${a.version}") a { };

  stdenv = {
    mkDerivation = mkDerivation "stdenv.mkDerivation";
    cc = pkg "gcc-wrapper";
    hostPlatform = { inherit system; };
  };
in
lib.genAttrs [
  "gnupatch" "busybox" "coreutils" "patchelf" "nix" "podman" "skopeo" "umoci" "openssh"
  "iproute2" "git" "gnutar" "gzip" "nixfmt" "nix-output-monitor" "bashInteractive"
] pkg
// {
  inherit lib system stdenv fetchurl python3 python3Packages;
  stdenvNoCC = stdenv // { mkDerivation = mkDerivation "stdenvNoCC.mkDerivation"; };
  fetchzip = args: call "fetchzip" (args.name or "source") args { };
  runCommand = name: env: script: fake "runCommand" name (env // { buildCommand = script; }) { };
  writeText = name: text: fake "writeText" name { inherit text; } { };
  mkShell = args: fake "mkShell" "nix-shell" args { };
  dockerTools = {
    pullImage =
      args:
      let a = check "dockerTools.pullImage" args;
          fix = builtins.replaceStrings [ "/" ":" ] [ "-" "-" ];
      in fake "dockerTools.pullImage" (a.name or (fix "docker-image-${a.finalImageName or a.imageName}-${a.finalImageTag or "latest"}.tar")) a { };
    streamLayeredImage =
      args:
      call "dockerTools.streamLayeredImage" "stream-${baseNameOf args.name}" args {
        imageName = args.name;
        imageTag = if args.tag or null == null then "stub-tag" else args.tag;
        isExe = true;
      };
  };
}
