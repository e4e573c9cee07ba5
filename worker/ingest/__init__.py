"""PDF ingestion: open untrusted bytes with limits, render pages, read text (layer or OCR).

Typical use by the pipeline::

    s = settings.worker
    facts, decrypted = inspect_pdf(data, password=pw, max_pages=s.max_pages,
                                   decrypt_limit=..., limits=ReaderLimits(...))
    ...  # page count, title: checks that need no page drawn (`worker.uploads.check_upload`)
    for page in iter_pages(data, password=pw, dpi=..., max_pixels=..., ocr=s.ocr,
                           deadline=Deadline(s.ingest_timeout_s),
                           limits=ReaderLimits(s.page_memory_mb, s.page_timeout_s),
                           max_pages=s.max_pages, on_open=remember_facts,
                           on_progress=report):
        ...  # page.error set: unreadable; else store page.image, page.text

Untrusted PDFs are opened, drawn and read only in confined reader processes (memory, CPU
time, file size, no secrets, no network, no files; `worker.ingest.sandbox`,
`worker.ingest.confine`), never in the calling process. `open_pdf` is what those processes
run; call it directly only on trusted files (benchmarks, evaluation sets).

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
    OpenLimitError,
    OpenMemoryLimitError,
    OpenTimeLimitError,
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
from worker.ingest.sandbox import PdfFacts, ReaderLimits, inspect_pdf
from worker.ingest.text import (
    PageText,
    TextPolicy,
    TextSource,
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
    "OpenLimitError",
    "OpenMemoryLimitError",
    "OpenTimeLimitError",
    "PageLimitError",
    "PageMemoryLimitError",
    "PageTimeLimitError",
    "PageText",
    "PasswordRequiredError",
    "PdfFacts",
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
    "inspect_pdf",
    "iter_pages",
    "ocr_available",
    "open_pdf",
    "page_text",
    "render_page",
    "usable_text_layer",
]
