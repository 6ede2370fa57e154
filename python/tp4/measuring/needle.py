"""The long-context check of the line (`tp4 bench needle`): one passphrase in varied filler at a
set depth, at the lengths the published line reports (99k, 198k, 746k and 1,011,084 tokens, the
passphrase at 37 % depth), PASS when the answer gives the passphrase back.

The filler is varied prose made from a seed (templates filled from word lists, numbers, names):
never one repeated token, which would hit one row of the Engram row cache and measure nothing
(MiaAI-Lab#21). Each length gets its own filler stream and its own passphrase, so no two prompts
share a prefix beyond the first line (no prefix-cache hit across lengths or runs: the seed is
random unless given).

Sizing in tokens. tp4 has no tokenizer of the model: two short requests calibrate the prompt
(``usage.prompt_tokens`` of the prompt without filler, and with a sample of filler: tokens per
character of filler), the filler is sized from that, and each answer's usage gives the real count
(reported beside the target, and used to size the next length more exactly).

The protocol a model sees (the stand-in engine answers it the same way, tests/standin/engine.py)::

    <INTRO>
    <filler ...> The secret passphrase is <word>-<word>-<4 digits>. <... filler>
    <QUESTION>

With ``watch`` (the head's :class:`tp4.hosts.nodes.Node`) a thread polls the head's ``MemAvailable``
(:func:`tp4.serving.serve.mem_available`) every ``interval`` seconds while each request runs and records
the low-water mark.
"""

from __future__ import annotations

import bisect
import random
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from tp4.serving import api
from tp4.core.errors import InvalidInput, Tp4Error

if TYPE_CHECKING:
    from tp4.hosts.nodes import Node

Echo = Callable[[str], None]
Status = Literal["PASS", "FAIL"]

# the seed's lengths (tokens) and depth
DEFAULT_LENGTHS = (99_000, 198_000, 746_000, 1_011_084)
DEFAULT_DEPTH = 0.37
MIN_LENGTH = 1_000
MAX_LENGTH = 8 * 1024 * 1024  # 8x the line's context; a prompt of ~36 MB
MAX_LENGTHS = 64
DEFAULT_TIMEOUT = 1800.0  # the seed's 1,011,084 tokens took 322-325 s
DEFAULT_MAX_TOKENS = 64
DEFAULT_INTERVAL = 5.0
CALIBRATION_CHARS = 32_000  # ~8k tokens of filler: a short request, a stable ratio
PREVIEW = 120

INTRO = (
    "Below is a long collection of unrelated notes. Exactly one sentence in it gives a secret passphrase. "
    "Read all of the notes carefully.\n\n"
)
QUESTION = "\n\nWhat is the secret passphrase given in the notes above? Reply with the passphrase only."
NEEDLE = "The secret passphrase is {code}."

# the passphrase's words: none of them occurs in the filler's word lists
CODE_WORDS = (
    "amber",
    "basalt",
    "cobalt",
    "dahlia",
    "ember",
    "falcon",
    "garnet",
    "heron",
    "indigo",
    "jasper",
    "kestrel",
    "lichen",
    "magpie",
    "nutmeg",
    "onyx",
    "plover",
    "quartz",
    "raven",
    "saffron",
    "thistle",
    "umber",
    "vervain",
    "walnut",
    "xenon",
    "yarrow",
    "zircon",
    "azure",
    "bramble",
    "cinder",
    "dunlin",
)

# --- the filler -----------------------------------------------------------------------------------

