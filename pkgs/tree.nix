# One transformed tree (the SGLang python tree, b12x SG17 + roce_ring, b12x_next, the upstream
# runtime tree): pkgs/transform.nix's script in a plain runCommand, with the transform code of
# `tp4 sources` (pkgs/src.nix `transforms`) on PYTHONPATH, and only python3 (the standard library:
# `python -m tp4.image.sources` needs no CLI package) and GNU patch.
{
  pkgs,
  transforms,
  sources,
  pname,
  target,
}:
pkgs.runCommand pname
  {
    nativeBuildInputs = [
      pkgs.python3
      pkgs.gnupatch
    ];
    PYTHONPATH = "${transforms}/python";
    passthru = {
      inherit target;
      inherit (sources.trees.${target}) inputs;
    };
  }
  (
    import ./transform.nix {
      inherit target;
      fetchArgs = sources.fetchArgs.${target};
    }
  )
