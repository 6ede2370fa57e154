"""README.md stays true: its two commands, its walk-through (the steps that run offline, run in
order), where the CLI reads its data from, every relative link of README.md and docs/*.md, and the
profile reference in docs/profile.md generated from the models."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from tp4.line.profile.reference import BEGIN, END, generate

MAIN = "bash python/setup.sh && .venv/bin/tp4 plan"
TESTS = "bash tests/run"
# the walk-through's steps that need no Spark, no Nix 2.18 and no network (the others say `# needs ...`)
OFFLINE_STEPS = [
    "tp4 profile check profile.toml",
    "tp4 hosts list",
    "tp4 up --profile profile.toml --dry-run",
    "tp4 sources verify",
    "tp4 plan --profile profile.toml",
    "tp4 plan --profile profile.toml --json -o plan.json",
    "tp4 plan --profile profile.toml --check plan.json",
]


def test_readme_states_the_two_commands_and_ci_runs_the_test_command(repo):
    readme = (repo / "README.md").read_text()
    assert MAIN in readme and TESTS in readme
    assert re.search(r"^exec bash tests/run$", (repo / ".ci/run").read_text(), re.M)


def test_profile_reference_is_generated_in_docs_profile(repo):
    doc = (repo / "docs" / "profile.md").read_text()
    section = doc[doc.index(BEGIN) : doc.index(END) + len(END)]
    assert section == generate(), (
        "docs/profile.md's profile reference is stale: regenerate it with `tp4 profile reference`"
    )
    assert BEGIN not in (repo / "README.md").read_text(), "the reference lives in docs/profile.md only"


def test_readme_is_the_overview_and_speaks_to_an_operator(repo):
    readme = (repo / "README.md").read_text()
    assert len(readme.splitlines()) < 250
    headings = re.findall(r"^### (\d)\. (.+)$", readme, re.M)
    assert [h[1] for h in headings] == ["Hosts", "Prepare", "Build", "Deploy or serve", "Verify", "Measure"]
    # words an operator of the line does not know
    for name in ["README.md", *sorted(str(p.relative_to(repo)) for p in (repo / "docs").glob("*.md"))]:
        text = (repo / name).read_text()
        for word in (r"the seed\b", r"\bthe issue\b", r"\bissue \d", r"upstream's author", r"\bcoming\b"):
            assert not re.search(word, text, re.I), f"{name}: {word}"


def _walkthrough(repo: Path) -> str:
    readme = (repo / "README.md").read_text()
    return readme[
        readme.index("## The job, step by step") : readme.index("\n## ", readme.index("## The job, step by step") + 5)
    ]


def _steps(section: str) -> list[str]:
    lines = []
    for block in re.findall(r"^```bash\n(.*?)^```$", section, re.M | re.S):
        lines += [line.strip() for line in block.splitlines() if line.strip().startswith("tp4 ")]
    return lines


def test_walkthrough_offline_steps_run_in_order(repo, tmp_path):
    """Every step of the walk-through that needs no Spark runs, in the README's order, on the
    README's own profile, from a directory outside the checkout."""
    section = _walkthrough(repo)
    steps = _steps(section)
    assert len(steps) >= 15, steps
    offline = [s for s in steps if "# needs " not in s]
    assert [s.split("#")[0].strip() for s in offline] == OFFLINE_STEPS
    profile = re.search(r"^```toml\n(.*?)^```$", section, re.M | re.S)
    assert profile is not None
    (tmp_path / "profile.toml").write_text(profile.group(1))
    env = {k: v for k, v in os.environ.items() if k != "TP4_PROFILE"}
    env.update(PYTHONPATH=str(repo / "python"), TP4_KNOWN_HOSTS=str(tmp_path / "known_hosts"))
    for step in offline:
        argv = [sys.executable, "-m", "tp4", *shlex.split(step.split("#")[0])[1:]]
        proc = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, f"{step}: {proc.stdout[-1000:]}{proc.stderr[-2000:]}"
        assert "Traceback" not in proc.stderr, step
        if step.startswith("tp4 up "):
            _rehearses_every_step_on_the_readmes_hosts(proc.stdout, profile.group(1))
    assert (tmp_path / "plan.json").is_file()
    assert not (tmp_path / "known_hosts").exists()  # no step asked a host (the README's do not exist)


def _rehearses_every_step_on_the_readmes_hosts(out: str, profile: str) -> None:
    """`tp4 up --dry-run` on the README's profile: the six steps in order, and every host of the
    profile named by the commands run on it, over ssh to its address."""
    from tp4.serving.up import STEPS

    headings = [line for line in out.splitlines() if line.startswith("step ")]
    assert headings == [f"step {i + 1}/6: {name}" for i, name in enumerate(STEPS)], out
    hosts = re.findall(r'^name = "([^"]+)"\nip = "([^"]+)"', profile, re.M)
    assert len(hosts) == 4, profile
    for name, ip in hosts:
        assert re.search(rf"^  {re.escape(name)}: ssh .*@{re.escape(ip)} ", out, re.M), (name, out)


def _slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(text: str) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for heading in re.findall(r"^#{1,6} (.+)$", re.sub(r"^```.*?^```$", "", text, flags=re.M | re.S), re.M):
        slug = _slug(heading)
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out | set(re.findall(r'<a (?:id|name)="([^"]+)"', text))


def test_every_relative_link_of_readme_and_docs_points_at_a_file_and_anchor(repo):
    broken = []
    pages = [repo / "README.md", *sorted((repo / "docs").glob("*.md"))]
    for page in pages:
        text = re.sub(r"^```.*?^```$", "", page.read_text(), flags=re.M | re.S)
        text = re.sub(r"`[^`\n]*`", "", text)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{page.relative_to(repo)}: {target}")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest.read_text()):
                broken.append(f"{page.relative_to(repo)}: {target} (no such heading)")
    assert broken == []


