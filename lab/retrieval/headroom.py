"""Where collection-wide page recall is lost: the document choice or the ranking within it.

    python -m lab.retrieval.headroom --devset /work/shared/devsets/mmlongbench-dev \
        --cache /tmp/devset-cache --json lab/retrieval/results/retrieval_headroom_mmlongbench.json

Ranks every answerable question twice with the service's default weights: over the whole
collection, and within its own document only (what `document_ids` scoping gives, i.e. the
document choice made by an oracle). For each question the gold document's rank among
documents (the order in which their first pages appear in the collection ranking) tells how
far the document choice is from right. The bound for K is the recall@10 the collection
ranking would reach if every question whose document ranks K-th or better got its
within-document recall, and every other question kept its collection recall: no reranking
of the top K documents can do better with this page ranker.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lab.retrieval.evaluate import EvalQuestion, PageRef, load_questions, rank_questions
from lab.retrieval.real_devset import DEFAULT, load_corpus, with_vectors
from worker.retrieval.embedder import Embedder

BOUND_KS = (1, 2, 3, 5, 10)
DEPTH = 10


def recall_at(gold: set[PageRef], ranked: Sequence[PageRef], k: int = DEPTH) -> float:
    """Share of `gold` in the first `k` of `ranked`."""
    return len(gold.intersection(ranked[:k])) / len(gold)


def document_rank(doc: str, ranked: Sequence[PageRef]) -> int | None:
    """1-based rank of `doc` among the documents in the order their pages first appear."""
    seen: list[str] = []
    for page_doc, _ in ranked:
        if page_doc not in seen:
            seen.append(page_doc)
            if page_doc == doc:
                return len(seen)
    return None


def headroom(questions: Sequence[EvalQuestion], collection: Sequence[Sequence[PageRef]],
             within: Sequence[Sequence[PageRef]]) -> dict[str, Any]:
    """Recall@10 over the collection and within the gold document, and the bound per K.

    `collection` ranks each question over every page (deep enough to reach its document);
    `within` ranks it over its own document's pages. Questions without gold pages or a
    document are skipped.
    """
    now, oracle, ranks = [], [], []
    for q, ranked, scoped in zip(questions, collection, within, strict=True):
        if q.doc is None or not q.evidence_pages:
            continue
        gold = {(q.doc, p) for p in q.evidence_pages}
        now.append(recall_at(gold, ranked))
        oracle.append(recall_at(gold, scoped))
        rank = document_rank(q.doc, ranked)
        ranks.append(rank if rank is not None else len(ranked) + 1)
    r_now, r_oracle, r_rank = np.array(now), np.array(oracle), np.array(ranks)
    bounds = {str(k): {"questions": int((r_rank <= k).sum()),
                       "bound_recall@10": round(float(np.where(r_rank <= k, r_oracle,
                                                               r_now).mean()), 4)}
              for k in BOUND_KS}
    return {"questions": len(now), "collection_recall@10": round(float(r_now.mean()), 4),
            "within_document_recall@10": round(float(r_oracle.mean()), 4),
            "gold_document_rank": {str(k): int((r_rank == k).sum()) for k in range(1, 6)}
            | {"6+": int((r_rank > 5).sum())},
            "bound_if_top_k_documents_resolved": bounds}


def main() -> None:
    """Command line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devset", type=Path, required=True)
    parser.add_argument("--cache", type=Path, required=True)
    parser.add_argument("--json", type=Path, required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    embedder = Embedder()
    base, rows, owners = load_corpus(args.devset / "pdfs", args.cache, embedder)
    corpus = with_vectors(base, rows, owners, "mean")
    documents = set(corpus.documents())
    questions = [q for q in load_questions(args.devset / "questions.jsonl")
                 if q.evidence_pages and q.doc in documents]
    collection = rank_questions(corpus, questions, within_doc=False, depth=len(corpus.pages),
                                embedder=embedder, **DEFAULT)
    within = rank_questions(corpus, questions, within_doc=True, depth=DEPTH, embedder=embedder,
                            **DEFAULT)
    result = headroom(questions, collection, within)
    print(json.dumps(result, indent=1))
    args.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
