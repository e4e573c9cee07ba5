"""The split-record oracle (`lab.testbed.oracle`): the source cell it adds is the value ending
the page before the key's page, and each arm answers the same questions."""

from __future__ import annotations

import torch

from conduit_core.policies import POLICIES
from conduit_core.testbed_model import WEIGHTS
from lab.testbed.oracle import ARMS, _key_page_rows, _source_rows, _with_rows, split_oracle
from lab.testbed.probe import load_checkpoint_vlm, probe_samples


def test_the_source_cell_is_the_value_ending_the_page_before() -> None:
    split = next(s for s in probe_samples(200, 3, "distractors")
                 if s.question.family == "split")
    key_page = split.question.records[0].page
    assert key_page - 1 in split.pages  # the source page is evidence, always shown
    cells = split.doc.shape.cells
    starts = [100 + i * (cells + 2) for i in range(len(split.pages))]  # start token, cells, end
    found = _source_rows(split, starts)
    assert found is not None
    source, page_rows = found
    first = starts[split.pages.index(key_page - 1)] + 1
    assert page_rows == range(first, first + cells)
    assert source - first == (split.doc.shape.rows - 1) * split.doc.shape.cols
    row, col = divmod(source - first, split.doc.shape.cols)
    assert split.doc.pages[key_page - 1][row][col] == split.question.answer  # the value
    key_row = _key_page_rows(split, starts, 0)
    key_first = starts[split.pages.index(key_page)] + 1
    assert key_row[0] == key_first + split.question.records[0].cell  # the key cell, row 0
    assert len(key_row) == split.doc.shape.cols


def test_the_arms_on_a_few_questions() -> None:
    extra: list[int] = []
    select = _with_rows(lambda ctx: torch.tensor([5, 3]), extra)
    extra[:] = [9, 3]
    assert select(None).tolist() == [3, 5, 9]  # type: ignore[arg-type]
    before = set(POLICIES)
    out = split_oracle(load_checkpoint_vlm(WEIGHTS), n=3, seed=3)
    assert set(POLICIES) == before  # the oracle's policy is gone again
    assert out["questions"] == 3
    assert set(ARMS) <= set(out) and all(0 <= out[a] <= 1 for a in ARMS)
    assert 0 <= out["source_refreshed"] <= 1
