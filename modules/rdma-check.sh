#!/bin/sh
# tp4-rdma-check: every RDMA port the rank uses is ACTIVE and has the RoCE v2 IPv4-mapped GID of
# its address; writes "<hca> <gid index>" per port to GID_FILE (the index NCCL_IB_GID_INDEX must
# name). At boot a port can take seconds to become ACTIVE after the driver loads and its GID to
# appear after the address: the check retries every second for at most TIMEOUT seconds (as the
# ring's link wait does), then fails loudly, naming the port and the fix, so the rank unit never
# starts on a fabric that would make NCCL fall back to TCP or time out. A pinned index that is not
# the GID's is a setting, not a state: it fails at once.
# usage: rdma-check.sh TIMEOUT GID_FILE PINNED_INDEX|- HCA NETDEV ADDRESS [HCA NETDEV ADDRESS ...]
# TP4_SYSFS (default /sys) is where the sysfs tree is read (tests point it at a copy).
set -eu
sys=${TP4_SYSFS:-/sys}
fail() { echo "tp4-rdma-check: $*" >&2; exit 1; }
[ $# -ge 3 ] || fail "usage: TIMEOUT GID_FILE PINNED_INDEX|- HCA NETDEV ADDRESS..."
timeout=$1 gid_file=$2 pinned=$3
shift 3
case $timeout in "" | *[!0-9]*) fail "TIMEOUT $timeout is not a number of seconds" ;; esac
[ $(($# % 3)) -eq 0 ] && [ $# -gt 0 ] || fail "usage: TIMEOUT GID_FILE PINNED_INDEX|- HCA NETDEV ADDRESS..."

# one pass over the ports: 0 with $table ("<hca> <index>" lines) and $said set, 1 with $problem
# set (worth waiting for), 2 for a pin
check() {
  table="" said="" problem=""
  while [ $# -gt 0 ]; do
    hca=$1 netdev=$2 addr=$3
    shift 3
    dev=$sys/class/infiniband/$hca
    if [ ! -d "$dev" ]; then
      problem="$hca: no such RDMA device (for $netdev $addr); fix: load mlx5_ib (boot.kernelModules), check the name with ibv_devices"
      return 1
    fi
    state=$(cat "$dev/ports/1/state" 2>/dev/null || echo missing)
    case $state in
      *ACTIVE*) ;;
      *)
        problem="$hca port 1 is '$state', not ACTIVE; fix: cable and link of $netdev (ip link show $netdev), then systemctl restart tp4-rdma-check"
        return 1
        ;;
    esac
    want=$(echo "$addr" | {
      IFS=. read -r a b c d
      printf '0000:0000:0000:0000:0000:ffff:%02x%02x:%02x%02x' "$a" "$b" "$c" "$d"
    })
    found=""
    for g in "$dev"/ports/1/gids/*; do
      i=${g##*/}
      [ "$(cat "$g" 2>/dev/null)" = "$want" ] || continue
      [ "$(cat "$dev/ports/1/gid_attrs/types/$i" 2>/dev/null)" = "RoCE v2" ] || continue
      found=$i
      break
    done
    if [ -z "$found" ]; then
      problem="$hca has no RoCE v2 GID for $addr ($want); fix: give $netdev the address $addr (networking.interfaces), check it with ip addr show $netdev"
      return 1
    fi
    if [ "$pinned" != - ] && [ "$found" != "$pinned" ]; then
      problem="$hca: the RoCE v2 GID of $addr is at index $found, the profile pins $pinned; fix: set the node's gid_index = $found in the profile (every rank must use the same index)"
      return 2
    fi
    table="$table$hca $found
"
    said="${said}tp4-rdma-check: $hca ($netdev $addr) ACTIVE, RoCE v2 GID index $found
"
  done
}

waited=0
while :; do
  rc=0
  check "$@" || rc=$?
  [ "$rc" -eq 0 ] && break
  [ "$rc" -eq 2 ] && fail "$problem"
  [ "$waited" -ge "$timeout" ] && fail "after ${waited} s: $problem"
  [ "$waited" -eq 0 ] && echo "tp4-rdma-check: waiting up to ${timeout} s: $problem"
  sleep 1
  waited=$((waited + 1))
done
printf '%s' "$said"
umask 022
mkdir -p "$(dirname "$gid_file")"
printf '%s' "$table" >"$gid_file.tmp"
mv -f "$gid_file.tmp" "$gid_file"
