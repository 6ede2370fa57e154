# The weights: when the plan has line.nfs the head exports its checkpoint over NFSv4, read-only,
# to exactly the line's workers, and every worker mounts it (upstream files/nfs-share.sh, as tp4
# share does it, with the plan's export and client options); without it (a ring, nfs.share =
# false) every node holds its own copy. The rank's container mounts the plan's weights volume.
# The exports line is written in the syntax tp4 share writes it in (python/tp4/hosts/share.py
# kernel_exports_text; a test compares them): its clients are the head's view of the workers'
# ports, a host fact the plan does not hold. The workers' volume options are the plan's.
let
  u = import ./util.nix;
  inherit (builtins)
    concatStringsSep
    elemAt
    filter
    head
    match
    tail
    toJSON
    ;
  inherit (u) fail;
in
rec {
  # the export and client options are the plan's (line.nfs.export_options, mount_options: tp4
  # share's); how systemd orders the worker's mount is the host's: mounted on first access (a
  # head that boots later does not fail the worker's boot), only once the network is online,
  # never waited on forever
  systemdMountOptions = [
    "_netdev"
    "x-systemd.automount"
    "x-systemd.after=network-online.target"
    "x-systemd.requires=network-online.target"
    "x-systemd.mount-timeout=120s"
  ];

  # the plan's weights mount of a worker (the named volume)
  volumeOf = planNode: head (filter (m: m.type == "volume") planNode.run.mounts);

  # each worker as the head sees it: its port on the server address's network (what the kernel
  # picks as the source address toward the server), else its fabric ip
  clients =
    { plan, ports }:
    u.imap0 (
      i: w:
      let
        server = elemAt plan.line.nfs.servers i;
        own = builtins.attrValues (ports.${w.name} or { });
        near = filter (p: u.sameSubnet p.prefixLength p.address server) own;
      in
      if near == [ ] then w.host else (head near).address
    ) (tail plan.nodes);

  # the head's /etc/exports line (services.nfs.server.exports): the path, quoted when it holds
  # whitespace, then one entry per client
  exportsLine =
    {
      path,
      clients,
      options,
    }:
    let
      quoted = if match ".*[[:space:]].*" path != null then "\"${path}\"" else path;
      bad = match ".*[\"\\\\].*" path != null;
    in
    if bad then
      fail "model.dir" "${toJSON path} holds a quote or a backslash, which an exports line cannot carry"
        "move the checkpoint to a path without them"
    else
      concatStringsSep " " ([ quoted ] ++ map (c: "${c}(${concatStringsSep "," options})") clients);

  # a worker's fileSystems entry for the head's export
  clientMount =
    {
      server,
      path,
      mountPoint,
      options,
    }:
    {
      inherit mountPoint;
      device = "${server}:${path}";
      fsType = "nfs";
      options = options ++ systemdMountOptions;
    };

  # the plan's weights volume, `<runtime> volume create --driver local` with these options. With
  # NFS they are the plan's (line.nfs.volumes: the volume tp4 share makes on a plain host, so share
  # and doctor check a NixOS worker as any other); the host's own mount of the export
  # (clientMount) is what orders the rank after a head that exports. Without NFS it binds the
  # node's own copy.
  volume =
    {
      name,
      nfs ? null,
      localDir ? null,
    }:
    {
      inherit name;
      driver = "local";
      options =
        if nfs != null then
          nfs
        else
          {
            type = "none";
            o = "bind";
            device = localDir;
          };
    };
}
