# What every Spark of the line shares beyond the TP4 modules (which lineConfigurations adds with
# this host's name): the platform, the boot disk, the node user, ssh. Edit to your machines.
{ ... }:
{
  nixpkgs.hostPlatform = "aarch64-linux";
  system.stateVersion = "25.11";

  boot.loader.systemd-boot.enable = true;
  boot.loader.efi.canTouchEfiVariables = true;
  fileSystems."/" = {
    device = "/dev/disk/by-label/nixos";
    fsType = "ext4";
  };
  fileSystems."/boot" = {
    device = "/dev/disk/by-label/boot";
    fsType = "vfat";
  };

  # the profile's cluster.user: owns the rank's state, cache and Engram directories; tp4 reaches
  # the node as this user (cluster.identity) and runs serve's commands through sudo
  users.users.tp4 = {
    isNormalUser = true;
    extraGroups = [ "wheel" ];
    openssh.authorizedKeys.keys = [ ];
  };
  security.sudo.wheelNeedsPassword = false;
  services.openssh.enable = true;
}
