# The tp4 CLI, packaged from the same Poetry pyproject.toml the venv uses, with nixpkgs'
# buildPythonApplication (PEP 517 through poetry-core).  poetry2nix would read the same file but
# is unmaintained (its README says so), and every dependency here is already in nixpkgs.
# The tools tp4 calls are appended to PATH, so the closure is complete while a newer nix or
# podman installed on the host still wins.
# The interpreter is nixpkgs' python313, not python3: at the pin python3 is 3.14, outside
# pyproject's `python` bound.  Every bound of pyproject's dependencies is checked against the
# versions nixpkgs packages at evaluation (pkgs/python-bounds.nix); a mismatch stops the build
# with the list (docs/build.md, "Python at the pin").
{ pkgs, src }:
let
  inherit (pkgs) lib;
  python = pkgs.python313;
  python3Packages = python.pkgs;
  bounds = import ./python-bounds.nix;
  pyproject = builtins.fromTOML (builtins.readFile (src.root + "/python/pyproject.toml"));
  names = table: builtins.filter (n: n != "python") (builtins.attrNames table);
  # a Poetry dependency table as python3Packages (whose names are Poetry's, lower case)
  packagesOf = table: map (n: python3Packages.${n}) (names table);
  runtime = pyproject.tool.poetry.dependencies;
  dependencies = packagesOf runtime;
  outside = bounds.mismatches (
    [
      {
        name = "python";
        inherit (python) version;
        constraint = runtime.python;
        where = "pkgs.python313";
      }
    ]
    ++ map (n: {
      name = n;
      inherit (python3Packages.${n}) version;
      constraint = bounds.constraintOf runtime.${n};
      where = "pkgs.python313Packages.${n}";
    }) (names runtime)
  );
in
if outside != [ ] then
  throw (bounds.message outside)
else
  python3Packages.buildPythonApplication {
    pname = "tp4";
    inherit (pyproject.tool.poetry) version;
    pyproject = true;
    src = src.cli;
    sourceRoot = "${src.cliName}/python";
    build-system = [ python3Packages.poetry-core ];
    inherit dependencies;
    makeWrapperArgs = [
      "--suffix"
      "PATH"
      ":"
      (lib.makeBinPath [
        pkgs.nix
        pkgs.openssh
        pkgs.gnupatch
        pkgs.podman
        pkgs.skopeo
      ])
    ];
    # the unit tests run in checks.unit; the rest needs netns hosts, sshd and a nix daemon (CI)
    doCheck = false;
    # the Python the tests run with (the unit check, the dev shell): tp4's dependencies and its
    # Poetry dev group (pytest, hypothesis, ruff, mypy, installer)
    passthru.testPython = python.withPackages (
      _: dependencies ++ packagesOf pyproject.tool.poetry.group.dev.dependencies
    );
    pythonImportsCheck = [
      "tp4"
      "tp4.cli"
      "tp4.image.sources"
    ];
    meta = {
      description = (pyproject.tool.poetry).description;
      license = lib.licenses.asl20;
      mainProgram = "tp4";
      platforms = lib.platforms.linux;
    };
  }
