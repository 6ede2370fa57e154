"""A profile that does not set the ssh user, home or key logs in as the operator, as ssh would:
the local user's name, /home/<name>, and ssh's own keys (no -i); nothing of upstream's author's
login is inherited from a preset. An imported upstream .env keeps upstream's launcher defaults,
which are facts of that file."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from tp4.core.errors import InvalidInput
from tp4.core.process import Remote
from tp4.line.plan import build_plan
from tp4.line.profile.legacy import import_env_text
from tp4.line.profile.load import PRESETS, load_text

pytestmark = pytest.mark.unit

FIXTURE = Path(__file__).parent / "fixtures" / "env.tp4.production"
SMALLEST = """\
preset = "production"

[cluster.head]
name = "spark1"
ip = "10.0.0.1"

[[cluster.workers]]
name = "spark2"
ip = "10.0.0.2"

[[cluster.workers]]
name = "spark3"
ip = "10.0.0.3"

[[cluster.workers]]
name = "spark4"
ip = "10.0.0.4"
"""


@pytest.fixture
def operator(monkeypatch):
    # getpass.getuser, as ssh, reads $LOGNAME first
    for var in ("LOGNAME", "USER", "LNAME", "USERNAME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("LOGNAME", "alice")
    return "alice"


def test_the_smallest_profile_logs_in_as_the_operator(operator):
    plan = build_plan(load_text(SMALLEST, "smallest.toml"))
    for node in plan.nodes:
        assert node.ssh.user == operator and node.ssh.identity is None
        assert all(not m.source.startswith("/home/zurih") for m in node.run.mounts)
    assert any(m.source.startswith(f"/home/{operator}/") for m in plan.nodes[0].run.mounts)
    ssh = plan.nodes[1].ssh
    argv = Remote(host=ssh.host, user=ssh.user, identity=ssh.identity).ssh_argv()
    assert "-i" not in argv and "zurih" not in " ".join(argv)


def test_no_preset_carries_upstreams_login():
    for preset in PRESETS.glob("*.toml"):
        text = preset.read_text()
        assert "zurih" not in text and "id_ed25519_shared" not in text, preset.name
        assert "user" not in tomllib.loads(text).get("cluster", {}), preset.name


def test_a_profile_sets_its_own_login(operator):
    text = SMALLEST.replace(
        'preset = "production"\n', 'preset = "production"\n[cluster]\nuser = "bob"\nidentity = "~/.ssh/k"\n'
    )
    plan = build_plan(load_text(text, "p.toml"))
    assert {(n.ssh.user, n.ssh.identity) for n in plan.nodes} == {("bob", "~/.ssh/k")}
    assert any(m.source.startswith("/home/bob/") for m in plan.nodes[0].run.mounts)


def test_a_local_name_ssh_would_not_take_is_refused_naming_the_field(monkeypatch):
    for var in ("LOGNAME", "USER", "LNAME", "USERNAME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("LOGNAME", "Not A User")
    with pytest.raises(InvalidInput) as exc:
        build_plan(load_text(SMALLEST, "smallest.toml"))
    assert str(exc.value).startswith("cluster.user: not set, and the local user's name ('Not A User')")
    assert "fix: set cluster.user" in str(exc.value)


def test_an_imported_file_keeps_upstreams_launcher_login(operator):
    text = (
        FIXTURE.read_text()
        .replace("WORKER_USER=zurih\n", "")
        .replace("SSH_IDENTITY=$HOME/.ssh/id_ed25519_shared\n", "")
        .replace("/home/$WORKER_USER/", "$HOME/")
    )
    result = import_env_text(text, "p.env")
    doc = tomllib.loads(result.toml)
    assert doc["cluster"]["user"] == "zurih" and doc["cluster"]["identity"] == "~/.ssh/id_ed25519_shared"
    assert any("WORKER_USER not set: upstream's launcher default zurih" in n for n in result.notes)
    plan = build_plan(load_text(result.toml, "imported.toml"))
    assert {n.ssh.user for n in plan.nodes} == {"zurih"}


def test_doctor_names_the_key_ssh_offers_when_the_profile_sets_none(operator):
    from tp4.hosts import doctor

    plan = build_plan(load_text(SMALLEST, "smallest.toml"))
    facts = {r.name: doctor.Facts(sections={"date": ["1000.0"]}, received=1000.0) for r in plan.nodes}
    facts[plan.nodes[2].name] = doctor.Facts(error="ssh: connect to host 10.0.0.3: Connection refused")
    r = next(r for r in doctor.evaluate(plan, facts) if r.check == "SSH.REACHABLE" and r.node == plan.nodes[2].name)
    assert r.fix is not None and f"{operator}@10.0.0.3:22" in r.fix
    assert "a key ssh offers by default" in r.fix and "None" not in r.fix
