"""Reciprocal rank fusion (Cormack et al., 2009) of several weighted rankings."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

# Cormack et al. use k = 60. A smaller k keeps a page that only BM25 ranks first (a fault
# code, a part number) above pages both rankings place in the middle (measured:
# docs/DECISIONS.md, "RRF constant k = 10, dense weight 0.6").
DEFAULT_RRF_K = 10.0


@dataclass(frozen=True)
class Ranking:
    """One retriever's ranking: `order` holds candidate indices best first (unranked omitted)."""

    name: str
    order: Sequence[int]
    weight: float = 1.0


def ranks_from_scores(scores: np.ndarray, *, positive_only: bool) -> list[int]:
    """Candidate indices by descending score (stable for ties); drop scores <= 0 if asked."""
    order = np.argsort(-scores, kind="stable")
    if positive_only:
        order = order[scores[order] > 0]
    return [int(i) for i in order]


def reciprocal_rank_fusion(
    rankings: Sequence[Ranking], n: int, *, k: float = DEFAULT_RRF_K
) -> np.ndarray:
    """Fused score per candidate: sum over rankings of `weight / (k + rank)`, rank 1-based.

    Candidates absent from every ranking score 0. Rankings with weight 0 contribute nothing.
    """
    if k < 0:
        raise ValueError("the RRF constant k must be >= 0")
    fused = np.zeros(n, dtype=np.float64)
    for ranking in rankings:
        if ranking.weight == 0:
            continue
        for rank, index in enumerate(ranking.order, start=1):
            fused[index] += ranking.weight / (k + rank)
    return fused
