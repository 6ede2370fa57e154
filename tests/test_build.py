"""`tp4 build`: dry run, a real build + load on a tiny busybox image flake, the in-image checks
run in podman before the line's tag moves, and the Nix checks."""

from __future__ import annotations

import json
import logging
import os
import shlex
import shutil
import stat
import tempfile
import tomllib
from pathlib import Path

import pytest

from nix_env import image_flake, nix, image_nix_config
from netns_hosts import storage_conf
from tp4.image import build as build_mod
from tp4.image import runtime_cli
from tp4.image import nix as nix_mod
from tp4.image import oci as tp4_oci
from tp4.core import process
from tp4.core.errors import InvalidInput, Tp4Error
from tp4.line.registry import RUNTIME_DIR, ImageCheck, load_registry, parse_image_checks

LINE = "tp4-test:line"


@pytest.fixture
def env(tmp_path, monkeypatch):
    """Offline nix and an isolated podman store for the head, under a short path: with a long
    runroot (pytest's tmp_path) every `podman run --rm` waits 20 s for its cleanup. This
    sandbox's hard limits are below podman's default nofile/nproc for a container, so
    runtime_cli.conf sets them (tp4's argv stays what the registry says)."""
    monkeypatch.setenv("NIX_CONFIG", image_nix_config(tmp_path / "nix"))
    store = Path(tempfile.mkdtemp(prefix="tp4b-", dir="/tmp"))
    monkeypatch.setenv("CONTAINERS_STORAGE_CONF", str(storage_conf(store)))
    conf = tmp_path / "runtime_cli.conf"
    conf.write_text('[containers]\ndefault_ulimits = ["nofile=1024:1024", "nproc=4096:4096"]\n')
    monkeypatch.setenv("CONTAINERS_CONF", str(conf))
    podman_bin = shutil.which("podman")
    yield tmp_path
    if podman_bin:  # a test may have emptied PATH
        process.run([podman_bin, "rmi", "-a", "-f"], check=False)
    shutil.rmtree(store, ignore_errors=True)


@pytest.fixture
def commands(caplog):
    """The commands tp4 ran through its one funnel (tp4.core.process logs each as `$ ...`)."""
    caplog.set_level(logging.DEBUG, logger="tp4.core.process")
    return lambda: [r.getMessage() for r in caplog.records if r.name == "tp4.core.process"]


def check(name: str, **fields) -> str:
    """One [[image_check]] entry as TOML (values written as TOML, which JSON scalars and lists are)."""
    lines = ["[[image_check]]", f"name = {json.dumps(name)}"]
    for key, value in fields.items():
        if isinstance(value, dict):
            value = "{ " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in value.items()) + " }"
        else:
            value = json.dumps(value)
        lines.append(f"{key} = {value}")
    return "\n".join(lines) + "\n"


PASS = check("pass", file="tests/test_pass.py")
FAIL = check("fail", file="tests/test_fail.py")
ENV = check("env", file="tests/test_env.py", args=["a", "b"], workdir="/opt/dsv41/tests", env={"BV_TEST_N": "60000"})
GPU = check("gpu_pass", file="tests/test_pass.py", gpu=True)


def podman(*argv: str) -> str:
    return process.run(["podman", *argv]).stdout


def image_ids_with_label(label: str) -> list[str]:
    ids = podman("images", "-q", "--no-trunc", "--filter", f"label=tp4.flake.rev={label}").split()
    return [runtime_cli.normalize_id(i) for i in ids]


def repo_tags(image_id: str) -> list[str]:
    return json.loads(podman("image", "inspect", "--format", "{{json .RepoTags}}", image_id))


def line_id() -> str | None:
    found = runtime_cli.inspect("podman", LINE)
    return found[0] if found else None


def build_line(env, tp4_cli, name="first") -> tuple[Path, str]:
    """A line image that passed its checks: (flake, image id)."""
    flake = image_flake(env / name, ref=LINE, label=f"{name}-{os.urandom(4).hex()}", checks=PASS)
    code, _, stderr = tp4_cli("build", "--flake", flake, "--runtime", "podman")
    assert code == 0, stderr
    return flake, line_id()


