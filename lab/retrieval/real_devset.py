"""Page retrieval on a real dev set (MMLongBench-Doc documents): today's default, ablations,
recall per evidence type, weights chosen with documents held out, and latency.

    python -m lab.retrieval.real_devset --devset /work/shared/devsets/mmlongbench-dev \
        --cache /tmp/devset-cache --json lab/retrieval/results/retrieval_mmlongbench_dev.json

The documents are ingested once (text layer, Tesseract OCR, every 120-word passage vector)
into `--cache`, which must lie outside the repository (the documents' license forbids
copying them or what is derived from them into it). Every configuration then ranks all
answerable questions over the whole collection with the service's `hybrid.search` through
`evaluate.rank_questions`, so latencies are measured side by side in one process.
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lab.retrieval.evaluate import (
    Corpus,
    CorpusPage,
    EvalQuestion,
    ingest_corpus,
    load_questions,
    rank_questions,
    score_rankings,
)
from lab.retrieval.run_bench import KS
from worker.retrieval.embedder import Embedder
from worker.retrieval.passages import DEFAULT_PASSAGES, embed_pages

EVIDENCE_TYPES = {"figure": ("Figure", "Chart"), "table": ("Table",),
                  "layout": ("Generalized-text (Layout)",), "text": ("Pure-text (Plain-text)",)}


@dataclass(frozen=True)
class Config:
    """One ranking configuration (weights as `rank_questions` takes them)."""

    name: str
    dense_mode: str = "mean"  # how a page's passage vectors are stored: "mean" or "max"
    kwargs: dict[str, float] = field(default_factory=dict)
    clean: bool = True  # rank with the question less its answer-format instructions


def load_corpus(pdfs: Path, cache: Path, embedder: Embedder) -> tuple[Corpus, np.ndarray,
                                                                       np.ndarray]:
    """The dev set's pages and every passage vector (rows, owning page), ingested once."""
    pages_path, rows_path, owners_path = (cache / "pages.json", cache / "passages.npy",
                                          cache / "owners.npy")
    if not (pages_path.exists() and rows_path.exists() and owners_path.exists()):
        cache.mkdir(parents=True, exist_ok=True)
        corpus = ingest_corpus(pdfs, ocr=True, embedder=None, workers=2)
        pages_path.write_text(json.dumps({
            "failed": corpus.failed, "seconds": corpus.seconds,
            "pages": [{"doc": p.doc, "page": p.page, "text": p.text, "source": p.source,
                       "context": p.context} for p in corpus.pages]}))
        matrices = embed_pages([p.text for p in corpus.pages], embedder,
                               replace(DEFAULT_PASSAGES, mode="max"),
                               contexts=[p.context for p in corpus.pages])
        np.save(owners_path, np.concatenate(
            [np.full(len(m), i, dtype=np.int32) for i, m in enumerate(matrices)
             if m is not None]))
        np.save(rows_path, np.concatenate([m for m in matrices if m is not None]))
    data = json.loads(pages_path.read_text())
    corpus = Corpus(pages=[CorpusPage(**p) for p in data["pages"]], failed=data["failed"],
                    seconds=data["seconds"])
    return corpus, np.load(rows_path), np.load(owners_path)


def with_vectors(corpus: Corpus, rows: np.ndarray, owners: np.ndarray, mode: str) -> Corpus:
    """`corpus` with each page's stored embedding: all passage rows ("max") or their
    renormalised mean ("mean", what ingestion stores by default)."""
    pages = []
    starts = np.flatnonzero(np.r_[True, owners[1:] != owners[:-1]])
    bounds = dict(zip(owners[starts].tolist(), zip(starts, np.r_[starts[1:], len(owners)],
                                                   strict=True), strict=True))
    for i, page in enumerate(corpus.pages):
        matrix = None
        if i in bounds:
            matrix = rows[bounds[i][0]:bounds[i][1]]
            if mode == "mean":
                mean = matrix.mean(axis=0)
                matrix = (mean / max(float(np.linalg.norm(mean)), 1e-12))[None, :]
        pages.append(replace(page, embedding=matrix))
    return Corpus(pages=pages, failed=corpus.failed, seconds=corpus.seconds)


