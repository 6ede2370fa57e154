#!/bin/sh
# tp4-rank-ready: the readiness of this node's rank, tp4 serve's boot-log check
# (python/tp4/bootlog.py) on this node's own container log. It waits until the log has READY_ERE
# (the head: boot.py's `Ready: API on port <PORT>`; a worker, which never prints that: SGLang's
# `Load weight end.`), then checks the required boot lines (the head's, from the plan). It fails
# at once on a forbidden line (the plan's forbidden_lines, as serve checks every rank) or when the
# container is no longer running, and after TIMEOUT seconds. tp4-rank-ready.service runs it beside
# the rank unit, never inside that unit's start: `systemctl start` of the rank (tp4 serve) returns
# as soon as the container runs, and nothing waits on a worker forever.
# usage: rank-ready.sh RUNTIME CONTAINER TIMEOUT READY_ERE [require ERE TEXT | forbid TEXT]...
# TP4_READY_POLL (default 5): seconds between two reads of the log.
set -eu
[ $# -ge 4 ] || { echo "tp4-rank-ready: usage: RUNTIME CONTAINER TIMEOUT READY_ERE [require ERE TEXT | forbid TEXT]..." >&2; exit 2; }
rt=$1 ctn=$2 timeout=$3 ready=$4
shift 4
poll=${TP4_READY_POLL:-5}
esc=$(printf '\033')
log=$(mktemp)
trap 'rm -f "$log"' EXIT

fail() {
  echo "tp4-rank-ready: $ctn: $*" >&2
  if [ -s "$log" ]; then
    echo "tp4-rank-ready: last lines of the log of $ctn:" >&2
    tail -n 20 "$log" | sed 's/^/  | /' >&2
  fi
  exit 1
}

# the arguments after READY_ERE must be whole groups
check_groups() {
  while [ $# -gt 0 ]; do
    case $1 in
      require) [ $# -ge 3 ] || { echo "tp4-rank-ready: require needs ERE and TEXT" >&2; exit 2; }; shift 3 ;;
      forbid) [ $# -ge 2 ] || { echo "tp4-rank-ready: forbid needs TEXT" >&2; exit 2; }; shift 2 ;;
      *) echo "tp4-rank-ready: unknown group '$1' (require ERE TEXT | forbid TEXT)" >&2; exit 2 ;;
    esac
  done
}

forbidden() {
  while [ $# -gt 0 ]; do
    case $1 in
      require) shift 3 ;;
      forbid)
        hit=$(grep -n -F -m 1 -- "$2" "$log" || :)
        [ -z "$hit" ] || fail "line ${hit%%:*} of its log has \`$2\`: ${hit#*:}; fix: read the whole log (tp4 logs), stop the line (tp4 stop) and fix the cause before the next tp4 serve"
        shift 2 ;;
    esac
  done
}

missing_required() {
  missing=""
  while [ $# -gt 0 ]; do
    case $1 in
      require)
        grep -E -q -- "$2" "$log" || missing="$missing \`$3\`"
        shift 3 ;;
      forbid) shift 2 ;;
    esac
  done
  [ -z "$missing" ] || fail "ready, but the boot lines the plan arms are not in its log:$missing; fix: check that the image carries the adapters and that the rank's env has their gates (tp4 plan)"
}

check_groups "$@"
deadline=$(($(date +%s) + timeout))
while :; do
  state=$("$rt" container inspect --format '{{.State.Status}}' "$ctn" 2>/dev/null) || state=gone
  # the log as the engine printed it: no carriage returns, no colour codes (bootlog's log_lines)
  "$rt" logs "$ctn" 2>&1 | tr -d '\r' | sed "s/${esc}\[[0-9;?]*[A-Za-z]//g" > "$log" || :
  forbidden "$@"
  line=$(grep -E -m 1 -- "$ready" "$log" || :)
  if [ -n "$line" ]; then
    missing_required "$@"
    echo "tp4-rank-ready: $ctn: ready: $line"
    exit 0
  fi
  [ "$state" = running ] || fail "the container is $state and its log never showed it ready (no line matching '$ready'); fix: read its log (journalctl -u the rank unit, or tp4 logs) and start the line again with tp4 serve"
  [ "$(date +%s)" -lt "$deadline" ] || fail "not ready after ${timeout}s: no line matching '$ready' in its log; fix: read its log (tp4 logs); a boot that is only slow needs tp4 serve's longer phase timeouts"
  sleep "$poll"
done
