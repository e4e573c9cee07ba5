"""The pipeline's side of the persistent retrieval index: one `RetrievalIndexes` per home
dir, the ingest and delete hooks, the index-first retrieval with the scan path as fallback,
and the startup consistency check.

Hooks never fail the step they follow: the metadata store is the source of truth, and an
index that missed a change is found stale by the consistency check and rebuilt.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from pathlib import Path

from storage.metadata import DocumentId, Page
from worker.context import WorkerContext
from worker.retrieval.hybrid import Hit
from worker.retrieval.index import RetrievalIndexes, search_index

log = logging.getLogger(__name__)

_handles: dict[Path, RetrievalIndexes] = {}
_handles_lock = threading.Lock()


def retrieval_indexes(ctx: WorkerContext) -> RetrievalIndexes:
    """This process's handle on the indexes under `<home>/index` (one per home dir)."""
    root = ctx.home / "index"
    with _handles_lock:
        handle = _handles.get(root)
        if handle is None:
            handle = RetrievalIndexes(root, lock_timeout_s=ctx.settings.worker.index_lock_timeout_s,
                                      ivf_min_rows=ctx.settings.worker.index_ivf_min_rows)
            _handles[root] = handle
        return handle


def on_document_ready(ctx: WorkerContext, collection_id: str, document_id: str,
                      pages: Sequence[Page]) -> None:
    """Add a document that just became ready to its collection's index (best effort)."""
    if not ctx.settings.worker.retrieval_index:
        return
    try:
        retrieval_indexes(ctx).document_ready(ctx.meta, collection_id, document_id, pages)
    except Exception:  # noqa: BLE001 - the check at startup repairs a missed update
        log.exception("could not add %s to the retrieval index of %s", document_id,
                      collection_id)


def on_document_deleted(ctx: WorkerContext, collection_id: str, document_id: str) -> None:
    """Drop a deleted document from its collection's index (best effort)."""
    if not ctx.settings.worker.retrieval_index:
        return
    try:
        retrieval_indexes(ctx).document_deleted(ctx.meta, collection_id, document_id)
    except Exception:  # noqa: BLE001 - the check at startup repairs a missed update
        log.exception("could not drop %s from the retrieval index of %s", document_id,
                      collection_id)


def on_collection_deleted(ctx: WorkerContext, collection_id: str) -> None:
    """Remove a deleted (empty) collection's index folder."""
    retrieval_indexes(ctx).remove_collection(collection_id)


def index_hits(ctx: WorkerContext, collection_id: str, question: str, *, top_k: int,
               document_ids: Sequence[DocumentId] | None, bm25_weight: float,
               dense_weight: float) -> list[Hit] | None:
    """The question's hits from the collection's index; None when the scan path must answer
    (index off, missing or being rebuilt: a missing one is then built in the background)."""
    s = ctx.settings
    if not s.worker.retrieval_index:
        return None
    indexes = retrieval_indexes(ctx)
    reader = indexes.reader(collection_id)
    if reader is None:
        return None
    hits = search_index(reader, question, top_k=top_k, document_ids=document_ids,
                        bm25_weight=bm25_weight, dense_weight=dense_weight,
                        embedder=ctx.embedder, rrf_k=s.worker.rrf_k, depth=s.worker.index_depth,
                        scan_rows=s.worker.index_scan_rows)
    if hits is None:
        indexes.rebuild_in_background(ctx.meta, collection_id)
    return hits


def start_index_check(ctx: WorkerContext) -> threading.Thread | None:
    """Check every indexed collection against the store in a background thread, rebuilding
    stale ones (questions scan meanwhile). None when the index is off."""
    if not ctx.settings.worker.retrieval_index:
        return None

    def run() -> None:
        try:
            retrieval_indexes(ctx).startup_check(ctx.meta)
        except Exception:  # noqa: BLE001 - questions still have the scan path
            log.exception("the retrieval index check failed")

    thread = threading.Thread(target=run, name="index-check", daemon=True)
    thread.start()
    return thread
