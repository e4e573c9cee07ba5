"""Tool subcommands of `conduit`: `worker`, `eval fidelity|retrieval` and `bench store|ttft`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def add_tool_commands(sub: Any) -> None:
    """Register the tool subcommands on the top-level subparsers."""
    work = sub.add_parser("worker", help="run a Celery worker (needs CONDUIT_REDIS_URL)")
    work.add_argument("--concurrency", type=int, default=1)
    work.set_defaults(func=_worker)

    ev = sub.add_parser("eval", help="quality evaluations").add_subparsers()
    retr = ev.add_parser("retrieval", help="page retrieval recall over a folder of PDFs")
    retr.add_argument("--pdfs", type=Path, required=True)
    retr.add_argument("--questions", type=Path, required=True)
    retr.add_argument("--out", type=Path, required=True)
    retr.add_argument("--k", type=_ints, default=[1, 3, 5, 10])
    retr.add_argument("--within-doc", action="store_true")
    retr.add_argument("--no-ocr", action="store_true")
    retr.set_defaults(func=_eval_retrieval)

    bench = sub.add_parser("bench", help="benchmarks").add_subparsers()
    store = bench.add_parser("store", help="KV store tier throughput vs raw ceilings")
    store.add_argument("--pages", type=int, default=16)
    store.add_argument("--redis-url", default=None)
    store.add_argument("--out", type=Path, default=Path("bench/results/store.json"))
    store.set_defaults(func=_bench_store)


def _eval_retrieval(args: argparse.Namespace) -> int:
    from worker.retrieval.evaluate import run_retrieval_eval

    summary = run_retrieval_eval(args.pdfs, args.questions, args.out, ks=args.k,
                                 within_doc=args.within_doc, ocr=not args.no_ocr)
    print(json.dumps(summary, indent=2))
    return 0


def _bench_store(args: argparse.Namespace) -> int:
    from bench.store import run_store_bench

    run_store_bench(pages=args.pages, redis_url=args.redis_url, out=args.out)
    return 0


def _worker(args: argparse.Namespace) -> int:
    from worker.celery_app import run_worker
    from worker.settings import Settings

    run_worker(Settings(), concurrency=args.concurrency)
    return 0
