"""`tp4 up` end to end on four netns hosts laid out as good Sparks (tests/doctor_hosts.py: real
sshd and podman, the stand-in engine's image under the plan's tag on every host, an RDMA sysfs
tree and a stub nvidia-smi per host), with the checkpoint pinned to a local stand-in of the Hub
and the image's stand-in packer (tests/test_prepare.py's fixtures):

1. from hosts with nothing prepared (no checkpoint, no Engram shard): every step runs and the
   line is Ready, smoke passes;
2. a second `tp4 up` of the same profile changes nothing: the same containers run, nothing is
   fetched or packed again, and it finishes fast;
3. a profile change that only the ranks see (an env knob) restarts the ranks and redoes nothing
   else: no download, no pack.

Also: the image step's build path (the head lacks the plan's image: built from a flake whose image
is the stand-in's with a layer on top, checked, tagged, pushed to the head's image store, copied
to every worker, then served), `--json` (one tp4.up/1 document on stdout, on a stopped run too),
Ctrl-C (the summary so far and the resume command, exit 130), and the line lock prepare takes
when it stops the old ranks."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from doctor_hosts import SYSFS, DoctorCluster
from test_download import Hub
from test_prepare import blank, cluster, hub, hub_env, profile, stop, tp4  # noqa: F401 (cluster, hub: fixtures)

from tp4.core import process
from tp4.hosts.doctor import engram_files
from tp4.hosts.pack import engram_dir

REPO = Path(__file__).resolve().parent.parent


def up_document(stdout: str) -> dict[str, Any]:
    """stdout of `tp4 up --json`: exactly one document, valid against its generated schema."""
    doc: dict[str, Any] = json.loads(stdout)
    schema = json.loads((REPO / "docs" / "schemas" / "up.schema.json").read_text())
    jsonschema.Draft202012Validator(schema).validate(doc)
    return doc


def digest(path: str) -> str:
    from tp4.line.plan import build_plan
    from tp4.line.profile import load_file

    return build_plan(load_file(Path(path))).digest


def container_ids(c: DoctorCluster) -> dict[str, str]:
    """Each host's rank container id ('' when none)."""
    ids = {}
    for node in c.nodes():
        proc = process.run(
            [node.runtime, "container", "inspect", "--format", "{{.Id}}", node.container],
            remote=node.remote,
            check=False,
            timeout=60,
        )
        ids[node.name] = proc.stdout.strip() if proc.returncode == 0 else ""
    return ids


def resolves(stand_in: Hub) -> int:
    return len([q for q in stand_in.requests if q[0] == "GET" and "/resolve/" in q[1]])


