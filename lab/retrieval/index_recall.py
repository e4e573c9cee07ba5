"""Recall of the persistent retrieval index vs the scan path on the same ingested corpus.

    python -m lab.retrieval.index_recall --pdfs /tmp/devset/pdfs \
        --questions /tmp/devset/questions.jsonl --cache /tmp/devset --json OUT
    python -m lab.retrieval.index_recall --real /work/shared/devsets/mmlongbench-dev \
        --cache /tmp/devset-cache --json OUT

Ingests once (cached as in run_bench; `--real`: the MMLongBench-Doc dev set as
`real_devset.py` caches it, outside the repository), builds the index of the whole corpus in
a temporary folder, ranks every question both ways with the deployment's weights (OCR,
document context, mean passages, BM25 1.0 + dense 0.6, RRF k 10) and with each retriever
alone, over the whole collection and within each question's document, and writes page
recall@k side by side. A second index has its vectors' inverted file trained at once
(`ivf.py`, normally only past 32,768 vectors) and is scored at several probed shares of the
vectors: the approximation's cost in recall on real embeddings (large collections probe
4,096 rows, 4% of 100k).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from lab.retrieval.evaluate import (
    Corpus,
    EvalQuestion,
    PageRef,
    load_questions,
    rank_questions,
    score_rankings,
)
from lab.retrieval.real_devset import load_corpus, with_vectors
from lab.retrieval.run_bench import KS, Embeddings, cached_corpus, with_context_kind
from worker.retrieval.embedder import Embedder
from worker.retrieval.index import ivf
from worker.retrieval.index.files import set_current
from worker.retrieval.index.reader import IndexReader
from worker.retrieval.index.search import search_index
from worker.retrieval.index.writer import IndexDocument, IndexPage, apply, create_version
from worker.retrieval.query_clean import retrieval_query

CONFIGS = {"hybrid (deployed)": (1.0, 0.6), "bm25 only": (1.0, 0.0), "dense only": (0.0, 1.0)}
IVF_SHARES = (0.04, 0.08, 0.16)  # probed share of the vectors for the inverted-file rows


def build_index(corpus: Corpus, folder: Path, *, ivf_min_rows: int = ivf.MIN_ROWS
                ) -> IndexReader:
    """The index of every page of `corpus`, one document per PDF, in corpus order."""
    docs: dict[str, list[IndexPage]] = {}
    for p in corpus.pages:
        docs.setdefault(p.doc, []).append(IndexPage(p.page, p.text, p.context, p.embedding))
    version = folder / "v1"
    create_version(version)
    set_current(folder, version)
    apply(version, add=[IndexDocument(d, pages) for d, pages in docs.items()],
          ivf_min_rows=ivf_min_rows)
    return IndexReader(folder)


def rank_with_index(reader: IndexReader, corpus: Corpus, questions: list, *, within_doc: bool,
                    bm25: float, dense: float, embedder: Embedder,
                    scan_rows: int = ivf.SCAN_ROWS) -> list[list[PageRef]]:
    """Rankings of the index path, in `rank_questions`'s form (the question cleaned as the
    service cleans it, and as `rank_questions` does by default)."""
    docs = set(corpus.documents())
    out: list[list[PageRef]] = []
    for q in questions:
        scope = None
        if within_doc:
            doc = q.doc if q.doc in docs else f"{q.doc}.pdf"
            scope = [doc]
        hits = search_index(reader, retrieval_query(q.question), top_k=20, document_ids=scope,
                            bm25_weight=bm25, dense_weight=dense, embedder=embedder,
                            scan_rows=scan_rows) or []
        out.append([(d, int(n)) for d, _, n in (h.key.rpartition(":") for h in hits)])
    return out


def load(args: argparse.Namespace, embedder: Embedder) -> tuple[Corpus, list[EvalQuestion]]:
    """The corpus with mean passage vectors and its answerable questions."""
    if args.real is not None:
        base, rows, owners = load_corpus(args.real / "pdfs", args.cache, embedder)
        return (with_vectors(base, rows, owners, "mean"),
                [q for q in load_questions(args.real / "questions.jsonl") if q.evidence_pages])
    if args.pdfs is None or args.questions is None:
        raise SystemExit("give --pdfs and --questions, or --real")
    ocr = not args.no_ocr
    tag = "ocr" if ocr else "text"
    args.cache.mkdir(parents=True, exist_ok=True)
    base = with_context_kind(cached_corpus(args.pdfs, ocr, args.cache / f"corpus_{tag}.json"),
                             "full")
    matrices = Embeddings(args.cache, embedder).get(base, ocr, "mean", "full")
    corpus = Corpus(pages=[replace(p, embedding=m) for p, m in zip(base.pages, matrices,
                                                                      strict=True)],
                    failed=dict(base.failed))
    return corpus, load_questions(args.questions)


def compare(corpus: Corpus, questions: list[EvalQuestion], embedder: Embedder
            ) -> dict[str, dict]:
    """Page recall@k of scan vs index per scope and retriever, and of the inverted file."""
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        reader = build_index(corpus, Path(tmp) / "exact")
        for scope in ("collection", "within_doc"):
            for name, (bm25, dense) in CONFIGS.items():
                row: dict[str, Any] = {}
                for path in ("scan", "index"):
                    if path == "scan":
                        ranked = rank_questions(corpus, questions, within_doc=scope != "collection",
                                                bm25_weight=bm25, dense_weight=dense,
                                                embedder=embedder if dense else None)
                    else:
                        ranked = rank_with_index(reader, corpus, questions,
                                                 within_doc=scope != "collection",
                                                 bm25=bm25, dense=dense, embedder=embedder)
                    row[path] = score_rankings(corpus, questions, ranked, KS)["page_recall"]
                row["delta"] = {k: round(row["index"][k] - row["scan"][k], 4)
                                for k in row["scan"]}
                results[f"{scope} / {name}"] = row
                print(f"{scope:10s} {name:18s} scan R@1,3,5,10 = "
                      f"{[row['scan'][str(k)] for k in KS]} index = "
                      f"{[row['index'][str(k)] for k in KS]}", flush=True)
        approx = build_index(corpus, Path(tmp) / "ivf", ivf_min_rows=0)
        rows = approx.snapshot().manifest.rows  # type: ignore[union-attr]
        for name in ("hybrid (deployed)", "dense only"):
            bm25, dense = CONFIGS[name]
            exact = results[f"collection / {name}"]["index"]
            for share in IVF_SHARES:
                ranked = rank_with_index(approx, corpus, questions, within_doc=False, bm25=bm25,
                                         dense=dense, embedder=embedder,
                                         scan_rows=max(1, round(share * rows)))
                recall: Any = score_rankings(corpus, questions, ranked, KS)["page_recall"]
                results[f"collection / {name} / inverted file, {share:.0%} probed"] = {
                    "index": recall, "delta_vs_exact": {k: round(recall[k] - exact[k], 4)
                                                        for k in exact}}
                print(f"inverted file {share:.0%} {name:18s} R@1,3,5,10 = "
                      f"{[recall[str(k)] for k in KS]}", flush=True)
    return results


def main() -> None:
    """Command line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pdfs", type=Path)
    parser.add_argument("--questions", type=Path)
    parser.add_argument("--real", type=Path, help="the MMLongBench-Doc dev set folder")
    parser.add_argument("--cache", type=Path, required=True, help="folder for cached corpora")
    parser.add_argument("--no-ocr", action="store_true")
    parser.add_argument("--json", type=Path, required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    embedder = Embedder()
    corpus, questions = load(args, embedder)
    t0 = time.perf_counter()
    results = compare(corpus, questions, embedder)
    summary = {"pdfs": str(args.real or args.pdfs), "pages": len(corpus.pages),
               "ocr": not args.no_ocr, "questions": len(questions),
               "seconds": round(time.perf_counter() - t0, 1), "results": results}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(summary, indent=1) + "\n")


if __name__ == "__main__":
    main()
