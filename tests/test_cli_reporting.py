"""How the CLI reports: a node's failure is said once, help texts tell the exit codes the commands
really return and name the schema versions the code writes (tp4.core.schemas), long work shows
progress. Fast tests: the nodes are stand-ins patched in, no ssh is started."""

from __future__ import annotations

import pytest

from tp4.core import process
from tp4.image import images as images_mod
from tp4.image import runtime_cli

REASON = "cannot reach 192.0.2.7: ssh: connect to host 192.0.2.7 port 22: Connection timed out"


@pytest.fixture
def one_node_down(monkeypatch):
    """The head answers, the worker 192.0.2.7 cannot be asked."""
    monkeypatch.setattr(runtime_cli, "detect", lambda preferred=None, **_: "podman")
    monkeypatch.setattr(
        images_mod,
        "inventory",
        lambda runtime, workers: [
            images_mod.NodeImages("head", None),
            images_mod.NodeImages("192.0.2.7", process.Remote(host="192.0.2.7"), error=REASON),
        ],
    )
    monkeypatch.setattr(images_mod, "running_store", lambda: (None, "not running"))
    monkeypatch.setattr(
        images_mod,
        "prune",
        lambda runtime, workers, keep, dry_run=False: [
            images_mod.Pruned("head"),
            images_mod.Pruned("192.0.2.7", error=REASON),
        ],
    )


@pytest.mark.parametrize("command", [["images"], ["images", "prune"]])
def test_a_node_that_cannot_be_asked_is_told_once_with_its_reason(command, one_node_down, tp4_cli):
    code, out, err = tp4_cli(*command, "--worker", "192.0.2.7")
    assert code == 1, err
    assert (out + err).count(REASON) == 1, out + err
    assert "192.0.2.7" in out and REASON in err and "Traceback" not in err


def _help(tp4_cli, *command: str) -> str:
    code, out, err = tp4_cli(*command, "--help")
    assert code == 0, err
    return " ".join(out.split())


@pytest.mark.parametrize("command", [["images"], ["images", "prune"]])
def test_images_help_states_the_exit_codes_it_returns(command, one_node_down, tp4_cli, tmp_path, monkeypatch):
    said = _help(tp4_cli, *command)
    assert "Exit 1 when a node" in said and "2 when ssh refused a node's host key" in said, said
    code, _, _ = tp4_cli(*command, "--worker", "192.0.2.7")
    assert code == 1
    # a node whose host key tp4 does not hold: refused before any connection, exit 2 (the real
    # listing; prune only as a dry run, this machine's own images are never touched)
    monkeypatch.undo()
    monkeypatch.setenv("TP4_KNOWN_HOSTS", str(tmp_path / "known_hosts"))
    process.host_key_failures.clear()
    dry = ["--dry-run"] if "prune" in command else []
    code, out, err = tp4_cli(*command, *dry, "--runtime", "podman", "--worker", "192.0.2.7")
    assert code == 2, out + err
    assert "not a host tp4 trusts yet" in err


def _commands():
    """Every command of the CLI with its path, groups included."""
    import click

    from tp4.cli import cli

    todo: list[tuple[tuple[str, ...], click.Command]] = [((), cli)]
    while todo:
        path, cmd = todo.pop()
        yield path, cmd
        if isinstance(cmd, click.Group):
            ctx = click.Context(cmd)
            todo += [((*path, name), cmd.get_command(ctx, name)) for name in cmd.list_commands(ctx)]


def test_every_schema_version_a_help_text_names_is_the_one_the_code_writes(tp4_cli):
    """A help text names a document's version only through tp4.core.schemas, the module the
    contracts (the models that write the documents) and the plan take their versions from."""
    import re

    from tp4.core import schemas

    known = {v for k, v in vars(schemas).items() if k.isupper() and isinstance(v, str)}
    named = {}
    for path, _ in _commands():
        text = _help(tp4_cli, *path)
        for version in re.findall(r"tp4\.[a-z-]+/[0-9][0-9.]*[0-9]|tp4\.[a-z-]+/[0-9]", text):
            named[version] = path
    assert named, "no help text names a schema: the walk found no command"
    assert {v: p for v, p in named.items() if v not in known} == {}


