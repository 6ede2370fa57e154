# lib's markers and the few lib functions the modules call, for tests/nixos-modules/walk.nix and
# tests/test_nixos_modules.py: mkIf, mkMerge, mkOverride and mkOrder are the { _type = ...; }
# attrsets nixpkgs' lib builds too; option types are names only (nothing is type-checked here).
let
  inherit (builtins)
    concatStringsSep
    replaceStrings
    ;
in
rec {
  mkIf = condition: content: {
    _type = "if";
    inherit condition content;
  };
  mkMerge = contents: {
    _type = "merge";
    inherit contents;
  };
  mkOverride = priority: content: {
    _type = "override";
    inherit priority content;
  };
  mkDefault = mkOverride 1000;
  mkForce = mkOverride 50;
  mkOrder = priority: content: {
    _type = "order";
    inherit priority content;
  };
  mkBefore = mkOrder 500;
  mkAfter = mkOrder 1500;
  mkOption = attrs: attrs // { _type = "option"; };
  mkEnableOption =
    name:
    mkOption {
      type = types.bool;
      default = false;
      description = "Whether to enable ${name}.";
    };
  literalExpression = text: {
    _type = "literalExpression";
    inherit text;
  };
  types = {
    bool = "bool";
    str = "str";
    int = "int";
    path = "path";
    package = "package";
    raw = "raw";
    nullOr = t: "nullOr ${t}";
    listOf = t: "listOf ${t}";
    attrsOf = t: "attrsOf ${t}";
    enum = vs: "enum";
  };
  inherit concatStringsSep;
  # nixpkgs lib/strings.nix lines 1200-1208 (nixpkgs.lib @ de42d442): a string of only safe
  # characters stays as it is, any other is single-quoted
  escapeShellArg =
    a:
    let
      s = toString a;
    in
    if builtins.match "[[:alnum:],._+:@%/-]+" s == null then
      "'${replaceStrings [ "'" ] [ "'\\''" ] s}'"
    else
      s;
  escapeShellArgs = args: concatStringsSep " " (map escapeShellArg args);
  removeSuffix =
    suffix: s:
    let
      n = builtins.stringLength s;
      k = builtins.stringLength suffix;
    in
    if k <= n && builtins.substring (n - k) k s == suffix then builtins.substring 0 (n - k) s else s;
  unique = builtins.foldl' (acc: x: if builtins.elem x acc then acc else acc ++ [ x ]) [ ];
}
