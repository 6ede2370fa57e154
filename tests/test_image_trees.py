"""The trees are symlinks into /nix/store: the registry's `import-adapters` and `tree-paths` checks
catch, at `tp4 build`, an adapter that does not import the way the engine imports it (python3 -I
from WORKDIR, the image's PYTHONPATH given explicitly) and a module that builds a path from
__file__ leading out of its tree (through the link, into /nix/store).

Real podman: an image made by pkgs/oci.nix on a base with Debian's python3, the runtime tree at
/opt/dsv41 linked into the store as in the line's image, and the registry's own two checks.
"""

from __future__ import annotations

import os

import pytest

from nix_env import image_flake
from test_build import check, env, line_id  # noqa: F401  (env is a fixture)
from test_image_site_packages import base_archive
from tp4.line.registry import load_registry

ADAPTERS = {
    "boot.py": "STARTED = False\n",
    # found only through the working directory, as the engine (`python -m`, in WORKDIR) finds it
    "adapter/needs_cwd.py": "import boot\n",
    "adapter/sitecustomize.py": "import os\nif os.environ.get('DSV41_SOURCE'):\n    raise SystemExit('hooked')\n",
    # paths from __file__ that stay inside the tree
    "adapter/here.py": (
        "import os\nfrom pathlib import Path\nHERE = os.path.dirname(__file__)\n"
        "ROOT = Path(__file__).resolve().parents[1]\nBOOT = os.path.join(HERE, '..', 'boot.py')\n"
    ),
}
BROKEN = {
    # upstream's layout would put /opt/b12x beside /opt/dsv41; through the link it is /nix/store/b12x
    "adapter/walks_out.py": "from pathlib import Path\nB12X = Path(__file__).resolve().parents[2] / 'b12x'\n",
    "adapter/needs_missing.py": "import not_in_the_image\n",
    "adapter/joins_out.py": "import os\nX = os.path.join(os.path.dirname(__file__), '../../sglang')\n",
}


def checks() -> str:
    by_name = {c.name: c for c in load_registry().image_checks}
    return "".join(check(n, argv=list(by_name[n].argv)) for n in ("import-adapters", "tree-paths"))


@pytest.mark.parametrize("broken", [False, True])
def test_the_adapter_and_tree_checks_run_in_the_linked_image(env, tp4_cli, broken):  # noqa: F811
    flake = image_flake(
        env / "flake",
        ref="tp4-test:line",
        label=f"trees-{broken}-{os.urandom(4).hex()}",
        checks=checks(),
        base_archive=base_archive(env),
        files={**ADAPTERS, **(BROKEN if broken else {})},
        env=("PATH=/usr/bin:/bin", "PYTHONPATH=/opt/dsv41/adapter"),
    )

    code, stdout, stderr = tp4_cli("build", "--flake", flake, "--runtime", "podman")

    lines = stdout.splitlines()
    if not broken:
        assert code == 0, stdout + stderr
        assert any(
            line.startswith("ok   import-adapters")
            and line.endswith("  3 adapter modules import from /opt/dsv41/adapter")
            for line in lines
        ), stdout
        assert any(
            line.startswith("ok   tree-paths") and "no path from __file__ leaves its tree" in line for line in lines
        ), stdout
        assert line_id() is not None
    else:
        assert code == 1
        assert "     | FAIL needs_missing: ModuleNotFoundError: No module named 'not_in_the_image'" in lines, stdout
        assert not [line for line in lines if "FAIL needs_cwd" in line or "FAIL here" in line]
        walks = [line for line in lines if "FAIL /opt/dsv41/adapter/walks_out.py:2: goes 2 directories up" in line]
        assert walks and "past /opt/dsv41" in walks[0] and "copy that tree into its layer" in walks[0], stdout
        assert [line for line in lines if "FAIL /opt/dsv41/adapter/joins_out.py:2: goes 2 directories up" in line]
        assert not [line for line in lines if "here.py" in line]
        assert "error: 2 of 2 in-image checks failed (import-adapters, tree-paths)" in stderr
        assert line_id() is None
