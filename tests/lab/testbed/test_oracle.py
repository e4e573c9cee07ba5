"""The split-record oracle (`lab.testbed.oracle`): the source cell it adds is the value ending
the page before the key's page, and each arm answers the same questions."""

from __future__ import annotations

import random

import pytest
import torch

from conduit_core.answer_types import PageInput
from conduit_core.model.testbed_model import WEIGHTS
from conduit_core.policies import POLICIES
from conduit_core.runtime import ReuseRuntime
from lab.testbed.batches import page_image
from lab.testbed.oracle import (
    ARMS,
    _arm_rows,
    _boundary_rows,
    _key_page_rows,
    _segment_rows,
    _with_rows,
    source_cell,
    split_oracle,
)
from lab.testbed.probe import load_checkpoint_vlm, probe_samples
from worker.prompt import ANSWER_PREFIX, page_label


def test_the_source_cell_is_the_value_ending_the_page_before() -> None:
    split = next(s for s in probe_samples(200, 3, "distractors")
                 if s.question.family == "split")
    key_page = split.question.records[0].page
    assert key_page - 1 in split.pages  # the source page is evidence, always shown
    runtime = ReuseRuntime(load_checkpoint_vlm(WEIGHTS))
    kvs = runtime.prefill_pages([page_image(split.doc.pages[p]) for p in split.pages])
    assembly = runtime.reuse.assemble(ANSWER_PREFIX, [
        PageInput(page_label(split.doc_name, p + 1), kv)
        for p, kv in zip(split.pages, kvs, strict=True)], split.text)
    found = source_cell(assembly, split)
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
    whole = _segment_rows(assembly, split, key_page)  # the page arm: delimiters and cells
    assert whole[0] == key_segment.start and len(whole) == key_segment.length
    assert set(key_row) < set(whole)
    arms = _arm_rows(assembly, split, source, page_rows, set(), random.Random(0))
    page = arms["plus_source_page"]
    assert page == list(range(segment.start, segment.stop))
    assert arms["plus_source_rest"] + arms["plus_source_tail"] == page  # the two parts
    assert arms["plus_source_tail"] == arms["plus_source_row"] + arms["plus_source_end"]
    assert arms["plus_source_rest"] == arms["plus_source_start"] + arms["plus_source_body"]
    assert arms["plus_source_upper"] + arms["plus_source_lower"] == arms["plus_source_body"]
    assert len(arms["plus_source_upper"]) == len(arms["plus_source_lower"])
    glyphs, blanks = arms["plus_source_glyphs"], arms["plus_source_blanks"]
    assert sorted(glyphs + blanks) == arms["plus_source_body"] and glyphs and blanks
    rows_above = split.doc.pages[key_page - 1][:-1]
    assert len(glyphs) == sum(ch != " " for line in rows_above for ch in line)
    cols = split.doc.shape.cols
    assert arms["plus_source_row_above"] == list(range(source - cols, source))
    assert set(arms["plus_source_near_glyphs"]) <= set(glyphs)
    assert all(r >= source - 3 * cols for r in arms["plus_source_near_glyphs"])
    assert arms["plus_source_columns"][-2:] == [source - cols, source - cols + 1]
    assert len(arms["plus_source_columns"]) == 2 * (split.doc.shape.rows - 1)
    key_first = key_segment.start + 1  # the key: the first cell of its page, after the source's
    for n in (2, 4):
        rows = _boundary_rows(assembly, split, {key_first}, n)
        assert rows == list(range(source + cols - n * cols, source + cols))
        assert _boundary_rows(assembly, split, set(), n) == []  # no first cell chosen
    starts = arms["plus_all_starts"]
    assert len(starts) == len(split.pages) and page[0] in starts and whole[0] in starts
    assert set(arms["plus_all_delimiters"]) == set(starts) | {
        seg.stop - 1 for seg in assembly.layout.segments}
    assert arms["plus_source_record"] == [source, source + 1]
    assert split.doc.pages[key_page - 1][-1][:2] == f"{split.question.answer}="
    assert arms["plus_distractor_page"] is not None
    assert not set(arms["plus_distractor_page"]) & (set(page) | set(whole))


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
    assert 0 < out["distractor_shown"] <= 1
    with pytest.raises(ValueError, match="unknown arms"):
        split_oracle(load_checkpoint_vlm(WEIGHTS), n=1, arms=("plus_everything",))
