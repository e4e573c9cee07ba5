"""The testbed task: documents of short records on a grid of glyph cells, and questions.

A document has `N_PAGES` pages of `ROWS` rows x `COLS` cells; every record is one row that
starts with its key (a letter unique in the document). Four families of records, so that
what a question needs sits on one page or on several:

  lookup     "K=5"        the value is on the record's own page (control)
  reference  "F=B+3"      F = (B + 3) mod 10, B a lookup record on an earlier page
  legend     "G=38"       a legend on page 1 ("#2") says which digit counts: here 8
  split      "H=" | "7"   the key ends one page, its value starts the next

Every record has a *result cell*: the cell whose prefill can hold the resolved value (the
value digit, the offset digit, the second digit, the carried-over digit). Training asks the
model to predict, at every key cell, its key, and at every result cell, the record's resolved
value; page-local prefill then loses exactly the cross-page part.

Public API:
  FAMILIES, COLS, ROWS, N_PAGES
  Record(key, family, answer, evidence_pages, page, cell)   pages 1-based, cell = row*COLS+col
  Document(pages: list[list[str]], records, legend_column)
    .aux_targets(page) -> list[tuple[int, str]]     (cell, character) for one page (0-based)
  make_document(rng) -> Document
  question_text(key) -> str                         "What is K?"
"""

from __future__ import annotations

import random
import string
from dataclasses import dataclass, field

FAMILIES = ("reference", "split", "legend", "lookup")
COLS, ROWS, N_PAGES = 6, 6, 3


@dataclass(frozen=True)
class Record:
    """One record and the answer to the question about it."""

    key: str
    family: str
    answer: str  # one digit
    evidence_pages: tuple[int, ...]  # 1-based, ascending
    page: int  # 0-based page of the result cell
    cell: int  # row * COLS + col of the result cell on that page
    key_page: int  # 0-based page of the key cell
    key_cell: int


@dataclass
class Document:
    """The pages (rows of COLS characters) and the records on them."""

    pages: list[list[str]]
    records: list[Record] = field(default_factory=list)
    legend_column: int = 1

    def aux_targets(self, page: int) -> list[tuple[int, str]]:
        """Auxiliary training targets on `page`: key cells -> key, result cells -> value."""
        out = [(r.key_cell, r.key) for r in self.records if r.key_page == page]
        out += [(r.cell, r.answer) for r in self.records if r.page == page]
        return sorted(out)


def question_text(key: str) -> str:
    """The question asked about record `key`."""
    return f"What is {key}?"


class _Builder:
    """Fills pages row by row."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.keys = list(string.ascii_uppercase)
        rng.shuffle(self.keys)
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
        row = self.add(page, f"{k}={v}")
        self.lookups.append((k, page, v))
        self.records.append(Record(k, "lookup", str(v), (page + 1,), page, row * COLS + 2,
                                   page, row * COLS))

    def reference(self, page: int) -> None:
        earlier = [x for x in self.lookups if x[1] < page]
        ref, ref_page, ref_value = self.rng.choice(earlier)
        k, off = self.key(), self.rng.randint(1, 4)
        row = self.add(page, f"{k}={ref}+{off}")
        self.records.append(Record(k, "reference", str((ref_value + off) % 10),
                                   tuple(sorted({ref_page + 1, page + 1})), page,
                                   row * COLS + 4, page, row * COLS))

    def legend(self, page: int, column: int) -> None:
        k, a, b = self.key(), self.rng.randrange(10), self.rng.randrange(10)
        row = self.add(page, f"{k}={a}{b}")
        self.records.append(Record(k, "legend", str(a if column == 1 else b), (1, page + 1),
                                   page, row * COLS + 3, page, row * COLS))

    def split(self, page: int) -> None:
        """Key on the last row of `page`, value on the first row of `page + 1`."""
        k, v = self.key(), self.rng.randrange(10)
        row = self.add(page, f"{k}=")
        assert row == ROWS - 1 and not self.rows[page + 1]
        self.add(page + 1, str(v))
        self.records.append(Record(k, "split", str(v), (page + 1, page + 2), page + 1, 0,
                                   page, row * COLS))


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
