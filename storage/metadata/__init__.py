"""Metadata store: collections, documents, pages, jobs (SQLite embedded, Redis distributed)."""

from storage.metadata.base import MetadataStore
from storage.metadata.records import (
    Collection,
    CollectionId,
    Document,
    DocumentId,
    Job,
    JobId,
    Page,
    SkippedPage,
    new_id,
)
from storage.metadata.redis_store import RedisMetadataStore
from storage.metadata.sqlite import SQLiteMetadataStore

__all__ = [
    "Collection", "CollectionId", "Document", "DocumentId", "Job", "JobId", "MetadataStore",
    "Page", "RedisMetadataStore", "SQLiteMetadataStore", "SkippedPage", "new_id",
]
