"""`tp4 build`: build the image with nix, load it into the head's container runtime, run its
in-image checks, and only then tag it for the line and report its pins.

The image is the flake's ``packages.<system>.image``: a dockerTools stream script (or, for other
flakes, an image tarball). It is loaded under its own content-derived tag (the candidate); the
checks it carries (label ``tp4.checks``, the registry's ``[[image_check]]`` list) each run in a
throwaway container of it, and only when all pass does it get the line's reference (label
``tp4.line.ref``) and is recorded next to the out-link (``result-image.json``) for
`tp4 distribute`. A failure removes the candidate and leaves the line's image and record as they were.
A tagged image is then pushed into the head's image store (:mod:`tp4.image.imagestore`; only blobs it
lacks are uploaded) and its manifest digest recorded next to the build record
(``result-image.store.json``), which `tp4 distribute` pulls by.
"""

from __future__ import annotations

import json
import os
import shlex
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from tp4.core import process

from tp4.image import baseimage, nix, runtime_cli
from tp4.core.errors import InvalidInput, Tp4Error
from tp4.core.privatefiles import replace_file
from tp4.line.registry import ImageCheck, parse_image_checks

PIN_PREFIX = "tp4.pin."
FLAKE_REV_LABEL = "tp4.flake.rev"
LINE_REF_LABEL = "tp4.line.ref"
CHECKS_LABEL = "tp4.checks"
OUTPUT_TAIL = 20
Echo = Callable[[str], None]


@dataclass(frozen=True)
class Built:
    """An image built by nix and loaded on the head."""

    out_path: str
    ref: str
    id: str

    def save(self, path: Path) -> None:
        replace_file(path, json.dumps(asdict(self), indent=2) + "\n")

    @classmethod
    def load(cls, path: Path) -> Built:
        try:
            data = json.loads(path.read_text())
            return cls(out_path=data["out_path"], ref=data["ref"], id=data["id"])
        except FileNotFoundError:
            raise Tp4Error(f"{path} does not exist: run `tp4 build` first, or pass --image") from None
        except (ValueError, KeyError) as exc:
            raise Tp4Error(f"{path} is not a tp4 build record ({exc}): run `tp4 build` again") from None


@dataclass(frozen=True)
class Pushed:
    """The build's image in the head's image store: manifest ``repo@digest`` of image ``id``."""

    id: str
    repo: str
    digest: str

    def save(self, path: Path) -> None:
        replace_file(path, json.dumps(asdict(self), indent=2) + "\n")

    @classmethod
    def load(cls, path: Path) -> Pushed | None:
        """The record, or None when there is none (or an unreadable one: distribute pushes again)."""
        try:
            data = json.loads(path.read_text())
            return cls(id=str(data["id"]), repo=str(data["repo"]), digest=str(data["digest"]))
        except (OSError, ValueError, KeyError, TypeError):
            return None


def store_record_path(flake: Path, attr: str) -> Path:
    return out_link(flake, attr).with_name(out_link(flake, attr).name + ".store.json")


def push_to_store(runtime: str, built: Built, record: Path, progress: Echo) -> Pushed | None:
    """Push the image into the head's image store and record its digest; a store that cannot
    be started or pushed to is a warning (`tp4 distribute` pushes then, or --method archive)."""
    from tp4.image import imagestore

    record.unlink(missing_ok=True)
    try:
        store = imagestore.start()
        progress(f"pushing {built.id[:12]} to the image store {store.url}/{imagestore.DEFAULT_REPO}")
        digest = imagestore.push(runtime, built.id, store)
    except Tp4Error as exc:
        progress(
            f"warning: the image is not in the head's image store ({exc}); `tp4 distribute` pushes it, "
            "or use `tp4 distribute --method archive`"
        )
        return None
    pushed = Pushed(id=built.id, repo=imagestore.DEFAULT_REPO, digest=digest)
    pushed.save(record)
    return pushed


