#!/bin/sh
# tp4-mesh's first step on a switchless ring: wait until every fabric link (one DAC per netdev)
# is up with a carrier, at most TIMEOUT seconds (upstream's dsv41-mesh waits 120 s), so the mesh
# is never set up on a link that is still training; fails naming each link that is not up.
# usage: ring-links.sh TIMEOUT NETDEV...
# TP4_SYSFS (default /sys) is where the sysfs tree is read (tests point it at a copy).
set -eu
sys=${TP4_SYSFS:-/sys}
timeout=$1
shift
[ $# -gt 0 ] || { echo "tp4-mesh: usage: TIMEOUT NETDEV..." >&2; exit 1; }
case $timeout in ""|*[!0-9]*) echo "tp4-mesh: TIMEOUT $timeout is not a number of seconds" >&2; exit 1 ;; esac
waited=0
while :; do
  down=""
  for dev in "$@"; do
    d=$sys/class/net/$dev
    if [ ! -d "$d" ]; then
      down="$down $dev(absent)"
    elif [ "$(cat "$d/operstate" 2>/dev/null)" != up ] || [ "$(cat "$d/carrier" 2>/dev/null)" != 1 ]; then
      down="$down $dev($(cat "$d/operstate" 2>/dev/null || echo unknown))"
    fi
  done
  if [ -z "$down" ]; then
    echo "tp4-mesh: the fabric links are up: $*"
    exit 0
  fi
  if [ "$waited" -ge "$timeout" ]; then
    echo "tp4-mesh: fabric links not up after ${timeout} s:$down; fix: check each DAC (rank i's f0 to rank i+1's f1) and ip link set <netdev> up" >&2
    exit 1
  fi
  sleep 1
  waited=$((waited + 1))
done
