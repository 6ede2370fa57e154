# nixosModules.tp4-line: this node's rank of the TP4 line as a systemd unit. The container is the
# plan's (tp4.planFile: `tp4 plan --json -o plan.json`, committed beside the profile): image,
# command, mounts, devices and flags as python/tp4/serving/serve.py runs them on a plain host, the
# environment from the env file tp4 serve writes before it starts the unit. Ordered after the
# network, the RDMA check, the weights volume and (ring) the mesh, with bounded restarts and the
# hardening a container runtime can live with; tp4-rank-ready.service beside it is its readiness
# (`tp4 bootlog wait`: the boot-log check of tp4 serve, on this node's log).
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
    mkMerge
    mkOverride
    types
    literalExpression
    escapeShellArgs
    ;
  inherit (utils) escapeSystemdExecArgs;
  cfg = config.tp4.line;
  tp4 =
    if config.tp4.package != null then
      config.tp4.package
    else
      throw "tp4.package: the rank's readiness unit runs tp4's boot-log check (tp4 bootlog wait) and no tp4 is set; fix: use the flake's nixosModules (they set tp4.package) or set tp4.package to the flake's packages.<system>.tp4";
  r = config.tp4.settings.rankUnit;
  # the rank unit's hardening (modules/lib/rank.nix `hardening`), without its limits and restarts
  watchHardening = builtins.intersectAttrs {
    NoNewPrivileges = null;
    LockPersonality = null;
    RestrictRealtime = null;
    SystemCallArchitectures = null;
    RestrictAddressFamilies = null;
  } r.serviceConfig;
  linePlan = builtins.fromJSON (builtins.readFile config.tp4.planFile);
  serviceName = lib.removeSuffix ".service" r.unit;
  users = lib.unique (map (d: d.user) r.directories);
  # above oci-containers' own unit settings (it sets Restart itself), below mkForce
  strong = builtins.mapAttrs (_: mkOverride 90);
  # the pre-start runs `${imageStream} | <runtime> load` (nixpkgs'
  # nixos/modules/virtualisation/oci-containers.nix, mkService's preStartScript): the layout as a
  # docker-archive on stdout, tagged with the name the container runs. --insecure-policy: the
  # source is a store path nix built (no signature to check)
  layoutStream = pkgs.writeShellScript "tp4-image-stream" ''
    exec ${pkgs.skopeo}/bin/skopeo --insecure-policy copy --quiet ${
      escapeShellArgs [
        "oci:${cfg.image.layout}"
        "docker-archive:/dev/stdout:${r.container.image}"
      ]
    }
  '';
