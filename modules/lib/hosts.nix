# The line's hosts and their fabric ports: the plan's nodes (each node's fabric `host` address) and
# the host facts the profile does not hold (builtins.fromTOML of a hosts file such as
# examples/spark-line/hosts.toml): per node the fabric ports besides the one that carries the
# node's address. The hosts file is read only here, so its faults are checked here; the plan is
# tp4's, checked when it was rendered. A bad hosts file throws `field: reason; fix: ...`.
let
  u = import ./util.nix;
  inherit (builtins)
    attrNames
    concatMap
    elem
    filter
    head
    isInt
    isString
    length
    listToAttrs
    mapAttrs
    toJSON
    ;
  inherit (u) fail;

  # what a DGX Spark calls its four RDMA functions' netdevs (upstream's host notes: rocep1s0f0 is
  # 0000:01:00.0, netdev enp1s0f0np0, ...); confirm on a host with `ibdev2netdev`
  sparkNetdevs = {
    rocep1s0f0 = "enp1s0f0np0";
    rocep1s0f1 = "enp1s0f1np1";
    roceP2p1s0f0 = "enP2p1s0f0np0";
    roceP2p1s0f1 = "enP2p1s0f1np1";
  };

  # and their PCI functions (the ring's devlink parameters are per function)
  sparkFunctions = {
    rocep1s0f0 = "0000:01:00.0";
    rocep1s0f1 = "0000:01:00.1";
    roceP2p1s0f0 = "0002:01:00.0";
    roceP2p1s0f1 = "0002:01:00.1";
  };

  # RoCE v2 needs jumbo frames on every fabric port (RoCE MTU 4096 inside Ethernet MTU 9000)
  fabricMtu = 9000;

  netdevName =
    where: n:
    if isString n && builtins.match "[A-Za-z0-9_.@-]{1,15}" n != null then
      n
    else
      fail where "${toJSON n} is not a network interface name"
        "1-15 letters, digits, '_', '.', '@' or '-' as `ip link` lists them (e.g. enp1s0f0np0)";

  address =
    where: a:
    if u.isIPv4 a then
      a
    else if a == null then
      fail where "missing" "write the port's IPv4 address, e.g. address = \"10.0.1.1\""
    else
      fail where "${toJSON a} is not an IPv4 address"
        "write four numbers 0-255 joined by '.', e.g. \"10.0.1.1\"";

  prefix =
    where: p:
    if isInt p && p >= 1 && p <= 32 then
      p
    else
      fail where "${toJSON p} is not a prefix length"
        "a whole number from 1 to 32 (24: one /24 per cable)";
