"""Answer grading the way MMLongBench-Doc scores answers, implemented here (no judge model).

MMLongBench-Doc scores in two steps: a judge model first *extracts* a short answer from the
free-form response, then fixed rules compare it with the key by the question's
`answer_format`. We have no judge model, so step 1 is a rule (`extract_answer`); step 2
follows the benchmark's `eval_score`, with the small fixes noted below.

Step 1, `extract_answer(response, fmt)`:
  - the first non-empty line; a leading "Answer:" / "The answer is" / "Extracted answer:"
    is dropped, and one trailing period;
  - a response that says the question cannot be answered ("not answerable", "cannot be
    answered", "not mentioned in the document", "no information", ...) becomes
    "Not answerable", whatever the format;
  - Int / Float: the first number in that line ("about 1,234 adults" -> "1234";
    "21%" -> "21"; "three" -> "3" for zero..twenty);
  - List: a Python-style list literal ("['a', 'b']") when the line holds one, else the line
    split on commas, semicolons and a final "and" ("a, b and c" -> ["a", "b", "c"]).

Step 2, `score_answer(key, response, fmt)` -> float in [0, 1] (the benchmark's per-question
score; accuracy is its mean):
  - cleaning (both sides, `clean`): lower case, parenthesised asides dropped, surrounding
    quotes, a leading "$", a trailing "%" and a trailing period stripped, thousands commas
    removed inside numbers, units "mile(s)" / "million" dropped (the benchmark meant to,
    but its `rstrip` result was discarded).
  - Int: numeric equality of the cleaned numbers. "541" vs "541 adults" = 1; "21%" vs "21"
    = 1 (the benchmark's `int("21%")` failed on such keys and scored 0); "541" vs "542" = 0;
    "8367277000" vs "8,367,277,000" = 1. A key that is no number ("13:51 CET") is
    compared as Str.
  - Float: equal within 1% relative, or equal after rounding to the shorter precision (at
    least 2 decimals), where the key may also be read as a percentage (key/100, key x 100).
    "92%" vs "0.92" = 1; "56.8" vs "56.80" = 1; "3.80" vs "3.9" = 0; "0.833" vs "83.3%" = 1.
  - Str: keys that must match exactly (URLs, file names, phone numbers, dates, times, e-mail
    addresses, "page ...") need equal cleaned strings; other keys score ANLS: 1 -
    Levenshtein distance / longer length, 0 at or below 0.5. "Pyke" vs "pyke" = 1;
    "2022-01-05" vs "2022-01-06" = 0; "Little Rock" vs "Little Rock, Arkansas" = 0.52
    (partial credit); "Little Rock" vs "Rockford" = 0.
  - List (order-free set match): both sides as lists; lengths must agree; elements cleaned
    and sorted; numeric or exact-match elements need the sorted lists equal, others score the
    minimum ANLS over the sorted pairs. "['3', '1']" vs "1, 3" = 1; "['yellow', 'black and
    white']" vs "['black and white', 'yellow']" = 1; vs "['yellow']" = 0. A key that is not
    a list literal ("0.66") is a one-element list.
  - None ("Not answerable"): correct (1) when the extracted answer is "Not answerable".
    Keys of the form "Not answerable or 0 or none" also accept the other alternatives
    (cleaned-string equality).

`agreement(response_a, response_b, fmt)` is True when two responses give the same extracted,
cleaned answer (numbers compared as numbers, lists as sorted lists): it needs no key, and
is how answers under a refresh policy are compared with the full-prefill answer.

Public API:
  NOT_ANSWERABLE = "Not answerable"
  FORMATS = ("Str", "Int", "Float", "List", "None")
  extract_answer(response, fmt) -> str | list[str]
  clean(text) -> str
  anls(key, prediction, threshold=0.5) -> float
  score_answer(key, response, fmt) -> float
  agreement(response_a, response_b, fmt) -> bool
"""

