"""Keeping collection indexes in step with the metadata store (the source of truth).

`RetrievalIndexes` is one process's handle on the index root (`<home>/index`): readers per
collection, the incremental hooks (a document became ready, a document was deleted), the
consistency check (index vs ready documents in the store) and rebuilds. A rebuild fills a
new version folder without the lock, then takes the lock, catches up with what changed
meanwhile and switches CURRENT, so ingestion is never blocked for a whole build. Questions
over a collection with no usable index fall back to the scan path while a background
rebuild runs.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from storage.errors import NotFoundError
from storage.metadata import CollectionId, DocumentId, MetadataStore, Page
from worker.retrieval.embedder import embedding_from_bytes
from worker.retrieval.index import ivf
from worker.retrieval.index.files import (
    FORMAT,
    collection_dir,
    current_version,
    read_manifest,
    set_current,
    usable_version,
)
from worker.retrieval.index.reader import IndexReader
from worker.retrieval.index.writer import (
    IndexDocument,
    IndexPage,
    apply,
    create_version,
    rebuild_lock,
    retrain,
    writer_lock,
)

log = logging.getLogger(__name__)

SYNC_BATCH_DOCUMENTS = 200  # documents read from the store and committed together
SYNC_BUILD_MAX_DOCUMENTS = 20  # a collection without an index this small is built in the hook
COMPACT_MIN_DEAD_PAGES = 1000  # a rebuild drops deleted pages' rows once this many ...
COMPACT_DEAD_SHARE = 0.25  # ... and this share of the indexed pages are dead


@dataclass(frozen=True)
class IndexCheck:
    """Index vs store for one collection: "ok", "missing" (no index) or "stale" (documents
    differ, or an older index format), with the document ids that differ."""

    collection_id: str
    state: Literal["ok", "missing", "stale"]
    missing: list[str] = field(default_factory=list)  # ready in the store, not indexed
    extra: list[str] = field(default_factory=list)  # indexed, no longer ready in the store


def index_document(document_id: str, pages: Sequence[Page]) -> IndexDocument:
    """A document's stored pages as the index takes them."""
    return IndexDocument(document_id, [
        IndexPage(p.number, p.text, p.context,
                  embedding_from_bytes(p.embedding) if p.embedding else None)
        for p in pages])


