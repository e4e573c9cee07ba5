"""Measure page retrieval on a dev set: BM25 vs dense vs hybrid, OCR on/off, document
context on/off, passage modes, fusion weights.

    python -m lab.retrieval.devsets.make_devset --out /tmp/devset
    python -m lab.retrieval.run_bench --devset /tmp/devset \
        --json lab/retrieval/results/retrieval_devset.json
    python -m lab.retrieval.devsets.hard_devset --out /tmp/hardset
    python -m lab.retrieval.run_bench --devset /tmp/hardset --preset hard \
        --json lab/retrieval/results/retrieval_hardset.json

Ingests the PDFs once with OCR and once without (text layers only; cached as JSON in the
dev set folder), embeds every page once per (OCR, passage mode, context) it needs (cached
as .npy), then ranks all questions under each configuration, over the whole collection and
within each question's document. Prints markdown tables; writes every number to --json.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

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
from worker.retrieval.document_context import document_context
from worker.retrieval.embedder import EMBEDDING_DIM, Embedder
from worker.retrieval.fusion import DEFAULT_RRF_K
from worker.retrieval.passages import DEFAULT_PASSAGES, PassageMode, embed_pages

KS = [1, 3, 5, 10]
# Document context per page: none; full (file name, PDF title, first-page words: what
# ingestion stores); or the first page's words only (opaque file names, no PDF titles).
ContextKind = Literal["none", "full", "first_page"]
BREAKDOWNS = ("style", "page_kind", "family", "image_only", "multi_page", "named")


@dataclass(frozen=True)
class Config:
    """One retrieval configuration of the benchmark."""

    name: str
    ocr: bool = True
    context: ContextKind = "full"
    mode: PassageMode = "mean"
    bm25: float = 1.0
    dense: float = 0.0
    rrf_k: float = DEFAULT_RRF_K
    detail: bool = False  # also break the metrics down by question fields


PRESETS: dict[str, list[Config]] = {
    "devset": [
        Config("bm25, no OCR, no context", ocr=False, context="none"),
        Config("bm25, no context", context="none", detail=True),
        Config("dense max-passage, no context", context="none", mode="max", bm25=0, dense=1),
        Config("dense mean-passage, no context", context="none", bm25=0, dense=1),
        Config("dense truncated, no context", context="none", mode="first", bm25=0, dense=1),
        Config("hybrid 1:0.6 k=60, no context", context="none", dense=0.6, rrf_k=60),
        Config("hybrid 1:0.6, no context", context="none", dense=0.6, detail=True),
        Config("hybrid 1:0.6, no OCR, no context", ocr=False, context="none", dense=0.6),
        Config("bm25 + context", detail=True),
        Config("dense + context", bm25=0, dense=1),
        Config("hybrid 1:0.3 + context", dense=0.3),
        Config("hybrid 1:0.6 k=60 + context", dense=0.6, rrf_k=60),
        Config("hybrid 1:0.6 + context (default)", dense=0.6, detail=True),
        Config("hybrid 1:1 + context", dense=1),
        Config("hybrid 1:0.6 + context, max-passage", dense=0.6, mode="max"),
    ],
    "hard": [
        Config("bm25, text layer only (baseline)", ocr=False, context="none", detail=True),
        Config("bm25 + OCR", context="none", detail=True),
        Config("bm25 + OCR + context", detail=True),
        Config("dense + OCR, no context", context="none", bm25=0, dense=1),
        Config("dense + OCR + context", bm25=0, dense=1, detail=True),
        Config("hybrid 1:0.6 k=60 + OCR, no context", context="none", dense=0.6, rrf_k=60),
        Config("hybrid 1:0.6 + OCR, no context", context="none", dense=0.6, detail=True),
        Config("hybrid 1:0.3 + OCR + context", dense=0.3),
        Config("hybrid 1:0.6 k=60 + OCR + context", dense=0.6, rrf_k=60, detail=True),
        Config("hybrid 1:0.6 + OCR + context (default)", dense=0.6, detail=True),
        Config("hybrid 1:1 + OCR + context", dense=1),
        Config("hybrid 1:0.6 + OCR + context, max-passage", dense=0.6, mode="max"),
        Config("hybrid 1:0.6 + OCR + first-page context only", context="first_page", dense=0.6,
           detail=True),
        Config("hybrid 1:0.6 + context, no OCR", ocr=False, dense=0.6, detail=True),
    ],
}


def cached_corpus(pdfs: Path, ocr: bool, cache: Path) -> Corpus:
    """Ingest once per dev set and OCR setting; later runs read the page texts from JSON."""
    if cache.exists() and cache.stat().st_mtime > max(p.stat().st_mtime
                                                      for p in pdfs.glob("*.pdf")):
        data = json.loads(cache.read_text())
        return Corpus(pages=[CorpusPage(**p) for p in data["pages"]], failed=data["failed"],
                      seconds=data["seconds"])
    corpus = ingest_corpus(pdfs, ocr=ocr, embedder=None)
    cache.write_text(json.dumps({
        "pages": [{"doc": p.doc, "page": p.page, "text": p.text, "source": p.source,
                   "context": p.context} for p in corpus.pages],
        "failed": corpus.failed, "seconds": corpus.seconds}))
    return corpus


def with_context_kind(corpus: Corpus, kind: ContextKind) -> Corpus:
    """`corpus` with every page's document context as `kind` says."""
    first: dict[str, str] = {}
    for page in corpus.pages:
        first.setdefault(page.doc, page.text)
    contexts = {"none": lambda p: "", "full": lambda p: p.context,
                "first_page": lambda p: document_context("", None, first[p.doc])}
    return Corpus(pages=[replace(p, context=contexts[kind](p)) for p in corpus.pages],
                  failed=dict(corpus.failed), seconds=corpus.seconds)


