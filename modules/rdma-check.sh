#!/bin/sh
# tp4-rdma-check: every RDMA port the rank uses is ACTIVE and has the RoCE v2 IPv4-mapped GID of
# its address; writes "<hca> <gid index>" per port to GID_FILE (the index NCCL_IB_GID_INDEX must
# name). Fails loudly, naming the port and the fix, so the rank unit never starts on a fabric that
# would make NCCL fall back to TCP or time out.
# usage: rdma-check.sh GID_FILE PINNED_INDEX|- HCA NETDEV ADDRESS [HCA NETDEV ADDRESS ...]
# TP4_SYSFS (default /sys) is where the sysfs tree is read (tests point it at a copy).
set -eu
sys=${TP4_SYSFS:-/sys}
gid_file=$1 pinned=$2
shift 2
fail() { echo "tp4-rdma-check: $*" >&2; exit 1; }
[ $(($# % 3)) -eq 0 ] && [ $# -gt 0 ] || fail "usage: GID_FILE PINNED_INDEX|- HCA NETDEV ADDRESS..."
out=""
while [ $# -gt 0 ]; do
  hca=$1 netdev=$2 addr=$3
  shift 3
  dev=$sys/class/infiniband/$hca
  [ -d "$dev" ] || fail "$hca: no such RDMA device (for $netdev $addr); fix: load mlx5_ib (boot.kernelModules), check the name with ibv_devices"
  state=$(cat "$dev/ports/1/state" 2>/dev/null || echo missing)
  case $state in
    *ACTIVE*) ;;
    *) fail "$hca port 1 is '$state', not ACTIVE; fix: cable and link of $netdev (ip link show $netdev), then systemctl restart tp4-rdma-check" ;;
  esac
  old_ifs=$IFS IFS=.
  # shellcheck disable=SC2086
  set -- $addr "$@"
  IFS=$old_ifs
  want=$(printf '0000:0000:0000:0000:0000:ffff:%02x%02x:%02x%02x' "$1" "$2" "$3" "$4")
  shift 4
  found=""
  for g in "$dev"/ports/1/gids/*; do
    i=${g##*/}
    [ "$(cat "$g" 2>/dev/null)" = "$want" ] || continue
    [ "$(cat "$dev/ports/1/gid_attrs/types/$i" 2>/dev/null)" = "RoCE v2" ] || continue
    found=$i
    break
  done
  [ -n "$found" ] || fail "$hca has no RoCE v2 GID for $addr ($want); fix: give $netdev the address $addr (networking.interfaces), check it with ip addr show $netdev"
  if [ "$pinned" != - ] && [ "$found" != "$pinned" ]; then
    fail "$hca: the RoCE v2 GID of $addr is at index $found, the profile pins $pinned; fix: set the node's gid_index = $found in the profile (every rank must use the same index)"
  fi
  echo "tp4-rdma-check: $hca ($netdev $addr) ACTIVE, RoCE v2 GID index $found"
  out="$out$hca $found
"
done
umask 022
mkdir -p "$(dirname "$gid_file")"
printf '%s' "$out" > "$gid_file.tmp"
mv -f "$gid_file.tmp" "$gid_file"
