"""The host keys tp4 trusts: `tp4 hosts list --json` (tp4.cli.hosts builds it through
:class:`HostKeys`), read from tp4's own known_hosts file."""

from __future__ import annotations

from typing import Final, Literal

from pydantic import Field

from tp4.core import schemas
from tp4.core.contracts.base import Closed, version

SCHEMA: Final = schemas.HOST_KEYS


class HostKey(Closed):
    """One line of the known_hosts file."""

    names: str | None = Field(description="The host patterns of the line, comma-separated; null: a hashed name.")
    keytype: str = Field(description="The key type as ssh writes it (ssh-ed25519, ecdsa-sha2-nistp256, …).")
    kind: str = Field(description="The key type in words (ED25519, ECDSA, RSA).")
    fingerprint: str = Field(description="SHA256:… as `ssh-keygen -lf` prints it.")
    marker: str = Field(description='The line\'s marker: "@cert-authority", "@revoked", or "" (none).')
    line: int = Field(description="The line number in the file.")


class HostKeys(Closed):
    """`tp4 hosts list --json`: the keys tp4's ssh accepts."""

    schema_: Literal["tp4.host-keys/1"] = version(SCHEMA)
    file: str = Field(
        description="The known_hosts file read ($TP4_KNOWN_HOSTS, default $XDG_STATE_HOME/tp4/known_hosts)."
    )
    keys: list[HostKey] = Field(description="Every recorded key, in the file's order (empty: none recorded).")


MODELS: tuple[type[Closed], ...] = (HostKeys, HostKey)
