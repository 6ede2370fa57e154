# The stand-in as a flake with no inputs, for `--override-input nixpkgs path:tests/nixpkgs-stub`.
# Its lib has nixpkgs' flake-level nixosSystem as a recorder: NixOS cannot be evaluated here, so
# it checks its argument names (nixos/lib/eval-config.nix's) and records them under `stub`, with a
# fake config.system.build.toplevel (what `nix flake check` reads).
{
  outputs = _: {
    lib = import ./lib.nix // {
      nixosSystem =
        args:
        let
          # nixos/lib/eval-config.nix lines 11-75 (read at NixOS/nixpkgs 02aa3c00); extraArgs, which
          # it still takes with a deprecation warning, is refused here on purpose: tp4 must not use it
          known = [
            "baseModules"
            "check"
            "extraModules"
            "lib"
            "modules"
            "modulesLocation"
            "pkgs"
            "prefix"
            "specialArgs"
            "system"
          ];
          unknown = builtins.filter (n: !(builtins.elem n known)) (builtins.attrNames args);
          name = "nixos-system-stand-in";
        in
        if unknown != [ ] then
          throw "nixpkgs stand-in: nixosSystem does not accept ${builtins.concatStringsSep ", " unknown}"
        else if !(args ? modules) then
          throw "nixpkgs stand-in: nixosSystem requires modules"
        else
          {
            _type = "configuration";
            stub = {
              builder = "nixosSystem";
              inherit args;
            };
            # a marker, not a real store path: the all-zero hash says no system was built
            config.system.build.toplevel = {
              type = "derivation";
              inherit name;
              outPath = "/nix/store/0000000000000000000000000000000a-${name}";
              drvPath = "/nix/store/0000000000000000000000000000000a-${name}.drv";
            };
          };
    };
    legacyPackages = {
      aarch64-linux = import ./default.nix { system = "aarch64-linux"; };
      x86_64-linux = import ./default.nix { system = "x86_64-linux"; };
    };
  };
}
