# An image as an OCI layout whose layers are derivations of their own (builtins only; the steps
# are `python3 -m tp4.image.oci`, python/tp4/image/oci.py).  A rebuild that changes one tree rebuilds that
# tree's layer, the top layer of links and the small layout; every other layer stays the same
# store path with the same digest, so `skopeo copy oci:... containers-storage:...` (or a push to
# the head's image store) skips it without reading it.  pkgs/image.nix builds the line's image
# with it; tests/nix_env.py builds test images with the same file.
{
  # name: attrs: script: derivation; a build with python3 and tp4.image.oci on its PYTHONPATH
  # (pkgs.runCommand in the flake, a busybox derivation in the tests)
  mk,
  # the prefix of every step's name (layers of images with the same name and trees below are the
  # same derivations)
  name,
  # the name of the image derivation itself
  imageName ? name,
  # a docker-archive (dockerTools.pullImage), or null for an image without a base
  base ? null,
  # bottom to top: [ { path = "/opt/b12x"; tree = <drv>; subdir = "/x" (optional); } ... ]:
  # one layer per tree (its closure, less the closures of the trees below), and a top layer
  # where each `path` is a symlink to its tree (or to `subdir` inside it); a layer with
  # `sitePackages = true` instead of `path` is a tree of installed wheels that goes into the
  # base's site-packages as pip would put it there (a link per entry, whiteouts for the
  # base's dist-info it replaces: `python3 -m tp4.image.oci links --install`)
  layers,
  # what the image config holds besides its layers: { architecture; config; created (optional) }
  spec,
  # passed through on the image derivation
  passthru ? { },
}:
let
  inherit (builtins)
    concatLists
    concatStringsSep
    elemAt
    genList
    length
    ;
  quote = s: "'" + builtins.replaceStrings [ "'" ] [ "'\\''" ] s + "'";
  step = argv: ''
    set -eu
    export PYTHONDONTWRITEBYTECODE=1
    python3 -m tp4.image.oci ${concatStringsSep " " (map quote argv)} --out "$out"
  '';
  trees = map (l: l.tree) layers;
  graph = j: "graph-${toString j}";

  baseLayers =
    if base == null then
      null
    else
      mk "${name}-base-layers" { } (step [
        "base"
        "--archive"
        "${base}"
      ]);

  # layer i: the closure of tree i (graph-i), less the closures of the trees below it
  storeLayer =
    i:
    mk "${name}-layer-${toString i}-${(elemAt trees i).name or "tree"}"
      {
        exportReferencesGraph = concatLists (
          genList (j: [
            (graph j)
            (elemAt trees j)
          ]) (i + 1)
        );
      }
      (
        step (
          [
            "layer"
            "--graph"
            (graph i)
          ]
          ++ concatLists (
            genList (j: [
              "--below"
              (graph j)
            ]) i
          )
        )
      );
  storeLayers = genList storeLayer (length trees);

  linked = builtins.filter (l: !(l.sitePackages or false)) layers;
  installed = builtins.filter (l: l.sitePackages or false) layers;
  links = mk "${name}-links" { } (
    step (
      [ "links" ]
      ++ concatLists (
        map (l: [
          "--link"
          "${l.path}=${l.tree}${l.subdir or ""}"
        ]) linked
      )
      ++ concatLists (
        map (l: [
          "--install"
          "${l.tree}"
        ]) installed
      )
      ++ (
        if installed == [ ] then
          [ ]
        else if baseLayers == null then
          throw "pkgs/oci.nix: a sitePackages layer needs a base image to install into"
        else
          [
            "--base"
            "${baseLayers}"
          ]
      )
    )
  );

  image =
    mk imageName
      {
        TP4_OCI_CONFIG = builtins.toJSON spec;
        passthru = passthru // {
          inherit
            base
            baseLayers
            storeLayers
            links
            ;
        };
      }
      (
        step (
          [
            "image"
            "--name"
            name
          ]
          ++ (
            if baseLayers == null then
              [ ]
            else
              [
                "--base"
                "${baseLayers}"
              ]
          )
          ++ concatLists (
            map (l: [
              "--layer"
              "${l}"
            ]) (storeLayers ++ [ links ])
          )
        )
      );
in
image
