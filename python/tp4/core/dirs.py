"""Where tp4 keeps its state on this machine, shared by every part that keeps some.

``$XDG_STATE_HOME/tp4`` (default ``~/.local/state/tp4``): the image store (``registry/``) and
the known_hosts file tp4's ssh trusts (``known_hosts``). The private directory of the ssh
control sockets is a runtime one (:func:`runtime_dir`).
"""

from __future__ import annotations

import os
from pathlib import Path


def state_dir() -> Path:
    """``$XDG_STATE_HOME/tp4``, else ``~/.local/state/tp4`` (not created here)."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "tp4"


def runtime_base() -> Path:
    """Where per-user runtime files go: ``$XDG_RUNTIME_DIR`` (a private tmpfs of the session),
    else /tmp; the caller makes its own private directory in it."""
    return Path(os.environ.get("XDG_RUNTIME_DIR") or "/tmp")
