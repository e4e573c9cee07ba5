"""Accepting an upload: validate the PDF before anything is written, then store it atomically.

The PDF is opened in a confined reader process (`worker.ingest.sandbox.inspect_pdf`), never
in the calling (API) process. An encrypted PDF is stored decrypted (its password is used
once, in that process, and never persisted).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from worker.ingest.errors import EmptyFileError, IngestError
from worker.ingest.sandbox import ReaderLimits, inspect_pdf


class UploadTooLargeError(IngestError):
    """The upload exceeds the configured byte limit."""

    http_status = 413


@dataclass(frozen=True)
class CheckedUpload:
    """A PDF that opened and has pages: the bytes to store, their digest, page count."""

    data: bytes
    sha256: str
    page_count: int


def upload_path(home: Path, document_id: str) -> Path:
    """Where a document's (decrypted) PDF is stored."""
    return home / "uploads" / f"{document_id}.pdf"


def check_upload(data: bytes, *, password: str | None, max_bytes: int, max_pages: int,
                 limits: ReaderLimits | None = None) -> CheckedUpload:
    """Validate an upload; raise an `IngestError` with a clear message if it is unusable.

    The file is opened in a reader process under `limits` (its memory, CPU time): one whose
    open exceeds them raises `OpenLimitError` naming the limit. Nothing is written.
    """
    if not data:
        raise EmptyFileError()
    if len(data) > max_bytes:
        raise UploadTooLargeError(
            f"the upload is {len(data)} bytes; the limit is {max_bytes} bytes"
        )
    facts, decrypted = inspect_pdf(data, password=password, max_pages=max_pages,
                                   decrypt_limit=2 * max_bytes + (1 << 20),
                                   limits=limits or ReaderLimits())
    return CheckedUpload(data=data if decrypted is None else decrypted,
                         sha256=hashlib.sha256(data).hexdigest(), page_count=facts.page_count)


def store_upload(home: Path, document_id: str, data: bytes) -> Path:
    """Write the PDF atomically (temp file, fsync, rename)."""
    path = upload_path(home, document_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