def test_setup_says_each_step_as_it_starts(tmp_path):
    """python/setup.sh takes a minute or more: a numbered line per step on stderr, in order. Run on
    a copy of the script whose virtualenv's pip only records what it was asked."""
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parent.parent
    (tmp_path / "python").mkdir()
    shutil.copy(repo / "python" / "setup.sh", tmp_path / "python" / "setup.sh")
    shutil.copy(repo / "python" / "poetry.lock", tmp_path / "python" / "poetry.lock")
    bin_ = tmp_path / ".venv" / "bin"
    bin_.mkdir(parents=True)
    (bin_ / "python").symlink_to(sys.executable)
    (bin_ / "pip").write_text('#!/bin/sh\necho "pip $*" >> "$(dirname "$0")/pip.log"\n')
    (bin_ / "pip").chmod(0o755)
    proc = subprocess.run(
        ["bash", str(tmp_path / "python" / "setup.sh")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    steps = [line for line in proc.stderr.splitlines() if line.startswith("setup: [")]
    assert [s.split("]")[0] for s in steps] == ["setup: [1/4", "setup: [2/4", "setup: [3/4", "setup: [4/4"], proc.stderr
    assert "checking the system tools" in steps[0] and "using the virtualenv" in steps[1]
    assert "Python packages python/poetry.lock pins" in steps[2] and "installing tp4 itself" in steps[3]
    assert "--require-hashes" in (bin_ / "pip.log").read_text()


def _validate(doc: object, name: str) -> None:
    """doc against the committed docs/schemas/NAME.schema.json."""
    import json
    from pathlib import Path

    import jsonschema

    schema = json.loads(
        (Path(__file__).resolve().parent.parent / "docs" / "schemas" / f"{name}.schema.json").read_text()
    )
    jsonschema.Draft202012Validator(schema).validate(doc)


def test_hosts_list_json_holds_every_key_and_fits_its_schema(tmp_path, monkeypatch, tp4_cli):
    import json
    import subprocess

    from tp4.core import schemas

    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "k")], check=True)
    pub = (tmp_path / "k.pub").read_text().split()
    known = tmp_path / "known_hosts"
    known.write_text(f"spark1 {pub[0]} {pub[1]}\n@revoked [spark2]:2222 {pub[0]} {pub[1]}\n")
    monkeypatch.setenv("TP4_KNOWN_HOSTS", str(known))
    code, out, err = tp4_cli("hosts", "list", "--json")
    assert code == 0, err
    doc = json.loads(out)
    _validate(doc, "host-keys")
    fingerprint = subprocess.run(["ssh-keygen", "-lf", str(tmp_path / "k.pub")], capture_output=True, text=True)
    assert doc["schema"] == schemas.HOST_KEYS and doc["file"] == str(known)
    assert [(k["names"], k["kind"], k["marker"], k["line"]) for k in doc["keys"]] == [
        ("spark1", "ED25519", "", 1),
        ("[spark2]:2222", "ED25519", "@revoked", 2),
    ]
    assert all(k["fingerprint"] == fingerprint.stdout.split()[1] for k in doc["keys"])
    # none recorded: an empty list, still the document
    monkeypatch.setenv("TP4_KNOWN_HOSTS", str(tmp_path / "none"))
    code, out, err = tp4_cli("hosts", "list", "--json")
    assert code == 0 and json.loads(out)["keys"] == [], err