def pin_summary(labels: dict[str, str]) -> list[str]:
    """`component  commit` lines from the image's labels, the flake revision first."""
    pins = [("flake", labels[FLAKE_REV_LABEL])] if FLAKE_REV_LABEL in labels else []
    pins += [(k[len(PIN_PREFIX) :], v) for k, v in sorted(labels.items()) if k.startswith(PIN_PREFIX)]
    width = max((len(name) for name, _ in pins), default=0)
    return [f"{name:<{width}}  {value}" for name, value in pins]


def image_attr(variant: str) -> str:
    """The flake attribute of a variant's image: the registry's `[images.<variant>].attr`, the
    table pkgs/default.nix builds the images from."""
    from tp4.line.registry import load_registry

    images = load_registry().images
    if variant not in images:
        raise InvalidInput(f"--image: {variant!r} is not an image variant; fix: use one of {', '.join(images)}")
    return images[variant].attr


def out_link(flake: Path, attr: str) -> Path:
    return flake / f"result-{attr.replace('.', '-')}"


def record_path(flake: Path, attr: str) -> Path:
    return out_link(flake, attr).with_name(out_link(flake, attr).name + ".json")


def _missing_output_hint(exc: Tp4Error, system: str | None) -> Tp4Error:
    """The image exists for aarch64-linux only: say so when nix cannot find it on another host."""
    if system is None and "does not provide attribute" in exc.message and os.uname().machine != "aarch64":
        return Tp4Error(
            exc.message + "\nhint: the image is built for aarch64-linux (the Sparks): run tp4 build "
            "on a Spark, or pass --system aarch64-linux with an aarch64 builder configured in nix"
        )
    return exc


# --- in-image checks ------------------------------------------------------------------------------


def image_checks(labels: dict[str, str], image: str) -> tuple[ImageCheck, ...] | None:
    """The checks an image carries (label tp4.checks: the registry's list as JSON), parsed as
    strictly as the registry; None when the image carries no list."""
    raw = labels.get(CHECKS_LABEL)
    if raw is None:
        return None
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise InvalidInput(f"the image {image}: its {CHECKS_LABEL} label is not JSON ({exc})") from None
    return parse_image_checks(data, f"the image {image}, label {CHECKS_LABEL}")


def select_checks(checks: Sequence[ImageCheck], *, gpu: bool) -> tuple[ImageCheck, ...]:
    """The CPU checks in their order, then (with ``gpu``) the GPU ones."""
    return tuple(c for c in checks if not c.gpu) + (tuple(c for c in checks if c.gpu) if gpu else ())


def check_argv(runtime: str, image: str, check: ImageCheck, *, name: str | None = None) -> list[str]:
    """`<runtime> run` of one check: a throwaway container without network, the check's env
    (a CPU check also gets CUDA_VISIBLE_DEVICES="", as in a GPU-less `docker build`, even where
    the runtime would hand it a GPU), the node's GPUs for a gpu check."""
    argv = [runtime, "run", "--rm", "--network", "none"]
    if name:
        argv += ["--name", name]
    if check.gpu:
        argv += runtime_cli.GPU_FLAGS[runtime]
    env = dict(check.env)
    if not check.gpu:
        env.setdefault("CUDA_VISIBLE_DEVICES", "")
    for key in sorted(env):
        argv += ["-e", f"{key}={env[key]}"]
    if check.workdir:
        argv += ["--workdir", check.workdir]
    return [*argv, "--entrypoint", check.argv[0], image, *check.argv[1:]]


@dataclass(frozen=True)
class CheckResult:
    name: str
    ok: bool
    seconds: float
    reason: str  # why it failed: "exit code 1", "timed out after 1800 s"; "" when it passed
    output: str  # stdout and stderr, interleaved


def run_check(runtime: str, image: str, check: ImageCheck) -> CheckResult:
    """Run one check to completion (or its timeout); a check that cannot even start fails too."""
    name = f"tp4-check-{os.getpid()}-{check.name}"
    argv = check_argv(runtime, image, check, name=name)
    start = time.monotonic()
    proc = process.start(argv, stdout=process.PIPE, stderr=process.STDOUT, text=True, errors="replace")
    try:
        output, _ = proc.communicate(timeout=check.timeout)
        reason = "" if proc.returncode == 0 else f"exit code {proc.returncode}"
    except process.TimeoutExpired:
        runtime_cli.remove_container(runtime, name)
        proc.kill()
        output, _ = proc.communicate()
        reason = f"timed out after {check.timeout} s"
    except BaseException:  # Ctrl-C: the container goes with it
        runtime_cli.remove_container(runtime, name)
        process.stop(proc)
        raise
    return CheckResult(check.name, not reason, time.monotonic() - start, reason, output or "")


