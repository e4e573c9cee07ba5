"""`conduit-lab testbed generate`: real PDFs of testbed documents and their questions.

Each document becomes a PDF whose pages are 1-bit images of the glyph grid (the bitmap font
of `lab.testbed.glyphs`), one image pixel per rendered pixel at the service's default 100 dpi, so
that the ingest path renders exactly the pixels the model was trained on (`doc.shape`: cols x
rows cells of 28 px, 448 x 448 px at page scale), plus an invisible text layer with the same
records (for retrieval and snippets). Questions go to `questions.jsonl` in the form
`conduit eval answers` reads: `id`, `doc`, `question`, `answer`, `answer_format` ("Int" for
one digit, else "Str": a legend letter, a pair's "5 7"), `evidence_pages`, `doc_type`, plus
`family` (one question of each family per document, in turn) and `shown_pages`: the 1-based
pages of a view with distractors, the evidence pages plus other pages of the document drawn
at random, `SHOWN` in all (or every page), in document order.

Public API:
  RENDER_DPI = 100;  SHOWN = 6
  write_pdf(rows_per_page, path, shape=PAGE) -> None
  generate(out, n, seed) -> list[dict]      n questions over ceil(n / 5) documents
"""

from __future__ import annotations

import io
import json
import random
from pathlib import Path

import pymupdf
from PIL import Image

from lab.testbed.batches import shown_pages
from lab.testbed.glyphs import CELL, draw_grid
from lab.testbed.task import FAMILIES, PAGE, Shape, make_document

RENDER_DPI = 100
SHOWN = 6  # pages of the "with distractors" view: evidence plus distractors
MAX_DOCUMENTS = 1000  # file names t000.pdf ... t999.pdf, as in training
_PT = 72 / RENDER_DPI  # points per rendered pixel
_EPS = 1e-4  # keeps MuPDF's outward rounding from adding a pixel column


def write_pdf(pages: list[list[str]], path: Path, shape: Shape = PAGE) -> None:
    """Write one PDF page per entry of `pages` (rows of characters, a `shape` grid)."""
    doc = pymupdf.open()
    side_w, side_h = shape.cols * CELL * _PT - _EPS, shape.rows * CELL * _PT - _EPS
    for rows in pages:
        page = doc.new_page(width=side_w, height=side_h)
        png = io.BytesIO()
        Image.fromarray(draw_grid(rows)).convert("1").save(png, format="PNG")
        page.insert_image(page.rect, stream=png.getvalue())
        for r, line in enumerate(rows):  # the invisible text layer, one line per row
            if line.strip():
                page.insert_text((2, (r + 0.8) * CELL * _PT), line.strip(), fontsize=6,
                                 render_mode=3)
    doc.set_metadata({"title": path.stem, "creator": "conduit testbed"})
    doc.save(path, garbage=3, deflate=True)
    doc.close()


def generate(out: Path, n: int, seed: int) -> list[dict[str, object]]:
    """Write `out/pdfs/*.pdf` and `out/questions.jsonl`; returns the question rows."""
    n_docs = -(-n // len(FAMILIES))
    if n < 1 or n_docs > MAX_DOCUMENTS:
        raise ValueError(f"n must be in [1, {MAX_DOCUMENTS * len(FAMILIES)}], got {n}")
    (out / "pdfs").mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, object]] = []
    for i in range(n_docs):
        rng = random.Random(f"generate:{seed}:{i}")
        doc = make_document(rng)
        name = f"t{i:03d}.pdf"
        write_pdf(doc.pages, out / "pdfs" / name, doc.shape)
        for family in FAMILIES[:n - len(rows)]:
            q = doc.question(family, rng)
            shown = shown_pages(doc, q.evidence_indices, SHOWN, rng)
            rows.append({"id": f"{name[:-4]}-{family}-{''.join(r.key for r in q.records)}",
                         "doc": name, "question": q.text, "answer": q.answer,
                         "answer_format": "Int" if q.answer.isdigit() else "Str",
                         "evidence_pages": list(q.evidence_pages),
                         "doc_type": "Synthetic records", "family": family,
                         "shown_pages": [p + 1 for p in shown]})
    with (out / "questions.jsonl").open("w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    return rows