class RetrievalIndexes:
    """The indexes under `root`, shared by the threads of one process."""

    def __init__(self, root: Path, *, lock_timeout_s: float = 120.0,
                 ivf_min_rows: int = ivf.MIN_ROWS) -> None:
        self.root = root
        self.lock_timeout_s = lock_timeout_s
        self.ivf_min_rows = ivf_min_rows
        self._readers: dict[str, IndexReader] = {}
        self._building: set[str] = set()
        self._training: set[str] = set()
        self._lock = threading.Lock()

    def reader(self, collection_id: str) -> IndexReader | None:
        """A reader of the collection's index, or None while it is missing or being rebuilt
        by this process (the caller scans instead)."""
        with self._lock:
            if collection_id in self._building:
                return None
            reader = self._readers.get(collection_id)
            if reader is None:
                reader = IndexReader(collection_dir(self.root, collection_id))
                self._readers[collection_id] = reader
        return reader

    def document_ready(self, meta: MetadataStore, collection_id: str, document_id: str,
                       pages: Sequence[Page]) -> bool:
        """Add a document that just became ready. A collection without an index gets one
        built from the store now when it is small (its first documents); a larger one is
        left to the background rebuild that its next question or the startup check starts
        (returns False)."""
        cdir = collection_dir(self.root, collection_id)
        if usable_version(cdir) is None:
            if len(_ready_documents(meta, collection_id)) > SYNC_BUILD_MAX_DOCUMENTS:
                return False
            self.rebuild(meta, collection_id)
            return True
        with writer_lock(cdir, self.lock_timeout_s):
            version = usable_version(cdir)
            if version is None:
                return False
            manifest = apply(version, add=[index_document(document_id, pages)], train=False)
        if ivf.due(manifest.rows, manifest.ivf_rows, self.ivf_min_rows):
            self.retrain_in_background(collection_id, version)
        return True

    def document_deleted(self, meta: MetadataStore, collection_id: str,
                         document_id: str) -> None:
        """Drop a deleted document; start a compacting rebuild when dead pages pile up."""
        cdir = collection_dir(self.root, collection_id)
        if usable_version(cdir) is None:  # none, or an older format: the rebuild reads the store
            return
        with writer_lock(cdir, self.lock_timeout_s):
            version = usable_version(cdir)
            if version is None:
                return
            manifest = apply(version, remove=[document_id], train=False)
        dead = manifest.dead_pages()
        if dead >= COMPACT_MIN_DEAD_PAGES and dead >= COMPACT_DEAD_SHARE * manifest.pages:
            self.rebuild_in_background(meta, collection_id)

    def check(self, meta: MetadataStore, collection_id: str) -> IndexCheck:
        """Compare the collection's index with its ready documents in the store."""
        version = current_version(collection_dir(self.root, collection_id))
        if version is None:
            return IndexCheck(collection_id, "missing")
        manifest = read_manifest(version)
        ready = set(_ready_documents(meta, collection_id))
        live = set(manifest.live())
        missing, extra = sorted(ready - live), sorted(live - ready)
        stale = missing or extra or manifest.format != FORMAT
        return IndexCheck(collection_id, "stale" if stale else "ok", missing, extra)

    def rebuild(self, meta: MetadataStore, collection_id: str) -> int:
        """Build the collection's index afresh from the store and switch to it; return the
        number of indexed pages. Rebuilds of one collection are serialised (`rebuild_lock`,
        across threads and processes): each builds its own version folder, switches to it and
        removes the older ones, never one that another rebuild is filling."""
        cdir = collection_dir(self.root, collection_id)
        with rebuild_lock(cdir):
            version = cdir / f"v{time.time_ns()}"
            create_version(version)
            _sync(meta, collection_id, version)
            # train the vectors' inverted file once, if the collection is large enough
            apply(version, ivf_min_rows=self.ivf_min_rows)
            with writer_lock(cdir, self.lock_timeout_s):
                _sync(meta, collection_id, version)  # what changed while the bulk was built
                set_current(cdir, version)
            for old in cdir.glob("v*"):
                if old != version:
                    shutil.rmtree(old, ignore_errors=True)
            return read_manifest(version).pages

    def rebuild_in_background(self, meta: MetadataStore, collection_id: str) -> bool:
        """Start a rebuild thread unless one is running for the collection; questions scan
        meanwhile. Returns whether a thread was started."""
        with self._lock:
            if collection_id in self._building:
                return False
            self._building.add(collection_id)

        def run() -> None:
            try:
                pages = self.rebuild(meta, collection_id)
                log.info("rebuilt the retrieval index of %s (%d pages)", collection_id, pages)
            except Exception:
                log.exception("rebuilding the retrieval index of %s failed", collection_id)
            finally:
                with self._lock:
                    self._building.discard(collection_id)

        threading.Thread(target=run, name=f"index-rebuild-{collection_id}", daemon=True).start()
        return True

    def retrain_in_background(self, collection_id: str, version: Path) -> threading.Thread | None:
        """Retrain the vectors' inverted file of a live version in a thread (`writer.retrain`:
        the writer lock is held only to switch), unless this process is already retraining
        it; questions keep using the current lists meanwhile. Returns the thread."""
        with self._lock:
            if collection_id in self._training:
                return None
            self._training.add(collection_id)
        cdir = collection_dir(self.root, collection_id)

        def run() -> None:
            try:
                retrain(version, lambda: writer_lock(cdir, self.lock_timeout_s))
            except Exception:
                log.exception("retraining the vector lists of %s failed", collection_id)
            finally:
                with self._lock:
                    self._training.discard(collection_id)

        thread = threading.Thread(target=run, name=f"index-lists-{collection_id}", daemon=True)
        thread.start()
        return thread

    def remove_collection(self, collection_id: str) -> None:
        """Forget a deleted collection's index and remove its folder."""
        cdir = collection_dir(self.root, collection_id)
        with self._lock:
            self._readers.pop(collection_id, None)
        if cdir.exists():
            with writer_lock(cdir, self.lock_timeout_s):
                (cdir / "CURRENT").unlink(missing_ok=True)
                for version in cdir.glob("v*"):
                    shutil.rmtree(version, ignore_errors=True)
            shutil.rmtree(cdir, ignore_errors=True)

    def indexed_collections(self) -> list[str]:
        """Collections that have an index folder under the root."""
        if not self.root.exists():
            return []
        return sorted(p.name for p in self.root.iterdir() if p.is_dir())

    def startup_check(self, meta: MetadataStore) -> list[IndexCheck]:
        """Check every indexed collection; rebuild stale ones in the background (collections
        without an index are built on their first question). Returns the checks."""
        checks = []
        for collection_id in self.indexed_collections():
            try:
                check = self.check(meta, collection_id)
            except NotFoundError:
                continue
            checks.append(check)
            if check.state != "ok":
                log.warning("retrieval index of %s is %s (%d missing, %d extra documents): "
                            "rebuilding in the background", collection_id, check.state,
                            len(check.missing), len(check.extra))
                self.rebuild_in_background(meta, collection_id)
        return checks


def _ready_documents(meta: MetadataStore, collection_id: str) -> list[str]:
    return [d.id for d in meta.list_documents(CollectionId(collection_id))
            if d.status == "ready"]


def _sync(meta: MetadataStore, collection_id: str, version: Path) -> None:
    """Make the version folder hold exactly the collection's ready documents (the vector
    lists are not trained here: the rebuild trains once, the hooks retrain when due)."""
    live = read_manifest(version).live()
    ready = _ready_documents(meta, collection_id)
    ready_set = set(ready)
    remove = [d for d in live if d not in ready_set]
    add = [d for d in ready if d not in live]
    if remove:
        apply(version, remove=remove, train=False)
    for start in range(0, len(add), SYNC_BATCH_DOCUMENTS):
        batch = [DocumentId(d) for d in add[start:start + SYNC_BATCH_DOCUMENTS]]
        by_doc: dict[str, list[Page]] = {d: [] for d in batch}
        for page in meta.list_pages(CollectionId(collection_id), batch):
            by_doc[page.document_id].append(page)
        apply(version, add=[index_document(d, pages) for d, pages in by_doc.items()],
              train=False)
