"""Uploads (`POST /v1/collections/{id}/documents`), document status, deletion, and jobs."""

from __future__ import annotations

import errno
import logging
import sqlite3
from collections.abc import Iterator
from typing import Annotated, BinaryIO

from fastapi import APIRouter, Depends, File, Form, HTTPException, UploadFile
from kombu.exceptions import OperationalError

from service.access import owned_collection, owned_document
from service.deps import (
    CollectionIdPath,
    DocumentIdPath,
    JobIdPath,
    TenantDep,
    ThumbnailsDep,
    WorkerDep,
)
from service.metrics import UPLOADS
from service.schemas import DocumentOut, JobOut, UploadOut
from service.views import document_out, job_out
from storage.errors import DiskFullError, NotFoundError, UnavailableError
from storage.metadata import Document, DocumentId, Job, JobId, new_id
from storage.text_safety import safe_text
from worker.facade import UploadTooLargeError, Worker

log = logging.getLogger(__name__)
router = APIRouter(tags=["documents"])

_CHUNK = 1 << 20


def _read_capped(file: BinaryIO, limit: int) -> bytes:
    """Read an upload, stopping as soon as it exceeds `limit` bytes."""
    parts: list[bytes] = []
    size = 0
    while chunk := file.read(_CHUNK):
        size += len(chunk)
        if size > limit:
            raise UploadTooLargeError(f"the upload exceeds the limit of {limit} bytes")
        parts.append(chunk)
    return b"".join(parts)


def storage_refusal(exc: BaseException) -> HTTPException | None:
    """A clear 507/503 for a storage failure while accepting an upload (None: not one)."""
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return HTTPException(507, "not enough disk space to store the upload; nothing was kept")
    if isinstance(exc, DiskFullError) or (
            isinstance(exc, sqlite3.OperationalError) and "full" in str(exc)):
        return HTTPException(507, "the metadata database is out of disk space; nothing was kept")
    if isinstance(exc, (OSError, sqlite3.Error, UnavailableError, OperationalError)):
        return HTTPException(503, "storage or the job queue is unavailable; nothing was kept, "
                             "retry shortly", headers={"Retry-After": "5"})
    return None


def _undo_upload(worker: Worker, doc_id: DocumentId, job_id: JobId) -> None:
    """Remove what an upload that failed half-way stored (each step best effort)."""
    worker.remove_upload(doc_id)
    for step in (lambda: worker.meta.delete_document(doc_id),
                 lambda: worker.meta.update_job(job_id, status="failed",
                                             error="the upload was not accepted")):
        try:
            step()
        except NotFoundError:
            pass
        except Exception as exc:  # storage is down: the reaper settles the records later
            log.warning("could not undo upload %s: %s", doc_id, exc)


def upload_slot(worker: WorkerDep, tenant: TenantDep) -> Iterator[None]:
    """One of the caller's uploads in flight, counted with its documents queued or in
    ingestion (`Worker.upload_slot`), held while the upload is checked and stored;
    `TenantBusyError` (429 with Retry-After, nothing stored) beyond the cap."""
    with worker.upload_slot(tenant):
        yield


UploadSlotDep = Annotated[None, Depends(upload_slot)]


@router.post("/v1/collections/{collection_id}/documents", status_code=202,
             response_model=UploadOut)
