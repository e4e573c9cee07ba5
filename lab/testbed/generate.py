"""`conduit-lab testbed generate`: real PDFs of testbed documents and their questions.

Each document becomes a PDF whose pages are 1-bit images of the glyph grid (the bitmap font
of `lab.testbed.glyphs`), one image pixel per rendered pixel at the service's default 100 dpi, so
that the ingest path renders exactly the pixels the model was trained on, plus an invisible
text layer with the same records (for retrieval and snippets). Questions go to
`questions.jsonl` in the form `conduit eval answers` reads: `id`, `doc`, `question`,
`answer`, `answer_format`, `evidence_pages`, `doc_type`, and `family` (one question of each
family per document, in turn).

Public API:
  RENDER_DPI = 100
  write_pdf(rows_per_page, path) -> None
  generate(out, n, seed) -> list[dict]      n questions over ceil(n / 4) documents
"""

from __future__ import annotations

import io
import json
import random
from pathlib import Path

import pymupdf
from PIL import Image

from lab.testbed.glyphs import CELL, draw_grid
from lab.testbed.task import COLS, FAMILIES, ROWS, make_document, question_text

RENDER_DPI = 100
MAX_DOCUMENTS = 1000  # file names t000.pdf ... t999.pdf, as in training
_PT = 72 / RENDER_DPI  # points per rendered pixel
_EPS = 1e-4  # keeps MuPDF's outward rounding from adding a pixel column


def write_pdf(pages: list[list[str]], path: Path) -> None:
    """Write one PDF page per entry of `pages` (rows of characters)."""
    doc = pymupdf.open()
    side_w, side_h = COLS * CELL * _PT - _EPS, ROWS * CELL * _PT - _EPS
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
        write_pdf(doc.pages, out / "pdfs" / name)
        for family in FAMILIES:
            if len(rows) == n:
                break
            record = rng.choice([r for r in doc.records if r.family == family])
            rows.append({"id": f"{name[:-4]}-{family}-{record.key}", "doc": name,
                         "question": question_text(record.key), "answer": record.answer,
                         "answer_format": "Int" if record.answer.isdigit() else "Str",
                         "evidence_pages": list(record.evidence_pages),
                         "doc_type": "Synthetic records", "family": family})
    with (out / "questions.jsonl").open("w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    return rows
