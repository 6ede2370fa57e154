"""`tp4 profile import`: bash-syntax profiles read like bash reads them, and rendered like the
upstream launcher renders them (checked against real bash and tests/upstream_oracle.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tp4.errors import InvalidInput
from tp4.plan import build_plan
from tp4.profile.legacy import import_env_text, parse_env_text
from tp4.profile.load import load_text
from upstream_oracle import bash_source, upstream_argv, upstream_env

pytestmark = pytest.mark.unit

FIXTURE = Path(__file__).parent / "fixtures" / "env.tp4.production"


def render_import(text: str, source: str = "t.env", **kw):
    result = import_env_text(text, source, **kw)
    return result, build_plan(load_text(result.toml, "imported"))


def assert_same_as_upstream(env_path: Path, plan) -> None:
    variables = bash_source(str(env_path))
    for node in plan.nodes:
        expected = upstream_env(variables, node.rank)
        assert node.env == expected, {k: (node.env.get(k), expected.get(k)) for k in set(node.env) | set(expected) if node.env.get(k) != expected.get(k)}
        assert node.argv == upstream_argv(expected)


def test_production_env_file_imports_to_the_upstream_line():
    result, plan = render_import(FIXTURE.read_text(), str(FIXTURE))
    assert_same_as_upstream(FIXTURE, plan)
    assert result.unknown == []
    assert plan.image["variant"] == "canary-roce" and plan.line["ep"] == 1


def test_production_env_file_equals_the_production_preset():
    from tp4.profile import load_default

    _, imported = render_import(FIXTURE.read_text(), head_checkout="/home/zurih/dsv41-4x-spark")
    default = build_plan(load_default())
    for a, b in zip(imported.nodes, default.nodes, strict=True):
        assert (a.env, a.argv, a.run) == (b.env, b.argv, b.run)


def test_parser_agrees_with_bash_on_the_fixture():
    assignments, _ = parse_env_text(FIXTURE.read_text())
    ours = {a.name: a.value for a in assignments}
    assert ours == {k: v for k, v in bash_source(str(FIXTURE)).items() if k in ours}
    assert set(bash_source(str(FIXTURE))) - {"HOME", "PWD", "SHLVL", "_", "OLDPWD"} <= set(ours)


BASH_CASES = [
    ('A="x y"\n', "x y"),
    ("A='$HOME $B'\n", "$HOME $B"),
    ('B=z\nA="${B}-$B"\n', "z-z"),
    ('A=${UNSET:-fallback}\n', "fallback"),
    ('A=plain # trailing comment\n', "plain"),
    ('export A=exported\n', "exported"),
    ('A="esc \\" \\$x"\n', 'esc " $x'),
    ('A=first\nA=second\n', "second"),
    ('A=a\\ b\n', "a b"),
    ('A="multi\nline"\n', "multi\nline"),
]


@pytest.mark.parametrize("text,value", BASH_CASES)
def test_bash_value_syntax(tmp_path, text, value):
    f = tmp_path / "e"
    f.write_text(text)
    assert bash_source(str(f))["A"] == value  # the case is really bash's behaviour
    assignments, _ = parse_env_text(text)
    assert [a for a in assignments if a.name == "A"][-1].value == value


@pytest.mark.parametrize("text,needle", [
    ("A=x y\n", "quoted"),
    ("A=$(hostname)\n", "command substitution"),
    ("A=`hostname`\n", "command substitution"),
    ('A="unterminated\n', "unterminated"),
    ("if true; then A=1; fi\n", "not a KEY=VALUE"),
])
def test_bash_constructs_we_refuse_name_the_line(text, needle):
    with pytest.raises(InvalidInput) as exc:
        parse_env_text("# header\n" + text, "p.env")
    assert "line 2" in str(exc.value) and needle in str(exc.value)


def test_home_becomes_tilde():
    result, plan = render_import(FIXTURE.read_text())
    assert result.document["model"]["dir"] == "~/NewModels/DeepSeek-V4.1-Flash"
    assert plan.nodes[0].run["mounts"][0]["source"] == "/home/zurih/NewModels/DeepSeek-V4.1-Flash"


def test_unknown_keys_are_reported_not_dropped_silently(tp4_cli, tmp_path):
    env = tmp_path / "x.env"
    env.write_text(FIXTURE.read_text() + "MYSTERY_KNOB=7\nDSV41_TYPO_GATE=1\n")
    out = tmp_path / "p.toml"
    code, stdout, stderr = tp4_cli("profile", "import", env, "-o", out)
    assert code == 0, stderr
    assert "unknown: MYSTERY_KNOB" in stderr and "unknown: DSV41_TYPO_GATE" in stderr


def test_loop_abort_values_keep_the_names_the_adapter_reads(tmp_path):
    # upstream forwards DSV41_LOOP_NGRAM/_REPEATS/_LINE_REPEATS (§1.6); a non-default value must
    # reach the container under that name
    env = tmp_path / "loop.env"
    env.write_text(FIXTURE.read_text().replace("DSV41_LOOP_NGRAM=32", "DSV41_LOOP_NGRAM=16")
                   .replace("DSV41_LOOP_REPEATS=4", "DSV41_LOOP_REPEATS=3")
                   .replace("DSV41_LOOP_LINE_REPEATS=8", "DSV41_LOOP_LINE_REPEATS=5"))
    result, plan = render_import(env.read_text())
    assert result.unknown == []
    assert result.document["gates"]["DSV41_LOOP_NGRAM"] == "16"
    for node in plan.nodes:
        assert (node.env["DSV41_LOOP_NGRAM"], node.env["DSV41_LOOP_REPEATS"], node.env["DSV41_LOOP_LINE_REPEATS"]) == ("16", "3", "5")
        assert not any(k.startswith("DSV41_LOOP_ABORT_") for k in node.env)
    assert_same_as_upstream(env, plan)


def test_the_misread_loop_abort_names_are_unknown():
    # nothing upstream reads DSV41_LOOP_ABORT_NGRAM: reported, never rendered
    result, plan = render_import(FIXTURE.read_text() + "DSV41_LOOP_ABORT_NGRAM=16\n")
    assert result.unknown == ["DSV41_LOOP_ABORT_NGRAM"]
    assert "DSV41_LOOP_ABORT_NGRAM" not in plan.nodes[0].env and plan.nodes[0].env["DSV41_LOOP_NGRAM"] == "32"


def test_upstream_validation_rules_of_the_legacy_items():
    base = FIXTURE.read_text()
    cases = [
        (base + 'EXTRA_CONTAINER_ENV="DSV41_INDEXER_CHUNKED=1 9BAD=1"\n', "9BAD=1"),
        (base + 'WORKER_HOSTS="a b"\n', "WORKER_HOSTS"),
        (base + "NCCL_OVERLAY_PIP=2\n", "NCCL_OVERLAY_PIP"),
        (base + "NCCL_SWITCHLESS_RING_ONLY=yes\n", "NCCL_SWITCHLESS_RING_ONLY"),
        (base + "NCCL_WORKER_DIR=relative/dir\n", "NCCL_WORKER_DIR"),
        (base + "NNODES=5\n", "NNODES"),
        (base + 'EXTRA_CONTAINER_ENV="NODE_RANK=2"\n', "NODE_RANK"),
    ]
    for text, needle in cases:
        with pytest.raises(InvalidInput) as exc:
            import_env_text(text, "p.env")
        assert needle in str(exc.value), (needle, str(exc.value))


def test_invalid_imported_line_names_the_legacy_variable():
    text = FIXTURE.read_text().replace("EP_SIZE=1   # production", "EP_SIZE=3   # production")
    with pytest.raises(InvalidInput) as exc:
        import_env_text(text, "p.env")
    # in the file's terms (the variable, its value and line), and the profile field
    line = next(i for i, t in enumerate(text.splitlines(), 1) if t.startswith("EP_SIZE=3"))
    assert f"p.env line {line}: EP_SIZE=3: " in str(exc.value) and "(profile field engine.ep)" in str(exc.value)


def test_api_key_is_never_written_or_printed(tp4_cli, tmp_path):
    env = tmp_path / "k.env"
    env.write_text(FIXTURE.read_text() + "API_KEY=sk-live-abcdef\nWORKER_PASS=hunter2\n")
    out = tmp_path / "p.toml"
    code, stdout, stderr = tp4_cli("profile", "import", env, "-o", out)
    assert code == 0
    for secret in ("sk-live-abcdef", "hunter2"):
        assert secret not in out.read_text() and secret not in stdout and secret not in stderr
    assert "api.key_file" in stderr


def test_failed_import_writes_nothing(tp4_cli, tmp_path):
    env = tmp_path / "bad.env"
    env.write_text("WORKER_IPS=\"10.0.0.2\"\nCONTEXT_LENGTH=12\n")
    out = tmp_path / "p.toml"
    code, _, stderr = tp4_cli("profile", "import", env, "-o", out)
    assert code == 2 and "engine.context_length" in stderr
    assert not out.exists() and list(tmp_path.iterdir()) == [env]


# --- generated legacy profiles: import + render == bash + upstream rules ---------------------------

EXTRA_LINES = {
    # (image tag, BUILD_DOCKERFILE, EP): EXTRA_CONTAINER_ENV lines of §2.4 valid for that image
    ("dsv41-4x-spark:local", "Dockerfile", "2"): ["DSV41_INDEXER_CHUNKED=1"],
    ("dsv41-4x-spark:canary", "Dockerfile.canary", "2"): [
        "DSV41_INDEXER_CHUNKED=1 SGLANG_DSPARK_FOLDED_SAMPLING=2 SGLANG_RUST_BUILD_MODE=never"],
    ("dsv41-4x-spark:canary-roce", "Dockerfile.canary-roce", "2"): [
        "DSV41_INDEXER_CHUNKED=1 SGLANG_DSPARK_FOLDED_SAMPLING=2 SGLANG_RUST_BUILD_MODE=never SGLANG_ROCE_ALLREDUCE=1 "
        "SGLANG_ROCE_MAX_SIZE=2097152 B12X_ROCE_HCA=rocep1s0f0,roceP2p1s0f0 B12X_ROCE_CACHE_DIR=/state/b12x-roce "
        "B12X_COMPILE_CACHE_DIR=/state/b12x-compile NCCL_IB_QPS_PER_CONNECTION=1"],
}

quoting = st.sampled_from(["plain", "double", "single"])


def quote(value: str, style: str) -> str:
    if style == "double" or (style == "plain" and (" " in value or "^" in value)):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$") + '"'
    if style == "single" and "'" not in value:
        return f"'{value}'"
    return value if " " not in value else '"' + value + '"'


@st.composite
def legacy_profiles(draw):
    (tag, dockerfile, ep), extras = draw(st.sampled_from(sorted(EXTRA_LINES.items())))
    values = {
        "HEAD_IP": "10.0.0.1",
        "WORKER_IPS": "10.0.0.2 10.0.0.3 10.0.0.4",
        "WORKER_HOSTS": " ".join(draw(st.lists(st.from_regex(r"[a-z][a-z0-9-]{0,10}", fullmatch=True), min_size=3, max_size=3, unique=True).filter(lambda xs: "head" not in xs))),
        "IMAGE": tag, "BUILD_DOCKERFILE": dockerfile, "TP_SIZE": "4", "EP_SIZE": ep,
        "CONTEXT_LENGTH": str(draw(st.integers(4096, 1048576))),
        "MAX_RUNNING_REQUESTS": str(draw(st.integers(1, 7))),
        "CHUNKED_PREFILL_SIZE": str(draw(st.sampled_from([512, 1024, 2048, 4096]))),
        "MEM_FRACTION_STATIC": draw(st.sampled_from(["0.80", "0.9", "0.75", "0.944"])),
        "DSPARK_BLOCK_SIZE": str(draw(st.integers(1, 8))),
        "DSV41_CACHE_GIB": str(draw(st.integers(0, 16))),
        "NCCL_DEBUG": draw(st.sampled_from(["WARN", "INFO"])),
        "IB_HCA": draw(st.sampled_from(["rocep1s0f0,roceP2p1s0f0", "rocep1s0f0,rocep1s0f1", "rocep1s0f0"])),
        "NCCL_PROTO": draw(st.sampled_from(["^LL128", "LL,LL128,Simple"])),
        "EXTRA_SGLANG_ARGS": draw(st.sampled_from(["", "--watchdog-timeout 1800", "--enable-metrics --sleep-on-idle"])),
        "DSV41_SHARED_PAD_K": draw(st.sampled_from(["0", "1"])),
        "EXTRA_CONTAINER_ENV": draw(st.sampled_from(extras)),
        "MAX_TOTAL_TOKENS": str(draw(st.sampled_from([0, 320000, 8000000]))),
    }
    if values["CHUNKED_PREFILL_SIZE"] == "4096" and "DSV41_INDEXER_CHUNKED=1" not in values["EXTRA_CONTAINER_ENV"]:
        values["CHUNKED_PREFILL_SIZE"] = "2048"
    drop = draw(st.sets(st.sampled_from(["CONTEXT_LENGTH", "DSV41_CACHE_GIB", "NCCL_PROTO", "IB_HCA", "MAX_TOTAL_TOKENS",
                                          "EXTRA_SGLANG_ARGS", "DSPARK_BLOCK_SIZE", "MEM_FRACTION_STATIC"])))
    lines = ["# generated"]
    for key, value in values.items():
        if key in drop:
            lines.append(f"# {key}={value}")
            continue
        lines.append(f"{key}={quote(value, draw(quoting))}")
    return "\n".join(lines) + "\n"


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=legacy_profiles())
def test_generated_legacy_profiles_render_like_upstream(tmp_path, text):
    path = tmp_path / "gen.env"
    path.write_text(text)
    result, plan = render_import(text)
    assert_same_as_upstream(path, plan)
    again = build_plan(load_text(import_env_text(text, "x").toml, "again"))
    assert [n.env for n in again.nodes] == [n.env for n in plan.nodes]
    assert "NCCL_IB_QPS_PER_CONNECTION" not in result.unknown