def evidence_types(corpus: Corpus, row: dict, question: EvalQuestion) -> set[str]:
    """The evidence types of a question's gold pages; "image_only" when one was read by OCR."""
    sources = row.get("evidence_sources") or []
    types = {name for name, labels in EVIDENCE_TYPES.items()
             if any(s in labels for s in sources)}
    source_of = {(p.doc, p.page): p.source for p in corpus.pages}
    if any(source_of.get((str(question.doc), n)) == "ocr" for n in question.evidence_pages):
        types.add("image_only")
    return types


def score(corpus: Corpus, questions: list[EvalQuestion], rankings: list, types: list[set[str]],
          subset: list[int] | None = None) -> dict[str, object]:
    """Recall@k, hit@k, doc hit@k over `subset` (all by default), and recall@10 per type."""
    idx = list(range(len(questions))) if subset is None else subset
    out = score_rankings(corpus, [questions[i] for i in idx], [rankings[i] for i in idx], KS)
    per_type = {}
    for name in [*EVIDENCE_TYPES, "image_only"]:
        chosen = [i for i in idx if name in types[i]]
        scored = score_rankings(corpus, [questions[i] for i in chosen],
                                [rankings[i] for i in chosen], [10])
        per_type[name] = {"questions": len(chosen),
                          "recall@10": scored["page_recall"]["10"]}  # type: ignore[index]
    out["per_type"] = per_type
    return out


def run(corpora: dict[str, Corpus], questions: list[EvalQuestion], config: Config,
        embedder: Embedder) -> tuple[list, float]:
    """Rankings (depth 10) of every question under `config`, and seconds per question."""
    started = time.perf_counter()
    rankings = rank_questions(corpora[config.dense_mode], questions, within_doc=False,
                              depth=10, embedder=embedder, clean_query=config.clean,
                              **config.kwargs)
    return rankings, (time.perf_counter() - started) / max(len(questions), 1)


DEFAULT: dict[str, Any] = {"bm25_weight": 1.0, "dense_weight": 0.6, "rrf_k": 10.0}
RAW = "issue 17's start (hybrid 1:0.6, mean passage, k 10, whole question)"
NEW = "default now: + query cleaning"
CONFIGS = [
    Config("bm25 + OCR + context (no dense)", kwargs={**DEFAULT, "dense_weight": 0.0},
           clean=False),
    Config("dense only (mean passage)",
           kwargs={**DEFAULT, "bm25_weight": 0.0, "dense_weight": 1.0}, clean=False),
    Config(RAW, kwargs=DEFAULT, clean=False),
    Config("+ max passage", "max", DEFAULT, clean=False),
    Config("+ page references", kwargs={**DEFAULT, "ref_weight": 1.0}, clean=False),
    Config("bm25 + OCR + context, query cleaning", kwargs={**DEFAULT, "dense_weight": 0.0}),
    Config("dense only, query cleaning",
           kwargs={**DEFAULT, "bm25_weight": 0.0, "dense_weight": 1.0}),
    Config(NEW, kwargs=DEFAULT),
    Config("+ query cleaning + max passage", "max", DEFAULT),
    Config("+ query cleaning + page references", kwargs={**DEFAULT, "ref_weight": 1.0}),
]
GRID_CLEAN = [False, True]
GRID_MODES = ["mean", "max"]
GRID_DENSE = [0.6, 1.0]
GRID_REF = [0.0, 1.0]


def grid_configs() -> list[Config]:
    """Every combination of the `GRID_*` values (for weights chosen with documents held out)."""
    out = []
    for clean, mode, dense, ref in itertools.product(GRID_CLEAN, GRID_MODES, GRID_DENSE,
                                                     GRID_REF):
        out.append(Config(grid_name(clean, mode, dense, ref), mode,
                          {**DEFAULT, "dense_weight": dense, "ref_weight": ref}, clean))
    return out


def grid_name(clean: bool, mode: str, dense: float, ref: float) -> str:
    """The name of one grid configuration."""
    return f"{'clean' if clean else 'raw'} {mode} d{dense} ref{ref}"