def test_doctor_json_prints_the_evidence_on_stdout_and_output_writes_it(tmp_path, monkeypatch, tp4_cli):
    """`--json` alone: the evidence on stdout (the table on stderr), valid against its schema;
    `-o FILE` writes it (as `tp4 plan --json -o FILE`). The nodes are not trusted: refused before any connection,
    each a blocking failure (exit 1, as the help says)."""
    import json
    from pathlib import Path

    profile = Path(__file__).resolve().parent.parent / "examples" / "spark-line" / "profile.toml"
    monkeypatch.setenv("TP4_KNOWN_HOSTS", str(tmp_path / "known_hosts"))
    process.host_key_failures.clear()
    assert "exits 1 on a blocking failure (a node ssh cannot reach or whose host key" in _help(tp4_cli, "doctor")
    code, out, err = tp4_cli("doctor", "--json", "--profile", str(profile))
    assert code == 1, err
    doc = json.loads(out)
    _validate(doc, "doctor-evidence")
    assert set(doc["nodes"]) == {"spark1", "spark2", "spark3", "spark4"}
    assert "FAIL spark2 SSH.REACHABLE" in err and "doctor: 4 nodes in" in err
    code, out, err = tp4_cli("doctor", "--profile", str(profile), "-o", str(tmp_path / "evidence.json"))
    assert code == 1, err
    _validate(json.loads((tmp_path / "evidence.json").read_text()), "doctor-evidence")
    assert "FAIL spark2 SSH.REACHABLE" in out


@pytest.mark.parametrize(
    "command, wanted",
    [
        (
            ["stop", "--grace", "7"],
            ["sudo -n systemctl stop podman-dsv41-head.service", "/run/tp4/dsv41-head.stopped.json"],
        ),
        (["serve"], ["systemctl start podman-dsv41-head.service", "< env file on stdin (mode 0600)"]),
    ],
)
def test_serve_and_stop_dry_run_print_each_hosts_command_and_run_nothing(command, wanted, monkeypatch, tp4_cli):
    """--dry-run: the commands host by host (ssh … -- user@host '<cmd>'), exit 0, no process
    started (the funnel refuses any), on a line whose nodes this machine cannot reach."""
    import shlex
    from pathlib import Path

    def refuse(*args, **kwargs):
        raise AssertionError(f"a dry run started a process: {args}")

    monkeypatch.setattr(process, "_spawn", refuse)
    monkeypatch.setattr(process, "start", refuse)
    profile = Path(__file__).resolve().parent.parent / "examples" / "spark-line" / "profile.toml"
    code, out, err = tp4_cli(*command, "--dry-run", "--profile", str(profile))
    assert code == 0, err
    lines = out.splitlines()
    assert [line.split(":")[0] for line in lines] == (
        # stop: the stop record on the head first
        ["spark1", "spark1", "spark2", "spark3", "spark4"]
        if command[0] == "stop"
        else ["spark2", "spark3", "spark4", "spark1"]
    ), out
    for line in lines:  # spark<N> is 10.0.0.<N> in the example profile
        name, command_line = line.split(": ", 1)
        words = shlex.split(command_line.split("  < ")[0])
        assert words[0] == "ssh" and words[words.index("--") + 1] == f"tp4@10.0.0.{name[-1]}", line
    assert all(w in out for w in wanted), out
    assert "dry run: nothing was run, no host was asked" in err


def test_profile_check_json_describes_a_valid_profile_and_lists_an_invalid_ones_problems(tmp_path, tp4_cli):
    import json
    from pathlib import Path

    profile = Path(__file__).resolve().parent.parent / "examples" / "spark-line" / "profile.toml"
    code, out, err = tp4_cli("profile", "check", "--json", str(profile))
    assert code == 0, err
    doc = json.loads(out)
    _validate(doc, "profile-check")
    assert doc["ok"] is True and doc["nodes"] == ["spark1", "spark2", "spark3", "spark4"] and doc["tp"] == 4
    assert doc["problems"] == [] and doc["preset"] == "production"

    bad = tmp_path / "bad.toml"
    bad.write_text('preset = "nope"\n')
    code, out, err = tp4_cli("profile", "check", "--json", str(bad))
    assert code == 2
    doc = json.loads(out)
    _validate(doc, "profile-check")
    assert doc["ok"] is False and doc["preset"] is None and len(doc["problems"]) == 1
    assert doc["problems"][0].startswith("preset: unknown preset 'nope'; fix:") and "error:" in err


