"""`tp4 build` and `tp4 distribute`."""

from __future__ import annotations

import json
from pathlib import Path

import click

from tp4.image import build as build_mod
from tp4.image import nix, runtime_cli
from tp4.image import distribute as distribute_mod
from tp4.cli.common import (
    PORT,
    dry_run_option,
    flake_option,
    profile_option,
    profile_remotes,
    ssh_option,
    strict_option,
)
from tp4.core import schemas
from tp4.core.errors import InvalidInput, Tp4Error

flake = flake_option("with the output to build")
attr_option = click.option("--attr", default="image", show_default=True, help="Flake output to build.")
runtime_option = click.option(
    "--runtime",
    type=click.Choice(["docker", "podman"]),
    default=None,
    help="Container runtime on the nodes (default: docker if installed on the head, else podman).",
)


def _echo(line: str) -> None:
    click.echo(line)


def _progress(line: str) -> None:
    click.echo(line, err=True)


@click.command("build")
@flake
@attr_option
@runtime_option
@click.option(
    "--system",
    default=None,
    metavar="SYSTEM",
    help="Build packages.SYSTEM.<attr> (e.g. aarch64-linux from another host, with an aarch64 builder).",
)
@click.option(
    "--gpu-tests",
    is_flag=True,
    help="Also run the image's gpu checks (upstream's tests/*_gpu.py) with this node's GPU.",
)
@click.option(
    "--skip-checks",
    is_flag=True,
    help="Tag the image for the line without running its in-image checks (says so on stderr).",
)
@dry_run_option
@click.option(
    "--image",
    "variant",
    default=None,
    metavar="VARIANT",
    help="Build the image of this variant (base, canary, canary-roce: the registry's [images.<variant>], "
    "the image a preset's plan runs) instead of --attr.",
)
def build(
    flake_dir: Path | None,
    attr: str,
    runtime: str | None,
    system: str | None,
    gpu_tests: bool,
    skip_checks: bool,
    dry_run: bool,
    variant: str | None,
) -> None:
    """Build the image with nix (pinned inputs only), check it, and tag it for the line on the head.

    The image is loaded under its own tag and each of its in-image checks (import checks and
    upstream's CPU tests, from the registry) runs in a throwaway container without network; only
    when all pass is it tagged as the line's image and recorded for `tp4 distribute`. Results,
    the image id and the pins (from the image's labels) go to stdout, progress to stderr.
    """
    if gpu_tests and skip_checks:
        raise InvalidInput("--gpu-tests and --skip-checks contradict each other: pass one")
    if variant is not None:
        if click.get_current_context().get_parameter_source("attr") is not click.core.ParameterSource.DEFAULT:
            raise InvalidInput("--image and --attr both name what to build: pass one")
        attr = build_mod.image_attr(variant)
    flake = nix.find_flake(flake_dir)
    runtime = runtime_cli.detect(runtime, required=not dry_run)
    if dry_run:
        build_mod.dry_run(flake, attr, runtime, _echo, system=system, gpu_tests=gpu_tests)
    else:
        build_mod.build(
            flake, attr, runtime, _echo, _progress, system=system, gpu_tests=gpu_tests, skip_checks=skip_checks
        )