def test_up_from_nothing_to_ready_then_nothing_changes_then_a_profile_change_restarts_only_the_ranks(
    cluster: DoctorCluster,  # noqa: F811
    hub: Hub,  # noqa: F811
) -> None:
    blank(cluster)
    path = str(profile(cluster))
    try:
        r = tp4(hub, cluster, "up", "--profile", path)
        out = r.stdout + r.stderr
        assert r.returncode == 0, out
        for i, name in enumerate(("doctor", "image", "distribute", "prepare", "serve", "smoke")):
            assert f"up: step {i + 1}/6: {name}" in r.stderr, out
        assert "up: doctor: done" in r.stderr and "but what later steps make: " in r.stderr, out
        assert "up: image: skipped" in r.stderr and "built and checked: reused" in r.stderr, out
        assert "up: distribute: skipped" in r.stderr and "every worker has" in r.stderr, out
        assert "(4 packed, 0 skipped)" in r.stdout, out
        assert "4 boot logs checked" in r.stdout, out
        assert "ok   arithmetic" in r.stdout, out
        table = r.stdout[r.stdout.index("step        outcome") :]
        assert [row.split()[:2] for row in table.splitlines()[1:7]] == [
            ["doctor", "done"],
            ["image", "skipped"],
            ["distribute", "skipped"],
            ["prepare", "done"],
            ["serve", "done"],
            ["smoke", "done"],
        ], table
        assert sorted(p.name for p in cluster.model_dir.iterdir() if not p.name.startswith(".tp4-")) == sorted(
            hub.files
        )
        first = container_ids(cluster)
        assert all(first.values()), first

        # the same profile again: nothing changes, only smoke runs; --json: stdout is the summary
        # as one document, the steps' output (smoke's lines, the table) goes to stderr
        gets = resolves(hub)
        began = time.monotonic()
        again = tp4(hub, cluster, "up", "--profile", path, "--json")
        seconds = time.monotonic() - began
        out = again.stdout + again.stderr
        assert again.returncode == 0, out
        assert "on every rank: only smoke verifies it" in again.stderr, out
        assert "up: step 6/6: smoke" in again.stderr and "up: step 5/6" not in again.stderr, out
        doc = up_document(again.stdout)
        assert doc["ok"] is True and doc["plan"] == digest(path), doc
        assert [(s["name"], s["outcome"]) for s in doc["steps"]] == [
            ("doctor", "skipped"),
            ("image", "skipped"),
            ("distribute", "skipped"),
            ("prepare", "skipped"),
            ("serve", "skipped"),
            ("smoke", "done"),
        ], doc
        assert doc["steps"][5]["detail"] == "arithmetic, stream passed" and doc["steps"][5]["seconds"] > 0, doc
        assert doc["stopped_at"] is None and doc["error"] is None and doc["resume"] is None, doc
        assert doc["seconds"] >= doc["steps"][5]["seconds"], doc
        assert "ok   arithmetic" in again.stderr and "step        outcome" in again.stderr, out
        assert container_ids(cluster) == first
        assert resolves(hub) == gets and "packed" not in again.stderr
        print(f"second tp4 up: {seconds:.2f} s")

        # a change only the ranks see (the Engram stats interval, an env knob): the ranks restart,
        # nothing is downloaded or packed again
        changed = Path(path).with_name("changed.toml")
        changed.write_text(Path(path).read_text() + "\n[engram]\nstats_seconds = 30\n")
        third = tp4(hub, cluster, "up", "--profile", str(changed))
        out = third.stdout + third.stderr
        assert third.returncode == 0, out
        assert "the line runs another plan" in third.stderr, out
        assert "up: doctor: skipped" in third.stderr, out
        assert "(0 packed, 4 skipped)" in third.stdout, out
        assert resolves(hub) == gets
        assert "the ranks of the other plan stopped first" in third.stderr, out
        restarted = container_ids(cluster)
        assert all(restarted.values()) and not set(restarted.values()) & set(first.values()), (first, restarted)

        # back to the first profile with a shard of rank 1 gone: the packer has work, so the ranks
        # of the running plan stop before it runs (it reads the checkpoint into their memory)
        rank = cluster.plan.nodes[1]
        (Path(engram_dir(rank)) / engram_files(cluster.plan, rank)[0]).unlink()
        fourth = tp4(hub, cluster, "up", "--profile", path)
        out = fourth.stdout + fourth.stderr
        assert fourth.returncode == 0, out
        assert f"up: prepare: pack has work on {rank.name} while the line runs another plan: " in fourth.stderr, out
        assert "(1 packed, 3 skipped)" in fourth.stdout, out
        assert "the ranks of the other plan stopped first" not in fourth.stderr, out  # stopped already
        assert "4 boot logs checked" in fourth.stdout, out
        assert resolves(hub) == gets

        # `tp4 stop` leaves its stop record on the head (a watch leaves the line stopped); up
        # serves the line again and removes it
        stop(path)
        head, record = cluster.hosts[0], cluster.plan.nodes[0].service.env_file.removesuffix(".env") + ".stopped.json"
        assert head.run("test", "-f", record, check=False).returncode == 0
        fifth = tp4(hub, cluster, "up", "--profile", path)
        out = fifth.stdout + fifth.stderr
        assert fifth.returncode == 0, out
        assert "4 boot logs checked" in fifth.stdout, out
        assert head.run("test", "-e", record, check=False).returncode == 1
    finally:
        stop(path)


