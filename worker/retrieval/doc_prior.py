"""Document prior: rank the documents of a scope for a question, then lift their pages.

A question about a long document often names the document's subject ("the survey of U.S.
adults from April 25 to May 1, 2018", "this 10-K", "the guidebook") in words spread over
many of its pages but absent from the one page that answers. Ranking whole documents
(BM25 over all of a document's text, and the cosine of the question with the mean of its
page vectors), fusing those two document rankings by RRF, and adding
`weight / (k + document rank)` to every page's fused score makes pages of the likely
document win ties against look-alike pages of other documents.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from worker.retrieval.bm25 import bm25_scores
from worker.retrieval.document_context import with_context
from worker.retrieval.fusion import Ranking, ranks_from_scores, reciprocal_rank_fusion


def document_ranks(
    query: str,
    documents: Sequence[str],
    texts: Sequence[str],
    contexts: Sequence[str],
    *,
    query_vector: np.ndarray | None = None,
    page_vectors: Sequence[np.ndarray | None] | None = None,
    rrf_k: float,
) -> np.ndarray:
    """Per page, the 1-based rank of its document among the scope's documents.

    `documents`, `texts` and `contexts` are parallel per page (document id, page text, the
    document's title words). Documents are ranked by BM25 over their whole text (context
    once, then every page) and, when `query_vector` and `page_vectors` are given, by cosine
    with the renormalised mean of their pages' passage vectors; the two rankings are fused
    by RRF with constant `rrf_k`. Ties keep first-appearance order.
    """
    names = list(dict.fromkeys(documents))
    index = {name: i for i, name in enumerate(names)}
    owner = np.fromiter((index[d] for d in documents), dtype=np.int64, count=len(documents))
    parts: list[list[str]] = [[] for _ in names]
    first_context = [""] * len(names)
    for document, text, context in zip(documents, texts, contexts, strict=True):
        if not parts[index[document]]:
            first_context[index[document]] = context
        parts[index[document]].append(text)
    whole = [with_context(first_context[i], "\n".join(parts[i])) for i in range(len(names))]
    rankings = [Ranking("bm25", ranks_from_scores(bm25_scores(query, whole),
                                                  positive_only=True))]
    if query_vector is not None and page_vectors is not None:
        sums = np.zeros((len(names), np.size(query_vector)), dtype=np.float32)
        for i, matrix in enumerate(page_vectors):
            if matrix is not None and np.size(matrix):
                mean = np.atleast_2d(matrix).mean(axis=0)
                sums[owner[i]] += mean / max(float(np.linalg.norm(mean)), 1e-12)
        norms = np.linalg.norm(sums, axis=1)
        scores = np.where(norms > 0, sums @ np.asarray(query_vector, dtype=np.float32)
                          / np.maximum(norms, 1e-12), -np.inf)
        order = [i for i in ranks_from_scores(scores, positive_only=False)
                 if np.isfinite(scores[i])]
        rankings.append(Ranking("dense", order))
    fused = reciprocal_rank_fusion(rankings, len(names), k=rrf_k)
    doc_rank = np.empty(len(names), dtype=np.int64)
    doc_rank[np.argsort(-fused, kind="stable")] = np.arange(1, len(names) + 1)
    return doc_rank[owner]
