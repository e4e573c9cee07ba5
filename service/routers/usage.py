"""`GET /v1/usage`: what the caller's tenant stores against its quotas.

Usage is counted from the metadata store (`MetadataStore.usage`): the tenant's documents in
all its collections, whatever their status, until deleted; a document's bytes are its upload,
and once it is ready what it takes on disk (`worker/disk_cost.py`). A limit of `null` is unlimited
(the setting is 0). An upload that would pass a limit gets 413 naming it.
"""

from __future__ import annotations

from fastapi import APIRouter
from pydantic import BaseModel, Field

from service.deps import TenantDep, WorkerDep

router = APIRouter(tags=["usage"])


class Measure(BaseModel):
    """One quantity a tenant stores and its limit."""

    used: int = Field(description="What the tenant's documents take now.")
    limit: int | None = Field(description="The tenant's quota; null = unlimited.")


class UsageOut(BaseModel):
    """The caller's tenant's usage and quotas."""

    bytes: Measure = Field(description="What the documents take on disk: uploads, and once "
                           "ingested their page images, page KV and text (CONDUIT_QUOTA_BYTES).")
    documents: Measure = Field(description="Documents (CONDUIT_QUOTA_DOCUMENTS).")
    pages: Measure = Field(description="Summed page counts (CONDUIT_QUOTA_PAGES).")
    collections: Measure = Field(description="Collections (CONDUIT_QUOTA_COLLECTIONS).")
    conversations: Measure = Field(description="Stored conversations "
                                   "(CONDUIT_CONVERSATION_MAX_STORED).")


@router.get("/v1/usage", response_model=UsageOut)
def get_usage(worker: WorkerDep, tenant: TenantDep) -> UsageOut:
    """The caller's bytes, documents, pages, collections and conversations with their
    limits."""
    used = worker.usage(tenant)
    quota = worker.quota
    return UsageOut(**{name: Measure(used=getattr(used, name), limit=getattr(quota, name) or None)
                       for name in ("bytes", "documents", "pages")},
                    collections=Measure(used=len(worker.meta.list_collections(tenant)),
                                        limit=quota.collections or None),
                    conversations=Measure(
                        used=worker.conversations.count(tenant),
                        limit=worker.settings.worker.conversation_max_stored or None))
