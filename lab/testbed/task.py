"""The testbed task: documents of short records on pages of glyph cells, and questions.

A document has 6-8 pages (`Shape.pages`) of `rows` x `cols` cells (16 x 16 at page scale: 256
visual tokens, as a real checkpoint's page). Records sit in slots of 8 cells, two to a row,
among filler runs (digits and "+", never a key) and blank cells, as text sits among white
space. Every record ends with its key, a letter unique in the document ("value = key"). Five
families, so that what a question needs sits on one page or on several:

  lookup     "5=K"        the value is on the record's own page (control)
  reference  "B=F"        F has B's value, B a lookup record on an earlier page
  legend     "3Q=G"       a legend on page 1 says which counts, "#1" the digit, "#2" the
                          letter: here Q under "#2" (the two differ in kind, not only place)
  split      "7=" | "H"   the value ends one page (last row), its key starts the next
  pair       "What are K and M?"  two lookups on two different pages: "5 7"

The key cell is the record's *result cell*: the one token whose prefill can hold the resolved
value, and the one a question about the key finds by its glyph. Training asks the model to
predict, at every key cell, the record's resolved value; page-local prefill then loses
exactly the cross-page part (reference, split, legend). A pair question reads two pages at
question time: stale page KV loses nothing there, but both pages must be among those shown.

Public API:
  FAMILIES, Shape, PAGE (16 x 16, 6-8 pages), LEGEND_CELL
  Record(key, family, answer, evidence_pages, page, cell)   pages 1-based, cell = row*cols+col
  Question(records, family)  .key_text, .answer, .evidence_pages, .text
  Document(pages, records, legend_column, shape)
    .aux_targets(page, shown) -> list[tuple[int, str]]   (cell, answer) on one page (0-based)
    .source(record) -> (page, cell) | None         the cell on another page a key cell reads
    .question(family, rng) -> Question
  make_document(rng, shape) -> Document
"""

from __future__ import annotations

import random
import string
from collections.abc import Iterable
from dataclasses import dataclass, field

FAMILIES = ("reference", "split", "legend", "lookup", "pair")
LEGEND_CELL = 1  # "#2" opens page 1: the digit is its second cell
LEGEND_LETTERS = 6  # letters kept out of the keys for the legend records' second value
SLOT = 8  # cells per record slot; two slots per 16-cell row
FILLER = "0123456789+"  # filler runs: no letter, no "=", so never a key or a record


