"""`tp4 profile import` refuses the files of upstream lines tp4 does not render (the TP3
.env.example, the TP8 .env.tp8, a GLM line's file), saying what the file is and what tp4 renders,
before anything in them is read as a TP4 setting."""

from __future__ import annotations

from pathlib import Path

import pytest

from tp4.core.errors import InvalidInput
from tp4.line.profile.legacy import import_env_text

pytestmark = pytest.mark.unit

FIXTURE = Path(__file__).parent / "fixtures" / "env.tp4.production"
RENDERS = "tp4 renders upstream's DeepSeek-V4.1-Flash TP4 line: 4 Sparks, TP_SIZE=4"

# upstream's .env.example (the 3-Spark TP3 profile, spec section 2.2) in its own form
TP3 = """\
HEAD_IP=10.0.0.1
WORKER1_IP=10.0.0.2
WORKER1_HOST=spark2
WORKER2_IP=10.0.0.3
WORKER2_HOST=spark3
IMAGE=dsv41-3x-spark:local
NNODES=3
TP_SIZE=3
EP_SIZE=3
DSV41_CACHE_GIB=0
MEM_FRACTION_STATIC=0.95
"""


def refusal(text: str) -> str:
    with pytest.raises(InvalidInput) as exc:
        import_env_text(text, "p.env")
    return str(exc.value)


def test_the_tp3_example_is_refused_as_the_tp3_profile():
    msg = refusal(TP3)
    assert msg.startswith("p.env line 8: TP_SIZE=3: this is upstream's 3-Spark TP3 profile (.env.example"), msg
    assert RENDERS in msg and "fix: import the .env.tp4" in msg


def test_the_tp8_line_is_refused_as_the_tp8_line():
    # the TP8 file is the TP4 one with eight nodes: it would otherwise plan as a TP4 line's state-tp4
    text = (
        FIXTURE.read_text()
        + "NNODES=8\nTP_SIZE=8\nEP_SIZE=2\n"
        + 'WORKER_IPS="10.0.0.2 10.0.0.3 10.0.0.4 10.0.0.5 10.0.0.6 10.0.0.7 10.0.0.8"\n'
        + 'WORKER_HOSTS="s2 s3 s4 s5 s6 s7 s8"\n'
    )
    msg = refusal(text)
    assert "TP_SIZE=8: this is upstream's 8-Spark TP8 line (.env.tp8, run by start-tp8.sh" in msg, msg
    assert RENDERS in msg


def test_another_tp_size_is_refused_as_a_line_tp4_does_not_render():
    assert "TP_SIZE=2: this is a TP2 line, which tp4 does not render" in refusal(FIXTURE.read_text() + "TP_SIZE=2\n")


@pytest.mark.parametrize(
    "text,what",
    [
        ("HOSTS=()\nHEAD_IP=10.0.0.1\n", "HOSTS=(...) is a bash array"),
        ("  export HOSTS=(spark1 spark2)\n", "HOSTS=(...) is a bash array"),
        ("# a comment\nMODEL=zai-org/GLM-5.3-FP8\n", "it names 'GLM'"),
        ("IMAGE=vllm-glm53:latest\n", "it names 'vllm'"),
        ("export VLLM_HOST_IP=10.0.0.1\n", "it names 'VLLM'"),
    ],
)
def test_a_glm_line_is_refused_as_not_a_deepseek_line(text, what):
    msg = refusal(text)
    assert "this is not a DeepSeek-V4.1 line: " + what in msg, msg
    assert RENDERS in msg and "unexpected '('" not in msg


def test_the_tp4_production_file_still_imports():
    assert import_env_text(FIXTURE.read_text(), "p.env").toml
    # reusing a GLM line's running NFS exporter is a DeepSeek line's setting, not another line
    assert import_env_text(FIXTURE.read_text() + "NFS_CONTAINER=glm53-nfs\n", "p.env").toml


def test_the_cli_refuses_with_exit_2_and_writes_nothing(tp4_cli, tmp_path):
    env = tmp_path / ".env.example"
    env.write_text(TP3)
    out = tmp_path / "p.toml"
    code, _, err = tp4_cli("profile", "import", str(env), "-o", str(out))
    assert code == 2 and "TP3 profile" in err and not out.exists()
    assert "Traceback" not in err
