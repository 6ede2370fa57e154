# nixosModules.tp4-router: the fleet's router (SGLang's router in front of several TP4 lines) as
# the systemd unit tp4-router.service on the host the fleet file names, for a fleet whose
# `router.service = "unit"`. The command is the one `tp4 fleet plan --json` renders from the
# fleet file at build time (tp4's launcher, the router's arguments): the module renders nothing
# itself. `tp4 fleet serve` writes the API key file and starts the unit once the lines are up,
# `tp4 fleet stop` stops it; it does not start at boot.
{
  config,
  lib,
  pkgs,
  # nixos/lib/utils.nix (a module argument): escapeSystemdExecArgs quotes Exec* lines the way
  # systemd parses them (JSON-quoted, `%` and `$` doubled), which escapeShellArgs does not
  utils,
  ...
}:
let
  inherit (lib)
    mkEnableOption
    mkOption
    mkIf
    types
    literalExpression
    ;
  inherit (utils) escapeSystemdExecArgs;
  cfg = config.tp4.router;
  plan = builtins.fromJSON (builtins.readFile cfg.fleetPlan);
  r = plan.router or { };
  command = r.command or [ ];
  # the plan's state directory (/var/lib/tp4-router unless the fleet file names one), relative to
  # /var/lib for StateDirectory; null when it lies elsewhere
  stateDir = r.state_dir or "/var/lib/tp4-router";
  underVarLib = builtins.match "/var/lib/(.+)" stateDir;
  stateDirectory = if underVarLib == null then null else builtins.head underVarLib;
  # the Python that runs the launcher: the option's, else the fleet file's router.python
  python = if cfg.python != null then "${cfg.python}/bin/python3" else r.python or null;
in
{
  options.tp4.router = {
    enable = mkEnableOption "the fleet's router as tp4-router.service (started and stopped by tp4 fleet serve and stop)";

    fleet = mkOption {
      type = types.nullOr types.path;
      default = null;
      example = literalExpression "./fleet.toml";
      description = ''
        The fleet file (`tp4 fleet plan -f`). Its directory is copied with it, so the profiles it
        names by relative path are there when {option}`tp4.router.fleetPlan` is rendered.
      '';
    };

    package = mkOption {
      type = types.nullOr types.package;
      default = null;
      defaultText = literalExpression "the flake's packages.\${system}.tp4 (set by nixosModules.tp4-router)";
      description = "The tp4 CLI that renders the fleet's plan at build time.";
    };

    fleetPlan = mkOption {
      type = types.path;
      default =
        if cfg.fleet == null || cfg.package == null then
          throw "tp4.router.fleetPlan: no fleet plan, and no tp4.router.fleet (and tp4.router.package) to render one; fix: set tp4.router.fleet = ./fleet.toml, or tp4.router.fleetPlan to the output of tp4 fleet plan --json -f FILE"
        else
          pkgs.runCommand "tp4-fleet-plan.json" { } ''
            HOME=$TMPDIR ${cfg.package}/bin/tp4 fleet plan --json -f ${dirOf cfg.fleet}/${baseNameOf cfg.fleet} > $out
          '';
      defaultText = literalExpression ''pkgs.runCommand "tp4-fleet-plan.json" { } "tp4 fleet plan --json -f ''${config.tp4.router.fleet} > $out"'';
      description = "The fleet's plan (`tp4 fleet plan --json`), whose router command the unit runs as it is.";
    };

    python = mkOption {
      type = types.nullOr types.package;
      default = null;
      example = literalExpression "pkgs.python3.withPackages (ps: [ sglang-router ])";
      description = ''
        A Python environment with the router package (`sglang-router`, or `smg`) installed:
        nixpkgs packages neither, so this is the user's to provide (a `buildPythonPackage` of the
        wheel pinned in tp4's `python/poetry.lock`, group `router`). `null`: the fleet file's
        `router.python`, a Python already on the host.
      '';
    };

    openFirewall = mkOption {
      type = types.bool;
      default = true;
      description = "Open the router's API port (the fleet's `router.port`); its metrics stay on loopback.";
    };
  };

  config = mkIf cfg.enable {
    assertions = [
      {
        assertion = (plan.schema or null) == "tp4.fleet/1" && command != [ ];
        message = "tp4.router.fleetPlan: ${toString cfg.fleetPlan} is not a tp4 fleet plan with the router's command (tp4.fleet/1); fix: pass the output of tp4 fleet plan --json -f FILE of this tp4";
      }
      {
        assertion = (r.service or null) == "unit";
        message = "tp4.router: the fleet file runs its router as a plain process (router.service = ${
          builtins.toJSON (r.service or null)
        }), so tp4 fleet serve would not start this unit; fix: set router.service = \"unit\" in the fleet file";
      }
      {
        assertion = python != null;
        message = "tp4.router.python: no Python with the router: nixpkgs has no sglang-router package; fix: set tp4.router.python to a Python environment with sglang-router installed, or router.python in the fleet file to one on this host";
      }
    ];

    systemd.services.tp4-router = {
      description = "tp4: SGLang's router in front of the fleet's lines (${r.kind or "router"}, ${r.policy or "round_robin"})";
      wants = [ "network-online.target" ];
      after = [ "network-online.target" ];
      # tp4 fleet serve starts it once the lines are up (it writes the key file first)
      restartIfChanged = false;
      serviceConfig = {
        Type = "simple";
        ExecStart =
          if command == [ ] || python == null then
            ""
          else
            escapeSystemdExecArgs ([ python ] ++ builtins.tail command);
        Restart = "on-failure";
        RestartSec = "5s";
        RestartSteps = 5;
        RestartMaxDelaySec = "2min";
        NoNewPrivileges = true;
        LockPersonality = true;
        RestrictRealtime = true;
        LimitNOFILE = 65536;
      }
      // (
        if stateDirectory == null then
          { }
        else
          {
            StateDirectory = stateDirectory;
            StateDirectoryMode = "0700";
          }
      );
      unitConfig = {
        StartLimitIntervalSec = 3600;
        StartLimitBurst = 5;
      };
    };

    # the router's state directory (the key file tp4 fleet serve writes as root): the unit's own
    # StateDirectory under /var/lib (systemd.exec(5): created at start, owned by the unit's user,
    # root, of StateDirectoryMode), or the fleet file's router.state_dir elsewhere, made by tmpfiles;
    # mode 0700 either way: tp4 refuses a state directory another user may write
    systemd.tmpfiles.rules =
      if stateDirectory == null then [ "d ${stateDir} 0700 root root -" ] else [ ];

    networking.firewall.allowedTCPPorts = mkIf (cfg.openFirewall && r ? port) [ r.port ];
  };
}
