"""Citation snippets: the best-matching passage of a page and its matched terms' spans."""

from __future__ import annotations

from worker.retrieval.snippet import best_snippet

FILLER = "The annual report covers many unrelated topics in great and tedious detail. " * 12


def _marked(snippet) -> list[str]:  # type: ignore[no-untyped-def]
    return [snippet.text[s:e] for s, e in snippet.spans]


def test_picks_the_matching_passage_and_marks_stemmed_terms() -> None:
    page = (FILLER + "Safety: the pressure valve is inspected every 14 days by the "
            "maintenance crew.\n\n" + FILLER)
    snip = best_snippet("How often is the valve inspection done?", page, max_chars=200)
    assert "pressure valve is inspected every 14 days" in snip.text
    assert len(snip.text) <= 200
    assert _marked(snip) == ["valve", "inspected"]  # 'inspection' ~ 'inspected'; stop words not
    assert snip.clipped_left and snip.clipped_right
    assert "\n" not in snip.text and "  " not in snip.text
    assert not snip.text[0].isspace() and not snip.text[-1].isspace()


def test_prefers_the_window_with_more_distinct_rare_terms() -> None:
    page = ("revenue revenue revenue revenue. " * 3 + FILLER
            + "Northern region revenue grew 12 percent. " + FILLER)
    snip = best_snippet("revenue growth in the northern region", page, max_chars=120)
    assert "Northern region revenue grew 12 percent." in snip.text
    assert set(_marked(snip)) == {"Northern", "region", "revenue"}  # "grew" is not "growth"


def test_no_match_gives_the_opening_and_empty_text_gives_empty() -> None:
    snip = best_snippet("zebra", "Short page text about something else.", max_chars=100)
    assert snip.text == "Short page text about something else."
    assert snip.spans == () and not snip.clipped_left and not snip.clipped_right
    assert best_snippet("zebra", "  \n ").text == ""


def test_spans_stay_inside_a_passage_cut_mid_word() -> None:
    page = "x" * 50 + " alpha beta " + "y" * 500
    snip = best_snippet("beta", page, max_chars=60)
    assert _marked(snip) == ["beta"]
    for start, end in snip.spans:
        assert 0 <= start < end <= len(snip.text)
