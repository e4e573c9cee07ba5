"""One measuring process of `lab.retrieval.scale` (run by it; prints one JSON line).

Argument: a JSON object with store, home, redis_url, prefix, collection, path ("index" or
"scan"), questions, inserts and seed.
"""

from __future__ import annotations

import json
import resource
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch


def current_rss_mb() -> float:
    """This process's resident set size now (Linux)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def main(args: dict[str, Any]) -> dict[str, Any]:
    """Measure one path in this fresh process."""
    from lab.retrieval.scale import PageMaker, add_ready_document
    from storage.metadata import CollectionId
    from worker.answer_job import Question, retrieve
    from worker.context import build_context
    from worker.retrieval.index.pipeline import on_document_ready
    from worker.settings import Settings

    torch.set_num_threads(1)
    settings = Settings(home=Path(args["home"]), redis_url=args["redis_url"] if
                        args["store"] == "redis" else None,
                        retrieval_index=args["path"] == "index")
    ctx = build_context(settings)
    if args["store"] == "redis":
        from storage.metadata import RedisMetadataStore

        ctx.meta.close()
        ctx.meta = RedisMetadataStore(args["redis_url"], prefix=args["prefix"])
    ctx.embedder.embed_query("warm up the embedder")
    baseline_mb = current_rss_mb()
    collection = CollectionId(args["collection"])

    def ask(text: str) -> float:
        t0 = time.perf_counter()
        hits = retrieve(ctx, Question(collection_id=collection, question=text, top_k=5,
                                      max_new_tokens=1))
        assert hits
        return 1000 * (time.perf_counter() - t0)

    questions: list[str] = args["questions"]
    restart_ms = ask(questions[0])
    warm = [ask(q) for q in questions[1:]] or [ask(questions[0])]
    embed = []  # the query embedding alone: the same in both paths, and the most noisy part
    for q in questions[1:]:
        t0 = time.perf_counter()
        ctx.embedder.embed_query(q + " please")  # not a cached query
        embed.append(1000 * (time.perf_counter() - t0))
    maker = PageMaker(seed=args["seed"])
    cold, update = [], []
    for i in range(args["inserts"]):
        doc_id, pages = maker.document(i)
        add_ready_document(ctx.meta, collection, doc_id, pages)
        t0 = time.perf_counter()
        on_document_ready(ctx, collection, doc_id, pages)
        update.append(1000 * (time.perf_counter() - t0) / len(pages))
        cold.append(ask(maker.question(pages[3])))
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"warm_p50_ms": round(float(np.median(warm)), 2),
            "cold_after_insert_ms": round(float(np.median(cold)), 2) if cold else None,
            "restart_first_ms": round(restart_ms, 2),
            "rss_mb": round(peak_mb - baseline_mb, 1),
            "update_ms_per_page": round(float(np.median(update)), 3)
            if update and args["path"] == "index" else None,
            "warm_questions": len(warm),
            "embed_query_p50_ms": round(float(np.median(embed)), 2) if embed else None}


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))))
