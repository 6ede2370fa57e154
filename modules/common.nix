# Options both TP4 modules read: which plan, which host facts, which node this host is. Imported
# by modules/spark-host.nix and modules/tp4-line.nix (the module system imports it once).
{
  config,
  lib,
  ...
}:
let
  inherit (lib) mkOption types literalExpression;
  cfg = config.tp4;
  tp4lib = import ./lib;
in
{
  options.tp4 = {
    planFile = mkOption {
      type = types.path;
      example = literalExpression "./plan.json";
      description = ''
        The line's plan, committed beside the profile: `tp4 plan --json -o plan.json --profile
        profile.toml`. The one renderer's output, read as it is (`builtins.fromJSON`): the hosts,
        their addresses, the rank's container, its readiness, the weights' NFS share. Evaluation
        builds nothing; `tp4 plan --check plan.json` (a check of the line's flake) fails when the
        profile has changed and the file was not written again.
      '';
    };

    hostsFile = mkOption {
      type = types.nullOr types.path;
      default = null;
      example = literalExpression "./hosts.toml";
      description = ''
        Host facts the profile does not hold: `[fabric] netdev` (where each node's plan address
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
      description = "This host's node name in the plan (the profile's `cluster.head.name` or a worker's `name`).";
    };

    package = mkOption {
      type = types.nullOr types.package;
      default = null;
      defaultText = literalExpression "the flake's packages.\${system}.tp4 (set by nixosModules)";
      description = "The tp4 CLI on the host: the rank's readiness unit runs its boot-log check (`tp4 bootlog wait`).";
    };

    settings = mkOption {
      type = types.raw;
      internal = true;
      readOnly = true;
      description = "This host's settings as modules/lib computes them (what the modules wire into NixOS options).";
    };
  };

  config.tp4.settings = tp4lib.host {
    plan = builtins.fromJSON (builtins.readFile cfg.planFile);
    hostsFile =
      if cfg.hostsFile == null then { } else builtins.fromTOML (builtins.readFile cfg.hostsFile);
    name = cfg.node;
    displayReservation = config.tp4.host.displayReservation.enable or true;
    weightsMountPoint = config.tp4.host.weights.mountPoint or "/var/lib/tp4/weights";
    localWeights = config.tp4.host.weights.localDir or null;
  };
}
