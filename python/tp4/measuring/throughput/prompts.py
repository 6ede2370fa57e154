"""What `tp4 bench` sends: the four decode prompt types, the salt that keeps streams from
sharing a prefix, and the prefill prompts (a varied-word filler, or real documents from a
corpus directory).

The decode prompt types follow sparkDash's four (structured, prose, code, json; the texts are
ours). sparkDash gives stream i of N the suffix `` (stream i/N)`` (so the prompt set changes
with N, and all N streams share a prefix); that stays the default here, for numbers that compare
with sparkDash's. ``--same-prompts`` sends every stream of every level the type's one prompt,
so per-stream values compare across concurrencies. Every prompt starts with a unique salt line
unless ``--shared-prefix``: nothing of one stream's prompt is in the prefix cache from another,
and a cache-aware router does not send every stream to one replica.
"""

from __future__ import annotations

import errno
import hashlib
import os
import random
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path

from tp4.core.errors import InvalidInput

PROMPTS: dict[str, str] = {
    "structured": (
        "Write the whole numbers from 1 to 200 in increasing order, one number per line, "
        "with nothing else: no words, no punctuation, no blank lines."
    ),
    "prose": (
        "Explain to a new programmer how a hash map works: what a hash function does, how keys "
        "become bucket indices, what happens when two keys collide, why the table is resized as it "
        "fills, and what the average and worst-case lookup costs are. Write plain paragraphs."
    ),
    "code": (
        "Write fifty small Python functions named clamp_00, clamp_01, and so on up to clamp_49. "
        "Function clamp_NN takes a number x and returns x limited to the range from -NN to NN "
        "inclusive. Give each function a one-line docstring and type hints. Output only code."
    ),
    "json": (
        "Produce a JSON array of 40 objects, each describing one GPU of a cluster at one moment, with "
        'the keys "node" (a string like "spark-03"), "gpu" (an integer), "util_pct", '
        '"mem_used_gib", "mem_total_gib", "temp_c", "power_w" and "sm_clock_mhz" (numbers). '
        "Output only the JSON."
    ),
}
TYPES = tuple(PROMPTS)

PREFILL_HEAD = "Ignore the text below. Reply with the single word OK.\n"
PREFILL_TAIL = "\nReply OK."

# the varied-word filler: common English words drawn at random per request, so no one token
# repeats through the prompt (a single repeated token hits one Engram row: MiaAI-Lab#21)
WORDS = tuple(
    """
the of and to in is was for on that with as by at from this be are have it an not which or his
but they one had all their were been has more when there can who would about into after other
new time some year only people these first two over could any most also than its many then
such city work part water world school place house system state group number story music
river night light power money field market book point village river north south east west
garden window morning winter summer island station library engine letter family mountain
bridge forest harbor valley table paper street voice color silver copper stone glass wooden
quiet rapid gentle early late simple careful bright narrow broad ancient modern hidden open
measure follow carry build write answer travel gather divide repair borrow listen change
explain describe compare include reduce observe protect remember discover continue arrive
""".split()
)

SALT_BYTES = 6  # 12 hex digits: unique within any run


def salt() -> str:
    return secrets.token_hex(SALT_BYTES)


def salted(text: str, salt_value: str | None, tag: str = "tp4-bench") -> str:
    """``text`` after a salt line (``[tp4-bench <salt>]``); unchanged when the salt is None."""
    return text if salt_value is None else f"[{tag} {salt_value}]\n{text}"


def decode_prompt(kind: str, index: int, concurrency: int, same_prompts: bool) -> str:
    """The prompt of stream ``index`` (0-based) at a level: the type's prompt, with sparkDash's
    `` (stream i/N)`` suffix at N > 1 unless ``same_prompts``."""
    base = PROMPTS[kind]
    if same_prompts or concurrency == 1:
        return base
    return f"{base} (stream {index + 1}/{concurrency})"


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def filler(chars: int, seed: str) -> str:
    """About ``chars`` characters of words drawn at random (seeded: one request's filler is the
    same on a retry), in sentences of 8-20 words."""
    rng = random.Random(seed)
    out: list[str] = []
    size = 0
    while size < chars:
        n = rng.randint(8, 20)
        sentence = " ".join(rng.choice(WORDS) for _ in range(n))
        sentence = sentence[0].upper() + sentence[1:] + "."
        out.append(sentence)
        size += len(sentence) + 1
    return " ".join(out)[: max(chars, 0)]


