"""The retrieval query: a question less its answer-format instructions, and its use in
`hybrid.search`."""

from __future__ import annotations

import pytest

from worker.retrieval.hybrid import Candidate, search
from worker.retrieval.query_clean import retrieval_query


@pytest.mark.parametrize(("question", "query"), [
    ('Which domains rate highest? Please write the answer in the list format and with '
     'alphabetical order, e.g., ["A","B"]', "Which domains rate highest?"),
    ("What is the inventory turnover for Nike?Round your answer to two decimal places.",
     "What is the inventory turnover for Nike?"),
    ("Is market CA03 part of the Bay Area? Answer 'yes' or 'no'.",
     "Is market CA03 part of the Bay Area?"),
    ("What date is mentioned on page 1? Format the date as YYYY-MM-DD",
     "What date is mentioned on page 1?"),
    ('How often is Exhibit P-10 mentioned? List all pages and formatted as a list, for '
     'example, ["1","2"]', "How often is Exhibit P-10 mentioned?"),
    ("Compute the separation distance for this transmitter. Write down the answer in float "
     "format with 2 decimals.", "Compute the separation distance for this transmitter."),
])
def test_answer_instructions_are_dropped(question: str, query: str) -> None:
    assert retrieval_query(question) == query
    assert retrieval_query(query) == query  # nothing left to drop


@pytest.mark.parametrize("question", [
    "Write the filing id and case number of this document?",  # one sentence: kept whole
    "Please list the bankers of the company.",
    "How many slides include more than one figure? Here don't consider the charts.",
    "Which year had more revenue? Give or take a rounding error, was it 2019?",  # a question
    "  What is the   date of the report?  ",  # nothing dropped: returned as given
])
def test_questions_without_instructions_are_unchanged(question: str) -> None:
    assert retrieval_query(question) == question


def test_search_ranks_with_the_cleaned_question() -> None:
    candidates = [
        Candidate("report:4", "Caldera Foods revenue rose to 412 million euros in 2021."),
        Candidate("style:2", "Write every answer in list format, in alphabetical order; an "
                  "answer in another format is returned to its writer."),
    ]
    question = ("What was the revenue of Caldera Foods in 2021? Please write the answer in "
                "list format with alphabetical order.")
    raw = search(question, candidates, top_k=2, dense_weight=0, clean_query=False)
    assert [h.key for h in raw] == ["style:2", "report:4"]  # the instruction words win
    cleaned = search(question, candidates, top_k=2, dense_weight=0)
    assert [h.key for h in cleaned][0] == "report:4"