def test_up_stopped_by_doctor_names_the_check_and_the_command_to_resume(
    cluster: DoctorCluster,  # noqa: F811
    hub: Hub,  # noqa: F811
) -> None:
    blank(cluster)
    asked = len(hub.requests)
    port = cluster.port(cluster.hosts[1], cluster.plan.nodes[1].gid.hcas[0]) / "link_layer"
    port.write_text("InfiniBand\n")
    path = str(profile(cluster))
    try:
        r = tp4(hub, cluster, "up", "--profile", path, "--json")
    finally:
        port.write_text("Ethernet\n")
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    assert "up: stopped at step 1/6 (doctor): 1 blocking failure(s):" in r.stderr, out
    assert f"  - RDMA.LINK_LAYER on {cluster.plan.nodes[1].name}: " in r.stderr, out
    # the resume command is this run's own (its options quoted for a shell), with --from
    resume = shlex.join(["tp4", "up", "--profile", path, "--sysfs", SYSFS, "--from", "doctor"])
    assert f"`{resume}`" in r.stderr, out
    assert "doctor      failed" in r.stderr and "image       not run" in r.stderr, out
    assert len(hub.requests) == asked  # download never ran
    # --json: the stopped run as its document on stdout, doctor's table with the progress on stderr
    doc = up_document(r.stdout)
    assert doc["ok"] is False and doc["plan"] == digest(path) and doc["stopped_at"] == "doctor", doc
    assert [s["outcome"] for s in doc["steps"]] == ["failed"] + ["not run"] * 5, doc
    assert doc["steps"][0]["detail"] == "1 blocking failure(s):", doc
    assert f"RDMA.LINK_LAYER on {cluster.plan.nodes[1].name}" in doc["error"], doc
    assert doc["resume"] == resume, doc
    assert "RDMA.LINK_LAYER" in r.stderr.split("up: stopped at")[0], out  # doctor's table


def test_up_from_a_later_step_skips_the_earlier_ones_and_a_failing_step_says_how_to_resume(
    cluster: DoctorCluster,  # noqa: F811
    hub: Hub,  # noqa: F811
) -> None:
    path = str(profile(cluster))
    stop(path)  # no line runs: smoke has nothing to talk to
    r = tp4(hub, cluster, "up", "--profile", path, "--from", "smoke", timeout=120)
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    assert "up: step 1/6" not in r.stderr and "up: step 6/6: smoke" in r.stderr, out
    for name in ("doctor", "image", "distribute", "prepare", "serve"):
        assert re.search(rf"^{name} +skipped +0\.0  --from smoke$", r.stderr, re.M), out
    assert re.search(r"^smoke +failed ", r.stderr, re.M), out
    assert (
        "up: stopped at step 6/6 (smoke): " in r.stderr
        and f"`{shlex.join(['tp4', 'up', '--profile', path, '--sysfs', SYSFS, '--from', 'smoke'])}`" in r.stderr
    ), out
    assert not any(container_ids(cluster).values())  # nothing was started


