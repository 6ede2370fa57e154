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
    // sparkOnly system { inherit (l) image tp4-runtime; }
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
    ;

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
    // sparkOnly system { inherit (l) image tp4-runtime; }
  );
}