@pytest.mark.parametrize("command", ["serve", "stop"])
def test_fleet_serve_and_stop_dry_run_print_every_lines_and_the_routers_commands(command, monkeypatch, tp4_cli):
    from pathlib import Path

    def refuse(*args, **kwargs):
        raise AssertionError(f"a dry run started a process: {args}")

    monkeypatch.setattr(process, "_spawn", refuse)
    monkeypatch.setattr(process, "start", refuse)
    fleet = Path(__file__).resolve().parent.parent / "examples" / "fleet" / "fleet.toml"
    code, out, err = tp4_cli("fleet", command, "--dry-run", "--fleet", str(fleet))
    assert code == 0, err
    heads = [line.split(": ssh ")[0] for line in out.splitlines() if ": ssh " in line]
    nodes = {f"line a: spark{i}" for i in range(1, 5)} | {f"line b: spark{i}" for i in range(5, 9)}
    assert set(heads) == nodes | {"router 10.0.0.1"}, out
    # the router starts after the lines and stops before them
    assert (heads[-1] if command == "serve" else heads[0]) == "router 10.0.0.1"
    assert "@10.0.0.5 " in out and "dry run: nothing was run, no host was asked" in err


def test_smoke_json_holds_every_check_and_fits_its_schema(monkeypatch, tp4_cli):
    import json
    from pathlib import Path

    from tp4.serving import api

    results = [api.SmokeResult("arithmetic", True, "42", 0.5), api.SmokeResult("stream", False, "no [DONE]", 1.25)]
    monkeypatch.setattr(api, "smoke", lambda ep, full: results)
    profile = Path(__file__).resolve().parent.parent / "examples" / "spark-line" / "profile.toml"
    code, out, err = tp4_cli("smoke", "--json", "--profile", str(profile))
    assert code == 1 and "smoke failed: stream" in err
    doc = json.loads(out)
    _validate(doc, "smoke")
    assert doc["ok"] is False and doc["api"].startswith("http://10.0.0.1:")
    assert [(c["name"], c["ok"], c["detail"]) for c in doc["checks"]] == [
        ("arithmetic", True, "42"),
        ("stream", False, "no [DONE]"),
    ]


def test_sources_verify_and_diff_json_fit_their_schemas(tmp_path, tp4_cli):
    import json

    from tp4.image.sources import manifest as mf

    code, out, err = tp4_cli("sources", "verify", "--json")
    assert code == 0, err
    doc = json.loads(out)
    _validate(doc, "sources-verify")
    shipped = mf.parse(mf.chosen_path(None).read_text(), mf.chosen_path(None))
    assert doc["ok"] is True and doc["rows"] == len(shipped.rows) and doc["trees"] == len(shipped.trees)
    assert doc["unlocked"] == len(doc["warnings"]) == sum(not r.locked for r in shipped.rows)

    # a row removed and another re-pinned: both in the diff, as the text diff has them
    text = mf.chosen_path(None).read_text()
    row = next(r for r in shipped.rows if r.locked and r.sha256)
    other = next(r for r in shipped.rows if r.name != row.name and r.locked and r.sha256)
    old = tmp_path / "old.manifest"
    old.write_text(text)
    new = tmp_path / "new.manifest"
    new.write_text(text.replace(row.sha256, "0" * 64))
    code, out, err = tp4_cli("sources", "diff", "--json", str(old), str(new))
    assert code == 0, err
    doc = json.loads(out)
    _validate(doc, "sources-diff")
    assert [(c["change"], c["kind"], c["name"]) for c in doc["changes"]] == [("changed", "row", row.name)], doc
    assert doc["changes"][0]["details"] == [f"sha256: {row.sha256} -> {'0' * 64}"]
    assert other.name not in out

    # a manifest with a problem: the document says it, then exit 2 as without --json
    broken = tmp_path / "broken.manifest"
    broken.write_text(text.replace(row.sha256, "xyz"))
    code, out, err = tp4_cli("sources", "verify", "--json", "--manifest", str(broken))
    assert code == 2, err
    doc = json.loads(out)
    _validate(doc, "sources-verify")
    assert doc["ok"] is False and doc["problems"] and "error:" in err


def test_image_store_status_json_says_it_does_not_run_and_exits_1(tmp_path, tp4_cli):
    import json

    root = tmp_path / "registry"
    code, out, err = tp4_cli("image-store", "status", "--json", "--root", str(root))
    assert code == 1 and "is not running" in err
    doc = json.loads(out)
    _validate(doc, "image-store")
    assert doc["running"] is False and doc["url"] is None and doc["root"] == str(root) and doc["manifests"] == []


