"""Hybrid search over a collection's persistent index: the scan path's ranking, from the index.

BM25 and dense rankings come from the index with the scan path's scores (BM25 re-scored
exactly as bm25s scores it, `exact_bm25.py`; dense exact below the inverted file's size),
each cut at `depth` pages (an RRF term at rank r > depth is at most weight / (k + depth): it
cannot lift a page into the top k unless two fused scores tie to that precision), restricted
in the index to the live pages of the requested documents, and fused with the same weighted
RRF, the same tie rules (better single rank, then index order) and the same fill-up with
unranked pages as `hybrid.search`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from worker.retrieval.embedder import Embedder
from worker.retrieval.fusion import DEFAULT_RRF_K
from worker.retrieval.hybrid import Hit
from worker.retrieval.index import ivf
from worker.retrieval.index.files import NUMBER
from worker.retrieval.index.reader import (
    IndexReader,
    bm25_top,
    dense_top,
    scope_mask,
    sorted_unique,
)

DEFAULT_DEPTH = 1000


def page_key(document_id: str, number: int) -> str:
    """The key `retrieve` uses for a page: "<document id>:<number>"."""
    return f"{document_id}:{number}"


def search_index(
    reader: IndexReader,
    query: str,
    *,
    top_k: int,
    document_ids: Sequence[str] | None = None,
    bm25_weight: float = 1.0,
    dense_weight: float = 1.0,
    embedder: Embedder | None = None,
    rrf_k: float = DEFAULT_RRF_K,
    depth: int = DEFAULT_DEPTH,
    scan_rows: int = ivf.SCAN_ROWS,
) -> list[Hit] | None:
    """The `top_k` best pages of the scope, best first, as `hybrid.search` ranks them; None
    when the collection has no index (the caller falls back to the scan path). Dense scores
    are exact unless the collection is large (`ivf.py`: then about `scan_rows` passage
    vectors nearest the question are scored)."""
    if top_k < 1:
        raise ValueError("top_k must be >= 1")
    snap = reader.snapshot()
    if snap is None:
        return None
    scope = scope_mask(snap, document_ids)
    depth = max(depth, top_k)
    rankings: list[tuple[str, np.ndarray, float]] = []
    lexical = None
    # the question's embedding is computed in a thread while BM25 ranks
    vector = embedder.submit_query(query) if dense_weight and embedder is not None else None
    if bm25_weight:
        lexical = bm25_top(snap, query, scope, document_ids, depth).ordinals
        rankings.append(("bm25", lexical, bm25_weight))
    if vector is not None:
        found = dense_top(snap, vector.result(), scope, depth, scan_rows, also=lexical)
        rankings.append(("dense", found.ordinals, dense_weight))
    # weighted RRF over the union of the rankings, vectorised (`fusion.reciprocal_rank_fusion`
    # adds the same terms in the same order, so the scores are bit-identical)
    ranked = sorted_unique(np.concatenate([o for _, o, _ in rankings] or
                                          [np.zeros(0, dtype=np.int64)]))
    fused = np.zeros(len(ranked), dtype=np.float64)
    best = np.full(len(ranked), len(scope) + 1, dtype=np.int64)
    ranks: dict[str, np.ndarray] = {}
    for name, order, weight in rankings:
        where = np.searchsorted(ranked, order)
        rank = np.arange(1, len(order) + 1)
        full = np.zeros(len(ranked), dtype=np.int64)
        full[where] = rank
        ranks[name] = full
        fused[where] += weight / (rrf_k + rank)
        best[where] = np.minimum(best[where], rank)
    top = np.lexsort((ranked, best, -fused))[:top_k]
    chosen = [(int(ranked[i]), float(fused[i])) for i in top]
    rank_of = {name: {int(ranked[i]): int(full[i]) for i in top if full[i]}
               for name, full in ranks.items()}
    if len(chosen) < top_k:  # fewer ranked pages than asked: the rest in index order
        taken = {o for o, _ in chosen}
        for o in np.flatnonzero(scope):
            if len(chosen) >= top_k:
                break
            if int(o) not in taken:
                chosen.append((int(o), 0.0))
    return [
        Hit(key=page_key(str(snap.doc_ids[int(snap.page_doc[o])]), int(snap.table[o, NUMBER])),
            score=score,
            bm25_rank=rank_of.get("bm25", {}).get(o),
            dense_rank=rank_of.get("dense", {}).get(o))
        for o, score in chosen
    ]
