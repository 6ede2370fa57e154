# A node's rank as a NixOS unit, read from the committed plan (`tp4 plan --json -o plan.json`): the oci-containers
# container is the plan's run spec flag for flag (python/tp4/serving/serve.py run_argv renders the same
# spec for a plain host; a test compares the two), the env file is the one tp4 serve writes, the
# unit is the plan's service.unit. Nothing here derives an engine flag or an env value.
let
  u = import ./util.nix;
  inherit (builtins)
    concatMap
    elemAt
    filter
    length
    listToAttrs
    toJSON
    ;
  inherit (u) fail optional optionals;
in
rec {
  # a ring with RoCEnante's opposite-node paths (the plan's DSV41_ROCE_RING=1) marks the RDMA
  # packets of those paths on every fabric device (sparkring's RDMA-TX rewrite probe, upstream's
  # dsv41-mesh-marker@<rdma-dev>): UDP source port 65535, EtherType rewritten to 0x88b5
  markerDevices = [
    "rocep1s0f0"
    "rocep1s0f1"
    "roceP2p1s0f0"
    "roceP2p1s0f1"
  ];
  marker =
    plan: node:
    if plan.line.fabric == "ring" && (node.env.DSV41_ROCE_RING or "0") == "1" then
      {
        devices = markerDevices;
        units = map (d: "tp4-mesh-marker@${d}.service") markerDevices;
        sourcePort = 65535;
        etherType = "0x88b5";
      }
    else
      null;

  # the display reservation's DRM node the plan hands the engine (DSV41_ENGRAM_DRM_NODE), and the
  # systemd device unit the rank waits for (spark-host tags the node for systemd)
  drmNode =
    node:
    let
      path = node.env.DSV41_ENGRAM_DRM_NODE or null;
      card = if path == null then null else builtins.match "/dev/dri/(card[0-9]{1,3})" path;
    in
    if path == null then
      null
    else if card == null then
      fail "plan: nodes[${toString node.rank}].env.DSV41_ENGRAM_DRM_NODE"
        "${toJSON path} is not a DRM card node"
        "set it to the display reservation's node, e.g. /dev/dri/card0"
    else
      {
        inherit path;
        kernel = elemAt card 0;
        unit = "dev-dri-${elemAt card 0}.device";
      };

  planNode =
    plan: name:
    let
      found = filter (n: n.name == name) plan.nodes;
    in
    if length found != 1 then
      fail "tp4.node" "${toJSON name} is not a node of the plan (${
        u.joinWords (map (n: n.name) plan.nodes)
      })" "set tp4.node to the name of this host in the profile"
    else
      elemAt found 0;

  # the plan's run.health as podman's flags, as serve passes them (python/tp4/serving/serve.py
  # health_flags): podman reads no health check from an OCI image's config, so the image's check is
  # given explicitly; the command is a JSON array, podman's exec form (no shell)
  healthOptions =
    run:
    let
      h = run.health;
    in
    [
      "--health-cmd=${toJSON h.cmd}"
      "--health-interval=${toString h.interval}s"
      "--health-timeout=${toString h.timeout}s"
      "--health-start-period=${toString h.start_period}s"
      "--health-retries=${toString h.retries}"
    ];

  # the rank's virtualisation.oci-containers entry: { backend; name; unit; container; }
  container =
    plan: node:
    let
      rank = node;
      run = rank.run;
      svc = rank.service;
      where = "plan: nodes[${toString rank.rank}]";
      runtime = svc.runtime;
      unit = "${runtime}-${run.container}.service";
    in
    if svc.kind != "nixos" then
      fail
        "${if rank.rank == 0 then "cluster.head" else "cluster.workers[${toString (rank.rank - 1)}]"}.kind"
        "${rank.name} is a ${toJSON svc.kind} host in the profile, so tp4 runs its container over ssh, not the NixOS unit"
        "set kind = \"nixos\" (and runtime) for this node and regenerate the plan"
    # oci-containers names the unit of container C `<backend>-C.service`: the plan's service.unit
    # must be the unit this module makes, or serve would start another
    else if svc.unit != unit then
      fail "${where}.service.unit" "${toJSON svc.unit} is not oci-containers' ${unit}"
        "regenerate the plan with this tp4"
    else
      {
        backend = runtime;
        name = run.container;
        inherit unit;
        container = {
          inherit (run) image;
          cmd = run.command;
          environmentFiles = [ svc.env_file ];
          volumes = map (m: "${m.source}:${m.target}" + (if m.read_only then ":ro" else "")) run.mounts;
          devices = run.devices ++ svc.gpu_devices;
          inherit (run) privileged;
          capabilities = listToAttrs (
            map (c: {
              name = c;
              value = true;
            }) run.cap_add
          );
          networks = [ run.network ];
          labels = {
            "tp4.line" = plan.line.id;
            "tp4.rank" = toString rank.rank;
            # the digest of the plan the rank runs from, as serve labels it (python/tp4/serving/serve.py
            # PLAN_LABEL): tp4 status compares it with the current plan
            "tp4.plan" = plan.digest;
          };
          extraOptions = [
            "--ipc=${run.ipc}"
          ]
          # podman refuses --shm-size with the host's IPC namespace (serve leaves it out too)
          ++ optional (run.ipc != "host") "--shm-size=${run.shm_size}"
          ++ [
            "--ulimit=memlock=${run.ulimits.memlock}"
            "--ulimit=stack=${run.ulimits.stack}"
          ]
          ++ healthOptions run;
          # the image is on the node (packages.image, or tp4's image store): never pulled
          pull = "never";
          # tp4 serve writes the env file, then starts the unit
          autoStart = false;
        };
      };

  # the host directories the rank needs (the plan's service.directories), as tmpfiles makes them
  directories =
    node:
    map (d: {
      inherit (d) path mode;
      user = d.owner;
    }) node.service.directories;

  # the rank unit's ordering: after the network, the RDMA check, the weights volume (which waits
  # for the weights mount), on a ring the mesh and its markers, and the DRM node the plan hands
  # it; the host units by the names the plan gives them (service.host_units, mesh_unit), under
  # which spark-host declares them
  ordering =
    { plan, node }:
    let
      units = node.service.host_units;
      mark = marker plan node;
      drm = drmNode node;
      needs = [
        units.rdma_check
      ]
      ++ optional (units.weights_volume != null) units.weights_volume
      ++ optional (node.service.mesh_unit != null) node.service.mesh_unit
      ++ optionals (mark != null) mark.units
      ++ optional (drm != null) drm.unit;
    in
    {
      wants = [ "network-online.target" ];
      after = [ "network-online.target" ] ++ needs;
      requires = needs;
    };

  # the hardening of the rank unit, from nixpkgs' ollama module's list: only what a root container
  # runtime as the unit's ExecStart can live with. With podman the container's processes descend
  # from the unit's (podman, conmon, crun), so a seccomp filter of the unit is theirs too; a
  # mount namespace of the unit would hold the container's mounts. docs/nixos.md says why each
  # other setting of ollama's is left out.
  hardening = {
    # root runtimes need no setuid helper (rootless podman's newuidmap would)
    NoNewPrivileges = true;
    LockPersonality = true;
    RestrictRealtime = true;
    SystemCallArchitectures = "native";
    # AF_NETLINK: getifaddrs (NCCL, Gloo pick their interface) and rdma-core's device list
    RestrictAddressFamilies = [
      "AF_UNIX"
      "AF_INET"
      "AF_INET6"
      "AF_NETLINK"
    ];
  };

  # systemd limits of the rank unit: unlocked memory (RDMA registers the KV pool), and a restart
  # that cannot loop on a broken line: growing delays, at most 3 starts an hour
  serviceConfig = hardening // {
    LimitMEMLOCK = "infinity";
    Restart = "on-failure";
    RestartSec = "10s";
    RestartSteps = 5;
    RestartMaxDelaySec = "5min";
  };
  unitConfig = {
    StartLimitIntervalSec = 3600;
    StartLimitBurst = 3;
  };

  # the host files the rank only reads (a ring's patched NCCL in NCCL_HOST_DIR, a head's
  # checkpoint directory): a start without one fails as an assertion naming the path, not inside
  # the runtime; the writable ones are made by tmpfiles (directories)
  readOnlyBinds =
    node:
    let
      model = (elemAt node.run.mounts 0).target;
    in
    map (m: m.source) (
      filter (m: m.type == "bind" && (m.read_only || m.target == model)) node.run.mounts
    );
  unitConfigOf =
    node:
    let
      paths = readOnlyBinds node;
    in
    unitConfig // (if paths == [ ] then { } else { AssertPathExists = paths; });

  # the rank's readiness unit (the plan's service.host_units.ready), beside the rank unit, wanted
  # by it and bound to it, so the rank's start never waits on it; it runs `tp4 bootlog wait` on the plan file and this node's rank (its
  # pattern, bound and boot lines are the plan's service.ready); its bound gives the unit its own
  readiness =
    { plan, node }:
    {
      unit = node.service.host_units.ready;
      inherit (node.service.ready) timeout;
      args = [
        "bootlog"
        "wait"
        "--rank"
        (toString node.rank)
      ];
    };

  # firewall: the head serves the API and the dist init port (and NFS when it exports); every
  # node trusts the bootstrap interface, where NCCL and Gloo listen on ephemeral ports
  firewall =
    {
      plan,
      node,
      nfs,
    }:
    let
      head = node.rank == 0;
      env = node.env;
    in
    {
      tcp =
        optionals head [
          plan.line.api_port
          plan.line.dist_init_port
        ]
        ++ optional (head && nfs) plan.line.nfs.port;
      trustedInterfaces = u.unique (
        concatMap (k: optional (env ? ${k}) env.${k}) [
          "NCCL_SOCKET_IFNAME"
          "GLOO_SOCKET_IFNAME"
        ]
      );
    };
}
