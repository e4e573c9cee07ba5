"""The `MetadataStore` protocol: SQLite (embedded) and Redis (distributed) behind one interface."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from storage.metadata.records import (
    Collection,
    CollectionId,
    Document,
    DocumentId,
    DocumentStatus,
    IngestStage,
    Job,
    JobId,
    JobStatus,
    Page,
    SkippedPage,
)
from storage.metadata.usage import Quota, Usage


class MetadataStore(Protocol):
    """Collections, documents, pages and jobs. Every method is atomic on its own."""

    # collections
    def create_collection(self, name: str, tenant: str, shared: bool = False) -> Collection:
        """Create a collection; `ConflictError` if the tenant already has one of that name."""
        ...

    def get_collection(self, collection_id: CollectionId) -> Collection:
        """The collection, or `NotFoundError`."""
        ...

    def find_collection(self, name: str, tenant: str) -> Collection | None:
        """The tenant's collection of that name, if any."""
        ...

    def list_collections(self, tenant: str) -> list[Collection]:
        """The tenant's collections, oldest first."""
        ...

    def delete_collection(self, collection_id: CollectionId) -> None:
        """Delete an empty collection (`ConflictError` if it still holds documents)."""
        ...

    # documents
    def add_document(self, document: Document, quota: Quota | None = None) -> None:
        """Insert a new document record; with `quota`, only if its collection's tenant stays
        within it after the insert (`QuotaExceededError` naming the limit otherwise), checked
        atomically with the insert: concurrent uploads never take a tenant past it."""
        ...

    def usage(self, tenant: str) -> Usage:
        """What the tenant's documents take: their bytes, number and pages
        (`storage.metadata.usage`), counted from the records."""
        ...

    def get_document(self, document_id: DocumentId) -> Document:
        """The document, or `NotFoundError`."""
        ...

    def list_documents(self, collection_id: CollectionId) -> list[Document]:
        """Documents of a collection, oldest first."""
        ...

    def update_progress(
        self,
        document_id: DocumentId,
        *,
        status: DocumentStatus,
        stage: IngestStage,
        pages_done: int,
        pages_total: int,
        error: str | None = None,
        skipped_pages: Sequence[SkippedPage] | None = None,
        size_bytes: int | None = None,
    ) -> None:
        """Record ingestion progress of a document (`skipped_pages`: its unreadable pages,
        replacing those recorded before; `size_bytes`: what it takes on disk, charged to its
        tenant's byte quota; None leaves either as it is)."""
        ...

    def put_pages(self, document_id: DocumentId, pages: Sequence[Page]) -> None:
        """Replace all page records of a document in one transaction."""
        ...

    def list_pages(
        self, collection_id: CollectionId, document_ids: Sequence[DocumentId] | None = None
    ) -> list[Page]:
        """Pages of ready documents in a collection (optionally only some documents)."""
        ...

    def get_pages(self, keys: Sequence[tuple[DocumentId, int]]) -> list[Page]:
        """The pages of ready documents named by `(document id, 1-based number)`, in the
        order of `keys`; keys of missing pages or documents that are not ready are skipped."""
        ...

    def delete_document(self, document_id: DocumentId) -> list[str]:
        """Delete a document and its pages; return the page hashes no other document uses."""
        ...

    def page_hash_in_use(self, page_hash: str) -> bool:
        """Whether any document's page references this KV page hash."""
        ...

    # jobs
    def add_job(self, job: Job) -> None:
        """Insert a new job record."""
        ...

    def get_job(self, job_id: JobId) -> Job:
        """The job, or `NotFoundError`."""
        ...

    def update_job(self, job_id: JobId, *, status: JobStatus, error: str | None = None) -> None:
        """Record a job's status."""
        ...

    def claim_job(self, job_id: JobId, lease_s: float) -> Job | None:
        """Atomically take a job to run it: a queued job, or a running one whose heartbeat is
        older than `lease_s` (its worker died), becomes running with one more attempt. Returns
        None when the job is finished or another worker holds a live lease; `NotFoundError`
        if there is no such job."""
        ...

    def heartbeat_job(self, job_id: JobId) -> None:
        """Renew a running job's lease (its `updated_at`); a finished job is left alone."""
        ...

    def list_active_jobs(self) -> list[Job]:
        """Every queued or running job, oldest first (for the startup reconcile and reaper)."""
        ...

    def close(self) -> None:
        """Release connections."""
        ...
