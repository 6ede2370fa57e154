# What the image is made of, from the manifest as pkgs/sources.nix parses it (builtins only):
# which rows feed each transformed tree (the same rule as tp4.sources.manifest.Manifest.inputs,
# checked against it by tests/test_flake_eval.py), which row is the base image, which rows are
# the wheels, and the OCI labels that carry every pin.
{ rows, trees }:
let
  inherit (builtins) filter map head listToAttrs isString stringLength substring elem;
  hasPrefix = p: s: substring 0 (stringLength p) s == p;
  nameOf = r: r.name or r.component;
  split = sep: s: filter (x: isString x && x != "") (builtins.split sep s);
  treeByName = listToAttrs (map (t: { inherit (t) name; value = t; }) trees);

  # rows an `add=` source names: one row, or a group `prefix/*`
  expand =
    source:
    let n = stringLength source;
    in
    if n >= 2 && substring (n - 2) 2 source == "/*" then
      map nameOf (filter (r: hasPrefix (substring 0 (n - 1) source) r.component) rows)
    else
      [ source ];

  inputs =
    name:
    let
      attrs = treeByName.${name}.attrs or (throw "sources.manifest has no `tree ${name}`");
      wanted =
        [ (attrs.from or "") ]
        ++ split "," (attrs.patches or "")
        ++ builtins.concatMap (item: expand (head (split ":" item))) (split "," (attrs.add or ""));
    in
    map nameOf (filter (r: elem (nameOf r) wanted) rows);

  only =
    what: pred:
    let found = filter pred rows;
    in if builtins.length found == 1 then nameOf (head found) else throw "sources.manifest must have exactly one ${what} row";
in
{
  base = only "docker:// (base image)" (r: hasPrefix "docker://" r.url);
  wheels = map nameOf (filter (r: hasPrefix "pypi:" r.url) rows);

  # package name -> the manifest tree it is, and the rows it is built from
  trees = builtins.mapAttrs (pname: target: { inherit target; components = inputs target; }) {
    sglang-tree = "sglang-line";
    b12x = "b12x";
    b12x-next = "b12x-next";
    runtime-tree = "dsv41-runtime";
  };

  labels =
    flakeRev:
    listToAttrs (map (r: { name = "tp4.pin.${nameOf r}"; value = r.commit; }) rows)
    // {
      "tp4.flake.rev" = flakeRev;
      "org.opencontainers.image.revision" = flakeRev;
      "org.opencontainers.image.title" = "dsv41-4x-spark";
    };
}
