"""`tp4 profile import BASE --overlay ARM.env`: an experiment arm (upstream's scripts/tp4/arms/*.env)
is read after its base file, as upstream's arm.sh appends it to a copy of .env.tp4 (bash: the last
assignment wins, and the arm may use what the base set); messages name each file's own lines."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from tp4.core.errors import InvalidInput
from tp4.line.plan import build_plan
from tp4.line.profile.legacy import import_env_file, import_env_text
from tp4.line.profile.load import load_text
from upstream_oracle import bash_source, upstream_env

pytestmark = pytest.mark.unit

FIXTURE = Path(__file__).parent / "fixtures" / "env.tp4.production"
ARM = 'MAX_RUNNING_REQUESTS=8\nEXTRA_CONTAINER_ENV="$EXTRA_CONTAINER_ENV DSV41_PREFILL_SP_EXACT=1"\n'


def files(tmp_path: Path, *texts: str) -> list[str]:
    base = tmp_path / ".env.tp4"
    base.write_text(FIXTURE.read_text())
    out = [str(base)]
    for i, text in enumerate(texts):
        arm = tmp_path / f"arm{i}.env"
        arm.write_text(text)
        out.append(str(arm))
    return out


def test_an_arm_overlays_its_base_as_arm_sh_appends_it(tmp_path):
    base, arm = files(tmp_path, ARM)
    result = import_env_file(base, overlays=[arm], head_checkout=str(tmp_path))
    plan = build_plan(load_text(result.toml, "arm.toml"))
    # what bash gives for the base with the arm appended, as arm.sh runs it
    joined = tmp_path / "joined.env"
    joined.write_text(FIXTURE.read_text() + ARM)
    expected = bash_source(str(joined))
    for node in plan.nodes:
        assert node.env == upstream_env(expected, node.rank)
    assert plan.nodes[0].env["MAX_RUNNING_REQUESTS"] == "8" and plan.nodes[0].env["DSV41_PREFILL_SP_EXACT"] == "1"
    assert result.toml.startswith("# Imported by `tp4 profile import` from .env.tp4 + arm0.env (overlays")
    # the same as importing the appended file
    assert tomllib.loads(result.toml) == tomllib.loads(import_env_text(joined.read_text(), str(base)).toml)


def test_overlays_apply_in_order(tmp_path):
    base, *arms = files(tmp_path, "MAX_RUNNING_REQUESTS=8\n", "MAX_RUNNING_REQUESTS=12")  # no final newline
    result = import_env_file(base, overlays=arms, head_checkout=str(tmp_path))
    assert result.document["engine"]["max_running_requests"] == 12


def test_a_problem_names_the_overlays_own_line(tmp_path):
    base, arm = files(tmp_path, "# arm\nEP_SIZE=3\nBOGUS_ARM=1\n")
    with pytest.raises(InvalidInput) as exc:
        import_env_file(base, overlays=[arm], head_checkout=str(tmp_path))
    msg = str(exc.value)
    assert f"{arm} line 2: EP_SIZE=3" in msg and f"BOGUS_ARM ({arm} line 3)" in msg, msg


def test_an_overlay_of_another_line_is_refused_as_such(tmp_path):
    base, arm = files(tmp_path, "HOSTS=()\n")
    with pytest.raises(InvalidInput) as exc:
        import_env_file(base, overlays=[arm], head_checkout=str(tmp_path))
    assert str(exc.value).startswith(f"{arm} line 1: this is not a DeepSeek-V4.1 line")


def test_an_arm_alone_says_to_import_it_as_an_overlay(tmp_path):
    with pytest.raises(InvalidInput) as exc:
        import_env_text(ARM, "arm.env")
    assert "--overlay ARM.env" in str(exc.value)


def test_the_cli_takes_repeated_overlays(tp4_cli, tmp_path):
    base, *arms = files(tmp_path, "MAX_RUNNING_REQUESTS=8\n", "MAX_RUNNING_REQUESTS=12\n")
    out = tmp_path / "arm.toml"
    code, stdout, err = tp4_cli("profile", "import", base, "--overlay", arms[0], "--overlay", arms[1], "-o", str(out))
    assert code == 0, err
    assert tomllib.loads(out.read_text())["engine"]["max_running_requests"] == 12
