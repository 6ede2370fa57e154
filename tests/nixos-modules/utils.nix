# The `utils` module argument (nixpkgs nixos/modules/misc/extra-arguments.nix passes
# nixos/lib/utils.nix) for tests/nixos-modules/walk.nix: only what the modules call.
# escapeSystemdExecArg(s) as nixpkgs defines them (nixos/lib/utils.nix, "Quotes an argument for
# use in Exec* service lines", read at NixOS/nixpkgs 0229f9ed): the argument as a string (a path
# interpolated, a number or derivation through toString, anything else refused), JSON-quoted,
# then every `%` and `$` doubled so systemd expands no specifier or variable.
let
  inherit (builtins)
    concatStringsSep
    isFloat
    isInt
    isPath
    isString
    replaceStrings
    toJSON
    ;
  isDerivation = v: builtins.isAttrs v && (v.type or null) == "derivation";
in
rec {
  escapeSystemdExecArg =
    arg:
    let
      s =
        if isPath arg then
          "${arg}"
        else if isString arg then
          arg
        else if isInt arg || isFloat arg || isDerivation arg then
          toString arg
        else
          throw "escapeSystemdExecArg only allows strings, paths, numbers and derivations";
    in
    replaceStrings
      [
        "%"
        "$"
      ]
      [
        "%%"
        "$$"
      ]
      (toJSON s);
  escapeSystemdExecArgs = args: concatStringsSep " " (map escapeSystemdExecArg args);
}
