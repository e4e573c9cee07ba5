"""Document context: the title words of a page's document, indexed with every page.

Three reports share one template; only the cover and the file name say whose report it
is. A question naming the company must reach the right company's inner page, which
without context is a coin toss between three identical-looking pages.
"""

from __future__ import annotations

import pytest

from worker.retrieval import Candidate, Embedder, embed_pages, search
from worker.retrieval.document_context import document_context, with_context

COMPANIES = {"norrvik": "Norrvik Energy", "caldera": "Caldera Foods",
             "tidewell": "Tidewell Shipping"}
DIVIDEND = {"norrvik": "EUR 1.20", "caldera": "EUR 0.45", "tidewell": "EUR 2.10"}


def _pages(slug: str) -> list[str]:
    name = COMPANIES[slug]
    return [
        f"{name} Annual Report 2023. Our year in review.",
        "Letter to shareholders. Demand recovered in the second half and margins improved. "
        "We opened two depots and trained our drivers in fuel-efficient driving.",
        f"Dividend. The board proposes a final dividend of {DIVIDEND[slug]} per share, "
        "payable in May after the annual general meeting.",
        "Governance. The board met eleven times; the audit committee met six times.",
    ]


def _candidates(embedder: Embedder | None, *, context: bool) -> list[Candidate]:
    out = []
    for slug in COMPANIES:
        texts = _pages(slug)
        ctx = document_context(f"{slug}_annual_report_2023.pdf", None, texts[0]) if context \
            else ""
        matrices = embed_pages(texts, embedder, contexts=[ctx] * len(texts)) if embedder \
            else [None] * len(texts)
        out += [Candidate(f"{slug}:{n}", t, m, context=ctx)
                for n, (t, m) in enumerate(zip(texts, matrices, strict=True), start=1)]
    return out


def test_document_context_keeps_title_words_once_and_drops_ids() -> None:
    ctx = document_context("caldera_foods_annual_report_2023.pdf",
                           "Microsoft Word - Caldera Foods AR 2023.docx",
                           "Caldera Foods Annual Report 2023\nCaldera Foods makes soups.")
    assert ctx.split()[:5] == ["Caldera", "Foods", "AR", "2023", "Annual"]
    assert "Microsoft" not in ctx and "docx" not in ctx
    assert [w.lower() for w in ctx.split()].count("caldera") == 1
    assert document_context("3f9a1c2e77b04d21.pdf", None, "") == ""
    assert document_context("2301.12345v2.pdf", None, "") == "2301"
    assert len(document_context("a.pdf", None, " ".join(f"w{i}x" for i in range(99))).split()) \
        <= 24


def test_with_context_prefixes_only_when_there_is_one() -> None:
    assert with_context("", "page") == "page"
    assert with_context("Caldera Foods", "page") == "Caldera Foods\npage"


@pytest.mark.parametrize("slug", list(COMPANIES))
def test_context_sends_a_named_question_to_its_own_documents_page(slug: str) -> None:
    question = f"How much dividend per share will {COMPANIES[slug]} pay?"
    plain = search(question, _candidates(None, context=False), top_k=3, dense_weight=0)
    # without context the three dividend pages tie on the question's words and the named
    # company's cover outranks its own dividend page
    assert plain[0].key == f"{slug}:1"
    hits = search(question, _candidates(None, context=True), top_k=3, dense_weight=0)
    assert hits[0].key == f"{slug}:3", hits


@pytest.mark.parametrize("slug", list(COMPANIES))
def test_contextual_embeddings_find_the_named_documents_page(slug: str,
                                                             embedder: Embedder) -> None:
    question = f"What payout to shareholders does {COMPANIES[slug]} propose for each share?"
    hits = search(question, _candidates(embedder, context=True), top_k=3, bm25_weight=0,
                  embedder=embedder)
    assert hits[0].key == f"{slug}:3", hits
