"""The tasks of `tp4 qeval`: written for tp4 (none is copied from a benchmark), each scored
automatically (:mod:`tp4.measuring.qeval.checks`). A task is an id, a prompt (one user message), the tokens
it may take and its scorer; its kind is its scorer's. Ids are stable: a baseline names them.

Prompts say exactly what form the answer takes, so that a scorer can be strict without being
unfair: code in one fenced block, JSON alone, the number alone, the form asked for.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass

from tp4.serving.api import Json
from tp4.measuring.qeval.checks import (
    AllCaps,
    Code,
    EachLine,
    EndsWith,
    Format,
    JsonAnswer,
    Kind,
    Lacks,
    Lines,
    Matches,
    Mentions,
    Numeric,
    Prose,
    Scorer,
    StartsWith,
    WordCount,
)


@dataclass(frozen=True)
class Task:
    id: str
    prompt: str
    max_tokens: int
    scorer: Scorer

    @property
    def kind(self) -> Kind:
        return self.scorer.kind


CODE_TAIL = " Use the standard library only. Reply with the code only, in one ```python block."
NUMBER_TAIL = " Reply with the number only."


def _code(id: str, signature: str, what: str, asserts: tuple[str, ...], max_tokens: int = 512) -> Task:
    function = signature.split("(", 1)[0]
    return Task(
        id, f"Write a Python function `{signature}` that {what}.{CODE_TAIL}", max_tokens, Code(function, asserts)
    )


def _is(value: Json) -> Callable[[Json], bool]:
    return lambda doc: doc == value


def _obj(properties: dict[str, Json], required: list[str] | None = None) -> dict[str, Json]:
    return {
        "type": "object",
        "properties": properties,
        "required": list(required if required is not None else properties),
        "additionalProperties": False,
    }


CODE: tuple[Task, ...] = (
    _code(
        "code_is_palindrome",
        "is_palindrome(s: str) -> bool",
        "tells whether s reads the same backwards, ignoring case and every character that is not a letter or a digit",
        (
            "assert is_palindrome('A man, a plan, a canal: Panama') is True",
            "assert is_palindrome('race a car') is False",
            "assert is_palindrome('') is True",
            "assert is_palindrome('No 1 in') is False",
            "assert is_palindrome('Was it a car or a cat I saw?') is True",
        ),
    ),
    _code(
        "code_fizzbuzz",
        "fizzbuzz(n: int) -> list[str]",
        "returns the FizzBuzz sequence for 1..n: 'Fizz' for multiples of 3, 'Buzz' for multiples of 5, 'FizzBuzz' for both, else the number as a string",
        (
            "assert fizzbuzz(5) == ['1', '2', 'Fizz', '4', 'Buzz']",
            "assert fizzbuzz(15)[-1] == 'FizzBuzz'",
            "assert fizzbuzz(0) == []",
            "assert len(fizzbuzz(100)) == 100 and fizzbuzz(100).count('FizzBuzz') == 6",
        ),
    ),
    _code(
        "code_merge_intervals",
        "merge_intervals(intervals: list[list[int]]) -> list[list[int]]",
        "merges overlapping or touching closed intervals [start, end] and returns them sorted by start",
        (
            "assert merge_intervals([[1, 3], [2, 6], [8, 10], [15, 18]]) == [[1, 6], [8, 10], [15, 18]]",
            "assert merge_intervals([[1, 4], [4, 5]]) == [[1, 5]]",
            "assert merge_intervals([]) == []",
            "assert merge_intervals([[5, 7], [1, 2], [2, 3]]) == [[1, 3], [5, 7]]",
            "assert merge_intervals([[1, 10], [2, 3]]) == [[1, 10]]",
        ),
    ),
    _code(
        "code_interval_intersect",
        "intersect(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int] | None",
        "returns the intersection of two closed integer intervals (start, end) with start <= end, or None when they do not overlap",
        (
            "assert intersect((1, 5), (3, 8)) == (3, 5)",
            "assert intersect((1, 2), (3, 4)) is None",
            "assert intersect((1, 3), (3, 9)) == (3, 3)",
            "assert intersect((0, 10), (2, 4)) == (2, 4)",
            "assert intersect((5, 6), (1, 5)) == (5, 5)",
        ),
    ),
    _code(
        "code_to_roman",
        "to_roman(n: int) -> str",
        "converts an integer from 1 to 3999 to a Roman numeral",
        (
            "assert to_roman(1) == 'I'",
            "assert to_roman(4) == 'IV'",
            "assert to_roman(1994) == 'MCMXCIV'",
            "assert to_roman(3999) == 'MMMCMXCIX'",
            "assert to_roman(58) == 'LVIII'",
        ),
    ),
    _code(
        "code_from_roman",
        "from_roman(s: str) -> int",
        "converts a valid Roman numeral (I to MMMCMXCIX) to an integer",
        (
            "assert from_roman('III') == 3",
            "assert from_roman('IX') == 9",
            "assert from_roman('MCMXCIV') == 1994",
            "assert from_roman('CDXLIV') == 444",
        ),
    ),
    _code(
        "code_flatten",
        "flatten(items: list) -> list",
        "flattens arbitrarily nested lists into one list, keeping the order of the elements",
        (
            "assert flatten([1, [2, [3, [4]], 5]]) == [1, 2, 3, 4, 5]",
            "assert flatten([]) == []",
            "assert flatten([[], [[]]]) == []",
            "assert flatten(['ab', ['cd']]) == ['ab', 'cd']",
        ),
    ),
    _code(
        "code_top_words",
        "top_words(text: str, k: int) -> list[tuple[str, int]]",
        "returns the k most frequent words of text with their counts; words are runs of the letters a-z after lower-casing; ties are ordered alphabetically",
        (
            "assert top_words('the cat and the hat and the bat', 2) == [('the', 3), ('and', 2)]",
            "assert top_words('b a c b a', 3) == [('a', 2), ('b', 2), ('c', 1)]",
            "assert top_words('', 3) == []",
            "assert top_words('Dog dog DOG, cat!', 1) == [('dog', 3)]",
        ),
    ),
    _code(
        "code_rle",
        "rle(s: str) -> str",
        "run-length encodes s as count then character for each run, e.g. 'aaabcc' becomes '3a1b2c'",
        (
            "assert rle('aaabcc') == '3a1b2c'",
            "assert rle('') == ''",
            "assert rle('a') == '1a'",
            "assert rle('aaaaaaaaaaaab') == '12a1b'",
            "assert rle('abab') == '1a1b1a1b'",
        ),
    ),
    _code(
        "code_primes_below",
        "primes_below(n: int) -> list[int]",
        "returns every prime number smaller than n, in increasing order",
        (
            "assert primes_below(10) == [2, 3, 5, 7]",
            "assert primes_below(2) == []",
            "assert primes_below(3) == [2]",
            "assert len(primes_below(10000)) == 1229",
            "assert primes_below(30)[-1] == 29",
        ),
    ),
    _code(
        "code_leftmost_index",
        "leftmost_index(xs: list[int], x: int) -> int",
        "returns the index of the first occurrence of x in the sorted list xs, or -1 when x is absent, in O(log n) time",
        (
            "assert leftmost_index([1, 2, 2, 2, 3], 2) == 1",
            "assert leftmost_index([], 1) == -1",
            "assert leftmost_index([1, 3, 5], 4) == -1",
            "assert leftmost_index([7] * 1000, 7) == 0",
            "assert leftmost_index(list(range(0, 100000, 2)), 99998) == 49999",
        ),
    ),
    _code(
        "code_transpose",
        "transpose(m: list[list[int]]) -> list[list[int]]",
        "returns the transpose of a rectangular matrix given as a list of rows",
        (
            "assert transpose([[1, 2, 3], [4, 5, 6]]) == [[1, 4], [2, 5], [3, 6]]",
            "assert transpose([[1]]) == [[1]]",
            "assert transpose([]) == []",
            "assert transpose([[1, 2]]) == [[1], [2]]",
        ),
    ),
    _code(
        "code_balanced",
        "balanced(s: str) -> bool",
        "tells whether the brackets (), [] and {} in s are balanced and properly nested; other characters are ignored",
        (
            "assert balanced('([]{})') is True",
            "assert balanced('([)]') is False",
            "assert balanced('') is True",
            "assert balanced('((') is False",
            "assert balanced('a(b[c]d)e') is True",
            "assert balanced(')(') is False",
        ),
    ),
    _code(
        "code_lcs_length",
        "lcs_length(a: str, b: str) -> int",
        "returns the length of the longest common subsequence of a and b",
        (
            "assert lcs_length('ABCBDAB', 'BDCABA') == 4",
            "assert lcs_length('', 'abc') == 0",
            "assert lcs_length('abc', 'abc') == 3",
            "assert lcs_length('abc', 'def') == 0",
            "assert lcs_length('a' * 300, 'a' * 300) == 300",
        ),
    ),
)

PERSON = _obj(
    {
        "name": {"type": "string", "minLength": 1},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "email": {"type": "string", "pattern": "^[^@\\s]+@[^@\\s]+\\.[^@\\s]+$"},
        "tags": {"type": "array", "items": {"type": "string"}, "minItems": 3, "maxItems": 3},
    }
)
ESCAPED = 'He said "hi" \\ then left.'

JSON: tuple[Task, ...] = (
    Task(
        "json_person",
        "Invent a fictional person and describe them as a JSON object with exactly these fields: name (a string), "
        "age (an integer from 0 to 120), email (an email address) and tags (an array of exactly 3 strings). Reply with the JSON only.",
        256,
        JsonAnswer(PERSON),
    ),
    Task(
        "json_first_primes",
        "Reply with a JSON array holding the first five prime numbers, in increasing order, and nothing else.",
        64,
        JsonAnswer(
            {"type": "array", "items": {"type": "integer"}, "minItems": 5, "maxItems": 5},
            (("the first five primes", _is([2, 3, 5, 7, 11])),),
        ),
    ),
    Task(
        "json_escape",
        'Reply with a JSON object with a single key "text" whose value is exactly this sentence, with its quotes and '
        f"its backslash: {ESCAPED}\nReply with the JSON only.",
        64,
        JsonAnswer(
            _obj({"text": {"type": "string"}}),
            ((f"text is exactly {ESCAPED!r}", lambda doc: isinstance(doc, dict) and doc["text"] == ESCAPED),),
        ),
    ),
    Task(
        "json_nested_config",
        'Write a JSON configuration object with a key "server" holding an object with "host" set to "localhost" '
        'and "port" set to the number 8080, a key "debug" set to false and a key "retries" set to 3. Reply with the JSON only.',
        128,
        JsonAnswer(
            _obj(
                {
                    "server": _obj({"host": {"type": "string"}, "port": {"type": "integer"}}),
                    "debug": {"type": "boolean"},
                    "retries": {"type": "integer"},
                }
            ),
            (
                (
                    "the values asked for",
                    _is({"server": {"host": "localhost", "port": 8080}, "debug": False, "retries": 3}),
                ),
            ),
        ),
    ),
    Task(
        "json_sum",
        'Given the numbers 17, 4, 23, 8 and 12, reply with a JSON object with a key "numbers" (the numbers as an array, in '
        'the order given) and a key "sum" (their sum). Reply with the JSON only.',
        96,
        JsonAnswer(
            _obj({"numbers": {"type": "array", "items": {"type": "integer"}}, "sum": {"type": "integer"}}),
            (
                ("numbers in order", lambda doc: isinstance(doc, dict) and doc["numbers"] == [17, 4, 23, 8, 12]),
                ("sum is 64", lambda doc: isinstance(doc, dict) and doc["sum"] == 64),
            ),
        ),
    ),
    Task(
        "json_inventory",
        'Turn this into a JSON array of objects with the keys "item" (string), "qty" (integer) and "price" (number), '
        "one object per item, in the order given: apples 3 at 0.5, pears 2 at 0.75, plums 10 at 0.2. Reply with the JSON only.",
        160,
        JsonAnswer(
            {
                "type": "array",
                "minItems": 3,
                "maxItems": 3,
                "items": _obj({"item": {"type": "string"}, "qty": {"type": "integer"}, "price": {"type": "number"}}),
            },
            (
                (
                    "the three items with their quantities and prices",
                    _is(
                        [
                            {"item": "apples", "qty": 3, "price": 0.5},
                            {"item": "pears", "qty": 2, "price": 0.75},
                            {"item": "plums", "qty": 10, "price": 0.2},
                        ]
                    ),
                ),
            ),
        ),
    ),
    Task(
        "json_factors",
        'For the number 91, reply with a JSON object with the keys "n" (the number), "is_prime" (a boolean) and "factors" '
        "(its prime factors as an array of integers in increasing order). Reply with the JSON only.",
        96,
        JsonAnswer(
            _obj(
                {
                    "n": {"type": "integer"},
                    "is_prime": {"type": "boolean"},
                    "factors": {"type": "array", "items": {"type": "integer"}},
                }
            ),
            (("91 = 7 * 13, not prime", _is({"n": 91, "is_prime": False, "factors": [7, 13]})),),
        ),
    ),
    Task(
        "json_unicode",
        'Reply with a JSON object with the keys "city" and "country" for the largest city of Switzerland, its name '
        "spelt in German with its umlaut, the country's name in English. Reply with the JSON only.",
        64,
        JsonAnswer(
            _obj({"city": {"type": "string"}, "country": {"type": "string"}}),
            (("Zürich, Switzerland", _is({"city": "Zürich", "country": "Switzerland"})),),
        ),
    ),
)

NUMERIC: tuple[Task, ...] = (
    Task("math_product", "What is 127 multiplied by 43?" + NUMBER_TAIL, 32, Numeric(5461)),
    Task("math_percent", "What is 15% of 240?" + NUMBER_TAIL, 32, Numeric(36)),
    Task("math_fraction", "Write 7/8 as a decimal number." + NUMBER_TAIL, 32, Numeric(0.875)),
    Task(
        "math_sqrt2",
        "What is the square root of 2, rounded to four decimal places?" + NUMBER_TAIL,
        32,
        Numeric(1.4142, tolerance=1e-4),
    ),
    Task(
        "math_speed",
        "A train travels 180 km in 2.5 hours at a constant speed. What is its speed in km/h?" + NUMBER_TAIL,
        32,
        Numeric(72),
    ),
    Task(
        "math_compound",
        "1000 euros earn 5% interest per year, compounded yearly. How many euros are there after 3 years?"
        + NUMBER_TAIL,
        48,
        Numeric(1157.625, tolerance=0.01),
    ),
    Task("math_series", "What is the sum of the integers from 1 to 100?" + NUMBER_TAIL, 32, Numeric(5050)),
    Task("math_week_minutes", "How many minutes are there in a week?" + NUMBER_TAIL, 32, Numeric(10080)),
    Task("math_gcd", "What is the greatest common divisor of 84 and 126?" + NUMBER_TAIL, 32, Numeric(42)),
    Task(
        "math_fahrenheit",
        "Convert 98.6 degrees Fahrenheit to degrees Celsius." + NUMBER_TAIL,
        32,
        Numeric(37, tolerance=0.05),
    ),
    Task("math_precedence", "What is 3 - 10 * 2?" + NUMBER_TAIL, 32, Numeric(-17)),
)

FORMAT: tuple[Task, ...] = (
    Task(
        "fmt_three_lines",
        "Name the three primary colours of paint, one per line, with nothing else.",
        32,
        Format((Lines(3), EachLine(r"[A-Za-z]+", "a single word"), Mentions(("red", "yellow", "blue")))),
    ),
    Task(
        "fmt_all_caps",
        "Write one sentence about the sea, entirely in capital letters.",
        64,
        Format((Lines(1), AllCaps(), WordCount(4, 30))),
    ),
    Task(
        "fmt_ends_with",
        'Write one sentence about autumn whose last word is "leaves".',
        64,
        Format((Lines(1), EndsWith("leaves"), WordCount(4, 40))),
    ),
    Task(
        "fmt_iso_date",
        "Write the date 4 July 1976 in ISO 8601 form (YYYY-MM-DD). Reply with the date only.",
        16,
        Format((Matches(r"1976-07-04", "the date 1976-07-04 alone"),)),
    ),
    Task(
        "fmt_no_letter_e",
        "Write one sentence of 5 to 15 words about a cat without using the letter e anywhere.",
        64,
        Format((Lines(1), Lacks("e"), WordCount(5, 15))),
    ),
    Task(
        "fmt_bullets",
        'Name four planets of the solar system as exactly four bullet points, each line starting with "- ", and nothing else.',
        48,
        Format((Lines(4), EachLine(r"- \S.*", "a bullet point '- ...'"))),
    ),
    Task(
        "fmt_numbered",
        'List five fruits as a numbered list ("1. " to "5. "), one per line, and nothing else.',
        64,
        Format(
            (
                Matches(
                    r"1\. \S[^\n]*\n2\. \S[^\n]*\n3\. \S[^\n]*\n4\. \S[^\n]*\n5\. \S[^\n]*", "a numbered list 1. to 5."
                ),
            )
        ),
    ),
    Task(
        "fmt_one_word",
        'Reply with exactly one word: the opposite of "hot".',
        8,
        Format((Matches(r"(?i)cold\.?", "the single word cold"),)),
    ),
    Task(
        "fmt_csv",
        "Write a CSV table with the header line name,age followed by exactly two data rows of made-up people. Reply with the CSV only.",
        64,
        Format((Lines(3), StartsWith("name,age"), EachLine(r"[^,]+,[^,]+", "two comma-separated fields"))),
    ),
)

PROSE: tuple[Task, ...] = (
    Task("prose_tcp", "In 80 to 200 words, explain what TCP does and why it is used.", 400, Prose(60, 260, ("TCP",))),
    Task(
        "prose_lighthouse",
        "Write a short story of about 150 words about a lighthouse keeper.",
        450,
        Prose(80, 300, ("lighthouse",)),
    ),
    Task(
        "prose_photosynthesis",
        "Explain photosynthesis to a twelve-year-old in one paragraph of 60 to 150 words.",
        350,
        Prose(50, 200, ("light",)),
    ),
    Task(
        "prose_thank_you",
        "Write a short thank-you note of 40 to 120 words to a teacher who is retiring.",
        300,
        Prose(30, 160, ("thank",)),
    ),
    Task(
        "prose_lists_tuples",
        "In one paragraph of 60 to 180 words, compare Python lists and tuples.",
        400,
        Prose(50, 230, ("list", "tuple")),
    ),
)

TASKS: tuple[Task, ...] = CODE + JSON + NUMERIC + FORMAT + PROSE


def suite_digest(tasks: tuple[Task, ...] = TASKS) -> str:
    """What identifies the suite (ids, prompts, max_tokens): a baseline of another suite says so."""
    data = json.dumps([[t.id, t.kind, t.prompt, t.max_tokens] for t in tasks], ensure_ascii=False)
    return hashlib.sha256(data.encode()).hexdigest()[:16]