def test_dry_run_prints_commands_and_store_paths_without_building(env, tp4_cli):
    flake = image_flake(env / "flake", label=f"dry-{os.urandom(4).hex()}")
    out = nix(["eval", "--raw", f"path:{flake}#image.outPath"], env).stdout
    drv = nix(["path-info", "--derivation", f"path:{flake}#image"], env).stdout.strip()

    code, stdout, stderr = tp4_cli("build", "--dry-run", "--flake", flake, "--runtime", "podman")

    assert code == 0, stderr
    build_cmd = shlex.join(
        [
            "nix",
            "--extra-experimental-features",
            "nix-command flakes",
            "build",
            f"{flake}#image",
            "--json",
            "--out-link",
            str(flake / "result-image"),
            "--log-format",
            "internal-json",
            "-v",
        ]
    )
    assert f"$ {build_cmd}" in stdout
    # the layout goes in with skopeo (its reference is known once it is built)
    assert f"$ skopeo copy --quiet 'oci:{out}:<ref>' 'containers-storage:localhost/<ref>'" in stdout
    assert "$ podman run --rm --network none -e CUDA_VISIBLE_DEVICES= " in stdout
    assert "$ podman tag '<image id>' '<tp4.line.ref label>'" in stdout
    assert "nvidia.com/gpu=all" not in stdout
    assert f"image       {out}" in stdout
    assert f"derivation  {drv}" in stdout
    assert drv in stdout.split("to build")[1]
    assert not Path(out).exists()
    assert not (flake / "result-image").exists()
    code, stdout, _ = tp4_cli("build", "--dry-run", "--gpu-tests", "--flake", flake, "--runtime", "podman")
    assert code == 0 and "$ podman run --rm --network none --device nvidia.com/gpu=all -e '<env>'" in stdout


def test_passing_checks_tag_the_image_for_the_line_and_record_it(env, tp4_cli, commands):
    label = f"built-{os.urandom(4).hex()}"  # a new image each run, so nix really builds it
    flake = image_flake(env / "flake", ref="tp4-test:built", label=label, checks=PASS + ENV)

    code, stdout, stderr = tp4_cli("build", "--flake", flake, "--runtime", "podman")

    assert code == 0, stderr
    found = runtime_cli.inspect("podman", "tp4-test:built")
    assert found is not None
    image_id, labels = found
    assert labels["tp4.flake.rev"] == label
    lines = stdout.splitlines()
    assert any(line.startswith("ok   pass  ") and line.endswith("  3/3 PASS") for line in lines), stdout
    # what the container saw: the check's workdir, args and env, CUDA hidden, no network but lo
    assert any(
        line.startswith("ok   env   ")
        and line.endswith("  cwd=/opt/dsv41/tests args=a b net=lo CVD=[] BV_TEST_N=60000")
        for line in lines
    ), stdout
    assert "checks: 2 passed, 0 failed" in lines
    assert f"id    {image_id}" in lines
    assert "image tp4-test:built" in lines
    assert f"  flake  {label}" in lines
    assert "  demo   0123456789abcdef0123456789abcdef01234567" in lines
    # progress on stderr: nix's builds, which check runs
    assert "building" in stderr and "building" not in stdout
    assert "check 1/2: pass" in stderr and "check 2/2: env" in stderr
    # the layout copied into podman's store by skopeo, shown once (progress), not again in the debug log
    out_path = os.path.realpath(flake / "result-image")
    ref = tp4_oci.read_layout(out_path).ref
    copy = shlex.join(["skopeo", "copy", "--quiet", f"oci:{out_path}:{ref}", f"containers-storage:localhost/{ref}"])
    assert stderr.count(f"$ {copy}\n") == 1
    assert not [c for c in commands() if c == f"$ {copy}"]
    runs = [c for c in commands() if c.startswith("$ podman run ")]
    assert [shlex.split(c)[1:] for c in runs] == [
        [
            "podman",
            "run",
            "--rm",
            "--network",
            "none",
            "--name",
            f"tp4-check-{os.getpid()}-pass",
            "-e",
            "CUDA_VISIBLE_DEVICES=",
            "--entrypoint",
            "python3",
            image_id,
            "/opt/dsv41/tests/test_pass.py",
        ],
        [
            "podman",
            "run",
            "--rm",
            "--network",
            "none",
            "--name",
            f"tp4-check-{os.getpid()}-env",
            "-e",
            "BV_TEST_N=60000",
            "-e",
            "CUDA_VISIBLE_DEVICES=",
            "--workdir",
            "/opt/dsv41/tests",
            "--entrypoint",
            "python3",
            image_id,
            "/opt/dsv41/tests/test_env.py",
            "a",
            "b",
        ],
    ]
    assert f"$ podman tag {image_id} tp4-test:built" in commands()
    record = json.loads((flake / "result-image.json").read_text())
    assert record == {"out_path": os.path.realpath(flake / "result-image"), "ref": "tp4-test:built", "id": image_id}
    # the candidate's own tag is gone: only the line's reference is left on the image
    assert repo_tags(image_id) == ["localhost/tp4-test:built"]
    assert podman("ps", "-a", "-q") == ""


