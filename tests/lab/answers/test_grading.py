"""The MMLongBench-Doc scoring rules on real cases from the dev set's answer key (read where
it lies, ../shared/devsets/mmlongbench-dev): matches and near-misses for every format."""

from __future__ import annotations

import json

import pytest

from lab import DEVSET
from lab.answers.grading import (
    NOT_ANSWERABLE,
    agreement,
    clean,
    extract_answer,
    score_answer,
)


def _key() -> dict[str, dict[str, str]]:
    if not DEVSET.is_dir():
        pytest.skip(f"dev set not found at {DEVSET}")
    rows = [json.loads(line) for name in ("questions.jsonl", "questions_unanswerable.jsonl")
            for line in (DEVSET / name).read_text().splitlines() if line.strip()]
    return {r["id"]: r for r in rows}


@pytest.fixture(scope="module")
def key() -> dict[str, dict[str, str]]:
    return _key()


# (question id in the dev set, a model response, expected score)
CASES = [
    # Int
    ("d0000", "541", 1.0), ("d0000", "About 541 adults rated them poor.", 1.0),
    ("d0000", "542", 0.0), ("d0000", "5410", 0.0), ("d0000", "54.1", 0.0),
    ("d0002", "21%", 1.0), ("d0002", "21", 1.0), ("d0002", "The answer is 21 percent.", 1.0),
    ("d0002", "12%", 0.0), ("d0032", "197,940", 1.0), ("d0032", "197,941", 0.0),
    ("d0022", "three", 1.0), ("d0022", "Three pages.", 1.0), ("d0022", "four", 0.0),
    ("d0162", "0", 1.0), ("d0162", "None of them: 0", 1.0), ("d0162", "1", 0.0),
    ("d0168", "In 1954.", 1.0), ("d0168", "1945", 0.0),
    ("d0000", "Not answerable", 0.0),
    # Float (1% relative tolerance; the key may be read as a percentage)
    ("d0010", "56.8", 1.0), ("d0010", "56.80%", 1.0), ("d0010", "0.568", 1.0),
    ("d0010", "58.8", 0.0), ("d0024", "466.43", 1.0), ("d0024", "$466.43 million", 1.0),
    ("d0024", "480", 0.0), ("d0062", "1.9%", 1.0), ("d0062", "0.019", 1.0),
    ("d0062", "2.9%", 0.0), ("d0082", "1,358,000", 1.0), ("d0082", "1,258,000", 0.0),
    ("d0100", "6063", 1.0), ("d0100", "6,063.00", 1.0), ("d0100", "6163", 0.0),
    ("d0102", "19", 1.0), ("d0102", "0.19", 1.0), ("d0102", "91%", 0.0),
    ("d0004", "7", 1.0), ("d0004", "7.5", 0.0),
    # Str: ANLS (partial credit above 0.5), exact match for dates, ids, times
    ("d0016", "Pyke", 1.0), ("d0016", "The answer is Pyke.", 1.0), ("d0016", "pyke", 1.0),
    ("d0016", "Prolog", 0.0), ("d0020", "Medicine", 1.0), ("d0020", "Engineering", 0.0),
    ("d0038", "Scott Bradley", 1.0), ("d0038", "Scott Brady", 1 - 2 / 13),
    ("d0038", "John Smith", 0.0), ("d0040", "Little Rock", 1.0),
    ("d0040", "Little Rock, Arkansas", 0.5238095238095238), ("d0040", "Rockford", 0.0),
    ("d0046", "No", 1.0), ("d0046", "Yes", 0.0), ("d0124", "2021-02-08", 1.0),
    ("d0124", "2021-02-09", 0.0), ("d0170", "2003-10-07", 1.0), ("d0170", "2003-10-17", 0.0),
    ("d0122", "21-13199", 1.0), ("d0122", "21-13198", 0.0), ("d0186", "399 million", 1.0),
    ("d0186", "399", 1.0), ("d0060", "N/A", 1.0), ("d0134", "Mr. S.V. Shanbhag", 1.0),
    ("d0086", "Elastic Compute Service (ECS)", 1.0), ("d0086", "Not answerable", 0.0),
    # List: order-free, lengths must agree
    ("d0006", "['Fact Checker']", 1.0), ("d0006", "Fact Checker", 1.0),
    ("d0006", "['Fact Checker', 'Editor']", 0.0), ("d0026", "['75.38', '71.02']", 1.0),
    ("d0026", "71.02, 75.38", 1.0), ("d0026", "['71.02', '75.39']", 0.0),
    ("d0030", "[0, 0]", 1.0), ("d0030", "[0]", 0.0), ("d0130", "10, 3, 2 and 1", 1.0),
    ("d0130", "1, 2, 3", 0.0), ("d0140", "['2002', '2001', '1982', '1981']", 1.0),
    ("d0140", "['2002', '2001', '1982', '1980']", 0.0), ("d0066", "0.66", 1.0),
    ("d0066", "0.67", 0.0), ("d0204", "['2015-03-25', '2015-03-24']", 1.0),
    ("d0204", "['2015-03-25', '2015-03-26']", 0.0),
    ("d0212", "Video Views and Post Reach", 1.0), ("d0212", "['Post Reach']", 0.0),
    ("d0116", "['IA Advisory', 'IA Tech Audit', 'IA outsource', 'IA Co-source']", 1.0),
    ("d0116", "['IA Advisory', 'IA Tech Audit', 'IA outsource', 'Other']", 0.0),
    # None ("Not answerable")
    ("du0000", "Not answerable", 1.0), ("du0000", "The document does not mention it.", 1.0),
    ("du0000", "This cannot be determined from the pages.", 1.0), ("du0000", "541", 0.0),
    ("du0000", "Answer: not answerable.", 1.0), ("d0128", "0", 1.0), ("d0128", "none", 1.0),
    ("d0128", "Not answerable", 1.0), ("d0128", "3", 0.0), ("du0001", "['A', 'B']", 0.0),
]


