"""Who may see what: the tenant checks the routers share. A collection or document the caller
cannot see (made up, deleted, or another tenant's) gets one 404, the same in every byte."""

from __future__ import annotations

from fastapi import HTTPException

from storage.errors import NotFoundError
from storage.metadata import Collection, CollectionId, Document, DocumentId
from worker.facade import Worker


def owned_collection(worker: Worker, tenant: str, collection_id: str) -> Collection:
    """The collection if the tenant owns it; 404 otherwise (no existence leak)."""
    try:
        col = worker.meta.get_collection(CollectionId(collection_id))
    except NotFoundError:
        col = None
    if col is None or col.tenant != tenant:
        raise HTTPException(404, f"collection {collection_id} not found")
    return col


def document_not_found(document_id: str) -> HTTPException:
    """The one 404 for a document the caller cannot see: made up, deleted, or another
    tenant's (the reply tells them apart in no byte)."""
    return HTTPException(404, f"document {document_id} not found")


def owned_document(worker: Worker, tenant: str, document_id: str) -> Document:
    """The document if the tenant owns its collection; the same 404 as a made-up id otherwise
    (never the owner's collection id)."""
    try:
        doc = worker.meta.get_document(DocumentId(document_id))
        col = worker.meta.get_collection(doc.collection_id)
    except NotFoundError:
        raise document_not_found(document_id) from None
    if col.tenant != tenant:
        raise document_not_found(document_id)
    return doc
