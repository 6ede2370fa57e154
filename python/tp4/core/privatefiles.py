"""Files tp4 writes on a host through a shell (``sh -c SCRIPT sh ARGS...``, locally or over ssh), so
that no other user can receive them or point them somewhere else: the one definition of the
shell functions every such writer uses (the router's key file and log, a rank's env file, the
plan serve leaves beside it, the NFS server's config, a spec table).

* ``private_dir DIR``: DIR is created (mode 0700) when missing; then it must be a directory, not
  a symbolic link, owned by the user the script runs as, and writable by nobody else (group or
  others): otherwise the script refuses, on stderr, naming the fix. Another user who made the
  directory first (``/var/tmp/x``, world-writable, with ``x/api-key.tmp`` a symlink to a file of
  theirs) would otherwise receive what tp4 writes there.
* ``write_file FILE MODE``: stdin to FILE through a new file ``mktemp`` makes beside it (created
  exclusively: no planted path can receive the data), then renamed over FILE (``mv -T``: a
  symlink or anything else at FILE is replaced, never followed).
* ``write_private FILE``: ``private_dir`` of FILE's directory, then ``write_file FILE 600``.

Constants only: every value is an argument of the script, never part of it.

Here, in Python: :func:`replace_file` is ``write_file``'s twin (a new file beside the target,
created exclusively, renamed over it), for the files tp4 keeps on the machine it runs on.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

# exit code of a refused directory (the message on stderr names the directory and the fix)
REFUSED = 3

PRIVATE_DIR_SH = (
    "private_dir() { "
    'case $1 in /*) ;; *) echo "tp4: $1 is not an absolute path; fix: name an absolute directory" >&2; return 3;; esac; '
    'if [ ! -e "$1" ] && [ ! -L "$1" ]; then (umask 077 && mkdir -p -- "$1") || return 3; fi; '
    'if [ -L "$1" ]; then echo "tp4: $1 is a symbolic link (another user may have planted it), refused for tp4\'s '
    'private files; fix: remove it, or name a directory of your own" >&2; return 3; fi; '
    'if [ ! -d "$1" ]; then echo "tp4: $1 is not a directory; fix: remove it, or name another directory" >&2; return 3; fi; '
    'if [ ! -O "$1" ]; then echo "tp4: $1 belongs to another user, not to $(id -un) (uid $(id -u)), who could read '
    "or plant the private files tp4 keeps there; fix: name a directory of your own (or remove that one as its "
    'owner)" >&2; return 3; fi; '
    'if [ -n "$(find "$1" -prune \\( -perm -020 -o -perm -002 \\) -print)" ]; then echo "tp4: $1 is writable by '
    'group or others ($(ls -ld -- "$1" | cut -c1-10)), who could plant files there; fix: chmod go-w -- $1 '
    '(or name a directory of your own)" >&2; return 3; fi; '
    "}; "
)

WRITE_FILE_SH = (
    "write_file() { "
    'wf_d=$(dirname -- "$1") && mkdir -p -- "$wf_d" && wf_t=$(mktemp -- "$wf_d/.tp4-write.XXXXXXXX") || return 1; '
    'if cat >> "$wf_t" && chmod "$2" -- "$wf_t" && mv -f -T -- "$wf_t" "$1"; then return 0; fi; '
    'rm -f -- "$wf_t"; return 1; '
    "}; "
)

WRITE_PRIVATE_SH = (
    PRIVATE_DIR_SH
    + WRITE_FILE_SH
    + 'write_private() { (umask 077 && set -C && private_dir "$(dirname -- "$1")" && write_file "$1" 600); }; '
)

# `sh -c WRITE_PRIVATE sh FILE` < data: FILE mode 0600 in a private directory
WRITE_PRIVATE = WRITE_PRIVATE_SH + 'write_private "$1"'

# `sh -c WRITE_SHARED sh FILE MODE` < data: FILE of MODE (not secret), through a new file beside it
WRITE_SHARED = WRITE_FILE_SH + 'write_file "$1" "$2"'


def replace_file(path: str | os.PathLike[str], text: str, mode: int = 0o644) -> Path:
    """Write ``text`` to ``path`` through a new file beside it (``mkstemp``: O_CREAT|O_EXCL, so no
    planted ``<path>.tmp`` link receives it), of ``mode``, renamed over ``path`` (a link there is
    replaced, never followed). Raises OSError; nothing is left behind on failure."""
    out = Path(path)
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return out
