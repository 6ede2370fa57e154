# The pinned sources as fixed-output fetches. Nix does not parse sources.manifest: it reads
# sources.manifest.json beside it, the parse tp4 wrote (python/tp4/image/sources/manifest.py, the one
# parser; `tp4 sources json` writes the copy, `tp4 sources lock` rewrites both), and refuses that
# copy while its source_sha256 is not the sha256 of the manifest it is given.
#
#   import ./sources.nix { manifest = ../sources.manifest; inherit fetchurl;
#                          fetchPypi = python3Packages.fetchPypi; pullImage = dockerTools.pullImage; }
#
# yields
#   rows      the JSON's rows, in manifest order ({ component commit sha256 url attrs name kind
#             locked line file_name wheel image git })
#   byName    name -> row
#   src       name -> the fixed-output fetch of that row (throws for an unlocked row); an archive
#             row with tree-sha256= is fetched by its unpacked tree (builtins.fetchTarball)
#   trees     name -> { name attrs line inputs }  (inputs: the row names `fetch NAME` needs)
#   fetchArgs name -> [ "--manifest" <file> "--input" "<row>=<src>" ... ] for
#             `python -m tp4.image.sources fetch NAME --to $out <fetchArgs.NAME>` inside a derivation
#   wheelFiles name -> the file name of a wheel row (its pypi:<file name>), which installers
#             read the distribution's name and version from
#   unlocked  the names of the rows whose sha256 is `unlocked`, in manifest order
#   lockCommand  `tp4 sources lock <those names>`, the one command that locks them all
#   commitCommand  `git commit` of the two files it rewrites
{
  manifest,
  # the parse of `manifest` (python/tp4/image/sources/companion.py)
  parsed ? manifest + ".json",
  fetchurl,
  fetchPypi ? null,
  pullImage ? null,
}:
let
  inherit (builtins)
    concatLists
    concatStringsSep
    filter
    length
    listToAttrs
    map
    replaceStrings
    ;

  label = toString manifest;
  document = builtins.fromJSON (builtins.readFile parsed);
  current =
    if document.source_sha256 == builtins.hashFile "sha256" manifest then
      document
    else
      throw (
        "${toString parsed} is not the parse of ${label} (the manifest was edited after it was "
        + "written): run `tp4 sources json` in the checkout and commit both files"
      );
  inherit (current) rows;
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
          "the whole base image ${r.url} (${r.image.arch}), pulled with skopeo by nixpkgs' nix-prefetch-docker"
        else if r.kind == "archive" then
          "the archive ${r.url}"
        else if r.kind == "wheel" then
          "the wheel ${r.file_name}"
        else if r.kind == "git" then
          "a checkout of ${r.url}"
        else
          "the file ${r.url}";
    in
    "  - ${r.name}: ${what}${size}";
  unlockedRows = filter (r: !r.locked) rows;
  unlocked = map (r: r.name) unlockedRows;
  lockCommand = "tp4 sources lock ${concatStringsSep " " unlocked}";
  # the files `tp4 sources lock` rewrites (the real files: the repository's sources.manifest and
  # sources.manifest.json are links to them, and `git commit LINK` commits the link, not them)
  commitCommand = "git commit python/tp4/data/sources.manifest python/tp4/data/sources.manifest.json";
  # one message for every unlocked row: whatever output needs one, the fix is the same command
  unlockedMessage =
    r:
    "source row '${r.name}' (line ${toString r.line}) is not locked: its sha256 is not known yet.\n"
    + "${toString (length unlocked)} row(s) of sources.manifest are not locked (their hashes need the network). "
    + "On a machine with network access, in the checkout, run once:\n\n"
    + "  ${lockCommand}\n\n"
    + "It downloads:\n"
    + concatStringsSep "\n" (map downloads unlockedRows)
    + "\nand rewrites those rows of sources.manifest (and its parse, sources.manifest.json); commit the change (${commitCommand}) "
    + "so every clone builds from the same pins.";
  storeName = r: replaceStrings [ "/" ":" ] [ "-" "-" ] r.name;
  # wheel, image and git are null on a row of that kind whose URL lacks the form (the parse keeps
  # it; validation refuses it)
  formed =
    r: field: form:
    if r.${field} == null then
      throw "${label}: row '${r.name}': ${r.url} is not ${form} (`tp4 sources verify` says what is wrong)"
    else
      r.${field};

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
            w = formed r "wheel" "pypi:<wheel file name>";
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
            i = formed r "image" "docker://NAME[:TAG]@sha256:DIGEST";
          in
          pullImage {
            imageName = i.name;
            imageDigest = i.digest;
            finalImageName = i.name;
            finalImageTag = i.tag;
            inherit (i) arch;
            inherit (r) sha256;
          }
      )
    else if r.kind == "git" then
      builtins.path {
        name = storeName r;
        # allRefs: fetch every ref, not only the default branch, so a commit that is only on
        # another branch (or a tag) is found (Nix >= 2.4, NixOS/nix#3814); without it a remote
        # fetch asks for the default ref alone and fails with "couldn't find remote ref"
        path = builtins.fetchGit {
          inherit (r.git) url rev;
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
      value = r.file_name;
    }) (filter (r: r.kind == "wheel") rows)
  );

  # --- trees ------------------------------------------------------------------------------------
  trees = listToAttrs (
    map (t: {
      inherit (t) name;
      value = t;
    }) current.trees
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
        ]) t.inputs
      );
    }) current.trees
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
    commitCommand
    ;
  treeNames = map (t: t.name) current.trees;
}