def test_a_failing_check_leaves_the_line_image_and_record_as_they_were(env, tp4_cli):
    first, first_id = build_line(env, tp4_cli)
    record = first / "result-image.json"
    before = record.read_bytes()
    label = f"broken-{os.urandom(4).hex()}"
    broken = image_flake(env / "first", ref=LINE, label=label, checks=PASS + FAIL)  # same flake dir, new image

    code, stdout, stderr = tp4_cli("build", "--flake", broken, "--runtime", "podman")

    assert code == 1
    lines = stdout.splitlines()
    assert any(line.startswith("ok   pass  ") for line in lines), stdout
    fail = next(i for i, line in enumerate(lines) if line.startswith("FAIL fail  "))
    assert lines[fail].endswith(" s  exit code 1")
    assert "     | checking something" in lines[fail + 1 : fail + 3]
    assert "     | AssertionError: failing on purpose" in lines[fail + 1 : fail + 3]
    assert "checks: 1 passed, 1 failed: fail" in lines
    assert "error: 1 of 2 in-image checks failed (fail)" in stderr
    assert f"{LINE} still is {first_id[:12]}" in stderr and "result-image.json is unchanged" in stderr
    assert "Traceback" not in stderr
    assert "id    " not in stdout
    assert line_id() == first_id
    assert record.read_bytes() == before
    assert image_ids_with_label(label) == []  # the candidate was removed
    assert podman("ps", "-a", "-q") == ""


def test_gpu_tests_add_the_gpu_checks_which_fail_on_a_host_without_gpu(env, tp4_cli, commands):
    _, first_id = build_line(env, tp4_cli)
    label = f"gpu-{os.urandom(4).hex()}"
    flake = image_flake(env / "gpu", ref=LINE, label=label, checks=PASS + GPU)
    before = len(commands())

    code, stdout, stderr = tp4_cli("build", "--gpu-tests", "--flake", flake, "--runtime", "podman")

    assert code == 1
    lines = stdout.splitlines()
    assert any(line.startswith("ok   pass      ") for line in lines), stdout
    fail = next(line for line in lines if line.startswith("FAIL gpu_pass  "))
    assert "exit code" in fail
    assert "nvidia.com/gpu=all" in stdout.split(fail)[1]  # podman's CDI error, in the output tail
    ran = commands()[before:]
    gpu_cmd = next(c for c in ran if c.startswith("$ podman run ") and "gpu_pass" in c)
    assert " --device nvidia.com/gpu=all " in gpu_cmd and "CUDA_VISIBLE_DEVICES" not in gpu_cmd
    assert not any(c.startswith("$ podman tag ") for c in ran)
    assert "error: 1 of 2 in-image checks failed (gpu_pass)" in stderr
    assert line_id() == first_id and image_ids_with_label(label) == []

    # without --gpu-tests the gpu check does not run, and the image passes
    code, stdout, stderr = tp4_cli("build", "--flake", flake, "--runtime", "podman")
    assert code == 0, stderr
    assert "gpu_pass" not in stdout and "gpu_pass" not in stderr
    assert "checks: 1 passed, 0 failed" in stdout.splitlines()
    assert line_id() == image_ids_with_label(label)[0] != first_id


