"""Walk a document page by page: render, extract text, report progress, honour a deadline."""

from __future__ import annotations

import contextlib
import multiprocessing
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Literal

import pymupdf
from PIL import Image

from worker.ingest.deadline import Deadline
from worker.ingest.errors import CorruptPdfError, IngestTimeoutError
from worker.ingest.ocr import ocr_available
from worker.ingest.ocr_pool import OcrPool, as_page_text
from worker.ingest.render import capped_zoom, render_page
from worker.ingest.text import (
    DEFAULT_TEXT_POLICY,
    PageText,
    TextPolicy,
    extract_text,
    wants_ocr,
)

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
    ocr_workers: int = 1,
) -> Iterator[IngestedPage]:
    """Yield every page of `doc` in order, rendered (if `render`) and with its text.

    Reports `Progress("render", i, n)` and `Progress("text", i, n)` after each page's steps
    through `on_progress`; the caller reports its own "index" and "prefill" stages with the
    same type. `deadline.check` runs before every step and raises `IngestTimeoutError`.
    `width`/`height` are the rendered size, or the size a render would have when not rendering.
    With `ocr_workers` > 1 and at least two pages to OCR, those pages are OCRed by an
    `OcrPool` of that many processes while this one renders. Raises `CorruptPdfError` for a
    page MuPDF cannot load.
    """
    total = doc.page_count
    report = on_progress or (lambda _p: None)
    with contextlib.ExitStack() as stack:
        pending = _start_ocr(doc, stack, ocr_workers, text_policy) if ocr else {}
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
            text = None
            if index in pending:
                text = as_page_text(_wait(pending.pop(index), deadline, index, total))
            if text is None:
                text = extract_text(doc, index, ocr=ocr, policy=text_policy)
            report(Progress("text", index + 1, total))
            yield IngestedPage(number=index + 1, text=text, image=image, width=width,
                               height=height)


def _start_ocr(doc: pymupdf.Document, stack: contextlib.ExitStack, workers: int,
               policy: TextPolicy) -> dict[int, Future[list[str] | None]]:
    """Submit the pages that need OCR to a pool (none when one process is enough, or when
    this process may not start any: a daemonic one, e.g. a prefork Celery child)."""
    if workers < 2 or multiprocessing.current_process().daemon or not ocr_available(
            policy.language):
        return {}
    todo = [i for i in range(doc.page_count) if _wants_ocr(doc, i, policy)]
    if len(todo) < 2:
        return {}
    pool = stack.enter_context(OcrPool(doc, min(workers, len(todo)), policy))
    return {i: pool.submit(i) for i in todo}


def _wants_ocr(doc: pymupdf.Document, index: int, policy: TextPolicy) -> bool:
    try:
        return wants_ocr(doc.load_page(index), policy)
    except Exception:  # read again, and reported, in the page loop
        return False


def _wait(future: Future[list[str] | None], deadline: Deadline | None, index: int,
          total: int) -> list[str] | None:
    """The worker's result, waiting no longer than the deadline leaves."""
    if deadline is None:
        return future.result()
    try:
        return future.result(timeout=max(deadline.seconds - deadline.elapsed, 0.0))
    except TimeoutError:
        raise IngestTimeoutError(deadline.seconds, index, total) from None


def _size_at(doc: pymupdf.Document, index: int, dpi: int, max_pixels: int) -> tuple[int, int]:
    try:
        rect = doc.load_page(index).rect
    except Exception as exc:
        raise CorruptPdfError(f"page {index + 1} cannot be read") from exc
    zoom = capped_zoom(rect, dpi=dpi, max_pixels=max_pixels)
    return int(rect.width * zoom), int(rect.height * zoom)
