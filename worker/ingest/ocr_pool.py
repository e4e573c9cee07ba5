"""OCR the pages of one document in worker processes while the caller renders the rest.

OCR costs about a second per page and MuPDF is not thread-safe, so a scanned document is read
by `workers` spawned processes, each holding its own copy of the document (sent once, when
the process starts). Results come back as plain `[text, source]` lists. A page a worker
cannot read comes back as None and the caller reads it itself, so errors surface with the
same `CorruptPdfError` as in a single process.
"""

from __future__ import annotations

import multiprocessing
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import asdict

import pymupdf

from worker.ingest.text import PageText, TextPolicy, page_text

_document: pymupdf.Document | None = None


def _open(data: bytes) -> None:
    global _document
    _document = pymupdf.open("pdf", data)


def _read(index: int, policy: dict[str, object]) -> list[str] | None:
    assert _document is not None, "the pool initializer opens the document"
    try:
        text = page_text(_document.load_page(index), ocr=True,
                         policy=TextPolicy(**policy))  # type: ignore[arg-type]
    except Exception:  # the caller reads the page again and reports the error
        return None
    return [text.text, text.source]


class OcrPool:
    """Worker processes that read (and OCR) pages of one document; use as a context manager."""

    def __init__(self, doc: pymupdf.Document, workers: int, policy: TextPolicy) -> None:
        # written unencrypted, so the workers open it without the password
        data = doc.tobytes(encryption=pymupdf.PDF_ENCRYPT_NONE)  # type: ignore[attr-defined]
        self._policy = asdict(policy)
        self._pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"),
                                         initializer=_open, initargs=(data,))

    def submit(self, index: int) -> Future[list[str] | None]:
        """Start reading page `index` (0-based)."""
        return self._pool.submit(_read, index, self._policy)

    def __enter__(self) -> OcrPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def as_page_text(result: list[str] | None) -> PageText | None:
    """A worker's result as `PageText` (None: the worker could not read the page)."""
    if result is None:
        return None
    text, source = result
    return PageText(text=text, source=source)  # type: ignore[arg-type]
