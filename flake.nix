{
  description = "tp4: DeepSeek-V4.1-Flash on four DGX Sparks at TP4 (image, CLI, pinned sources)";

  inputs = {
    # the revision graham33/nixos-dgx-spark runs DGX Sparks with (CUDA 13.2)
    nixpkgs.url = "github:NixOS/nixpkgs/efa487181cc01970ebb09ed193fa71dfe94784b1";
    nixos-dgx-spark = {
      url = "github:graham33/nixos-dgx-spark/f1ebf94a047a16d40f3ff811961574b92d9c4e1e";
      flake = false;
    };
  };

  outputs =
    {
      self,
      nixpkgs,
      nixos-dgx-spark,
    }:
    import ./pkgs/outputs.nix { inherit self nixpkgs nixos-dgx-spark; };
}
