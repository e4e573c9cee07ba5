"""`/v1/collections`: create, list, show and delete collections.

A tenant holds at most `quota_collections` collections (413 past it). Both lists are paged
(`service.pagination`: `?limit=&after=`, the next cursor in `X-Next-Cursor`).
"""

from __future__ import annotations

from fastapi import APIRouter, Response

from service.access import owned_collection
from service.deps import CollectionIdPath, TenantDep, WorkerDep
from service.pagination import NEXT_HEADER, PAGE_DEFAULT, After, Limit, page_after
from service.schemas import CollectionIn, CollectionOut, DocumentOut
from service.views import collection_out, document_out

router = APIRouter(prefix="/v1/collections", tags=["collections"])


@router.post("", status_code=201, response_model=CollectionOut)
def create_collection(body: CollectionIn, worker: WorkerDep, tenant: TenantDep) -> CollectionOut:
    """Create a collection (409 if the name is taken, 413 past the collections quota)."""
    worker.quota.check_collections(len(worker.meta.list_collections(tenant)))
    return collection_out(worker.meta.create_collection(body.name, tenant, body.shared))


@router.get("", response_model=list[CollectionOut])
def list_collections(worker: WorkerDep, tenant: TenantDep, response: Response,
                     after: After = None, limit: Limit = PAGE_DEFAULT) -> list[CollectionOut]:
    """The caller's collections, oldest first, a page at a time."""
    page, cursor = page_after(worker.meta.list_collections(tenant),
                              lambda c: (c.created_at, c.id), after, limit)
    if cursor:
        response.headers[NEXT_HEADER] = cursor
    return [collection_out(c) for c in page]


@router.get("/{collection_id}", response_model=CollectionOut)
def get_collection(collection_id: CollectionIdPath, worker: WorkerDep,
                   tenant: TenantDep) -> CollectionOut:
    """One collection."""
    return collection_out(owned_collection(worker, tenant, collection_id))


@router.get("/{collection_id}/documents", response_model=list[DocumentOut])
def list_documents(collection_id: CollectionIdPath, worker: WorkerDep, tenant: TenantDep,
                   response: Response, after: After = None,
                   limit: Limit = PAGE_DEFAULT) -> list[DocumentOut]:
    """The documents of a collection with their status, oldest first, a page at a time."""
    col = owned_collection(worker, tenant, collection_id)
    page, cursor = page_after(worker.meta.list_documents(col.id),
                              lambda d: (d.created_at, d.id), after, limit)
    if cursor:
        response.headers[NEXT_HEADER] = cursor
    return [document_out(d) for d in page]


@router.delete("/{collection_id}", status_code=204)
def delete_collection(collection_id: CollectionIdPath, worker: WorkerDep,
                      tenant: TenantDep) -> None:
    """Delete an empty collection (409 while it holds documents)."""
    worker.delete_collection(owned_collection(worker, tenant, collection_id).id)