def test_an_image_without_a_check_list_is_not_tagged_unless_asked(env, tp4_cli):
    label = f"nolist-{os.urandom(4).hex()}"
    flake = image_flake(env / "flake", ref=LINE, label=label, checks=None)

    code, stdout, stderr = tp4_cli("build", "--flake", flake, "--runtime", "podman")

    assert code == 1
    assert "carries no in-image checks (no tp4.checks label)" in stderr and "--skip-checks" in stderr
    assert line_id() is None and image_ids_with_label(label) == []
    assert not (flake / "result-image.json").exists()

    code, stdout, stderr = tp4_cli("build", "--skip-checks", "--flake", flake, "--runtime", "podman")
    assert code == 0, stderr
    assert "warning: --skip-checks" in stderr and "checks:" not in stdout
    assert line_id() == image_ids_with_label(label)[0]


def test_an_empty_check_list_is_the_images_own_declaration(env, tp4_cli):
    flake = image_flake(env / "flake", ref=LINE, label=f"empty-{os.urandom(4).hex()}", checks="")
    code, stdout, stderr = tp4_cli("build", "--flake", flake, "--runtime", "podman")
    assert code == 0, stderr
    assert "checks: none in the image's list" in stdout.splitlines()
    assert line_id() is not None


def test_a_bad_check_list_in_the_image_is_invalid_input(env, tp4_cli):
    label = f"badlist-{os.urandom(4).hex()}"
    flake = image_flake(
        env / "flake",
        ref=LINE,
        label=label,
        checks=PASS + check("typo", file="tests/test_pass.py", enviroment={"A": "1"}),
    )
    code, _, stderr = tp4_cli("build", "--flake", flake, "--runtime", "podman")
    assert code == 2
    assert "label tp4.checks: bad image checks" in stderr and "image_check[1] (typo): unknown key enviroment" in stderr
    assert "Traceback" not in stderr
    assert line_id() is None and image_ids_with_label(label) == []


def test_a_check_that_outlives_its_timeout_fails_and_its_container_goes(env, tp4_cli):
    label = f"slow-{os.urandom(4).hex()}"
    flake = image_flake(
        env / "flake",
        ref=LINE,
        label=label,
        checks=check("slow", argv=["/bin/sh", "-c", "echo started; sleep 60"], timeout=2),
    )
    code, stdout, stderr = tp4_cli("build", "--flake", flake, "--runtime", "podman")
    assert code == 1
    assert any(line.startswith("FAIL slow  ") and line.endswith("timed out after 2 s") for line in stdout.splitlines())
    assert "error: 1 of 1 in-image checks failed (slow)" in stderr
    assert podman("ps", "-a", "-q") == ""
    assert line_id() is None and image_ids_with_label(label) == []


def test_an_image_loaded_under_the_lines_own_tag_is_refused_and_the_line_put_back(env, tp4_cli):
    flake, first_id = build_line(env, tp4_cli)
    label = f"sametag-{os.urandom(4).hex()}"
    # a stream (a layout's name always carries its own tag); the same flake dir: its record
    bad = image_flake(env / "first", ref=LINE, label=label, checks=PASS, stream=True)
    text = (bad / "flake.nix").read_text()
    assert '"RepoTags":["tp4-test:${tag}"]' in text
    (bad / "flake.nix").write_text(text.replace('"RepoTags":["tp4-test:${tag}"]', f'"RepoTags":["{LINE}"]'))

    code, _, stderr = tp4_cli("build", "--flake", bad, "--runtime", "podman")

    assert code == 1
    assert f"loaded as the line's reference {LINE} itself" in stderr
    assert f"{LINE} is {first_id[:12]} again" in stderr
    assert line_id() == first_id
    assert json.loads((flake / "result-image.json").read_text())["id"] == first_id


