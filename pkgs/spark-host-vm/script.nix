# The test script of checks.aarch64-linux.spark-host-vm, a function of the test's nodes (as
# nixos/lib/testing/testScript.nix calls it): every name and value is the node's own
# (config.tp4.settings), so the script checks what the modules configured.
{ nodes, ... }:
let
  m = nodes.machine;
  s = m.tp4.settings;
  inherit (builtins)
    attrNames
    concatStringsSep
    head
    replaceStrings
    toJSON
    ;
  # a shell word; then a Python string literal (JSON's is one for this text)
  sq = t: "'" + replaceStrings [ "'" ] [ "'\\''" ] t + "'";
  py = toJSON;
  succeed = cmd: "machine.succeed(${py cmd})";
  fail = cmd: "machine.fail(${py cmd})";
  first = head s.rdmaCheck.ports;
  rank = s.rankUnit.unit;
  container = s.rankUnit.name;
  ready = s.rankUnit.readiness.unit;
  # what modules/rdma-check.sh prints for a port whose RDMA device is missing (a VM has none),
  # while it waits and when it gives up after its deadline
  message = "${first.hca}: no such RDMA device (for ${first.netdev} ${first.address}); fix: load mlx5_ib";
  fabric = concatStringsSep "\n" (
    map (
      n:
      let
        i = s.interfaces.${n};
        a = head i.ipv4.addresses;
      in
      concatStringsSep "\n" [
        (succeed "ip -o link show ${n} | grep -q ' mtu ${toString i.mtu} '")
        (succeed "ip -o -4 addr show ${n} | grep -q ' inet ${a.address}/${toString a.prefixLength} '")
      ]
    ) (attrNames s.interfaces)
  );
  # the head's export line: "<path> <client>(<options>) ..."
  exportWords = builtins.filter builtins.isString (builtins.split " " s.nfs.exports);
  exportPath = head exportWords;
  exports = concatStringsSep "\n" (
    [ "machine.wait_for_unit(\"nfs-server.service\")" ]
    ++ map (w: succeed "exportfs -v | grep -qF ${sq (head (builtins.split "[(]" w) + "(")}") (
      builtins.tail exportWords
    )
    ++ [ (succeed "exportfs -v | grep -qF ${sq exportPath}") ]
  );
  sysctl = concatStringsSep "\n" (
    map (k: succeed "test \"$(sysctl -n ${k})\" = ${toString s.sysctl.${k}}") (attrNames s.sysctl)
  );
in
''
  machine.wait_for_unit("multi-user.target")

  # the Spark's system: nixos-dgx-spark's kernel (the running release is its modDirVersion; its
  # version attribute adds "-nvidia"), headless, the display reservation on the command line
  ${succeed "test \"$(uname -r)\" = ${m.boot.kernelPackages.kernel.modDirVersion}"}
  ${succeed "test \"$(systemctl get-default)\" = multi-user.target"}
  ${succeed "grep -q 'nvidia-drm.modeset=1 nvidia-drm.fbdev=0' /proc/cmdline"}

  # the fabric ports: address, MTU 9000, ARP answered per port
  ${fabric}
  ${sysctl}

  # the head exports the checkpoint to the workers
  ${exports}

  # no RDMA device in the VM: the check fails loudly, its message in the journal
  machine.wait_until_succeeds(${py "systemctl is-failed --quiet ${s.rdmaCheck.unit}"})
  ${succeed "journalctl -b -u ${s.rdmaCheck.unit} -o cat | grep -qF ${sq message}"}
  ${fail "test -e ${s.rdmaCheck.gidFile}"}

  # the rank requires the check: its start fails on the dependency, no container runs, and its
  # readiness never starts (nothing started it at boot: tp4 serve starts it)
  ${fail "systemctl is-active --quiet ${rank}"}
  ${fail "systemctl start ${rank}"}
  ${fail "systemctl is-active --quiet ${rank}"}
  ${succeed "journalctl -b -u ${rank} -o cat | grep -q 'Dependency failed for'"}
  ${succeed "test -z \"$(podman ps --all --quiet --filter name=^${container}$)\""}
  ${fail "systemctl is-active --quiet ${ready}"}
  ${succeed "test \"$(systemctl show -p NoNewPrivileges --value ${rank})\" = yes"}

  # the runtime starts a container under the rank unit's hardening
  machine.wait_for_unit("podman-tp4-probe.service")
  machine.wait_until_succeeds("grep -qx probe-ok /var/lib/tp4-probe/ok")
  ${succeed "test \"$(systemctl show -p NoNewPrivileges --value podman-tp4-probe.service)\" = yes"}
''
