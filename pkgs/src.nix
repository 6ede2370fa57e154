# What each derivation sees of the repository (builtins only, evaluated in tests).  The transform
# trees see only the code of `tp4 sources`, so an edit to the CLI, a profile or an adapter does
# not rebuild the SGLang, b12x or b12x_next layers.
{ root }:
let
  junk = [
    "__pycache__"
    ".pytest_cache"
    ".hypothesis"
    ".venv"
    ".mypy_cache"
    "dist"
  ];
  hasPrefix = p: s: builtins.substring 0 (builtins.stringLength p) s == p;
  hasSuffix =
    x: s:
    let
      n = builtins.stringLength s;
      m = builtins.stringLength x;
    in
    n >= m && builtins.substring (n - m) m s == x;
  rel =
    path:
    let
      r = toString root;
      p = toString path;
    in
    if p == r then "" else builtins.substring (builtins.stringLength r + 1) (-1) p;
  # keep `path` when it is one of `prefixes`, lies below one, or is a directory above one
  wanted =
    prefixes: path: type:
    let
      r = rel path;
      n = baseNameOf r;
    in
    !(builtins.elem n junk || hasSuffix ".egg-info" n || hasSuffix ".pyc" n)
    && builtins.any (
      p: r == p || hasPrefix (p + "/") r || (type == "directory" && hasPrefix (r + "/") p)
    ) prefixes;
  cliName = "tp4-source";
  pick =
    name: prefixes:
    builtins.path {
      path = root;
      inherit name;
      filter = wanted prefixes;
    };
in
{
  # the Poetry project plus the repository files python/tp4/data links to
  cli = pick cliName [
    "python"
    "adapters"
  ];
  inherit cliName root;
  # the code `python -m tp4.image.sources fetch` imports (nothing of the CLI), and the manifest it reads
  transforms = pick "tp4-transforms" [
    "python/tp4/__init__.py"
    "python/tp4/core/__init__.py"
    "python/tp4/core/errors.py"
    "python/tp4/core/userfiles.py"
    "python/tp4/core/process.py"
    "python/tp4/core/pidfile.py"
    "python/tp4/image/__init__.py"
    "python/tp4/image/sources"
    "python/tp4/data/sources.manifest"
  ];
  # the code `python -m tp4.image.oci` runs to assemble the image (the standard library only), so an
  # edit to the CLI does not rebuild a layer
  oci = pick "tp4-oci" [
    "python/tp4/__init__.py"
    "python/tp4/image/__init__.py"
    "python/tp4/image/oci.py"
  ];
  inherit wanted hasSuffix;
}