class Embeddings:
    """Page embeddings per (OCR, passage mode, context), computed once and cached as .npz."""

    def __init__(self, folder: Path, embedder: Embedder) -> None:
        self.folder, self.embedder = folder, embedder
        self.seconds: dict[str, float] = {}

    def get(self, corpus: Corpus, ocr: bool, mode: PassageMode, context: ContextKind
            ) -> list[np.ndarray | None]:
        """One matrix per page of `corpus` (the OCR or text-layer corpus with `context`
        applied): `(n, 384)` rows for "max", one row otherwise; None for a page without text."""
        tag = f"{'ocr' if ocr else 'text'}_{mode}_{context}"
        path = self.folder / f"emb_{tag}.npz"
        source = self.folder / f"corpus_{'ocr' if ocr else 'text'}.json"
        if path.exists() and path.stat().st_mtime > source.stat().st_mtime:
            with np.load(path, allow_pickle=False) as data:
                rows, owners = data["rows"], data["owners"]
        else:
            started = time.perf_counter()
            matrices = embed_pages(
                [p.text for p in corpus.pages], self.embedder,
                replace(DEFAULT_PASSAGES, mode=mode),
                contexts=None if context == "none" else [p.context for p in corpus.pages])
            self.seconds[tag] = round(time.perf_counter() - started, 1)
            owners = np.concatenate([np.full(len(m), i) for i, m in enumerate(matrices)
                                     if m is not None] or [np.zeros(0, dtype=np.int64)])
            rows = np.concatenate([m for m in matrices if m is not None]
                                  or [np.zeros((0, EMBEDDING_DIM), np.float32)])
            np.savez(path, rows=rows, owners=owners)
        out: list[np.ndarray | None] = [None] * len(corpus.pages)
        for i in np.unique(owners):
            out[int(i)] = rows[owners == i]
        return out


