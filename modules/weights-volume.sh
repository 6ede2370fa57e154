#!/bin/sh
# tp4-weights-volume: the plan's weights volume as a bind of a host directory (the worker's NFS
# mount of the head's checkpoint, or its own copy), created with those options or left alone when
# it has them. A volume with other options is replaced only when no container uses it.
# usage: weights-volume.sh RUNTIME NAME DEVICE
set -eu
rt=$1 name=$2 device=$3
want="none bind $device"
have=$("$rt" volume inspect --format '{{index .Options "type"}} {{index .Options "o"}} {{index .Options "device"}}' "$name" 2>/dev/null || true)
if [ "$have" = "$want" ]; then
  echo "tp4-weights-volume: $name binds $device"
  exit 0
fi
if [ -n "$have" ]; then
  "$rt" volume rm "$name" >/dev/null 2>&1 || {
    echo "tp4-weights-volume: $name has the options '$have', not '$want', and a container uses it; fix: tp4 stop, then systemctl restart tp4-weights-volume" >&2
    exit 1
  }
fi
"$rt" volume create --driver local --opt type=none --opt o=bind --opt "device=$device" "$name" >/dev/null
echo "tp4-weights-volume: $name ${have:+re}created, binding $device"