def test_up_dry_run_prints_every_steps_commands_host_by_host_and_asks_no_host(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "TP4_PROFILE"}
    env.update(PYTHONPATH=str(REPO / "python"), TP4_KNOWN_HOSTS=str(tmp_path / "known_hosts"))
    # the embedded example's hosts do not exist here: a step that asked one would fail
    r = subprocess.run(
        [sys.executable, "-m", "tp4", "up", "--dry-run"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    from tp4.line.plan import build_plan
    from tp4.line.profile import load_default

    plan = build_plan(load_default())
    for i, name in enumerate(("doctor", "image", "distribute", "prepare", "serve", "smoke")):
        assert f"step {i + 1}/6: {name}\n" in r.stdout
    sections = r.stdout.split("step 5/6: serve\n")[1].split("step 6/6")[0]
    for n in plan.nodes:  # every rank's stop (a line of another plan) and start, on its own host
        # its stop (a line of another plan), then its start (the head: create, then start)
        assert sum(line.startswith(f"  {n.name}: ssh ") for line in sections.splitlines()) >= 2, sections
        assert f"pack_engram.py --rank {n.rank} " in r.stdout
    assert "  download: head (this machine): fetch into " in r.stdout  # download's own rehearsal
    assert "/v1/chat/completions" in r.stdout
    assert not (tmp_path / "known_hosts").exists()


def test_up_without_the_plans_image_on_the_head_passes_doctor_and_stops_at_the_image_step(
    cluster: DoctorCluster,  # noqa: F811
    hub: Hub,  # noqa: F811
    tmp_path: Path,
) -> None:
    """The image is what the image step makes: doctor's IMAGE.SAME does not stop up before it;
    with no flake to build from, the image step stops with its own message and the resume command."""
    head = cluster.nodes()[0]
    tag = cluster.plan.image.tag
    image_id = process.run([head.runtime, "image", "inspect", "--format", "{{.Id}}", tag], remote=head.remote)
    process.run([head.runtime, "untag", tag, tag], remote=head.remote)
    try:
        with pytest.MonkeyPatch.context() as env:  # the flake tp4 up finds: none (TP4_FLAKE, nix.find_flake)
            env.setenv("TP4_FLAKE", str(tmp_path))
            env.chdir(tmp_path)
            r = tp4(hub, cluster, "up", "--profile", str(profile(cluster)), timeout=300)
    finally:
        process.run([head.runtime, "tag", image_id.stdout.strip(), tag], remote=head.remote)
    out = r.stdout + r.stderr
    assert r.returncode == 2, out
    assert "up: doctor: done" in r.stderr and "IMAGE.SAME (image, distribute)" in r.stderr, out
    assert "up: stopped at step 2/6 (image): no flake.nix in " in r.stderr, out
    resume = shlex.join(["tp4", "up", "--profile", str(profile(cluster)), "--sysfs", SYSFS, "--from", "image"])
    assert f"`{resume}`" in r.stderr, out
    assert re.search(r"^distribute +not run", r.stderr, re.M), out


def test_a_line_up_from_this_plan_that_fails_smoke_is_not_told_to_rerun_smoke(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Rerunning smoke does not mend a line that runs this plan and answers wrongly (or not): the
    fix names `tp4 status` and `tp4 serve --replace`; no other step runs."""
    from tp4.core.errors import Tp4Error
    from tp4.line.plan import build_plan
    from tp4.line.profile import load_default
    from tp4.serving import serve as serve_mod
    from tp4.serving import up

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))  # up's lock
    plan = build_plan(load_default())
    line = up.Line(load_default(), plan, [], {})
    ran: list[str] = []
    monkeypatch.setattr(up, "read_state", lambda _: up.State({n.name: ("running", plan.digest) for n in plan.nodes}))

    def smoke(*args: object) -> str:
        ran.append("smoke")
        raise Tp4Error("smoke failed: arithmetic")

    monkeypatch.setattr(up, "_smoke", smoke)
    with pytest.raises(up.Stopped) as stopped:
        up.run(line, up.Options(serve=serve_mod.Options()), lambda _: None, lambda _: None)
    assert ran == ["smoke"]
    assert "up: stopped at step 6/6 (smoke): smoke failed: arithmetic" in stopped.value.message
    assert "`tp4 serve --replace` restarts its ranks" in stopped.value.message
    assert "--from smoke" not in stopped.value.message


def test_a_second_tp4_up_of_the_line_is_refused_while_one_runs(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Two `tp4 up` of one line would race in every step: the second is refused naming the first;
    none of its steps runs."""
    import pytest

    from tp4.core.errors import Tp4Error
    from tp4.line.plan import build_plan
    from tp4.line.profile import load_default
    from tp4.serving import serve as serve_mod
    from tp4.serving import up

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    plan = build_plan(load_default())
    line = up.Line(load_default(), plan, [], {})
    monkeypatch.setattr(up, "read_state", lambda _: pytest.fail("a step ran"))
    with serve_mod.line_lock(plan, "up", kind="up.lock"):
        with pytest.raises(Tp4Error, match=r"is busy: tp4 up \(pid [0-9]+, started "):
            up.run(line, up.Options(serve=serve_mod.Options()), lambda _: None, lambda _: None)


def test_up_dry_run_shows_share_and_distribute_as_their_own_dry_runs_print_them(
    tmp_path: Path, monkeypatch, tp4_cli
) -> None:  # type: ignore[no-untyped-def]
    """One code path: up's distribute step and the share part of its prepare step are what
    `tp4 distribute --dry-run` and `tp4 share --dry-run` print (indented under up's step)."""
    import textwrap

    from tp4.line.plan import build_plan
    from tp4.line.profile import load_file

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"a dry run started a process: {args}")

    monkeypatch.setattr(process, "_spawn", refuse)
    monkeypatch.setattr(process, "start", refuse)
    monkeypatch.setenv("TP4_FLAKE", str(tmp_path))  # no build records: the same digest placeholder in both
    monkeypatch.chdir(tmp_path)
    example = REPO / "examples" / "spark-line" / "profile.toml"
    profile = tmp_path / "profile.toml"  # hosts that are not NixOS: share writes the export and the volumes
    profile.write_text(example.read_text().replace('kind = "nixos"', 'kind = "plain"'))
    code, up_out, err = tp4_cli("up", "--dry-run", "--profile", str(profile))
    assert code == 0, err
    tag = build_plan(load_file(profile)).image.tag

    def alone(*args: str) -> str:
        code, out, err = tp4_cli(*args, "--dry-run", "--profile", str(profile))
        assert code == 0, err
        return "\n".join(line for line in out.splitlines() if not line.startswith("profile: "))

    distribute_step = up_out.split("step 3/6: distribute\n")[1].split("step 4/6")[0]
    assert distribute_step.rstrip("\n") == textwrap.indent(
        alone("distribute", "--runtime", "podman", "--image", tag), "  "
    ), distribute_step
    share_text = textwrap.indent(alone("share"), "  ")
    prepare_step = up_out.split("step 4/6: prepare\n")[1].split("step 5/6")[0]
    assert share_text in prepare_step and "sudo -n exportfs -ra" in share_text, prepare_step


def test_ctrl_c_during_up_prints_the_summary_so_far_and_the_resume_command_and_exits_130(
    cluster: DoctorCluster,  # noqa: F811
    hub: Hub,  # noqa: F811
) -> None:
    """Ctrl-C in the serve step: the steps before it as they ended, serve `interrupted`, smoke `not
    run`, the command that resumes at serve; exit 130 and no traceback; serve leaves no rank
    behind; with --json the same as the document on stdout."""
    blank(cluster)  # whatever ran before: prepare has work (the download), and the checkpoint is the Hub's
    path = str(profile(cluster))
    stop(path)  # nothing runs: every step runs
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(HF_ENDPOINT=hub.url, PYTHONPATH=str(REPO / "python"), NO_PROXY="127.0.0.1", no_proxy="127.0.0.1")
    argv = [sys.executable, "-m", "tp4", "up", "--profile", path, "--json", "--sysfs", SYSFS]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stderr is not None
        seen = []
        for text in proc.stderr:  # the serve step has started: its boot takes seconds
            seen.append(text)
            if text.startswith("up: step 5/6: serve"):
                break
        assert seen and seen[-1].startswith("up: step 5/6: serve"), "".join(seen)
        time.sleep(1)
        proc.send_signal(signal.SIGINT)
        stdout, rest = proc.communicate(timeout=180)
        err = "".join(seen) + rest
        assert proc.returncode == 130, stdout + err
        assert "Traceback" not in err, err
        for name, outcome in (("doctor", "done"), ("image", "skipped"), ("distribute", "skipped"), ("prepare", "done")):
            assert re.search(rf"^{name} +{outcome} +[0-9.]+  ", err, re.M), err
        assert re.search(r"^serve +interrupted +[0-9.]+  interrupted$", err, re.M), err
        assert re.search(r"^smoke +not run ", err, re.M), err
        resume = shlex.join(["tp4", "up", "--profile", path, "--sysfs", SYSFS, "--from", "serve"])
        assert f"up: interrupted at step 5/6 (serve); resume with `{resume}`" in err, err
        assert err.rstrip().endswith("interrupted"), err  # the CLI's own last word, as for every command
        doc = up_document(stdout)
        assert doc["ok"] is False and doc["stopped_at"] == "serve" and doc["error"] == "interrupted", doc
        assert [s["outcome"] for s in doc["steps"]] == ["done", "skipped", "skipped", "done", "interrupted", "not run"]
        assert doc["resume"] == resume and doc["steps"][4]["seconds"] >= 1, doc
        assert not any(container_ids(cluster).values())  # serve stopped every rank it started
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        stop(path)


def test_prepare_stops_the_old_ranks_and_packs_under_the_lock_serve_and_stop_take(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When the packer has work on a line that runs another plan, prepare stops the ranks and
    packs holding the line's lock (the one `tp4 serve` and `tp4 stop` take): a serve that comes
    meanwhile is refused; a serve that holds it already makes prepare stop before stopping any
    rank. (The stop and the packer are recorded here; tests/test_pack.py and the end-to-end test
    above run them.)"""
    from tp4.core.errors import Tp4Error
    from tp4.hosts import checkpoint, pack, share
    from tp4.line.plan import build_plan
    from tp4.line.profile import load_default
    from tp4.serving import serve as serve_mod
    from tp4.serving import up

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    plan = build_plan(load_default())
    line = up.Line(load_default(), plan, [], {})
    ran: list[str] = []

    def serve_refused(when: str) -> None:
        with pytest.raises(Tp4Error, match=r"is busy: tp4 up \(prepare: stopping the ranks for the packer\) \(pid "):
            with serve_mod.line_lock(plan, "serve"):
                pass
        ran.append(when)

    def stop_nodes(nodes: object, echo: object) -> list[str]:
        serve_refused("stop")
        return []

    monkeypatch.setattr(up, "unpacked", lambda _: [plan.nodes[1].name])
    monkeypatch.setattr(checkpoint, "download", lambda profile: None)
    monkeypatch.setattr(share, "share", lambda *args: None)
    monkeypatch.setattr(serve_mod, "stop_nodes", stop_nodes)
    monkeypatch.setattr(pack, "pack", lambda *args: serve_refused("pack"))

    def running() -> up.State:
        return up.State({n.name: ("running", "another plan") for n in plan.nodes})

    state = running()
    up._prepare(line, up.Options(serve=serve_mod.Options()), state, lambda _: None, lambda _: None)
    assert ran == ["stop", "pack"] and not state.any_running()
    with serve_mod.line_lock(plan, "serve"):  # a `tp4 serve` of the line runs: prepare stops nothing
        with pytest.raises(Tp4Error, match=r"pack: the line .* is busy: tp4 serve \(pid "):
            up._prepare(line, up.Options(serve=serve_mod.Options()), running(), lambda _: None, lambda _: None)
    assert ran == ["stop", "pack"]


def standin_flake(dest: Path, tag: str, attr: str) -> Path:
    """A flake whose image (attribute ``attr``) is the stand-in engine's test image
    (tests/standin/image.py, as the base) with a layer of its own on top: an in-image check at
    /opt/dsv41/tests/test_up_image.py (real Python, the base's python3) and a label file, built
    by pkgs/oci.nix as the line's image is, under the line's reference ``tag`` (label
    tp4.line.ref) with the stand-in's entrypoint: what `tp4 serve` runs serves as the stand-in."""
    from nix_env import image_flake
    from standin import image as standin_image

    from tp4.line.container import IMAGE

    archive, _ = standin_image.archive()
    flake = image_flake(
        dest,
        ref=tag,
        label=f"up-{os.urandom(4).hex()}",  # a new image each run, so nix really builds it
        base_archive=archive,
        files={"tests/test_up_image.py": 'print("the stand-in image, built by tp4 up")\nprint("1/1 PASS")\n'},
        checks='[[image_check]]\nname = "up"\nfile = "tests/test_up_image.py"\n',
        env=("PATH=/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE=1"),
    )
    text = (flake / "flake.nix").read_text()
    for old, new in (
        # the stand-in's /bin (the applets a rank's stop needs) and /opt/dsv41 (its engine) stay:
        # only the checks' directory is linked into its runtime tree
        ('{ path = "/bin"; tree = tools; subdir = "/bin"; }', ""),
        (
            '{ path = "/opt/dsv41"; tree = runtime; }',
            '{ path = "/opt/dsv41/tests"; tree = runtime; subdir = "/tests"; }',
        ),
        (
            'Entrypoint = [ "/bin/sh" "-c" "echo entrypoint not overridden; exit 97" ];',
            f'Entrypoint = [ "python3" "-u" "{IMAGE.boot}" ];',
        ),
        ('WorkingDir = "/opt/dsv41";', f'WorkingDir = "{IMAGE.runtime}";'),
    ):
        assert old in text, old
        text = text.replace(old, new)
    if attr != "image":  # the variant's attribute, as pkgs/default.nix names it
        old = "{ inherit image; default = image; }"
        assert old in text
        text = text.replace(old, f'{{ inherit image; default = image; "{attr}" = image; }}')
    (flake / "flake.nix").write_text(text)
    return flake


def up_with_flake(
    line: DoctorCluster, stand_in: Hub, tmp_path: Path, path: str, flake: Path, podman: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    """`tp4 up --flake FLAKE` with offline nix, the head's image store and the line's locks under
    tmp_path, and this machine's podman configured by ``podman`` (CONTAINERS_STORAGE_CONF,
    CONTAINERS_CONF)."""
    from nix_env import image_nix_config

    env = hub_env(stand_in, line.workdir)
    env.update(
        NIX_CONFIG=image_nix_config(tmp_path / "nix"),
        XDG_STATE_HOME=str(tmp_path / "state"),
        XDG_CACHE_HOME=str(tmp_path / "cache"),
        CONTAINERS_STORAGE_CONF=podman["CONTAINERS_STORAGE_CONF"],
        CONTAINERS_CONF=podman["CONTAINERS_CONF"],
    )
    return subprocess.run(
        [sys.executable, "-m", "tp4", "up", "--profile", path, "--flake", str(flake), "--sysfs", SYSFS],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
    )


def test_up_builds_checks_and_pushes_the_plans_image_when_the_head_lacks_it_and_the_workers_get_its_layers(
    cluster: DoctorCluster,  # noqa: F811
    hub: Hub,  # noqa: F811
    tmp_path: Path,
) -> None:
    """The image step's build path, as `tp4 build --image VARIANT` takes it: the head lacks the
    plan's image, so up builds it from the flake (nix build, load, its in-image check in podman,
    the line's tag, a push to the head's image store); distribute copies it from that store to
    every worker (one lacks the tag, the others have another image under it), each getting the
    head's layers; serve runs the built image and smoke passes. tp4 runs on the head, as up
    says: its podman is the head's store (the head host's storage and containers.conf)."""
    from tp4.image import build as build_mod
    from tp4.image import imagestore, runtime_cli

    blank(cluster)  # the cluster's 48 shard files are not the pinned checkpoint's 3: download fetches them
    path = str(profile(cluster))
    stop(path)
    tag = cluster.plan.image.tag
    attr = build_mod.image_attr(cluster.plan.image.variant)
    nodes = cluster.nodes()
    head, workers = nodes[0], nodes[1:]
    before = {n.name: runtime_cli.inspect(n.runtime, tag, remote=n.remote) for n in nodes}
    assert all(before.values()), before
    flake = standin_flake(tmp_path / "flake", tag, attr)
    process.run([head.runtime, "untag", tag, tag], remote=head.remote)
    process.run([workers[0].runtime, "untag", tag, tag], remote=workers[0].remote)
    try:
        r = up_with_flake(cluster, hub, tmp_path, path, flake, cluster.head.env)
        out = r.stdout + r.stderr
        assert r.returncode == 0, out
        built = runtime_cli.inspect(head.runtime, tag, remote=head.remote)
        assert built is not None, out
        head_id = runtime_cli.normalize_id(built[0])
        assert head_id not in {runtime_cli.normalize_id(b[0]) for b in before.values() if b}, out
        assert "up: doctor: done" in r.stderr and "IMAGE.SAME (image, distribute)" in r.stderr, out
        assert "up: image: done in " in r.stderr and f"built, checked and tagged {tag} ({head_id[:12]})" in r.stderr, (
            out
        )
        assert "check 1/1: up" in r.stderr and "1/1 PASS" in r.stdout and "checks: 1 passed, 0 failed" in r.stdout, out
        # pushed to the head's image store: the record distribute reads, of this image
        pushed = build_mod.Pushed.load(build_mod.store_record_path(flake, attr))
        assert pushed is not None and pushed.id.removeprefix("sha256:") == head_id.removeprefix("sha256:"), out
        assert "up: distribute: done in " in r.stderr and f"3 of 3 workers got {head_id[:12]}" in r.stderr, out
        head_layers = runtime_cli.layers(head.runtime, tag, remote=head.remote)
        for n in workers:
            got = runtime_cli.inspect(n.runtime, tag, remote=n.remote)
            assert got is not None and runtime_cli.normalize_id(got[0]) == head_id, (n.name, got)
            assert runtime_cli.layers(n.runtime, tag, remote=n.remote) == head_layers, n.name
        assert "4 boot logs checked" in r.stdout and "ok   arithmetic" in r.stdout, out
        assert re.search(r"^smoke +done ", r.stdout, re.M), out
    finally:
        stop(path)
        for n in nodes:  # the stand-in image under the plan's tag again, as the cluster has it
            old = before[n.name]
            assert old is not None
            process.run([n.runtime, "tag", old[0], tag], remote=n.remote)
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
            imagestore.stop()


def test_up_that_builds_into_a_store_the_head_does_not_run_from_says_so_at_the_image_step(
    cluster: DoctorCluster,  # noqa: F811
    hub: Hub,  # noqa: F811
    tmp_path: Path,
) -> None:
    """tp4 up not run on the head as the head's ssh user: the build lands in a podman store the
    ranks do not run from. The image step says so, with the fix, instead of a later step
    failing on an image the head lacks; nothing after it runs."""
    from netns_hosts import storage_conf

    from tp4.image import imagestore, runtime_cli

    path = str(profile(cluster))
    stop(path)
    tag = cluster.plan.image.tag
    head = cluster.nodes()[0]
    before = runtime_cli.inspect(head.runtime, tag, remote=head.remote)
    assert before is not None
    flake = standin_flake(tmp_path / "flake", tag, "image")
    store = Path(tempfile.mkdtemp(prefix="tp4up-", dir="/tmp"))  # short: podman's runroot
    conf = tmp_path / "containers.conf"  # this sandbox's limits, as tests/test_build.py has them
    conf.write_text('[containers]\ndefault_ulimits = ["nofile=1024:1024", "nproc=4096:4096"]\n')
    here = {"CONTAINERS_STORAGE_CONF": str(storage_conf(store)), "CONTAINERS_CONF": str(conf)}
    process.run([head.runtime, "untag", tag, tag], remote=head.remote)
    try:
        r = up_with_flake(cluster, hub, tmp_path, path, flake, here)
        out = r.stdout + r.stderr
        assert r.returncode == 1, out
        assert "checks: 1 passed, 0 failed" in r.stdout, out  # built and checked here
        assert re.search(
            rf"up: stopped at step 2/6 \(image\): built {re.escape(tag)} \([0-9a-f]{{12}}\) here, but the head "
            rf"{head.name} \(over ssh as root\) has no {re.escape(tag)}: the build went into this machine's podman "
            r"store, which is not the one the head's ranks run from; fix: run tp4 up on the head, as the head's "
            r"ssh user \(root\)",
            r.stderr,
        ), out
        assert re.search(r"^distribute +not run", r.stderr, re.M), out
        assert runtime_cli.inspect(head.runtime, tag, remote=head.remote) is None
    finally:
        process.run([head.runtime, "tag", before[0], tag], remote=head.remote)
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
            mp.setenv("CONTAINERS_STORAGE_CONF", here["CONTAINERS_STORAGE_CONF"])
            mp.setenv("CONTAINERS_CONF", here["CONTAINERS_CONF"])
            imagestore.stop()
            process.run(["podman", "rmi", "-a", "-f"], check=False)
        shutil.rmtree(store, ignore_errors=True)
