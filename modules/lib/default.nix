# The host settings of a TP4 line's NixOS hosts, as builtins-only functions of their inputs: the
# profile (builtins.fromTOML of the tp4 profile), the plan (builtins.fromJSON of `tp4 plan --json`
# of that profile) and the hosts file (per node the fabric ports the profile does not hold).
# modules/spark-host.nix and modules/tp4-line.nix only wire `host`'s result into NixOS options;
# tests/test_nixos_lib.py evaluates these with a bare Nix.
let
  u = import ./util.nix;
  hosts = import ./hosts.nix;
  weights = import ./weights.nix;
  rank = import ./rank.nix;
  kernel = import ./kernel.nix;
  inherit (builtins)
    elemAt
    length
    map
    toJSON
    ;
  inherit (u) fail optionals;

  # the plan must be the profile's: same nodes, same order, same addresses
  samePlan =
    profile: plan:
    let
      ns = hosts.nodes profile;
      pn = plan.nodes;
      mismatch = builtins.filter (
        i: (elemAt ns i).name != (elemAt pn i).name || (elemAt ns i).ip != (elemAt pn i).host
      ) (builtins.genList (i: i) (length ns));
    in
    if plan.schema or null == null || builtins.match "tp4\\.plan/1\\..*" plan.schema == null then
      fail "plan: schema" "${toJSON (plan.schema or null)} is not a tp4 plan (tp4.plan/1.x)"
        "pass the output of tp4 plan --json"
    else if length ns != length pn then
      fail "plan: nodes" "${toString (length pn)} nodes, the profile has ${toString (length ns)}"
        "regenerate the plan from this profile (tp4 plan --json --profile FILE)"
    else if mismatch != [ ] then
      let
        i = elemAt mismatch 0;
      in
      fail "plan: nodes[${toString i}]"
        "${(elemAt pn i).name} ${(elemAt pn i).host} is ${(elemAt ns i).name} ${(elemAt ns i).ip} (${(elemAt ns i).where}) in the profile"
        "regenerate the plan from this profile (tp4 plan --json --profile FILE)"
    else
      true;
in
{
  inherit
    u
    hosts
    weights
    rank
    kernel
    ;

  # the names of the line's hosts, in rank order (for nixosConfigurations; needs no plan)
  hostNames = profile: map (n: n.name) (hosts.nodes profile);

  # everything the two modules set on host `name`
  host =
    {
      profile,
      plan,
      name,
      hostsFile ? { },
      displayReservation ? true,
      weightsMountPoint ? "/var/lib/tp4/weights",
      localWeights ? null,
    }:
    let
      # the profile's own faults first (a missing or repeated address), then whether the plan is its
      ports = hosts.ports {
        inherit profile;
        hosts = hostsFile;
      };
    in
    assert builtins.seq ports (samePlan profile plan);
    let
      nodePorts =
        ports.${name} or (fail "tp4.node" "${toJSON name} is not a node of the profile (${
          u.joinWords (map (n: n.name) (hosts.nodes profile))
        })" "set tp4.node to this host's name in the profile");
      node = builtins.seq nodePorts (rank.planNode plan name);
      isHead = node.rank == 0;
      nfs = weights.usesNfs { inherit profile plan; };
      servers = if nfs then weights.servers { inherit profile plan; } else [ ];
      export = if nfs then weights.exportPath plan else null;
      worker = if isHead then null else elemAt servers (node.rank - 1);
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
      gpuClockMHz =
        plan.line.gpu_clock_mhz
          or (fail "plan: line.gpu_clock_mhz" "missing (a plan older than tp4.plan/1.6)"
            "regenerate the plan with this tp4 (tp4 plan --json)"
          );
      rdmaCheck = {
        unit = rank.rdmaCheckUnit;
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
              clients = weights.clients { inherit plan ports servers; };
            }
          else
            null;
        mount =
          if nfs && !isHead then
            weights.clientMount {
              server = worker;
              path = export;
              mountPoint = weightsMountPoint;
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
            nfs =
              if nfs then
                {
                  server = worker;
                  path = export;
                }
              else
                null;
            localDir = if nfs then null else local;
          }
          // {
            # what the volume's unit waits for: the host's NFS mount (a head that exports), else the copy
            requiresMount = if nfs then weightsMountPoint else local;
          };
      firewall = rank.firewall { inherit plan node nfs; };
      ring =
        if plan.line.fabric == "ring" then
          hosts.ringHairpin profile // { marker = rank.marker plan node; }
        else
          null;
      drmNode = rank.drmNode node;
      rankUnit = unit // {
        ordering = rank.ordering {
          inherit plan node;
          weightsVolume = !isHead;
        };
        inherit (rank) serviceConfig;
        unitConfig = rank.unitConfigOf node;
        directories = rank.directories node;
        readiness = rank.readiness { inherit plan node; };
      };
    };
}
