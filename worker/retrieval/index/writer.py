"""Writing a collection's index: add and remove whole documents, one writer at a time.

Every change runs under the collection's file lock (`writer_lock`), so one process writes
while any number read. A change appends the documents' passage vectors, page-table rows and
the pages' stem counts (for exact BM25, `exact_bm25.py`), adds their pages to Tantivy (stemmed
tokens, tokenised exactly as the BM25 scan path tokenises), commits Tantivy, and then commits
the manifest. Removing a document deletes its Tantivy documents by term and marks its ordinal
dead; its vector rows and stems stay until compaction (a rebuild). Large collections also
append each new vector row's list to the inverted file (`ivf.py`); `retrain` rebuilds the lists of
a live version with the lock held only to switch.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tantivy
from filelock import FileLock

from worker.retrieval.bm25 import tokenize
from worker.retrieval.document_context import with_context
from worker.retrieval.index import ivf
from worker.retrieval.index.exact_bm25 import page_entries
from worker.retrieval.index.files import (
    PAGE_FIELDS,
    Manifest,
    append_raw,
    ivf_paths,
    read_manifest,
    write_file,
    write_manifest,
)

WRITER_HEAP_BYTES = 32_000_000  # Tantivy's buffer before it flushes a segment


@dataclass(frozen=True)
class IndexPage:
    """One page as the index stores it: its number, text and document context (indexed by
    BM25, as `with_context` joins them) and its `(n, d)` passage vectors (None: no text)."""

    number: int
    text: str
    context: str = ""
    vectors: np.ndarray | None = None


@dataclass(frozen=True)
class IndexDocument:
    """A ready document's pages, as added to the index in one commit."""

    document_id: str
    pages: Sequence[IndexPage]


@functools.cache
def schema() -> tantivy.Schema:
    """Tantivy schema: `body` holds our stemmed tokens joined by spaces, split back by
    Tantivy's whitespace tokenizer (stems hold no spaces; frequencies, no positions), `doc`
    the document id (exact term, for filters and deletes), `page` the page ordinal."""
    builder = tantivy.SchemaBuilder()
    builder.add_text_field("body", tokenizer_name="whitespace", index_option="freq")
    builder.add_text_field("doc", tokenizer_name="raw", index_option="basic")
    builder.add_unsigned_field("page", stored=False, indexed=False, fast=True)
    return builder.build()


@contextmanager
def writer_lock(collection_dir: Path, timeout_s: float) -> Iterator[None]:
    """Hold the collection's writer file lock (raises `filelock.Timeout` after `timeout_s`)."""
    collection_dir.mkdir(parents=True, exist_ok=True)
    with FileLock(collection_dir / "writer.lock", timeout=timeout_s):
        yield


@contextmanager
def rebuild_lock(collection_dir: Path) -> Iterator[None]:
    """Hold the collection's rebuild file lock for a whole rebuild: at most one rebuild of a
    collection runs at a time across the threads and processes sharing the home dir (a
    `filelock` lock is an flock on its own descriptor, so threads of one process exclude each
    other too), and a rebuild removes old version folders only while it holds it. Waits
    without a timeout: a holder that dies releases it with its descriptor."""
    collection_dir.mkdir(parents=True, exist_ok=True)
    with FileLock(collection_dir / "rebuild.lock"):
        yield


def create_version(version: Path) -> None:
    """An empty version folder: Tantivy index, empty arrays, manifest at generation 0."""
    (version / "text").mkdir(parents=True, exist_ok=True)
    tantivy.Index(schema(), path=str(version / "text"), reuse=False)
    for name in ("vectors.f32", "pages.i64", "terms.u64"):
        (version / name).write_bytes(b"")
    write_manifest(version, Manifest())


