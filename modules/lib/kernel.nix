# Kernel command line and modules of a Spark in the line.
let
  inherit (builtins)
    elemAt
    filter
    foldl'
    match
    replaceStrings
    ;
in
rec {
  # the ConnectX-7 driver and its RDMA half (RoCE needs mlx5_ib; nothing loads it on a host
  # without a desktop's hardware probing of RDMA)
  rdmaModules = [
    "mlx5_core"
    "mlx5_ib"
  ];

  # the GB10 display reservation kept for the line (upstream's DSV41_ENGRAM_DRM_NODE): nvidia-drm
  # with modeset=1 and fbdev=0, since no console framebuffer may claim the reservation
  displayReservationParams = [
    "nvidia-drm.modeset=1"
    "nvidia-drm.fbdev=0"
  ];

  # the value the kernel uses for module parameter `param` of `module` on a command line: the last
  # occurrence wins, and '-' and '_' are one character in module names (null when it is not set)
  moduleParam =
    params: module: param:
    let
      norm = s: replaceStrings [ "-" ] [ "_" ] s;
      want = "${norm module}.${param}";
      hits = filter (m: m != null && norm (elemAt m 0) + "." + elemAt m 1 == want) (
        map (p: match "([^.=]+)\\.([^=]+)=(.*)" p) params
      );
    in
    foldl' (_: m: elemAt m 2) null hits;

  # null when the reservation holds on `params`, else what is wrong
  displayReservationProblem =
    params:
    let
      modeset = moduleParam params "nvidia-drm" "modeset";
      fbdev = moduleParam params "nvidia-drm" "fbdev";
    in
    if modeset != "1" then
      "nvidia-drm.modeset is ${if modeset == null then "unset" else modeset}, not 1"
    else if fbdev != "0" then
      "nvidia-drm.fbdev is ${
        if fbdev == null then "unset" else fbdev
      }, not 0 (the nvidia module appends nvidia-drm.fbdev=1 for drivers >= 545)"
    else
      null;
}