in
{
  imports = [ ./common.nix ];

  options.tp4.line = {
    enable = mkEnableOption "this node's rank of the TP4 line as a systemd unit (started and stopped by tp4 serve and tp4 stop)";

    image = {
      layout = mkOption {
        type = types.nullOr types.package;
        default = null;
        example = literalExpression "tp4.packages.aarch64-linux.image";
        description = ''
          The line's image as the flake builds it (`.#image`: an OCI layout directory). The
          unit's pre-start streams it as a docker-archive named by the plan's `run.image`
          (`skopeo copy oci:<layout> docker-archive:/dev/stdout:<run.image>`) into the runtime's
          `load`, so the container finds it under the name it runs (it never pulls). A layout
          handed to `podman load -i` as {option}`tp4.line.image.file` would be loaded under its
          store path's name instead, and the rank would not start.
        '';
      };
      stream = mkOption {
        type = types.nullOr types.package;
        default = null;
        description = ''
          A `dockerTools.streamLayeredImage`-style script that writes a docker-archive of the
          plan's `run.image` (tagged with that name) to stdout, piped to the runtime's `load`
          before the container starts. `null` (and no {option}`tp4.line.image.layout` or
          {option}`tp4.line.image.file`): the image is already in the runtime's store
          (`tp4 build` on the head, `tp4 distribute` to the workers).
        '';
      };
      file = mkOption {
        type = types.nullOr types.package;
        default = null;
        description = ''
          A docker-archive (or oci-archive) file of the plan's `run.image`, tagged with that name,
          loaded with `<runtime> load -i` instead of {option}`tp4.line.image.stream`.
        '';
      };
    };

    watch = {
      enable = mkEnableOption "tp4-watch.service on the head: `tp4 watch` (docs/watch.md) restarts a wedged line or one whose rank is gone, never a busy one, and keeps the evidence";
      profile = mkOption {
        type = types.nullOr types.path;
        default = null;
        description = ''
          The line's profile, the one {option}`tp4.planFile` was written from (`tp4 watch
          --profile`): the watchdog serves the line again from it after a restart.
        '';
      };
      metricsPort = mkOption {
        type = types.port;
        default = 9478;
        description = ''
          The loopback port of the watchdog's Prometheus metrics (`--metrics 127.0.0.1:PORT`).
          With {option}`services.prometheus.enable`, a scrape job `tp4-watch` reads it and a job
          `tp4-sglang` reads the head's SGLang `/metrics` on the line's API port.
        '';
      };
      extraArgs = mkOption {
        type = types.listOf types.str;
        default = [ ];
        example = [
          "--interval"
          "5"
        ];
        description = "More options of `tp4 watch` (docs/watch.md), appended to its command line.";
      };
    };

    autoStart = mkOption {
      type = types.bool;
      default = false;
      description = ''
        Start the rank at boot. Off by default: `tp4 serve` writes the rank's env file (its
        environment and, on the head, the API key) and then starts the unit; at boot there is no
        env file yet.
      '';
    };
  };

  config = mkIf cfg.enable (mkMerge [
    {
      assertions = [
        {
          assertion = config.tp4.host.enable or false;
          message = "tp4.line: the rank unit waits for the host units of spark-host (${lib.concatStringsSep ", " r.ordering.requires}); fix: import nixosModules.spark-host (or nixosModules.default) and set tp4.host.enable = true";
        }
        {
          assertion =
            builtins.length (
              builtins.filter (x: x != null) [
                cfg.image.layout
                cfg.image.stream
                cfg.image.file
              ]
            ) <= 1;
          message = "tp4.line.image: more than one of layout, stream and file is set; fix: set only one of them (layout = tp4.packages.aarch64-linux.image)";
        }
      ]
      ++ map (u: {
        assertion = u == "root" || config.users.users ? ${u};
        message = "tp4.line: the plan's node user ${u} owns the rank's state, cache and Engram directories but is not a user of this host; fix: declare users.users.${u} (isNormalUser = true) or change cluster.user in the profile";
      }) users;

      virtualisation.oci-containers.backend = r.backend;
      virtualisation.oci-containers.containers.${r.name} = r.container // {
        inherit (cfg) autoStart;
        imageStream = if cfg.image.layout != null then layoutStream else cfg.image.stream;
        imageFile = cfg.image.file;
      };

      systemd.services.${serviceName} = {
        inherit (r.ordering) wants after requires;
        # the plan the rank runs from, in the unit's environment as on its container's label
        environment.TP4_PLAN = r.container.labels."tp4.plan";
        serviceConfig = strong r.serviceConfig;
        unitConfig = r.unitConfig;
      };

      # the readiness: started with the rank (wanted by it, after it) and stopped with it (bound
      # to it); the rank's own start (tp4 serve's systemctl start) never waits for it
      systemd.services.${lib.removeSuffix ".service" r.readiness.unit} = {
        description = "tp4: the rank's boot log shows it ready (tp4 serve's boot-log check)";
        wantedBy = [ r.unit ];
        after = [ r.unit ];
        bindsTo = [ r.unit ];
        # the runtime whose logs the check reads (the plan's service.runtime: podman on NixOS)
        path = [ config.virtualisation.podman.package ];
        serviceConfig = {
          Type = "oneshot";
          RemainAfterExit = true;
          # the check's own bound (the plan's service.ready.timeout), plus a margin: a start that
          # never ends is impossible
          TimeoutStartSec = r.readiness.timeout + 60;
          ExecStart = escapeSystemdExecArgs (
            [ "${tp4}/bin/tp4" ]
            ++ r.readiness.args
            ++ [
              "--plan"
              "${config.tp4.planFile}"
            ]
          );
        };
      };

      systemd.tmpfiles.rules = map (d: "d ${d.path} ${d.mode} ${d.user} - -") r.directories;
    }
    (mkIf cfg.watch.enable {
      assertions = [
        {
          assertion = config.tp4.settings.rank == 0;
          message = "tp4.line.watch: ${config.tp4.node} is not the line's head; fix: enable the watchdog on the head only";
        }
        {
          assertion = cfg.watch.profile != null;
          message = "tp4.line.watch.profile: the watchdog serves the line again from its profile and none is set; fix: set it to the profile the plan file was written from";
        }
      ];
      # `tp4 watch` in the foreground, as a service: restarted on failure, not after it gave up
      # and stopped the line (exit 3); hardened like the rank unit (its `hardening`,
      # modules/lib/rank.nix), its events and evidence in its state directory
      systemd.services.tp4-watch = {
        description = "tp4 watch: the line's watchdog (docs/watch.md)";
        wantedBy = [ "multi-user.target" ];
        wants = [ "network-online.target" ];
        after = [ "network-online.target" ];
        environment.XDG_STATE_HOME = "/var/lib/tp4-watch";
        serviceConfig = watchHardening // {
          ExecStart = escapeSystemdExecArgs (
            [
              "${tp4}/bin/tp4"
              "watch"
              "--profile"
              "${cfg.watch.profile}"
              "--metrics"
              "127.0.0.1:${toString cfg.watch.metricsPort}"
            ]
            ++ cfg.watch.extraArgs
          );
          StateDirectory = "tp4-watch";
          Restart = "on-failure";
          RestartSec = "30s";
          RestartPreventExitStatus = 3;
        };
      };
      # scrapeConfigs: a list of scrape_config submodules (job_name, static_configs = a list of
      # { targets; labels }), nixpkgs nixos/modules/services/monitoring/prometheus/default.nix
      # (promTypes.scrape_config, promTypes.static_config, options.services.prometheus.scrapeConfigs;
      # read in the stored copy at 020e024506ab147265c4a5757af92da617ef2dfb, the pinned commit is
      # not stored; the same shape at 80f38e9032a8fc3af44a04800e1e149f30b00603)
      services.prometheus.scrapeConfigs = mkIf (config.services.prometheus.enable or false) [
        {
          job_name = "tp4-watch";
          static_configs = [ { targets = [ "127.0.0.1:${toString cfg.watch.metricsPort}" ]; } ];
        }
        {
          job_name = "tp4-sglang";
          static_configs = [ { targets = [ "127.0.0.1:${toString linePlan.line.api_port}" ]; } ];
        }
      ];
    })
  ]);
}
