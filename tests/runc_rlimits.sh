#!/bin/sh
# The OCI runtime of tests/line_cluster.py's hosts (containers.conf: ``[engine] runtime =
# "tp4-runc"``, ``[engine.runtimes] tp4-runc = ["<this file>"]``): runc, through
# tests/runc_rlimits.py where that has work to do (create and run, exec: the container's limits;
# a start a test made fail: its config.json holds TP4_TEST_RUNC_FAIL=start), and straight to runc
# otherwise (start, state, kill, delete), without an interpreter's start-up on every call, as a
# host without the wrapper runs them. TP4_TEST_RUNC names runc (default: on PATH).
python() { exec /usr/bin/python3 -S "$(dirname -- "$0")/runc_rlimits.py" "$@"; }
root=/run/runc prev= start= id=
for a in "$@"; do
  case $a in
    create|run|exec) python "$@" ;;
    start) start=1 ;;
    --root=*) root=${a#--root=} ;;
  esac
  [ "$prev" = --root ] && root=$a
  prev=$a id=$a
done
if [ -n "$start" ] && [ -r "$root/$id/state.json" ]; then
  bundle=$(grep -o '"bundle=[^"]*"' "$root/$id/state.json" | sed -n '1s/^"bundle=\(.*\)"$/\1/p')
  if [ -n "$bundle" ] && grep -q '"TP4_TEST_RUNC_FAIL=start"' "$bundle/config.json" 2>/dev/null; then
    python "$@"
  fi
fi
exec "${TP4_TEST_RUNC:-$(command -v runc || echo /usr/bin/runc)}" "$@"
