"""`conduit index rebuild|check`: the persistent retrieval indexes by hand."""

from __future__ import annotations

import argparse
import json
from typing import Any


def add_index_commands(sub: Any) -> None:
    """Register `index` on the top-level subparsers."""
    index = sub.add_parser("index", help="persistent retrieval indexes").add_subparsers()
    rebuild = index.add_parser("rebuild", help="rebuild retrieval indexes from the store")
    rebuild.add_argument("--collection", default=None,
                         help="one collection id (default: every collection with an index)")
    rebuild.set_defaults(func=_rebuild)
    check = index.add_parser("check", help="compare retrieval indexes with the store")
    check.add_argument("--collection", default=None)
    check.set_defaults(func=_check)


def _collections(args: argparse.Namespace) -> tuple[Any, list[str]]:
    from worker.context import build_context
    from worker.retrieval.index.pipeline import retrieval_indexes
    from worker.settings import Settings

    ctx = build_context(Settings())
    indexes = retrieval_indexes(ctx)
    ids = [args.collection] if args.collection else indexes.indexed_collections()
    return ctx, ids


def _rebuild(args: argparse.Namespace) -> int:
    import time

    from worker.retrieval.index.pipeline import retrieval_indexes

    ctx, ids = _collections(args)
    for collection_id in ids:
        t0 = time.perf_counter()
        pages = retrieval_indexes(ctx).rebuild(ctx.meta, collection_id)
        print(f"{collection_id}: {pages} pages in {time.perf_counter() - t0:.1f} s")
    ctx.close()
    return 0


def _check(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from worker.retrieval.index.pipeline import retrieval_indexes

    ctx, ids = _collections(args)
    checks = [retrieval_indexes(ctx).check(ctx.meta, c) for c in ids]
    print(json.dumps([asdict(c) for c in checks], indent=2))
    ctx.close()
    return 0 if all(c.state == "ok" for c in checks) else 1

