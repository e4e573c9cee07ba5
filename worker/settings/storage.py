"""The settings of `storage`: the home directory, Redis, the page-KV tiers' budgets, and what
each tenant may store."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings

from worker.settings.fields import FLAT_ENV, cap


class StorageSettings(BaseSettings):
    """Where state lives and how much of it."""

    model_config = FLAT_ENV

    # where state lives
    home: Path = Field(Path(".conduit"), description="Directory for all on-disk state.")
    redis_url: str | None = Field(
        None, description="Redis URL; set it to run distributed (Redis KV, metadata, Celery)."
    )

    # the page-KV tiers
    memory_kv_bytes: int = Field(
        512 * 2**20, ge=0, description="Byte budget of the in-memory page-KV LRU."
    )
    disk_kv_bytes: int = Field(
        20 * 2**30, ge=0, description="Byte budget of the on-disk page-KV tier."
    )
    redis_kv_ttl_s: int | None = Field(None, ge=1, description="TTL of page KV in Redis.")
    kv_int8: bool = Field(True, description="Store page KV quantised to int8.")

    # per-tenant quotas (the metadata store charges them atomically) and the disk reserve
    quota_bytes: int = cap(
        20 * 2**30, "Per-tenant cap on the summed size of its uploads, every status counted "
        "until deleted; an upload past it gets 413 naming the limit.",
    )
    quota_documents: int = cap(5000, "Per-tenant cap on its documents (413 past it).")
    quota_pages: int = cap(
        100_000, "Per-tenant cap on the summed pages of its documents, each counted at upload "
        "(413 past it); bounds the page KV, images and index a tenant makes.",
    )
    quota_collections: int = cap(300, "Per-tenant cap on its collections (413 past it).")
    disk_reserve_bytes: int = Field(
        1 * 2**30, ge=0, description="Free space kept on the home's filesystem: an upload that "
        "would leave less gets 507 (deletes, status and metadata writes still run). 0 = none.",
    )
