"""Pure tensor helpers behind the policies: scores, amplification, quotas."""

from __future__ import annotations

import pytest
import torch

from conduit_core.passes.scoring import ScoreConfig
from conduit_core.policies.selection import (
    budget_tokens,
    first_per_page,
    page_amplification,
    per_page_topk,
    quota_split,
    topk_positions,
)
from tests.core.helpers import token_scores


def test_token_scores_by_hand() -> None:
    # L=2, H=2 query heads on G=1 KV head, Q=2 question rows, N=3 keys
    probs = torch.tensor([[[[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]],
                           [[1.0, 0.0, 0.0], [0.0, 0.0, 1.0]]],
                          [[[0.0, 1.0, 0.0], [0.0, 1.0, 0.0]],
                           [[0.0, 0.5, 0.5], [0.5, 0.5, 0.0]]]])  # (2, 2, 2, 3)
    norms = torch.tensor([[[1.0, 2.0, 4.0]], [[2.0, 1.0, 1.0]]])  # (2, 1, 3)
    s = token_scores(probs, norms, ScoreConfig())
    # layer 0: head-mean of A = [[.75,.25,0],[.1,.15,.75]] -> q-mean [.425,.2,.375] * [1,2,4]
    # layer 1: head-mean [[0,.75,.25],[.25,.75,0]] -> q-mean [.125,.75,.125] * [2,1,1]
    expected = (torch.tensor([0.425, 0.4, 1.5]) + torch.tensor([0.25, 0.75, 0.125])) / 2
    assert torch.allclose(s, expected)
    raw = token_scores(probs, norms, ScoreConfig(), value_norm=False)
    raw_expected = (torch.tensor([.425, .2, .375]) + torch.tensor([.125, .75, .125])) / 2
    assert torch.allclose(raw, raw_expected)
    only_norm = token_scores(probs, norms, ScoreConfig(), attention=False)
    assert torch.allclose(only_norm, torch.tensor([1.5, 1.5, 2.5]))
    last = token_scores(probs, norms, ScoreConfig(layers=(1, 2), query_window=1, head_agg="max"))
    # layer 1, last row: heads [0, 1, 0] and [.5, .5, 0] -> max [.5, 1, 0] * norms [2, 1, 1]
    assert torch.allclose(last, torch.tensor([1.0, 1.0, 0.0]))


def test_score_config_bounds() -> None:
    with pytest.raises(ValueError):
        ScoreConfig(query_window=0)
    with pytest.raises(ValueError):
        ScoreConfig(head_agg="median")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        ScoreConfig(layers=(3, 5)).layer_slice(2)
    assert ScoreConfig(layers=(-1, 2)).layer_slice(2) == slice(-1, 2)


def test_budget_tokens() -> None:
    assert budget_tokens(0.1, 72) == 7
    assert budget_tokens(1.0, 72) == 72
    assert budget_tokens(0.0, 72) == 0
    with pytest.raises(ValueError):
        budget_tokens(1.5, 10)


def test_topk_is_stable_and_sorted() -> None:
    scores = torch.tensor([0.1, 0.5, 0.5, 0.9, 0.5])
    assert topk_positions(scores, 3).tolist() == [1, 2, 3]
    assert topk_positions(scores, 0).numel() == 0


def test_amplification_one_page_is_one() -> None:
    scores = torch.rand(10)
    assert torch.equal(page_amplification(scores, torch.zeros(10, dtype=torch.long), 1, 1.0),
                       torch.ones(1))


def test_amplification_by_hand() -> None:
    scores = torch.tensor([1.0, 1.0, 2.0, 4.0])
    page_of = torch.tensor([0, 0, 1, 1])  # R = [2, 6], mean 4
    assert torch.allclose(page_amplification(scores, page_of, 2, 1.0), torch.tensor([0.5, 1.5]))
    assert torch.allclose(page_amplification(scores, page_of, 2, 2.0), torch.tensor([.25, 2.25]))
    assert torch.equal(page_amplification(scores, page_of, 2, 0.0), torch.ones(2))


def test_quota_split() -> None:
    sizes = torch.tensor([16, 15, 8])
    for k in range(0, 40):
        q = quota_split(sizes, k)
        assert int(q.sum()) == min(k, 39) and bool((q <= sizes).all())
    assert quota_split(sizes, 7, weights=torch.ones(3)).tolist() == [3, 2, 2]
    assert quota_split(torch.tensor([1, 10]), 6, weights=torch.ones(2)).tolist() == [1, 5]


def test_per_page_and_first_tokens() -> None:
    page_of = torch.tensor([0, 0, 0, 1, 1, 2])
    scores = torch.tensor([0.1, 0.9, 0.5, 0.2, 0.8, 0.3])
    assert per_page_topk(scores, page_of, torch.tensor([2, 1, 0])).tolist() == [1, 2, 4]
    assert first_per_page(page_of, torch.tensor([2, 1, 1])).tolist() == [0, 1, 3, 5]
