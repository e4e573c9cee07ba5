"""Generate the HARD retrieval dev set: long documents, scans, charts, multi-page evidence.

    python -m lab.retrieval.devsets.hard_devset --out /tmp/hardset [--seed 11] [--docs-per-family N]

writes `OUT/pdfs/*.pdf` (about 52 documents and 2,000 pages: annual reports, manuals,
papers, slide decks, scanned filings) and `OUT/questions.jsonl` (`id`, `question`, `doc`,
`evidence_pages`, plus `family`, `page_kind`, `style`, `image_only`, `multi_page`, `named`
and `answer`). See "The hard dev set" in lab/retrieval/NOTES.md.
"""

from __future__ import annotations

import argparse
import io
import json
import random
import time
from collections.abc import Callable
from pathlib import Path

import pymupdf
from PIL import Image, ImageDraw, ImageFont

from lab.retrieval.devsets.hard_docs import manual, paper, slide_deck
from lab.retrieval.devsets.hard_families import annual_report, filing
from lab.retrieval.devsets.hard_specs import Builder, Chart, HardDoc, HardPage, HardQuestion
from lab.retrieval.devsets.make_devset import A4, MARGIN, SLIDE, as_scan, layout_page

Family = Callable[[random.Random, int, set[str]], Builder]
FAMILIES: list[tuple[Family, int]] = [(annual_report, 10), (manual, 10), (paper, 12),
                                      (slide_deck, 10), (filing, 10)]
HEADER_SHARE = 0.4


