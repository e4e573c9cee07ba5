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

from storage.metadata import MetadataStore
from storage.metadata.usage import Quota, Usage
from storage.space import free_bytes
from worker.ingest.errors import EmptyFileError, IngestError
from worker.ingest.sandbox import ReaderLimits, inspect_pdf
from worker.settings import Settings


class UploadTooLargeError(IngestError):
    """The upload exceeds the configured byte limit."""

    http_status = 413


class LowDiskSpaceError(IngestError):
    """Storing the upload would leave less free space than the reserve (507)."""

    http_status = 507


def tenant_quota(settings: Settings) -> Quota:
    """Each tenant's limits (`quota_bytes`, `quota_documents`, `quota_pages`; 0 = none)."""
    return Quota(settings.quota_bytes, settings.quota_documents, settings.quota_pages)


def check_room(home: Path, size: int, reserve: int) -> None:
    """Raise `LowDiskSpaceError` unless `size` more bytes leave `reserve` free on the home's
    filesystem (deletes and metadata writes do not check this: they run below it)."""
    free = free_bytes(home)
    if free - size < reserve:
        raise LowDiskSpaceError(
            f"not enough disk space to accept the upload: {free} bytes free and the service "
            f"keeps {reserve} in reserve (CONDUIT_DISK_RESERVE_BYTES); nothing was kept, "
            "deleting documents frees space")


def check_quota(meta: MetadataStore, tenant: str, quota: Quota, checked: CheckedUpload) -> None:
    """Raise `QuotaExceededError` (naming the limit) if the upload would take the tenant past
    its quota: checked before the upload is stored, and again atomically as its record is
    added (`MetadataStore.add_document`)."""
    quota.check(meta.usage(tenant), upload_usage(checked))


def upload_usage(checked: CheckedUpload) -> Usage:
    """What an upload adds to its tenant's usage (its size as uploaded)."""
    return Usage(bytes=checked.size, documents=1, pages=checked.page_count)


@dataclass(frozen=True)
class CheckedUpload:
    """A PDF that opened and has pages: the bytes to store, their digest, page count, and
    the upload's size (before decryption)."""

    data: bytes
    sha256: str
    page_count: int
    size: int


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
                         sha256=hashlib.sha256(data).hexdigest(), page_count=facts.page_count,
                         size=len(data))


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