_NAMES = (
    "Ada",
    "Bruno",
    "Chen",
    "Dara",
    "Elif",
    "Farid",
    "Greta",
    "Hugo",
    "Ines",
    "Jonas",
    "Kaito",
    "Lena",
    "Mateo",
    "Nadia",
    "Oskar",
    "Priya",
    "Quinn",
    "Rosa",
    "Sven",
    "Tariq",
    "Uma",
    "Viktor",
    "Wanda",
    "Yusuf",
    "Zofia",
    "Amara",
    "Bilal",
    "Carmen",
    "Dmitri",
    "Esther",
    "Felix",
    "Hana",
    "Ivan",
    "Julia",
    "Kofi",
    "Lucia",
    "Milan",
    "Noor",
    "Olga",
    "Pavel",
)
_ADJ = (
    "quiet",
    "narrow",
    "broad",
    "early",
    "late",
    "heavy",
    "light",
    "steady",
    "uneven",
    "distant",
    "nearby",
    "warm",
    "cold",
    "damp",
    "dry",
    "bright",
    "dim",
    "ordinary",
    "unusual",
    "careful",
    "hasty",
    "modest",
    "large",
    "small",
    "old",
    "new",
    "rough",
    "smooth",
    "plain",
    "crowded",
    "empty",
    "gentle",
    "sudden",
    "patient",
    "noisy",
    "silent",
    "northern",
    "southern",
    "eastern",
    "western",
    "wooden",
    "stone",
    "paper",
    "glass",
    "iron",
    "woollen",
    "local",
    "seasonal",
    "weekly",
    "hidden",
    "open",
    "simple",
    "complex",
    "faded",
    "fresh",
)
_NOUNS = (
    "river",
    "market",
    "bridge",
    "library",
    "orchard",
    "harbor",
    "station",
    "workshop",
    "village",
    "meadow",
    "factory",
    "garden",
    "tower",
    "kitchen",
    "school",
    "museum",
    "forest",
    "valley",
    "bakery",
    "mill",
    "lighthouse",
    "theatre",
    "archive",
    "farm",
    "quarry",
    "canal",
    "chapel",
    "ferry",
    "warehouse",
    "courtyard",
    "observatory",
    "greenhouse",
    "pier",
    "tunnel",
    "square",
    "clinic",
    "office",
    "studio",
    "barn",
    "depot",
)
_PLURALS = (
    "letters",
    "baskets",
    "lanterns",
    "barrels",
    "maps",
    "ledgers",
    "boats",
    "crates",
    "bicycles",
    "chairs",
    "windows",
    "bottles",
    "blankets",
    "candles",
    "ropes",
    "tools",
    "carts",
    "sacks",
    "coins",
    "keys",
    "notebooks",
    "pamphlets",
    "tickets",
    "spools",
    "buckets",
    "shelves",
    "kettles",
    "jars",
    "parcels",
    "seeds",
)
_VERBS = (
    "carried",
    "counted",
    "repaired",
    "painted",
    "moved",
    "sorted",
    "measured",
    "cleaned",
    "described",
    "replaced",
    "inspected",
    "collected",
    "delivered",
    "recorded",
    "stacked",
    "weighed",
    "mended",
    "returned",
    "borrowed",
    "ordered",
    "priced",
    "labelled",
    "shipped",
    "folded",
    "polished",
    "copied",
    "traded",
    "stored",
)
_ADVERBS = (
    "slowly",
    "quickly",
    "carefully",
    "quietly",
    "twice",
    "again",
    "at dawn",
    "by noon",
    "in the rain",
    "without help",
    "before dusk",
    "with some effort",
    "for the first time",
    "as usual",
    "on foot",
)
_UNITS = ("minutes", "hours", "days", "weeks", "months", "kilometres", "metres", "steps", "miles", "years")
_ROLES = (
    "clerk",
    "keeper",
    "surveyor",
    "mayor",
    "teacher",
    "miller",
    "ferryman",
    "archivist",
    "baker",
    "engineer",
    "gardener",
    "porter",
    "painter",
    "doctor",
    "carpenter",
)
_GERUNDS = (
    "fishing",
    "weaving",
    "baking",
    "surveying",
    "printing",
    "sailing",
    "farming",
    "mapping",
    "brewing",
    "building",
    "trading",
    "teaching",
    "gardening",
    "tailoring",
    "mining",
)
_DAYS = (
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
    "the next morning",
    "the following week",
    "the last day of spring",
    "midsummer",
    "the first frost",
)
_EVENTS = ("storm", "harvest", "fair", "flood", "festival", "election", "auction", "meeting", "eclipse", "parade")
_PERIODS = ("morning", "evening", "week", "month", "season", "winter", "summer", "autumn", "spring")

