# A recording stand-in for nixpkgs, for evaluating the flake offline.  Every builder named in
# ./api.nix checks its arguments against that one list (unknown, missing or forbidden names
# throw, as they do in nixpkgs) and returns a fake derivation that records the call under `stub`:
#   { type = "derivation"; name; outPath; stub = { builder; args; }; ... }
# so a test can read back what the flake passed (base digest, layer order, entrypoint, labels).
# Store names are the ones nixpkgs computes (a fetched wheel is <hash>-<its file name>), so code
# that depends on a name sees the name it will see in nixpkgs.
# Packages that are only referenced (python3, gnupatch, nix, ...) are plain fake derivations;
# an attribute that nixpkgs does not have here fails as it would in nixpkgs.
{
  system ? "aarch64-linux",
}:
let
  api = import ./api.nix;
  inherit (builtins)
    attrNames
    attrValues
    concatLists
    concatStringsSep
    elem
    filter
    head
    length
    match
    ;

  # what stdenv.mkDerivation reads; other (environment) names must start with a capital
  drvAttrs = concatLists (attrValues api.mkDerivation);
  isEnvVar = n: match "[A-Z][A-Z0-9_]*" n != null;
  # a name of a oneOf group counts when it has a value (nixpkgs' defaults are "" and [ ])
  given =
    args: n:
    args ? ${n}
    && !(elem args.${n} [
      ""
      [ ]
      null
    ]);

  check =
    builder: args:
    let
      spec = api.${builder};
      names = attrNames args;
      known = spec.required ++ spec.optional ++ concatLists (attrValues (spec.formats or { }));
      unknown = filter (n: !(elem n known) && !(spec.open && (elem n drvAttrs || isEnvVar n))) names;
      missing = filter (n: !(elem n names)) spec.required;
      groups = filter (g: length (filter (given args) g) != 1) spec.oneOf;
      forbidden = filter (n: elem n names) (attrNames (spec.forbidden or { }));
    in
    if forbidden != [ ] then
      let
        n = head forbidden;
      in
      throw "nixpkgs stand-in: ${builder}: ${n}: ${spec.forbidden.${n}}"
    else if unknown != [ ] then
      throw "nixpkgs stand-in: ${builder} does not accept ${concatStringsSep ", " unknown}"
    else if missing != [ ] then
      throw "nixpkgs stand-in: ${builder} requires ${concatStringsSep ", " missing}"
    else if groups != [ ] then
      throw "nixpkgs stand-in: ${builder} needs exactly one of ${concatStringsSep " / " (head groups)}"
    else
      args;

  # stdenv.mkDerivation takes any attribute; the stand-in takes the ones it reads and variables
  checkDrv =
    builder: args:
    let
      unknown = filter (n: !(elem n drvAttrs) && !(isEnvVar n)) (attrNames args);
    in
    if unknown != [ ] then
      throw "nixpkgs stand-in: ${builder} does not accept ${concatStringsSep ", " unknown} (not an attribute stdenv reads, nor an environment variable)"
    else
      args;

  # 32 characters of the Nix base-32 alphabet (which has no e, o, u, t), so fake paths parse as store paths
  hash =
    s:
    builtins.replaceStrings [ "e" ] [ "z" ] (builtins.substring 0 32 (builtins.hashString "sha256" s));
  # what a derivation's inputs are, as data: a dependency by its drvPath, a function by nothing
  inputs =
    v:
    if builtins.isFunction v then
      "<function>"
    else if builtins.isList v then
      map inputs v
    else if builtins.isAttrs v then
      (
        if v ? drvPath then
          v.drvPath
        else if v ? outPath then
          toString v.outPath
        else
          builtins.mapAttrs (_: inputs) v
      )
    else
      v;
  fake =
    builder: name: args: extra:
    let
      self = {
        type = "derivation";
        inherit name system;
        # like a real derivation, its paths force every argument (a misspelt attribute deep in a
        # list fails when the derivation is instantiated, not only when that element is read)
        outPath = builtins.deepSeq args "/nix/store/${hash "${builder}|${name}|${builtins.toJSON (attrNames args)}"}-${name}";
        # as a real .drv path, it changes with every input (a dependency by its own drvPath);
        # passthru is not an input
        drvPath = "/nix/store/${hash "drv|${builder}|${name}|${builtins.toJSON (inputs (removeAttrs args [ "passthru" ]))}"}-${name}.drv";
        outputs = [ "out" ];
        out = self;
        stub = { inherit builder args; };
        meta = args.meta or { };
        passthru = args.passthru or { };
      }
      // (args.passthru or { })
      // extra;
    in
    self;
  pkg = name: fake "package" name { } { };
  # call a checked builder
  call =
    builder: name: args: extra:
    fake builder name (check builder args) extra;

  lib = import ./lib.nix;

  # the store name nixpkgs' fetchurl gives: pname-version, else name, else the URL's basename
  fetchurlName =
    args:
    if args ? pname && args ? version then
      "${args.pname}-${args.version}"
    else
      args.name or (baseNameOf (args.url or (head args.urls)));
  fetchurl =
    args:
    let
      a = check "fetchurl" args;
    in
    if a ? outputHash && !(a ? outputHashAlgo) then
      throw "nixpkgs stand-in: fetchurl was passed outputHash without outputHashAlgo"
    else
      fake "fetchurl" (fetchurlName a) a { url = a.url or (head a.urls); };

  # fetchPypi's URL builders (no `...`): the file name, and so the store name, of what it fetches
  pypiFile = {
    wheel =
      {
        pname,
        version,
        abi ? "none",
        dist ? "py2.py3",
        platform ? "any",
        python ? "py2.py3",
      }:
      "${pname}-${version}-${python}-${abi}-${platform}.whl";
    setuptools =
      {
        pname,
        version,
        extension ? "tar.gz",
      }:
      "${pname}-${version}.${extension}";
  };
  fetchPypi =
    args:
    let
      spec = api."python3Packages.fetchPypi";
      format = args.format or "setuptools";
      # what the outer function keeps; the rest goes to the format's URL builder
      urlArgs = removeAttrs args spec.optional;
      unknown = filter (n: !(elem n (spec.required ++ spec.formats.${format}))) (attrNames urlArgs);
    in
    if !(spec.formats ? ${format}) then
      throw "nixpkgs stand-in: python3Packages.fetchPypi: Unsupported format ${format}"
    else if unknown != [ ] then
      throw "nixpkgs stand-in: python3Packages.fetchPypi (format ${format}) does not accept ${concatStringsSep ", " unknown}"
    else
      call "python3Packages.fetchPypi" (pypiFile.${format} urlArgs) args { };

  # a Python package of nixpkgs at the pin, with the version its file has
  pyPkg =
    pname: version:
    fake "package" "python3.13-${pname}-${version}" { } {
      inherit pname version;
    };
  python3Packages = {
    inherit fetchPypi;
    buildPythonApplication =
      args: call "python3Packages.buildPythonApplication" "${args.pname}-${args.version}" args { };
  }
  # the versions of tp4's dependencies at the pin: the `version` line of
  # pkgs/development/python-modules/<name>/default.nix in Swarsel/nixpkgs@4aa6836a (a copy of the
  # 26.05 cycle; efa48718 itself is not stored), docs/build.md "Python at the pin"
  // builtins.mapAttrs pyPkg {
    poetry-core = "2.4.0"; # poetry-core/default.nix
    pydantic = "2.13.4"; # pydantic/default.nix
    click = "8.3.3"; # click/default.nix
    requests = "2.34.2"; # requests/default.nix
    gitpython = "3.1.50"; # gitpython/default.nix
    huggingface-hub = "1.10.2"; # huggingface-hub/default.nix
    httpx = "0.28.1"; # httpx/default.nix
    matplotlib = "3.11.0"; # matplotlib/default.nix
    jsonschema = "4.26.0"; # jsonschema/default.nix
  }
  # the dev group (the test Python only; their versions are not checked)
  // lib.genAttrs [
    "installer"
    "pytest"
    "hypothesis"
    "ruff"
    "mypy"
    "types-requests"
  ] pkg;

  # CPython as pkgs/development/interpreters/python/default.nix (Swarsel/nixpkgs@4aa6836a) builds
  # it: python313 is 3.13.14 (its sourceVersion); python3 is 3.14.6, the version of
  # `sources.python314` that python3Minimal, the minimal python3, is built from
  cpython =
    version: short:
    let
      name = "python3-${version}";
    in
    pkg name
    // {
      inherit version;
      pkgs = python3Packages;
      pythonVersion = short;
      interpreter = "/nix/store/${hash name}-${name}/bin/python3";
      withPackages = f: fake "python3.withPackages" "${name}-env" { packages = f python3Packages; } { };
    };
  python3 = cpython "3.14.6" "3.14";
  python313 = cpython "3.13.14" "3.13";

  mkDerivation =
    builder: args:
    let
      a = if builtins.isFunction args then args a else args;
    in
    fake builder (a.name or "${a.pname}-${a.version}") (checkDrv builder a) { };

  stdenv = {
    mkDerivation = mkDerivation "stdenv.mkDerivation";
    cc = pkg "gcc-wrapper";
    hostPlatform = { inherit system; };
  };

  busybox = pkg "busybox-1.37.0";
  # nixfmt-tree is treefmt configured for nixfmt; `check project` is treefmt's check wrapper
  # (pkgs/by-name/tr/treefmt/check-wrapper.nix): the tree is formatted, else the build fails
  nixfmt-tree = pkg "nixfmt-tree" // {
    check = project: fake "nixfmt-tree.check" "nixfmt-tree-check" { inherit project; } { };
  };
