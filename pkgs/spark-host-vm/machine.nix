# The node of checks.aarch64-linux.spark-host-vm: the example line's head (examples/spark-line,
# node spark1) with the flake's modules, in a QEMU VM without GPU and without RDMA device. Its two
# fabric ports are virtio NICs renamed to the netdevs the line uses, so the addresses, MTU and ARP
# settings land on interfaces of those names; there is no RDMA device behind them, so the RDMA
# check must fail. A probe container runs under the rank unit's hardening, to show the runtime
# starts containers with it.
{
  # the flake's nixosModules
  nixosModules,
  # the line's directory: profile.toml, its plan.json, hosts.toml, configuration.nix
  example,
  # this directory's probe of the hardening (modules/lib's rank.hardening)
  hardening,
}:
{
  config,
  lib,
  pkgs,
  ...
}:
let
  s = config.tp4.settings;
  ports = s.rdmaCheck.ports;
  mac = i: "52:54:00:74:70:${toString (10 + i)}";
  indexed = builtins.genList (i: {
    inherit i;
    port = builtins.elemAt ports i;
  }) (builtins.length ports);
  # the head's export: "<path> <client>(<options>) ..."
  export = builtins.head (builtins.split " " s.nfs.exports);
  probe = pkgs.dockerTools.streamLayeredImage {
    name = "tp4-probe";
    tag = "1";
    contents = [ pkgs.busybox ];
  };
in
{
  imports = [
    nixosModules.default
    (example + "/configuration.nix")
  ];

  config = {
    networking.hostName = "spark1";
    tp4 = {
      planFile = example + "/plan.json";
      hostsFile = example + "/hosts.toml";
      node = "spark1";
      host.enable = true;
      line.enable = true;
    };

    # nixos-dgx-spark's dgx-spark-boot-vm does the same: the qemu-vm module takes "nvidia" out of
    # services.xserver.videoDrivers, which trips the container toolkit's assertion; the VM has
    # no GPU anyway
    hardware.nvidia-container-toolkit.suppressNvidiaDriverAssertion = true;
    # configuration.nix asks for the deploying user's key (its authorized_keys); the VM is
    # driven from its console, so a key no one holds
    users.users.tp4.openssh.authorizedKeys.keys = lib.mkForce [
      "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHRwNC1jaGVjay1vbmx5LW5vdC1hLXJlYWwta2V5 tp4-check"
    ];
    virtualisation.memorySize = 4096;
    virtualisation.cores = 4;

    # one NIC per fabric port of the plan (no RDMA behind it), named as on a Spark
    virtualisation.qemu.options = builtins.concatMap (x: [
      "-netdev user,id=fabric${toString x.i},restrict=on"
      "-device virtio-net-pci,netdev=fabric${toString x.i},mac=${mac x.i}"
    ]) indexed;
    systemd.network.links = builtins.listToAttrs (
      map (x: {
        name = "10-${x.port.netdev}";
        value = {
          matchConfig.MACAddress = mac x.i;
          linkConfig.Name = x.port.netdev;
        };
      }) indexed
    );

    # the probe: a container of the same runtime under the rank unit's hardening
    virtualisation.oci-containers.containers.tp4-probe = {
      image = "${probe.imageName}:${probe.imageTag}";
      imageStream = probe;
      pull = "never";
      cmd = [
        "sh"
        "-c"
        "echo probe-ok > /out/ok; exec sleep 3600"
      ];
      volumes = [ "/var/lib/tp4-probe:/out" ];
    };
    systemd.services.podman-tp4-probe.serviceConfig = hardening;
    # the checkpoint directory the head exports (empty here), so the NFS server starts
    systemd.tmpfiles.rules = [
      "d /var/lib/tp4-probe 0755 root root - -"
      "d ${export} 0755 tp4 - - -"
    ];
  };
}
