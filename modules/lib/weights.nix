# The weights: on a switched fabric the head exports its checkpoint over NFSv4, read-only, to
# exactly the line's workers, and every worker mounts it (upstream files/nfs-share.sh, as tp4
# share does it: python/tp4/share.py, whose options a test compares with these); on a ring, or
# with nfs.share = false, every node holds its own copy. The rank's container mounts the plan's
# weights volume.
let
  u = import ./util.nix;
  inherit (builtins)
    concatStringsSep
    elemAt
    filter
    head
    length
    match
    tail
    toJSON
    ;
  inherit (u) fail;
in
rec {
  # exports(5) options of the checkpoint (tp4 share's, without fsid=0: the path itself is exported)
  exportOptions = [
    "ro"
    "sync"
    "no_subtree_check"
    "no_root_squash"
    "insecure"
  ];
  # the workers' client options (upstream files/nfs-share.sh)
  mountOptions = [
    "nfsvers=4.2"
    "ro"
    "nconnect=8"
    "rsize=1048576"
    "wsize=1048576"
    "hard"
    "timeo=600"
  ];
  # and how systemd orders it: mounted on first access (a head that boots later does not fail the
  # worker's boot), only once the network is online, never waited on forever
  systemdMountOptions = [
    "_netdev"
    "x-systemd.automount"
    "x-systemd.after=network-online.target"
    "x-systemd.requires=network-online.target"
    "x-systemd.mount-timeout=120s"
  ];
  nfsPort = 2049;

  # NFS is used on a switched fabric unless the profile turns nfs.share off (its default is on:
  # tp4.profile.models.Nfs; a test keeps the two equal)
  usesNfs = { profile, plan }: (profile.nfs.share or true) && plan.line.fabric == "switched";

  workers = plan: tail plan.nodes;

  # the plan's weights mount of a worker (the named volume) and the head's checkpoint mount at the
  # same target: the plan says which is which, the module only reads it
  volumeOf =
    planNode:
    let
      vs = filter (m: m.type == "volume") planNode.run.mounts;
    in
    if length vs != 1 then
      fail "plan: nodes[${toString planNode.rank}].run.mounts"
        "expected one volume (the weights), found ${toString (length vs)}"
        "regenerate the plan with tp4 plan --json"
    else
      head vs;

  exportPath =
    plan:
    let
      ws = workers plan;
      target = (volumeOf (head ws)).target;
      hs = filter (m: m.target == target) (head plan.nodes).run.mounts;
    in
    if ws == [ ] then
      null
    else if hs == [ ] || (head hs).type != "bind" then
      fail "plan: nodes[0].run.mounts" "the head has no bind mount of the checkpoint at ${target}"
        "regenerate the plan with tp4 plan --json"
    else
      (head hs).source;

  # the head's address each worker mounts from (upstream NFS_SERVER_IPS: one for all workers or
  # one per worker); the profile must write it out, as tp4 share reads the same field
  servers =
    { profile, plan }:
    let
      ips =
        (profile.nfs or { }).server_ips or (fail "nfs.server_ips"
          "not written in the profile; the NixOS hosts mount the weights from it (tp4's default is the upstream example's 10.0.22.1)"
          "set nfs.server_ips = [ \"<the head's fabric address>\" ]"
        );
      n = length (workers plan);
      checked = u.imap0 (
        i: a:
        if u.isIPv4 a then
          a
        else
          fail "nfs.server_ips[${toString i}]" "${toJSON a} is not an IPv4 address"
            "write the head's fabric address, e.g. \"10.0.0.1\""
      ) ips;
    in
    if length ips == 1 then
      map (_: head checked) (workers plan)
    else if length ips == n then
      checked
    else
      fail "nfs.server_ips" "${toString (length ips)} addresses for ${toString n} workers"
        "give one address for all workers or one per worker";

  # each worker as the head sees it: its port on the server address's network (what the kernel
  # picks as the source address toward the server), else its fabric ip
  clients =
    {
      plan,
      ports,
      servers,
    }:
    u.imap0 (
      i: w:
      let
        server = elemAt servers i;
        own = builtins.attrValues (ports.${w.name} or { });
        near = filter (p: u.sameSubnet p.prefixLength p.address server) own;
      in
      if near == [ ] then w.host else (head near).address
    ) (workers plan);

  # the head's /etc/exports line (services.nfs.server.exports): the path, quoted when it holds
  # whitespace, then one entry per client
  exportsLine =
    { path, clients }:
    let
      quoted = if match ".*[[:space:]].*" path != null then "\"${path}\"" else path;
      bad = match ".*[\"\\\\].*" path != null;
    in
    if bad then
      fail "model.dir" "${toJSON path} holds a quote or a backslash, which an exports line cannot carry"
        "move the checkpoint to a path without them"
    else if clients == [ ] then
      fail "cluster.workers" "no workers to export the checkpoint to"
        "add the workers, or set nfs.share = false"
    else
      concatStringsSep " " ([ quoted ] ++ map (c: "${c}(${concatStringsSep "," exportOptions})") clients);

  # a worker's fileSystems entry for the head's export
  clientMount =
    {
      server,
      path,
      mountPoint,
    }:
    {
      inherit mountPoint;
      device = "${server}:${path}";
      fsType = "nfs";
      options = mountOptions ++ systemdMountOptions;
    };

  # the plan's weights volume, `<runtime> volume create --driver local` with these options. With
  # NFS it is the volume tp4 share makes on a plain host (python/tp4/share.py WorkerShare: the
  # same options, so share and doctor check a NixOS worker as any other); the host's own mount of
  # the export (clientMount) is what orders the rank after a head that exports. Without NFS it
  # binds the node's own copy.
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
          {
            type = "nfs";
            o = concatStringsSep "," ([ "addr=${nfs.server}" ] ++ mountOptions);
            device = ":${nfs.path}";
          }
        else
          {
            type = "none";
            o = "bind";
            device = localDir;
          };
    };
}
