#!/usr/bin/env bash
# Set up tp4 on a fresh Debian 12 machine: a virtualenv at <repo>/.venv with the tp4 CLI, installed
# editable from this checkout.
#   bash python/setup.sh          the CLI only (enough for `tp4 plan`, `tp4 profile`)
#   bash python/setup.sh --test   also the system tools and Python packages the tests use
#                                 (nix, busybox, sshd, podman, docker, skopeo, umoci, iproute2, iptables, g++, binutils,
#                                 nfs-ganesha + its VFS backend, libnfs-utils,
#                                 prometheus; the dev group, and the router
#                                 group: SGLang's router, which tp4 fleet runs)
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
want_test=0
[ "${1:-}" = "--test" ] && want_test=1

# a line per step on stderr: the whole setup takes a minute or more, never silently
steps=4
step_no=0
step() { step_no=$((step_no + 1)); echo "setup: [$step_no/$steps] $*" >&2; }

step "checking the system tools$([ "$want_test" = 1 ] && echo ' (and those the tests use)')"
apt_pkgs=()
need() { command -v "$1" >/dev/null 2>&1 || apt_pkgs+=("$2"); }
python3 -c 'import venv, ensurepip' 2>/dev/null || apt_pkgs+=(python3-venv)
command -v python3 >/dev/null 2>&1 || apt_pkgs+=(python3)
if [ "$want_test" = 1 ]; then
  need nix nix-bin
  need busybox busybox-static
  need sshd openssh-server
  need ssh openssh-client
  need ip iproute2
  need tc iproute2
  need iptables iptables
  need ping iputils-ping
  need podman podman
  need runc runc
  need skopeo skopeo
  need docker-registry docker-registry
  need dockerd docker.io
  need umoci umoci
  need git git
  need g++ g++
  need readelf binutils
  need objdump binutils
  need patch patch
  # tp4 watch's metrics test scrapes the watchdog with the real Prometheus
  need prometheus prometheus
  # tp4 share's tests: a user-space NFS server (VFS backend) in the head's namespace, a user-space client
  need ganesha.nfsd nfs-ganesha
  [ -e /usr/lib/x86_64-linux-gnu/ganesha/libfsalvfs.so ] || [ -e /usr/lib/aarch64-linux-gnu/ganesha/libfsalvfs.so ] || apt_pkgs+=(nfs-ganesha-vfs)
  need nfs-ls libnfs-utils
  need nfs-cat libnfs-utils
fi
if [ ${#apt_pkgs[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" = 0 ] || sudo=sudo
  echo "setup: installing ${apt_pkgs[*]} (apt-get)" >&2
  # another apt-get on this machine holds the package lock for a while: wait for it, not fail
  lock=(-o DPkg::Lock::Timeout=900)
  $sudo apt-get "${lock[@]}" update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get "${lock[@]}" install -y -qq "${apt_pkgs[@]}" >/dev/null
fi

if [ ! -x "$repo/.venv/bin/python" ]; then
  step "creating the virtualenv $repo/.venv"
  python3 -m venv "$repo/.venv"
else
  step "using the virtualenv $repo/.venv"
fi
"$repo/.venv/bin/pip" install -q --disable-pip-version-check --upgrade pip >/dev/null 2>&1 || true
# Install exactly what python/poetry.lock pins (versions and file hashes), then tp4 itself.
reqs=$(mktemp)
trap 'rm -f "$reqs"' EXIT
"$repo/.venv/bin/python" - "$repo/python/poetry.lock" "$want_test" >"$reqs" <<'PY'
import sys, tomllib
lock = tomllib.load(open(sys.argv[1], "rb"))
groups = {"main", "dev", "router"} if sys.argv[2] == "1" else {"main"}
for pkg in lock["package"]:
    if not groups & set(pkg.get("groups", ["main"])):
        continue
    line = f"{pkg['name']}=={pkg['version']}"
    if pkg.get("markers"):
        markers = pkg["markers"]
        if isinstance(markers, dict):
            markers = " or ".join(f"({v})" for k, v in markers.items() if k in groups)
        line += f" ; {markers}"
    hashes = " ".join(f"--hash={f['hash']}" for f in pkg.get("files", []))
    print(f"{line} {hashes}")
PY
step "installing the $(grep -c . "$reqs") Python packages python/poetry.lock pins (hashes checked)"
"$repo/.venv/bin/pip" install -q --disable-pip-version-check --require-hashes -r "$reqs"
step "installing tp4 itself from $repo/python (editable)"
# tp4 itself, editable: the CLI runs this checkout's python/tp4 and reads its data (python/tp4/data:
# adapters/registry.toml, the presets, sources.manifest), so an edit there reaches the next command.
# The wheel and the Nix package carry their own copy of that data.
"$repo/.venv/bin/pip" install -q --disable-pip-version-check --no-deps --no-build-isolation -e "$repo/python" 2>/dev/null \
  || "$repo/.venv/bin/pip" install -q --disable-pip-version-check --no-deps -e "$repo/python"
echo "setup: tp4 installed in $repo/.venv (run $repo/.venv/bin/tp4)" >&2
