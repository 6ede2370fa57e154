# What the image is made of, from the rows pkgs/sources.nix reads (builtins only): which
# manifest tree each package is, which row is the base image, which rows are the wheels, and
# the OCI labels that carry every pin.
{ rows }:
let
  inherit (builtins)
    filter
    map
    head
    length
    listToAttrs
    stringLength
    substring
    ;
  hasPrefix = p: s: substring 0 (stringLength p) s == p;
  only =
    what: pred:
    let
      found = filter pred rows;
    in
    if length found == 1 then
      (head found).name
    else
      throw "sources.manifest must have exactly one ${what} row";
in
{
  base = only "image (docker://)" (r: r.kind == "image");
  wheels = map (r: r.name) (filter (r: r.kind == "wheel") rows);

  # package name -> the `tree NAME` of sources.manifest it is built from
  trees = {
    sglang-tree = "sglang-line";
    # the dsv4.1 branch without RoCEnante (the canary image)
    sglang-branch-tree = "sglang-python";
    b12x = "b12x";
    b12x-next = "b12x-next";
    runtime-tree = "dsv41-runtime";
  };

  labels =
    flakeRev:
    listToAttrs (
      map (r: {
        name = "tp4.pin.${r.name}";
        value = r.commit;
      }) rows
    )
    // {
      "tp4.flake.rev" = flakeRev;
      "org.opencontainers.image.revision" = flakeRev;
      "org.opencontainers.image.title" = "dsv41-4x-spark";
    };
}
