"""A private docker daemon for tests: Debian's dockerd with its own data root, exec root and
socket under /tmp, no iptables and no bridge (containers run with --network none), stopped at
the end. ``DOCKER_HOST`` points the docker CLI (and tp4, which hands it to skopeo) at it.

    with Dockerd() as daemon:
        daemon.env  # {"DOCKER_HOST": "unix:///tmp/tp4d-.../docker.sock"}

Needs root and the docker.io package (python/setup.sh --test installs it).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

DOCKERD = shutil.which("dockerd") or "/usr/sbin/dockerd"
# the docker.io package's client: another docker on PATH may be a different version
DOCKER = "/usr/bin/docker" if os.access("/usr/bin/docker", os.X_OK) else (shutil.which("docker") or "docker")


class Dockerd:
    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="tp4d-", dir="/tmp"))
        self.socket = self.root / "docker.sock"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def host(self) -> str:
        return f"unix://{self.socket}"

    @property
    def env(self) -> dict[str, str]:
        return {"DOCKER_HOST": self.host}

    def __enter__(self) -> Dockerd:
        log = open(self.root / "dockerd.log", "wb")
        self.proc = subprocess.Popen(
            [
                DOCKERD,
                "--iptables=false",
                "--ip6tables=false",
                "--bridge=none",
                "--data-root",
                str(self.root / "data"),
                "--exec-root",
                str(self.root / "exec"),
                "--pidfile",
                str(self.root / "docker.pid"),
                "-H",
                self.host,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"dockerd exited: {(self.root / 'dockerd.log').read_text()[-2000:]}")
            ready = subprocess.run([DOCKER, "-H", self.host, "version"], capture_output=True)
            if ready.returncode == 0:
                return self
            time.sleep(0.3)
        raise RuntimeError(f"dockerd did not answer: {(self.root / 'dockerd.log').read_text()[-2000:]}")

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        subprocess.run(["umount", "-R", str(self.root / "data")], capture_output=True)
        shutil.rmtree(self.root, ignore_errors=True)
