"""Probe rows as tables (`lab.testbed.compare`) and the candidate policies (`variants`)."""

from pathlib import Path

import pytest

from conduit_core.policies import POLICIES
from lab.testbed.compare import across, frontier, overall, table
from lab.testbed.variants import CANDIDATES, register

ROWS = [
    {"family": "split", "policy": "conduit", "budget": 0.1, "n": 3, "accuracy": 1.0,
     "flops_ratio_lm": 0.2},
    {"family": "lookup", "policy": "conduit", "budget": 0.1, "n": 1, "accuracy": 0.0,
     "flops_ratio_lm": 0.4},
    {"family": "split", "policy": "full_prefill", "budget": 1.0, "n": 3, "accuracy": 1.0,
     "flops_ratio_lm": 1.0},
    {"family": "lookup", "policy": "full_prefill", "budget": 1.0, "n": 1, "accuracy": 1.0,
     "flops_ratio_lm": 1.0},
    {"family": "split", "policy": "cv_mass_50", "budget": 0.2, "n": 4, "accuracy": 0.5,
     "flops_ratio_lm": 0.1},
]


def test_overall_weights_families_by_their_question_counts() -> None:
    o = overall(ROWS)
    assert o[("conduit", 0.1)]["all"] == pytest.approx(0.75)  # 3 of 4 questions
    assert o[("conduit", 0.1)]["flops_ratio_lm"] == pytest.approx(0.25)
    assert o[("conduit", 0.1)]["lookup"] == 0.0 and o[("full_prefill", 1.0)]["all"] == 1.0
    md = table(ROWS)
    assert "| conduit | 0.1 | 0.000 | 1.000 | **0.750** | 0.250 |" in md


def test_across_runs_gives_mean_and_spread(tmp_path: Path) -> None:
    other = [{**r, "accuracy": 0.0} if r["policy"] == "conduit" else r for r in ROWS]
    md = across({"a": ROWS, "b": other})
    assert "| conduit | 0.1 | **0.375** | 0.000-0.750 | 0.750 | 0.000 |" in md
    frontier(ROWS, tmp_path / "f.png")
    assert (tmp_path / "f.png").stat().st_size > 0


def test_candidates_register_under_their_names() -> None:
    names = register()
    assert names == list(CANDIDATES) and all(POLICIES[n] is CANDIDATES[n] for n in names)
    for n in names:
        del POLICIES[n]  # leave the registry as the product ships it
