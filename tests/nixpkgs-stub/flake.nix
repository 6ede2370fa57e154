# The stand-in as a flake with no inputs, for `--override-input nixpkgs path:tests/nixpkgs-stub`.
{
  outputs = _: {
    lib = import ./lib.nix;
    legacyPackages = {
      aarch64-linux = import ./default.nix { system = "aarch64-linux"; };
      x86_64-linux = import ./default.nix { system = "x86_64-linux"; };
    };
  };
}
