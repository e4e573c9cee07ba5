"""Hybrid search over a collection's persistent index: the scan path's ranking, from the index.

BM25 and dense rankings come from the index, each cut at `depth` pages (an RRF term at rank
r > depth is at most weight / (k + depth): it cannot lift a page into the top k unless two
fused scores tie to that precision), restricted in the index to the live pages of the
requested documents, and fused with the same weighted RRF, the same tie rules (better single
rank, then index order) and the same fill-up with unranked pages as `hybrid.search`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from worker.retrieval.embedder import Embedder
from worker.retrieval.fusion import DEFAULT_RRF_K, Ranking, reciprocal_rank_fusion
from worker.retrieval.hybrid import Hit
from worker.retrieval.index.reader import IndexReader, bm25_top, dense_top, scope_mask

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
) -> list[Hit] | None:
    """The `top_k` best pages of the scope, best first, as `hybrid.search` ranks them; None
    when the collection has no index (the caller falls back to the scan path)."""
    if top_k < 1:
        raise ValueError("top_k must be >= 1")
    snap = reader.snapshot()
    if snap is None:
        return None
    scope = scope_mask(snap, document_ids)
    depth = max(depth, top_k)
    rankings: list[Ranking] = []
    if bm25_weight:
        rankings.append(Ranking("bm25", bm25_top(snap, query, scope, document_ids, depth)
                                .ordinals.tolist(), bm25_weight))
    if dense_weight and embedder is not None:
        found = dense_top(snap, embedder.embed_query(query), scope, depth)
        rankings.append(Ranking("dense", found.ordinals.tolist(), dense_weight))
    ranked = sorted({o for r in rankings for o in r.order})
    local = {o: i for i, o in enumerate(ranked)}
    fused = reciprocal_rank_fusion(
        [Ranking(r.name, [local[o] for o in r.order], r.weight) for r in rankings],
        len(ranked), k=rrf_k)
    rank_of = {r.name: {o: rank for rank, o in enumerate(r.order, start=1)} for r in rankings}
    outside = len(scope) + 1
    best = [min((ranks[o] for ranks in rank_of.values() if o in ranks), default=outside)
            for o in ranked]
    order = sorted(range(len(ranked)),
                   key=lambda i: (-fused[i], best[i], ranked[i]))[:top_k]
    chosen = [(ranked[i], float(fused[i])) for i in order]
    if len(chosen) < top_k:  # fewer ranked pages than asked: the rest in index order
        taken = {o for o, _ in chosen}
        for o in np.flatnonzero(scope):
            if len(chosen) >= top_k:
                break
            if int(o) not in taken:
                chosen.append((int(o), 0.0))
    return [
        Hit(key=page_key(str(snap.doc_ids[int(snap.table[o, 0])]), int(snap.table[o, 1])),
            score=score,
            bm25_rank=rank_of.get("bm25", {}).get(o),
            dense_rank=rank_of.get("dense", {}).get(o))
        for o, score in chosen
    ]
