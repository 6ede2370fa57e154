# The line's packages for one system.  Pure wiring: the manifest is read by pkgs/sources.nix, what
# the image is made of is in pkgs/line.nix (both builtins only), the transforms are tp4's Python.
{
  pkgs,
  # the flake (for its revision); { } outside a flake
  self ? { },
  # the repository
  root ? ../.,
}:
let
  src = import ./src.nix { inherit root; };
  # the real file (the repository's sources.manifest is a link to it, and a link interpolated into
  # a derivation would be copied as a dangling link)
  manifest = root + "/python/tp4/data/sources.manifest";
  sources = import ./sources.nix {
    inherit manifest;
    inherit (pkgs) fetchurl;
    inherit (pkgs.python3Packages) fetchPypi;
    inherit (pkgs.dockerTools) pullImage;
  };
  line = import ./line.nix { inherit (sources) rows; };

  trees = builtins.mapAttrs (
    pname: target:
    import ./tree.nix {
      inherit
        pkgs
        sources
        pname
        target
        ;
      transforms = src.transforms;
    }
  ) line.trees;

  tp4 = import ./tp4.nix { inherit pkgs src; };
  wheels = import ./wheels.nix {
    inherit pkgs;
    wheels = map (w: {
      file = sources.wheelFiles.${w};
      src = sources.src.${w};
    }) line.wheels;
  };
  tp4-runtime = import ./runtime.nix {
    inherit pkgs;
    tree = trees.runtime-tree;
    version =
      builtins.substring 0 8
        sources.byName.${sources.trees.${line.trees.runtime-tree}.attrs.from}.commit;
    glibc =
      sources.byName.${line.base}.attrs.glibc
        or (throw "sources.manifest: the base image's row '${line.base}' needs glibc=MAJOR.MINOR (its glibc version)");
    inherit src;
  };

  flakeRev = self.rev or self.dirtyRev or "unknown";
  # the fixed paths inside the container (python/tp4/data/container.toml, read by the renderer too)
  container = builtins.fromTOML (builtins.readFile ../python/tp4/data/container.toml);
  paths = container.image;
  image = import ./image.nix {
    inherit pkgs container;
    inherit (src) oci;
    base = sources.src.${line.base};
    baseRow = sources.byName.${line.base};
    labels = line.labels flakeRev;
    created = self.lastModified or 1;
    # bottom to top: least to most often changed
    layers = [
      {
        path = paths.wheels;
        tree = wheels;
      }
      # the tree holds python/ at its top, as upstream's /sgl-workspace/sglang does
      {
        path = paths.sglang;
        tree = trees.sglang-tree;
        subdir = "/python";
      }
      {
        path = paths.b12x;
        tree = trees.b12x;
      }
      {
        path = paths.b12x_next;
        tree = trees.b12x-next;
      }
      {
        path = paths.runtime;
        tree = tp4-runtime;
      }
    ];
  };
in
{
  inherit
    tp4
    wheels
    tp4-runtime
    image
    line
    ;
  inherit (trees) sglang-tree b12x b12x-next;
  sources = sources.src;
}