from __future__ import annotations

import ast
import math
import re

from rapidfuzz.distance import Levenshtein

NOT_ANSWERABLE = "Not answerable"
FORMATS = ("Str", "Int", "Float", "List", "None")

_LEAD = re.compile(r"^(?:extracted answer|final answer|short answer|answer)\s*[:\-]\s*"
                   r"|^the (?:final |correct )?answer is\s*[:\-]?\s*", re.IGNORECASE)
_UNANSWERABLE = re.compile(
    r"not answerable|unanswerable|cannot be answered|can ?not be answered|can't be answered"
    r"|cannot be determined|can ?not be determined|not (?:be )?(?:mentioned|provided|stated|"
    r"specified|given|available|found|included)|no (?:relevant )?information|not enough "
    r"information|insufficient information|(?:does|do) not (?:mention|provide|specify|"
    r"state|contain|include|say)|(?:doesn't|don't) (?:mention|provide|specify|state|"
    r"contain|include|say)",
    re.IGNORECASE)
_NUMBER = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)?(?:\.\d+)?")
_WORDS = {w: str(i) for i, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
    "fifteen sixteen seventeen eighteen nineteen twenty".split())}
_WORD_NUMBER = re.compile(r"\b(" + "|".join(_WORDS) + r")\b", re.IGNORECASE)
_PAREN = re.compile(r"\s*\([^)]*\)")
_QUOTES = re.compile(r"^['\"`]+|['\"`]+$")
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}\b)")
_UNITS = re.compile(r"\s*\b(?:miles?|million)$")
_EXACT = (
    re.compile(r"\d+(?:-\d+|\s\d+)?"),  # telephone-like numbers
    re.compile(r"\d{4}[-\s]\d{2}[-\s]\d{2}"),  # YYYY-MM-DD
    re.compile(r"\d{4}[-\s]\d{2}"),  # YYYY-MM
    re.compile(r"[a-zA-Z0-9._%+-]+@[a-zA-Z0-9.-]+\.[a-zA-Z]{2,}"),  # e-mail
)


def _first_line(response: str) -> str:
    line = next((ln.strip() for ln in response.splitlines() if ln.strip()), "")
    for _ in range(2):  # "Answer: The answer is 5"
        line = _LEAD.sub("", line).strip()
    return line.removesuffix(".").strip()


def _first_number(text: str) -> str | None:
    text = _WORD_NUMBER.sub(lambda m: _WORDS[m.group(1).lower()], text)
    for m in _NUMBER.finditer(text):
        token = m.group(0)
        if any(c.isdigit() for c in token):
            return token.replace(",", "").lstrip("+")
    return None


def _split_list(line: str) -> list[str]:
    start, stop = line.find("["), line.rfind("]")
    if 0 <= start < stop:
        try:
            value = ast.literal_eval(line[start:stop + 1])
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            value = None
        if isinstance(value, (list, tuple)):
            return [str(v) for v in value]
        line = line[start + 1:stop]
    parts = re.split(r"\s*;\s*|\s*,\s*(?:and\s+)?|\s+and\s+(?=[^,]*$)", line)
    return [p.strip() for p in parts if p.strip()]


def extract_answer(response: str, fmt: str) -> str | list[str]:
    """The short answer in a free-form `response` (step 1 of the module docstring)."""
    line = _first_line(response)
    if _UNANSWERABLE.search(line):
        return NOT_ANSWERABLE
    if fmt in ("Int", "Float"):
        number = _first_number(line)
        return line if number is None else number
    if fmt == "List":
        return _split_list(line)
    return line


def clean(text: str) -> str:
    """The benchmark's `get_clean_string`, with units really dropped and thousands commas
    removed (see the module docstring)."""
    s = str(text).lower().strip()
    s = _PAREN.sub("", s).strip()
    s = _QUOTES.sub("", s).strip()
    s = s.lstrip("$").strip().rstrip("%").strip()
    s = _UNITS.sub("", s).strip().removesuffix(".").strip()
    return _THOUSANDS.sub("", s)