def test_anchors_are_the_ones_github_makes():
    assert _anchors(
        '# Title\n## 1. Hosts\n## Which profile a command uses\n```\n# not a heading\n```\n<a id="x"></a>\n'
    ) == {
        "title",
        "1-hosts",
        "which-profile-a-command-uses",
        "x",
    }


def _copy_checkout(repo: Path, copy: Path) -> None:
    files = (
        subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=repo,
            capture_output=True,
            check=True,
        )
        .stdout.decode()
        .split("\0")
    )
    for name in filter(None, files):
        src = repo / name
        dst = copy / name
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            dst.symlink_to(src.readlink())
        elif src.is_file():
            shutil.copy2(src, dst)


def test_main_command_works_on_a_copy_of_the_checkout(repo, tmp_path):
    """The README's first command on a fresh copy: a new venv, tp4 installed editable from the
    copy, plan printed; an edit of the copy's adapters/registry.toml or of a preset reaches the
    next command, as the README says. The wheel still carries its own data."""
    copy = tmp_path / "checkout"
    _copy_checkout(repo, copy)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TP4_PROFILE")}
    proc = subprocess.run(["bash", "-c", MAIN], cwd=copy, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "rank 3 (worker)" in proc.stdout and "RoCEnante ready: world=4" in proc.stdout
    tp4 = str(copy / ".venv/bin/tp4")
    where = subprocess.run(
        [str(copy / ".venv/bin/python"), "-c", "import tp4; print(tp4.__file__)"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert where.stdout.strip() == str(copy / "python/tp4/__init__.py"), "not an editable install of the checkout"
    # edits in the checkout reach the CLI: the registry (through adapters/registry.toml) and a preset
    registry = copy / "adapters/registry.toml"
    text = registry.read_text()
    assert "RoCEnante ready: world={TP_SIZE}" in text
    registry.write_text(text.replace("RoCEnante ready: world={TP_SIZE}", "RoCEnante edited: world={TP_SIZE}"))
    preset = copy / "python/tp4/data/presets/production.toml"
    assert 'DSV41_DRAFT_TAU = "0.7"' in preset.read_text()
    preset.write_text(preset.read_text().replace('DSV41_DRAFT_TAU = "0.7"', 'DSV41_DRAFT_TAU = "0.6"'))
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    plan = subprocess.run([tp4, "plan"], cwd=outside, env=env, capture_output=True, text=True, timeout=60)
    assert plan.returncode == 0, plan.stderr
    assert "RoCEnante edited: world=4" in plan.stdout and "RoCEnante ready" not in plan.stdout
    assert "DSV41_DRAFT_TAU=0.6" in plan.stdout and "DSV41_DRAFT_TAU=0.7" not in plan.stdout
    listing = subprocess.run([tp4, "sources", "list"], cwd=outside, env=env, capture_output=True, text=True, timeout=60)
    assert listing.returncode == 0, listing.stderr
    assert "b12x-main" in listing.stdout and "tree b12x-next" in listing.stdout
    # the wheel (what `nix run` and a pip install of the package have) carries its own data, not links
    # into a checkout
    dist = tmp_path / "dist"
    wheel = subprocess.run(
        [str(copy / ".venv/bin/pip"), "wheel", "-q", "--no-deps", "-w", str(dist), str(repo / "python")],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert wheel.returncode == 0, wheel.stderr[-2000:]
    with zipfile.ZipFile(next(dist.glob("tp4-*.whl"))) as whl:
        names = set(whl.namelist())
        assert {"tp4/data/registry.toml", "tp4/data/presets/production.toml"} <= names
        assert whl.read("tp4/data/sources.manifest").decode() == (repo / "sources.manifest").read_text()


def test_the_root_tracks_no_empty_file(repo):
    """A stray output redirect (an empty `oom` once) is not part of the repository."""
    names = subprocess.run(["git", "ls-files"], cwd=repo, capture_output=True, text=True, check=True).stdout.split()
    empty = [n for n in names if "/" not in n and (repo / n).is_file() and (repo / n).stat().st_size == 0]
    assert empty == []


def test_every_commands_help_speaks_to_an_operator():
    """What `tp4 ... --help` prints uses no word an operator does not know (as README and docs)."""
    import click

    from tp4.cli import cli

    found = []

    def walk(cmd: click.Command, path: list[str]) -> None:
        ctx = click.Context(cmd, info_name=" ".join(path))
        text = " ".join((cmd.get_help(ctx) + " " + (cmd.get_short_help_str(200) if path else "")).split())
        for word in (r"the seed\b", r"\bthe issue\b", r"\bissue \d", r"upstream's author"):
            if re.search(word, text, re.I):
                found.append(f"{' '.join(path)}: {word}")
        if isinstance(cmd, click.Group):
            for name in cmd.list_commands(ctx):
                sub = cmd.get_command(ctx, name)
                if sub is not None:
                    walk(sub, [*path, name])

    walk(cli, ["tp4"])
    assert found == []


def test_every_preset_as_shown_speaks_to_an_operator(tp4_cli):
    """`tp4 profile show-preset NAME` prints the preset's file, its comments included."""
    from tp4.line.profile.load import PRESETS

    for preset in sorted(PRESETS.glob("*.toml")):
        code, out, err = tp4_cli("profile", "show-preset", preset.stem)
        assert code == 0, err
        text = " ".join(out.split())
        for word in (r"\bseed\b", r"\bthe issue\b", r"\bissue \d", r"upstream's author"):
            assert not re.search(word, text, re.I), f"{preset.stem}: {word}"
