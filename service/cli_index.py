"""`conduit index rebuild|check` and `conduit bench retrieval-scale`."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def add_index_commands(sub: Any, bench: Any) -> None:
    """Register `index` on the top-level subparsers and `retrieval-scale` under `bench`."""
    index = sub.add_parser("index", help="persistent retrieval indexes").add_subparsers()
    rebuild = index.add_parser("rebuild", help="rebuild retrieval indexes from the store")
    rebuild.add_argument("--collection", default=None,
                         help="one collection id (default: every collection with an index)")
    rebuild.set_defaults(func=_rebuild)
    check = index.add_parser("check", help="compare retrieval indexes with the store")
    check.add_argument("--collection", default=None)
    check.set_defaults(func=_check)

    scale = bench.add_parser("retrieval-scale", help="question latency, RSS and disk of the "
                             "retrieval index vs the scan path over synthetic collections")
    scale.add_argument("--pages", type=_ints, default=[1000, 10000, 100000])
    scale.add_argument("--store", default="sqlite,redis", help="sqlite, redis or both")
    scale.add_argument("--questions", type=int, default=30, help="warm questions per row")
    scale.add_argument("--inserts", type=int, default=3,
                       help="documents added one at a time, each followed by a question")
    scale.add_argument("--scan-max-pages", type=int, default=100_000,
                       help="measure the scan path only up to this many pages")
    scale.add_argument("--work", type=Path, default=None,
                       help="scratch folder (default: a temporary one, removed after)")
    scale.add_argument("--out", type=Path, default=Path("bench/results/retrieval_scale.json"))
    scale.set_defaults(func=_bench_scale)


def _collections(args: argparse.Namespace) -> tuple[Any, list[str]]:
    from worker.context import build_context
    from worker.retrieval_index import retrieval_indexes
    from worker.settings import Settings

    ctx = build_context(Settings())
    indexes = retrieval_indexes(ctx)
    ids = [args.collection] if args.collection else indexes.indexed_collections()
    return ctx, ids


def _rebuild(args: argparse.Namespace) -> int:
    import time

    from worker.retrieval_index import retrieval_indexes

    ctx, ids = _collections(args)
    for collection_id in ids:
        t0 = time.perf_counter()
        pages = retrieval_indexes(ctx).rebuild(ctx.meta, collection_id)
        print(f"{collection_id}: {pages} pages in {time.perf_counter() - t0:.1f} s")
    ctx.close()
    return 0


def _check(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from worker.retrieval_index import retrieval_indexes

    ctx, ids = _collections(args)
    checks = [retrieval_indexes(ctx).check(ctx.meta, c) for c in ids]
    print(json.dumps([asdict(c) for c in checks], indent=2))
    ctx.close()
    return 0 if all(c.state == "ok" for c in checks) else 1


def _bench_scale(args: argparse.Namespace) -> int:
    from bench.retrieval_scale import run_retrieval_scale

    stores = [s for s in args.store.split(",") if s]
    run_retrieval_scale(pages=args.pages, stores=stores, questions=args.questions,
                        inserts=args.inserts, work=args.work, out=args.out,
                        scan_max_pages=args.scan_max_pages,
                        command="conduit " + " ".join(sys.argv[1:]))
    return 0
