# `tp4 plan --check`: a line's committed plan file is the one its profile renders now. The NixOS
# hosts read the plan file, never the profile: a profile edited without `tp4 plan --json -o
# plan.json` fails this check, naming each field that differs. Copies of both files under their
# usual names, so the message's fix reads as the operator runs it.
{
  pkgs,
  # the command that runs tp4 (the package's bin/tp4, or python -m tp4 on the source tree)
  tp4,
}:
{
  profile,
  plan,
  name ? "tp4-plan-current",
}:
pkgs.runCommand name { } ''
  export HOME="$TMPDIR"
  cd "$TMPDIR"
  cp ${profile} profile.toml
  cp ${plan} plan.json
  ${tp4} plan --check plan.json --profile profile.toml
  touch "$out"
''
