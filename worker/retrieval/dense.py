"""Dense scoring: cosine between a query vector and each candidate's best passage."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def max_passage_scores(query: np.ndarray, pages: Sequence[np.ndarray | None]) -> np.ndarray:
    """Per page, the highest dot product of `query` (unit, `(d,)`) with its passage rows.

    A page is an `(n, d)` or `(d,)` array of unit vectors; pages without one score -inf.
    """
    scores = np.full(len(pages), -np.inf, dtype=np.float32)
    present = [i for i, page in enumerate(pages) if page is not None and np.size(page)]
    if not present:
        return scores
    blocks = [np.atleast_2d(np.asarray(pages[i], dtype=np.float32)) for i in present]
    lengths = np.array([len(block) for block in blocks])
    products = np.concatenate(blocks) @ np.asarray(query, dtype=np.float32).reshape(-1)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    scores[present] = np.maximum.reduceat(products, starts)
    return scores
