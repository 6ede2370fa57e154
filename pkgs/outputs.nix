# The flake's outputs, as a function of its inputs so tests can evaluate it with a stand-in for
# nixpkgs (tests/nixpkgs-stub).  The image and the runtime tree (a native librow_store.so) are
# aarch64-linux only; the CLI and the architecture-independent trees build on x86_64-linux too.
{
  self,
  nixpkgs,
  nixos-dgx-spark,
}:
let
  systems = [
    "aarch64-linux"
    "x86_64-linux"
  ];
  forAll =
    f:
    builtins.listToAttrs (
      map (system: {
        name = system;
        value = f system nixpkgs.legacyPackages.${system};
      }) systems
    );
  lineFor = forAll (system: pkgs: import ./default.nix { inherit pkgs self; });
  sparkOnly = system: attrs: if system == "aarch64-linux" then attrs else { };
  src = import ./src.nix { root = ../.; };

  # `packages` holds derivations only (what `nix flake check` wants); the per-component fetches
  # live in legacyPackages, which `nix build .#sources.<component>` finds the same way
  packages = forAll (
    system: pkgs:
    let
      l = lineFor.${system};
    in
    {
      inherit (l)
        tp4
        sglang-tree
        b12x
        b12x-next
        wheels
        ;
      default = l.tp4;
    }
    # the images of the registry's `[images.<variant>]` (image, image-canary, image-local)
    // sparkOnly system (l.images // { inherit (l) tp4-runtime; })
  );

  legacyPackages = forAll (system: pkgs: { inherit (lineFor.${system}) sources; });

  # `nix run .#serve -- [--profile FILE]` (default ./profile.toml) and the same for stop and status
  apps = forAll (
    system: pkgs:
    let
      tp4 = "${lineFor.${system}.tp4}/bin/tp4";
      command = name: description: {
        type = "app";
        program = "${pkgs.writeShellScript "tp4-${name}" ''exec ${tp4} ${name} "$@"''}";
        meta.description = description;
      };
    in
    {
      default = {
        type = "app";
        program = tp4;
        meta.description = "The tp4 CLI: build, deploy and serve the TP4 line";
      };
      serve = command "serve" "Start the TP4 line and prove it ready, or leave nothing running";
      stop = command "stop" "Stop every rank of the TP4 line";
      status = command "status" "The TP4 line's nodes and liveness";
    }
  );

  devShells = forAll (
    system: pkgs: {
      # what building tp4 needs, the Python the tests run with and the tools they drive; busybox
      # stays off PATH (its `ip` has no netns, its `patch` no --fuzz): the tests that build with
      # it find it through TP4_TEST_BUSYBOX (static: it also runs inside test images)
      default = pkgs.mkShell {
        inputsFrom = [ lineFor.${system}.tp4 ];
        packages = [
          lineFor.${system}.tp4.testPython
          pkgs.nix
          pkgs.openssh
          pkgs.podman
          pkgs.skopeo
          pkgs.umoci
          pkgs.iproute2
          pkgs.gnupatch
          pkgs.git
        ];
        env.TP4_TEST_BUSYBOX = "${pkgs.pkgsStatic.busybox}/bin/busybox";
      };
    }
  );

  formatter = forAll (system: pkgs: pkgs.nixfmt-tree);

  # NixOS: a DGX Spark host of the line (on nixos-dgx-spark's dgx-spark module) and its rank unit;
  # both render the plan with this flake's tp4 at build time (tp4.planFile), the tp4 of the build
  # platform (the plan is the same on every platform). The key: both modules import it, and the
  # module system then takes it once.
  withTp4 =
    { lib, pkgs, ... }:
    {
      key = "tp4/with-tp4";
      config.tp4.package = lib.mkDefault packages.${pkgs.stdenv.buildPlatform.system}.tp4;
    };
  nixosModules = rec {
    spark-host = {
      imports = [
        "${nixos-dgx-spark}/modules/dgx-spark.nix"
        ../modules/spark-host.nix
        withTp4
      ];
    };
    tp4-line = {
      imports = [
        ../modules/tp4-line.nix
        withTp4
      ];
    };
    default = {
      imports = [
        spark-host
        tp4-line
      ];
    };
    # the fleet's router as tp4-router.service (a fleet file with router.service = "unit")
    tp4-router = {
      imports = [
        ../modules/tp4-router.nix
        (
          { lib, pkgs, ... }:
          {
            config.tp4.router.package = lib.mkDefault packages.${pkgs.stdenv.buildPlatform.system}.tp4;
          }
        )
      ];
    };
  };

  # one NixOS system per node of a profile: the hosts and their addresses are the profile's
  # (builtins.fromTOML), each host's settings and rank unit come from modules/lib and the plan
  lineConfigurations =
    {
      profile,
      hostsFile ? null,
      modules ? [ ],
    }:
    builtins.listToAttrs (
      map (name: {
        inherit name;
        value = nixpkgs.lib.nixosSystem {
          modules = [
            nixosModules.default
            {
              networking.hostName = name;
              tp4 = {
                inherit profile hostsFile;
                node = name;
                host.enable = true;
                line.enable = true;
              };
            }
          ]
          ++ modules;
        };
      }) ((import ../modules/lib).hostNames (builtins.fromTOML (builtins.readFile profile)))
    );

  # the example line's four Sparks (examples/spark-line); `nix flake init -t .#spark-line` copies it
  example = ../examples/spark-line;
  nixosConfigurations = lineConfigurations {
    profile = example + "/profile.toml";
    hostsFile = example + "/hosts.toml";
    modules = [ (example + "/configuration.nix") ];
  };

  # checks of the NixOS outputs (aarch64-linux: the Sparks' system), for users with network:
  # nixos-<node> evaluates that node's whole system (its toplevel's .drv path, which renders the
  # plan at evaluation time) without building it, as nixos-dgx-spark's dgx-spark-eval does;
  # spark-host-vm boots spark-host in a VM (pkgs/spark-host-vm)
  nixosChecks =
    pkgs:
    builtins.listToAttrs (
      map (name: {
        name = "nixos-${name}";
        value = pkgs.writeText "tp4-nixos-${name}.drv-path" (
          builtins.unsafeDiscardStringContext nixosConfigurations.${name}.config.system.build.toplevel.drvPath
        );
      }) (builtins.attrNames nixosConfigurations)
    )
    // {
      spark-host-vm = import ./spark-host-vm { inherit pkgs nixosModules example; };
    };

  # every output a user builds or enters, as "<system>.<kind>.<name>" (for checks.eval); the
  # fetch of an unlocked source row throws, so this fails until every row is locked
  everything = builtins.listToAttrs (
    builtins.concatMap (
      system:
      let
        kinds = {
          packages = packages.${system};
          devShells = devShells.${system};
          sources = legacyPackages.${system}.sources;
          formatter.default = formatter.${system};
        };
      in
      builtins.concatMap (
        kind:
        map (name: {
          name = "${system}.${kind}.${name}";
          value = kinds.${kind}.${name};
        }) (builtins.attrNames kinds.${kind})
      ) (builtins.attrNames kinds)
    ) systems
  );
in
{
  inherit
    packages
    legacyPackages
    apps
    devShells
    formatter
    nixosModules
    ;

  lib = { inherit lineConfigurations; };

  inherit nixosConfigurations;

  templates.spark-line = {
    path = example;
    description = "Four DGX Sparks on NixOS running the TP4 line from one tp4 profile";
  };

  checks = forAll (
    system: pkgs:
    let
      l = lineFor.${system};
    in
    import ./checks.nix {
      inherit pkgs src;
      python = l.tp4.testPython;
      outputs = everything;
    }
    // {
      inherit (l)
        tp4
        sglang-tree
        b12x
        b12x-next
        ;
    }
    // sparkOnly system ({ inherit (l) image tp4-runtime; } // nixosChecks pkgs)
  );
}