def anls(key: str, prediction: str, threshold: float = 0.5) -> float:
    """1 - normalised Levenshtein distance, 0 at or below `threshold` (the benchmark's ANLS)."""
    length = max(len(key), len(prediction))
    value = 1.0 - (Levenshtein.distance(key, prediction) / length if length else 0.0)
    return 0.0 if value <= threshold else value


def _is_exact(s: str) -> bool:
    return ("https://" in s or s.endswith((".py", "ipynb")) or s.startswith("page")
            or "a.m." in s or "p.m." in s or any(p.fullmatch(s) for p in _EXACT))


def _number(text: str) -> float | None:
    try:
        value = float(clean(text).replace(",", ""))
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _precision(value: float) -> int:
    text = repr(value)
    return len(text.split(".")[-1]) if "." in text and "e" not in text else 3


def _float_equal(key: float, pred: float) -> bool:
    for ref in (key / 100, key, key * 100):
        if math.isclose(ref, pred, rel_tol=0.01):
            return True
        digits = max(min(_precision(pred), _precision(ref)), 2)
        if round(pred, digits) == round(ref, digits):
            return True
    return False


def _as_list(value: str | list[str]) -> list[str]:
    if isinstance(value, list):
        return value
    text = value.strip()
    if text.startswith("["):
        try:
            parsed = ast.literal_eval(text)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            parsed = None
        if isinstance(parsed, (list, tuple)):
            return [str(v) for v in parsed]
    return [text]


def _score_list(key: list[str], pred: list[str]) -> float:
    if len(key) != len(pred) or not key:
        return 0.0
    gold = sorted(clean(a) for a in key)
    got = sorted(clean(a) for a in pred)
    if _number(gold[0]) is not None or _is_exact(gold[0]):
        return float(gold == got)
    return min(anls(g, p) for g, p in zip(gold, got, strict=True))


def score_answer(key: str, response: str, fmt: str) -> float:
    """The question's score in [0, 1] (step 2 of the module docstring)."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown answer_format {fmt!r}; known: {', '.join(FORMATS)}")
    pred = extract_answer(response, fmt)
    if fmt == "None" or clean(key) == clean(NOT_ANSWERABLE):
        if pred == NOT_ANSWERABLE:
            return 1.0
        alternatives = {clean(a) for a in key.split(" or ")} - {clean(NOT_ANSWERABLE)}
        return float(isinstance(pred, str) and clean(pred) in alternatives)
    if pred == NOT_ANSWERABLE:
        return 0.0
    if fmt == "List":
        return _score_list(_as_list(key), _as_list(pred))
    assert isinstance(pred, str)
    gold = _number(key) if fmt in ("Int", "Float") else None
    if gold is not None:
        got = _number(pred)
        if got is None:
            return 0.0
        return float(gold == got) if fmt == "Int" else float(_float_equal(gold, got))
    if fmt in ("Int", "Float"):  # a key that is no number ("13:51 CET"): compared as Str
        pred = _first_line(response)
    gold_s, got_s = clean(key), clean(pred)
    return float(gold_s == got_s) if _is_exact(gold_s) else anls(gold_s, got_s)


def _canonical(response: str, fmt: str) -> object:
    pred = extract_answer(response, fmt)
    if pred == NOT_ANSWERABLE:
        return NOT_ANSWERABLE
    if isinstance(pred, list):
        return tuple(sorted(clean(p) for p in pred))
    if fmt in ("Int", "Float"):
        number = _number(pred)
        if number is not None:
            return number
    return clean(pred)


def agreement(response_a: str, response_b: str, fmt: str) -> bool:
    """Whether two responses give the same normalised answer (no key needed)."""
    return _canonical(response_a, fmt) == _canonical(response_b, fmt)
