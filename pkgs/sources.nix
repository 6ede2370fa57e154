# sources.manifest read with builtins only (the same grammar as python/tp4/sources/manifest.py;
# tests evaluate both on the real manifest and on generated ones and compare).
#
#   import ./sources.nix { manifest = ../sources.manifest; inherit fetchurl;
#                          fetchPypi = python3Packages.fetchPypi; pullImage = dockerTools.pullImage; }
#
# yields
#   rows      [ { component commit sha256 url attrs name kind locked line } ]  in manifest order
#   byName    name -> row
#   src       name -> the fixed-output fetch of that row (throws for an unlocked row); an archive
#             row with tree-sha256= is fetched by its unpacked tree (builtins.fetchTarball)
#   trees     name -> { name attrs line inputs }  (inputs: the row names `fetch NAME` needs)
#   fetchArgs name -> [ "--manifest" <file> "--input" "<row>=<src>" ... ] for
#             `python -m tp4.sources fetch NAME --to $out <fetchArgs.NAME>` inside a derivation
#   wheelFiles name -> the file name of a wheel row (its pypi:<file name>), which installers
#             read the distribution's name and version from
#   unlocked  the names of the rows whose sha256 is `unlocked`, in manifest order
#   lockCommand  `tp4 sources lock <those names>`, the one command that locks them all
{
  manifest,
  fetchurl,
  fetchPypi ? null,
  pullImage ? null,
}:
let
  inherit (builtins)
    all
    any
    attrNames
    concatLists
    elem
    elemAt
    filter
    foldl'
    genList
    hasAttr
    head
    isString
    length
    listToAttrs
    map
    match
    replaceStrings
    split
    stringLength
    substring
    tail
    ;

  hasPrefix = p: s: substring 0 (stringLength p) s == p;
  hasSuffix =
    x: s:
    let
      n = stringLength s;
      l = stringLength x;
    in
    n >= l && substring (n - l) l s == x;
  strings = xs: filter isString xs;
  splitOn = sep: s: strings (split sep s);
  init = xs: genList (elemAt xs) (length xs - 1);
  last = xs: elemAt xs (length xs - 1);
  drop = n: xs: genList (i: elemAt xs (i + n)) (length xs - n);

  label = toString manifest;
  fail = line: msg: throw "${label}: line ${toString line}: ${msg}";

  # --- lines -> entries ({ line; tokens; }) --------------------------------------------------
  physical = splitOn "\n" (builtins.readFile manifest);
  tokensOf = l: filter (t: t != "") (splitOn "[ \t\r]+" l);
  step =
    acc: l:
    let
      n = acc.n + 1;
      toks = tokensOf l;
      first = substring 0 1 l;
    in
    if toks == [ ] || hasPrefix "#" (head toks) then
      acc // { inherit n; }
    else if first == " " || first == "\t" then
      (
        if acc.entries == [ ] then
          fail n "a continuation line (starting with a blank) with no entry above it"
        else
          acc
          // {
            inherit n;
            entries = init acc.entries ++ [
              (last acc.entries // { tokens = (last acc.entries).tokens ++ toks; })
            ];
          }
      )
    else
      acc
      // {
        inherit n;
        entries = acc.entries ++ [
          {
            line = n;
            tokens = toks;
          }
        ];
      };
  entries =
    (foldl' step {
      n = 0;
      entries = [ ];
    } physical).entries;

  parseAttrs =
    line: toks:
    let
      pairs = map (
        t:
        let
          m = match "([a-z][a-z0-9-]*)=(.+)" t;
        in
        if m == null then
          fail line "'${t}' is not key=value (an extension attribute)"
        else
          {
            name = elemAt m 0;
            value = elemAt m 1;
          }
      ) toks;
      add =
        acc: p:
        if hasAttr p.name acc then
          fail line "attribute '${p.name}' given twice"
        else
          acc // { ${p.name} = p.value; };
    in
    foldl' add { } pairs;

  archiveSuffixes = [
    ".tar.gz"
    ".tgz"
    ".tar.xz"
    ".tar.bz2"
    ".tar"
  ];
  patchSuffixes = [
    ".patch"
    ".diff"
  ];
  kindOf =
    component: url: attrs:
    let
      path = head (split "[?]" url);
    in
    if component == "local" then
      "local"
    else if hasPrefix "pypi:" url then
      "wheel"
    else if hasPrefix "docker://" url then
      "image"
    else if hasPrefix "git+" url then
      "git"
    else if attrs ? kind then
      attrs.kind
    else if any (s: hasSuffix s path) archiveSuffixes then
      "archive"
    else if any (s: hasSuffix s path) patchSuffixes then
      "patch"
    else
      "file";

  mkRow =
    e:
    let
      t = e.tokens;
      component = elemAt t 0;
      commit = elemAt t 1;
      url = elemAt t 3;
      attrs = parseAttrs e.line (drop 4 t);
      sha256 = elemAt t 2;
    in
    if length t < 4 then
      fail e.line "a row needs four columns `component commit sha256 url`, got ${toString (length t)}"
    else
      {
        inherit
          component
          commit
          sha256
          url
          attrs
          ;
        inherit (e) line;
        name = if component == "local" then "local:${commit}" else component;
        kind = kindOf component url attrs;
        locked = sha256 != "unlocked";
      };

  mkTree =
    e:
    if length e.tokens < 2 then
      fail e.line "`tree` needs a name"
    else
      {
        name = elemAt e.tokens 1;
        attrs = parseAttrs e.line (drop 2 e.tokens);
        inherit (e) line;
      };

  isTree = e: head e.tokens == "tree";
  rows = map mkRow (filter (e: !isTree e) entries);
  treeList = map mkTree (filter isTree entries);
  byName = listToAttrs (
    map (r: {
      inherit (r) name;
      value = r;
    }) rows
  );

  # --- fixed-output fetches ---------------------------------------------------------------------
  # What `tp4 sources lock` downloads for a row, and how large when the row says (size=)
  downloads =
    r:
    let
      size =
        if r.attrs ? size then ", about ${r.attrs.size}" else " (size not recorded: size= in its row)";
      what =
        if r.kind == "image" then
          "the whole base image ${r.url} (${r.attrs.arch or "arm64"}), pulled with skopeo by nixpkgs' nix-prefetch-docker"
        else if r.kind == "archive" then
          "the archive ${r.url}"
        else if r.kind == "wheel" then
          "the wheel ${substring 5 (stringLength r.url) r.url}"
        else if r.kind == "git" then
          "a checkout of ${r.url}"
        else
          "the file ${r.url}";
    in
    "  - ${r.name}: ${what}${size}";
  unlockedRows = filter (r: !r.locked) rows;
  unlocked = map (r: r.name) unlockedRows;
  lockCommand = "tp4 sources lock ${builtins.concatStringsSep " " unlocked}";
  # one message for every unlocked row: whatever output needs one, the fix is the same command
  unlockedMessage =
    r:
    "source row '${r.name}' (line ${toString r.line}) is not locked: its sha256 is not known yet.\n"
    + "${toString (length unlocked)} row(s) of sources.manifest are not locked (their hashes need the network). "
    + "On a machine with network access, in the checkout, run once:\n\n"
    + "  ${lockCommand}\n\n"
    + "It downloads:\n"
    + builtins.concatStringsSep "\n" (map downloads unlockedRows)
    + "\nand rewrites those rows of sources.manifest; commit the change (git commit sources.manifest) "
    + "so every clone builds from the same pins.";
  storeName = r: replaceStrings [ "/" ":" ] [ "-" "-" ] r.name;
  wheelOf =
    r:
    let
      m = match "([A-Za-z0-9_.]+)-([^-]+)-([^-]+)-([^-]+)-([^-]+)[.]whl" (
        substring 5 (stringLength r.url) r.url
      );
    in
    if m == null then
      throw "${label}: row '${r.name}': ${r.url} is not pypi:<wheel file name>"
    else
      {
        pname = elemAt m 0;
        version = elemAt m 1;
        python = elemAt m 2;
        abi = elemAt m 3;
        platform = elemAt m 4;
      };
  imageOf =
    r:
    let
      m = match "docker://([a-z0-9._/-]+)(:([A-Za-z0-9._-]+))?@(sha256:[0-9a-f]{64})" r.url;
    in
    if m == null then
      throw "${label}: row '${r.name}': ${r.url} is not docker://NAME[:TAG]@sha256:DIGEST"
    else
      {
        name = elemAt m 0;
        tag = if elemAt m 2 == null then "latest" else elemAt m 2;
        digest = elemAt m 3;
      };

  fetchRow =
    r:
    if !r.locked then
      throw (unlockedMessage r)
    else if r.kind == "local" then
      throw "${label}: row '${r.name}' names a file in upstream's repository; give it a URL row"
    else if r.kind == "wheel" then
      (
        if fetchPypi == null then
          throw "${label}: row '${r.name}' is a wheel: pass fetchPypi to sources.nix"
        else
          let
            w = wheelOf r;
          in
          fetchPypi {
            inherit (w)
              pname
              version
              python
              abi
              platform
              ;
            dist = w.python;
            format = "wheel";
            inherit (r) sha256;
          }
      )
    else if r.kind == "image" then
      (
        if pullImage == null then
          throw "${label}: row '${r.name}' is an image: pass pullImage to sources.nix"
        else
          let
            i = imageOf r;
          in
          pullImage {
            imageName = i.name;
            imageDigest = i.digest;
            finalImageName = i.name;
            finalImageTag = i.tag;
            arch = r.attrs.arch or "arm64";
            inherit (r) sha256;
          }
      )
    else if r.kind == "git" then
      let
        bare = substring 4 (stringLength r.url) r.url;
        parts = match "(.*)@([^@]*)" bare;
      in
      builtins.path {
        name = storeName r;
        # allRefs: fetch every ref, not only the default branch, so a commit that is only on
        # another branch (or a tag) is found (Nix >= 2.4, NixOS/nix#3814); without it a remote
        # fetch asks for the default ref alone and fails with "couldn't find remote ref"
        path = builtins.fetchGit {
          url = elemAt parts 0;
          rev = r.commit;
          allRefs = true;
        };
        inherit (r) sha256;
      }
    else if r.kind == "archive" && r.attrs ? tree-sha256 then
      # pinned by its unpacked tree (`tp4 sources lock --tree`): the NAR hash of the archive's one
      # top directory, which is what nixpkgs' fetchzip (stripRoot = true, so fetchFromGitHub) checks
      # too; GitHub does not promise stable archive bytes, only the files in them. builtins, not
      # fetchzip: the very fetcher the tests run here, with no unzip or stdenv; it downloads at
      # evaluation, once (the store path is known from the hash, so a later evaluation finds it)
      builtins.fetchTarball {
        url = r.url;
        sha256 = r.attrs.tree-sha256;
        name = storeName r;
      }
    else
      fetchurl {
        url = r.url;
        inherit (r) sha256;
        name = storeName r;
      };

  src = listToAttrs (
    map (r: {
      inherit (r) name;
      value = fetchRow r;
    }) rows
  );
  wheelFiles = listToAttrs (
    map (r: {
      inherit (r) name;
      value = substring 5 (stringLength r.url) r.url;
    }) (filter (r: r.kind == "wheel") rows)
  );

  # --- trees ------------------------------------------------------------------------------------
  listOf = attrs: key: if attrs ? ${key} then splitOn "," attrs.${key} else [ ];
  addSources = t: map (a: head (splitOn ":" a)) (listOf t.attrs "add");
  expand =
    s:
    if hasSuffix "/*" s then
      let
        prefix = substring 0 (stringLength s - 1) s;
      in
      map (r: r.name) (filter (r: hasPrefix prefix r.component) rows)
    else
      [ s ];
  treeInputs =
    t:
    let
      wanted = [
        (t.attrs.from or "")
      ]
      ++ listOf t.attrs "patches"
      ++ listOf t.attrs "run"
      ++ concatLists (map expand (addSources t));
    in
    map (r: r.name) (filter (r: elem r.name wanted) rows);
  trees = listToAttrs (
    map (t: {
      inherit (t) name;
      value = t // {
        inputs = treeInputs t;
      };
    }) treeList
  );

  fetchArgs = listToAttrs (
    map (t: {
      inherit (t) name;
      value = [
        "--manifest"
        "${manifest}"
      ]
      ++ concatLists (
        map (n: [
          "--input"
          "${n}=${src.${n}}"
        ]) trees.${t.name}.inputs
      );
    }) treeList
  );
in
{
  inherit
    rows
    byName
    src
    trees
    fetchArgs
    wheelFiles
    unlocked
    lockCommand
    ;
  treeNames = map (t: t.name) treeList;
}
