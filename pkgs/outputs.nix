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
  allPackages = forAll (
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

  # Which rows of sources.manifest each output needs (builtins only, nothing fetched). A row whose
  # sha256 needs the network stays `unlocked` until `tp4 sources lock` fills it in; an output that
  # needs one cannot be evaluated (pkgs/sources.nix throws the lock command), so until then it is
  # not in `packages` (which `nix flake check` evaluates) but in `legacyPackages` (which it skips,
  # and where `nix build .#image` still finds it and fails at once with that message), and it is
  # left out of `checks` (checks.sources-unlocked says so and prints the command).
  manifest = import ./sources.nix {
    manifest = ../python/tp4/data/sources.manifest;
    fetchurl = null;
  };
  line = import ./line.nix { inherit (manifest) rows; };
  treeRows = pkg: manifest.trees.${line.trees.${pkg}}.inputs;
  imageRows = [
    line.base
  ]
  ++ line.wheels
  ++ builtins.concatMap treeRows (builtins.attrNames line.trees);
  packageRows = {
    tp4 = [ ];
    default = [ ];
    wheels = line.wheels;
    sglang-tree = treeRows "sglang-tree";
    b12x = treeRows "b12x";
    b12x-next = treeRows "b12x-next";
    # the base row's glibc= is read from the manifest, not from the fetched image
    tp4-runtime = treeRows "runtime-tree";
  };
  # kind: packages, sources, devShells or formatter; a package not listed above (an image) needs
  # every row of the image
  needs =
    kind: name:
    if kind == "sources" then
      [ name ]
    else if kind == "packages" then
      packageRows.${name} or imageRows
    else
      [ ];
  isLocked = kind: name: builtins.all (r: manifest.byName.${r}.locked) (needs kind name);
  onlyLocked =
    kind: attrs:
    builtins.removeAttrs attrs (builtins.filter (n: !isLocked kind n) (builtins.attrNames attrs));
  onlyUnlocked =
    kind: attrs:
    builtins.removeAttrs attrs (builtins.filter (isLocked kind) (builtins.attrNames attrs));

  packages = builtins.mapAttrs (_: onlyLocked "packages") allPackages;
  legacyPackages = forAll (
    system: pkgs:
    { inherit (lineFor.${system}) sources; } // onlyUnlocked "packages" allPackages.${system}
  );

  # `nix run .#serve -- [--profile FILE]` (default ./profile.toml) and the same for up, stop and status
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
      up = command "up" "Doctor, image, distribute, prepare, serve and smoke the TP4 line from one plan";
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
  # both read the committed plan (tp4.planFile) and carry this flake's tp4, whose boot-log check
  # the rank's readiness unit runs. The key: both modules import it, and the module system then
  # takes it once.
  withTp4 =
    { lib, pkgs, ... }:
    {
      key = "tp4/with-tp4";
      config.tp4.package = lib.mkDefault packages.${pkgs.stdenv.hostPlatform.system}.tp4;
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

  # one NixOS system per node of the line's committed plan (`tp4 plan --json -o plan.json`): the
  # hosts are the plan's nodes, each host's settings and rank unit come from modules/lib reading
  # the plan. Nothing is built to evaluate them.
  # `hardware`: the hosts' own hardware-configuration.nix (their disks and boot modules, as
  # nixos-generate-config writes it; nixos-dgx-spark's templates/dgx-spark keeps one beside its
  # configuration.nix): a directory holding <host>/hardware-configuration.nix, or one module for
  # every host (the checks' test hardware). A host whose file is missing fails evaluation saying
  # how to make it: a system without it would mount disks the Spark does not have.
  hardwareOf =
    hardware: name:
    let
      rel = "${baseNameOf (toString hardware)}/${name}/hardware-configuration.nix";
      file = hardware + "/${name}/hardware-configuration.nix";
    in
    if hardware == null then
      throw "tp4.lib.lineConfigurations: ${name}: hardware is not set; fix: pass hardware = ./hardware (a directory of <host>/hardware-configuration.nix, as nixos-generate-config writes them) or a module with the host's fileSystems and boot settings"
    else if !(builtins.isPath hardware || builtins.isString hardware) then
      hardware
    else if builtins.pathExists file then
      file
    else
      throw "${name}: ${rel} does not exist: it holds this Spark's disks and boot modules. Fix: on ${name}, booted into NixOS (or nixos-dgx-spark's installer with the new system mounted at /mnt, then add --root /mnt), run `nixos-generate-config --show-hardware-config > hardware-configuration.nix`; copy the file to ${rel} next to flake.nix and `git add` it (a flake sees only files git knows)";
  lineConfigurations =
    {
      plan,
      hostsFile ? null,
      modules ? [ ],
      hardware ? null,
    }:
    builtins.listToAttrs (
      map (
        name:
        let
          hw = hardwareOf hardware name;
        in
        {
          inherit name;
          value = builtins.seq hw (
            nixpkgs.lib.nixosSystem {
              modules = [
                nixosModules.default
                {
                  networking.hostName = name;
                  tp4 = {
                    inherit hostsFile;
                    planFile = plan;
                    node = name;
                    host.enable = true;
                    line.enable = true;
                  };
                }
                hw
              ]
              ++ modules;
            }
          );
        }
      ) ((import ../modules/lib).hostNames (builtins.fromJSON (builtins.readFile plan)))
    );

  # per system, a check that the line's committed plan file is the one its profile renders (the
  # template's flake.nix puts it in its checks): `tp4 plan --check plan.json`
  planChecks =
    { profile, plan }:
    forAll (
      system: pkgs: {
        plan-current = import ./plan-check.nix {
          inherit pkgs;
          tp4 = "${packages.${system}.tp4}/bin/tp4";
        } { inherit profile plan; };
      }
    );

  # the example line's four Sparks (examples/spark-line); `nix flake init -t .#spark-line` copies it.
  # Its nixosConfigurations live in the line's own flake (the template's flake.nix), beside each
  # Spark's generated hardware-configuration.nix: this flake has none of its own, so `nix flake
  # check` of a fresh clone evaluates no host that lacks its hardware
  example = ../examples/spark-line;
  exampleLine = {
    plan = example + "/plan.json";
    hostsFile = example + "/hosts.toml";
    modules = [ (example + "/configuration.nix") ];
  };

  # what the checks evaluate instead: the same hosts on an explicit test hardware module (a disk
  # by a label no Spark has: evaluation only, never to be deployed) and a test key for the node
  # user (configuration.nix asks for the deploying user's key in authorized_keys)
  checkHardware = {
    fileSystems."/" = {
      device = "/dev/disk/by-label/tp4-check-root";
      fsType = "ext4";
    };
    fileSystems."/boot" = {
      device = "/dev/disk/by-label/tp4-check-boot";
      fsType = "vfat";
    };
    boot.initrd.availableKernelModules = [
      "nvme"
      "usb_storage"
      "usbhid"
    ];
  };
  checkKey =
    { lib, ... }:
    {
      users.users.tp4.openssh.authorizedKeys.keys = lib.mkForce [
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHRwNC1jaGVjay1vbmx5LW5vdC1hLXJlYWwta2V5 tp4-check"
      ];
    };
  checkConfigurations = lineConfigurations (
    exampleLine
    // {
      hardware = checkHardware;
      modules = exampleLine.modules ++ [ checkKey ];
    }
  );

  # checks of the NixOS outputs (aarch64-linux: the Sparks' system), for users with network:
  # nixos-<node> evaluates that node's whole system on the test hardware (its toplevel's .drv
  # path; evaluation reads the committed plan and builds nothing) without building it, as nixos-dgx-spark's
  # dgx-spark-eval does; spark-host-vm boots spark-host in a VM (pkgs/spark-host-vm)
  nixosChecks =
    pkgs:
    builtins.listToAttrs (
      map (name: {
        name = "nixos-${name}";
        value = pkgs.writeText "tp4-nixos-${name}.drv-path" (
          builtins.unsafeDiscardStringContext checkConfigurations.${name}.config.system.build.toplevel.drvPath
        );
      }) (builtins.attrNames checkConfigurations)
    )
    // {
      spark-host-vm = import ./spark-host-vm { inherit pkgs nixosModules example; };
    };

  # every output a user builds or enters, as "<system>.<kind>.<name>" (for checks.eval), with the
  # rows it needs; `checkable` holds those whose rows are all locked, `leftOut` the names of the rest
  outputList = builtins.concatMap (
    system:
    let
      kinds = {
        packages = allPackages.${system};
        devShells = devShells.${system};
        sources = lineFor.${system}.sources;
        formatter.default = formatter.${system};
      };
    in
    builtins.concatMap (
      kind:
      map (name: {
        name = "${system}.${kind}.${name}";
        value = kinds.${kind}.${name};
        locked = isLocked kind name;
      }) (builtins.attrNames kinds.${kind})
    ) (builtins.attrNames kinds)
  ) systems;
  checkable = builtins.listToAttrs (builtins.filter (o: o.locked) outputList);
  leftOut = map (o: o.name) (builtins.filter (o: !o.locked) outputList);
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

  lib = { inherit lineConfigurations planChecks; };

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
      inherit pkgs src leftOut;
      python = l.tp4.testPython;
      outputs = checkable;
      inherit (manifest) unlocked lockCommand commitCommand;
    }
    # every package that can be evaluated (the images of the registry included: the rollback
    # presets' too), `default` being tp4 again
    // builtins.removeAttrs packages.${system} [ "default" ]
    // sparkOnly system (nixosChecks pkgs)
  );
}
