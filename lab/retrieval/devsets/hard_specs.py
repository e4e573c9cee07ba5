"""Data model of the hard dev set and a builder that adds pages and questions to a document.

Pages reuse `PageSpec` from the easy set; a page may also carry a `Chart` (drawn with PIL and
embedded as an image, so its labels and values are not in the text layer).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from lab.retrieval.devsets.devset_specs import DocSpec, PageKind, PageSpec, paragraphs, plant
from lab.retrieval.devsets.hard_text import LABELS, fill

LEXICAL_SHARE = 0.25


@dataclass
class Chart:
    """A bar chart (`kind` "bar") or an infographic of labelled boxes (`kind` "boxes")."""

    kind: str
    title: str
    labels: list[str]
    values: list[float]
    unit: str = ""


@dataclass
class HardPage(PageSpec):
    """A page; with `chart`, the paragraphs are the caption and prose around the image."""

    chart: Chart | None = None


@dataclass
class HardDoc(DocSpec):
    """A document; `running` is the running header text (empty: only page numbers)."""

    title: str = ""
    running: str = ""
    scan_dpi: int = 170


@dataclass
class HardQuestion:
    """A question with its gold pages and the breakdown fields of the questions file."""

    question: str
    doc: str
    evidence_pages: list[int]
    style: str
    page_kind: str
    family: str
    image_only: bool
    multi_page: bool
    named: bool
    answer: str


@dataclass
class Builder:
    """Collects the pages of one document and the questions about them."""

    rng: random.Random
    doc: HardDoc
    questions: list[HardQuestion] = field(default_factory=list)

    def add(self, kind: PageKind, title: str, paragraphs: list[str] | None = None,
            table: list[list[str]] | None = None, chart: Chart | None = None) -> int:
        """Append a page and return its 1-based number."""
        self.doc.pages.append(HardPage(kind, title, paragraphs or [], table, chart))
        return len(self.doc.pages)

    def ask(self, pages: list[int], lexical: str, paraphrase: str, answer: str,
            named: bool = True) -> None:
        """Add a question on `pages`, worded with the page's words about a quarter of the time."""
        style = "lexical" if self.rng.random() < LEXICAL_SHARE else "paraphrase"
        first = self.doc.pages[pages[0] - 1]
        kind = "chart" if isinstance(first, HardPage) and first.chart else first.kind
        image_only = all(self.doc.pages[p - 1].kind in ("scan", "slide_image") for p in pages)
        self.questions.append(HardQuestion(
            lexical if style == "lexical" else paraphrase, self.doc.filename, pages, style,
            kind, self.doc.family, image_only, len(pages) > 1, named, answer))

    def prose(self, title: str, pool: list[str], n: int, facts: tuple[str, ...] = (),
              columns: bool = True, per: int = 4, **fixed: str) -> int:
        """A page of `n` filler sentences from `pool` with `facts` planted among them."""
        sentences = fill(self.rng, pool, n, **fixed)
        for fact in facts:
            plant(self.rng, sentences, fact)
        return self.add("columns" if columns else "table", title, paragraphs(sentences, per))

    def number_table(self, title: str, intro: str, years: tuple[str, str] = ("2023", "2022"),
                     rows: int = 9, planted: list[list[str]] | None = None,
                     kind: PageKind = "table") -> int:
        """A notes-to-the-accounts page: a short intro and a table of random amounts."""
        labels = self.rng.sample(LABELS, rows)
        body = [[lab, *(f"{self.rng.uniform(3, 2500):,.1f}" for _ in years)] for lab in labels]
        for row in planted or []:
            body.insert(self.rng.randint(0, len(body)), row)
        body.append(["Total", *(f"{self.rng.uniform(2000, 9000):,.1f}" for _ in years)])
        return self.add(kind, title, [intro], [["EUR million", *years], *body])


def unique_code(rng: random.Random, used: set[str], pattern: str) -> str:
    """A code from `pattern` ("#" a digit, "@" an upper-case letter) not in `used` yet."""
    while True:
        code = "".join(str(rng.randint(0, 9)) if c == "#" else
                       chr(rng.randint(65, 90)) if c == "@" else c for c in pattern)
        if code not in used:
            used.add(code)
            return code


UNCOMMON_FIRST = ["Wilhelmina", "Bartholomew", "Ottilie", "Casimir", "Leopoldine", "Evander",
                  "Philippa", "Ignatius", "Rosalind", "Thaddeus", "Clementine", "Augustin",
                  "Seraphina", "Lysander", "Henrietta", "Cornelius", "Marisol", "Osvaldo"]
UNCOMMON_LAST = ["Achterberg", "Quennell", "Ravensworth", "Szczepanik", "Vandermolen",
                 "Holloway-Price", "Tarkowski", "Ellingboe", "Marchetti-Vogel", "Oyelowo",
                 "Fairweather", "Kristiansen-Lie", "Abernathy", "Zoltanek", "Drummond-Hay"]


def unique_person(rng: random.Random, used: set[str]) -> str:
    """A name with an uncommon first and last name, used once in the whole collection."""
    while True:
        name = f"{rng.choice(UNCOMMON_FIRST)} {rng.choice(UNCOMMON_LAST)}"
        if name not in used:
            used.add(name)
            return name
