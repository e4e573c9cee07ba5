"""The passage of a page's text that best matches a question, with the matched terms' spans.

Words match the way BM25 ranks them (`worker.retrieval.bm25`): lower-cased, English stop words
dropped, Snowball-stemmed with PyStemmer, so "inspected" in a question marks "inspection" on the
page. The passage is the window of at most `max_chars` characters (whitespace collapsed) that
covers the most distinct question terms, each weighted by its rarity on the page; it is then
centred on its first and last match and snapped to word boundaries.
"""

from __future__ import annotations

import functools
import math
import re
from collections import Counter
from dataclasses import dataclass

import Stemmer
from bm25s.stopwords import STOPWORDS_EN

SNIPPET_CHARS = 320
_WORD = re.compile(r"\w+")
_SPACE = re.compile(r"\s+")
_STOP = frozenset(STOPWORDS_EN)


@dataclass(frozen=True)
class Snippet:
    """A passage of page text. `spans` are `(start, end)` character offsets into `text` of
    words matching a question term; `clipped_left`/`clipped_right` say whether the page text
    goes on before/after the passage."""

    text: str
    spans: tuple[tuple[int, int], ...] = ()
    clipped_left: bool = False
    clipped_right: bool = False


@functools.cache
def _stemmer() -> Stemmer.Stemmer:
    return Stemmer.Stemmer("english")


def _terms(words: list[str]) -> list[str]:
    """Stems of `words` ('' for stop words, which never match)."""
    lowered = [w.lower() for w in words]
    stems = _stemmer().stemWords(lowered)
    return ["" if w in _STOP else s for w, s in zip(lowered, stems, strict=True)]


def best_snippet(question: str, page_text: str, max_chars: int = SNIPPET_CHARS) -> Snippet:
    """The passage of `page_text` that best matches `question` (see the module docstring).

    A page without text gives an empty snippet; a page where no question term occurs gives its
    opening `max_chars` characters without spans.
    """
    text = _SPACE.sub(" ", page_text).strip()
    if not text:
        return Snippet(text="")
    query = {t for t in _terms(_WORD.findall(question)) if t}
    matches = [m for m in _WORD.finditer(text)]
    stems = _terms([m.group() for m in matches])
    hits = [(m.start(), m.end(), s) for m, s in zip(matches, stems, strict=True) if s in query]
    if not hits:
        return _cut(text, 0, min(len(text), max_chars), [])
    counts = Counter(s for _, _, s in hits)
    weight = {s: 1.0 + math.log(len(matches) / c) for s, c in counts.items()}
    best = (-1.0, 0, 0)  # (score, first hit index, last hit index)
    last = 0
    for first in range(len(hits)):  # windows anchored at each hit: two pointers
        last = max(last, first)
        while last + 1 < len(hits) and hits[last + 1][1] - hits[first][0] <= max_chars:
            last += 1
        score = sum(weight[s] for s in {s for _, _, s in hits[first:last + 1]})
        if score > best[0]:
            best = (score, first, last)
    _, first, last = best
    lo, hi = hits[first][0], hits[last][1]
    slack = max_chars - (hi - lo)
    start = max(0, min(lo - slack // 2, len(text) - max_chars))
    end = min(len(text), start + max_chars)
    return _cut(text, start, end, [(s, e) for s, e, _ in hits[first:last + 1]])


def _cut(text: str, start: int, end: int, spans: list[tuple[int, int]]) -> Snippet:
    """`text[start:end]` snapped inwards to word boundaries, with `spans` made relative."""
    if start > 0 and text[start - 1].isalnum():
        space = text.find(" ", start, end)
        if space != -1 and all(s >= space + 1 for s, _ in spans):
            start = space + 1
    if end < len(text) and text[end].isalnum():
        space = text.rfind(" ", start, end)
        if space > start and all(e <= space for _, e in spans):
            end = space
    passage = text[start:end].strip()
    shift = start + (len(text[start:end]) - len(text[start:end].lstrip()))
    inside = tuple((s - shift, e - shift) for s, e in spans
                   if s >= start and e <= end)
    return Snippet(text=passage, spans=inside, clipped_left=start > 0,
                   clipped_right=end < len(text))
