# A TP4 line of four DGX Sparks on NixOS, from one tp4 profile (`nix flake init -t <tp4>#spark-line`).
# profile.toml is what tp4 plan/serve read; plan.json is its plan (`tp4 plan --json -o plan.json
# --profile profile.toml`), which the hosts read: write it again after every edit of the profile
# and commit both (`nix flake check` fails while it is stale); hosts.toml adds each node's second
# fabric port;
# configuration.nix holds what the hosts share; hardware/<host>/hardware-configuration.nix is each
# Spark's own (nixos-generate-config's), and authorized_keys the deploying user's public key:
# until they exist, evaluation stops and says how to make them (docs/nixos.md of tp4).
# `nixos-rebuild switch --flake .#spark1` (or tp4 deploy) sets a host up.
{
  description = "A TP4 line of four DGX Sparks on NixOS";

  # the tp4 flake this was initialised from (`nix flake init -t <it>#spark-line`): set it to that
  # flake's reference (a git URL, `github:<owner>/tp4`, or `path:/srv/tp4`); `nix flake lock`
  # then pins it
  inputs.tp4.url = "github:OWNER/tp4";

  outputs =
    { self, tp4 }:
    {
      nixosConfigurations = tp4.lib.lineConfigurations {
        plan = ./plan.json;
        hostsFile = ./hosts.toml;
        modules = [ ./configuration.nix ];
        hardware = ./hardware;
      };
      # the committed plan is the one the profile renders (tp4 plan --check plan.json)
      checks = tp4.lib.planChecks {
        profile = ./profile.toml;
        plan = ./plan.json;
      };
    };
}
