"""A ready document's pages: `GET /v1/documents/{id}/pages` (text, OCR and KV-cache facts per
page) and `GET /v1/documents/{id}/pages/{n}/image` (the rendered page as PNG, or a thumbnail
with `?width=`). Both are tenant-checked like the document itself: another tenant's id is a 404.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, HTTPException, Query, Response
from fastapi.responses import FileResponse

from service.access import owned_document
from service.deps import DocumentIdPath, PageNumberPath, TenantDep, ThumbnailsDep, WorkerDep
from service.schemas import PageOut
from service.thumbnails import WIDTHS, thumbnail_width
from storage.keys import PageHash
from storage.metadata import Page
from worker.facade import Worker

router = APIRouter(tags=["documents"])

# a page's image never changes under its document id (a new upload is a new id), so clients may
# keep it; `private` because the response depends on the caller's credentials
IMAGE_CACHE_CONTROL = "private, max-age=86400"
MAX_THUMB_WIDTH = 4096


def _ready_pages(worker: Worker, tenant: str, document_id: str) -> list[Page]:
    doc = owned_document(worker, tenant, document_id)
    if doc.status == "failed":
        raise HTTPException(409, f"document {document_id} failed to ingest: {doc.error}")
    if doc.status != "ready":
        raise HTTPException(409, f"document {document_id} is still being ingested "
                            f"({doc.stage}, {doc.pages_done}/{doc.pages_total}); retry when "
                            "it is ready")
    return sorted(worker.meta.list_pages(doc.collection_id, [doc.id]), key=lambda p: p.number)


@router.get("/v1/documents/{document_id}/pages", response_model=list[PageOut])
def list_pages(document_id: DocumentIdPath, worker: WorkerDep, tenant: TenantDep) -> list[PageOut]:
    """Every page of a ready document: size, text length, whether it was OCRed, and which KV
    tiers hold its cache (409 while the document is being ingested or if it failed)."""
    pages = _ready_pages(worker, tenant, document_id)
    held = worker.kv_tiers_holding([PageHash(p.page_hash) for p in pages])
    return [PageOut(number=p.number, width=p.width, height=p.height,
                    kv_cached=bool(held[PageHash(p.page_hash)]),
                    kv_tiers=held[PageHash(p.page_hash)], text_chars=len(p.text),
                    ocr=p.text_source == "ocr") for p in pages]


@router.get("/v1/documents/{document_id}/pages/{number}/image",
            response_class=Response,
            responses={200: {"content": {"image/webp": {}, "image/png": {}}},
                       304: {"description": "unchanged"}})
def page_image(
    document_id: DocumentIdPath,
    number: PageNumberPath,
    worker: WorkerDep,
    tenant: TenantDep,
    thumbnails: ThumbnailsDep,
    width: Annotated[int | None, Query(
        ge=16, le=MAX_THUMB_WIDTH, description="Scale down to about this width: rounded up "
        f"to the next of {', '.join(map(str, WIDTHS))} (never wider than the page).")] = None,
    if_none_match: Annotated[str | None, Header(max_length=4096)] = None,
) -> Response:
    """The page as rendered for the model, as stored (lossless WebP; PNG for documents
    ingested before); `?width=` scales it down for thumbnails (PNG; a
    fixed set of widths, kept in a bounded in-memory cache). Answers carry an ETag and
    `Cache-Control`; a matching `If-None-Match` gets a 304."""
    page = next((p for p in _ready_pages(worker, tenant, document_id) if p.number == number), None)
    if page is None:
        raise HTTPException(404, f"document {document_id} has no page {number}")
    path = worker.page_image_path(page.image_path)
    if not path.is_file():
        raise HTTPException(404, f"the image of page {number} is missing on the server")
    if width is not None:
        width = thumbnail_width(width)
    scaled = width is not None and width < page.width
    etag = f'"{page.page_hash[:24]}-{width if scaled else "full"}"'
    headers = {"ETag": etag, "Cache-Control": IMAGE_CACHE_CONTROL, "Vary": "Authorization"}
    if if_none_match is not None and etag in {t.strip() for t in if_none_match.split(",")}:
        return Response(status_code=304, headers=headers)
    if not scaled:
        media = "image/webp" if path.suffix == ".webp" else "image/png"
        return FileResponse(path, media_type=media, headers=headers)
    assert width is not None
    return Response(thumbnails.get(page.document_id, path, width), media_type="image/png",
                    headers=headers)
