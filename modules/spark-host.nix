# nixosModules.spark-host: a DGX Spark as a host of the TP4 line, on top of nixos-dgx-spark's
# dgx-spark module (kernel, open driver, CDI, PAM memlock), which the flake imports with it.
# This adds what the line needs from the host (upstream's host requirements): RoCE ports with
# addresses, MTU 9000 and ARP settings, the mlx5 modules and rdma-core, a check that the RDMA
# ports and their GIDs are there, memlock for services, the weights over NFS (or a local copy),
# the display reservation, headless boot and the firewall. Every value comes from modules/lib
# (tp4.settings); this file only declares options and wires.
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
    mkAfter
    mkDefault
    types
    ;
  inherit (utils) escapeSystemdExecArgs;
  cfg = config.tp4.host;
  s = config.tp4.settings;
  tp4lib = import ./lib;
  ring = s.fabric == "ring";
  runtime = s.rankUnit.backend;
  rdmaArgs = [
    (toString s.rdmaCheck.timeout)
    s.rdmaCheck.gidFile
    (if s.rdmaCheck.gidIndex == null then "-" else toString s.rdmaCheck.gidIndex)
  ]
  ++ builtins.concatMap (p: [
    p.hca
    p.netdev
    p.address
  ]) s.rdmaCheck.ports;
  volume = s.weightsVolume;
  # the units this module declares, by the names the plan gives them (service.host_units)
  unitName = lib.removeSuffix ".service";
