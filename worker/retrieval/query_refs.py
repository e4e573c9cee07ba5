"""Pages a question points at by position or caption: "page 5", "the last page", "Figure 2".

Questions about real documents often name where the answer is rather than what it says:
"on page 14", "the cover page", "the last slide", "in Table 3", "shown in Figure 1-1".
BM25 drops one-character tokens and stop words, so "Figure 1" reaches it as "figur" and
"page 5" as "page", and the dense model does not count pages. `parse_refs` reads those
references from the question; `referenced_pages` marks, among a scope's pages, the ones
they point at:

- a page number matches the page at that physical position in its document, and a page
  whose printed folio (a first or last line that is just that number) says so;
- "first", "cover" or "front" page and "last", "final" or "back" page (also "slide") match
  each document's first and last page;
- "Figure N" / "Fig. N" / "Table N" / "Chart N" match pages whose text has that caption at
  the start of a line (strength 1.0), else pages that mention it (strength 0.5).

The search adds a fixed RRF-style bonus scaled by that strength (see `hybrid.search`), so a
named page rises among the pages the text rankings already like without overriding them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

_NUMBER = r"(\d{1,4})"
_PAGE_WORD = r"(?:pages?|pp?\.|slides?)"
_PAGE_REF = re.compile(
    rf"\b{_PAGE_WORD}\s*{_NUMBER}((?:\s*(?:,|and|&|-|to|through)\s*{_NUMBER})*)", re.IGNORECASE)
_MORE_NUMBERS = re.compile(_NUMBER)
_FIRST_PAGE = re.compile(r"\b(first|cover|front|title)\s+(page|slide)\b|\bcover\b",
                         re.IGNORECASE)
_LAST_PAGE = re.compile(r"\b(last|final|back|closing|ending)\s+(page|slide)\b|\bback cover\b",
                        re.IGNORECASE)
_CAPTION_KINDS = {"fig": "figure", "figure": "figure", "table": "table", "chart": "chart",
                  "exhibit": "exhibit"}
_CAPTION_REF = re.compile(r"\b(fig(?:ure)?|table|chart|exhibit)\.?\s*(\d{1,3}(?:[-.]\d{1,3})?)\b",
                          re.IGNORECASE)
MAX_PAGE_REFS = 8


@dataclass(frozen=True)
class QueryRefs:
    """What a question points at: physical page numbers, the first or last page, captions
    as `(kind, label)` such as `("figure", "1-1")`."""

    pages: tuple[int, ...] = ()
    first: bool = False
    last: bool = False
    captions: tuple[tuple[str, str], ...] = field(default=())

    def __bool__(self) -> bool:
        return bool(self.pages or self.first or self.last or self.captions)


def parse_refs(question: str) -> QueryRefs:
    """The page, position and caption references in `question` (empty when none)."""
    pages: list[int] = []
    for match in _PAGE_REF.finditer(question):
        numbers = [int(match.group(1))] + [int(n) for n in _MORE_NUMBERS.findall(match.group(2))]
        if re.search(r"-|to|through", match.group(2) or "") and len(numbers) == 2:
            low, high = sorted(numbers)
            numbers = list(range(low, min(high, low + MAX_PAGE_REFS - 1) + 1))
        pages.extend(n for n in numbers if n >= 1)
    captions = [(_CAPTION_KINDS[m.group(1).lower()], m.group(2).replace(".", "-"))
                for m in _CAPTION_REF.finditer(question)]
    return QueryRefs(
        pages=tuple(dict.fromkeys(pages))[:MAX_PAGE_REFS],
        first=bool(_FIRST_PAGE.search(question)),
        last=bool(_LAST_PAGE.search(question)),
        captions=tuple(dict.fromkeys(captions)),
    )


def _caption_pattern(kind: str, label: str, line_start: bool) -> re.Pattern[str]:
    word = {"figure": r"fig(?:ure)?\.?", "table": r"table", "chart": r"chart",
            "exhibit": r"exhibit"}[kind]
    number = r"[-.]".join(re.escape(part) for part in label.split("-"))
    prefix = r"(?m)^\s*" if line_start else r"\b"
    return re.compile(rf"{prefix}{word}\s*{number}(?![\d])", re.IGNORECASE)


_FOLIO = re.compile(r"^(?:page\s*)?(\d{1,4})(?:\s*(?:of|/)\s*\d{1,4})?$", re.IGNORECASE)


def _folios(text: str) -> set[int]:
    """The printed page number of a page: a number alone (or "Page N", "N of M") on one of
    its first two or last two non-empty lines, where headers and footers print it."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    edge = lines[:2] + lines[-2:] if len(lines) > 4 else lines
    return {int(m.group(1)) for m in map(_FOLIO.match, edge) if m}


def referenced_pages(refs: QueryRefs, documents: Sequence[str], numbers: Sequence[int],
                     texts: Sequence[str]) -> dict[int, float]:
    """Index -> strength (0-1] of the candidates `refs` points at.

    Candidates are given as parallel sequences: each one's document (any id), 1-based
    physical page number (0 when unknown) and text. The last page of a document is the
    highest page number among its candidates.
    """
    if not refs:
        return {}
    last: dict[str, int] = {}
    for document, number in zip(documents, numbers, strict=True):
        last[document] = max(last.get(document, 0), number)
    wanted = set(refs.pages)
    strong = [_caption_pattern(kind, label, True) for kind, label in refs.captions]
    weak = [_caption_pattern(kind, label, False) for kind, label in refs.captions]
    found: dict[int, float] = {}
    for i, (document, number, text) in enumerate(zip(documents, numbers, texts, strict=True)):
        strength = 0.0
        if number and (number in wanted or (refs.first and number == 1)
                       or (refs.last and number == last[document])):
            strength = 1.0
        elif wanted and _folios(text) & wanted:
            strength = 1.0
        if strength < 1.0 and refs.captions:
            if any(p.search(text) for p in strong):
                strength = 1.0
            elif any(p.search(text) for p in weak):
                strength = max(strength, 0.5)
        if strength:
            found[i] = strength
    return found
