"""The headroom analysis splits recall loss between the document choice and the ranking."""

from __future__ import annotations

from lab.retrieval.evaluate import EvalQuestion
from lab.retrieval.headroom import document_rank, headroom


def question(qid: str, doc: str, *pages: int) -> EvalQuestion:
    return EvalQuestion(id=qid, question="?", doc=doc, evidence_pages=pages)


def test_document_rank_counts_documents_in_order_of_first_page() -> None:
    ranked = [("b.pdf", 3), ("b.pdf", 1), ("a.pdf", 2), ("c.pdf", 1), ("a.pdf", 1)]
    assert document_rank("b.pdf", ranked) == 1
    assert document_rank("a.pdf", ranked) == 2
    assert document_rank("c.pdf", ranked) == 3
    assert document_rank("d.pdf", ranked) is None


def test_bound_gives_resolved_questions_their_within_document_recall() -> None:
    questions = [
        question("q1", "a.pdf", 1, 2),   # document ranks first, half its gold found
        question("q2", "b.pdf", 4),      # document ranks second, missed in the top 10
        question("q3", "c.pdf", 1),      # document never reached
        question("q4", "a.pdf"),         # no gold pages: skipped
    ]
    others = [("z.pdf", n) for n in range(1, 11)]
    collection = [
        [("a.pdf", 1)] + others,
        others[:1] + [("b.pdf", 9)] + others[1:],
        others,
        others,
    ]
    within = [[("a.pdf", 2), ("a.pdf", 1)], [("b.pdf", 4)], [("c.pdf", 1)], []]
    out = headroom(questions, collection, within)
    assert out["questions"] == 3
    assert out["collection_recall@10"] == round((0.5 + 0 + 0) / 3, 4)
    assert out["within_document_recall@10"] == 1.0
    assert out["gold_document_rank"] == {"1": 1, "2": 1, "3": 0, "4": 0, "5": 0, "6+": 1}
    bounds = out["bound_if_top_k_documents_resolved"]
    assert bounds["1"] == {"questions": 1, "bound_recall@10": round((1 + 0 + 0) / 3, 4)}
    assert bounds["2"] == {"questions": 2, "bound_recall@10": round((1 + 1 + 0) / 3, 4)}
    assert bounds["10"]["bound_recall@10"] == round(2 / 3, 4)