def test_distribute_check_json_names_every_worker_and_fits_its_schema(monkeypatch, tp4_cli):
    import json

    from tp4.image import distribute as distribute_mod

    image_id = "sha256:" + "a" * 64
    monkeypatch.setattr(runtime_cli, "detect", lambda preferred=None, **_: "podman")
    monkeypatch.setattr(runtime_cli, "inspect", lambda runtime, ref, **_: (image_id, {}))
    monkeypatch.setattr(
        distribute_mod,
        "check",
        lambda ref, i, nodes, runtime: [
            distribute_mod.Outcome(nodes[0].host, "present", i),
            distribute_mod.Outcome(nodes[1].host, "missing", f"no image {ref}"),
        ],
    )
    argv = ["distribute", "--check", "--json", "--image", "line:1", "--worker", "192.0.2.7", "--worker", "192.0.2.8"]
    code, out, err = tp4_cli(*argv)
    assert code == 1 and "192.0.2.8: missing" in err
    doc = json.loads(out)
    _validate(doc, "distribute-check")
    assert doc["ok"] is False and doc["id"] == image_id and doc["image"] == "line:1"
    assert [(w["node"], w["status"]) for w in doc["workers"]] == [("192.0.2.7", "present"), ("192.0.2.8", "missing")]
    code, out, err = tp4_cli("distribute", "--json", "--image", "line:1", "--worker", "192.0.2.7")
    assert code == 2 and "--check --json" in err and out == ""


def test_pack_dry_run_prints_each_nodes_packer_and_runs_nothing(monkeypatch, tp4_cli):
    from pathlib import Path

    def refuse(*args, **kwargs):
        raise AssertionError(f"a dry run started a process: {args}")

    monkeypatch.setattr(process, "_spawn", refuse)
    monkeypatch.setattr(process, "start", refuse)
    profile = Path(__file__).resolve().parent.parent / "examples" / "spark-line" / "profile.toml"
    code, out, err = tp4_cli("pack", "--dry-run", "--profile", str(profile))
    assert code == 0, err
    heads = [line.split(": ssh ")[0] for line in out.splitlines() if ": ssh " in line]
    assert heads == ["spark1", "spark2", "spark3", "spark4"], out
    assert all(f"tp4@10.0.0.{i} " in out for i in range(1, 5)) and "dry run: nothing was run" in err


