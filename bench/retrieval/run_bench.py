"""Measure page retrieval on the dev set: BM25 vs dense vs hybrid, OCR on/off, passage modes.

    python -m bench.retrieval.make_devset --out /tmp/devset
    python -m bench.retrieval.run_bench --devset /tmp/devset \
        --json bench/results/retrieval_devset.json

Ingests the PDFs once with OCR and once without (text layers only), embeds every page once
per passage mode, then ranks all questions under each configuration, over the whole
collection and within each question's document. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from worker.retrieval.embedder import Embedder
from worker.retrieval.evaluate import (
    Corpus,
    CorpusPage,
    EvalQuestion,
    ingest_corpus,
    load_questions,
    rank_questions,
    score_rankings,
)
from worker.retrieval.passages import DEFAULT_PASSAGES, embed_pages

KS = [1, 3, 5, 10]


def with_embeddings(corpus: Corpus, matrices: Sequence[np.ndarray | None]) -> Corpus:
    """A copy of `corpus` whose pages carry `matrices`."""
    pages = [replace(p, embedding=m) for p, m in zip(corpus.pages, matrices, strict=True)]
    return Corpus(pages=pages, failed=dict(corpus.failed), seconds=corpus.seconds)


def cached_corpus(pdfs: Path, ocr: bool, cache: Path) -> Corpus:
    """Ingest once per dev set and OCR setting; later runs read the page texts from JSON."""
    if cache.exists() and cache.stat().st_mtime > max(p.stat().st_mtime
                                                      for p in pdfs.glob("*.pdf")):
        data = json.loads(cache.read_text())
        return Corpus(pages=[CorpusPage(**p) for p in data["pages"]], failed=data["failed"],
                      seconds=data["seconds"])
    corpus = ingest_corpus(pdfs, ocr=ocr, embedder=None)
    cache.write_text(json.dumps({
        "pages": [{"doc": p.doc, "page": p.page, "text": p.text, "source": p.source}
                  for p in corpus.pages],
        "failed": corpus.failed, "seconds": corpus.seconds}))
    return corpus


def mode_embeddings(corpus: Corpus, embedder: Embedder) -> dict[str, list[np.ndarray | None]]:
    """Page embeddings per passage mode: all windows (max), their mean, or truncation."""
    texts = [p.text for p in corpus.pages]
    windows = embed_pages(texts, embedder, replace(DEFAULT_PASSAGES, mode="max"))
    means: list[np.ndarray | None] = []
    for m in windows:
        if m is None:
            means.append(None)
            continue
        v = m.mean(axis=0)
        means.append((v / np.linalg.norm(v))[None, :].astype(np.float32))
    present = [i for i, t in enumerate(texts) if t.strip()]
    truncated: list[np.ndarray | None] = [None] * len(texts)
    for i, row in zip(present, embedder.embed([texts[i] for i in present]), strict=True):
        truncated[i] = row[None, :]
    return {"max": windows, "mean": means, "truncate": truncated}


def breakdown(corpus: Corpus, questions: list[EvalQuestion], rankings: list, extra: list[dict],
              field: str) -> dict[str, dict[str, object]]:
    """Metrics per value of a question field (style, page_kind, family)."""
    out = {}
    for value in sorted({row[field] for row in extra}):
        idx = [i for i, row in enumerate(extra) if row[field] == value]
        out[value] = score_rankings(corpus, [questions[i] for i in idx],
                                    [rankings[i] for i in idx], KS)
    return out


def main() -> None:
    """Command line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devset", type=Path, required=True)
    parser.add_argument("--json", type=Path, required=True)
    args = parser.parse_args()
    questions = load_questions(args.devset / "questions.jsonl")
    extra = [json.loads(line) for line in
             (args.devset / "questions.jsonl").read_text().splitlines() if line.strip()]
    torch.set_num_threads(1)  # stable timings on a shared 2-core machine
    embedder = Embedder()
    pdfs = args.devset / "pdfs"
    with_ocr = cached_corpus(pdfs, True, args.devset / "corpus_ocr.json")
    without_ocr = cached_corpus(pdfs, False, args.devset / "corpus_text_layer.json")
    print(f"ingested: {len(with_ocr.pages)} pages in {with_ocr.seconds:.0f} s", flush=True)
    started = time.perf_counter()
    modes = mode_embeddings(with_ocr, embedder)
    embed_s = time.perf_counter() - started
    print(f"embedded in {embed_s:.0f} s", flush=True)
    plain = mode_embeddings(without_ocr, embedder)["mean"]
    corpora = {"ocr": {m: with_embeddings(with_ocr, e) for m, e in modes.items()},
               "no_ocr": {"mean": with_embeddings(without_ocr, plain)}}
    configs = [  # name, ocr, passage mode, bm25 weight, dense weight
        ("bm25", "ocr", "max", 1.0, 0.0),
        ("bm25 (no OCR)", "no_ocr", "mean", 1.0, 0.0),
        ("dense max-passage", "ocr", "max", 0.0, 1.0),
        ("dense mean-passage", "ocr", "mean", 0.0, 1.0),
        ("dense truncated", "ocr", "truncate", 0.0, 1.0),
        ("hybrid max-passage", "ocr", "max", 1.0, 1.0),
        ("hybrid mean-passage", "ocr", "mean", 1.0, 1.0),
        ("hybrid truncated", "ocr", "truncate", 1.0, 1.0),
        ("hybrid mean-passage (no OCR)", "no_ocr", "mean", 1.0, 1.0),
        ("hybrid mean, dense weight 0.7", "ocr", "mean", 1.0, 0.7),
        ("hybrid mean, dense weight 0.5", "ocr", "mean", 1.0, 0.5),
        ("hybrid mean, dense weight 0.25", "ocr", "mean", 1.0, 0.25),
        ("hybrid mean, dense weight 2", "ocr", "mean", 1.0, 2.0),
    ]
    results: dict[str, object] = {}
    for scope in ("collection", "within_doc"):
        rows = {}
        for name, ocr, mode, bw, dw in configs:
            corpus = corpora[ocr][mode]
            t0 = time.perf_counter()
            ranked = rank_questions(corpus, questions, within_doc=scope == "within_doc",
                                    bm25_weight=bw, dense_weight=dw,
                                    embedder=embedder if dw else None)
            row = score_rankings(corpus, questions, ranked, KS)
            row["ms_per_question"] = round(1000 * (time.perf_counter() - t0) / len(questions), 1)
            if name in ("bm25", "dense mean-passage", "hybrid mean-passage",
                        "hybrid mean, dense weight 0.5"):
                row["by_style"] = breakdown(corpus, questions, ranked, extra, "style")
                row["by_page_kind"] = breakdown(corpus, questions, ranked, extra, "page_kind")
            rows[name] = row
            print(f"{scope:10s} {name:30s} R@1={row['page_recall']['1']:.3f} "
                  f"R@10={row['page_recall']['10']:.3f}", flush=True)
        results[scope] = rows
    summary = {
        "devset": {"documents": len(with_ocr.documents()), "pages": len(with_ocr.pages),
                   "ocr_pages": sum(p.source == "ocr" for p in with_ocr.pages),
                   "questions": len(questions),
                   "generator": "python -m bench.retrieval.make_devset --seed 7"},
        "ingest_s": {"with_ocr": round(with_ocr.seconds, 1),
                     "text_layer_only": round(without_ocr.seconds, 1),
                     "embed_all_modes": round(embed_s, 1)},
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "results": results,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(summary, indent=1) + "\n")
    for scope, rows in results.items():
        print(f"\n### {scope}\n")
        print("| config | R@1 | R@3 | R@5 | R@10 | doc hit@1 | ms/q |")
        print("|---|---|---|---|---|---|---|")
        for name, row in rows.items():
            r = row["page_recall"]
            print(f"| {name} | {r['1']:.3f} | {r['3']:.3f} | {r['5']:.3f} | {r['10']:.3f} | "
                  f"{row['doc_hit']['1']:.3f} | {row['ms_per_question']} |")


if __name__ == "__main__":
    main()
