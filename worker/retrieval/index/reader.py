"""Reading a collection's index: memory-mapped vectors and page table, a Tantivy searcher.

A reader checks the manifest's identity (inode and mtime: a commit renames a new file into
place) before each question and reopens only what changed, so a question after a commit pays
for reopening, never for a rebuild. Vectors are scored exactly (brute force over the mapped
float32 rows, best passage per page) until the collection is large enough for its inverted
file (`ivf.py`): then only the rows of the lists nearest the question are scored, exactly, as
are all rows of a scope that holds few. BM25 candidates come from Tantivy over the same
stemmed tokens the scan path uses, and are scored exactly as the scan path scores them
(`exact_bm25.py`).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tantivy

from worker.retrieval.bm25 import tokenize
from worker.retrieval.index import ivf
from worker.retrieval.index.exact_bm25 import exact_scores
from worker.retrieval.index.files import (
    DOC,
    ENTRY_COUNT,
    FIRST_ENTRY,
    FIRST_ROW,
    FORMAT,
    PAGE_FIELDS,
    ROW_COUNT,
    STEM_COUNT,
    Manifest,
    current_version,
    ivf_paths,
    read_manifest,
)
from worker.retrieval.index.writer import schema


@dataclass(frozen=True)
class Scored:
    """Page ordinals best first with their scores (one retriever's ranking)."""

    ordinals: np.ndarray
    scores: np.ndarray


class _Snapshot:
    """One committed state of a version folder, opened for reading."""

    def __init__(self, version: Path, manifest: Manifest, index: tantivy.Index | None) -> None:
        self.version = version
        self.manifest = manifest
        m = self.manifest
        self.index = index or tantivy.Index.open(str(version / "text"))
        self.index.reload()
        self.searcher = self.index.searcher()
        self.table = _mapped(version / "pages.i64", np.int64, (m.pages, PAGE_FIELDS))
        self.vectors = _mapped(version / "vectors.f32", np.float32, (m.rows, m.dim or 1))
        self.terms = _mapped(version / "terms.u64", np.uint64, (m.terms, 1))[:, 0]
        self.doc_ids = [d for d in m.documents]
        self.doc_ordinal = {d: i for i, d in enumerate(m.documents) if d is not None}
        alive_docs = np.array([d is not None for d in m.documents] or [False], dtype=bool)
        self.page_doc = self.table[:, DOC]
        self.alive = alive_docs[self.page_doc] if m.pages else np.zeros(0, dtype=bool)
        counts = self.row_counts = self.table[:, ROW_COUNT]
        self.first_row = self.table[:, FIRST_ROW]
        self.with_rows = np.flatnonzero(counts > 0)
        self.row_starts = self.first_row[self.with_rows]
        self.live_rows = int(counts[self.alive].sum()) if m.pages else 0
        self.lengths = self.table[:, STEM_COUNT]  # stems per page
        self.live_pages = int(self.alive.sum())
        self.live_length = int(self.lengths[self.alive].sum()) if m.pages else 0
        self.has_deleted = m.dead_pages() > 0
        self.centroids: np.ndarray | None = None
        if m.ivf:  # rows grouped by list: list l holds rows list_rows[list_starts[l]:...[l+1]]
            centroids, lists_path = ivf_paths(version, m.ivf)
            self.centroids = np.fromfile(centroids, dtype=np.float32).reshape(m.ivf_lists, m.dim)
            lists = np.fromfile(lists_path, dtype=np.int32, count=m.rows)  # (rows,)
            self.list_rows = np.argsort(lists, kind="stable")  # (rows,)
            self.list_starts = np.r_[0, np.cumsum(np.bincount(lists, minlength=m.ivf_lists))]
            self.row_page = np.repeat(self.with_rows, counts[self.with_rows])  # (rows,)


def _mapped(path: Path, dtype: type, shape: tuple[int, int]) -> np.ndarray:
    """The file's first `shape[0]` rows, memory-mapped read-only, as a plain ndarray view
    (`np.memmap`'s own indexing adds Python overhead to every call)."""
    if shape[0] == 0:
        return np.zeros(shape, dtype=dtype)
    return np.asarray(np.memmap(path, dtype=dtype, mode="r", shape=shape))


class IndexReader:
    """A reader of one collection's index folder (`collection_dir`); thread-safe."""

    def __init__(self, collection_dir: Path) -> None:
        self.collection_dir = collection_dir
        self._lock = threading.Lock()
        self._snap: _Snapshot | None = None
        self._stamp: tuple[str, int, int] | None = None

    def snapshot(self) -> _Snapshot | None:
        """The latest committed state (reopened if a writer committed since), or None when
        the collection has no index or one of an older format (the caller scans and rebuilds
        it)."""
        version = current_version(self.collection_dir)
        if version is None:
            return None
        st = os.stat(version / "manifest.json")
        stamp = (version.name, st.st_ino, st.st_mtime_ns)
        with self._lock:
            if stamp != self._stamp or self._snap is None:
                manifest = read_manifest(version)
                if manifest.format != FORMAT:
                    return None
                same = self._snap is not None and self._snap.version == version
                self._snap = _Snapshot(version, manifest, self._snap.index if same and self._snap
                                       else None)
                self._stamp = stamp
            return self._snap


def scope_mask(snap: _Snapshot, document_ids: Sequence[str] | None) -> np.ndarray:
    """Per page ordinal: alive and (when given) in one of `document_ids`."""
    if document_ids is None:
        return snap.alive
    wanted = [snap.doc_ordinal[d] for d in document_ids if d in snap.doc_ordinal]
    return snap.alive & np.isin(snap.page_doc, np.asarray(wanted, dtype=np.int64))


def bm25_top(snap: _Snapshot, query: str, scope: np.ndarray,
             document_ids: Sequence[str] | None, depth: int) -> Scored:
    """The `depth` best pages in scope by BM25 (pages without a query term are unranked):
    Tantivy's `depth` best, scored exactly as the scan path scores them (`exact_bm25.py`)."""
    terms = tokenize([query])[0]
    empty = Scored(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32))
    if not terms or snap.manifest.pages == 0:
        return empty
    distinct = list(dict.fromkeys(terms))
    q = tantivy.Query.boolean_query(
        [(tantivy.Occur.Should, tantivy.Query.term_query(schema(), "body", t)) for t in distinct])
    docs = None
    if document_ids is not None:
        docs = tantivy.Query.term_set_query(schema(), "doc", [str(d) for d in document_ids])
        q = tantivy.Query.boolean_query([(tantivy.Occur.Must, q), (tantivy.Occur.Must, docs)])
    hits = snap.searcher.search(q, depth, count=False).hits
    if not hits:
        return empty
    ordinals = np.asarray(snap.searcher.fast_field_values("page", [a for _, a in hits]),
                          dtype=np.int64)
    keep = ordinals < len(scope)
    keep[keep] = scope[ordinals[keep]]
    ordinals = ordinals[keep]
    if scope is snap.alive:
        n_pages, length = snap.live_pages, snap.live_length
    else:
        n_pages, length = int(scope.sum()), int(snap.lengths[scope].sum())
    exact_counts = docs is not None or snap.has_deleted
    df_of = dict(zip(distinct, document_frequencies(snap.searcher, distinct, docs, exact_counts),
                     strict=True))
    scores = exact_scores(terms, [df_of[t] for t in terms], n_pages, length / max(n_pages, 1),
                          snap.table[ordinals, FIRST_ENTRY], snap.table[ordinals, ENTRY_COUNT],
                          snap.lengths[ordinals], snap.terms)
    keep = scores > 0
    ordinals, scores = ordinals[keep], scores[keep]
    order = np.lexsort((ordinals, -scores))  # ties: index order, as the scan path
    return Scored(ordinals[order], scores[order])


