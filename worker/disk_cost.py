"""What a document costs on the home's disk, charged to its tenant's byte quota.

An upload is the smallest part of a document: its page images, its page KV on the disk tier and
its text and embeddings (in the metadata store and again in the collection's retrieval index)
are many times larger for image-heavy pages (a 4.98 MB PDF of 40 noise-image pages grew the
home by 204 MB). `document_bytes` measures them once the files exist; the ingest checks the
tenant's byte quota and the free-space reserve with it after rendering and again after the
prefill (`check_room_for`: past either, the document fails with a message and keeps nothing
but its upload), and a ready document's `size_bytes` becomes it, so `/v1/usage` and the quota
count what the disk holds. Page KV shared with another document (the same page hash) is
charged to each; KV held only in Redis is not on the home's disk and is not charged.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from storage.keys import PageHash
from storage.kv.disk import DiskKVStore
from storage.metadata import Document, Page
from storage.space import free_bytes
from worker.context import WorkerContext
from worker.ingest.errors import IngestError
from worker.uploads import tenant_quota, upload_path


class OverQuotaError(IngestError):
    """The document's cost on disk would take its tenant past the byte quota or the home past
    its free-space reserve."""

    http_status = 413


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def document_bytes(ctx: WorkerContext, document_id: str, pages: Sequence[Page]) -> int:
    """The upload, page images, page KV on the disk tier, and text and embeddings (counted
    twice: the metadata store's page records and the retrieval index) of one document."""
    total = _size(upload_path(ctx.home, document_id))
    for page in pages:
        total += _size(ctx.page_image_path(page.image_path))
        total += 2 * (len(page.text.encode("utf-8", "replace")) + len(page.embedding or b""))
    disks = [tier for _, tier in ctx.kv.tiers if isinstance(tier, DiskKVStore)]
    for key in {PageHash(p.page_hash) for p in pages}:
        total += sum(_size(disk.path(key)) for disk in disks)
    return total


def check_room_for(ctx: WorkerContext, doc: Document, cost: int) -> None:
    """Raise `OverQuotaError` if `cost` bytes for `doc` pass its tenant's byte quota (its
    other documents as charged now) or leave less than the reserve free on the home."""
    limit = tenant_quota(ctx.settings).bytes
    tenant = ctx.meta.get_collection(doc.collection_id).tenant
    others = ctx.meta.usage(tenant).bytes - ctx.meta.get_document(doc.id).size_bytes
    if limit and others + cost > limit:
        raise OverQuotaError(
            f"the document takes {cost} bytes on disk with its page images and page KV, which "
            f"would pass this tenant's quota of {limit} bytes ({others} used by its other "
            "documents); delete documents to make room")
    reserve = ctx.settings.storage.disk_reserve_bytes
    if reserve and free_bytes(ctx.home) < reserve:
        raise OverQuotaError(
            "the disk is nearly full: the document's page images and page KV would leave less "
            "free space than the service keeps (CONDUIT_DISK_RESERVE_BYTES)")
