# Options both TP4 modules read: which profile, which plan, which node this host is. Imported by
# modules/spark-host.nix and modules/tp4-line.nix (the module system imports it once).
{
  config,
  lib,
  pkgs,
  ...
}:
let
  inherit (lib) mkOption types literalExpression;
  cfg = config.tp4;
  tp4lib = import ./lib;
in
{
  options.tp4 = {
    profile = mkOption {
      type = types.path;
      example = literalExpression "./profile.toml";
      description = ''
        The line's tp4 profile (TOML), the same file `tp4 plan`, `tp4 serve` and `tp4 deploy` read.
        The hosts' names and fabric addresses come from it (`builtins.fromTOML`).
      '';
    };

    hostsFile = mkOption {
      type = types.nullOr types.path;
      default = null;
      example = literalExpression "./hosts.toml";
      description = ''
        Host facts the profile does not hold: `[fabric] netdev` (where each node's profile `ip`
        sits, default `enp1s0f0np0`), `prefix_length` (default 24), and per node the other fabric
        ports the line uses, `[nodes.<node>.ports.<netdev>] address = "..."`.
        See `examples/spark-line/hosts.toml`.
      '';
    };

    node = mkOption {
      type = types.str;
      default = config.networking.hostName;
      defaultText = literalExpression "config.networking.hostName";
      example = "spark2";
      description = "This host's node name in the profile (`cluster.head.name` or a worker's `name`).";
    };

    package = mkOption {
      type = types.nullOr types.package;
      default = null;
      defaultText = literalExpression "the flake's packages.\${system}.tp4 (set by nixosModules)";
      description = "The tp4 CLI that renders the plan from the profile at build time.";
    };

    planFile = mkOption {
      type = types.path;
      default =
        if cfg.package == null then
          throw "tp4.planFile: no plan and no tp4.package to render one; fix: use the flake's nixosModules (they set tp4.package) or set tp4.planFile to the output of tp4 plan --json --profile FILE"
        else
          pkgs.runCommand "tp4-plan.json" { } ''
            HOME=$TMPDIR ${cfg.package}/bin/tp4 plan --json --profile ${cfg.profile} > $out
          '';
      defaultText = literalExpression ''pkgs.runCommand "tp4-plan.json" { } "tp4 plan --json --profile ''${config.tp4.profile} > $out"'';
      description = ''
        The plan of the line (`tp4 plan --json`): the one renderer's output, which the rank unit
        runs as it is. By default rendered from {option}`tp4.profile` at build time.
      '';
    };

    settings = mkOption {
      type = types.raw;
      internal = true;
      readOnly = true;
      description = "This host's settings as modules/lib computes them (what the modules wire into NixOS options).";
    };
  };

  config.tp4.settings = tp4lib.host {
    profile = builtins.fromTOML (builtins.readFile cfg.profile);
    plan = builtins.fromJSON (builtins.readFile cfg.planFile);
    hostsFile =
      if cfg.hostsFile == null then { } else builtins.fromTOML (builtins.readFile cfg.hostsFile);
    name = cfg.node;
    displayReservation = config.tp4.host.displayReservation.enable or true;
    weightsMountPoint = config.tp4.host.weights.mountPoint or "/var/lib/tp4/weights";
    localWeights = config.tp4.host.weights.localDir or null;
  };
}
