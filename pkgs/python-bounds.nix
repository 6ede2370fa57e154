# Poetry version constraints (python/pyproject.toml) against the versions nixpkgs packages, at
# evaluation (builtins only): a nixpkgs pin whose python or a dependency is outside the bounds
# stops `nix build .#tp4` before anything builds, with every mismatch named.  nixpkgs'
# pythonRuntimeDepsCheckHook compares the wheel's Requires-Dist with the environment only after
# the wheel is built, and never Requires-Python (docs/build.md, "Python at the pin").
let
  inherit (builtins)
    all
    compareVersions
    concatStringsSep
    elemAt
    filter
    genList
    head
    isAttrs
    isString
    length
    map
    match
    split
    splitVersion
    toString
    ;
  trim = s: head (match "[[:space:]]*(.*[^[:space:]])[[:space:]]*" s);
  join = parts: concatStringsSep "." (map toString parts);
  # the first `n` parts of a version, the last of them plus one
  bumped =
    parts: n:
    join (
      genList (
        i: if i == n - 1 then toString ((builtins.fromJSON (elemAt parts i)) + 1) else elemAt parts i
      ) n
    );
  # Poetry's caret: up to the next change of the first non-zero part (^0.28 is <0.29, ^2.7 <3)
  caretUpper =
    v:
    let
      parts = splitVersion v;
      nonZero = filter (i: elemAt parts i != "0") (genList (i: i) (length parts));
    in
    bumped parts (if nonZero == [ ] then length parts else head nonZero + 1);
  # Poetry's tilde: ~X.Y is <X.(Y+1), ~X is <X+1
  tildeUpper =
    v:
    let
      parts = splitVersion v;
    in
    bumped parts (if length parts > 1 then 2 else 1);
  ge = v: w: compareVersions v w >= 0;
  lt = v: w: compareVersions v w < 0;
  clause =
    c:
    let
      op = match "(\\^|~=|~|>=|<=|==|!=|>|<)?[[:space:]]*([0-9][0-9a-z.]*|\\*)" c;
      o = if op == null then null else elemAt op 0;
      w = if op == null then null else elemAt op 1;
    in
    if op == null then
      throw "python/pyproject.toml: the version constraint '${c}' is not one pkgs/python-bounds.nix reads (^, ~, >=, >, <=, <, ==, != or a version)"
    else if w == "*" then
      (_: true)
    else if o == "^" then
      (v: ge v w && lt v (caretUpper w))
    else if o == "~" || o == "~=" then
      (v: ge v w && lt v (tildeUpper w))
    else if o == ">=" then
      (v: ge v w)
    else if o == ">" then
      (v: compareVersions v w > 0)
    else if o == "<=" then
      (v: compareVersions v w <= 0)
    else if o == "<" then
      (v: lt v w)
    else if o == "!=" then
      (v: compareVersions v w != 0)
    else
      (v: compareVersions v w == 0);
in
rec {
  # the constraint string of a Poetry dependency ("^2.7", or a table with `version`)
  constraintOf = spec: if isAttrs spec then spec.version or "*" else spec;
  # does `version` satisfy `constraint` ("^2.7", ">=1.0,<3", ...)
  satisfies =
    version: constraint:
    all (c: (clause c) version) (map trim (filter isString (split "," constraint)));
  # [ { name; version; constraint; where; } ... ] -> the ones outside their bounds
  mismatches = filter (d: !(satisfies d.version d.constraint));
  # the message naming each mismatch and the two ways out
  message =
    bad:
    "tp4: the pinned nixpkgs does not satisfy python/pyproject.toml:\n"
    + concatStringsSep "\n" (
      map (d: "  ${d.name} ${d.version} (${d.where}) is outside \"${d.constraint}\"") bad
    )
    + "\nfix: move the bound in python/pyproject.toml (after testing tp4 with that version), or move the "
    + "nixpkgs pin in flake.lock; docs/build.md lists the versions at the pin";
}