def test_check_argv_is_what_the_data_says():
    cpu, gpu, plain = parse_image_checks(
        [
            {
                "name": "bv",
                "file": "tests/test_block_verify.py",
                "env": {"PYTHONPATH": "/opt/dsv41/adapter", "BV_TEST_N": "60000"},
            },
            {
                "name": "g",
                "file": "tests/test_x_gpu.py",
                "args": ["--bench"],
                "gpu": True,
                "workdir": "/opt/dsv41/tests",
            },
            {"name": "imp", "argv": ["python3", "-c", "import b12x"]},
        ],
        "test",
    )
    assert build_mod.check_argv("podman", "abc123", cpu) == [
        "podman",
        "run",
        "--rm",
        "--network",
        "none",
        "-e",
        "BV_TEST_N=60000",
        "-e",
        "CUDA_VISIBLE_DEVICES=",
        "-e",
        "PYTHONPATH=/opt/dsv41/adapter",
        "--entrypoint",
        "python3",
        "abc123",
        "/opt/dsv41/tests/test_block_verify.py",
    ]
    assert build_mod.check_argv("docker", "abc123", gpu, name="n") == [
        "docker",
        "run",
        "--rm",
        "--network",
        "none",
        "--name",
        "n",
        "--gpus",
        "all",
        "--workdir",
        "/opt/dsv41/tests",
        "--entrypoint",
        "python3",
        "abc123",
        "/opt/dsv41/tests/test_x_gpu.py",
        "--bench",
    ]
    assert build_mod.check_argv("podman", "abc123", gpu)[5:7] == ["--device", "nvidia.com/gpu=all"]
    assert build_mod.check_argv("podman", "abc123", plain)[-5:] == [
        "--entrypoint",
        "python3",
        "abc123",
        "-c",
        "import b12x",
    ]
    # a check may hide CUDA itself differently; tp4 does not override it
    own = ImageCheck(name="own", argv=("python3",), env=(("CUDA_VISIBLE_DEVICES", "0"),))
    assert "CUDA_VISIBLE_DEVICES=0" in build_mod.check_argv("podman", "x", own)
    assert [c.name for c in build_mod.select_checks([gpu, cpu, plain], gpu=False)] == ["bv", "imp"]
    assert [c.name for c in build_mod.select_checks([gpu, cpu, plain], gpu=True)] == ["bv", "imp", "g"]


@pytest.mark.parametrize(
    "entry,complaint",
    [
        ({"name": "a", "file": "t.py", "enviroment": {}}, "(a): unknown key enviroment"),
        ({"name": "a"}, "(a): give exactly one of file"),
        ({"name": "a", "file": "t.py", "argv": ["x"]}, "(a): give exactly one of file"),
        ({"name": "a", "file": "/opt/dsv41/t.py"}, "file must be a path relative to /opt/dsv41"),
        ({"name": "a", "file": "../t.py"}, "file must be a path relative to /opt/dsv41"),
        ({"name": "a", "argv": []}, "argv must be a non-empty list of strings"),
        ({"name": "a", "argv": ["x"], "args": ["y"]}, "args must be a list of strings, given with file"),
        ({"name": "a", "file": "t.py", "env": {"BV_TEST_N": 60000}}, "env must be a table"),
        ({"name": "a", "file": "t.py", "env": {"BAD-NAME": "1"}}, "env must be a table"),
        ({"name": "a", "file": "t.py", "gpu": "yes"}, "gpu must be true or false"),
        ({"name": "a", "file": "t.py", "timeout": 0}, "timeout must be a whole number"),
        ({"name": "a", "file": "t.py", "workdir": "tests"}, "workdir must be an absolute path"),
        ({"name": "a b", "file": "t.py"}, "name must be letters"),
        ("a string", "image_check[0]: must be a table"),
    ],
)
def test_image_checks_are_parsed_strictly(entry, complaint):
    with pytest.raises(InvalidInput) as err:
        parse_image_checks([entry], "test")
    assert complaint in str(err.value)


