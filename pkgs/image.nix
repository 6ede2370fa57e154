# The production image (upstream's `Dockerfile.canary-roce`, final stage; docs/upstream.md): the pinned base image by digest, then one
# layer per tree in the order they change least to most often, then a small customisation layer
# with the symlinks that put each tree where upstream's Dockerfile copies it.  Only the layer of a
# changed tree (and the customisation layer and config) differs after a rebuild.
{
  pkgs,
  # dockerTools.pullImage of the base row
  base,
  # the base row of the manifest (imageName, digest)
  baseRow,
  # in the image, bottom to top: [ { path = "/opt/b12x"; tree = <drv>; subdir = "/x" (optional); } ... ]
  # `path` becomes a symlink to the tree (or to `subdir` inside it)
  layers,
  # OCI labels (pins and flake revision)
  labels,
  # the registry whose `[[image_check]]` entries the image carries (label tp4.checks), for
  # `tp4 build` to run before it tags the image for the line
  registry ? ../python/tp4/data/registry.toml,
  # the fixed paths inside the container, shared with the renderer (python/tp4/container.py)
  container ? builtins.fromTOML (builtins.readFile ../python/tp4/data/container.toml),
  name ? "dsv41-4x-spark",
  # the line's reference is name:lineTag; the image itself is loaded under a content-derived tag
  # (tag = null) and tagged for the line only after its checks pass
  lineTag ? "canary-roce",
}:
let
  # split_paths peels one tree off the closure into its own layer, then recurses into the rest;
  # the resulting store layers are listed bottom first.
  peel =
    trees:
    if trees == [ ] then
      [ ]
    else
      [
        [
          "split_paths"
          [ "${builtins.head trees}" ]
        ]
      ]
      ++ (
        if builtins.tail trees == [ ] then
          [ ]
        else
          [
            [
              "over"
              "rest"
              [
                "pipe"
                (peel (builtins.tail trees))
              ]
            ]
          ]
      );
  link = l: ''
    mkdir -p ".${dirOf l.path}"
    ln -s ${l.tree}${l.subdir or ""} ".${l.path}"
  '';
  seconds = s: s * 1000000000;
  lineRef = "${name}:${lineTag}";
  checks = (builtins.fromTOML (builtins.readFile registry)).image_check or [ ];
  inherit (container) mounts;
  paths = container.image;
in
pkgs.dockerTools.streamLayeredImage {
  inherit name;
  tag = null;
  fromImage = base;
  architecture = "arm64";
  layeringPipeline = peel (map (l: l.tree) layers);
  # symlinks replace the base image's directories at the same paths (an upper-layer entry that is
  # not a directory removes the lower directory), which is upstream's `rm -rf` + COPY
  extraCommands = builtins.concatStringsSep "" (map link layers);
  config = {
    Entrypoint = [
      "python3"
      "-u"
      paths.boot
    ];
    Cmd = [ "run" ];
    WorkingDir = paths.runtime;
    Env = [
      "PYTHONPATH=${paths.adapters}:${paths.b12x}:${paths.b12x_next}:${paths.wheels}"
      "MODEL_PATH=${mounts.model}"
      "STATE_PATH=${mounts.state}"
      "OFFLOAD_MODE=nvme"
      "DSV41_CACHE_GIB=16"
    ];
    ExposedPorts = {
      "8888/tcp" = { };
    };
    # `-S` keeps the adapter's sitecustomize (and so the engine) out of the probe
    Healthcheck = {
      Test = [
        "CMD"
        "python3"
        "-S"
        paths.boot
        "health"
      ];
      Interval = seconds 30;
      Timeout = seconds 30;
      StartPeriod = seconds 1800;
      Retries = 3;
    };
    Labels = labels // {
      "tp4.line.ref" = lineRef;
      "tp4.checks" = builtins.toJSON checks;
    };
  };
  passthru = {
    inherit
      labels
      layers
      baseRow
      lineRef
      checks
      ;
  };
}
