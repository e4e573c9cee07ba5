"""The questions file: MMLongBench-Doc form, its string-encoded lists, groups, and errors that
name the file and line."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from lab.answers.questions import QuestionsError, load_items
from lab.answers.results import Records, RecordsMismatchError
from tests.lab.answers.slice import QUESTIONS


def _write(path: Path, rows: list[object]) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_items_and_groups(tmp_path: Path) -> None:
    rows = [{**QUESTIONS[1], "evidence_pages": "[3, 1, 3]"}, QUESTIONS[3]]
    a, b = load_items([_write(tmp_path / "q.jsonl", [*rows, ""])])
    assert a.evidence_pages == (1, 3) and a.evidence_sources == ("Table",)
    assert a.groups() == ["all", "doc_type=Manual", "source=Table", "family=multi"]
    assert b.evidence_pages == () and b.groups() == ["all", "doc_type=Financial report"]
    assert a.shown_pages == () and b.shown_pages == ()  # optional


def test_shown_pages_are_sorted_and_hold_the_evidence(tmp_path: Path) -> None:
    rows = [{**QUESTIONS[1], "shown_pages": "[4, 3, 1, 4]"},
            {**QUESTIONS[3], "shown_pages": [2, 5]}]  # no evidence: any pages may be shown
    a, b = load_items([_write(tmp_path / "q.jsonl", rows)])
    assert a.shown_pages == (1, 3, 4) and a.evidence_pages == (1, 3)
    assert b.shown_pages == (2, 5)


@pytest.mark.parametrize(("row", "message"), [
    ("{not json", "q.jsonl:1: not JSON"),
    ({"id": "x", "doc": "a.pdf", "question": "?"}, "missing field(s) answer, answer_format"),
    ({**QUESTIONS[0], "answer_format": "Bool"}, "answer_format 'Bool' is not one of"),
    ({**QUESTIONS[0], "evidence_pages": [0]}, "1-based page numbers"),
    ({**QUESTIONS[0], "evidence_pages": "three"}, "evidence_pages must be a list"),
    ([1, 2], "expected a JSON object"),
    ({**QUESTIONS[0], "shown_pages": [2, 0]}, "shown_pages must be 1-based page numbers"),
    ({**QUESTIONS[0], "shown_pages": [True]}, "shown_pages must be 1-based page numbers"),
    ({**QUESTIONS[0], "shown_pages": "2 and 3"}, "shown_pages must be a list"),
    ({**QUESTIONS[1], "shown_pages": [1, 2]}, "evidence page(s) [3] not among shown_pages "
                                              "[1, 2]"),
])
def test_bad_lines_name_file_and_line(tmp_path: Path, row: object, message: str) -> None:
    with pytest.raises(QuestionsError, match=re.escape(message)):
        load_items([_write(tmp_path / "q.jsonl", [row])])


def test_ids_are_unique_across_files_and_a_file_must_hold_questions(tmp_path: Path) -> None:
    one = _write(tmp_path / "one.jsonl", [QUESTIONS[0]])
    two = _write(tmp_path / "two.jsonl", [QUESTIONS[1], QUESTIONS[0]])
    with pytest.raises(QuestionsError, match=r"two.jsonl:2: id 'q1' already used at .*one"):
        load_items([one, two])
    with pytest.raises(QuestionsError, match="no questions in"):
        load_items([_write(tmp_path / "empty.jsonl", [""])])
    with pytest.raises(QuestionsError, match="cannot read"):
        load_items([tmp_path / "absent.jsonl"])


def test_records_resume_and_refuse_other_settings(tmp_path: Path) -> None:
    path = tmp_path / "r.records.jsonl"
    records = Records(path, {"model": "m", "max_new_tokens": 4})
    records.add([{"id": "q1", "policy": "conduit", "budget": 0.1, "answer": "x"}])
    with path.open("a") as fh:
        fh.write('{"id": "q2", "pol')  # a line cut short by an interrupted run
    again = Records(path, {"model": "m", "max_new_tokens": 4})
    assert again.done("q1", "conduit", 0.1) and not again.done("q1", "conduit", 0.2)
    assert len(again.all()) == 1
    again.add([{"id": "q2", "policy": "conduit", "budget": 0.1, "answer": "y"}])
    assert Records(path, {"model": "m", "max_new_tokens": 4}).done("q2", "conduit", 0.1)
    with pytest.raises(RecordsMismatchError, match=r"other settings \(max_new_tokens\)"):
        Records(path, {"model": "m", "max_new_tokens": 8})


def test_records_are_pinned_to_the_weights(tmp_path: Path) -> None:
    """A builtin keeps its name when its committed weights change: the records of the old
    weights must not be resumed as answers of the new ones."""
    path = tmp_path / "r.records.jsonl"
    config = {"model": "builtin:testbed-qwen2-vl"}
    records = Records(path, config)
    records.pin_model("sha-old")
    records.add([{"id": "q1", "policy": "conduit", "budget": 0.1, "answer": "x"}])
    again = Records(path, config)
    again.pin_model("sha-old")  # the same weights: resumes
    assert again.done("q1", "conduit", 0.1)
    with pytest.raises(RecordsMismatchError, match="other weights"):
        Records(path, config).pin_model("sha-new")
    old = tmp_path / "old.records.jsonl"  # written before weights were recorded
    Records(old, config).add([{"id": "q1", "policy": "conduit", "budget": 0.1, "answer": "x"}])
    with pytest.raises(RecordsMismatchError, match="not recorded"):
        Records(old, config).pin_model("sha-new")
