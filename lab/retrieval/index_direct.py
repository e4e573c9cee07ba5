"""The index path alone at a given size, built straight from synthetic pages (no metadata
store), for machines too slow to run `conduit-lab bench retrieval-scale` at 100k pages:

    python -m lab.retrieval.index_direct --pages 100000 --out FILE

Query embeddings are computed once up front (the embedder caches them), so the timings are the
index's own: BM25, dense scoring, fusion and reopening after a commit. Prints and writes one
JSON object.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from lab.retrieval.scale import PAGES_PER_DOC, PageMaker
from lab.retrieval.scale_probe import current_rss_mb
from worker.retrieval.embedder import Embedder
from worker.retrieval.index.files import set_current
from worker.retrieval.index.maintain import index_document
from worker.retrieval.index.reader import IndexReader
from worker.retrieval.index.search import search_index
from worker.retrieval.index.writer import apply, create_version


def main() -> None:
    """Command line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=100_000)
    parser.add_argument("--questions", type=int, default=30)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    embedder = Embedder()
    maker = PageMaker(seed=args.pages)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        version = folder / "v1"
        create_version(version)
        set_current(folder, version)
        sample = []
        t0 = time.perf_counter()
        for start in range(0, args.pages // PAGES_PER_DOC, 200):
            docs = [maker.document(0) for _ in range(min(200, args.pages // PAGES_PER_DOC
                                                         - start))]
            sample += [pages[3] for _, pages in docs[:2]]
            apply(version, add=[index_document(d, pages) for d, pages in docs])
        build_ms = 1000 * (time.perf_counter() - t0) / args.pages
        questions = [maker.question(p) for p in sample[:args.questions]]
        for q in questions:
            embedder.embed_query(q)
        baseline = current_rss_mb()
        reader = IndexReader(folder)
        t0 = time.perf_counter()
        search_index(reader, questions[0], top_k=5, embedder=embedder, dense_weight=0.6)
        restart_ms = 1000 * (time.perf_counter() - t0)
        warm = []
        for q in questions[1:]:
            t0 = time.perf_counter()
            search_index(reader, q, top_k=5, embedder=embedder, dense_weight=0.6)
            warm.append(1000 * (time.perf_counter() - t0))
        update, cold = [], []
        for _ in range(3):
            doc_id, pages = maker.document(0)
            t0 = time.perf_counter()
            apply(version, add=[index_document(doc_id, pages)])
            update.append(1000 * (time.perf_counter() - t0) / len(pages))
            q = maker.question(pages[3])
            embedder.embed_query(q)
            t0 = time.perf_counter()
            search_index(reader, q, top_k=5, embedder=embedder, dense_weight=0.6)
            cold.append(1000 * (time.perf_counter() - t0))
        resident = current_rss_mb()
        size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) / 2**20
    result = {"pages": args.pages, "path": "index (direct, query embeddings cached)",
              "build_ms_per_page": round(build_ms, 3),
              "restart_first_ms": round(restart_ms, 2),
              "warm_p50_ms": round(float(np.median(warm)), 2),
              "cold_after_insert_ms": round(float(np.median(cold)), 2),
              "update_ms_per_page": round(float(np.median(update)), 3),
              "rss_mb_above_baseline": round(resident - baseline, 1), "index_mb": round(size, 1)}
    print(json.dumps(result), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
