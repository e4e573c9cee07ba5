"""The document prior: documents ranked as wholes, and its term in `hybrid.search`."""

from __future__ import annotations

import numpy as np

from worker.retrieval.doc_prior import document_ranks
from worker.retrieval.hybrid import Candidate, search


def _unit(*values: float) -> np.ndarray:
    v = np.asarray(values, dtype=np.float32)
    return v / np.linalg.norm(v)


def test_documents_ranked_by_their_whole_text() -> None:
    documents = ["survey", "survey", "filing", "filing"]
    texts = ["adults were asked in April about the economy", "approval of the president",
             "revenue and operating income", "approval of the dividend"]
    ranks = document_ranks("approval among adults surveyed in April", documents, texts,
                           ["Pew survey", "Pew survey", "Annual report", "Annual report"],
                           rrf_k=10)
    assert ranks.tolist() == [1, 1, 2, 2]


def test_dense_document_ranking_joins_bm25() -> None:
    documents = ["a", "b"]
    vectors = [_unit(1, 0, 0)[None, :], _unit(0, 1, 0)[None, :]]
    # no shared words: BM25 ranks no document, the dense ranking decides
    ranks = document_ranks("zebra", documents, ["alpha", "beta"], ["", ""],
                           query_vector=_unit(0, 1, 0), page_vectors=vectors, rrf_k=10)
    assert ranks.tolist() == [2, 1]


def test_search_lifts_pages_of_the_likely_document() -> None:
    candidates = [
        Candidate("filing:1", "Annual report of Caldera Foods. Caldera Foods sells bread, "
                  "soups and snacks across Europe."),
        Candidate("filing:2", "Caldera Foods revenue grew. The board proposes a dividend; "
                  "the dividend is paid in May."),
        Candidate("other:1", "Annual report of Borealis Mining. Ore grades and reserves."),
        Candidate("other:2", "The board proposes a final dividend. The board proposes the "
                  "dividend each year."),
    ]
    question = "What dividend does the board of Caldera Foods propose?"
    plain = [h.key for h in search(question, candidates, top_k=4)]
    assert plain[:3] == ["filing:2", "other:2", "filing:1"]  # a look-alike page second
    lifted = [h.key for h in search(question, candidates, top_k=4, doc_weight=1.0)]
    assert lifted[:3] == ["filing:2", "filing:1", "other:2"]
