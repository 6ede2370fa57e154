# checks.aarch64-linux.spark-host-vm: a NixOS VM test of nixosModules.spark-host (with tp4-line)
# without GPU and without RDMA device, as nixos-dgx-spark's checks/dgx-spark-boot-vm.nix boots its
# module: the VM boots nixos-dgx-spark's NVIDIA kernel (QEMU's virt machine direct-boots it), the
# fabric ports get their settings, tp4-rdma-check.service fails with its message and the rank
# unit does not start. aarch64-linux only: the kernel is the Spark's (spark-host refuses another
# without tp4.host.kernel.allowOther), and nixos-dgx-spark runs its VM tests on aarch64-linux only.
# Its closure holds that kernel and the driver, so it is expensive: build it on a Spark or an
# aarch64 builder with KVM.
{
  pkgs,
  nixosModules,
  example,
}:
pkgs.testers.runNixOSTest {
  name = "tp4-spark-host";

  # the dgx-spark module sets nixpkgs.overlays and nixpkgs.config (its kernel, the unfree
  # driver), so the node evaluates its own pkgs (as nixos-dgx-spark's boot test does)
  node.pkgsReadOnly = false;
  globalTimeout = 1800;

  nodes.machine = import ./machine.nix {
    inherit nixosModules example;
    inherit ((import ../../modules/lib).rank) hardening;
  };

  testScript = import ./script.nix;
}