in
lib.genAttrs [
  "gnupatch"
  "coreutils"
  "patchelf"
  "nix"
  "podman"
  "skopeo"
  "umoci"
  "openssh"
  "iproute2"
  "git"
  "gnutar"
  "gzip"
  "nixfmt"
  "nix-output-monitor"
  "bashInteractive"
  "ruff"
] pkg
// {
  inherit
    lib
    system
    stdenv
    fetchurl
    python3
    python313
    python3Packages
    busybox
    nixfmt-tree
    ;
  pkgsStatic = {
    busybox = pkg "busybox-static-x86_64-unknown-linux-musl-1.37.0";
  };
  stdenvNoCC = stdenv // {
    mkDerivation = mkDerivation "stdenvNoCC.mkDerivation";
  };
  runCommand =
    name: env: script:
    fake "runCommand" name (checkDrv "runCommand" (env // { buildCommand = script; })) { };
  writeText = name: text: fake "writeText" name { inherit text; } { };
  # pkgs/build-support/trivial-builders: an executable #!runtimeShell script
  writeShellScript = name: text: fake "writeShellScript" name { inherit text; } { };
  mkShell = args: call "mkShell" (args.name or "nix-shell") args { };
  # a test module (here: an attrset) checked against the test options; the nodes are NixOS
  # modules (a function, an attrset or a path), the test script a string or a function of the
  # nodes (nixos/lib/testing/testScript.nix: `either str (functionTo str)`)
  testers.runNixOSTest =
    test:
    let
      spec = api."testers.runNixOSTest";
      t =
        if builtins.isAttrs test then
          check "testers.runNixOSTest" test
        else
          throw "nixpkgs stand-in: testers.runNixOSTest: the stand-in takes a test module as an attrset";
      badNode = filter (n: !(elem n spec.node)) (attrNames (t.node or { }));
      isModule = m: builtins.isFunction m || builtins.isAttrs m || builtins.isPath m;
      badNodes = filter (n: !(isModule t.nodes.${n})) (attrNames t.nodes);
    in
    if !(builtins.isString t.name) then
      throw "nixpkgs stand-in: testers.runNixOSTest: name must be a string"
    else if !(builtins.isAttrs t.nodes) || t.nodes == { } then
      throw "nixpkgs stand-in: testers.runNixOSTest: nodes must name at least one NixOS module"
    else if badNodes != [ ] then
      throw "nixpkgs stand-in: testers.runNixOSTest: nodes.${head badNodes} is not a NixOS module"
    else if !(builtins.isString t.testScript || builtins.isFunction t.testScript) then
      throw "nixpkgs stand-in: testers.runNixOSTest: testScript must be a string or a function of the nodes"
    else if badNode != [ ] then
      throw "nixpkgs stand-in: testers.runNixOSTest does not accept node.${concatStringsSep ", node." badNode}"
    else
      fake "testers.runNixOSTest" "vm-test-run-${t.name}" t { };
  dockerTools = {
    pullImage =
      args:
      let
        a = check "dockerTools.pullImage" args;
        fix = builtins.replaceStrings [ "/" ":" ] [ "-" "-" ];
      in
      fake "dockerTools.pullImage" (a.name
        or (fix "docker-image-${a.finalImageName or a.imageName}-${a.finalImageTag or "latest"}.tar")
      ) a { };
    streamLayeredImage =
      args:
      call "dockerTools.streamLayeredImage" "stream-${baseNameOf args.name}" args {
        imageName = args.name;
        # nixpkgs derives the tag of `tag = null` from the output hash of the image's config
        # (pkgs/build-support/docker/default.nix), which a stand-in cannot compute: refused
        imageTag =
          if args.tag or null == null then
            throw "stand-in: streamLayeredImage with tag = null derives its tag from a hash the stand-in cannot compute; pass a tag"
          else
            args.tag;
        isExe = true;
      };
  };
}