def _last_line(output: str, width: int = 100) -> str:
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    last = lines[-1] if lines else ""
    return last if len(last) <= width else last[: width - 3] + "..."


def result_lines(result: CheckResult, width: int) -> list[str]:
    """`ok   name  1.2 s  <its last output line>`, or `FAIL name  1.2 s  exit code 1` and the
    tail of its output."""
    head = f"{'ok' if result.ok else 'FAIL':<4} {result.name:<{width}}  {result.seconds:5.1f} s"
    detail = _last_line(result.output) if result.ok else result.reason
    lines = [f"{head}  {detail}" if detail else head]
    if not result.ok:
        lines += [f"     | {line}" for line in result.output.rstrip().splitlines()[-OUTPUT_TAIL:]]
    return lines


def run_checks(runtime: str, image: str, checks: Sequence[ImageCheck], out: Echo, progress: Echo) -> list[CheckResult]:
    """Every check in order (a failure does not stop the others), one result line each and a
    summary on ``out``; which one is running on ``progress`` (`tp4 -v` shows its command)."""
    width = max(len(c.name) for c in checks)
    results = []
    for number, check in enumerate(checks, 1):
        progress(f"check {number}/{len(checks)}: {check.name}" + (f" ({check.summary})" if check.summary else ""))
        result = run_check(runtime, image, check)
        results.append(result)
        for line in result_lines(result, width):
            out(line)
    failed = [r.name for r in results if not r.ok]
    out(
        f"checks: {len(results) - len(failed)} passed, {len(failed)} failed"
        + (f": {', '.join(failed)}" if failed else "")
    )
    return results


# --- build ----------------------------------------------------------------------------------------


def dry_run(
    flake: Path, attr: str, runtime: str, echo: Echo, *, system: str | None = None, gpu_tests: bool = False
) -> None:
    """Print the exact commands `tp4 build` runs and the store paths involved; build nothing."""
    nix.require(flake)
    target = nix.installable(str(flake), attr, system)
    try:
        _dry_run(target, flake, attr, runtime, echo, gpu_tests)
    except Tp4Error as exc:
        raise _missing_output_hint(exc, system) from None


def _dry_run(target: str, flake: Path, attr: str, runtime: str, echo: Echo, gpu_tests: bool) -> None:
    link = out_link(flake, attr)
    out_path = nix.eval_raw(target + ".outPath")
    drv = nix.derivation(target)
    plan = nix.dry_run(target)
    run = [
        runtime,
        "run",
        "--rm",
        "--network",
        "none",
        "-e",
        "CUDA_VISIBLE_DEVICES=",
        "-e",
        "<env>",
        "--entrypoint",
        "<command>",
        "<image id>",
        "<args>",
    ]
    echo("commands:")
    if baseimage.expected(target) is not None:  # the base first, read against its row
        echo(f"  $ {shlex.join(nix.build_argv(target + '.base', flake / 'result-image-base'))}")
        echo(f"  $ {shlex.join([runtime, 'load', '-i', '<base archive>'])}    # unless {runtime} has its image id")
        probe = baseimage.probe_argv(runtime, "<base image>", "tp4-base-probe-<pid>")
        echo(f"  $ {shlex.join(probe[:-1])} <probe script>    # glibc, python, gcc, verbs, packages vs the base row")
    echo(f"  $ {shlex.join(nix.build_argv(target, link))}")
    for line in describe_load_image(out_path, runtime):
        echo(f"  $ {line}")
    echo(
        f"  $ {shlex.join([runtime, 'image', 'inspect', '--format', '{{.Id}} {{json .Config.Labels}}', '<loaded image>'])}"
    )
    echo(f"  $ {shlex.join(run)}    # each CPU check of the image's {CHECKS_LABEL} label")
    if gpu_tests:
        gpu = [*run[:5], *runtime_cli.GPU_FLAGS[runtime], *run[7:]]
        echo(f"  $ {shlex.join(gpu)}    # each gpu check (--gpu-tests)")
    echo(f"  $ {shlex.join([runtime, 'tag', '<image id>', f'<{LINE_REF_LABEL} label>'])}    # when every check passed")
    echo(f"  $ {shlex.join([runtime, 'rmi', '<loaded image>'])}")
    echo("store paths:")
    echo(f"  image       {out_path}")
    echo(f"  derivation  {drv}")
    if plan.build:
        echo(f"  to build ({len(plan.build)}):")
        for p in plan.build:
            echo(f"    {p}")
    else:
        echo("  to build: nothing (already in the store)")
    if plan.fetch:
        echo(f"  to fetch ({len(plan.fetch)}):")
        for p in plan.fetch:
            echo(f"    {p}")