@click.command("distribute")
@flake
@attr_option
@runtime_option
@profile_option
@click.option(
    "--worker",
    "workers",
    multiple=True,
    metavar="HOST",
    help="A worker's ssh name or address instead of the profile's; repeat, or give a comma/space list.",
)
@click.option("--user", default=None, help="ssh user on the workers.")
@click.option("--identity", default=None, help="ssh private key.")
@click.option("--port", type=PORT, default=None, help="ssh port.")
@ssh_option
@click.option(
    "--image", "image_ref", default=None, help="Image reference on the head (default: the one `tp4 build` loaded)."
)
@click.option("--check", "check_only", is_flag=True, help="Only report which workers have the head's image.")
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help=f"With --check: the report as one JSON object on stdout (schema {schemas.DISTRIBUTE_CHECK}).",
)
@click.option(
    "--method",
    type=click.Choice(distribute_mod.METHODS),
    default="registry",
    show_default=True,
    help="registry: workers pull by digest from the head's image store through a reverse ssh tunnel, "
    "moving only the layers they lack; archive: stream the whole image into `<runtime> load` "
    "(for a head without the image store).",
)
@strict_option
@dry_run_option
def distribute(
    flake_dir: Path | None,
    attr: str,
    runtime: str | None,
    profile_path: str | None,
    workers: tuple[str, ...],
    user: str | None,
    identity: str | None,
    port: int | None,
    ssh_options: tuple[str, ...],
    image_ref: str | None,
    check_only: bool,
    as_json: bool,
    method: str,
    strict: bool,
    dry_run: bool,
) -> None:
    """Copy the head's image to the workers in parallel; skip workers that already have it.

    By default each worker pulls the image by its manifest digest from the head's image store
    (`tp4 image-store`, bound to 127.0.0.1) through a reverse tunnel of its ssh connection, so
    only the layers it lacks move and no port opens on the network; podman pulls with
    --tls-verify=false, as the store is plain HTTP reachable only through the tunnel.
    Every worker must end with the head's image id and RootFS layers, or the command fails
    naming the worker.

    --dry-run prints the commands of the copy, worker by worker, from the build records (the image
    reference and the store's digest) and asks no worker: each worker's copy runs only where it
    lacks the head's image, which the output says depends on the worker.
    """
    # every input first (the profile, --worker, --user, --port), before the head's image is looked up
    if as_json and not check_only:
        raise InvalidInput("--json reports --check: pass --check --json (a copy reports as it goes, in text)")
    if dry_run and check_only:
        raise InvalidInput("--dry-run rehearses a copy; --check only asks the workers: pass one of them")
    digest = None
    nodes = profile_remotes(workers, profile_path, user, identity, port, ssh_options, strict)
    runtime = runtime_cli.detect(runtime, required=not dry_run)
    if dry_run:
        if image_ref is None:
            flake = nix.find_flake(flake_dir)
            built = build_mod.Built.load(build_mod.record_path(flake, attr))
            image_ref, recorded = built.ref, build_mod.Pushed.load(build_mod.store_record_path(flake, attr))
            digest = recorded.digest if recorded is not None and recorded.id == built.id else None
        for line in distribute_mod.rehearse(image_ref, nodes, runtime, method=method, digest=digest):
            click.echo(line)
        click.echo("dry run: nothing was run, no host was asked", err=True)
        return
    digest = None
    if image_ref is None:
        flake = nix.find_flake(flake_dir)
        image_ref = build_mod.Built.load(build_mod.record_path(flake, attr)).ref
        pushed = build_mod.Pushed.load(build_mod.store_record_path(flake, attr))
    else:
        pushed = None
    found = runtime_cli.inspect(runtime, image_ref)
    if found is None:
        raise Tp4Error(f"the head has no image {image_ref}: run `tp4 build` first")
    image_id = found[0]
    if pushed is not None and pushed.id == image_id:
        digest = pushed.digest
    click.echo(f"image {image_ref} {image_id[:12]}", err=as_json)
    if check_only and as_json:  # built through its contract (tp4.core.contracts.distribute_check)
        from tp4.core.contracts.distribute_check import DistributeCheck, WorkerImage

        outcomes = distribute_mod.check(image_ref, image_id, nodes, runtime)
        doc = DistributeCheck(
            image=image_ref,
            id=image_id,
            ok=all(o.ok for o in outcomes),
            workers=[WorkerImage(node=o.node, status=o.status, detail=o.detail) for o in outcomes],
        )
        click.echo(json.dumps(doc.model_dump(mode="json", by_alias=True), indent=2))
    elif check_only:
        outcomes = distribute_mod.check(image_ref, image_id, nodes, runtime)
        for o in outcomes:
            click.echo(f"{o.node}: {o.status}{': ' + o.detail if o.detail and o.status != 'present' else ''}")
    else:
        outcomes = distribute_mod.distribute(image_ref, image_id, nodes, runtime, _echo, method=method, digest=digest)
    bad = [o for o in outcomes if not o.ok]
    if bad:
        raise Tp4Error("; ".join(f"{o.node}: {o.status} ({o.detail})" for o in bad))
    click.echo(f"all {len(outcomes)} workers have {image_id[:12]}", err=as_json)


@click.group("image-store")
def image_store() -> None:
    """The head's image store: an OCI registry (docker-registry) on 127.0.0.1 that the workers
    pull from through reverse ssh tunnels (`tp4 distribute`). `tp4 build` starts it when needed."""


root_option = click.option(
    "--root",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="State directory (default: $XDG_STATE_HOME/tp4/registry).",
)


@image_store.command("start")
@root_option
@click.option(
    "--port",
    type=PORT,
    default=None,
    help="Port on 127.0.0.1 (default: the last one used, else a free one).",
)
def image_store_start(root: Path | None, port: int | None) -> None:
    """Start the image store (a running one is reused)."""
    from tp4.image import imagestore

    store = imagestore.start(root, port)
    click.echo(f"image store {store.url} ({store.root})")


@image_store.command("stop")
@root_option
def image_store_stop(root: Path | None) -> None:
    """Stop the image store."""
    from tp4.image import imagestore

    click.echo("stopped" if imagestore.stop(root) else "not running")


@image_store.command("status")
@root_option
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help=f"The status as one JSON object on stdout (schema {schemas.IMAGE_STORE}), also when it does not run.",
)
def image_store_status(root: Path | None, as_json: bool) -> None:
    """Whether the image store runs, where, and the manifests it holds. Exit 1 when it does not run."""
    from tp4.core.contracts.image_store_status import ImageStoreStatus
    from tp4.image import imagestore

    store = imagestore.running(root)
    if as_json:  # built through its contract (tp4.core.contracts.image_store_status)
        doc = ImageStoreStatus(
            running=store is not None,
            root=str(store.root if store is not None else root or imagestore.default_root()),
            url=store.url if store is not None else None,
            repo=imagestore.DEFAULT_REPO,
            manifests=list(imagestore.manifests(store, imagestore.DEFAULT_REPO)) if store is not None else [],
        )
        click.echo(json.dumps(doc.model_dump(mode="json", by_alias=True), indent=2))
    if store is None:
        raise Tp4Error(
            f"the image store under {root or imagestore.default_root()} is not running: "
            "start it with `tp4 image-store start`"
        )
    if as_json:
        return
    click.echo(f"image store {store.url} ({store.root})")
    for digest in imagestore.manifests(store, imagestore.DEFAULT_REPO):
        click.echo(f"  {imagestore.DEFAULT_REPO}@{digest}")
