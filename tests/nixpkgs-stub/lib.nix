# The few nixpkgs lib functions the flake uses, with nixpkgs' semantics, in builtins only.
# A function missing here is one the flake must not use without adding it (and checking it exists
# in nixpkgs' lib).
let
  inherit (builtins)
    listToAttrs
    map
    concatStringsSep
    filter
    attrNames
    ;
in
rec {
  genAttrs =
    names: f:
    listToAttrs (
      map (n: {
        name = n;
        value = f n;
      }) names
    );
  makeBinPath = ps: concatStringsSep ":" (map (p: "${p}/bin") ps);
  # nixpkgs lib/strings.nix lines 1200-1208 (nixpkgs.lib @ de42d442): a string of only safe
  # characters stays as it is, any other is single-quoted
  escapeShellArg =
    arg:
    let
      s = toString arg;
    in
    if builtins.match "[[:alnum:],._+:@%/-]+" s == null then
      "'" + builtins.replaceStrings [ "'" ] [ "'\\''" ] s + "'"
    else
      s;
  licenses.asl20 = {
    spdxId = "Apache-2.0";
  };
  platforms.linux = [
    "aarch64-linux"
    "x86_64-linux"
  ];
  platforms.all = platforms.linux;
}