def document_frequencies(searcher: tantivy.Searcher, stems: list[str],
                         scope_query: tantivy.Query | None, exact_counts: bool) -> list[int]:
    """Per stem, the pages holding it: Tantivy's document frequency, or with `exact_counts`
    the live pages within `scope_query` (when given) that hold it, counted by a search
    (Tantivy's frequencies include deleted pages until their segment merges)."""
    if not exact_counts:
        return [searcher.doc_freq("body", stem) for stem in stems]
    counts = []
    for stem in stems:
        q = tantivy.Query.term_query(schema(), "body", stem)
        if scope_query is not None:
            q = tantivy.Query.boolean_query([(tantivy.Occur.Must, q),
                                             (tantivy.Occur.Must, scope_query)])
        counts.append(searcher.search(q, 1, count=True).count)  # type: ignore[attr-defined]
    return counts


def dense_top(snap: _Snapshot, query_vector: np.ndarray, scope: np.ndarray,
              depth: int, scan_rows: int = ivf.SCAN_ROWS,
              also: np.ndarray | None = None) -> Scored:
    """The `depth` best pages in scope by cosine of their best passage: exact while the
    collection has no inverted file or the scope holds at most `scan_rows` rows, else over
    the rows of the lists nearest the query (about `scan_rows` of them) and of the pages
    `also` (ordinals: the hybrid passes BM25's ranking, so its pages get exact scores)."""
    n = snap.manifest.pages
    if n == 0 or snap.manifest.rows == 0:
        return Scored(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32))
    q = np.asarray(query_vector, dtype=np.float32).reshape(-1)  # (d,)
    if snap.centroids is None:
        rows = snap.vectors @ q  # (rows,)
        page = np.full(n, -np.inf, dtype=np.float32)
        page[snap.with_rows] = np.maximum.reduceat(rows, snap.row_starts)
        page[~scope] = -np.inf
        return _best_pages(page, np.flatnonzero(np.isfinite(page)), depth)
    scope_rows = snap.live_rows if scope is snap.alive else int(snap.row_counts[scope].sum())
    if scope_rows <= scan_rows:  # a small scope: all its rows
        picked = np.flatnonzero(scope[snap.row_page])
    else:
        lists = ivf.probe(snap.centroids, q, snap.manifest.rows, scan_rows)
        picked = np.concatenate([
            snap.list_rows[snap.list_starts[i]:snap.list_starts[i + 1]] for i in lists])
        if also is not None and len(also):
            picked = np.concatenate([picked, _page_rows(snap, also)])
        picked = sorted_unique(picked)
        picked = picked[scope[snap.row_page[picked]]]
    if not len(picked):
        return Scored(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32))
    scores = np.take(snap.vectors, picked, axis=0) @ q  # (picked,)
    pages = snap.row_page[picked]  # non-decreasing: picked is sorted, rows are in page order
    first = np.flatnonzero(np.r_[True, pages[1:] != pages[:-1]])  # each page's first row
    page = np.full(n, -np.inf, dtype=np.float32)
    page[pages[first]] = np.maximum.reduceat(scores, first)  # its best row
    return _best_pages(page, pages[first], depth)


def sorted_unique(values: np.ndarray) -> np.ndarray:
    """`np.unique(values)` by sorting: numpy 2's hashing `unique` is slower on the few
    thousand ordinals a question handles."""
    ordered = np.sort(values)
    return ordered[np.r_[True, ordered[1:] != ordered[:-1]]] if len(ordered) else ordered


def _page_rows(snap: _Snapshot, ordinals: np.ndarray) -> np.ndarray:
    """The vector rows of the pages `ordinals`."""
    counts = snap.row_counts[ordinals]
    starts = np.repeat(snap.first_row[ordinals] - np.cumsum(counts) + counts, counts)
    return starts + np.arange(int(counts.sum()))


def _best_pages(page: np.ndarray, candidates: np.ndarray, depth: int) -> Scored:
    """The `depth` best of `candidates` by `page` score (ties: index order)."""
    if len(candidates) > depth:
        part = np.argpartition(-page[candidates], depth - 1)[:depth]
        cut = page[candidates[part]].min()
        candidates = candidates[page[candidates] >= cut]  # keep ties at the cut
    order = np.lexsort((candidates, -page[candidates]))[:depth]
    chosen = candidates[order]
    return Scored(chosen, page[chosen])
