"""`lab.testbed.hop_reads`: the cells a split record needs, counted in each choice."""

from __future__ import annotations

from conduit_core.model.testbed_model import WEIGHTS
from lab.testbed.hop_reads import CHOICES, near_cells_held
from lab.testbed.probe import load_checkpoint_vlm


def test_each_choice_holds_part_of_the_near_cells() -> None:
    held = near_cells_held(load_checkpoint_vlm(WEIGHTS), n=2, seed=7373)
    assert held["questions"] == 2
    assert held["near"] >= 2 * 3  # glyphs in the three rows above each source
    for name in CHOICES:
        assert 0 <= held[name] <= held["near"]
    assert held["default_first"] <= held["second_hop_10"]  # the first part is kept whole