def breakdown(corpus: Corpus, questions: list[EvalQuestion], rankings: list, extra: list[dict],
              field: str) -> dict[str, dict[str, object]]:
    """Metrics per value of a question field (style, page_kind, image_only, ...)."""
    out = {}
    for value in sorted({str(row[field]) for row in extra}):
        idx = [i for i, row in enumerate(extra) if str(row[field]) == value]
        out[value] = score_rankings(corpus, [questions[i] for i in idx],
                                    [rankings[i] for i in idx], KS)
    return out


def main() -> None:
    """Command line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devset", type=Path, required=True)
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument("--preset", choices=sorted(PRESETS), default="devset")
    args = parser.parse_args()
    questions = load_questions(args.devset / "questions.jsonl")
    extra = [json.loads(line) for line in
             (args.devset / "questions.jsonl").read_text().splitlines() if line.strip()]
    torch.set_num_threads(1)  # stable timings on a shared 2-core machine
    embedder = Embedder()
    pdfs = args.devset / "pdfs"
    corpora = {True: cached_corpus(pdfs, True, args.devset / "corpus_ocr.json"),
               False: cached_corpus(pdfs, False, args.devset / "corpus_text.json")}
    with_ocr = corpora[True]
    print(f"ingested: {len(with_ocr.pages)} pages in {with_ocr.seconds:.0f} s", flush=True)
    embeddings = Embeddings(args.devset, embedder)
    fields = [f for f in BREAKDOWNS if extra and f in extra[0]]
    results: dict[str, dict[str, dict]] = {}
    for scope in ("collection", "within_doc"):
        rows: dict[str, dict] = {}
        for config in PRESETS[args.preset]:
            base = with_context_kind(corpora[config.ocr], config.context)
            matrices = (embeddings.get(base, config.ocr, config.mode, config.context)
                        if config.dense else [None] * len(base.pages))
            corpus = Corpus(pages=[replace(p, embedding=m)
                                   for p, m in zip(base.pages, matrices, strict=True)],
                            failed=dict(base.failed))
            t0 = time.perf_counter()
            ranked = rank_questions(corpus, questions, within_doc=scope == "within_doc",
                                    bm25_weight=config.bm25, dense_weight=config.dense,
                                    rrf_k=config.rrf_k,
                                    embedder=embedder if config.dense else None)
            row: dict = score_rankings(corpus, questions, ranked, KS)
            row["ms_per_question"] = round(1000 * (time.perf_counter() - t0) / len(questions), 1)
            if config.detail:
                for f in fields:
                    row[f"by_{f}"] = breakdown(corpus, questions, ranked, extra, f)
            rows[config.name] = row
            print(f"{scope:10s} {config.name:45s} R@1={row['page_recall']['1']:.3f} "
                  f"R@10={row['page_recall']['10']:.3f}", flush=True)
        results[scope] = rows
    summary = {
        "devset": {"folder": str(args.devset), "documents": len(with_ocr.documents()),
                   "pages": len(with_ocr.pages),
                   "ocr_pages": sum(p.source == "ocr" for p in with_ocr.pages),
                   "questions": len(questions), "preset": args.preset},
        "ingest_s": {"with_ocr": round(with_ocr.seconds, 1),
                     "text_layer_only": round(corpora[False].seconds, 1)},
        "embed_s": embeddings.seconds,
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "configs": {c.name: c.__dict__ for c in PRESETS[args.preset]},
        "results": results,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(summary, indent=1) + "\n")
    for scope, scope_rows in results.items():
        print(f"\n### {scope}\n")
        print("| config | R@1 | R@3 | R@5 | R@10 | doc hit@1 | ms/q |")
        print("|---|---|---|---|---|---|---|")
        for name, row in scope_rows.items():
            r = row["page_recall"]
            print(f"| {name} | {r['1']:.3f} | {r['3']:.3f} | {r['5']:.3f} | {r['10']:.3f} | "
                  f"{row['doc_hit']['1']:.3f} | {row['ms_per_question']} |")


if __name__ == "__main__":
    main()