def upload_document(
    collection_id: CollectionIdPath,
    worker: WorkerDep,
    tenant: TenantDep,
    _slot: UploadSlotDep,
    file: Annotated[UploadFile, File(description="A PDF, image, e-book, XPS, "
                                                     "text or Office file (GET /v1/info).")],
    password: Annotated[str | None, Form(max_length=1024,
                                         description="Password of an encrypted PDF.")] = None,
) -> UploadOut:
    """Accept a document (a PDF, or a format of `GET /v1/info`, stored as the PDF it becomes):
    validate it fully before anything is stored, then queue its ingestion.

    A plain `def`: parsing, fsync and store calls run on a worker thread, never on the event
    loop. Anything that fails after the first write (disk full, storage or queue down) undoes
    what was stored and answers 507/503. An upload past the tenant's quota gets 413 naming
    the limit; one that would leave less than the disk reserve free gets 507.

    Refused with Retry-After, nothing stored: 429 when the caller has its cap of documents
    queued (`upload_slot`), 503 when the PDF readers hold their memory budget
    (`worker.ingest.budget`).
    """
    col = owned_collection(worker, tenant, collection_id)
    data = _read_capped(file.file, worker.settings.worker.max_upload_bytes)
    checked = worker.check_upload(data, password or None, file.filename)
    worker.check_room(tenant, checked)
    doc_id = DocumentId(new_id("doc"))
    job = Job(id=JobId(new_id("job")), kind="ingest", document_id=doc_id)
    filename = safe_text(file.filename or "document.pdf").replace("/", "_")[-200:]
    try:
        worker.store_upload(doc_id, checked.data)
        worker.meta.add_job(job)
        worker.meta.add_document(Document(
            id=doc_id, collection_id=col.id, filename=filename, sha256=checked.sha256,
            size_bytes=checked.size, pages_total=checked.page_count, job_id=job.id,
        ), worker.quota)
        worker.submit_ingest(job.id, doc_id)
    except Exception as exc:
        _undo_upload(worker, doc_id, job.id)
        refusal = storage_refusal(exc)
        UPLOADS.labels("storage_error" if refusal else "error").inc()
        if refusal is None:
            raise
        log.error("upload %s not accepted: %s: %s", doc_id, type(exc).__name__, exc)
        raise refusal from exc
    UPLOADS.labels("accepted").inc()
    return UploadOut(document_id=doc_id, job_id=job.id, status="queued")


@router.get("/v1/documents/{document_id}", response_model=DocumentOut)
def get_document(document_id: DocumentIdPath, worker: WorkerDep,
                 tenant: TenantDep) -> DocumentOut:
    """Status and progress of a document's ingestion."""
    return document_out(owned_document(worker, tenant, document_id))


@router.delete("/v1/documents/{document_id}", status_code=204)
def delete_document(document_id: DocumentIdPath, worker: WorkerDep, tenant: TenantDep,
                    thumbnails: ThumbnailsDep) -> None:
    """Delete a document, its files, and the cached pages no other document uses.

    409 only while a live worker ingests it; a queued document, or one whose worker died
    (lease expired), is deleted, and its job then ends as failed ("the document was deleted").
    Its files go first, so that the records' delete finds room on a full disk.
    """
    doc = owned_document(worker, tenant, document_id)
    if worker.held_by_live_worker(doc):
        lease_s = worker.settings.worker.job_lease_s
        raise HTTPException(409, "the document is being ingested; retry when it is done (a "
                            f"stalled ingest can be deleted {lease_s:.0f} s after its worker "
                            "stops)")
    thumbnails.drop_document(doc.id)
    released = worker.delete_document_files(doc)
    log.info("deleted %s, released %d cached page(s)", doc.id, released)
    if doc.job_id is not None and doc.status in ("queued", "processing"):
        try:
            worker.meta.update_job(doc.job_id, status="failed", error="the document was deleted")
        except NotFoundError:
            pass


@router.get("/v1/jobs/{job_id}", response_model=JobOut)
def get_job(job_id: JobIdPath, worker: WorkerDep, tenant: TenantDep) -> JobOut:
    """A background job's status: the caller's if its document is theirs. A made-up id,
    another tenant's job and the job of a deleted document all get the same 404."""
    not_found = HTTPException(404, f"job {job_id} not found")
    try:
        job = worker.meta.get_job(JobId(job_id))
    except NotFoundError:
        raise not_found from None
    if job.document_id is None:  # answer jobs are not recorded; none is anyone's to read
        raise not_found
    try:
        doc = owned_document(worker, tenant, job.document_id)
    except HTTPException:
        raise not_found from None
    return job_out(worker.settled_job(job, doc))

