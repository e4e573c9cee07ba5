"""Releasing a document's pages: the metadata store's pages table is the reference count."""

from __future__ import annotations

import logging

from storage.keys import PageHash
from storage.kv.base import KVStore
from storage.metadata.base import MetadataStore
from storage.metadata.records import DocumentId

log = logging.getLogger(__name__)


def release_pages(kv: KVStore, meta: MetadataStore, document_id: DocumentId) -> list[PageHash]:
    """Delete a document and remove, from every tier of `kv`, the pages only it used.

    Hashes that `delete_document` reports as orphans are re-checked with `page_hash_in_use`
    just before deletion, so a page that another document started using meanwhile is kept.
    (A reference added after that re-check can still find its KV gone: the KV store is a cache,
    and a missing page is recomputed.) Returns the page hashes deleted.
    """
    orphans = meta.delete_document(document_id)
    doomed = [PageHash(h) for h in orphans if not meta.page_hash_in_use(h)]
    if doomed:
        kv.delete(doomed)
    log.info("document %s deleted; released %d of %d orphan pages", document_id, len(doomed),
             len(orphans))
    return doomed