def leave_documents_out(corpus: Corpus, questions: list[EvalQuestion], types: list[set[str]],
                        grid: dict[str, list]) -> dict[str, object]:
    """Split the documents in two halves (alternating in sorted order); choose the grid
    configuration with the best recall@10 (then @5) on one half's questions, report it on
    the other half's, both ways."""
    documents = sorted(corpus.documents())
    halves = [set(documents[0::2]), set(documents[1::2])]
    out: dict[str, object] = {}
    for tune, test in ((0, 1), (1, 0)):
        tune_q = [i for i, q in enumerate(questions) if q.doc in halves[tune]]
        test_q = [i for i, q in enumerate(questions) if q.doc in halves[test]]

        def key(name: str, idx: list[int]) -> tuple[float, float]:
            m = score(corpus, questions, grid[name], types, idx)
            recall = m["page_recall"]
            return recall["10"], recall["5"]  # type: ignore[index]

        best = max(grid, key=lambda name: key(name, tune_q))
        before, now = (grid_name(clean, "mean", 0.6, 0.0) for clean in (False, True))
        out[f"tuned_on_half_{tune}"] = {
            "chosen": best, "tune_questions": len(tune_q), "test_questions": len(test_q),
            "held_out": score(corpus, questions, grid[best], types, test_q),
            "held_out_default_before": score(corpus, questions, grid[before], types, test_q),
            "held_out_default_now": score(corpus, questions, grid[now], types, test_q)}
    return out


def row(name: str, metrics: dict, seconds: float) -> str:
    """One markdown table row: R@1/3/5/10, doc hit@10, recall@10 per type, ms per question."""
    r, d, t = metrics["page_recall"], metrics["doc_hit"], metrics["per_type"]
    cells = [r["1"], r["3"], r["5"], r["10"], d["10"]] + [t[k]["recall@10"] for k in t]
    return f"| {name} | " + " | ".join(f"{c:.3f}" for c in cells) + f" | {seconds * 1e3:.0f} |"


def main() -> None:
    """Command line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devset", type=Path, required=True)
    parser.add_argument("--cache", type=Path, required=True)
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument("--no-grid", action="store_true", help="skip leave-documents-out")
    parser.add_argument("--only", nargs="*", default=None,
                        help="run only the configurations whose name contains one of these")
    args = parser.parse_args()
    torch.set_num_threads(1)
    embedder = Embedder()
    base, rows, owners = load_corpus(args.devset / "pdfs", args.cache, embedder)
    corpora = {mode: with_vectors(base, rows, owners, mode) for mode in ("mean", "max")}
    questions = [q for q in load_questions(args.devset / "questions.jsonl") if q.evidence_pages]
    extra = {r["id"]: r for r in map(json.loads, (args.devset / "questions.jsonl")
                                     .read_text().splitlines()) if r.get("evidence_pages")}
    types = [evidence_types(base, extra[q.id], q) for q in questions]
    rank_questions(corpora["mean"], questions[:3], within_doc=False, depth=10,
                   embedder=embedder, **DEFAULT)  # warm: model, BM25 indexes
    results: dict[str, object] = {
        "devset": {"documents": len(base.documents()), "pages": len(base.pages),
                   "ocr_pages": sum(p.source == "ocr" for p in base.pages),
                   "questions": len(questions), "ingest_s": round(base.seconds, 1)},
        "configs": {}}
    header = ("| configuration | R@1 | R@3 | R@5 | R@10 | doc hit@10 | "
              + " | ".join(f"{k} @10" for k in [*EVIDENCE_TYPES, "image_only"]) + " | ms/q |")
    print(header, flush=True)
    for config in CONFIGS:
        if args.only and not any(part in config.name for part in args.only):
            continue
        rankings, seconds = run(corpora, questions, config, embedder)
        metrics = score(base, questions, rankings, types)
        results["configs"][config.name] = {  # type: ignore[index]
            "dense_mode": config.dense_mode, **config.kwargs, **metrics,
            "ms_per_question": round(seconds * 1e3, 1)}
        print(row(config.name, metrics, seconds), flush=True)
    if not args.no_grid:
        grid = {c.name: run(corpora, questions, c, embedder)[0] for c in grid_configs()}
        results["leave_documents_out"] = leave_documents_out(base, questions, types, grid)
        print(json.dumps(results["leave_documents_out"], indent=1), flush=True)
    args.json.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
