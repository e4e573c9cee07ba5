"""The token categories of the choices analysis: an asked record's own cells and the cell its
key reads on another page, on generated samples."""

from __future__ import annotations

from lab.testbed.choices import record_cells, source_cells
from lab.testbed.probe import probe_samples
from lab.testbed.task import LEGEND_CELL


def test_record_and_source_cells_by_family() -> None:
    seen = set()
    for s in probe_samples(60, seed=7, pages="distractors"):
        cols = s.doc.shape.cols
        text = "".join(s.doc.pages[p][c // cols][c % cols] for p, c in sorted(record_cells(s)))
        family = s.question.family
        seen.add(family)
        if family == "legend":  # "3Q=" before the key "G"; the legend's digit on page 1
            assert len(text) == 3 and text.endswith("=") and text[0].isdigit()
            assert source_cells(s) == {(0, LEGEND_CELL)}
        elif family == "lookup":  # "5=" before the key; nothing on another page
            assert len(text) == 2 and text.endswith("=")
            assert source_cells(s) == set()
        elif family == "reference":  # "B=" names another record, whose key cell it reads
            assert len(text) == 2 and text.endswith("=")
            (page, cell), = source_cells(s)
            assert s.doc.pages[page][cell // cols][cell % cols] == text[0]
            assert page != s.question.records[0].page
    assert {"legend", "lookup", "reference"} <= seen
