#!/bin/sh
# tp4-mesh's first step on a switchless ring: the ConnectX-7 functions' hairpin queue size, a
# devlink driverinit parameter that resets at every boot (RoCEnante's size cap follows it). A
# function already at the size is left alone: a reload re-initialises it (~4 s), which must never
# happen while the line serves.
# usage: ring-hairpin.sh SIZE PCI_FUNCTION...
set -eu
size=$1
shift
[ $# -gt 0 ] || { echo "tp4-mesh: usage: SIZE PCI_FUNCTION..." >&2; exit 1; }
for fn in "$@"; do
  dev=pci/$fn
  now=$(devlink dev param show "$dev" name hairpin_queue_size 2>&1) || {
    echo "tp4-mesh: $dev has no hairpin_queue_size ($now); fix: check the function with devlink dev show, and the mlx5 driver" >&2
    exit 1
  }
  case $now in
    *"cmode driverinit value $size"*) echo "tp4-mesh: $dev hairpin_queue_size is $size already"; continue ;;
  esac
  devlink dev param set "$dev" name hairpin_queue_size value "$size" cmode driverinit
  devlink dev reload "$dev"
  echo "tp4-mesh: $dev hairpin_queue_size set to $size (reloaded)"
done