in
rec {
  inherit sparkNetdevs sparkFunctions fabricMtu;

  # a ring's hairpin queue: devlink's driverinit hairpin_queue_size on the four fabric functions
  # (RoCEnante's size cap follows it), the plan's line.ring_hairpin_queue
  ringHairpin = plan: {
    size = plan.line.ring_hairpin_queue;
    functions = map (hca: sparkFunctions.${hca}) [
      "rocep1s0f0"
      "rocep1s0f1"
      "roceP2p1s0f0"
      "roceP2p1s0f1"
    ];
    # the four fabric links (one DAC each), which tp4-mesh waits for before it sets them up
    links = map (hca: sparkNetdevs.${hca}) [
      "rocep1s0f0"
      "rocep1s0f1"
      "roceP2p1s0f0"
      "roceP2p1s0f1"
    ];
    linkTimeout = 120;
  };

  # every node's fabric ports: { <node> = { <netdev> = { address; prefixLength; where; }; }; }.
  # The node's plan `host` sits on hosts.fabric.netdev (default the netdev of rocep1s0f0), the
  # hosts file adds [nodes.<node>.ports.<netdev>] tables. No port of the hosts file may take an
  # address the line already uses.
  ports =
    {
      plan,
      hosts ? { },
    }:
    let
      list = map (n: {
        inherit (n) name;
        ip = n.host;
        where = "plan: nodes[${toString n.rank}].host";
      }) plan.nodes;
      fabric = hosts.fabric or { };
      primary = netdevName "hosts: fabric.netdev" (fabric.netdev or sparkNetdevs.rocep1s0f0);
      defaultPrefix = prefix "hosts: fabric.prefix_length" (fabric.prefix_length or 24);
      extra = hosts.nodes or { };
      unknown = filter (n: !(elem n (map (x: x.name) list))) (attrNames extra);
      portsOf =
        n:
        let
          own = (extra.${n.name} or { }).ports or { };
          mk =
            netdev: p:
            let
              where = "hosts: nodes.${n.name}.ports.${netdev}";
            in
            if netdev == primary then
              fail where "${netdev} already carries the plan's address of ${n.name} (${n.where})"
                "remove this table, or name another port"
            else
              {
                netdev = netdevName where netdev;
                address = address "${where}.address" (p.address or null);
                prefixLength = prefix "${where}.prefix_length" (p.prefix_length or defaultPrefix);
                inherit where;
              };
        in
        [
          {
            netdev = primary;
            address = n.ip;
            prefixLength = defaultPrefix;
            inherit (n) where;
          }
        ]
        ++ map (netdev: mk netdev own.${netdev}) (attrNames own);
      all' = map (n: {
        inherit (n) name;
        ports = portsOf n;
      }) list;
      flat = concatMap (x: x.ports) all';
      dup = u.duplicates (map (p: p.address) flat);
      twice = filter (p: p.address == head dup) flat;
    in
    if unknown != [ ] then
      fail "hosts: nodes.${head unknown}" "not a node of the plan (${
        u.joinWords (map (x: x.name) list)
      })" "name a node of the profile's cluster.head or cluster.workers"
    else if dup != [ ] then
      fail (builtins.elemAt twice 1).where "${head dup} is also ${(head twice).where}"
        "give every node and port its own address"
    else
      listToAttrs (
        map (x: {
          inherit (x) name;
          value = listToAttrs (
            map (p: {
              name = p.netdev;
              value = p;
            }) x.ports
          );
        }) all'
      );

  # networking.interfaces of one node's ports: the address and MTU 9000
  interfaces =
    nodePorts:
    mapAttrs (_: p: {
      mtu = fabricMtu;
      ipv4.addresses = [ { inherit (p) address prefixLength; } ];
    }) nodePorts;

  # boot.kernel.sysctl of one node's ports: reply to ARP only for the port's own address and
  # announce it from that port (several ports of one host in one L2 domain; RoCE will not wait
  # for a wrong ARP answer to be corrected)
  sysctl =
    nodePorts:
    listToAttrs (
      concatMap (netdev: [
        {
          name = "net.ipv4.conf.${netdev}.arp_ignore";
          value = 1;
        }
        {
          name = "net.ipv4.conf.${netdev}.arp_announce";
          value = 2;
        }
      ]) (attrNames nodePorts)
    );

  # boot.kernel.sysctl of every node of a ring: IPv4 forwarding. The mesh routes a node's traffic
  # to the opposite node via a neighbour (its /32 routes), and that neighbour forwards it: any node
  # of a four-node ring may be the relay of another's route (sparkring's ring_doctor finds
  # `ip-forward-disabled` on such a relay and sets net.ipv4.ip_forward=1; tp4 doctor's
  # RING.IP_FORWARD checks it)
  ringSysctl = {
    "net.ipv4.ip_forward" = 1;
  };

  # the RDMA ports the rank uses on this node (the plan's gid.hcas), each with the netdev and the
  # address whose RoCE v2 IPv4-mapped GID the check unit must find
  rdmaPorts =
    {
      hosts ? { },
      nodePorts,
      node,
      planNode,
    }:
    let
      table = sparkNetdevs // ((hosts.fabric or { }).rdma_netdevs or { });
      one =
        hca:
        let
          netdev =
            table.${hca} or (fail "hosts: fabric.rdma_netdevs.${hca}"
              "the line uses ${hca} (fabric.hcas) but its netdev is not known"
              "add ${hca} = \"<netdev>\" (see ibdev2netdev)"
            );
          port =
            nodePorts.${netdev} or (fail "hosts: nodes.${node}.ports.${netdev}"
              "the line uses ${hca} (fabric.hcas), whose netdev ${netdev} has no address on ${node}"
              "add [nodes.${node}.ports.${netdev}] with address = \"...\" (RoCE v2 derives its GID from it)"
            );
        in
        {
          inherit hca netdev;
          inherit (port) address;
        };
    in
    map one planNode.gid.hcas;
}