# each field: where its words come from; numbers come from the generator
_POOLS: dict[str, Sequence[str]] = {
    "name": _NAMES,
    "name2": _NAMES,
    "adj": _ADJ,
    "adj2": _ADJ,
    "noun": _NOUNS,
    "noun2": _NOUNS,
    "place": _NOUNS,
    "plural": _PLURALS,
    "plural2": _PLURALS,
    "verb": _VERBS,
    "adv": _ADVERBS,
    "unit": _UNITS,
    "role": _ROLES,
    "gerund": _GERUNDS,
    "day": _DAYS,
    "event": _EVENTS,
    "period": _PERIODS,
}
_TEMPLATES = (
    "The {adj} {noun} near the {place} {verb} {num} {plural} {adv}.",
    "In {year}, {name} {verb} the {adj} {noun} of the {place}.",
    "{name} said that the {noun} was {adj} and {adj2}, about {num} {unit} from the {place}.",
    "Every {period}, the {role} {verb} roughly {num} {plural} before the {adj} {event}.",
    "A {adj} {noun} is not the same as a {adj2} {noun2}, the {role} of the {place} wrote in {year}.",
    "After {num} {unit} of {gerund}, the {plural} were {verb} {adv}.",
    "{name} and {name2} {verb} {num} {plural} at the {adj} {place} on {day}.",
    "There were {num} {plural} in the {place}, and {num2} of them were {adj}.",
    "The report on {gerund} lists {num} {plural}, {num2} {plural2} and one {adj} {noun}.",
    "Why the {noun} was {verb} {adv} is a question the {role} left for {day}.",
    "Near the {adj} {place}, {name} kept {num} {plural} for the {event} of {year}.",
    "The {role} {verb} the {plural} {adv}, then walked {num} {unit} to the {noun}.",
)
_FIELD = re.compile(r"\{(\w+)\}")


def _sentence(rng: random.Random, template: str) -> str:
    def fill(m: re.Match[str]) -> str:
        name = m[1]
        if name in ("num", "num2"):
            return str(rng.randint(2, 9999))
        if name == "year":
            return str(rng.randint(1600, 2099))
        return rng.choice(_POOLS[name])

    return _FIELD.sub(fill, template)


def filler(seed: int, stream: str, chars: int) -> list[str]:
    """Sentences of varied prose, at least ``chars`` characters with the spaces between them;
    the same (seed, stream) gives the same sentences."""
    rng = random.Random(f"tp4-needle:{seed}:{stream}")
    out: list[str] = []
    size = -1
    while size < chars:
        text = _sentence(rng, rng.choice(_TEMPLATES))
        out.append(text)
        size += len(text) + 1
    return out


def passphrase(seed: int, stream: str) -> str:
    rng = random.Random(f"tp4-needle-code:{seed}:{stream}")
    first, second = rng.sample(CODE_WORDS, 2)
    return f"{first}-{second}-{rng.randint(1000, 9999)}"


@dataclass(frozen=True)
class Prompt:
    """A needle prompt: its text, the passphrase and where the needle sentence starts."""

    text: str
    code: str
    offset: int  # characters before the needle sentence
    filler_chars: int

    @property
    def depth(self) -> float:
        return self.offset / len(self.text)


def build(seed: int, stream: str, filler_chars: int, depth: float) -> Prompt:
    """The prompt of one length: ``filler_chars`` of filler (to a sentence), the needle sentence
    at the sentence boundary nearest to ``depth`` of the whole prompt."""
    code = passphrase(seed, stream)
    needle = NEEDLE.format(code=code)
    sentences = filler(seed, stream, filler_chars) if filler_chars > 0 else []
    ends = [0]  # characters of the first k sentences, each with the space after it
    for s in sentences:
        ends.append(ends[-1] + len(s) + 1)
    whole = len(INTRO) + ends[-1] + len(needle) + len(QUESTION)
    want = depth * whole - len(INTRO)  # filler characters before the needle
    k = bisect.bisect_left(ends, want)
    if k > len(sentences) or (k > 0 and want - ends[k - 1] <= ends[k] - want):
        k -= 1
    before, after = " ".join(sentences[:k]), " ".join(sentences[k:])
    head = INTRO + before + (" " if before else "")
    text = head + needle + (" " + after if after else "") + QUESTION
    return Prompt(text, code, len(head), len(before) + len(after))


