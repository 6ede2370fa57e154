# Which option paths a module's `config` sets, for tests/test_nixos_modules.py: the module is
# called with `lib`'s markers as nixpkgs' lib builds them (mkIf, mkMerge, mkOverride, mkOrder are
# plain { _type = ...; } attrsets there too) and a fixture `config`; its `config` is walked, a
# mkIf taken when its condition holds on the fixture, down to the entries of modules/options.toml
# (an option's value is not walked into). A path that is no entry and no prefix of one is
# reported with entry = null. This is no module system: nothing is merged, typed or defaulted.
{
  # a module file, or a module function
  module,
  optionsFile,
  config,
  pkgs,
  # the sections of the data file whose entries a path may reach
  sections ? [
    "set"
    "own"
  ],
}:
let
  inherit (builtins)
    all
    any
    attrNames
    concatMap
    concatStringsSep
    elemAt
    filter
    genList
    head
    isAttrs
    isString
    length
    split
    ;

  lib = import ./lib.nix;

  options = builtins.fromTOML (builtins.readFile optionsFile);
  components = e: filter isString (split "\\." e);
  entries = map (e: {
    name = e;
    parts = components e;
  }) (concatMap (s: attrNames options.${s}) sections);
  same =
    path: parts: i:
    elemAt parts i == "<name>" || elemAt parts i == elemAt path i;
  matches =
    path: e: length path == length e.parts && all (same path e.parts) (genList (i: i) (length path));
  below =
    path: e: length path < length e.parts && all (same path e.parts) (genList (i: i) (length path));
  marker = v: t: isAttrs v && (v._type or null) == t;

  walk =
    path: v:
    if marker v "if" then
      (if v.condition then walk path v.content else [ ])
    else if marker v "merge" then
      concatMap (walk path) v.contents
    else if marker v "override" || marker v "order" then
      walk path v.content
    else
      let
        hit = filter (matches path) entries;
      in
      if hit != [ ] then
        [
          {
            path = concatStringsSep "." path;
            entry = (head hit).name;
            value = plain v;
          }
        ]
      else if isAttrs v && any (below path) entries then
        concatMap (n: walk (path ++ [ n ]) v.${n}) (attrNames v)
      else
        [
          {
            path = concatStringsSep "." path;
            entry = null;
          }
        ];

  # an option's value as data: lib's markers resolved as walk resolves them (a mkIf whose
  # condition fails is null), functions as "<function>"
  plain =
    v:
    if marker v "if" then
      (if v.condition then plain v.content else null)
    else if marker v "override" || marker v "order" then
      plain v.content
    else if marker v "merge" then
      map plain v.contents
    else if builtins.isFunction v then
      "<function>"
    else if builtins.isList v then
      map plain v
    else if isAttrs v then
      builtins.mapAttrs (_: plain) v
    else
      v;

  # the declared options: [ { path; description; hasType; } ]
  declared =
    path: v:
    if marker v "option" then
      [
        {
          path = concatStringsSep "." path;
          description = v.description or null;
          hasType = v ? type;
        }
      ]
    else if isAttrs v then
      concatMap (n: declared (path ++ [ n ]) v.${n}) (attrNames v)
    else
      [ ];

  m = (if builtins.isFunction module then module else import module) {
    inherit config lib pkgs;
    utils = import ./utils.nix;
    options = { };
  };
in
{
  set = walk [ ] (m.config or { });
  options = declared [ ] (m.options or { });
  imports = map (p: if isAttrs p then "<module>" else baseNameOf (toString p)) (m.imports or [ ]);
}
