"""Open untrusted PDF bytes with PyMuPDF, turning every failure into a typed `IngestError`."""

from __future__ import annotations

import logging

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
    """Reject files MuPDF had to rebuild because their end is missing.

    MuPDF repairs many damaged files silently; a truncated one then opens with its page tree
    intact but later pages blank. A repaired file that still ends in `%%EOF` is accepted
    (minor xref damage is common in real-world PDFs).
    """
    if doc.is_repaired and b"%%EOF" not in data[-_TRAILER_WINDOW:]:
        raise CorruptPdfError("the file appears truncated")
