"""PDF ingestion: open untrusted bytes with limits, render pages, read text (layer or OCR).

Typical use by the pipeline::

    doc = open_pdf(data, password=pw, max_pages=settings.max_pages)
    with doc:
        for page in iter_pages(doc, dpi=..., max_pixels=..., ocr=settings.ocr,
                               deadline=Deadline(settings.ingest_timeout_s),
                               on_progress=report):
            ...  # store page.image, page.text; embed with worker.retrieval

Every failure is an `IngestError` subclass with a user-facing `.message`.
"""

from worker.ingest.deadline import Deadline
from worker.ingest.errors import (
    CorruptPdfError,
    EmptyFileError,
    IngestError,
    IngestTimeoutError,
    NoPagesError,
    NotAPdfError,
    PasswordRequiredError,
    TooManyPagesError,
    WrongPasswordError,
)
from worker.ingest.ocr import ocr_available
from worker.ingest.pages import IngestedPage, Progress, ProgressCallback, Stage, iter_pages
from worker.ingest.pdf import open_pdf
from worker.ingest.render import render_page
from worker.ingest.text import (
    PageText,
    TextPolicy,
    TextSource,
    extract_text,
    page_text,
    usable_text_layer,
)

__all__ = [
    "CorruptPdfError",
    "Deadline",
    "EmptyFileError",
    "IngestError",
    "IngestTimeoutError",
    "IngestedPage",
    "NoPagesError",
    "NotAPdfError",
    "PageText",
    "PasswordRequiredError",
    "Progress",
    "ProgressCallback",
    "Stage",
    "TextPolicy",
    "TextSource",
    "TooManyPagesError",
    "WrongPasswordError",
    "extract_text",
    "iter_pages",
    "ocr_available",
    "open_pdf",
    "page_text",
    "render_page",
    "usable_text_layer",
]
