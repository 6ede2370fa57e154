# The production image (upstream's `Dockerfile.canary-roce`, final stage; docs/upstream.md): the
# pinned base image by digest, then one layer per tree in the order they change least to most
# often, then a small layer with the symlinks that put each tree where upstream's Dockerfile
# copies it.  It is an OCI layout whose layers are derivations of their own (pkgs/oci.nix): after
# a rebuild only the layer of a changed tree (and the links layer and config) is new, and loading
# it skips the others by digest without reading them.
{
  pkgs,
  # the code of `python -m tp4.image.oci` (pkgs/src.nix `oci`)
  oci,
  # dockerTools.pullImage of the base row
  base,
  # the base row of the manifest (imageName, digest)
  baseRow,
  # in the image, bottom to top: [ { path = "/opt/b12x"; tree = <drv>; subdir = "/x" (optional); } ... ]
  # `path` becomes a symlink to the tree (or to `subdir` inside it); `sitePackages = true`
  # instead of `path`: installed wheels, put into the base's site-packages (pkgs/oci.nix)
  layers,
  # OCI labels (pins and flake revision)
  labels,
  # the image's creation time, seconds since the epoch: the flake revision's commit time, so the
  # same revision gives the same image and builds sort by their commits (files keep mtime 1)
  created ? 1,
  # the registry whose `[[image_check]]` entries the image carries (label tp4.checks), for
  # `tp4 build` to run before it tags the image for the line
  registry ? ../python/tp4/data/registry.toml,
  # the fixed paths inside the container, shared with the renderer (python/tp4/line/container.py)
  container ? builtins.fromTOML (builtins.readFile ../python/tp4/data/container.toml),
  # the variant (the registry's image_order) this image is; it carries the checks for it
  variant ? "canary-roce",
  # the line's reference NAME:TAG (the registry's `[images.<variant>].ref`); the image itself is
  # named NAME:<a tag derived from its config> and tagged for the line only after its checks pass
  lineRef ? "dsv41-4x-spark:canary-roce",
}:
let
  seconds = s: s * 1000000000;
  # every variant's image shares the layer derivations' names (so a layer they have in common is
  # one derivation); only the image derivation itself is named after its variant
  name = builtins.head (builtins.split ":" lineRef);
  checks = builtins.filter (c: builtins.elem variant (c.images or [ variant ])) (
    (builtins.fromTOML (builtins.readFile registry)).image_check or [ ]
  );
  inherit (container) mounts health;
  paths = container.image;
  present = map (l: l.path or null) layers;
  # upstream's PYTHONPATH, less the trees this image does not hold (the wheels are in
  # site-packages, as upstream's pip install puts them)
  pythonPath = [
    paths.adapters
  ]
  ++ builtins.filter (p: builtins.elem p present) [
    paths.b12x
    paths.b12x_next
  ];
in
import ./oci.nix {
  inherit name layers base;
  imageName = if variant == "canary-roce" then name else "${name}-${variant}";
  passthru = {
    # what `tp4 build` reads from the base before building on it (python/tp4/image/baseimage.py)
    baseFacts = {
      row = baseRow.name;
      inherit (baseRow) attrs;
    };
    inherit
      labels
      layers
      baseRow
      lineRef
      checks
      variant
      ;
  };
  # each step in a plain runCommand with python3 (the standard library) and tp4.image.oci
  mk =
    name: attrs: script:
    pkgs.runCommand name (
      {
        nativeBuildInputs = [ pkgs.python3 ];
        PYTHONPATH = "${oci}/python";
      }
      // attrs
    ) script;
  spec = {
    architecture = "arm64";
    inherit created;
    config = {
      Entrypoint = [
        "python3"
        "-u"
        paths.boot
      ];
      Cmd = [ "run" ];
      WorkingDir = paths.runtime;
      Env = [
        "PYTHONPATH=${builtins.concatStringsSep ":" pythonPath}"
        "MODEL_PATH=${mounts.model}"
        "STATE_PATH=${mounts.state}"
        "OFFLOAD_MODE=nvme"
        "DSV41_CACHE_GIB=16"
      ];
      ExposedPorts = {
        "8888/tcp" = { };
      };
      # upstream's HEALTHCHECK, from container.toml's [health] (the plan carries the same table
      # to podman as flags: podman reads no health check from an OCI image's config)
      Healthcheck = {
        Test = [ "CMD" ] ++ health.cmd;
        Interval = seconds health.interval;
        Timeout = seconds health.timeout;
        StartPeriod = seconds health.start_period;
        Retries = health.retries;
      };
      Labels = labels // {
        "tp4.line.ref" = lineRef;
        "tp4.checks" = builtins.toJSON checks;
      };
    };
  };
}
