"""The cost model's placement prior: where a policy's earlier choices fell."""

from __future__ import annotations

import pytest
import torch

from conduit_core.cost.choice_history import ChoiceHistory, even_rows, quantile_rows

VISUAL = torch.cat([torch.arange(10, 110), torch.arange(120, 220), torch.arange(230, 330)])


def test_no_history_places_evenly() -> None:
    history = ChoiceHistory()
    assert torch.equal(history.rows("p", VISUAL, 30), even_rows(VISUAL, 30))


@pytest.mark.parametrize("k", [1, 7, 30, 150, 299])
def test_quantile_rows_are_k_distinct_visual_rows(k: int) -> None:
    spike = torch.zeros(64)
    spike[3] = 1.0  # every earlier choice in one narrow band
    rows = quantile_rows(VISUAL, k, spike)
    assert rows.numel() == k and torch.equal(rows, rows.unique(sorted=True))
    assert bool(torch.isin(rows, VISUAL).all())


def test_placement_follows_the_recorded_choices() -> None:
    history = ChoiceHistory()
    first_page = VISUAL[:100]
    history.record(("conduit", 0.1), VISUAL, first_page[::4])  # all on the first page
    rows = history.rows(("conduit", 0.1), VISUAL, 25)
    assert rows.numel() == 25 and int(rows.max()) < int(VISUAL[105])
    assert torch.equal(history.rows(("conduit", 0.2), VISUAL, 25), even_rows(VISUAL, 25))


def test_history_is_a_moving_average_and_bounded() -> None:
    history = ChoiceHistory(capacity=2, weight=0.5)
    history.record("a", VISUAL, VISUAL[:50])  # first page
    history.record("a", VISUAL, VISUAL[-50:])  # last page: half the mass now
    rows = history.rows("a", VISUAL, 20)
    assert int((rows < VISUAL[100]).sum()) == 10 and int((rows >= VISUAL[200]).sum()) == 10
    history.record("b", VISUAL, VISUAL[:10])
    history.record("c", VISUAL, VISUAL[:10])  # "a" was least recently used: dropped
    assert torch.equal(history.rows("a", VISUAL, 20), even_rows(VISUAL, 20))
    with pytest.raises(ValueError):
        ChoiceHistory(weight=0.0)


def test_a_policy_under_a_cap_is_predicted_at_its_share_of_it() -> None:
    """A budget per question refreshes part of its cap: the prediction places that share
    (a moving average over answers); a choice that is its cap stays at k."""
    history = ChoiceHistory(weight=0.5)
    history.record("mass", VISUAL, VISUAL[::10], cap=60)  # 30 of a cap of 60
    assert history.rows("mass", VISUAL, 60).numel() == 30
    assert history.rows("mass", VISUAL, 20).numel() == 10  # the share, at another cap
    history.record("mass", VISUAL, VISUAL[::5], cap=60)  # the whole cap this time
    assert history.rows("mass", VISUAL, 60).numel() == 45  # (0.5 + 1) / 2 of it
    history.record("fixed", VISUAL, VISUAL[::10])
    assert history.rows("fixed", VISUAL, 30).numel() == 30
    assert history.rows("mass", VISUAL, 1).numel() == 1  # never below one row