# --- the corpus --------------------------------------------------------------------------------------

MAX_FILE_BYTES = 4 << 20  # a document: more than this of one file is not read
MAX_CORPUS_BYTES = 64 << 20  # the corpus: files beyond this are not read
MAX_FILES = 100_000  # directory entries looked at


@dataclass(frozen=True)
class Corpus:
    """Real documents (their text, in path order) and what was skipped."""

    name: str
    documents: tuple[str, ...]
    skipped: int

    @property
    def chars(self) -> int:
        return sum(len(d) for d in self.documents)

    def text(self, chars: int, start: int) -> str:
        """``chars`` characters of the documents joined by blank lines, from document ``start``
        (mod the count) on, wrapping around when the corpus is shorter."""
        parts: list[str] = []
        size, i = 0, start % len(self.documents)
        while size < chars:
            doc = self.documents[i]
            parts.append(doc)
            size += len(doc) + 2
            i = (i + 1) % len(self.documents)
        return "\n\n".join(parts)[:chars]


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISREG(mode):
        return "a regular file"
    return "not a directory"


def _read_document(path: Path, limit: int) -> str | None:
    """A regular file's text (at most ``limit`` bytes, undecodable bytes replaced); None for
    anything else, an unreadable file, or binary data (a NUL byte). Opened without following a
    symlink and without blocking, checked on the descriptor: a FIFO or a device is never read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        chunks: list[bytes] = []
        size = 0
        while size < limit:
            part = os.read(fd, min(1 << 20, limit - size))
            if not part:
                break
            chunks.append(part)
            size += len(part)
    except OSError:
        return None
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if b"\0" in data:
        return None
    text = data.decode("utf-8", errors="replace").strip()
    return text or None


def load_corpus(directory: str) -> Corpus:
    """The text files under ``directory`` (recursively, in path order; symlinks not followed).
    A missing path, one that is not a directory, or a directory without one readable text file
    is :class:`InvalidInput`."""
    where = Path(directory).expanduser()
    fix = "name a directory of text files (documentation, source code)"
    try:
        st = os.stat(where)
    except FileNotFoundError:
        raise InvalidInput(f"--corpus: {where} does not exist; fix: {fix}") from None
    except OSError as exc:
        raise InvalidInput(
            f"--corpus: {where} cannot be read ({exc.strerror or errno.errorcode.get(exc.errno or 0)}); fix: {fix}"
        ) from None
    if not stat.S_ISDIR(st.st_mode):
        raise InvalidInput(f"--corpus: {where} is {_kind(st.st_mode)}, not a directory; fix: {fix}")
    documents: list[str] = []
    skipped = seen = total = 0
    unreadable: list[str] = []

    def walk_error(exc: OSError) -> None:
        unreadable.append(str(exc.filename))

    for root, dirs, files in os.walk(where, onerror=walk_error, followlinks=False):
        dirs.sort()
        for name in sorted(files):
            seen += 1
            if seen > MAX_FILES or total >= MAX_CORPUS_BYTES:
                skipped += 1
                continue
            text = _read_document(Path(root) / name, min(MAX_FILE_BYTES, MAX_CORPUS_BYTES - total))
            if text is None:
                skipped += 1
                continue
            documents.append(text)
            total += len(text.encode("utf-8", errors="replace"))
    if unreadable and str(where) in unreadable:
        raise InvalidInput(f"--corpus: {where} cannot be listed (permission denied); fix: {fix}")
    if not documents:
        what = (
            "holds no files"
            if seen == 0
            else f"holds no readable text file ({seen} entries skipped: not regular files, unreadable or binary)"
        )
        raise InvalidInput(f"--corpus: {where} {what}; fix: {fix}")
    return Corpus(where.name or str(where), tuple(documents), skipped + len(unreadable))