def test_a_check_listed_twice_is_an_error():
    with pytest.raises(InvalidInput, match="'a' is listed twice"):
        parse_image_checks([{"name": "a", "file": "t.py"}, {"name": "a", "argv": ["x"]}], "test")


def test_a_label_that_is_not_json_is_invalid_input():
    assert build_mod.image_checks({}, "img") is None
    assert build_mod.image_checks({"tp4.checks": "[]"}, "img") == ()
    with pytest.raises(InvalidInput, match="tp4.checks label is not JSON"):
        build_mod.image_checks({"tp4.checks": "[{"}, "img")


# upstream's Dockerfile.canary-roce at the pinned M 519a3988 (its in-image test list), in order
UPSTREAM_CPU_TESTS = [
    "thinking_alias",
    "max_new_tokens",
    "loop_abort",
    "fast_load_pacing",
    "fast_load_tp_slice",
    "prefill_sp",
    "fast_load_slab",
    "moe_b12x_next_cpu",
    "wo_a_w8",
    "draft_tau",
    "folded_fence",
    "draft_head_fp8",
    "draft_head_fp8_tp4",
    "block_verify",
    "autotune_keep",
    "replicated_split",
    "verify_cap",
    "roce_ring",
    "indexer_chunked_v3",
]


def test_the_registry_lists_upstreams_in_image_checks():
    checks = load_registry().image_checks
    by_name = {c.name: c for c in checks}
    cpu = [c for c in checks if not c.gpu]
    # step 1's wheels as `python3 -I` sees them, steps 2, 4, 5 import checks, step 6's adapters
    # and the linked trees, then step 8's tests
    assert [c.name for c in cpu[:6]] == [
        "wheels",
        "import-sglang",
        "import-b12x",
        "import-b12x_next",
        "import-adapters",
        "tree-paths",
    ]
    assert [c.name for c in cpu[6:]] == UPSTREAM_CPU_TESTS
    for c in cpu[6:]:
        assert c.argv[:2] == ("python3", f"{RUNTIME_DIR}/tests/test_{c.name}.py")
    assert (
        "import sglang, sglang.srt.models.deepseek_v4, sglang.srt.layers.attention.deepseek_v4_backend, "
        "sglang.srt.models.deepseek_v4_dspark" in by_name["import-sglang"].argv[2]
    )
    assert "roce.API_VERSION" in by_name["import-b12x"].argv[2]
    assert "SOURCE_COMMIT" in by_name["import-b12x_next"].argv[2]
    assert dict(by_name["block_verify"].env)["BV_TEST_N"] == "60000"
    assert dict(by_name["verify_cap"].env)["VC_TEST_N"] == "60000"
    indexer = by_name["indexer_chunked_v3"]
    assert indexer.argv[2:] == ("/sgl-workspace/sglang/python/sglang/srt/layers/attention/deepseek_v4_backend.py",)
    assert indexer.workdir == "/opt/dsv41/tests"
    for c in cpu[6:]:
        if c.name != "roce_ring":  # upstream gives that one no PYTHONPATH
            assert dict(c.env)["PYTHONPATH"].split(":")[0] == "/opt/dsv41/adapter"
    # the wheels upstream pip-installs are in site-packages here too: no check puts them on PYTHONPATH
    assert not [c.name for c in checks if "wheels" in dict(c.env).get("PYTHONPATH", "")]
    assert dict(by_name["import-sglang"].env)["PYTHONPATH"] == ""  # before step 9's ENV
    # the wheels check runs with -I and checks the pins of sources.manifest's wheel rows
    from tp4.image.sources import manifest as mf

    rows = mf.load(Path(__file__).parent.parent / "sources.manifest").rows
    pins = [f"{r.name}=={r.commit}" for r in rows if r.url.startswith("pypi:")]
    assert pins == ["sglang-kernel==0.4.7", "sgl-deep-gemm==0.2.0"]
    assert by_name["wheels"].argv[:3] == ("python3", "-I", "-c") and list(by_name["wheels"].argv[4:]) == pins
    assert by_name["import-adapters"].argv[:3] == ("python3", "-I", "-c")
    assert by_name["import-adapters"].argv[4:] == ("/opt/dsv41/adapter",)
    assert by_name["tree-paths"].argv[4:] == (
        "/opt/dsv41",
        "/opt/b12x",
        "/opt/b12x_next",
        "/sgl-workspace/sglang/python",
    )
    gpu = [c for c in checks if c.gpu]
    assert gpu and all(c.argv[1].startswith(f"{RUNTIME_DIR}/tests/") and c.argv[1].endswith("_gpu.py") for c in gpu)
    # the registry file is the TOML the parser read (no key silently dropped)
    raw = tomllib.loads((Path(__file__).parent.parent / "adapters" / "registry.toml").read_text())["image_check"]
    assert parse_image_checks(raw, "registry") == checks


