"""Every .nix file is as the real nixfmt (1.x, what nixpkgs' nixfmt-tree runs in checks.formatting)
leaves it: held to the list tests/nixfmt_stamp.py writes after a passing `nixfmt --check`, and
checked by nixfmt itself where it is installed (CI has none: no registry here carries it)."""

from __future__ import annotations

import subprocess

from nixfmt_stamp import STAMP, digest, find_nixfmt, nix_files, read_stamp


def test_every_nix_file_is_as_nixfmt_left_it(repo):
    version, sums = read_stamp()
    assert version.startswith("nixfmt 1."), version
    files = {f.as_posix() for f in nix_files(repo)}
    assert files, "no .nix file found"
    unstamped = sorted(files - sums.keys())
    changed = sorted(f for f in files & sums.keys() if digest(repo / f) != sums[f])
    gone = sorted(sums.keys() - files)
    fix = "fix: build nixfmt (shared/tools/nixfmt.md), run it on these files, then `python tests/nixfmt_stamp.py`"
    assert not unstamped, f"never checked by nixfmt: {unstamped}; {fix}"
    assert not changed, f"changed since nixfmt checked them: {changed}; {fix}"
    assert not gone, f"{STAMP.name} names files that no longer exist: {gone}; {fix}"


def test_nixfmt_agrees_where_installed(repo):
    nixfmt = find_nixfmt()
    if nixfmt is None:
        # CI: the stamp above is the check; nothing more can be asserted without the binary
        return
    files = [str(f) for f in nix_files(repo)]
    proc = subprocess.run([nixfmt, "--check", *files], cwd=repo, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
