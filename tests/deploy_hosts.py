"""The `tp4 deploy` test cluster: tests/doctor_hosts.py's four good Sparks as NixOS hosts, and a
flake of small real NixOS-like systems for them::

    with DeployCluster(tmp_path) as cluster:
        cluster.systems({"node1": System("v1"), ...})  # what nixosConfigurations.<node> builds
        cluster.install("v0")                          # every host on a first generation of it
        cluster.generations(host)                      # [(number, store path, current)]
        cluster.switches(host)                         # what switch-to-configuration was asked
        cluster.units(host)                            # what systemd-run started

What is real: sshd (tests/netns_hosts.py), nix (the deploy's `nix build` of the flake, its
`nix copy` over ssh), **nix-env** (the real one: each host's sessions see a host-local
/nix/var/nix/profiles, bound over the machine's in the host's mount namespace, so each keeps its
own numbered system generations; /nix/store and its database are this machine's, shared), and
doctor's facts (tests/doctor_hosts.py lays the hardware).

Where this machine has no NixOS, and what stands in (in ``<host dir>/bin``, first on the
sessions' PATH, like DoctorCluster's stubs; each keeps its records under the host's own
``/etc/tp4-deploy``, a link in the host's /etc overlay to ``<host dir>/deploy``):

* ``systemd-run`` (there is no systemd here): takes the options tp4 and nixos-rebuild use
  (``--unit/-u``, ``--wait``, ``--collect``, ``--pipe``, ``--quiet``, ``--no-ask-password``,
  ``--service-type=``, ``--setenv/-E``) and refuses any other, a missing or relative command,
  and a unit name already loaded (one still running, or a failed one started without
  ``--collect``), with systemd's messages. It records the unit, its options and command
  (``systemd-run.log``, one JSON object a line) and runs the command as a unit would: in a
  session of its own (the ssh session ending does not stop it), with a unit's environment (PATH
  and what ``--setenv`` gives, nothing of the caller's else); with ``--wait`` it exits with the
  command's status, without ``--pipe`` the output goes to ``journal/<unit>``; the unit's state
  (``units/<unit>``, what systemctl reads) is active while it runs, gone when it ended (failed
  for a failed one without ``--collect``), also when the caller went first;
* ``systemctl``: ``is-active [--] UNIT...`` from ``units/<unit>`` (what the last switch set;
  ``inactive`` without), ``show -p LimitMEMLOCK --value`` (``infinity``, what the host module
  sets); refuses the rest;
* the systems' ``bin/switch-to-configuration`` (in the store paths the flake builds; the host's
  /bin/sh runs it, where a NixOS system's is a program of its closure): refuses an
  action other than switch, boot, test or dry-activate; records its path, action and start and
  end times (``switch.log``); for a system that says so, ends the ssh connection that started it
  (TERM to the nearest sshd above it: what a restart of sshd or the network does), or stops the
  host's sshd listening (TERM to the listener; the connections open stay); sleeps the
  system's ``seconds``; then sets each unit the system
  lists to its state (``units/<unit>``: ``tp4-rdma-check.service`` active, or failed for a
  system whose RDMA check fails), and fails (exit 1) when the system says so;
* ``nix-store``: the real one on a store of the host's own (``NIX_REMOTE=local?root=<its state
  dir>/store``: the hosts share this machine's /nix, so without it every path would be there
  already and deploy's copy would never send one); its ``--check-validity`` and ``--import`` runs
  (deploy's copy: which paths the host lacks, then those) are recorded in ``nix-store.log`` (the
  first two words). nix-env and the systems' scripts use this machine's store, where the paths
  built here are, as the host's own store holds them after the copy.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from doctor_hosts import DoctorCluster, _doctor_prepare
from netns_hosts import Host
from nix_env import SYSTEM, busybox_dir, nix_config

from tp4.core import process

from tp4.hosts import deploy

STATE = "/etc/tp4-deploy"

SYSTEMD_RUN = r'''#!/usr/bin/python3
"""systemd-run, as far as tp4 deploy uses it (tests/deploy_hosts.py)."""
import json, os, signal, subprocess, sys, time

d = "@state@"
UNIT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def die(text):
    print(text, file=sys.stderr)
    sys.exit(1)


args = sys.argv[1:]
opts = {"wait": False, "collect": False, "pipe": False, "unit": None, "setenv": []}
seen = []
while args and args[0].startswith("-"):
    a = args.pop(0)
    seen.append(a)
    if a == "--":
        break
    name, eq, value = a.partition("=")
    if name in ("--unit", "-u", "--setenv", "-E", "--service-type") and not eq:
        if not args:
            die(f"systemd-run: option '{name}' requires an argument")
        value = args.pop(0)
        seen.append(value)
    if name in ("--unit", "-u"):
        opts["unit"] = value
    elif name in ("--setenv", "-E"):
        opts["setenv"].append(value)
    elif name == "--service-type":
        if value not in ("simple", "exec", "forking", "oneshot", "dbus", "notify", "idle"):
            die(f"Failed to parse service type: {value}")
    elif a in ("--wait", "--collect", "--pipe"):
        opts[a[2:]] = True
    elif a in ("--quiet", "-q", "--no-ask-password"):
        pass
    else:
        die(f"systemd-run: unrecognized option '{a}'")
if not args:
    die("Command line to execute required.")
if not args[0].startswith("/"):
    die(f"Failed to find executable {args[0]}: No such file or directory")
if not os.access(args[0], os.X_OK):
    die(f"Failed to find executable {args[0]}: No such file or directory")
unit = opts["unit"] or f"run-u{os.getpid()}"
if not unit.endswith(".service"):
    unit += ".service"
loaded = os.path.join(d, "loaded", unit)
os.makedirs(os.path.dirname(loaded), exist_ok=True)
try:
    fd = os.open(loaded, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
except FileExistsError:
    die(f"Failed to start transient service unit: Unit {unit} was already loaded or has a fragment file.")
os.close(fd)
with open(os.path.join(d, "systemd-run.log"), "a") as log:
    log.write(json.dumps({"unit": unit, "options": seen, "argv": args, "time": time.time()}) + "\n")
state = os.path.join(d, "units", unit)
os.makedirs(os.path.dirname(state), exist_ok=True)
with open(state, "w") as f:
    f.write("active\n")
env = {"PATH": UNIT_PATH}
for item in opts["setenv"]:
    k, eq, v = item.partition("=")
    if eq:
        env[k] = v
    elif k in os.environ:
        env[k] = os.environ[k]
if opts["pipe"]:
    out = err = None
else:
    os.makedirs(os.path.join(d, "journal"), exist_ok=True)
    out = err = open(os.path.join(d, "journal", unit), "ab")
manager = os.fork()
if manager:  # the caller; the unit lives on in the manager below if the caller goes (its ssh ended)
    if not opts["wait"]:
        sys.exit(0)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    _, status = os.waitpid(manager, 0)
    sys.exit(os.waitstatus_to_exitcode(status))
os.setsid()
signal.signal(signal.SIGHUP, signal.SIG_IGN)
# SIGPIPE stays ignored, as a unit's (IgnoreSIGPIPE=yes): a write to a dead ssh channel fails, it does not kill
code = subprocess.call(args, env=env, cwd="/", stdin=None if opts["pipe"] else subprocess.DEVNULL, stdout=out, stderr=err,
                       restore_signals=False)
if code == 0 or opts["collect"]:  # a transient unit goes when it ends; a failed one stays without --collect
    os.unlink(loaded)
    os.unlink(state)
else:
    with open(state, "w") as f:
        f.write("failed\n")
sys.exit(code if code >= 0 else 128 - code)
'''

SYSTEMCTL = r"""#!/bin/sh
d=@state@
case "$1" in
  is-active)
    shift; [ "$1" = -- ] && shift
    rc=0
    for u in "$@"; do
      s=$(cat "$d/units/$u" 2>/dev/null || echo inactive)
      echo "$s"
      [ "$s" = active ] || rc=3
    done
    exit $rc ;;
  show)
    if [ "$2" = -p ] && [ "$3" = LimitMEMLOCK ]; then echo infinity; exit 0; fi ;;