in
{
  imports = [ ./common.nix ];

  options.tp4.host = {
    enable = mkEnableOption "this DGX Spark as a host of the TP4 line (RoCE, weights, display reservation, headless boot)";

    kernel = {
      version = mkOption {
        type = types.str;
        # nixos-dgx-spark (modules/dgx-spark.nix lines 30-33 at f1ebf94) builds its kernel with
        # version = "${nvidiaKernelVersion}-nvidia" and modDirVersion = nvidiaKernelVersion
        # ("6.17.13", kernel-configs/nvidia-kernel-source.nix line 4). The full version is
        # compared: modDirVersion alone cannot tell the NVIDIA kernel from a stock 6.17.13.
        default = "6.17.13-nvidia";
        description = ''
          The kernel the line was validated on: nixos-dgx-spark's NVIDIA kernel at the pinned input,
          as its `version` attribute reads (`<release>-nvidia`; its `modDirVersion` is the bare
          release). A kernel change can break RDMA memory registration (a known DGX OS
          regression), so another kernel is refused unless {option}`tp4.host.kernel.allowOther`
          is set.
        '';
      };
      allowOther = mkOption {
        type = types.bool;
        default = false;
        description = "Accept a kernel other than {option}`tp4.host.kernel.version` (validate RDMA on it first).";
      };
    };

    displayReservation.enable = mkOption {
      type = types.bool;
      default = true;
      description = ''
        Keep the GB10 display reservation free for the line's Engram row cache (upstream's
        `DSV41_ENGRAM_DRM_NODE`): `nvidia-drm.modeset=1` and `nvidia-drm.fbdev=0` on the kernel
        command line (after the `nvidia-drm.fbdev=1` the nvidia module appends), no display
        manager, boot to `multi-user.target`.
      '';
    };

    weights = {
      mountPoint = mkOption {
        type = types.str;
        default = "/var/lib/tp4/weights";
        description = "Where a worker mounts the head's NFS export of the checkpoint (the plan's weights volume binds it).";
      };
      localDir = mkOption {
        type = types.nullOr types.str;
        default = null;
        example = "/var/lib/tp4/DeepSeek-V4.1-Flash";
        description = ''
          A worker's own copy of the checkpoint, when the line has no NFS share (a ring, or
          `nfs.share = false` in the profile): the plan's weights volume binds it.
        '';
      };
    };

    firewall.enable = mkOption {
      type = types.bool;
      default = true;
      description = ''
        Open what the line listens on: on the head the API and dist-init ports (and NFS when it
        exports), on every node the bootstrap interface (`NCCL_SOCKET_IFNAME`/`GLOO_SOCKET_IFNAME`
        of the plan), where NCCL and Gloo listen on ephemeral ports.
      '';
    };

    ring = {
      meshUp = mkOption {
        type = types.nullOr types.path;
        default = null;
        description = "A ring's mesh-up script for this node (sparkring's planner writes `mesh-up-<host>.sh`); run by `tp4-mesh.service` before the rank.";
      };
      meshDown = mkOption {
        type = types.nullOr types.path;
        default = null;
        description = "The matching mesh-down script, run when `tp4-mesh.service` stops.";
      };
      marker = {
        package = mkOption {
          type = types.nullOr types.package;
          default = null;
          defaultText = lib.literalExpression "null";
          example = lib.literalExpression "pkgs.callPackage ./mlx5-rdma-tx-rewrite-probe.nix { }";
          description = ''
            The RDMA packet marker of RoCEnante's opposite-node paths on a ring (sparkring's
            `mlx5_rdma_tx_rewrite_probe.c`, built with `cc -libverbs -lmlx5`; upstream installs it as
            `/opt/dsv41-mesh/bin/mlx5-rdma-tx-rewrite-probe`). Needed when the plan arms
            `DSV41_ROCE_RING=1`: one `tp4-mesh-marker@<rdma-dev>.service` per fabric device keeps it
            attached (`--attach --managed`) while the rank runs. tp4 does not package it: the
            probe is research code of sparkring's `cx7_hairpin_diagonal` experiment.
          '';
        };
        program = mkOption {
          type = types.str;
          default = "mlx5-rdma-tx-rewrite-probe";
          description = "The marker's program in {option}`tp4.host.ring.marker.package`'s `bin`.";
        };
      };
    };
  };

  config = mkIf cfg.enable (mkMerge [
    {
      hardware.dgx-spark.enable = true;

      assertions = [
        {
          assertion =
            cfg.kernel.allowOther || config.boot.kernelPackages.kernel.version == cfg.kernel.version;
          message = "tp4.host: the kernel is ${config.boot.kernelPackages.kernel.version} (modDirVersion ${config.boot.kernelPackages.kernel.modDirVersion}), the line is validated on ${cfg.kernel.version} (nixos-dgx-spark's NVIDIA kernel); fix: keep hardware.dgx-spark.useNvidiaKernel = true and boot.kernelPackages unset, or set tp4.host.kernel.allowOther = true after checking RDMA on it";
        }
      ];

      # RoCE: the ConnectX-7 driver with its RDMA half, the verbs tools, one address and MTU 9000
      # per fabric port, ARP answered per port
      boot.kernelModules = s.kernelModules;
      environment.systemPackages = [ pkgs.rdma-core ];
      networking.interfaces = builtins.mapAttrs (_: i: {
        inherit (i) mtu;
        ipv4.addresses = i.ipv4.addresses;
      }) s.interfaces;
      boot.kernel.sysctl = s.sysctl;

      # memlock for services and the container runtime, not only login sessions (PAM)
      systemd.settings.Manager.DefaultLimitMEMLOCK = "infinity";

      # the container runtime of the plan, with NVIDIA CDI (nvidia.com/gpu=all)
      hardware.nvidia-container-toolkit.enable = true;

      systemd.services.${unitName s.rdmaCheck.unit} = {
        description = "tp4: the RDMA ports of the line are ACTIVE with their RoCE v2 GIDs";
        wantedBy = [ "multi-user.target" ];
        wants = [ "network-online.target" ];
        after = [
          "network-online.target"
        ]
        ++ map (n: "network-addresses-${n}.service") (builtins.attrNames s.interfaces);
        path = [ pkgs.coreutils ];
        serviceConfig = {
          Type = "oneshot";
          RemainAfterExit = true;
          # the script's own wait for the ports, plus a margin: it fails itself, loudly, first
          TimeoutStartSec = s.rdmaCheck.timeout + 30;
          ExecStart = escapeSystemdExecArgs (
            [
              pkgs.runtimeShell
              ./rdma-check.sh
            ]
            ++ rdmaArgs
          );
        };
      };
    }

    # the SM clock cap of the plan (the profile's cluster.gpu_clock_mhz: upstream measured its
    # numbers at `nvidia-smi -lgc 0,2200`, re-applied by a timer on each node; a driver reload or a
    # GPU reset drops it), at boot and every 10 minutes; doctor's GPU.CLOCK_CAP reads the same field
    (mkIf (s.gpuClockMHz != null) {
      systemd.services.tp4-gpu-clock = {
        description = "tp4: the GPU's SM clock capped at ${toString s.gpuClockMHz} MHz (nvidia-smi -lgc)";
        serviceConfig = {
          Type = "oneshot";
          ExecStart = escapeSystemdExecArgs [
            "${config.hardware.nvidia.package.bin}/bin/nvidia-smi"
            "-lgc"
            "0,${toString s.gpuClockMHz}"
          ];
        };
      };
      systemd.timers.tp4-gpu-clock = {
        wantedBy = [ "timers.target" ];
        timerConfig = {
          OnBootSec = "30s";
          OnUnitActiveSec = "10min";
        };
      };
    })

    (mkIf cfg.displayReservation.enable {
      boot.kernelParams = mkAfter s.kernelParams;
      services.xserver.enable = mkDefault false;
      services.displayManager.enable = mkDefault false;
      systemd.defaultUnit = "multi-user.target";
      assertions = [
        {
          assertion = tp4lib.kernel.displayReservationProblem config.boot.kernelParams == null;
          message = "tp4.host.displayReservation: ${toString (tp4lib.kernel.displayReservationProblem config.boot.kernelParams)} on the kernel command line; fix: remove the nvidia-drm parameters you add to boot.kernelParams (tp4 appends modeset=1 fbdev=0 last)";
        }
        {
          assertion =
            !config.services.xserver.enable
            && !config.services.displayManager.enable
            && !config.services.displayManager.gdm.enable
            && !config.services.desktopManager.gnome.enable;
          message = "tp4.host.displayReservation: a display server or desktop is enabled (nixos-dgx-spark's template turns on GNOME and GDM), and it would take the display reservation; fix: drop services.desktopManager.gnome, services.displayManager.gdm and services.xserver from the configuration, or set tp4.host.displayReservation.enable = false";
        }
      ];
    })

    (mkIf (s.nfs.exports != null) {
      services.nfs.server.enable = true;
      services.nfs.server.exports = s.nfs.exports + "\n";
    })

    (mkIf (s.nfs.mount != null) {
      fileSystems.${s.nfs.mount.mountPoint} = {
        inherit (s.nfs.mount) device fsType options;
      };
    })

    (mkIf (volume != null) {
      systemd.services.${unitName volume.unit} = {
        description = "tp4: the plan's weights volume ${volume.name} (${volume.options.type} ${volume.options.device})";
        wants = [ "network-online.target" ];
        after = [ "network-online.target" ];
        unitConfig.RequiresMountsFor = [ volume.requiresMount ];
        path = [ config.virtualisation.podman.package ];
        serviceConfig = {
          Type = "oneshot";
          RemainAfterExit = true;
          ExecStart = escapeSystemdExecArgs [
            pkgs.runtimeShell
            ./weights-volume.sh
            runtime
            volume.name
            volume.options.type
            volume.options.o
            volume.options.device
          ];
        };
      };
    })

    (mkIf ring {
      assertions = [
        {
          assertion = cfg.ring.meshUp != null && cfg.ring.meshDown != null;
          message = "tp4.host.ring: the plan's fabric is a ring, whose mesh must be up before the rank; fix: set tp4.host.ring.meshUp and meshDown to this node's mesh-up/mesh-down scripts";
        }
      ];
      systemd.services.${unitName s.ring.unit} =
        mkIf (cfg.ring.meshUp != null && cfg.ring.meshDown != null)
          {
            description = "tp4: the switchless ring's mesh (hairpin queues, routes, tc rules)";
            wantedBy = [ "multi-user.target" ];
            wants = [ "network-online.target" ];
            after = [ "network-online.target" ];
            path = [ pkgs.iproute2 ];
            # re-initialising a fabric function while the line serves breaks it: a switch leaves the
            # mesh as it is
            restartIfChanged = false;
            serviceConfig = {
              Type = "oneshot";
              RemainAfterExit = true;
              TimeoutStartSec = 300;
              ExecStartPre = [
                (escapeSystemdExecArgs (
                  [
                    pkgs.runtimeShell
                    ./ring-links.sh
                    (toString s.ring.linkTimeout)
                  ]
                  ++ s.ring.links
                ))
                (escapeSystemdExecArgs (
                  [
                    pkgs.runtimeShell
                    ./ring-hairpin.sh
                    (toString s.ring.size)
                  ]
                  ++ s.ring.functions
                ))
              ];
              ExecStart = escapeSystemdExecArgs [
                pkgs.runtimeShell
                cfg.ring.meshUp
              ];
              ExecStop = escapeSystemdExecArgs [
                pkgs.runtimeShell
                cfg.ring.meshDown
              ];
            };
          };
    })

    (mkIf (ring && s.ring.marker != null) {
      assertions = [
        {
          assertion = cfg.ring.marker.package != null;
          message = "tp4.host.ring.marker.package: the plan arms DSV41_ROCE_RING=1 (RoCEnante's opposite-node paths on the ring), whose RDMA packets the marker must rewrite, and no marker is set; fix: build sparkring's spark_transport/experiments/cx7_hairpin_diagonal/native/mlx5_rdma_tx_rewrite_probe.c (cc -libverbs -lmlx5 against rdma-core) as a package with bin/${cfg.ring.marker.program} and set tp4.host.ring.marker.package, or set gates.DSV41_ROCE_RING = \"0\" in the profile";
        }
      ];
      # the marker's packets leave with UDP source port 65535: no local socket may take it
      boot.kernel.sysctl."net.ipv4.ip_local_reserved_ports" = toString s.ring.marker.sourcePort;
      systemd.services = mkIf (cfg.ring.marker.package != null) (
        builtins.listToAttrs (
          map (dev: {
            name = "tp4-mesh-marker@${dev}";
            value = {
              description = "tp4: RoCEnante's ring packet marker on ${dev} (UDP source port ${toString s.ring.marker.sourcePort}, EtherType ${s.ring.marker.etherType})";
              # the marker acts on the mesh's paths: up after it, down with it
              after = [ s.ring.unit ];
              bindsTo = [ s.ring.unit ];
              wantedBy = [ "multi-user.target" ];
              # a switch must not detach the marker under a serving rank
              restartIfChanged = false;
              serviceConfig = {
                Type = "simple";
                ExecStart = escapeSystemdExecArgs [
                  "${cfg.ring.marker.package}/bin/${cfg.ring.marker.program}"
                  "--device"
                  dev
                  "--source-port"
                  (toString s.ring.marker.sourcePort)
                  "--replacement-ethertype"
                  s.ring.marker.etherType
                  "--attach"
                  "--managed"
                ];
                Restart = "on-failure";
                RestartSec = "2s";
                LimitMEMLOCK = "infinity";
              };
            };
          }) s.ring.marker.devices
        )
      );
    })

    (mkIf (s.drmNode != null) {
      assertions = [
        {
          assertion = cfg.displayReservation.enable;
          message = "tp4.host.displayReservation.enable: the plan hands the engine the display reservation's DRM node (DSV41_ENGRAM_DRM_NODE=${s.drmNode.path}), which is only free with the reservation kept; fix: set tp4.host.displayReservation.enable = true, or unset DSV41_ENGRAM_DRM_NODE in the profile";
        }
      ];
      # a systemd device unit for the node, which the rank requires: the rank waits for the card
      # and fails on the dependency (not inside the engine) when the driver never creates it
      services.udev.extraRules = ''
        SUBSYSTEM=="drm", KERNEL=="${s.drmNode.kernel}", TAG+="systemd"
      '';
    })

    (mkIf cfg.firewall.enable {
      networking.firewall.allowedTCPPorts = s.firewall.tcp;
      networking.firewall.trustedInterfaces = s.firewall.trustedInterfaces;
    })
  ]);
}
