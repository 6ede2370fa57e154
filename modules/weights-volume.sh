#!/bin/sh
# tp4-weights-volume: the plan's weights volume with the options the host's settings give it (the
# NFS volume tp4 share makes on a plain host, or a bind of the node's own copy), created, or left
# alone when it has them. A volume with other options is replaced only when no container uses it.
# usage: weights-volume.sh RUNTIME NAME TYPE O DEVICE
set -eu
rt=$1 name=$2 type=$3 o=$4 device=$5
want="$type $o $device"
have=$("$rt" volume inspect --format '{{index .Options "type"}} {{index .Options "o"}} {{index .Options "device"}}' "$name" 2>/dev/null || true)
if [ "$have" = "$want" ]; then
  echo "tp4-weights-volume: $name is $want"
  exit 0
fi
if [ -n "$have" ]; then
  "$rt" volume rm "$name" >/dev/null 2>&1 || {
    echo "tp4-weights-volume: $name is '$have', not '$want', and a container uses it; fix: tp4 stop, then systemctl restart tp4-weights-volume" >&2
    exit 1
  }
fi
"$rt" volume create --driver local --opt "type=$type" --opt "o=$o" --opt "device=$device" "$name" >/dev/null
echo "tp4-weights-volume: $name ${have:+re}created: $want"