@pytest.mark.parametrize(("qid", "response", "expected"), CASES)
def test_real_cases(key: dict[str, dict[str, str]], qid: str, response: str,
                    expected: float) -> None:
    row = key[qid]
    assert score_answer(row["answer"], response, row["answer_format"]) == pytest.approx(expected)


def test_cases_cover_every_format(key: dict[str, dict[str, str]]) -> None:
    formats = {key[qid]["answer_format"] for qid, _, _ in CASES}
    assert formats == {"Str", "Int", "Float", "List", "None"}
    for fmt in formats:
        mine = [e for q, _, e in CASES if key[q]["answer_format"] == fmt]
        assert 1.0 in mine and 0.0 in mine  # matches and near-misses for each


def test_every_key_matches_itself_and_its_stated_form(key: dict[str, dict[str, str]]) -> None:
    for row in key.values():
        answer, fmt = row["answer"], row["answer_format"]
        assert score_answer(answer, answer, fmt) == 1.0, row["id"]
        if fmt not in ("List", "None"):
            assert score_answer(answer, f"Answer: {answer}\nbecause ...", fmt) == 1.0, row["id"]


def test_every_numeric_key_rejects_a_different_number(key: dict[str, dict[str, str]]) -> None:
    checked = 0
    for row in key.values():
        fmt, answer = row["answer_format"], row["answer"]
        if fmt not in ("Int", "Float"):
            continue
        try:
            value = float(clean(answer))
        except ValueError:
            continue
        wrong = value + 1 if fmt == "Int" or value == 0 else value * 1.5
        assert score_answer(answer, f"{wrong:g}", fmt) == 0.0, row["id"]
        checked += 1
    assert checked >= 120


def test_every_list_key_rejects_a_missing_element(key: dict[str, dict[str, str]]) -> None:
    lists = [r for r in key.values() if r["answer_format"] == "List"
             and r["answer"].startswith("[") and r["answer"].count(",") >= 1]
    assert len(lists) >= 25
    for row in lists:
        items = extract_answer(row["answer"], "List")
        assert isinstance(items, list)
        assert score_answer(row["answer"], repr(items[::-1]), "List") == 1.0, row["id"]
        assert score_answer(row["answer"], repr(items[1:]), "List") == 0.0, row["id"]


def test_every_unanswerable_key_accepts_only_a_refusal(key: dict[str, dict[str, str]]) -> None:
    rows = [r for r in key.values() if r["answer_format"] == "None"]
    assert len(rows) == 67
    for row in rows:
        assert score_answer(row["answer"], "Not answerable", "None") == 1.0
        assert score_answer(row["answer"], "The pages do not provide this.", "None") == 1.0
        assert score_answer(row["answer"], "Tokyo", "None") == 0.0


def test_extraction() -> None:
    assert extract_answer("The answer is 1,234 adults.", "Int") == "1234"
    assert extract_answer("\n\nAnswer: Pyke.\nIt is on page 3.", "Str") == "Pyke"
    assert extract_answer("a, b and c", "List") == ["a", "b", "c"]
    assert extract_answer("It is not mentioned in the document.", "Str") == NOT_ANSWERABLE


def test_agreement_compares_normalised_answers() -> None:
    assert agreement("541", "The answer is 541 adults.", "Int")
    assert agreement("0.5", "0.50", "Float")
    assert agreement("['b', 'a']", "a, b", "List")
    assert agreement("Pyke.", "pyke", "Str")
    assert agreement("Not answerable", "This is not stated in the document", "None")
    assert not agreement("541", "542", "Int")
    assert not agreement("Pyke", "Prolog", "Str")


def test_unknown_format_is_an_error() -> None:
    with pytest.raises(ValueError, match="unknown answer_format 'Date'"):
        score_answer("2021", "2021", "Date")