@dataclass(frozen=True)
class Shape:
    """Page grid and document length; `shown` bounds the pages a question is asked over."""

    cols: int = 16
    rows: int = 16
    pages: tuple[int, int] = (6, 8)  # pages per document, inclusive range
    shown: tuple[int, int] = (4, 6)  # pages shown per training question (gold + distractors)
    filler: float = 0.35  # share of free slots holding a filler run

    def __post_init__(self) -> None:
        if self.cols < SLOT or self.cols % SLOT:
            raise ValueError(f"cols must be a multiple of {SLOT}, got {self.cols}")
        if self.pages[0] < 4 or self.pages[0] > self.pages[1]:
            raise ValueError(f"pages must be a range from at least 4, got {self.pages}")
        if (self.rows - 2) * (self.cols // SLOT) < 8:  # records of a page: 6 at most
            raise ValueError(f"{self.rows} x {self.cols} leaves too few record slots")
        if not 1 <= self.shown[0] <= self.shown[1]:
            raise ValueError(f"shown must be a range from at least 1, got {self.shown}")

    @property
    def cells(self) -> int:
        """Visual tokens per page."""
        return self.cols * self.rows


PAGE = Shape()


@dataclass(frozen=True)
class Record:
    """One record and the answer to the question about it."""

    key: str
    family: str
    answer: str  # one digit (a legend record under "#2": one letter, never a key)
    evidence_pages: tuple[int, ...]  # 1-based, ascending
    page: int  # 0-based page of the key (= result) cell
    cell: int  # row * cols + col of the key cell on that page


@dataclass(frozen=True)
class Question:
    """A question about one record, or about two (`pair`), and its answer."""

    records: tuple[Record, ...]
    family: str

    @property
    def text(self) -> str:
        """The question as asked: "What is K?" or "What are K and M?"."""
        keys = [r.key for r in self.records]
        return f"What is {keys[0]}?" if len(keys) == 1 else f"What are {keys[0]} and {keys[1]}?"

    @property
    def answer(self) -> str:
        """One value, or two separated by a space."""
        return " ".join(r.answer for r in self.records)

    @property
    def evidence_pages(self) -> tuple[int, ...]:
        """1-based pages the answer needs, ascending."""
        return tuple(sorted({p for r in self.records for p in r.evidence_pages}))

    @property
    def evidence_indices(self) -> set[int]:
        """The evidence pages, 0-based (what `batches.shown_pages` takes as needed)."""
        return {p - 1 for p in self.evidence_pages}


@dataclass
class Document:
    """The pages (rows of `shape.cols` characters) and the records on them."""

    pages: list[list[str]]
    records: list[Record] = field(default_factory=list)
    legend_column: int = 1
    shape: Shape = PAGE

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
        cols = self.shape.cols
        if record.family == "reference":
            named = self.pages[record.page][record.cell // cols][record.cell % cols - 2]
            ref = next(r for r in self.records if r.key == named)
            return ref.page, ref.cell
        if record.family == "legend":
            return 0, LEGEND_CELL
        if record.family == "split":
            return record.page - 1, (self.shape.rows - 1) * cols
        return None

    def question(self, family: str, rng: random.Random) -> Question:
        """A random question of `family` about this document."""
        if family == "pair":
            lookups = [r for r in self.records if r.family == "lookup"]
            a = rng.choice(lookups)
            b = rng.choice([r for r in lookups if r.page != a.page])
            return Question(tuple(sorted((a, b), key=lambda r: (r.page, r.cell))), "pair")
        return Question((rng.choice([r for r in self.records if r.family == family]),), family)


class _Builder:
    """Places records in free slots of each page, then fills the rest."""

    def __init__(self, rng: random.Random, shape: Shape, n_pages: int):
        self.rng, self.shape = rng, shape
        self.keys = list(string.ascii_uppercase)
        rng.shuffle(self.keys)
        self.letters = [self.keys.pop() for _ in range(LEGEND_LETTERS)]  # legend values
        self.grid = [[[" "] * shape.cols for _ in range(shape.rows)] for _ in range(n_pages)]
        self.free = [[(r, c) for r in range(1, shape.rows - 1)
                      for c in range(0, shape.cols, SLOT)] for _ in range(n_pages)]
        for slots in self.free:
            rng.shuffle(slots)
        self.records: list[Record] = []
        self.lookups: list[tuple[str, int, int]] = []  # (key, page, value)

    def put(self, page: int, row: int, col: int, text: str) -> int:
        """Write `text` at (row, col) of `page`; returns the cell of its last character."""
        for i, ch in enumerate(text):
            self.grid[page][row][col + i] = ch
        return row * self.shape.cols + col + len(text) - 1

    def slot(self, page: int, text: str) -> int:
        row, col = self.free[page].pop()
        return self.put(page, row, col, text)

    def lookup(self, page: int) -> None:
        k, v = self.keys.pop(), self.rng.randrange(10)
        cell = self.slot(page, f"{v}={k}")
        self.lookups.append((k, page, v))
        self.records.append(Record(k, "lookup", str(v), (page + 1,), page, cell))

    def reference(self, page: int) -> None:
        ref, ref_page, ref_value = self.rng.choice([x for x in self.lookups if x[1] < page])
        k = self.keys.pop()
        cell = self.slot(page, f"{ref}={k}")
        self.records.append(Record(k, "reference", str(ref_value),
                                   (ref_page + 1, page + 1), page, cell))

    def legend(self, page: int, column: int) -> None:
        """A digit and a letter; the legend's column says which one the key has."""
        k, a, q = self.keys.pop(), str(self.rng.randrange(10)), self.rng.choice(self.letters)
        cell = self.slot(page, f"{a}{q}={k}")
        self.records.append(Record(k, "legend", a if column == 1 else q, (1, page + 1),
                                   page, cell))

    def split(self, page: int) -> None:
        """Value on the last row of `page`, key on the first cell of `page + 1`."""
        k, v = self.keys.pop(), self.rng.randrange(10)
        self.put(page, self.shape.rows - 1, 0, f"{v}=")
        cell = self.put(page + 1, 0, 0, k)
        self.records.append(Record(k, "split", str(v), (page + 1, page + 2), page + 1, cell))

    def fill(self) -> None:
        """Filler runs in a share of the free slots: digits and "+" only."""
        for page, slots in enumerate(self.free):
            for row, col in slots:
                if self.rng.random() < self.shape.filler:
                    n = self.rng.randint(3, SLOT - 1)
                    self.put(page, row, col, "".join(self.rng.choice(FILLER) for _ in range(n)))


def make_document(rng: random.Random, shape: Shape = PAGE) -> Document:
    """A random document with every family present (see the module docstring): 2 lookups on
    page 1 and at least one on two later pages, references and legends on later pages, one
    or two splits, 20 keys in all."""
    n_pages = rng.randint(*shape.pages)
    b = _Builder(rng, shape, n_pages)
    column = rng.randint(1, 2)
    b.put(0, 0, 0, f"#{column}")
    splits = rng.sample(range(1, n_pages - 1), rng.randint(1, 2))
    for page in splits:
        b.split(page)
    b.lookup(0)
    b.lookup(0)
    kinds = ["reference", "legend", "lookup", "lookup", "reference", "legend"]
    rng.shuffle(kinds)
    pages = list(range(1, n_pages))
    while len(b.keys) > 0:
        page = pages[(len(b.records)) % len(pages)]
        kind = kinds.pop() if kinds else rng.choice(["reference", "legend", "lookup"])
        if kind == "reference":
            b.reference(page)
        elif kind == "legend":
            b.legend(page, column)
        else:
            b.lookup(page)
    b.fill()
    rows = [["".join(r) for r in page] for page in b.grid]
    return Document(pages=rows, records=b.records, legend_column=column, shape=shape)