def test_same_ref_sees_through_podmans_localhost_prefix():
    assert runtime_cli.same_ref("localhost/tp4-test:line", "tp4-test:line")
    assert runtime_cli.same_ref("tp4-test", "localhost/tp4-test:latest")
    assert not runtime_cli.same_ref("localhost/tp4-test:0123abcd", "tp4-test:line")


def test_missing_nix_is_a_clear_error(env, tp4_cli, monkeypatch):
    monkeypatch.setenv("PATH", str(env / "empty-bin"))
    code, _, stderr = tp4_cli("build", "--dry-run", "--flake", image_flake(env / "flake"))
    assert code == 1
    assert "nix is not installed" in stderr and "Nix >= 2.4" in stderr and "flakes" in stderr
    assert "Traceback" not in stderr


def test_old_nix_is_a_clear_error(env, tp4_cli, monkeypatch):
    fake = env / "old-bin" / "nix"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 'nix (Nix) 2.3.16'\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{fake.parent}:{os.environ['PATH']}")
    code, _, stderr = tp4_cli("build", "--flake", image_flake(env / "flake"), "--runtime", "podman")
    assert code == 1
    assert "nix 2.3.16 is too old" in stderr and "Nix >= 2.4" in stderr


def test_no_flake_is_invalid_input(tmp_path, tp4_cli, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TP4_FLAKE", raising=False)
    code, _, stderr = tp4_cli("build", "--dry-run")
    assert code == 2 and "no flake.nix" in stderr


@pytest.mark.parametrize(
    "text,version",
    [
        ("nix (Nix) 2.8.0\n", (2, 8, 0)),
        ("nix (Nix) 2.24.9", (2, 24, 9)),
        ("nix (Determinate Nix 3.6.2) 2.29.0", (3, 6, 2)),
    ],
)
def test_parse_version(text, version):
    assert nix_mod.parse_version(text) == version


def test_parse_version_rejects_garbage():
    with pytest.raises(Tp4Error):
        nix_mod.parse_version("no digits")


def test_log_event_reads_internal_json():
    start = '@nix {"action":"start","id":1,"level":3,"type":105,"text":"building \'/nix/store/x-a.drv\'"}'
    assert nix_mod.log_event(start) == ("progress", "building '/nix/store/x-a.drv'")
    error = '@nix {"action":"msg","level":0,"msg":"\\u001b[31;1merror:\\u001b[0m builder failed"}'
    assert nix_mod.log_event(error) == ("detail", "error: builder failed")
    assert nix_mod.log_event('@nix {"action":"result","id":2,"type":101,"fields":["make: ok"]}') == (
        "detail",
        "make: ok",
    )
    assert nix_mod.log_event('@nix {"action":"stop","id":1}') is None
    assert nix_mod.log_event("plain stderr\n") == ("detail", "plain stderr")


def test_a_failing_build_shows_nix_errors(env, tp4_cli):
    flake = image_flake(env / "flake", label=f"fail-{os.urandom(4).hex()}")
    text = (
        (flake / "flake.nix")
        .read_text()
        .replace('> "$out/label"', '> "$out/label"; echo broken-on-purpose >&2; exit 3')
    )
    (flake / "flake.nix").write_text(text)
    code, _, stderr = tp4_cli("build", "--flake", flake, "--runtime", "podman")
    assert code == 1
    assert "failed with exit code" in stderr and "broken-on-purpose" in stderr
    assert "Traceback" not in stderr


def test_a_broken_image_stream_is_named_and_the_load_stopped(env, tmp_path):
    script = tmp_path / "x-stream-broken"
    script.write_text("#!/bin/sh\nprintf 'not an archive'\necho 'stream: no such layer' >&2\nexit 5\n")
    script.chmod(0o755)
    with pytest.raises(Tp4Error) as err:
        runtime_cli.load(str(script), "podman")
    msg = str(err.value)
    assert msg.startswith(f"`{script}` failed with exit code 5 (in `{script} | podman load`)")
    assert "stream: no such layer" in msg


def test_loaded_ref_from_podman_and_docker_output():
    assert runtime_cli.loaded_ref("Loaded image: localhost/a:b\n") == "localhost/a:b"
    assert runtime_cli.loaded_ref("Loaded image(s): localhost/a:b\n") == "localhost/a:b"
    assert runtime_cli.loaded_ref("Loaded image ID: sha256:abc\n") == "sha256:abc"
    with pytest.raises(Tp4Error):
        runtime_cli.loaded_ref("nothing")


def test_build_image_option_builds_that_variants_attribute(env, tp4_cli):
    from nix_env import SYSTEM

    flake = image_flake(env / "flake", label=f"variant-{os.urandom(4).hex()}")
    code, stdout, stderr = tp4_cli(
        "build", "--dry-run", "--flake", flake, "--runtime", "podman", "--system", SYSTEM, "--image", "canary"
    )
    # the test flake has no image-canary: nix is asked for exactly that attribute
    assert code == 1 and f"packages.{SYSTEM}.image-canary" in stderr, stderr
    code, _, stderr = tp4_cli("build", "--dry-run", "--flake", flake, "--runtime", "podman", "--image", "nope")
    assert code == 2 and "--image: 'nope' is not an image variant" in stderr and "base, canary, canary-roce" in stderr
    code, _, stderr = tp4_cli(
        "build", "--dry-run", "--flake", flake, "--runtime", "podman", "--image", "base", "--attr", "other"
    )
    assert code == 2 and "--image and --attr" in stderr
    code, stdout, stderr = tp4_cli(
        "build", "--dry-run", "--flake", flake, "--runtime", "podman", "--system", SYSTEM, "--image", "canary-roce"
    )
    assert code == 0, stderr
    assert f"build {shlex.quote(f'{flake}#packages.{SYSTEM}.image')} --json" in stdout


def test_pin_summary_lists_flake_first_then_components():
    lines = build_mod.pin_summary({"tp4.pin.b12x-main": "a7d7", "tp4.flake.rev": "abc", "tp4.pin.x": "1", "other": "y"})
    assert lines == ["flake      abc", "b12x-main  a7d7", "x          1"]


def test_system_option_builds_that_systems_package(env, tp4_cli):
    from nix_env import SYSTEM

    flake = image_flake(env / "flake", label=f"sys-{os.urandom(4).hex()}")
    code, stdout, stderr = tp4_cli("build", "--dry-run", "--flake", flake, "--runtime", "podman", "--system", SYSTEM)
    assert code == 0, stderr
    assert f"build {shlex.quote(f'{flake}#packages.{SYSTEM}.image')} --json" in stdout
    code, _, stderr = tp4_cli(
        "build", "--dry-run", "--flake", flake, "--runtime", "podman", "--system", "riscv64-linux"
    )
    assert code == 1 and "packages.riscv64-linux.image" in stderr
