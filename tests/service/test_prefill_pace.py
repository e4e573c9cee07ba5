"""The engine's prefill pace (`worker.prefill_pace`): a step's prefill budget is a share of the
running batch's recent decode steps, grown by the backlog, and a phase starts only where its
expected time still fits."""

from __future__ import annotations

import pytest

from worker.prefill_pace import RECENT_STEPS, PrefillPace


def test_the_budget_is_a_share_of_the_median_recent_decode_step() -> None:
    pace = PrefillPace(0.5)
    assert pace.budget(decoding=False) == float("inf")  # nothing streams: the prefill runs whole
    assert pace.budget(decoding=True) == 0.0  # no decode step timed yet: one phase
    for seconds in (0.020, 0.022, 0.5, 0.021):  # one slow step among them
        pace.decoded(seconds)
    assert pace.budget(decoding=True) == pytest.approx(0.5 * 0.0215)  # the median, not 0.5
    for _ in range(RECENT_STEPS):
        pace.decoded(0.040)  # the batch grew: only the recent steps count
    assert pace.budget(decoding=True) == pytest.approx(0.020)


def test_a_backlog_beyond_the_free_slots_grows_the_budget() -> None:
    pace = PrefillPace(0.5)
    pace.decoded(0.020)
    assert pace.budget(decoding=True, backlog=0) == pytest.approx(0.010)
    assert pace.budget(decoding=True, backlog=3) == pytest.approx(0.040)


def test_a_fixed_budget_replaces_the_rule() -> None:
    pace = PrefillPace(0.5, fixed_s=0.0)
    pace.decoded(0.020)
    assert pace.budget(decoding=True, backlog=5) == 0.0
    assert pace.budget(decoding=False) == 0.0


def test_a_phase_starts_only_where_its_expected_time_fits() -> None:
    pace = PrefillPace(0.5)
    assert pace.fits("scoring", spent=0.004, budget=0.010)  # nothing learned yet
    pace.ran(None, 0.002)  # a prefill's first phase
    pace.ran("assembled", 0.004)  # the phase after "assembled" took 4 ms
    pace.ran("chosen", 0.012)  # a refresh group, after the choice
    assert pace.fits(None, spent=0.0, budget=0.003)
    assert pace.fits("assembled", spent=0.005, budget=0.010)
    assert not pace.fits("chosen", spent=0.001, budget=0.010)  # 1 + 12 ms > 10
    pace.ran("chosen", 0.002)  # a moving average: one short run lowers it, not to 2 ms
    assert not pace.fits("chosen", spent=0.0, budget=0.008)
    assert pace.fits("chosen", spent=0.0, budget=0.0095)  # 12 + 0.3 * (2 - 12) = 9 ms


def test_a_negative_share_is_refused() -> None:
    with pytest.raises(ValueError, match="share"):
        PrefillPace(-0.1)
