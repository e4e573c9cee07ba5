"""The split-record oracle (`lab.testbed.oracle`): the source cell it adds is the value ending
the page before the key's page, and each arm answers the same questions."""

from __future__ import annotations

import torch

from conduit_core.answer_types import PageInput
from conduit_core.policies import POLICIES
from conduit_core.runtime import ReuseRuntime
from conduit_core.testbed_model import WEIGHTS
from lab.testbed.batches import page_image
from lab.testbed.oracle import ARMS, _key_page_rows, _source_rows, _with_rows, split_oracle
from lab.testbed.probe import load_checkpoint_vlm, probe_samples
from worker.prompt import ANSWER_PREFIX, page_label


def test_the_source_cell_is_the_value_ending_the_page_before() -> None:
    split = next(s for s in probe_samples(200, 3, "distractors")
                 if s.question.family == "split")
    key_page = split.question.records[0].page
    assert key_page - 1 in split.pages  # the source page is evidence, always shown
    runtime = ReuseRuntime(load_checkpoint_vlm(WEIGHTS))
    kvs = runtime.prefill_pages([page_image(split.doc.pages[p]) for p in split.pages])
    assembly = runtime.assemble(ANSWER_PREFIX, [
        PageInput(page_label(split.doc_name, p + 1), kv)
        for p, kv in zip(split.pages, kvs, strict=True)], split.text)
    found = _source_rows(assembly, split)
    assert found is not None
    source, page_rows = found
    segment = assembly.layout.segments[split.pages.index(key_page - 1)]
    first = segment.start + 1  # after the page's start token
    assert page_rows == range(first, first + split.doc.shape.cells)
    assert source - first == (split.doc.shape.rows - 1) * split.doc.shape.cols
    row, col = divmod(source - first, split.doc.shape.cols)
    assert split.doc.pages[key_page - 1][row][col] == split.question.answer  # the value
    key_row = _key_page_rows(assembly, split, 0)
    key_segment = assembly.layout.segments[split.pages.index(key_page)]
    assert key_row[0] == key_segment.start + 1 + split.question.records[0].cell  # the key
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