def _no_process(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError(f"a dry run started a process: {args}")

    monkeypatch.setattr(process, "_spawn", refuse)
    monkeypatch.setattr(process, "start", refuse)


def _plain_line(tmp_path):
    """The example line on hosts that are not NixOS (share writes the export and the volumes)."""
    from pathlib import Path

    example = Path(__file__).resolve().parent.parent / "examples" / "spark-line" / "profile.toml"
    profile = tmp_path / "profile.toml"
    profile.write_text(example.read_text().replace('kind = "nixos"', 'kind = "plain"'))
    return profile


def test_share_dry_run_prints_the_export_and_every_workers_volume_and_says_what_depends_on_the_hosts(
    tmp_path, monkeypatch, tp4_cli
):
    import shlex

    _no_process(monkeypatch)
    code, out, err = tp4_cli("share", "--dry-run", "--profile", str(_plain_line(tmp_path)))
    assert code == 0, err
    assert "dry run: nothing was run, no host was asked" in err
    commands = [line for line in out.splitlines() if line.startswith("spark")]
    for line in commands:  # every command as the funnel runs it: ssh … -- tp4@10.0.0.<N> '<cmd>'
        name, command_line = line.split(": ", 1)
        words = shlex.split(command_line.split("  (")[0].split("  < ")[0])
        assert words[0] == "ssh" and words[words.index("--") + 1] == f"tp4@10.0.0.{name[-1]}", line
    assert [c.split(":")[0] for c in commands[:5]] == ["spark1", "spark2", "spark3", "spark4", "spark1"]
    # the export line names each worker's address as the head sees it: asked at run time, so a placeholder
    assert "<spark2's address toward 10.0.0.1>(ro," in out and "sudo -n exportfs -ra" in out
    assert "the next commands depend on it" in out and "depends on" in out
    for n in (2, 3, 4):
        create = next(c for c in commands if c.startswith(f"spark{n}:") and "volume create" in c)
        assert "--opt type=nfs" in create and "addr=10.0.0.1" in create and "dsv41-weights" in create
        assert any(c.startswith(f"spark{n}:") and "/tp4-weights/config.json" in c for c in commands)


def test_download_dry_run_says_what_the_head_fetches_and_never_shows_a_token(tmp_path, monkeypatch, tp4_cli):
    _no_process(monkeypatch)
    monkeypatch.setenv("HF_TOKEN", "hf_secretsecretsecret")
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", "https://me:hunter22@mirror.invalid/hf")
    code, out, err = tp4_cli("download", "--dry-run", "--profile", str(_plain_line(tmp_path)))
    assert code == 0, err
    assert "hf_secretsecretsecret" not in out + err and "hunter22" not in out + err
    assert all(line.startswith("head (this machine): ") for line in out.splitlines()[1:]), out
    assert "https://mirror.invalid/hf" in out and "depends on the directory" in out
    assert "ln -sfn /home/tp4/NewModels/DeepSeek-V4.1-Flash " in out
    assert not (tmp_path / "home").exists()


def test_prepare_dry_run_prints_every_step_in_order_from_the_same_rehearsals(tmp_path, monkeypatch, tp4_cli):
    _no_process(monkeypatch)
    profile = str(_plain_line(tmp_path))
    code, out, err = tp4_cli("prepare", "--dry-run", "--profile", profile)
    assert code == 0, err
    steps = [line for line in out.splitlines() if line.startswith("# prepare: step")]
    assert steps == [f"# prepare: step {i}/4: {s}" for i, s in enumerate(["doctor", "download", "share", "pack"], 1)]
    doctor_part = out.split(steps[1])[0]
    assert sum(line.startswith("spark") for line in doctor_part.splitlines()) == 4
    assert "<FACTS_SCRIPT>" in doctor_part and "tp4-doctor" in doctor_part
    # the later steps are what `tp4 download|share|pack --dry-run` print, in that order
    for command, step in (("download", 1), ("share", 2), ("pack", 3)):
        code, alone, err = tp4_cli(command, "--dry-run", "--profile", profile)
        assert code == 0, err
        body = "\n".join(line for line in alone.splitlines() if not line.startswith("profile: "))
        part = out.split(steps[step])[1].split(steps[step + 1])[0] if step < 3 else out.split(steps[step])[1]
        assert part.strip("\n") == body, command
    # options are checked first, as in a real run
    code, out, err = tp4_cli("prepare", "--dry-run", "--profile", profile, "--sysfs", "relative/sys")
    assert code == 2 and "--sysfs" in err


@pytest.mark.parametrize("method", ["registry", "archive"])
def test_distribute_dry_run_prints_each_workers_copy_and_runs_nothing(method, tmp_path, monkeypatch, tp4_cli):
    import shlex

    _no_process(monkeypatch)
    ref = "dsv41-4x-spark:canary-roce"
    args = ["distribute", "--dry-run", "--runtime", "podman", "--image", ref, "--method", method]
    code, out, err = tp4_cli(*args, "--profile", str(_plain_line(tmp_path)))
    assert code == 0, err
    assert "dry run: nothing was run, no host was asked" in err
    for n in (2, 3, 4):
        mine = [line for line in out.splitlines() if line.startswith(f"10.0.0.{n}: ")]
        assert "depends on the worker" in mine[0] and "image inspect" in mine[0]
        copy = next(line for line in mine if ("pull" if method == "registry" else "load") in line)
        words = shlex.split(copy.split(": ", 1)[1].split("  < ")[0])
        assert words[0] == "ssh" and words[words.index("--") + 1] == f"tp4@10.0.0.{n}"
        if method == "registry":
            assert "RemoteForward=<port> 127.0.0.1:<pull endpoint port>" in words
            assert "--tls-verify=false" in words[-1] and "the pull credential on stdin" in copy
    code, out, err = tp4_cli(*args, "--check", "--profile", str(_plain_line(tmp_path)))
    assert code == 2 and "--dry-run" in err
