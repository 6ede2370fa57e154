# The tp4 CLI, packaged from the same Poetry pyproject.toml the venv uses, with nixpkgs'
# buildPythonApplication (PEP 517 through poetry-core).  poetry2nix would read the same file but
# is unmaintained (its README says so), and every dependency here is already in nixpkgs.
# The tools tp4 calls are appended to PATH, so the closure is complete while a newer nix or
# podman installed on the host still wins.
{ pkgs, src }:
let
  inherit (pkgs) lib python3Packages;
  pyproject = builtins.fromTOML (builtins.readFile (src.root + "/python/pyproject.toml"));
in
python3Packages.buildPythonApplication {
  pname = "tp4";
  inherit (pyproject.tool.poetry) version;
  pyproject = true;
  src = src.cli;
  sourceRoot = "${src.cliName}/python";
  build-system = [ python3Packages.poetry-core ];
  dependencies = with python3Packages; [ pydantic click requests gitpython ];
  makeWrapperArgs = [
    "--suffix" "PATH" ":"
    (lib.makeBinPath [ pkgs.nix pkgs.openssh pkgs.gnupatch pkgs.podman pkgs.skopeo ])
  ];
  # the test suite needs netns hosts, sshd and a nix daemon: it runs in `checks` and CI, not here
  doCheck = false;
  pythonImportsCheck = [ "tp4" "tp4.cli" "tp4.sources" ];
  meta = {
    description = (pyproject.tool.poetry).description;
    license = lib.licenses.asl20;
    mainProgram = "tp4";
    platforms = lib.platforms.linux;
  };
}
