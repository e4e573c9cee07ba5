"""Page, position and caption references in questions, and the pages they point at."""

from __future__ import annotations

from worker.retrieval.query_refs import QueryRefs, parse_refs, referenced_pages


def test_page_numbers_lists_and_ranges() -> None:
    assert parse_refs("What is the date mentioned on page 14?").pages == (14,)
    assert parse_refs("the overlapped apps between page 21 and 62?").pages == (21, 62)
    assert parse_refs("Summarise pages 3-5.").pages == (3, 4, 5)
    assert parse_refs("What does slide 7 show?").pages == (7,)
    assert parse_refs("How many pages does it have?") == QueryRefs()


def test_positions_and_captions() -> None:
    refs = parse_refs("How many websites are present on the cover page?")
    assert refs.first and not refs.last
    assert parse_refs("Is there a signature on the last page?").last
    assert parse_refs("Which solver is shown in Figure 1 and Fig. 2?").captions == (
        ("figure", "1"), ("figure", "2"))
    assert parse_refs("the items in Table1-1").captions == (("table", "1-1"),)


def test_referenced_pages_by_number_position_folio_and_caption() -> None:
    documents = ["a", "a", "a", "b", "b"]
    numbers = [1, 2, 3, 1, 2]
    texts = [
        "Cover of report A",
        "Results\nFigure 2: accuracy by year\nsee Table 1",
        "Discussion\n7",  # printed folio 7 on the third physical page
        "Cover of report B",
        "Table 1. Revenue by segment",
    ]

    def found(question: str) -> dict[int, float]:
        return referenced_pages(parse_refs(question), documents, numbers, texts)

    assert found("What is on page 2?") == {1: 1.0, 4: 1.0}
    assert found("What is on page 7?") == {2: 1.0}
    assert found("What does the last page say?") == {2: 1.0, 4: 1.0}
    assert found("Who is on the cover page?") == {0: 1.0, 3: 1.0}
    # a caption at the start of a line is strong; a mention in running text is weak
    assert found("What does Table 1 list?") == {1: 0.5, 4: 1.0}
    assert found("What does Figure 2 plot?") == {1: 1.0}
    assert found("What does Figure 12 plot?") == {}
    assert found("What is the revenue of report B?") == {}


def test_the_reference_weight_is_a_bounded_setting(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import pytest
    from pydantic import ValidationError

    from worker.settings import Settings

    monkeypatch.setenv("CONDUIT_REF_WEIGHT", "1.5")
    s = Settings()
    assert s.worker.ref_weight == 1.5
    with pytest.raises(ValidationError):
        Settings(ref_weight=-1.0)
    with pytest.raises(ValidationError):
        Settings(ref_weight=11.0)
