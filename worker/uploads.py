"""Accepting an upload: validate it before anything is written, then store it atomically.

Every upload is stored as a PDF, the form the pipeline reads: a PDF as sent, any other
accepted format (`worker.ingest.formats`) as the PDF it was made into while it was checked;
the document keeps the original's name. The upload is opened in a confined reader process
(`worker.ingest.sandbox.inspect_pdf`), never in the calling (API) process. An encrypted PDF
is stored decrypted (its password is used once, in that process, and never persisted).
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
from worker.ingest.formats import FORMATS, sniff
from worker.ingest.office import check_office, check_page_count, office_to_pdf, soffice_path
from worker.ingest.sandbox import ReaderLimits, inspect_pdf
from worker.settings import Settings


class UploadTooLargeError(IngestError):
    """The upload exceeds the configured byte limit."""

    http_status = 413


class LowDiskSpaceError(IngestError):
    """Storing the upload would leave less free space than the reserve (507)."""

    http_status = 507


def tenant_quota(settings: Settings) -> Quota:
    """Each tenant's limits (`quota_bytes`, `quota_documents`, `quota_pages`,
    `quota_collections`; 0 = none)."""
    s = settings.storage
    return Quota(s.quota_bytes, s.quota_documents, s.quota_pages, s.quota_collections)


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
    """An upload that opened and has pages: the PDF to store (decrypted, or what another
    format became), the digest of the upload as sent, page count, the upload's size, and
    its format (`worker.ingest.formats` name)."""

    data: bytes
    sha256: str
    page_count: int
    size: int
    format: str = "pdf"


@dataclass(frozen=True)
class Conversion:
    """How uploads of other formats become a PDF: images are pages at `dpi` with at most
    `max_pixels`; Office files are converted by LibreOffice (`office`: allowed at all)
    within `office_timeout_s`."""

    dpi: int = 100
    max_pixels: int = 1654 * 2339
    office: bool = True
    office_timeout_s: float = 120.0


def conversion(settings: Settings) -> Conversion:
    """The deployment's `Conversion` (`render_dpi`, `max_page_pixels`, `office_conversion`,
    `office_timeout_s`)."""
    return Conversion(settings.worker.render_dpi, settings.worker.max_page_pixels,
                      settings.worker.office_conversion, settings.worker.office_timeout_s)


def upload_path(home: Path, document_id: str) -> Path:
    """Where a document's (decrypted) PDF is stored."""
    return home / "uploads" / f"{document_id}.pdf"


def accepted_formats(convert: Conversion) -> list[dict[str, object]]:
    """What a user may upload here, for `GET /v1/info`: each format's name, label and
    extensions; Office formats only when conversion is on and LibreOffice is installed."""
    office = convert.office and soffice_path() is not None
    return [{"name": f.name, "label": f.label, "extensions": list(f.extensions)}
            for f in FORMATS if f.route != "office" or office]


def check_upload(data: bytes, *, password: str | None, max_bytes: int, max_pages: int,
                 limits: ReaderLimits | None = None, filename: str | None = None,
                 convert: Conversion | None = None) -> CheckedUpload:
    """Validate an upload; raise an `IngestError` with a clear message if it is unusable.

    Its format is sniffed from its content and checked against `filename`
    (`worker.ingest.formats.sniff`: 415 for an unsupported one). A PDF is opened as it is;
    an image, e-book, XPS or text file is made a PDF by the reader that opens it; an Office
    file by LibreOffice first (`worker.ingest.office`; 415 when `convert.office` is off or
    LibreOffice is missing). The reader runs under `limits` (its memory, CPU time): an
    open that exceeds them raises `OpenLimitError` naming the limit. Nothing is written.
    """
    if not data:
        raise EmptyFileError()
    if len(data) > max_bytes:
        raise UploadTooLargeError(
            f"the upload is {len(data)} bytes; the limit is {max_bytes} bytes"
        )
    fmt = sniff(data, filename)
    limits = limits or ReaderLimits()
    convert = convert or Conversion()
    pdf_limit = 2 * max_bytes + (1 << 20)
    opened, options = data, None
    if fmt.route == "office":
        check_page_count(data, fmt, max_pages)
        soffice = check_office(fmt, enabled=convert.office)
        opened = office_to_pdf(data, fmt, soffice=soffice, memory_mb=limits.memory_mb,
                               seconds=convert.office_timeout_s, max_bytes=pdf_limit,
                               budget_mb=limits.budget_mb)
    elif fmt.route != "pdf":
        options = {"filetype": fmt.name, "label": fmt.label, "dpi": convert.dpi,
                   "max_pixels": convert.max_pixels}
    facts, made = inspect_pdf(opened, password=password if fmt.route == "pdf" else None,
                              max_pages=max_pages, decrypt_limit=pdf_limit, limits=limits,
                              convert=options)
    return CheckedUpload(data=made or opened, sha256=hashlib.sha256(data).hexdigest(),
                         page_count=facts.page_count, size=len(data), format=fmt.name)


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