def build(
    flake: Path,
    attr: str,
    runtime: str,
    out: Echo,
    progress: Echo,
    *,
    system: str | None = None,
    gpu_tests: bool = False,
    skip_checks: bool = False,
) -> Built:
    """nix build; load the image under its own tag; run its in-image checks; on success tag it as
    the line's reference, print id and pins and record it for distribute. On failure the image is
    removed and the line's image and the record stay as they were."""
    nix.require(flake)
    target = nix.installable(str(flake), attr, system)
    try:
        # the base first, read against its row: a difference stops the build before anything is built on it
        baseimage.check(target, flake, runtime, progress)
        out_path = nix.build(target, out_link(flake, attr), echo=progress)
    except Tp4Error as exc:
        raise _missing_output_hint(exc, system) from None
    progress(f"built {out_path}")
    candidate = load_image(out_path, runtime, progress)
    found = runtime_cli.inspect(runtime, candidate)
    if found is None:
        raise Tp4Error(f"{runtime} loaded {candidate} but cannot inspect it")
    image_id, labels = found
    record = record_path(flake, attr)
    line = labels.get(LINE_REF_LABEL)
    if line and runtime_cli.same_ref(candidate, line):
        raise Tp4Error(_loaded_as_line(runtime, line, record))
    try:
        if not line:
            raise Tp4Error(
                f"the image {candidate} does not name the line's reference (label {LINE_REF_LABEL}), "
                "so tp4 cannot tag it for the line: build it with pkgs/image.nix"
            )
        previous = runtime_cli.inspect(runtime, line)
        _verify(
            runtime,
            image_id,
            candidate,
            labels,
            out,
            progress,
            gpu_tests=gpu_tests,
            skip_checks=skip_checks,
            line=line,
            previous=previous[0] if previous else None,
            record=record,
        )
        runtime_cli.tag(runtime, image_id, line)
    except BaseException:
        _discard(runtime, candidate, progress)
        raise
    _discard(runtime, candidate, progress)
    built = Built(out_path=out_path, ref=line, id=image_id)
    built.save(record)
    pushed = push_to_store(runtime, built, store_record_path(flake, attr), progress)
    out(f"image {line}")
    out(f"id    {image_id}")
    if pushed is not None:
        out(f"digest {pushed.digest}")
    pins = pin_summary(labels)
    if pins:
        out("pins:")
        for pin in pins:
            out(f"  {pin}")
    return built


def load_image(out_path: str, runtime: str, progress: Echo) -> str:
    """Load the built image into the head's runtime; its reference there.

    An OCI layout (the line's image) is copied by skopeo, which skips every layer the runtime
    already has by its digest without reading it: into podman's store directly; into docker
    through the head's image store (:func:`tp4.image.imagestore.load_layout_into_docker`), since
    docker's daemon takes only whole archives. When the store cannot start, docker gets the
    whole image through its daemon (a warning says so)."""
    if runtime == "docker" and runtime_cli.image_kind(out_path) == "oci":
        from tp4.image import imagestore

        try:
            return imagestore.load_layout_into_docker(out_path, imagestore.start(), echo=progress)
        except Tp4Error as exc:
            progress(
                f"warning: the image store cannot take the image ({exc}); docker gets the whole image "
                "through its daemon instead"
            )
    return runtime_cli.load(out_path, runtime, echo=progress)


