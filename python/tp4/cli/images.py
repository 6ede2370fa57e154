"""`tp4 images` (the tp4 images of every node and their provenance) and `tp4 images prune`."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any, TypeVar

import click

from tp4.image import runtime_cli
from tp4.image import images as images_mod
from tp4.image.build import pin_summary
from tp4.cli.common import PORT, profile_option, profile_remotes, ssh_option, strict_option
from tp4.core.contracts.images_listing import ImageEntry, ImagesListing, ImagesNode
from tp4.core import schemas
from tp4.core.errors import Tp4Error, clip
from tp4.core.process import Remote

F = TypeVar("F", bound=Callable[..., Any])

# the largest --keep: more builds than any node's disk holds (the image is ~50 GB)
MAX_KEEP = 1000


class KeepCount(click.ParamType[int]):
    """--keep: a whole number 0..MAX_KEEP, refused with what to pass instead."""

    name = "N"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int) and not isinstance(value, bool):
            number = value
        else:
            text = str(value)
            # ASCII digits only (int() takes "٣", " 3", "+3" and "3_000"); a number of more than 20
            # digits is out of range without being converted
            if not re.fullmatch(r"-?[0-9]+", text, re.ASCII):
                self.fail(
                    f"{clip(text)} is not a whole number; fix: pass how many of the newest builds to keep, "
                    f"0 to {MAX_KEEP}",
                    param,
                    ctx,
                )
            if len(text) > 20:
                self.fail(
                    f"{clip(text, 20)} is out of range; fix: pass how many of the newest builds to keep, 0 to {MAX_KEEP}",
                    param,
                    ctx,
                )
            number = int(text)
        if not 0 <= number <= MAX_KEEP:
            self.fail(
                f"{number} is out of range; fix: pass how many of the newest builds to keep, 0 to {MAX_KEEP}",
                param,
                ctx,
            )
        return number


def node_options(f: F) -> F:
    """The nodes (head and workers) and their runtime, as `tp4 distribute` takes them."""
    for option in reversed(
        [
            click.option(
                "--runtime",
                type=click.Choice(["docker", "podman"]),
                default=None,
                help="Container runtime on the nodes (default: docker if installed on the head, else podman).",
            ),
            profile_option,
            click.option(
                "--worker",
                "workers",
                multiple=True,
                metavar="HOST",
                help="A worker's ssh name or address instead of the profile's; repeat, or give a comma/space list.",
            ),
            click.option("--user", default=None, help="ssh user on the workers."),
            click.option("--identity", default=None, help="ssh private key."),
            click.option("--port", type=PORT, default=None, help="ssh port."),
            ssh_option,
            strict_option,
        ]
    ):
        f = option(f)
    return f


NODE_KEYS = ("runtime", "profile_path", "workers", "user", "identity", "port", "ssh_options", "strict")


def _resolve(opts: dict[str, Any]) -> tuple[str, list[Remote]]:
    # the input first (a hostile --worker is refused as such), then what this machine has
    workers = profile_remotes(
        opts["workers"],
        opts["profile_path"],
        opts["user"],
        opts["identity"],
        opts["port"],
        opts["ssh_options"],
        opts["strict"],
    )
    return runtime_cli.detect(opts["runtime"]), workers


def _mib(n: int | None) -> str:
    return "?" if n is None else f"{n / 2**20:.1f} MiB"


def _when(image: images_mod.Image) -> str:
    return image.created.strftime("%Y-%m-%d %H:%M:%S UTC")


@click.group("images", invoke_without_command=True)
@node_options
@click.option("--json", "as_json", is_flag=True, help=f"The listing as JSON (schema {schemas.IMAGES}).")
@click.pass_context
def images(ctx: click.Context, /, as_json: bool, **opts: Any) -> None:
    """The tp4 images (label tp4.line.ref) on the head and every worker.

    Per node and image: id, tags, created time, the manifest digest of the head's registry
    (when pushed or pulled by digest), the flake revision and pins from its labels, and the
    containers (running or stopped) that use it. A worker whose line image is not the head's is
    marked DIFFERS. Exit 1 when a node cannot be asked (each such node is named once, with its
    reason, in the error at the end), 2 when ssh refused a node's host key (`tp4 hosts trust`).
    """
    ctx.obj = opts
    if ctx.invoked_subcommand is not None:
        return
    runtime, workers = _resolve(opts)
    nodes = images_mod.inventory(runtime, workers)
    store, _ = images_mod.running_store()
    store_ids = images_mod.store_digests(store) if store is not None else {}
    head = nodes[0]

    def digest(node: images_mod.NodeImages, image: images_mod.Image) -> str | None:
        return (store_ids.get(image.id) if node is head else None) or image.digest()

    if as_json:  # built through its contract (tp4.core.contracts.images_listing)
        listing = ImagesListing(
            runtime=runtime,
            nodes=[
                ImagesNode(
                    node=n.name,
                    host=n.remote.host if n.remote else None,
                    error=n.error,
                    line=n.line_ids(),
                    differs=images_mod.differences(head, n),
                    images=[
                        ImageEntry(
                            id=i.id,
                            tags=list(i.tags),
                            created=i.created.isoformat(),
                            size=i.size,
                            line_ref=i.line_ref,
                            line=i.is_line,
                            digest=digest(n, i),
                            flake_rev=i.flake_rev,
                            pins=i.pins,
                            containers=list(i.containers),
                            layers=list(i.layers),
                        )
                        for i in n.images
                    ],
                )
                for n in nodes
            ],
        )
        click.echo(json.dumps(listing.model_dump(mode="json", by_alias=True), indent=2))
    else:
        for n in nodes:
            _print_node(n, head, digest)
    failed = [n for n in nodes if n.error]
    if failed:
        # each node's reason in the error itself: the listing may have gone to a file, or be JSON
        raise Tp4Error(
            "could not list the images of "
            + "; ".join(f"{n.name} ({_reason(n.error)})" for n in failed)
            + "; fix: check the ssh settings (--worker, --user, --identity, --ssh-option) and that the node is up"
        )


def _reason(error: str | None) -> str:
    """A node's failure as the final error names it; a host-key refusal is said once, on its own
    line after it (tp4.cli's rule for refusals), so here it is only pointed at."""
    from tp4.core import process

    if any(error == refusal.message for refusal in process.host_key_failures.values()):
        return "ssh refused its host key: see the error below"
    return str(error)


def _print_node(
    node: images_mod.NodeImages,
    head: images_mod.NodeImages,
    digest: Callable[[images_mod.NodeImages, images_mod.Image], str | None],
) -> None:
    if node.error:
        # the reason is said once, in the error that ends the run (it names every such node)
        click.echo(f"{node.name}: cannot list its images (the reason is in the error below)")
        click.echo()
        return
    lines = ", ".join(f"{ref} is {i[:12]}" for ref, i in sorted(node.line_ids().items())) or "no line image"
    differs = images_mod.differences(head, node)
    mark = f"  DIFFERS from the head: {'; '.join(differs)}" if differs else ""
    click.echo(f"{node.name}: {len(node.images)} tp4 images; {lines}{mark}")
    for i in node.images:
        tags = ", ".join(i.tags) or "<untagged>"
        used = f"  used by {', '.join(i.containers)}" if i.containers else ""
        d = digest(node, i)
        click.echo(f"  {i.id[:12]}  {_when(i)}  {_mib(i.size):>10}  {tags}" + (f"  digest {d}" if d else "") + used)
        for pin in pin_summary(dict(i.labels)):
            click.echo(f"      {pin}")
    click.echo()


@images.command("prune")
@node_options
@click.option(
    "--keep",
    type=KeepCount(),
    default=2,
    show_default=True,
    metavar="N",
    help=f"How many of the newest builds (by created time) each node keeps besides the line's image and those containers use (0-{MAX_KEEP}).",
)
@click.option("--dry-run", is_flag=True, help="Say what would be removed; remove nothing.")
@click.pass_context
def prune(ctx: click.Context, /, keep: int, dry_run: bool, **opts: Any) -> None:
    """Remove the tp4 images of old builds on every node, and their manifests and blobs in the
    head's registry.

    Each node keeps the images its containers (running or stopped) use, the image the line's
    tag names and the newest N; images without the tp4.line.ref label are never touched. The
    registry keeps the manifests of every image a node keeps; the others are deleted and its
    blobs garbage-collected (skipped with a note when the registry does not run). Exit 1 when
    a node or the registry could not be pruned (each named once, with its reason, in the error at
    the end), 2 when ssh refused a node's host key (`tp4 hosts trust`).
    """
    parent: dict[str, Any] = ctx.obj or {}
    merged = {k: opts[k] if opts[k] not in (None, (), False) else parent.get(k, opts[k]) for k in NODE_KEYS}
    runtime, workers = _resolve(merged)
    results = images_mod.prune(runtime, workers, keep, dry_run=dry_run)
    verb = "would remove" if dry_run else "removed"
    for r in results:
        if r.error:
            # the reason is said once, in the error that ends the run
            click.echo(f"{r.node}: cannot prune (the reason is in the error below)")
            continue
        gone = [d.image for d in r.decisions if d.remove] if dry_run else list(r.removed)
        freed = "" if dry_run else f", freed {_mib(r.freed)}"
        click.echo(f"{r.node}: {verb} {len(gone)} images{freed}; kept {len(r.kept)}")
        for i in gone:
            click.echo(f"  {verb} {i.id[:12]}  {_when(i)}  {_mib(i.size):>10}  {', '.join(i.tags) or '<untagged>'}")
        for image, complaint in r.failed:
            click.echo(f"  could not remove {image.id[:12]}: {complaint}")
        for d in r.kept:
            click.echo(f"  kept    {d.image.id[:12]}  {_when(d.image)}  {_mib(d.image.size):>10}  {d.reason}")
    store_result = None
    if all(r.error is None for r in results):
        kept_ids = {d.image.id for r in results for d in r.kept} | {i.id for r in results for i, _ in r.failed}
        store_result = images_mod.prune_store(kept_ids, dry_run=dry_run, progress=lambda s: click.echo(s, err=True))
        _print_store(store_result, verb, dry_run)
    else:
        click.echo("registry: skipped, as not every node could be asked which images it keeps")
    bad = [r for r in results if not r.ok]
    if bad or (store_result is not None and store_result.errors):
        reasons = [
            f"{r.node} ({_reason(r.error) if r.error else '; '.join(c for _, c in r.failed) or 'not every image removed'})"
            for r in bad
        ]
        if store_result is not None and store_result.errors:
            reasons.append(f"registry ({'; '.join(store_result.errors)})")
        raise Tp4Error("prune did not finish on " + "; ".join(reasons) + "; fix the cause and run it again")


def _print_store(r: images_mod.StorePruned, verb: str, dry_run: bool) -> None:
    if r.note:
        click.echo(f"registry: {r.note}")
        return
    freed = "" if dry_run else f", freed {_mib(r.freed)}"
    click.echo(f"registry: {verb} {len(r.deleted)} manifests{freed}; kept {len(r.kept)}")
    for d in r.deleted:
        click.echo(f"  {verb} {d}")
    for e in r.errors:
        click.echo(f"  error: {e}")
