# What every Spark of the line shares beyond the TP4 modules (which lineConfigurations adds with
# this host's name) and its own hardware/<host>/hardware-configuration.nix (its disks and boot
# modules, from nixos-generate-config): the platform, the boot loader, the node user, ssh.
# Edit to your machines.
{ ... }:
let
  # the deploying user's public key(s), one per line as in OpenSSH's authorized_keys: the public
  # half of the profile's cluster.identity (~/.ssh/id_ed25519_tp4.pub), with which tp4 deploy and
  # tp4 serve reach each node as the profile's cluster.user
  keysFile = ./authorized_keys;
  keys =
    if builtins.pathExists keysFile then
      builtins.filter (l: builtins.isString l && l != "" && builtins.substring 0 1 l != "#") (
        builtins.split "\n" (builtins.readFile keysFile)
      )
    else
      [ ];
in
{
  nixpkgs.hostPlatform = "aarch64-linux";
  system.stateVersion = "25.11";

  # as nixos-dgx-spark's templates/dgx-spark/configuration.nix (its installer boots by UEFI)
  boot.loader.systemd-boot.enable = true;
  boot.loader.efi.canTouchEfiVariables = true;

  # the profile's cluster.user: owns the rank's state, cache and Engram directories; tp4 reaches
  # the node as this user (cluster.identity) and runs serve's commands through sudo. Without a
  # key nobody could log in after the switch: evaluation stops and says what to add (the list's
  # element throws, so a module that sets the keys with mkForce replaces it without reading it)
  users.users.tp4 = {
    isNormalUser = true;
    extraGroups = [ "wheel" ];
    openssh.authorizedKeys.keys =
      if keys != [ ] then
        keys
      else
        [
          (throw "users.users.tp4.openssh.authorizedKeys.keys: authorized_keys next to configuration.nix has no key, and tp4 reaches every node over ssh as tp4; fix: `cp ~/.ssh/id_ed25519_tp4.pub authorized_keys` (the public half of the profile's cluster.identity) and `git add authorized_keys`")
        ];
  };
  security.sudo.wheelNeedsPassword = false;
  services.openssh.enable = true;
}
