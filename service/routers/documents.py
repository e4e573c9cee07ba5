"""Uploads (`POST /v1/collections/{id}/documents`), document status, deletion, and jobs."""

from __future__ import annotations

import logging
import shutil
from typing import Annotated

from fastapi import APIRouter, File, Form, HTTPException, UploadFile

from service.deps import CtxDep, RunnerDep, TenantDep
from service.metrics import UPLOADS
from service.routers.collections import owned_collection
from service.schemas import DocumentOut, JobOut, UploadOut
from service.views import document_out, job_out
from storage.errors import NotFoundError
from storage.gc import release_pages
from storage.metadata import Document, DocumentId, Job, JobId, new_id
from worker.context import WorkerContext
from worker.ingest.errors import IngestError
from worker.uploads import UploadTooLargeError, check_upload, store_upload, upload_path

log = logging.getLogger(__name__)
router = APIRouter(tags=["documents"])

_CHUNK = 1 << 20


async def _read_capped(file: UploadFile, limit: int) -> bytes:
    """Read an upload, stopping as soon as it exceeds `limit` bytes."""
    parts: list[bytes] = []
    size = 0
    while chunk := await file.read(_CHUNK):
        size += len(chunk)
        if size > limit:
            raise UploadTooLargeError(f"the upload exceeds the limit of {limit} bytes")
        parts.append(chunk)
    return b"".join(parts)


def owned_document(ctx: WorkerContext, tenant: str, document_id: str) -> Document:
    """The document if the tenant owns its collection; 404 otherwise."""
    try:
        doc = ctx.meta.get_document(DocumentId(document_id))
    except NotFoundError:
        raise HTTPException(404, f"document {document_id} not found") from None
    owned_collection(ctx, tenant, doc.collection_id)
    return doc


@router.post("/v1/collections/{collection_id}/documents", status_code=202,
             response_model=UploadOut)
async def upload_document(
    collection_id: str,
    ctx: CtxDep,
    runner: RunnerDep,
    tenant: TenantDep,
    file: Annotated[UploadFile, File(description="A PDF file.")],
    password: Annotated[str | None, Form(description="Password of an encrypted PDF.")] = None,
) -> UploadOut:
    """Accept a PDF: validate it fully before anything is stored, then queue its ingestion."""
    col = owned_collection(ctx, tenant, collection_id)
    s = ctx.settings
    data = await _read_capped(file, s.max_upload_bytes)
    checked = check_upload(data, password=password or None, max_bytes=s.max_upload_bytes,
                           max_pages=s.max_pages)
    doc_id = DocumentId(new_id("doc"))
    job = Job(id=JobId(new_id("job")), kind="ingest", document_id=doc_id)
    filename = (file.filename or "document.pdf").replace("/", "_")[-200:]
    store_upload(ctx.home, doc_id, checked.data)
    try:
        ctx.meta.add_job(job)
        ctx.meta.add_document(Document(
            id=doc_id, collection_id=col.id, filename=filename, sha256=checked.sha256,
            size_bytes=len(data), pages_total=checked.page_count, job_id=job.id,
        ))
    except Exception:
        upload_path(ctx.home, doc_id).unlink(missing_ok=True)
        raise
    runner.submit_ingest(job.id, doc_id)
    UPLOADS.labels("accepted").inc()
    return UploadOut(document_id=doc_id, job_id=job.id, status="queued")


@router.get("/v1/documents/{document_id}", response_model=DocumentOut)
def get_document(document_id: str, ctx: CtxDep, tenant: TenantDep) -> DocumentOut:
    """Status and progress of a document's ingestion."""
    return document_out(owned_document(ctx, tenant, document_id))


@router.delete("/v1/documents/{document_id}", status_code=204)
def delete_document(document_id: str, ctx: CtxDep, tenant: TenantDep) -> None:
    """Delete a document, its files, and the cached pages no other document uses."""
    doc = owned_document(ctx, tenant, document_id)
    if doc.status in ("queued", "processing"):
        raise HTTPException(409, "the document is still being ingested; retry when it is done")
    released = release_pages(ctx.kv, ctx.meta, doc.id)
    log.info("deleted %s, released %d cached page(s)", doc.id, len(released))
    upload_path(ctx.home, doc.id).unlink(missing_ok=True)
    shutil.rmtree(ctx.home / "pages" / doc.id, ignore_errors=True)


@router.get("/v1/jobs/{job_id}", response_model=JobOut)
def get_job(job_id: str, ctx: CtxDep, tenant: TenantDep) -> JobOut:
    """A background job's status."""
    try:
        job = ctx.meta.get_job(JobId(job_id))
    except NotFoundError:
        raise HTTPException(404, f"job {job_id} not found") from None
    if job.document_id is not None:
        owned_document(ctx, tenant, job.document_id)
    return job_out(job)


def ingest_error_status(exc: IngestError) -> int:
    """HTTP status of an ingest error (each error class carries its own)."""
    return exc.http_status
