"""`GET /v1/models` and `GET /v1/models/{model}`: the caller's collections as OpenAI models.

OpenAI clients and chat front-ends list models before they chat; each of the caller's
collections is a model named `conduit:<collection_id>`, the name `POST /v1/chat/completions`
takes. The list is paged like every list (`service.pagination`), keeping OpenAI's list object
with `has_more` and `next_cursor` added. Tenant-scoped like every listing: another tenant's
collection is not listed, and asking for it by name gets exactly the 404 a made-up name gets.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Path

from service.deps import TenantDep, WorkerDep
from service.pagination import PAGE_DEFAULT, After, Limit, page_after
from storage.errors import NotFoundError
from storage.metadata import Collection, CollectionId

router = APIRouter(tags=["openai"])

MODEL_PREFIX = "conduit:"
ModelPath = Annotated[str, Path(min_length=1, max_length=128, description="`conduit:<id>`")]


def model_card(col: Collection) -> dict[str, object]:
    """OpenAI's model object for a collection (`name`: the collection's, for front-ends)."""
    return {"id": f"{MODEL_PREFIX}{col.id}", "object": "model", "created": int(col.created_at),
            "owned_by": "conduit", "name": col.name}


@router.get("/v1/models")
def list_models(worker: WorkerDep, tenant: TenantDep, after: After = None,
                limit: Limit = PAGE_DEFAULT) -> dict[str, object]:
    """The caller's collections, oldest first, in OpenAI's list format, a page at a time."""
    page, cursor = page_after(worker.meta.list_collections(tenant),
                              lambda c: (c.created_at, c.id), after, limit)
    return {"object": "list", "data": [model_card(c) for c in page],
            "has_more": cursor is not None, "next_cursor": cursor}


@router.get("/v1/models/{model}")
def get_model(model: ModelPath, worker: WorkerDep, tenant: TenantDep) -> dict[str, object]:
    """One of the caller's collections as a model; 404 for any other name."""
    col: Collection | None = None
    if model.startswith(MODEL_PREFIX):
        try:
            col = worker.meta.get_collection(CollectionId(model.removeprefix(MODEL_PREFIX)))
        except NotFoundError:
            col = None
    if col is None or col.tenant != tenant:
        raise HTTPException(404, f"model {model} not found")
    return model_card(col)
