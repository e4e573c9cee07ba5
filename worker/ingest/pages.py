"""Walk a document page by page: render, extract text, report progress, honour a deadline."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Literal

import pymupdf
from PIL import Image

from worker.ingest.deadline import Deadline
from worker.ingest.errors import CorruptPdfError
from worker.ingest.render import capped_zoom, render_page
from worker.ingest.text import DEFAULT_TEXT_POLICY, PageText, TextPolicy, extract_text

Stage = Literal["render", "text", "index", "prefill"]


@dataclass(frozen=True)
class Progress:
    """One progress event: `done` of `total` pages have finished `stage`."""

    stage: Stage
    done: int
    total: int


ProgressCallback = Callable[[Progress], None]


@dataclass
class IngestedPage:
    """One page after ingestion: 1-based `number`, its image (None if not rendered), its text."""

    number: int
    text: PageText
    image: Image.Image | None
    width: int
    height: int


def iter_pages(
    doc: pymupdf.Document,
    *,
    dpi: int,
    max_pixels: int,
    ocr: bool,
    render: bool = True,
    deadline: Deadline | None = None,
    on_progress: ProgressCallback | None = None,
    text_policy: TextPolicy = DEFAULT_TEXT_POLICY,
) -> Iterator[IngestedPage]:
    """Yield every page of `doc` in order, rendered (if `render`) and with its text.

    Reports `Progress("render", i, n)` and `Progress("text", i, n)` after each page's steps
    through `on_progress`; the caller reports its own "index" and "prefill" stages with the
    same type. `deadline.check` runs before every step and raises `IngestTimeoutError`.
    `width`/`height` are the rendered size, or the size a render would have when not rendering.
    Raises `CorruptPdfError` for a page MuPDF cannot load.
    """
    total = doc.page_count
    report = on_progress or (lambda _p: None)
    for index in range(total):
        if deadline is not None:
            deadline.check(index, total)
        image = None
        if render:
            image = render_page(doc, index, dpi=dpi, max_pixels=max_pixels)
            width, height = image.size
            report(Progress("render", index + 1, total))
            if deadline is not None:
                deadline.check(index, total)
        if image is None:
            width, height = _size_at(doc, index, dpi, max_pixels)
        text = extract_text(doc, index, ocr=ocr, policy=text_policy)
        report(Progress("text", index + 1, total))
        yield IngestedPage(number=index + 1, text=text, image=image, width=width, height=height)


def _size_at(doc: pymupdf.Document, index: int, dpi: int, max_pixels: int) -> tuple[int, int]:
    try:
        rect = doc.load_page(index).rect
    except Exception as exc:
        raise CorruptPdfError(f"page {index + 1} cannot be read") from exc
    zoom = capped_zoom(rect, dpi=dpi, max_pixels=max_pixels)
    return int(rect.width * zoom), int(rect.height * zoom)
