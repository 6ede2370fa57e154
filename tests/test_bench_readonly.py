"""`tp4 bench --out` on a read-only mount: needs root (a mount namespace of its own, unshare and
mount), so it is not a unit test (the rest of `tp4 bench` is, in tests/test_bench.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from test_bench import free_port, tp4_argv, tp4_env


def test_a_read_only_out_dir_exits_2(tmp_path: Path) -> None:
    """The out directory on a read-only mount (a mount namespace of its own; root writes
    through any mode bits, not through a read-only mount)."""
    ro = tmp_path / "ro"
    ro.mkdir()
    script = 'mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" && shift && exec "$@"'
    for out in (ro, ro / "new"):
        proc = subprocess.run(
            [
                "unshare",
                "-m",
                "sh",
                "-c",
                script,
                "sh",
                str(ro),
                *tp4_argv("bench", "decode", "--url", f"http://127.0.0.1:{free_port()}", "--out", out),
            ],
            env=tp4_env(),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 2, proc.stderr
        assert (
            "--out:" in proc.stderr
            and "fix: choose a directory you can write to" in proc.stderr
            and "Traceback" not in proc.stderr
        )
