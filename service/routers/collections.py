"""`/v1/collections`: create, list, show and delete collections."""

from __future__ import annotations

from fastapi import APIRouter

from service.access import owned_collection
from service.deps import CollectionIdPath, TenantDep, WorkerDep
from service.schemas import CollectionIn, CollectionOut, DocumentOut
from service.views import collection_out, document_out

router = APIRouter(prefix="/v1/collections", tags=["collections"])


@router.post("", status_code=201, response_model=CollectionOut)
def create_collection(body: CollectionIn, worker: WorkerDep, tenant: TenantDep) -> CollectionOut:
    """Create a collection (409 if the name is taken)."""
    return collection_out(worker.meta.create_collection(body.name, tenant, body.shared))


@router.get("", response_model=list[CollectionOut])
def list_collections(worker: WorkerDep, tenant: TenantDep) -> list[CollectionOut]:
    """The caller's collections."""
    return [collection_out(c) for c in worker.meta.list_collections(tenant)]


@router.get("/{collection_id}", response_model=CollectionOut)
def get_collection(collection_id: CollectionIdPath, worker: WorkerDep,
                   tenant: TenantDep) -> CollectionOut:
    """One collection."""
    return collection_out(owned_collection(worker, tenant, collection_id))


@router.get("/{collection_id}/documents", response_model=list[DocumentOut])
def list_documents(collection_id: CollectionIdPath, worker: WorkerDep,
                   tenant: TenantDep) -> list[DocumentOut]:
    """The documents of a collection with their status."""
    col = owned_collection(worker, tenant, collection_id)
    return [document_out(d) for d in worker.meta.list_documents(col.id)]


@router.delete("/{collection_id}", status_code=204)
def delete_collection(collection_id: CollectionIdPath, worker: WorkerDep,
                      tenant: TenantDep) -> None:
    """Delete an empty collection (409 while it holds documents)."""
    worker.delete_collection(owned_collection(worker, tenant, collection_id).id)