def draw_chart(chart: Chart, width: int, height: int) -> bytes:
    """Render `chart` as a PNG (labels and values exist only as pixels)."""
    image = Image.new("L", (width, height), 255)
    draw = ImageDraw.Draw(image)
    fsize = max(16, min(height // 22, width // 42))
    font = ImageFont.load_default(size=fsize)
    big = ImageFont.load_default(size=max(26, min(height // 13, width // 20)))
    draw.text((20, 10), chart.title, fill=0, font=font)
    n = len(chart.labels)
    if chart.kind == "boxes":
        cols = 2
        bw, bh = (width - 60) // cols, (height - 70) // ((n + 1) // cols)
        for k, (label, value) in enumerate(zip(chart.labels, chart.values, strict=True)):
            x, y = 20 + (k % cols) * (bw + 20), 55 + (k // cols) * bh
            draw.rectangle((x, y, x + bw, y + bh - 15), outline=0, width=3, fill=235)
            draw.text((x + 20, y + 15), f"{value:,.0f}", fill=0, font=big)
            draw.text((x + 20, y + bh - 60), label, fill=0, font=font)
        return _png(image)
    top, bottom = 60 + fsize, height - 2 * fsize - 10
    slot = (width - 40) / n
    peak = max(chart.values) or 1.0
    for k, (label, value) in enumerate(zip(chart.labels, chart.values, strict=True)):
        x0 = 20 + k * slot + slot * 0.2
        x1 = x0 + slot * 0.6
        y0 = bottom - (bottom - top) * value / peak
        draw.rectangle((x0, y0, x1, bottom), fill=110, outline=0)
        text = f"{value:g}"
        draw.text((x0, y0 - fsize - 6), text, fill=0, font=font)
        draw.text((20 + k * slot + 4, bottom + 8), label, fill=0, font=font)
    draw.line((20, bottom, width - 20, bottom), fill=0, width=2)
    return _png(image)


def _png(image: Image.Image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, "PNG", optimize=True)
    return buf.getvalue()


def _chart_page(page: pymupdf.Page, spec: HardPage, number: int, slide: bool,
                running: str) -> None:
    """Lay out the caption and prose like `layout_page`, then embed the chart image below."""
    assert spec.chart is not None
    layout_page(page, HardPage("table", spec.title, spec.paragraphs), number, slide, running)
    size = 18 if slide else 11
    bullets = [("- " if slide else "") + p for p in spec.paragraphs]
    span = size * 1.9 * sum(1 + len(p) // 70 for p in bullets) + 10
    top = 40.0 + (80 if slide else 50) + span + 20
    width = page.rect.width - 2 * MARGIN
    rect = pymupdf.Rect(MARGIN, top, MARGIN + width,
                        min(page.rect.height - 45, top + 0.65 * width))
    scale = 2.0
    png = draw_chart(spec.chart, int(rect.width * scale), int(rect.height * scale))
    page.insert_image(rect, stream=png)


def write_hard_pdf(doc: HardDoc, path: Path, rng: random.Random) -> None:
    """Write one document: text pages, scans/screenshots (pixels only) and chart pages."""
    size = SLIDE if doc.landscape else A4
    pdf = pymupdf.open()
    for number, spec in enumerate(doc.pages, start=1):
        page = pdf.new_page(width=size[0], height=size[1])
        if spec.kind in ("scan", "slide_image"):
            dpi = 150 if doc.landscape else doc.scan_dpi
            page.insert_image(page.rect, stream=as_scan(spec, size, number, doc.landscape,
                                                         doc.running, rng, dpi=dpi))
            if spec.kind == "scan" and rng.random() < 0.5:  # a stamped text-layer footer
                page.insert_text((MARGIN, size[1] - 12), f"Scanned copy - page {number}",
                                 fontsize=6)
        elif isinstance(spec, HardPage) and spec.chart is not None:
            _chart_page(page, spec, number, doc.landscape, doc.running)
        else:
            layout_page(page, spec, number, doc.landscape, doc.running)
    pdf.set_metadata({"title": doc.title, "producer": "conduit hard dev set"})
    pdf.save(path, garbage=3, deflate=True)
    pdf.close()


def build(out: Path, seed: int = 11,
          docs_per_family: int | None = None) -> tuple[int, int, list[HardQuestion]]:
    """Write the hard set under `out`; return (documents, pages, questions).

    `docs_per_family` caps the number of documents of each family (a small, quick variant).
    """
    rng = random.Random(seed)
    used: set[str] = set()
    builders = [family(rng, i, used) for family, count in FAMILIES
                for i in range(min(count, docs_per_family or count))]
    headed = set(rng.sample(range(len(builders)), round(HEADER_SHARE * len(builders))))
    pdf_dir = out / "pdfs"
    pdf_dir.mkdir(parents=True, exist_ok=True)
    questions: list[HardQuestion] = []
    for n, b in enumerate(builders):
        if n in headed:
            b.doc.running = b.doc.title
        write_hard_pdf(b.doc, pdf_dir / b.doc.filename, rng)
        questions.extend(b.questions)
    with (out / "questions.jsonl").open("w", encoding="utf-8") as fh:
        for n, q in enumerate(questions, start=1):
            fh.write(json.dumps({
                "id": f"h{n:03d}", "question": q.question, "doc": q.doc,
                "evidence_pages": q.evidence_pages, "family": q.family,
                "page_kind": q.page_kind, "style": q.style, "image_only": q.image_only,
                "multi_page": q.multi_page, "named": q.named, "answer": q.answer}) + "\n")
    pages = sum(len(b.doc.pages) for b in builders)
    return len(builders), pages, questions


def main() -> None:
    """Command line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--docs-per-family", type=int, default=None,
                        help="at most this many documents per family (a quick small variant)")
    args = parser.parse_args()
    started = time.perf_counter()
    docs, pages, questions = build(args.out, args.seed, args.docs_per_family)
    share = {k: sum(getattr(q, k) for q in questions) for k in
             ("image_only", "multi_page", "named")}
    charts = sum(q.page_kind == "chart" for q in questions)
    print(f"wrote {docs} documents, {pages} pages, {len(questions)} questions to {args.out} "
          f"in {time.perf_counter() - started:.0f} s; image-only {share['image_only']}, "
          f"chart {charts}, multi-page {share['multi_page']}, named {share['named']}")


if __name__ == "__main__":
    main()