def describe_load_image(out_path: str, runtime: str) -> list[str]:
    """The commands :func:`load_image` runs (a layout not built yet is named ``<ref>``)."""
    if runtime == "docker" and runtime_cli.image_kind(out_path) == "oci":
        from tp4.image import imagestore

        ref = runtime_cli.layout_ref(out_path) if os.path.exists(out_path) else "<ref>"
        store = f"127.0.0.1:<port>/{imagestore.DEFAULT_REPO}"
        return [
            shlex.join(
                [
                    "skopeo",
                    "copy",
                    "--quiet",
                    "--dest-tls-verify=false",
                    runtime_cli.oci_source(out_path, ref),
                    f"docker://{store}:<tag>",
                ]
            )
            + "    # into the head's image store",
            shlex.join(["docker", "pull", "--quiet", f"{store}@<digest>"]),
            shlex.join(["docker", "tag", f"{store}@<digest>", ref]),
        ]
    return [runtime_cli.describe_load(out_path, runtime)]


def _verify(
    runtime: str,
    image_id: str,
    candidate: str,
    labels: dict[str, str],
    out: Echo,
    progress: Echo,
    *,
    gpu_tests: bool,
    skip_checks: bool,
    line: str,
    previous: str | None,
    record: Path,
) -> None:
    """Run the image's checks; raise, naming the failed ones, unless every one passed."""
    if skip_checks:
        progress(f"warning: --skip-checks: {line} gets {image_id[:12]} without its in-image checks")
        return
    checks = image_checks(labels, candidate)
    if checks is None:
        raise Tp4Error(
            f"the image {candidate} carries no in-image checks (no {CHECKS_LABEL} label), so it is not "
            f"tagged {line}: build it with pkgs/image.nix (its label lists the registry's "
            "[[image_check]] entries), or pass --skip-checks to tag it untested"
        )
    selected = select_checks(checks, gpu=gpu_tests)
    gpu = sum(c.gpu for c in checks)
    if gpu_tests and not gpu:
        progress("note: --gpu-tests: the image carries no gpu checks")
    if not selected:
        out("checks: none in the image's list" + (f" ({gpu} gpu checks run with --gpu-tests)" if gpu else ""))
        return
    results = run_checks(runtime, image_id, selected, out, progress)
    failed = [r.name for r in results if not r.ok]
    if failed:
        if previous == image_id:
            fate = f"the image {image_id[:12]} already was {line} (built before) and stays so"
        else:
            still = f"still is {previous[:12]}" if previous else "still has no image"
            fate = f"the image {image_id[:12]} is not tagged {line} and is removed; {line} {still}"
        raise Tp4Error(
            f"{len(failed)} of {len(results)} in-image checks failed ({', '.join(failed)}): {fate}, "
            f"and {record.name} is unchanged"
        )


def _discard(runtime: str, candidate: str, progress: Echo) -> None:
    """Remove the candidate's own tag (and so the image, when the line's tag is not on it)."""
    complaint = runtime_cli.remove(runtime, candidate)
    if complaint:
        progress(f"warning: could not remove {candidate}: {complaint}")


def _loaded_as_line(runtime: str, line: str, record: Path) -> str:
    """The image's own tag is the line's: loading it already moved the line's tag to an image
    whose checks have not run. Put the recorded line image back."""
    msg = (
        f"the image was loaded as the line's reference {line} itself, before its checks could run: "
        "build it under a tag of its own (pkgs/image.nix passes tag = null)"
    )
    try:
        before = Built.load(record)
    except Tp4Error:
        return msg + f"; {line} now points at the unchecked image"
    if runtime_cli.same_ref(before.ref, line) and runtime_cli.inspect(runtime, before.id) is not None:
        runtime_cli.tag(runtime, before.id, line)
        return msg + f"; {line} is {before.id[:12]} again, as {record.name} says"
    return msg + f"; {line} now points at the unchecked image"