# --- input ------------------------------------------------------------------------------------------

_LENGTH = re.compile(r"([0-9]{1,12})([kKmM]?)")


def parse_lengths(text: str, field_name: str = "--lengths") -> tuple[int, ...]:
    """Comma-separated token counts, each a whole number with an optional k (x1000) or M
    (x1,000,000) suffix, between MIN_LENGTH and MAX_LENGTH, none twice."""
    fix = f"fix: give token counts from {MIN_LENGTH:,} to {MAX_LENGTH:,}, e.g. {field_name} 99k,198k,746k,1011084"
    items = [t.strip() for t in text.split(",")]
    if not text.strip() or any(not t for t in items):
        raise InvalidInput(f"{field_name} {text[:80]!r}: an empty length; {fix}")
    if len(items) > MAX_LENGTHS:
        raise InvalidInput(
            f"{field_name}: {len(items)} lengths, more than {MAX_LENGTHS}; fix: run fewer lengths at once"
        )
    out: list[int] = []
    for item in items:
        m = _LENGTH.fullmatch(item)
        if m is None:
            raise InvalidInput(f"{field_name} {item[:40]!r}: not a token count; {fix}")
        value = int(m[1]) * {"": 1, "k": 1000, "m": 1_000_000}[m[2].lower()]
        if not MIN_LENGTH <= value <= MAX_LENGTH:
            raise InvalidInput(
                f"{field_name} {item!r}: {value:,} tokens is outside {MIN_LENGTH:,}..{MAX_LENGTH:,}; {fix}"
            )
        if value in out:
            raise InvalidInput(f"{field_name} {item!r}: {value:,} tokens is listed twice; fix: list each length once")
        out.append(value)
    return tuple(out)


def parse_depth(text: str) -> float:
    fix = "fix: give a fraction from 0 (the start) to 1 (the end), e.g. --depth 0.37"
    try:
        value = float(text) if re.fullmatch(r"[0-9]*\.?[0-9]+", text.strip()) else float("nan")
    except ValueError:
        value = float("nan")
    if not 0.0 <= value <= 1.0:
        raise InvalidInput(f"--depth {text[:40]!r}: not a fraction from 0 to 1; {fix}")
    return value


# --- a run ------------------------------------------------------------------------------------------


@dataclass
class Memory:
    """The head's MemAvailable during one request (bytes)."""

    before: int | None = None
    low_water: int | None = None
    samples: int = 0
    errors: list[str] = field(default_factory=list)

    def add(self, value: int) -> None:
        self.samples += 1
        self.low_water = value if self.low_water is None else min(self.low_water, value)

    def to_json(self) -> dict[str, api.Json]:
        return {
            "beforeBytes": self.before,
            "lowWaterBytes": self.low_water,
            "samples": self.samples,
            "error": self.errors[0] if self.errors else None,
        }


class Watcher:
    """A thread that reads the head's MemAvailable every ``interval`` seconds until stopped."""

    def __init__(self, node: Node, interval: float) -> None:
        self.node, self.interval = node, interval
        self.memory = Memory()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="tp4-needle-memory", daemon=True)

    def _read(self) -> int | None:
        from tp4.serving import serve

        try:
            value = serve.mem_available(self.node, timeout=max(self.interval * 4, 20))
        except Tp4Error as exc:
            self.memory.errors.append(exc.message.splitlines()[0])
            return None
        if value is None:
            self.memory.errors.append(f"{self.node.name}: MemAvailable unreadable (/proc/meminfo)")
            return None
        self.memory.add(value)
        return value

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self._read()

    def __enter__(self) -> Watcher:
        self.memory.before = self._read()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._read()  # the state right after the answer


@dataclass(frozen=True)
class Calibration:
    fixed_tokens: int  # the prompt without filler (chat template, intro, needle, question)
    tokens_per_char: float  # of filler
    sample_chars: int
    sample_tokens: int

    def filler_chars(self, tokens: int) -> int:
        return max(0, round((tokens - self.fixed_tokens) / self.tokens_per_char))

    def to_json(self) -> dict[str, api.Json]:
        return {
            "fixedTokens": self.fixed_tokens,
            "charsPerToken": round(1 / self.tokens_per_char, 4),
            "sampleChars": self.sample_chars,
            "sampleTokens": self.sample_tokens,
        }


