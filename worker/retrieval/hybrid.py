"""Hybrid page retrieval: BM25 and dense rankings fused by RRF.

Stateless over candidates: the caller picks the candidate pages (the scope: a whole
collection, or the pages of a list of document ids) and passes their stored text and
embeddings; nothing here reads a store, so embedded and distributed mode share the code.
Each candidate's document context (its document's title words) is indexed with its text.
An optional term joins the fused score: pages the question points at by number, position or
caption (`query_refs`). Every ranking reads the question without its answer-format
instructions (`query_clean`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from worker.retrieval.bm25 import bm25_scores
from worker.retrieval.dense import max_passage_scores
from worker.retrieval.document_context import with_context
from worker.retrieval.embedder import Embedder
from worker.retrieval.fusion import (
    DEFAULT_RRF_K,
    Ranking,
    ranks_from_scores,
    reciprocal_rank_fusion,
)
from worker.retrieval.passages import embed_pages
from worker.retrieval.query_clean import retrieval_query
from worker.retrieval.query_refs import parse_refs, referenced_pages


@dataclass(frozen=True)
class Candidate:
    """A page that may be retrieved.

    `key` is the caller's id for the page (e.g. "doc_ab12:3"). `embedding` is the page's
    `(n, 384)` passage matrix from ingestion (`embedding_from_bytes`); when None and the page
    has text, it is computed on the fly. `context` is the title words of the page's document
    (`document_context`), indexed with the page by BM25. `document` (its document's id) and
    `page` (1-based physical number, 0 unknown) let a question's page references find it;
    with `document` empty, `key` up to its last ":" names the document.
    """

    key: str
    text: str
    embedding: np.ndarray | None = None
    context: str = ""
    document: str = ""
    page: int = 0

    def document_id(self) -> str:
        """The candidate's document: `document`, else `key` before its last ":"."""
        return self.document or self.key.rpartition(":")[0]


@dataclass(frozen=True)
class Hit:
    """A retrieved page: fused RRF score and its 1-based rank in each retriever (None: unranked)."""

    key: str
    score: float
    bm25_rank: int | None
    dense_rank: int | None


def search(
    query: str,
    candidates: Sequence[Candidate],
    *,
    top_k: int,
    bm25_weight: float = 1.0,
    dense_weight: float = 1.0,
    embedder: Embedder | None = None,
    rrf_k: float = DEFAULT_RRF_K,
    ref_weight: float = 0.0,
    clean_query: bool = True,
) -> list[Hit]:
    """The `top_k` best candidates for `query`, best first.

    Rankings: BM25 over page context and text (pages without a query term are unranked),
    dense cosine of the query with each page's best passage (needs `embedder`; skipped when
    None or `dense_weight` is 0). Fused by weighted reciprocal rank fusion with constant
    `rrf_k`. With `ref_weight`, a page the question names ("page 5", "the last page",
    "Figure 2": `query_refs`) gains `ref_weight * strength / (rrf_k + 1)`. With
    `clean_query`, every ranking reads `query_clean.retrieval_query(query)` (the question
    without "Please write the answer in ... format" and the like). Ties go to the better
    single rank, then to input order. When fewer than `top_k` candidates are ranked at all
    (and no page is named), the rest follow in input order with score 0, so the result
    always has `min(top_k, len(candidates))` entries.
    """
    if top_k < 1:
        raise ValueError("top_k must be >= 1")
    n = len(candidates)
    if n == 0:
        return []
    if clean_query:
        query = retrieval_query(query)
    rankings: list[Ranking] = []
    if bm25_weight:
        scores = bm25_scores(query, [with_context(c.context, c.text) for c in candidates])
        rankings.append(Ranking("bm25", ranks_from_scores(scores, positive_only=True),
                                bm25_weight))
    if dense_weight and embedder is not None:
        pages = _page_vectors(candidates, embedder)
        query_vector = embedder.embed_query(query)
        rankings.append(Ranking("dense", _dense_order(query_vector, pages), dense_weight))
    fused = reciprocal_rank_fusion(rankings, n, k=rrf_k)
    if ref_weight:
        documents = [c.document_id() for c in candidates]
        named = referenced_pages(parse_refs(query), documents, [c.page for c in candidates],
                                 [c.text for c in candidates])
        for i, strength in named.items():
            fused[i] += ref_weight * strength / (rrf_k + 1)
    rank_of = {r.name: {index: rank for rank, index in enumerate(r.order, start=1)}
               for r in rankings}
    best_single = [min((ranks[i] for ranks in rank_of.values() if i in ranks), default=n + 1)
                   for i in range(n)]
    order = sorted(range(n), key=lambda i: (-fused[i], best_single[i], i))[:top_k]
    return [
        Hit(
            key=candidates[i].key,
            score=float(fused[i]),
            bm25_rank=rank_of.get("bm25", {}).get(i),
            dense_rank=rank_of.get("dense", {}).get(i),
        )
        for i in order
    ]


def _page_vectors(candidates: Sequence[Candidate], embedder: Embedder
                  ) -> list[np.ndarray | None]:
    """Every candidate's passage matrix, embedding on the fly those that came without one."""
    pages: list[np.ndarray | None] = [c.embedding for c in candidates]
    missing = [i for i, c in enumerate(candidates) if c.embedding is None and c.text.strip()]
    if missing:
        texts = [candidates[i].text for i in missing]
        contexts = [candidates[i].context for i in missing]
        for i, matrix in zip(missing, embed_pages(texts, embedder, contexts=contexts),
                             strict=True):
            pages[i] = matrix
    return pages


def _dense_order(query_vector: np.ndarray, pages: Sequence[np.ndarray | None]) -> list[int]:
    scores = max_passage_scores(query_vector, pages)
    order = ranks_from_scores(scores, positive_only=False)
    return [i for i in order if np.isfinite(scores[i])]

