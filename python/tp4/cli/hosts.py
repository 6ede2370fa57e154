"""`tp4 hosts trust | list | forget`: the host keys tp4's ssh trusts (tp4.core.knownhosts)."""

from __future__ import annotations

import json
import sys

import click

from tp4.hosts import trust as trust_mod
from tp4.core import knownhosts, schemas
from tp4.core.contracts.host_keys import HostKey, HostKeys
from tp4.cli.common import PORT, profile_option, profile_remotes
from tp4.core.errors import InvalidInput
from tp4.core.process import Remote


@click.group("hosts")
def hosts() -> None:
    """The ssh host keys tp4 trusts, in its own known_hosts file ($TP4_KNOWN_HOSTS, default
    $XDG_STATE_HOME/tp4/known_hosts). Every ssh tp4 runs checks host keys strictly against this
    file only: record a node's keys once with `tp4 hosts trust` after checking the fingerprints
    it shows (e.g. against `ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub` on the node)."""


def _port(value: int | None) -> int | None:
    return None if value in (None, 22) else value


def _remotes(profile_path: str | None, names: tuple[str, ...], port: int | None) -> list[Remote]:
    if profile_path and names:
        raise InvalidInput("--profile and --host contradict each other: pass the profile (all its nodes) or the hosts")
    if names:
        return [Remote(host=knownhosts.check_host(h, "--host"), port=_port(port)) for h in names]
    return profile_remotes((), profile_path, None, None, port, (), head=True)


@hosts.command("trust")
@profile_option
@click.option(
    "--host",
    "names",
    multiple=True,
    metavar="HOST",
    help="A host's ssh name or address instead of the profile's nodes; repeatable.",
)
@click.option("--port", type=PORT, default=None, help="ssh port (default: the node's, else 22).")
@click.option(
    "--yes", "-y", is_flag=True, help="Record the keys shown without asking (needed when stdin is not a terminal)."
)
@click.option(
    "--replace",
    is_flag=True,
    help="Accept a node whose key changed: its recorded keys are replaced by those it offers now.",
)
def trust(profile_path: str | None, names: tuple[str, ...], port: int | None, yes: bool, replace: bool) -> None:
    """Fetch each node's host keys (ssh-keyscan), show their fingerprints and record them.

    A node already recorded with the keys it offers is `already trusted`. A node offering another
    key than the recorded one is refused, naming it and both fingerprints, and nothing is
    written, unless --replace. Without --yes the keys are recorded only after a `y` on the
    terminal.
    """
    remotes = _remotes(profile_path, names, port)
    click.echo(
        f"fetching the host keys of {len(remotes)} node{'s' if len(remotes) != 1 else ''} "
        f"(ssh-keyscan, at most {trust_mod.SCAN_TIMEOUT} s)…",
        err=True,
    )
    verdicts = trust_mod.examine(remotes, progress=lambda line: click.echo(line, err=True))
    for v in verdicts:
        if v.status == "trusted":
            click.echo(f"{v.name}: already trusted ({', '.join(k.shown() for k in v.recorded)})")
            continue
        click.echo(f"{v.name}: {'new' if v.status == 'new' else 'CHANGED'}")
        if v.status == "changed":
            for k in v.recorded:
                click.echo(f"  recorded {k.shown()}")
        for k in v.offered:
            click.echo(f"  {'offered  ' if v.status == 'changed' else ''}{k.shown()}")
    if not replace:
        trust_mod.refuse_changed(verdicts)
    todo = [v for v in verdicts if v.status != "trusted"]
    if not todo:
        return
    file = knownhosts.path()
    if not yes:
        if not sys.stdin.isatty():
            raise InvalidInput(
                "not recording the keys above: stdin is not a terminal to confirm on; fix: check the "
                "fingerprints against the nodes and rerun with --yes"
            )
        if not click.confirm(f"record the keys of {', '.join(v.name for v in todo)} in {file}?", err=True):
            raise InvalidInput("not recorded: you declined; nothing was written")
    count = trust_mod.record(todo)
    click.echo(f"recorded {count} host{'s' if count != 1 else ''} in {file}")


@hosts.command("list")
@click.option(
    "--json", "as_json", is_flag=True, help=f"The recorded keys as one JSON object (schema {schemas.HOST_KEYS})."
)
def list_(as_json: bool) -> None:
    """The recorded keys: name, key type and fingerprint, one a line."""
    entries = knownhosts.read()
    if as_json:  # built through its contract (tp4.core.contracts.host_keys)
        listing = HostKeys(
            file=str(knownhosts.path()),
            keys=[
                HostKey(
                    names=None if e.hashed else e.names,
                    keytype=e.keytype,
                    kind=knownhosts.kind(e.keytype),
                    fingerprint=e.fingerprint,
                    marker=e.marker,
                    line=e.line,
                )
                for e in entries
            ],
        )
        click.echo(json.dumps(listing.model_dump(mode="json", by_alias=True), indent=2))
        return
    if not entries:
        click.echo(f"no host keys recorded in {knownhosts.path()}: run `tp4 hosts trust`", err=True)
        return
    for e in entries:
        name = "(hashed name)" if e.hashed else e.names
        marker = f"  {e.marker}" if e.marker else ""
        click.echo(f"{name}  {knownhosts.kind(e.keytype)} {e.fingerprint}{marker}")


@hosts.command("forget")
@click.argument("host")
@click.option("--port", type=PORT, default=None, help="ssh port the key was recorded for (default 22).")
def forget(host: str, port: int | None) -> None:
    """Remove the recorded keys of HOST: tp4 refuses to connect to it until it is trusted again."""
    name, removed = trust_mod.forget(Remote(host=knownhosts.check_host(host, "HOST"), port=_port(port)))
    if removed:
        click.echo(f"{name}: forgot {removed} key{'s' if removed != 1 else ''}")
    else:
        click.echo(f"{name}: not recorded in {knownhosts.path()}, nothing to forget")