@dataclass
class Result:
    target_tokens: int
    status: Status
    prompt_tokens: int | None = None
    prompt_chars: int = 0
    filler_chars: int = 0
    depth: float = 0.0
    needle_offset: int = 0
    code: str = ""
    seconds: float | None = None
    answer: str = ""
    finish_reason: str | None = None
    error: str | None = None
    memory: Memory | None = None

    @property
    def deviation(self) -> float | None:
        return None if self.prompt_tokens is None else (self.prompt_tokens - self.target_tokens) / self.target_tokens

    def to_json(self) -> dict[str, api.Json]:
        dev = self.deviation
        return {
            "targetTokens": self.target_tokens,
            "promptTokens": self.prompt_tokens,
            "deviation": None if dev is None else round(dev, 5),
            "promptChars": self.prompt_chars,
            "depth": round(self.depth, 5),
            "needleOffsetChars": self.needle_offset,
            "passphrase": self.code,
            "status": self.status,
            "seconds": None if self.seconds is None else round(self.seconds, 3),
            "finishReason": self.finish_reason,
            "answerPreview": preview(self.answer),
            "error": self.error,
            "memory": self.memory.to_json() if self.memory is not None else None,
        }


def preview(text: str, limit: int = PREVIEW) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[:limit] + "..."


def found(code: str, answer: str) -> bool:
    """The passphrase is in the answer (case aside)."""
    return code.lower() in answer.lower()


def _ask(ep: api.Endpoint, prompt: str, max_tokens: int, timeout: float) -> api.Completion:
    return api.complete(
        ep, prompt, max_tokens=max_tokens, timeout=timeout, temperature=0.0, chat_template_kwargs=api.NO_THINKING
    )


def _tokens(done: api.Completion, what: str) -> int:
    if done.usage is None:
        raise Tp4Error(
            f"{what}: the answer has no usage.prompt_tokens, so prompts cannot be sized in tokens; "
            "fix: point tp4 at an engine that reports usage (SGLang does)"
        )
    return done.usage.prompt_tokens


def calibrate(ep: api.Endpoint, seed: int, timeout: float) -> Calibration:
    """Tokens of the prompt without filler, and tokens per character of filler (two short requests)."""
    bare = build(seed, "calibration", 0, 0.5)
    fixed = _tokens(_ask(ep, bare.text, 1, timeout), "calibration")
    sample = build(seed, "calibration", CALIBRATION_CHARS, 0.5)
    tokens = _tokens(_ask(ep, sample.text, 1, timeout), "calibration")
    if tokens <= fixed:
        raise Tp4Error(
            f"calibration: {sample.filler_chars} characters of filler counted {tokens - fixed} tokens; "
            "fix: check that the endpoint counts prompt tokens in usage"
        )
    return Calibration(fixed, (tokens - fixed) / sample.filler_chars, sample.filler_chars, tokens)


def _refused(exc: api.ApiError) -> bool:
    return exc.kind == "http" and exc.status == 400 and "context length" in exc.message.lower()


def run_one(
    ep: api.Endpoint,
    cal: Calibration,
    target: int,
    index: int,
    *,
    seed: int,
    depth: float,
    max_tokens: int,
    timeout: float,
    watch: Node | None,
    interval: float,
) -> tuple[Result, api.ApiError | None]:
    """One length: its result, and the error that stops the run (the API down, the key refused:
    every later length would meet it too) or None."""
    prompt = build(seed, f"length-{index}-{target}", cal.filler_chars(target), depth)
    result = Result(
        target,
        "FAIL",
        prompt_chars=len(prompt.text),
        filler_chars=prompt.filler_chars,
        depth=prompt.depth,
        needle_offset=prompt.offset,
        code=prompt.code,
    )
    watcher = Watcher(watch, interval) if watch is not None else None
    started = time.monotonic()
    try:
        if watcher is not None:
            with watcher:
                done = _ask(ep, prompt.text, max_tokens, timeout)
        else:
            done = _ask(ep, prompt.text, max_tokens, timeout)
    except api.ApiError as exc:
        result.seconds = time.monotonic() - started
        result.error = (
            (
                f"refused as too long: {exc.message}; fix: lengths below the line's context length (the profile's "
                "engine.context_length)"
            )
            if _refused(exc)
            else exc.message
        )
        return result, exc if exc.kind in ("down", "auth") else None
    finally:
        if watcher is not None:
            result.memory = watcher.memory
    result.seconds = done.seconds
    result.answer, result.finish_reason = done.content, done.finish_reason
    result.prompt_tokens = done.usage.prompt_tokens if done.usage is not None else None
    if found(prompt.code, done.content):
        result.status = "PASS"
    else:
        result.error = "the answer does not give the passphrase back"
    return result, None


