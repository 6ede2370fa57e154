# The flake's outputs, as a function of its inputs so tests can evaluate it with a stand-in for
# nixpkgs (tests/nixpkgs-stub).  The image and the runtime tree (a native librow_store.so) are
# aarch64-linux only; the CLI and the architecture-independent trees build on x86_64-linux too.
{ self, nixpkgs, nixos-dgx-spark }:
let
  systems = [ "aarch64-linux" "x86_64-linux" ];
  forAll = f: builtins.listToAttrs (map (system: { name = system; value = f system nixpkgs.legacyPackages.${system}; }) systems);
  lineFor = forAll (system: pkgs: import ./default.nix { inherit pkgs self; });
  sparkOnly = system: attrs: if system == "aarch64-linux" then attrs else { };
in
{
  # `packages` holds derivations only (what `nix flake check` wants); the per-component fetches
  # live in legacyPackages, which `nix build .#sources.<component>` finds the same way
  packages = forAll (
    system: pkgs:
    let l = lineFor.${system};
    in
    {
      inherit (l) tp4 sglang-tree b12x b12x-next wheels;
      default = l.tp4;
    }
    // sparkOnly system { inherit (l) image tp4-runtime; }
  );

  legacyPackages = forAll (system: pkgs: { inherit (lineFor.${system}) sources; });

  apps = forAll (
    system: pkgs: {
      default = {
        type = "app";
        program = "${lineFor.${system}.tp4}/bin/tp4";
        meta.description = "The tp4 CLI: build, deploy and serve the TP4 line";
      };
    }
  );

  checks = forAll (
    system: pkgs:
    let l = lineFor.${system};
    in
    { inherit (l) tp4 sglang-tree b12x b12x-next; }
    // sparkOnly system { inherit (l) image tp4-runtime; }
  );

  devShells = forAll (
    system: pkgs: {
      default = pkgs.mkShell {
        packages = [
          (pkgs.python3.withPackages (ps: [
            ps.pydantic ps.click ps.requests ps.gitpython ps.pytest ps.hypothesis ps.poetry-core
          ]))
          pkgs.nix pkgs.busybox pkgs.openssh pkgs.podman pkgs.skopeo pkgs.umoci pkgs.iproute2
          pkgs.gnupatch pkgs.git
        ];
      };
    }
  );

  formatter = forAll (system: pkgs: pkgs.nixfmt);
}
