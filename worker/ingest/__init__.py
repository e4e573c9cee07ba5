"""PDF ingestion: open untrusted bytes with limits, render pages, read text (layer or OCR).

Typical use by the pipeline::

    with open_pdf(data, password=pw, max_pages=settings.max_pages) as doc:
        ...  # page count, title: checks that need no page drawn
    for page in iter_pages(data, password=pw, dpi=..., max_pixels=..., ocr=settings.ocr,
                           deadline=Deadline(settings.ingest_timeout_s),
                           limits=ReaderLimits(settings.page_memory_mb,
                                               settings.page_timeout_s),
                           on_progress=report):
        ...  # page.error set: unreadable; else store page.image, page.text

Pages are drawn and read only in reader processes under a memory cap and a time limit
(`worker.ingest.sandbox`), never in the calling process.

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
    PageLimitError,
    PageMemoryLimitError,
    PageTimeLimitError,
    PasswordRequiredError,
    TooManyPagesError,
    UnreadableDocumentError,
    WrongPasswordError,
)
from worker.ingest.ocr import ocr_available
from worker.ingest.pages import (
    IngestedPage,
    Progress,
    ProgressCallback,
    Stage,
    check_readable,
    iter_pages,
)
from worker.ingest.pdf import open_pdf
from worker.ingest.render import render_page
from worker.ingest.sandbox import ReaderLimits
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
    "PageLimitError",
    "PageMemoryLimitError",
    "PageTimeLimitError",
    "PageText",
    "PasswordRequiredError",
    "Progress",
    "ReaderLimits",
    "ProgressCallback",
    "Stage",
    "TextPolicy",
    "TextSource",
    "TooManyPagesError",
    "UnreadableDocumentError",
    "WrongPasswordError",
    "check_readable",
    "extract_text",
    "iter_pages",
    "ocr_available",
    "open_pdf",
    "page_text",
    "render_page",
    "usable_text_layer",
]