@dataclass
class Run:
    lengths: tuple[int, ...]
    depth: float
    seed: int
    calibration: Calibration | None = None
    results: list[Result] = field(default_factory=list)
    stopped: str | None = None  # why the lengths after the last result did not run

    @property
    def status(self) -> Status:
        ok = len(self.results) == len(self.lengths) and all(r.status == "PASS" for r in self.results)
        return "PASS" if ok else "FAIL"


def run(
    ep: api.Endpoint,
    lengths: Sequence[int],
    *,
    depth: float = DEFAULT_DEPTH,
    seed: int,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    timeout: float = DEFAULT_TIMEOUT,
    watch: Node | None = None,
    interval: float = DEFAULT_INTERVAL,
    calibration: Calibration | None = None,
    progress: Echo = lambda line: None,
) -> Run:
    """Calibrate, then ask the needle at every length in order. Each answer's usage refines the
    sizing of the next length. A length the engine refuses (too long for its context) or answers
    without the passphrase is a FAIL and the next length runs; the API going down or refusing the
    key stops the run (the run's ``stopped`` says why). ``calibration``: one made before (no
    calibration requests)."""
    out = Run(tuple(lengths), depth, seed)
    if watch is not None:  # before any request: a watch that cannot read says so now, not after the run
        from tp4.serving import serve

        if serve.mem_available(watch) is None:
            raise Tp4Error(
                f"--watch-memory: {watch.name}: MemAvailable cannot be read from /proc/meminfo; fix: check that "
                f"the head is reachable (`tp4 status`), or run without --watch-memory"
            )
    if calibration is None:
        progress(f"needle: calibrating the prompt size at {ep.url} (2 short requests)")
        calibration = calibrate(ep, seed, min(timeout, 600.0))
    cal = out.calibration = calibration
    progress(f"needle: seed {seed} (--seed {seed} gives the same filler and passphrases)")
    progress(
        f"needle: {1 / cal.tokens_per_char:.2f} characters per token of filler, {cal.fixed_tokens} tokens without filler"
    )
    for i, target in enumerate(lengths):
        progress(f"needle: {target:,} tokens, the passphrase at {depth:.0%} depth ...")
        result, stop = run_one(
            ep,
            cal,
            target,
            i,
            seed=seed,
            depth=depth,
            max_tokens=max_tokens,
            timeout=timeout,
            watch=watch,
            interval=interval,
        )
        out.results.append(result)
        if stop is not None:
            out.stopped = stop.message
            progress(f"needle: {target:,} tokens: {stop.message}; the remaining lengths are not run")
            break
        low = result.memory.low_water if result.memory is not None else None
        mem = f", MemAvailable low-water {gib(low)}" if low is not None else ""
        took = f" in {result.seconds:.1f} s" if result.seconds is not None else ""
        progress(
            f"needle: {target:,} tokens: {result.status}{took} ({result.prompt_tokens or '?'} prompt tokens{mem})"
            + (f": {result.error}" if result.error else "")
        )
        if result.prompt_tokens is not None:
            filler_tokens = result.prompt_tokens - cal.fixed_tokens
            if (
                filler_tokens > 0 and result.filler_chars > cal.sample_chars
            ):  # a larger sample than the last: a finer ratio
                cal = Calibration(
                    cal.fixed_tokens, filler_tokens / result.filler_chars, result.filler_chars, result.prompt_tokens
                )
    return out


def gib(value: int | None) -> str:
    return "-" if value is None else f"{value / (1 << 30):.1f} GiB"
