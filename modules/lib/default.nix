# The host settings of a TP4 line's NixOS hosts, as builtins-only functions of their inputs: the
# plan (builtins.fromJSON of the plan file committed beside the profile, `tp4 plan --json -o
# plan.json`) and the hosts file (per node the fabric ports the profile does not hold). The
# profile is never read here: everything a host needs is a field of the plan, and this maps the
# fields to what modules/spark-host.nix and modules/tp4-line.nix wire into NixOS options.
# tests/test_nixos_lib.py evaluates these with a bare Nix.
let
  u = import ./util.nix;
  hosts = import ./hosts.nix;
  weights = import ./weights.nix;
  rank = import ./rank.nix;
  kernel = import ./kernel.nix;
  inherit (builtins)
    elemAt
    map
    toJSON
    ;
  inherit (u) fail optionals;

  # the plan fields this reads are those of tp4.plan/1.9 (a plan file written by an older tp4
  # lacks them): a plan of another schema stops evaluation saying how to write it again
  minor = 9;
  checked =
    plan:
    let
      m = builtins.match "tp4\\.plan/1\\.([0-9]+)" (plan.schema or "");
    in
    if m == null || builtins.fromJSON (elemAt m 0) < minor then
      fail "tp4.planFile"
        "${toJSON (plan.schema or null)} is not a plan this module reads (tp4.plan/1.${toString minor} or later)"
        "write the plan again with this flake's tp4: tp4 plan --json -o plan.json --profile profile.toml"
    else
      plan;
in
{
  inherit
    u
    hosts
    weights
    rank
    kernel
    ;

  # the names of the line's hosts, in rank order (for nixosConfigurations)
  hostNames = plan: map (n: n.name) plan.nodes;

  # everything the two modules set on host `name`
  host =
    {
      plan,
      name,
      hostsFile ? { },
      displayReservation ? true,
      weightsMountPoint ? "/var/lib/tp4/weights",
      localWeights ? null,
    }:
    let
      ports = hosts.ports {
        plan = checked plan;
        hosts = hostsFile;
      };
      node = rank.planNode (checked plan) name;
      nodePorts = builtins.seq node ports.${name};
      isHead = node.rank == 0;
      nfs = plan.line.nfs != null;
      export = if nfs then plan.line.nfs.export else null;
      worker = if isHead || !nfs then null else elemAt plan.line.nfs.servers (node.rank - 1);
      volume = if isHead then null else weights.volumeOf node;
      local =
        if localWeights != null then
          localWeights
        else
          fail "tp4.host.weights.localDir"
            "${name} keeps its own copy of the checkpoint (${
              if plan.line.fabric == "ring" then "a ring has no NFS share" else "nfs.share is off"
            }), so the weights volume needs its directory"
            "set tp4.host.weights.localDir to the checkpoint's directory on ${name}";
      unit = rank.container plan node;
    in
    {
      inherit name;
      inherit (node) rank role;
      inherit (plan.line) fabric;
      interfaces = hosts.interfaces nodePorts;
      sysctl = hosts.sysctl nodePorts // (if plan.line.fabric == "ring" then hosts.ringSysctl else { });
      kernelModules = kernel.rdmaModules;
      kernelParams = optionals displayReservation kernel.displayReservationParams;
      # the plan's SM clock cap (the profile's cluster.gpu_clock_mhz; null leaves the clock alone)
      gpuClockMHz = plan.line.gpu_clock_mhz;
      rdmaCheck = {
        unit = node.service.host_units.rdma_check;
        # how long the check waits at boot for the ports to be ACTIVE with their GIDs (the same
        # bound as the ring's link wait, upstream's dsv41-mesh's 120 s)
        timeout = 120;
        ports = hosts.rdmaPorts {
          hosts = hostsFile;
          inherit nodePorts;
          planNode = node;
          node = name;
        };
        # the plan's pinned index must be the one found; unpinned, the check writes what it found
        gidIndex = if node.gid.pinned_by != null then node.gid.value else null;
        gidFile = "${dirOf node.service.env_file}/gid-index";
      };
      nfs = {
        exports =
          if nfs && isHead then
            weights.exportsLine {
              path = export;
              clients = weights.clients { inherit plan ports; };
              options = plan.line.nfs.export_options;
            }
          else
            null;
        mount =
          if nfs && !isHead then
            weights.clientMount {
              server = worker;
              path = export;
              mountPoint = weightsMountPoint;
              options = plan.line.nfs.mount_options;
            }
          else
            null;
      };
      weightsVolume =
        if isHead then
          null
        else
          weights.volume {
            name = volume.source;
            nfs = if nfs then elemAt plan.line.nfs.volumes (node.rank - 1) else null;
            localDir = if nfs then null else local;
          }
          // {
            unit = node.service.host_units.weights_volume;
            # what the volume's unit waits for: the host's NFS mount (a head that exports), else the copy
            requiresMount = if nfs then weightsMountPoint else local;
          };
      firewall = rank.firewall { inherit plan node nfs; };
      ring =
        if plan.line.fabric == "ring" then
          hosts.ringHairpin plan
          // {
            # the mesh's unit, by the plan's name (service.mesh_unit)
            unit = node.service.mesh_unit;
            marker = rank.marker plan node;
          }
        else
          null;
      drmNode = rank.drmNode node;
      rankUnit = unit // {
        ordering = rank.ordering { inherit plan node; };
        inherit (rank) serviceConfig;
        unitConfig = rank.unitConfigOf node;
        directories = rank.directories node;
        readiness = rank.readiness { inherit plan node; };
      };
    };
}
