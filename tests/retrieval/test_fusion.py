"""Reciprocal rank fusion and the ordering rules of `search` (no model needed)."""

from __future__ import annotations

import numpy as np
import pytest

from worker.retrieval import Candidate, Ranking, reciprocal_rank_fusion, search
from worker.retrieval.fusion import DEFAULT_RRF_K, ranks_from_scores
from worker.settings import WorkerSettings


def test_rrf_sums_weighted_reciprocal_ranks() -> None:
    fused = reciprocal_rank_fusion(
        [Ranking("a", [2, 0], 1.0), Ranking("b", [0, 1, 2], 0.5)], 4, k=10)
    assert fused[0] == pytest.approx(1 / 12 + 0.5 / 11)
    assert fused[1] == pytest.approx(0.5 / 12)
    assert fused[2] == pytest.approx(1 / 11 + 0.5 / 13)
    assert fused[3] == 0.0


def test_rrf_weight_zero_ignores_a_ranking() -> None:
    fused = reciprocal_rank_fusion([Ranking("a", [1, 0]), Ranking("b", [0, 1], 0.0)], 2)
    assert fused[1] > fused[0]


def test_rrf_agreement_beats_a_single_first_place() -> None:
    # candidate 1 is second in both lists; 0 and 2 are each first in one and absent in the other
    fused = reciprocal_rank_fusion([Ranking("a", [0, 1]), Ranking("b", [2, 1])], 3)
    assert fused.argmax() == 1


def test_rrf_rejects_negative_k() -> None:
    with pytest.raises(ValueError):
        reciprocal_rank_fusion([], 1, k=-1)


def test_ranks_from_scores() -> None:
    scores = np.array([0.0, 2.0, 1.0, 2.0], dtype=np.float32)
    assert ranks_from_scores(scores, positive_only=False) == [1, 3, 2, 0]
    assert ranks_from_scores(scores, positive_only=True) == [1, 3, 2]


PAGES = [
    Candidate("a", "Minutes of the rowing club annual meeting."),
    Candidate("b", "The rowing club bought a new eight-person boat for the regatta."),
    Candidate("c", ""),
    Candidate("d", "Tax forms for the bakery."),
]


def test_bm25_only_search_ranks_matching_pages_then_fills_in_input_order() -> None:
    hits = search("new boat for the regatta", PAGES, top_k=4, dense_weight=0.0)
    assert [h.key for h in hits] == ["b", "a", "c", "d"]
    assert hits[0].bm25_rank == 1 and hits[0].dense_rank is None
    assert hits[1].bm25_rank is None and hits[1].score == 0.0  # no shared term: unranked
    assert len(search("boat", PAGES, top_k=2, dense_weight=0.0)) == 2


def test_search_edge_cases() -> None:
    assert search("anything", [], top_k=3) == []
    with pytest.raises(ValueError):
        search("anything", PAGES, top_k=0)
    # a query of stop words only ranks nothing but still returns pages
    hits = search("the of and", PAGES, top_k=2, dense_weight=0.0)
    assert [h.key for h in hits] == ["a", "b"] and all(h.score == 0 for h in hits)


def test_the_deployment_default_rrf_constant_is_the_library_default() -> None:
    assert WorkerSettings.model_fields["rrf_k"].default == DEFAULT_RRF_K
