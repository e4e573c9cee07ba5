"""Generate the retrieval dev set: PDFs written with PyMuPDF and a questions JSONL.

    python -m lab.retrieval.devsets.make_devset --out /tmp/devset [--seed 7]

writes `OUT/pdfs/*.pdf` (38 documents, 232 pages: two-column prose, tables, slides, scanned
pages whose words exist only as pixels, slide screenshots) and `OUT/questions.jsonl`
(`id`, `question`, `doc`, `evidence_pages`, plus `style`, `page_kind`, `family` for
breakdowns). See lab/retrieval/NOTES.md for how it was made and what it measures.
"""

from __future__ import annotations

import argparse
import io
import json
import random
from pathlib import Path

import pymupdf
from PIL import Image, ImageFilter

from lab.retrieval.devsets.devset_families import FAMILIES
from lab.retrieval.devsets.devset_specs import DocSpec, PageSpec, QuestionSpec

A4 = (595.0, 842.0)
SLIDE = (842.0, 474.0)
MARGIN = 50.0


def _fit_textbox(page: pymupdf.Page, rect: pymupdf.Rect, text: str, size: float) -> None:
    """Insert `text` into `rect`, shrinking the font until it fits (nothing is cut)."""
    while size > 4:
        if page.insert_textbox(rect, text, fontsize=size, fontname="helv") >= 0:
            return
        size -= 0.5
    raise ValueError(f"text does not fit: {text[:60]!r}")


def _draw_table(page: pymupdf.Page, top: float, rows: list[list[str]], size: float) -> None:
    width = page.rect.width - 2 * MARGIN
    first = width * 0.42 if len(rows[0]) > 2 else width * 0.5
    rest = (width - first) / max(len(rows[0]) - 1, 1)
    height = size * 2.2
    for r, row in enumerate(rows):
        y = top + r * height
        x = MARGIN
        for c, cell in enumerate(row):
            w = first if c == 0 else rest
            font = "hebo" if r == 0 else "helv"
            page.insert_text((x + 4, y + height * 0.65), cell, fontsize=size, fontname=font)
            x += w
        page.draw_line((MARGIN, y + height), (MARGIN + width, y + height), width=0.5)
    page.draw_line((MARGIN, top), (MARGIN + width, top), width=1.0)


def layout_page(page: pymupdf.Page, spec: PageSpec, number: int, slide: bool,
            running: str) -> None:
    """Draw `spec` as real text on `page`, with a running footer naming the document.

    With `running` empty, the footer (from page 2 on) is the bare page number.
    """
    w = page.rect.width
    title_size = 26 if slide else (22 if spec.kind == "cover" else 15)
    top = 90.0 if spec.kind == "cover" and not slide else 40.0
    _fit_textbox(page, pymupdf.Rect(MARGIN, top, w - MARGIN, top + 70), spec.title, title_size)
    y = top + (80 if slide or spec.kind == "cover" else 50)
    bottom = page.rect.height - 45
    if spec.kind == "columns":
        half = (w - 2 * MARGIN - 20) / 2
        cut = (len(spec.paragraphs) + 1) // 2
        for col, chunk in enumerate([spec.paragraphs[:cut], spec.paragraphs[cut:]]):
            x0 = MARGIN + col * (half + 20)
            _fit_textbox(page, pymupdf.Rect(x0, y, x0 + half, bottom), "\n\n".join(chunk), 10.5)
    else:
        size = 18 if slide else 11
        bullets = [("- " if slide and spec.kind != "cover" else "") + p for p in spec.paragraphs]
        if spec.paragraphs:
            span = size * 1.9 * sum(1 + len(p) // 70 for p in bullets) + 10
            _fit_textbox(page, pymupdf.Rect(MARGIN, y, w - MARGIN, min(y + span, bottom)),
                         "\n".join(bullets), size)
            y += span + 10
        if spec.table:
            _draw_table(page, y, spec.table, 14 if slide else 10)
    if number > 1:
        footer = f"{running} - page {number}" if running else str(number)
        page.insert_text((MARGIN, page.rect.height - 25), footer, fontsize=8)


def as_scan(spec: PageSpec, size: tuple[float, float], number: int, slide: bool,
             running: str, rng: random.Random, dpi: int | None = None) -> bytes:
    """Lay the page out in a scratch document, render it, and degrade it like a scan.

    `dpi` defaults to 200 for portrait scans and 150 for slide screenshots.
    """
    scratch = pymupdf.open()
    page = scratch.new_page(width=size[0], height=size[1])
    layout_page(page, spec if spec.kind != "scan" else PageSpec("cover", spec.title,
                                                            spec.paragraphs), number, slide,
            running)
    dpi = dpi or (200 if not slide else 150)
    pix = page.get_pixmap(dpi=dpi, colorspace=pymupdf.csGRAY)
    image = Image.frombytes("L", (pix.width, pix.height), pix.samples)
    scratch.close()
    if not slide:  # a slightly skewed, blurred, grey-paper scan
        image = image.rotate(rng.uniform(-1.0, 1.0), expand=False, fillcolor=255)
        image = image.filter(ImageFilter.GaussianBlur(0.6)).point(lambda v: min(v, 238))
    buf = io.BytesIO()
    image.save(buf, "PNG", optimize=True)
    return buf.getvalue()


def write_pdf(doc: DocSpec, path: Path, rng: random.Random) -> None:
    """Write one document."""
    size = SLIDE if doc.landscape else A4
    running = doc.pages[0].title
    pdf = pymupdf.open()
    for number, spec in enumerate(doc.pages, start=1):
        page = pdf.new_page(width=size[0], height=size[1])
        if spec.kind in ("scan", "slide_image"):
            page.insert_image(page.rect, stream=as_scan(spec, size, number, doc.landscape,
                                                         running, rng))
            if spec.kind == "scan" and rng.random() < 0.5:  # a stamped text-layer footer
                page.insert_text((MARGIN, size[1] - 12), f"Scanned copy - page {number}",
                                 fontsize=6)
        else:
            layout_page(page, spec, number, doc.landscape, running)
    pdf.set_metadata({"title": doc.pages[0].title, "producer": "conduit dev set"})
    pdf.save(path, garbage=3, deflate=True)
    pdf.close()


def build(out: Path, seed: int) -> tuple[int, int, int]:
    """Write the dev set under `out`; return (documents, pages, questions)."""
    rng = random.Random(seed)
    pdf_dir = out / "pdfs"
    pdf_dir.mkdir(parents=True, exist_ok=True)
    questions: list[tuple[str, QuestionSpec]] = []
    pages = 0
    docs = 0
    for family, count in FAMILIES:
        for i in range(count):
            doc, qs = family(rng, i)
            write_pdf(doc, pdf_dir / doc.filename, rng)
            docs += 1
            pages += len(doc.pages)
            questions.extend((doc.family, q) for q in qs)
    with (out / "questions.jsonl").open("w", encoding="utf-8") as fh:
        for n, (family_name, q) in enumerate(questions, start=1):
            fh.write(json.dumps({"id": f"q{n:03d}", "question": q.question, "doc": q.doc,
                                 "evidence_pages": q.evidence_pages, "style": q.style,
                                 "page_kind": q.page_kind, "family": family_name}) + "\n")
    return docs, pages, len(questions)


def main() -> None:
    """Command line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    docs, pages, questions = build(args.out, args.seed)
    print(f"wrote {docs} documents, {pages} pages, {questions} questions to {args.out}")


if __name__ == "__main__":
    main()
