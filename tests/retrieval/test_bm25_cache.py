"""The BM25 index of a candidate set is built once and reused; another set gets its own."""

from __future__ import annotations

import numpy as np

from worker.retrieval import bm25


def test_index_is_cached_per_candidate_set() -> None:
    texts = ["the pressure valve is inspected weekly", "revenue grew in the north",
             "glossary of hydraulic terms"]
    first = bm25.bm25_scores("pressure valve", texts)
    index_a = bm25._index(texts, 1.5, 0.75)
    again = bm25.bm25_scores("pressure valve", texts)
    assert np.array_equal(first, again) and first.argmax() == 0
    assert bm25._index(texts, 1.5, 0.75)[0] is index_a[0]  # reused, not rebuilt
    changed = [*texts[:2], "valve pressure valve pressure"]
    scores = bm25.bm25_scores("pressure valve", changed)
    assert scores.argmax() == 2  # a different set is indexed afresh, not served stale
    assert bm25._index(changed, 1.5, 0.75)[0] is not index_a[0]