def apply(version: Path, add: Sequence[IndexDocument] = (), remove: Sequence[str] = (), *,
          train: bool = True, ivf_min_rows: int = ivf.MIN_ROWS) -> Manifest:
    """Remove the documents `remove` and (re)add the documents `add` in one commit; return the
    new manifest. With `train`, the vectors' inverted file is (re)trained in the same commit
    when it is due (`ivf.due`): a rebuild trains once at its end, the ingest and delete hooks
    pass False and `retrain` in the background. The caller holds the writer lock (or owns the
    folder: a rebuild)."""
    manifest = read_manifest(version)
    committed_rows, committed_pages = manifest.rows, manifest.pages
    committed_terms = manifest.terms
    ordinal = {d: i for i, d in enumerate(manifest.documents) if d is not None}
    gone = [d for d in {*remove, *(doc.document_id for doc in add)} if d in ordinal]
    index = tantivy.Index.open(str(version / "text"))
    writer = index.writer(WRITER_HEAP_BYTES, 1)
    for document_id in gone:
        writer.delete_documents_by_term("doc", document_id)
        manifest.documents[ordinal[document_id]] = None
    vectors: list[np.ndarray] = []
    terms: list[np.ndarray] = []
    table: list[tuple[int, ...]] = []
    for doc in add:
        doc_ordinal = len(manifest.documents)
        manifest.documents.append(doc.document_id)
        manifest.page_counts.append(len(doc.pages))
        tokens = tokenize([with_context(p.context, p.text) for p in doc.pages])
        for page, page_tokens in zip(doc.pages, tokens, strict=True):
            rows = _rows(page.vectors, manifest)
            entries = page_entries(page_tokens)
            # columns as `files.py` names them: DOC, NUMBER, FIRST_ROW ... STEM_COUNT
            table.append((doc_ordinal, page.number, manifest.rows, len(rows), manifest.terms,
                          len(entries), len(page_tokens)))
            terms.append(entries)
            manifest.terms += len(entries)
            if len(rows):
                vectors.append(rows)
                manifest.rows += len(rows)
            writer.add_document(_tantivy_doc(doc.document_id, manifest.pages, page_tokens))
            manifest.pages += 1
    added = np.concatenate(vectors) if vectors else np.zeros((0, manifest.dim or 1), np.float32)
    append_raw(version / "vectors.f32", added.tobytes(), committed_rows * manifest.dim * 4)
    append_raw(version / "pages.i64", np.asarray(table, dtype=np.int64).tobytes(),
               committed_pages * PAGE_FIELDS * 8)
    append_raw(version / "terms.u64", b"".join(t.tobytes() for t in terms), committed_terms * 8)
    old_ivf = manifest.ivf
    if train and ivf.due(manifest.rows, manifest.ivf_rows, ivf_min_rows):
        _train_ivf(version, manifest)
    elif manifest.ivf:
        centroids, lists = ivf_paths(version, manifest.ivf)
        append_raw(lists, ivf.assign(added, _centroids(centroids, manifest)).tobytes(),
                   committed_rows * 4)
    writer.commit()
    writer.wait_merging_threads()
    manifest.generation += 1
    write_manifest(version, manifest)
    if old_ivf and old_ivf != manifest.ivf:  # retrained: the old lists are unreachable now
        for path in ivf_paths(version, old_ivf):
            path.unlink(missing_ok=True)
    return manifest


def _train_ivf(version: Path, manifest: Manifest) -> None:
    """Train new list centroids on every vector row (committed and just appended), assign
    every row, and write both under a new tag that the manifest's commit switches to."""
    tag = f"g{manifest.generation + 1}"
    centroids = _write_lists(version, manifest, tag)
    manifest.ivf, manifest.ivf_rows, manifest.ivf_lists = tag, manifest.rows, len(centroids)


def _write_lists(version: Path, manifest: Manifest, tag: str) -> np.ndarray:
    """Train centroids on the manifest's vector rows, write them and every row's list under
    `tag`; return the centroids."""
    rows = _vector_rows(version, manifest)
    centroids = ivf.train(rows, ivf.list_count(manifest.rows), seed=manifest.generation)
    centroids_path, lists_path = ivf_paths(version, tag)
    write_file(centroids_path, centroids.tobytes())
    write_file(lists_path, ivf.assign(rows, centroids).tobytes())
    return centroids


def retrain(version: Path, lock: Callable[[], AbstractContextManager[object]]) -> bool:
    """Retrain the inverted file of a live version without holding the writer lock for the
    long part: the centroids and the lists of the rows committed now are computed unlocked;
    then, under `lock`, the rows added meanwhile are assigned and the manifest switches to
    the new files. Returns False (and leaves nothing behind) when another writer retrained
    first."""
    start = read_manifest(version)
    tag = f"r{time.time_ns()}"
    centroids = _write_lists(version, start, tag)
    centroids_path, lists_path = ivf_paths(version, tag)
    with lock():
        manifest = read_manifest(version)
        if (manifest.ivf, manifest.ivf_rows) != (start.ivf, start.ivf_rows):
            centroids_path.unlink(missing_ok=True)
            lists_path.unlink(missing_ok=True)
            return False
        since = _vector_rows(version, manifest)[start.rows:]  # rows added while training
        append_raw(lists_path, ivf.assign(since, centroids).tobytes(), start.rows * 4)
        manifest.ivf, manifest.ivf_rows, manifest.ivf_lists = tag, start.rows, len(centroids)
        manifest.generation += 1
        write_manifest(version, manifest)
    for path in ivf_paths(version, start.ivf) if start.ivf else ():
        path.unlink(missing_ok=True)
    return True


def _vector_rows(version: Path, manifest: Manifest) -> np.ndarray:
    """The version's vector rows up to the manifest's count, memory-mapped `(rows, d)`."""
    return np.memmap(version / "vectors.f32", dtype=np.float32, mode="r",
                     shape=(manifest.rows, manifest.dim))


def _centroids(path: Path, manifest: Manifest) -> np.ndarray:
    return np.fromfile(path, dtype=np.float32).reshape(manifest.ivf_lists, manifest.dim)


def _rows(vectors: np.ndarray | None, manifest: Manifest) -> np.ndarray:
    if vectors is None or not np.size(vectors):
        return np.zeros((0, manifest.dim or 1), dtype=np.float32)
    rows = np.ascontiguousarray(np.atleast_2d(vectors), dtype=np.float32)
    if manifest.dim == 0:
        manifest.dim = rows.shape[1]
    if rows.shape[1] != manifest.dim:
        raise ValueError(f"passage vectors of width {rows.shape[1]}, index holds {manifest.dim}")
    return rows


def _tantivy_doc(document_id: str, page_ordinal: int, tokens: list[str]) -> tantivy.Document:
    doc = tantivy.Document()
    doc.add_text("body", " ".join(tokens))
    doc.add_text("doc", document_id)
    doc.add_unsigned("page", page_ordinal)
    return doc