esac
echo "systemctl stand-in: not supported: $*" >&2
exit 1
"""

NIX_STORE = r"""#!/bin/sh
case " $* " in
  *" --check-validity "*|*" --import "*) echo "$1 $2" >> @state@/nix-store.log ;;
esac
NIX_REMOTE="local?root=@store@" exec @real@ "$@"
"""

# the systems: nixosConfigurations.<node>.config.system.build.toplevel of each entry of
# systems.json, a store path like a NixOS system's: nixos-version, bin/switch-to-configuration
SYSTEMS_FLAKE = r"""{
  outputs = { self }:
    let
      system = "@system@";
      bb = ./bb;
      sh = "${bb}/bin/sh";
      specs = builtins.fromJSON (builtins.readFile ./systems.json);
      switch = builtins.toFile "switch-to-configuration" ''
        case "$1" in switch|boot|test|dry-activate) ;; *) echo "Usage: $0 [switch|boot|test|dry-activate]" >&2; exit 1;; esac
        d=@state@
        self=$(cd "$(dirname "$0")/.." && pwd -P)
        echo "$(date +%s.%N) start $self $1" >> "$d/switch.log"
        if [ "$(cat "$self/drop")" = 1 ]; then
          # what a restart of sshd or the network does: the ssh connection that started the switch ends
          p=$PPID
          while [ "$p" -gt 1 ]; do
            case "$(cat /proc/$p/comm)" in sshd*) kill -TERM "$p"; break;; esac
            p=$(awk '{print $4}' /proc/$p/stat)
          done
          sleep 1
        fi
        if [ "$(cat "$self/stop_sshd")" = 1 ]; then
          # sshd stops listening (a broken sshd configuration): the connections open stay, new ones fail
          p=$PPID
          while [ "$p" -gt 1 ]; do
            case " $(tr '\0' ' ' < /proc/$p/cmdline)" in *" -D "*sshd_config*) kill -TERM "$p"; break;; esac
            p=$(awk '{print $4}' /proc/$p/stat)
          done
        fi
        sleep "$(cat "$self/seconds")"
        mkdir -p "$d/units"
        while read -r unit state; do echo "$state" > "$d/units/$unit"; done < "$self/units"
        echo "$(date +%s.%N) end $self $1" >> "$d/switch.log"
        if [ "$(cat "$self/fail")" = 1 ]; then echo "switch-to-configuration: activation failed (on purpose)" >&2; exit 1; fi
      '';
      toplevel = name: s: derivation {
        name = "nixos-system-${name}-${s.label}";
        inherit system;
        builder = sh;
        args = [ "-euc" ''
          ${if s.broken then "echo 'this system does not build (on purpose)' >&2; exit 1" else ""}
          ${bb}/bin/busybox mkdir -p "$out/bin"
          echo "${s.label}" > "$out/nixos-version"
          echo "${toString s.seconds}" > "$out/seconds"
          echo "${if s.fail then "1" else "0"}" > "$out/fail"
          echo "${if s.drop then "1" else "0"}" > "$out/drop"
          echo "${if s.stop_sshd then "1" else "0"}" > "$out/stop_sshd"
          echo "@rdma_unit@ ${s.rdma}" > "$out/units"
          { echo "#!/bin/sh"; ${bb}/bin/busybox cat ${switch}; } > "$out/bin/switch-to-configuration"
          ${bb}/bin/busybox chmod +x "$out/bin/switch-to-configuration"
        '' ];
      };
    in {
      nixosConfigurations = builtins.mapAttrs (name: s: { config.system.build.toplevel = toplevel name s; }) specs;
    };
}
"""


@dataclass(frozen=True)
class System:
    """One node's system: its label (a new label is a new store path), the state its switch
    leaves the RDMA check unit in, whether the switch fails, how long it takes."""

    label: str
    rdma: str = "active"
    fail: bool = False
    seconds: float = 0.0
    drop_ssh: bool = False  # the switch ends the ssh connection that started it (restarting sshd)
    stop_sshd: bool = False  # the switch stops the host's sshd listening (open connections stay)
    broken: bool = False  # it does not build

    def to_json(self) -> dict[str, object]:
        return {
            "label": self.label,
            "rdma": self.rdma,
            "fail": self.fail,
            "seconds": self.seconds,
            "drop": self.drop_ssh,
            "stop_sshd": self.stop_sshd,
            "broken": self.broken,
        }


def _deploy_prepare(host: Host) -> None:
    _doctor_prepare(host)
    state = host.dir / "deploy"
    (state / "units").mkdir(parents=True, exist_ok=True)
    (host.root / "etc" / "tp4-deploy").symlink_to(state)
    profiles = host.dir / "profiles"
    profiles.mkdir(exist_ok=True)
    host.bind(profiles, "/nix/var/nix/profiles")
    real_nix_store = shutil.which("nix-store") or "/usr/bin/nix-store"
    bin_dir = host.dir / "bin"
    for name, text in {"systemd-run": SYSTEMD_RUN, "systemctl": SYSTEMCTL, "nix-store": NIX_STORE}.items():
        own_store = os.path.realpath(state / "store")  # no symlink on the way (Nix refuses one)
        (bin_dir / name).write_text(
            text.replace("@state@", STATE).replace("@real@", real_nix_store).replace("@store@", own_store)
        )
        (bin_dir / name).chmod(0o755)


class DeployCluster(DoctorCluster):
    def __init__(self, workdir: Path) -> None:
        super().__init__(workdir)
        self.hosts.prepare = _deploy_prepare
        self.flake = self.workdir / "systems"
        self.nix_config = nix_config(self.workdir / "nix")

    def profile_text(self) -> str:
        return super().profile_text().replace('kind = "plain"', 'kind = "nixos"')

    def _setup(self) -> None:
        super()._setup()
        busybox_dir(self.flake / "bb")
        text = SYSTEMS_FLAKE.replace("@system@", SYSTEM).replace("@rdma_unit@", deploy.RDMA_CHECK_UNIT)
        (self.flake / "flake.nix").write_text(text.replace("@state@", STATE))

    def state(self, host: Host) -> Path:
        return host.dir / "deploy"

    def systems(self, specs: dict[str, System]) -> None:
        (self.flake / "systems.json").write_text(
            json.dumps({k: v.to_json() for k, v in specs.items()}, indent=1) + "\n"
        )

    def build(self, specs: dict[str, System]) -> dict[str, str]:
        """Build the systems here (as deploy does): node -> store path."""
        self.systems(specs)
        names = list(specs)
        proc = process.run(deploy.build_argv(str(self.flake), names), env={"NIX_CONFIG": self.nix_config})
        return deploy.toplevels(proc.stdout, names)

    def install(self, label: str) -> dict[str, int]:
        """Every host on a first system of ``label`` (as an installer leaves it): its profile set
        and switched, for real nix-env and the stand-ins; host name -> its generation."""
        paths = self.build({h.name: System(label) for h in self.hosts})
        out = {}
        for host in self.hosts:
            host.run("nix-env", "-p", deploy.SYSTEM_PROFILE, "--set", paths[host.name])
            host.run(f"{paths[host.name]}/bin/switch-to-configuration", "switch")
            out[host.name] = self.current(host)
        return out

    def generations(self, host: Host) -> list[tuple[int, str, bool]]:
        """The host's system generations: (number, store path, current), from real nix-env."""
        text = host.run("nix-env", "-p", deploy.SYSTEM_PROFILE, "--list-generations").stdout
        out = []
        for line in text.splitlines():
            if not line.strip():
                continue
            number = int(line.split()[0])
            link = host.run("readlink", deploy.generation_link(number)).stdout.strip()
            out.append((number, link, "(current)" in line))
        return out

    def current(self, host: Host) -> int:
        return next(n for n, _, cur in self.generations(host) if cur)

    def current_path(self, host: Host) -> str:
        return host.run("readlink", "-f", deploy.SYSTEM_PROFILE).stdout.strip()

    def switches(self, host: Host) -> list[tuple[float, str, str, str]]:
        """What switch-to-configuration was asked on the host: (time, start|end, system, action)."""
        log = self.state(host) / "switch.log"
        rows = []
        for line in log.read_text().splitlines() if log.exists() else []:
            when, what, path, action = line.split()
            rows.append((float(when), what, path, action))
        return rows

    def units(self, host: Host) -> list[dict[str, object]]:
        """What systemd-run started on the host (unit, options, command)."""
        log = self.state(host) / "systemd-run.log"
        return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []

    def unit_state(self, host: Host, unit: str = deploy.RDMA_CHECK_UNIT) -> str:
        f = self.state(host) / "units" / unit
        return f.read_text().strip() if f.exists() else "inactive"

    def has_path(self, host: Host, path: str) -> bool:
        """``path`` is valid in the host's own store (what deploy's copy filled)."""
        own_store = os.path.realpath(self.state(host) / "store")
        proc = process.run(
            ["nix-store", "--check-validity", path], env={"NIX_REMOTE": f"local?root={own_store}"}, check=False
        )
        return proc.returncode == 0

    def serves(self, host: Host) -> list[str]:
        """The host's `nix-store` runs of deploy's copy (the first two words of each)."""
        log = self.state(host) / "nix-store.log"
        return log.read_text().splitlines() if log.exists() else []

    def clear_records(self) -> None:
        for host in self.hosts:
            for name in ("switch.log", "systemd-run.log", "nix-store.log"):
                (self.state(host) / name).unlink(missing_ok=True)
