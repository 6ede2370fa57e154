# The checks that run on every change without building the image or any tree: every output
# evaluates, the Nix files are formatted, and the Python unit tests pass.  The expensive checks
# (the packages themselves) are added beside these in pkgs/outputs.nix.
{
  pkgs,
  # pkgs/src.nix
  src,
  # python3 with tp4's dependencies and dev group (tp4.testPython)
  python,
  # name -> derivation: every output of the flake, on every system, that needs no unlocked row
  outputs,
  # the names of the outputs left out of `outputs` because they need an unlocked row
  leftOut ? [ ],
  # the names of the unlocked rows of sources.manifest and the command that locks them
  # (pkgs/sources.nix `unlocked`, `lockCommand`)
  unlocked ? [ ],
  lockCommand ? "",
  # `git commit` of the files the lock rewrites (pkgs/sources.nix `commitCommand`)
  commitCommand ? "",
}:
let
  inherit (src) hasSuffix;
  # what pytest -m unit reads: the code, the tests and the data files they compare against
  tests = builtins.path {
    path = src.root;
    name = "tp4-unit-tests";
    filter = src.wanted [
      "adapters"
      "bench"
      "docs"
      # the example line's profile and committed plan (tests/test_nixos_plan_file.py)
      "examples/spark-line"
      "pkgs/sources.nix"
      "python"
      "sources.manifest"
      "tests"
    ];
  };
  # the Nix files alone, so only an edit to one reruns the formatting check
  nixFiles = builtins.path {
    path = src.root;
    name = "tp4-nix-files";
    filter =
      path: type:
      !(builtins.elem (baseNameOf path) [
        ".git"
        ".venv"
      ])
      && (type == "directory" || hasSuffix ".nix" path);
  };
  unlockedReport = ''
    ${toString (builtins.length unlocked)} row(s) of sources.manifest are not locked (their hashes need the network):
    ${builtins.concatStringsSep " " unlocked}.
    These outputs need them and are not checked (nor in `packages`) until they are locked:
    ${builtins.concatStringsSep "\n" (map (n: "  " + n) leftOut)}
    On a machine with network access, in the checkout, run once
      ${lockCommand}
    (it prints what it downloads), commit the change (${commitCommand}), and run `nix flake check` again.
  '';
in
{
  # instantiates every output (a throw, e.g. an unlocked source row, fails it) without building
  # any: the store paths lose their context, so none becomes an input of this file
  eval = pkgs.writeText "tp4-eval.json" (
    builtins.toJSON (builtins.mapAttrs (_: d: builtins.unsafeDiscardStringContext d.drvPath) outputs)
  );

  # the example line's committed plan (examples/spark-line/plan.json, which the template copies
  # and its NixOS hosts read) is the one its profile renders; the line's own flake checks its copy
  # the same way (tp4.lib.planChecks)
  plan-current =
    import ./plan-check.nix
      {
        inherit pkgs;
        tp4 = "PYTHONPATH=${src.cli}/python ${python}/bin/python3 -m tp4";
      }
      {
        profile = src.root + "/examples/spark-line/profile.toml";
        plan = src.root + "/examples/spark-line/plan.json";
      };

  # treefmt with nixfmt over a copy of the tree; fails on any file nixfmt would change
  formatting = pkgs.nixfmt-tree.check nixFiles;

  # the test modules marked `unit` need no root, nix, network or daemon (tests/conftest.py); only
  # they are collected, as others need nix even to import
  unit =
    pkgs.runCommand "tp4-unit-tests"
      {
        nativeBuildInputs = [
          python
          pkgs.git
        ];
      }
      ''
        cp -r ${tests} "$TMPDIR/tree"
        chmod -R u+w "$TMPDIR/tree"
        cd "$TMPDIR/tree"
        export HOME="$TMPDIR"
        modules=$(grep -l '^pytestmark = pytest.mark.unit$' tests/test_*.py)
        # tp4 never downloads inside a Nix build (NIX_BUILD_TOP); these tests download from loopback.
        # A fixed hypothesis seed: the same tree gives the same result (CI draws new examples)
        env -u NIX_BUILD_TOP python3 -m pytest -q -p no:cacheprovider --hypothesis-seed=0 -m unit $modules
        touch "$out"
      '';
}
# passes, and says which outputs were left out and the command that brings them back (a trace at
# evaluation, so `nix flake check` and `nix flake show` print it without -L)
// (
  if unlocked == [ ] then
    { }
  else
    {
      sources-unlocked = builtins.trace "warning: ${unlockedReport}" (
        pkgs.runCommand "tp4-sources-unlocked-${toString (builtins.length leftOut)}-outputs-not-checked"
          {
            passthru = {
              inherit
                unlocked
                leftOut
                lockCommand
                commitCommand
                ;
            };
            meta.description = "Passes; ${toString (builtins.length leftOut)} outputs need unlocked rows: run `${lockCommand}` and ${commitCommand}";
          }
          ''
            cat <<'EOF'
            ${unlockedReport}
            EOF
            touch "$out"
          ''
      );
    }
)
