"""The testbed task: documents of short records on a grid of glyph cells, and questions.

A document has `N_PAGES` pages of `ROWS` rows x `COLS` cells; every record is one row that
ends with its key (a letter unique in the document), read "value = key". Four families, so
that what a question needs sits on one page or on several:

  lookup     "5=K"        the value is on the record's own page (control)
  reference  "B=F"        F has B's value, B a lookup record on an earlier page
  legend     "3Q=G"       a legend on page 1 says which counts, "#1" the digit, "#2" the
                          letter: here Q under "#2" (the two differ in kind, not only place)
  split      "7=" | "H"   the value ends one page, its key starts the next

The key cell is the record's *result cell*: the one token whose prefill can hold the resolved
value, and the one a question about the key finds by its glyph. Training asks the model to
predict, at every key cell, the record's resolved value; page-local prefill then loses
exactly the cross-page part.

Public API:
  FAMILIES, COLS, ROWS, N_PAGES, LEGEND_CELL
  Record(key, family, answer, evidence_pages, page, cell)   pages 1-based, cell = row*COLS+col
  Document(pages: list[list[str]], records, legend_column)
    .aux_targets(page, shown) -> list[tuple[int, str]]   (cell, answer) on one page (0-based)
    .source(record) -> (page, cell) | None         the cell on another page a key cell reads
  make_document(rng) -> Document
  question_text(key) -> str                         "What is K?"
"""

from __future__ import annotations

import random
import string
from collections.abc import Iterable
from dataclasses import dataclass, field

FAMILIES = ("reference", "split", "legend", "lookup")
COLS, ROWS, N_PAGES = 6, 6, 3
LEGEND_CELL = 1  # "#2" opens page 1: the digit is its second cell
LEGEND_LETTERS = 6  # letters kept out of the keys for the legend records' second value


@dataclass(frozen=True)
class Record:
    """One record and the answer to the question about it."""

    key: str
    family: str
    answer: str  # one digit (a legend record under "#2": one letter, never a key)
    evidence_pages: tuple[int, ...]  # 1-based, ascending
    page: int  # 0-based page of the key (= result) cell
    cell: int  # row * COLS + col of the key cell on that page


@dataclass
class Document:
    """The pages (rows of COLS characters) and the records on them."""

    pages: list[list[str]]
    records: list[Record] = field(default_factory=list)
    legend_column: int = 1

    def aux_targets(self, page: int, shown: Iterable[int] | None = None
                    ) -> list[tuple[int, str]]:
        """Auxiliary training targets on `page`: each key cell -> its resolved value, for the
        records whose evidence pages are all among `shown` (0-based; None: every page)."""
        seen = set(range(len(self.pages)) if shown is None else shown)
        return sorted((r.cell, r.answer) for r in self.records
                      if r.page == page and all(p - 1 in seen for p in r.evidence_pages))

    def source(self, record: Record) -> tuple[int, int] | None:
        """The (page, cell) on another page that `record`'s key cell must read to resolve its
        value: the named record's key cell (reference), the legend's digit on page 1 (legend),
        the value cell at the end of the page before (split); None for a lookup."""
        if record.family == "reference":
            named = self.pages[record.page][record.cell // COLS][0]
            ref = next(r for r in self.records if r.key == named)
            return ref.page, ref.cell
        if record.family == "legend":
            return 0, LEGEND_CELL
        if record.family == "split":
            return record.page - 1, (ROWS - 1) * COLS
        return None


def question_text(key: str) -> str:
    """The question asked about record `key`."""
    return f"What is {key}?"


class _Builder:
    """Fills pages row by row."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.keys = list(string.ascii_uppercase)
        rng.shuffle(self.keys)
        self.letters = [self.keys.pop() for _ in range(LEGEND_LETTERS)]  # legend values
        self.rows: list[list[str]] = [[] for _ in range(N_PAGES)]
        self.records: list[Record] = []
        self.lookups: list[tuple[str, int, int]] = []  # (key, page, value)

    def key(self) -> str:
        return self.keys.pop()

    def add(self, page: int, text: str) -> int:
        """Append a row to `page`; returns its row index."""
        self.rows[page].append(text.ljust(COLS))
        return len(self.rows[page]) - 1

    def lookup(self, page: int) -> None:
        k, v = self.key(), self.rng.randrange(10)
        row = self.add(page, f"{v}={k}")
        self.lookups.append((k, page, v))
        self.records.append(Record(k, "lookup", str(v), (page + 1,), page, row * COLS + 2))

    def reference(self, page: int) -> None:
        earlier = [x for x in self.lookups if x[1] < page]
        ref, ref_page, ref_value = self.rng.choice(earlier)
        k = self.key()
        row = self.add(page, f"{ref}={k}")
        self.records.append(Record(k, "reference", str(ref_value),
                                   tuple(sorted({ref_page + 1, page + 1})), page,
                                   row * COLS + 2))

    def legend(self, page: int, column: int) -> None:
        """A digit and a letter; the legend's column says which one the key has."""
        k, a, q = self.key(), str(self.rng.randrange(10)), self.rng.choice(self.letters)
        row = self.add(page, f"{a}{q}={k}")
        self.records.append(Record(k, "legend", a if column == 1 else q, (1, page + 1),
                                   page, row * COLS + 3))

    def split(self, page: int) -> None:
        """Value on the last row of `page`, key on the first row of `page + 1`."""
        k, v = self.key(), self.rng.randrange(10)
        row = self.add(page, f"{v}=")
        assert row == ROWS - 1 and not self.rows[page + 1]
        self.add(page + 1, k)
        self.records.append(Record(k, "split", str(v), (page + 1, page + 2), page + 1, 0))


def make_document(rng: random.Random) -> Document:
    """A random document with every family present (see the module docstring)."""
    b = _Builder(rng)
    column = rng.randint(1, 2)
    b.add(0, f"#{column}")
    while len(b.rows[0]) < ROWS - 1:
        b.lookup(0)
    b.split(0) if rng.random() < 0.5 else b.lookup(0)
    for page in range(1, N_PAGES):
        last = page == N_PAGES - 1
        kinds = ["reference", "reference", "legend", "legend", "lookup"]
        while len(b.rows[page]) < ROWS - (0 if last else 1):
            kinds = kinds or ["reference", "legend", "lookup"]
            kind = kinds.pop(rng.randrange(len(kinds)))
            if kind == "reference":
                b.reference(page)
            elif kind == "legend":
                b.legend(page, column)
            else:
                b.lookup(page)
        if not last:
            b.split(page)
    return Document(pages=b.rows, records=b.records, legend_column=column)
