# The tp4 CLI, packaged from the same Poetry pyproject.toml the venv uses, with nixpkgs'
# buildPythonApplication (PEP 517 through poetry-core).  poetry2nix would read the same file but
# is unmaintained (its README says so), and every dependency here is already in nixpkgs.
# The tools tp4 calls are appended to PATH, so the closure is complete while a newer nix or
# podman installed on the host still wins.
{ pkgs, src }:
let
  inherit (pkgs) lib python3Packages;
  pyproject = builtins.fromTOML (builtins.readFile (src.root + "/python/pyproject.toml"));
  # a Poetry dependency table as python3Packages (whose names are Poetry's, lower case)
  packagesOf =
    table:
    map (n: python3Packages.${n}) (builtins.filter (n: n != "python") (builtins.attrNames table));
  dependencies = packagesOf pyproject.tool.poetry.dependencies;
in
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
  passthru.testPython = pkgs.python3.withPackages (
    _: dependencies ++ packagesOf pyproject.tool.poetry.group.dev.dependencies
  );
  pythonImportsCheck = [
    "tp4"
    "tp4.cli"
    "tp4.sources"
  ];
  meta = {
    description = (pyproject.tool.poetry).description;
    license = lib.licenses.asl20;
    mainProgram = "tp4";
    platforms = lib.platforms.linux;
  };
}
