"""`conduit index rebuild|check`: the persistent retrieval indexes by hand."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from worker.facade import Worker


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


def _collections(args: argparse.Namespace) -> tuple[Worker, list[str]]:
    from worker.facade import Worker
    from worker.settings import Settings

    worker = Worker.local(Settings())
    ids = [args.collection] if args.collection else worker.indexed_collections()
    return worker, ids


def _rebuild(args: argparse.Namespace) -> int:
    import time

    worker, ids = _collections(args)
    for collection_id in ids:
        t0 = time.perf_counter()
        pages = worker.rebuild_index(collection_id)
        print(f"{collection_id}: {pages} pages in {time.perf_counter() - t0:.1f} s")
    worker.close()
    return 0


def _check(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    worker, ids = _collections(args)
    checks = [worker.check_index(c) for c in ids]
    print(json.dumps([asdict(c) for c in checks], indent=2))
    worker.close()
    return 0 if all(c.state == "ok" for c in checks) else 1

