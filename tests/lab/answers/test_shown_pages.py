"""`--pages shown`: each question answered on exactly its `shown_pages` (evidence plus
distractors) in document order, with the fallbacks counted; the builtin model on the slice."""

from __future__ import annotations

import json
from typing import Any

import pytest

from lab.answers.config import AnswerEvalConfig
from lab.answers.runner import run_answer_eval
from tests.lab.answers.slice import QUESTIONS, write_slice

Run = tuple[dict[str, Any], list[dict[str, Any]], str]  # the document, the records, the table


@pytest.fixture(scope="module")
def shown_run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """One shown-pages run: q1 (evidence page 1) shows pages 3 and 1 of valves.pdf, listed out
    of order; q2 shows all three; q3 names no shown pages; q4 no pages at all."""
    root = tmp_path_factory.mktemp("shown")
    pdfs, _ = write_slice(root)
    rows = [{**QUESTIONS[0], "evidence_pages": [1], "shown_pages": "[3, 1]"},
            {**QUESTIONS[1], "shown_pages": [3, 2, 1]}, QUESTIONS[2], QUESTIONS[3]]
    questions = root / "shown.jsonl"
    questions.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = root / "answers_shown.json"
    doc = run_answer_eval(AnswerEvalConfig(
        pdfs=pdfs, questions=[questions], out=out, policies="full_reuse", budgets=(0.1,),
        pages="shown", top_k=2, max_new_tokens=2, progress=False, work_dir=root / "home"))
    records = [json.loads(line) for line in
               out.with_suffix(".records.jsonl").read_text().splitlines()]
    return doc, records, out.with_suffix(".md").read_text()


def test_shown_mode_answers_on_exactly_the_listed_pages_in_document_order(
        shown_run: Run) -> None:
    doc, records, table = shown_run
    assert records[0]["config"]["pages"] == "shown"  # gold and shown never share a file
    pages = {r["id"]: r["pages"] for r in records[1:] if r["policy"] == "full_prefill"}
    assert pages["q1"] == [1, 3]  # not page 2, which it does not show
    assert pages["q2"] == [1, 2, 3]
    assert pages["q3"] == [1]  # no shown_pages: its evidence page
    meta = doc["meta"]
    assert meta["pages_mode"] == "shown"
    assert meta["questions_on_evidence_pages_without_shown_pages"] == 1  # q3
    assert meta["questions_on_retrieved_pages_without_evidence"] == 1  # q4
    assert meta["pages_per_question_mean"] == pytest.approx(
        (2 + 3 + 1 + len(pages["q4"])) / 4, abs=1e-3)
    assert "evidence pages plus distractors, " in table
    assert f"{meta['pages_per_question_mean']:.2f} pages per question on average" in table
