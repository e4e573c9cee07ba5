"""Open untrusted PDF bytes with PyMuPDF, turning every failure into a typed `IngestError`."""

from __future__ import annotations

import logging
import re

import pymupdf

from worker.ingest.errors import (
    CorruptPdfError,
    EmptyFileError,
    NoPagesError,
    NotAPdfError,
    PasswordRequiredError,
    TooManyPagesError,
    WrongPasswordError,
)
from worker.ingest.saslprep import password_forms

log = logging.getLogger(__name__)

# The PDF spec lets readers accept the header anywhere in the first 1024 bytes.
_HEADER_WINDOW = 1024
# A complete file ends with `%%EOF`, possibly followed by a little junk.
_TRAILER_WINDOW = 2048


def looks_like_pdf(data: bytes) -> bool:
    """True when the bytes carry a `%PDF-` header where readers look for one."""
    return b"%PDF-" in data[:_HEADER_WINDOW]


def open_pdf(data: bytes, *, password: str | None = None, max_pages: int) -> pymupdf.Document:
    """Open PDF bytes, authenticate if needed, and check the page count.

    Raises `EmptyFileError`, `NotAPdfError`, `CorruptPdfError` (damaged or truncated),
    `PasswordRequiredError`, `WrongPasswordError`, `NoPagesError` (opens with 0 pages) or
    `TooManyPagesError` (more than `max_pages`). Never lets a PyMuPDF exception escape.

    `needs_pass` is checked before `authenticate()`: authenticating a file that needs no
    password, or checking after authenticating, makes pages render blank. A password given
    for an unencrypted file is ignored. The caller owns the returned document (close it).
    """
    if not data:
        raise EmptyFileError()
    if not looks_like_pdf(data):
        raise NotAPdfError()
    try:
        doc = pymupdf.open(stream=data, filetype="pdf")
    except Exception as exc:  # PyMuPDF raises FileDataError, RuntimeError, ValueError...
        log.info("pymupdf could not open the file: %s", exc)
        raise CorruptPdfError() from exc
    try:
        _unlock(doc, data, password)
        _check_complete(doc, data)
        pages = doc.page_count
        if pages == 0:
            raise NoPagesError()
        if pages > max_pages:
            raise TooManyPagesError(pages, max_pages)
    except BaseException:
        doc.close()
        raise
    return doc


def _unlock(doc: pymupdf.Document, data: bytes, password: str | None) -> None:
    if not doc.needs_pass:
        return
    if password is None or password == "":
        raise PasswordRequiredError()
    if doc.authenticate(password):
        return
    for form in password_forms(password, encryption_revision(data))[1:]:
        if doc.authenticate(form):
            return
    raise WrongPasswordError()


def encryption_revision(data: bytes) -> int | None:
    """The `/R` of the file's standard security handler, or None when the file is not
    encrypted or the entry cannot be read.

    Read from a second, throwaway document: reading objects of an encrypted document before
    it is authenticated leaves them cached undecrypted, and its pages then read blank.
    """
    try:
        with pymupdf.open(stream=data, filetype="pdf") as probe:
            kind, ref = probe.xref_get_key(-1, "Encrypt")
            if kind == "xref":
                kind, value = probe.xref_get_key(int(ref.split()[0]), "R")
            else:  # an encryption dictionary written inline in the trailer
                kind, value = probe.xref_get_key(-1, "Encrypt/R")
        return int(value) if kind == "int" else None
    except Exception:  # a damaged trailer: the password is tried as given only
        return None


def _check_complete(doc: pymupdf.Document, data: bytes) -> None:
    """Refuse a file whose end is missing, judged by its pages rather than by its trailer.

    MuPDF repairs many damaged files silently. A file that lost only its cross-reference
    table or `%%EOF` (a common defect of scans and hand-written files) still has every page
    and is accepted. A truncated file opens with its page tree intact but the objects of its
    later pages gone (they render blank): when MuPDF had to repair a file without `%%EOF`
    and it has no pages or its last page has lost its content, it is refused. Pages lost in
    the middle of a file are reported one by one by the page reader instead.
    """
    if not looks_truncated(doc, data):
        return
    pages = doc.page_count
    if pages == 0:
        raise CorruptPdfError("the file appears truncated")
    missing = missing_content_pages(doc)
    if pages in missing:
        first = pages
        while first - 1 in missing:
            first -= 1
        raise CorruptPdfError(f"the file appears truncated: pages {first} to {pages} of "
                              f"{pages} are missing")


def looks_truncated(doc: pymupdf.Document, data: bytes) -> bool:
    """True when MuPDF had to repair the file and it does not end in `%%EOF`."""
    return bool(doc.is_repaired) and b"%%EOF" not in data[-_TRAILER_WINDOW:]


def missing_content_pages(doc: pymupdf.Document) -> set[int]:
    """1-based numbers of the pages whose page object or content stream is missing.

    Checked on the cross-reference structure only (no stream is decompressed). A page with
    no `/Contents` at all is a blank page, not a missing one.
    """
    return {n + 1 for n in range(doc.page_count) if not _content_present(doc, n)}


def _content_present(doc: pymupdf.Document, index: int) -> bool:
    try:
        kind, value = doc.xref_get_key(doc.page_xref(index), "Contents")
        if kind == "null":
            return True
        refs = [int(x) for x in re.findall(r"(\d+) 0 R", value)]
        return bool(refs) and all(doc.xref_is_stream(x) for x in refs)
    except Exception:  # a page object that cannot be read at all
        return False
