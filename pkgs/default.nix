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
  # the images the registry's `[images.<variant>]` names, each from the same trees: a tree two
  # images hold at the same place in the same order above the same trees is one layer derivation
  registry = builtins.fromTOML (builtins.readFile ../python/tp4/data/registry.toml);
  layer = {
    # installed into the base image's site-packages, replacing its dist-info of the same
    # distributions as upstream's `pip install` does (pkgs/oci.nix `sitePackages`)
    wheels = {
      sitePackages = true;
      tree = wheels;
    };
    # the tree holds python/ at its top, as upstream's /sgl-workspace/sglang does
    sglang-branch = {
      path = paths.sglang;
      tree = trees.sglang-branch-tree;
      subdir = "/python";
    };
    sglang-line = {
      path = paths.sglang;
      tree = trees.sglang-tree;
      subdir = "/python";
    };
    b12x = {
      path = paths.b12x;
      tree = trees.b12x;
    };
    b12x-next = {
      path = paths.b12x_next;
      tree = trees.b12x-next;
    };
    runtime = {
      path = paths.runtime;
      tree = tp4-runtime;
    };
  };
  # bottom to top: least to most often changed (docs/build.md "Images for each preset")
  layersOf = {
    # upstream's Dockerfile: the stock image's SGLang and its adapters only
    base = [ layer.runtime ];
    # Dockerfile.canary: the dsv4.1 branch's python tree and the two wheels, without RoCEnante
    canary = [
      layer.wheels
      layer.sglang-branch
      layer.runtime
    ];
    # Dockerfile.canary-roce: the branch with RoCEnante, SG17 b12x and b12x_next
    canary-roce = [
      layer.wheels
      layer.sglang-line
      layer.b12x
      layer.b12x-next
      layer.runtime
    ];
  };
  imageFor =
    variant:
    import ./image.nix {
      inherit pkgs container variant;
      inherit (src) oci;
      lineRef = registry.images.${variant}.ref;
      base = sources.src.${line.base};
      baseRow = sources.byName.${line.base};
      labels = line.labels flakeRev;
      created = self.lastModified or 1;
      layers =
        layersOf.${variant}
          or (throw "pkgs/default.nix: the registry's image variant '${variant}' has no layers here");
    };
  # flake attribute -> image
  images = builtins.listToAttrs (
    map (variant: {
      name = registry.images.${variant}.attr;
      value = imageFor variant;
    }) registry.image_order
  );
  image = images.${registry.images.canary-roce.attr};
in
{
  inherit
    tp4
    wheels
    tp4-runtime
    image
    images
    line
    ;
  inherit (trees)
    sglang-tree
    sglang-branch-tree
    b12x
    b12x-next
    ;
  sources = sources.src;
}
