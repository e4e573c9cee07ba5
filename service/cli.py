"""The `conduit` command line: serve, ingest, ask, worker and index.

`ingest` and `ask` run the pipeline in this process against the stores the settings name
(embedded: the home dir), so they work with no server running. Benchmarks, evaluations and
the testbed are the lab's command, `conduit-lab` (lab/cli.py).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from service.cli_index import add_index_commands
from worker.settings import Settings

if TYPE_CHECKING:
    from storage.conversations import Conversation
    from storage.metadata import CollectionId
    from worker.facade import Worker


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `conduit` console script."""
    return run(_parser(), argv)


def run(parser: argparse.ArgumentParser, argv: Sequence[str] | None = None) -> int:
    """Parse `argv` with `parser`, set up logging (`-v`) and run the chosen command."""
    args = parser.parse_args(argv)
    if not args.verbose:  # before transformers is imported: it reads these once
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # "Loading weights" bars
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not hasattr(args, "func"):
        parser.print_help()
        return 2
    code: int = args.func(args)
    return code


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="conduit", description=__doc__)
    p.add_argument("-v", "--verbose", action="store_true", help="log progress")
    sub = p.add_subparsers()

    serve = sub.add_parser("serve", help="run the HTTP service")
    serve.add_argument("--host", default="127.0.0.1",
                       help="address to bind; not a loopback one without API keys unless "
                       "--allow-open")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--allow-open", action="store_true",
                       help="bind a non-loopback address with no API keys (as "
                       "CONDUIT_ALLOW_OPEN_NETWORK=1; only loopback Host names are answered)")
    serve.set_defaults(func=_serve)

    ingest = sub.add_parser("ingest", help="ingest documents (PDFs, images, "
                            "Office files, e-books, text) into a collection")
    ingest.add_argument("paths", nargs="+", type=Path)
    ingest.add_argument("--collection", required=True)
    ingest.add_argument("--password", default=None, help="password of encrypted PDFs")
    ingest.set_defaults(func=_ingest)

    ask = sub.add_parser("ask", help="ask a question over a collection")
    ask.add_argument("question")
    ask.add_argument("--collection", required=True)
    ask.add_argument("--top-k", type=int, default=None)
    ask.add_argument("--max-new-tokens", type=int, default=None)
    ask.add_argument("--policy", default=None)
    ask.add_argument("--budget", type=float, default=None)
    ask.add_argument("--gamma", type=float, default=None, help="CONDUIT amplification exponent")
    ask.add_argument("--score-layers", default=None, help="'all', 'start:stop' or a depth "
                     "in (0, 1] (the first share of the layers); unset: the policy's own "
                     "('all' for conduit, 0.8 for conduit_per_page)")
    ask.add_argument("--query-window", type=int, default=None)
    ask.add_argument("--head-agg", choices=["mean", "max"], default=None)
    ask.add_argument("--json", action="store_true", help="print the full answer as JSON")
    ask.add_argument("--conversation", default=None, metavar="ID",
                     help="ask as the next turn of this stored conversation ('new' starts one "
                     "over the collection and prints its id)")
    ask.set_defaults(func=_ask)

    work = sub.add_parser("worker", help="run a Celery worker (needs CONDUIT_REDIS_URL)")
    work.add_argument("--concurrency", type=int, default=2,
                      help="ingest jobs at once beside a full answer batch: the worker runs "
                      "CONDUIT_MAX_ACTIVE_ANSWERS + concurrency - 1 task threads")
    work.add_argument("--queues", default="conduit.answer,conduit.ingest",
                      help="comma-separated queues to consume")
    work.set_defaults(func=_worker)

    add_index_commands(sub)
    return p


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from service.app import create_app
    from service.auth import KeyRing
    from service.connections import uvicorn_options
    from service.hardening import check_bind
    from worker.facade import freeze_long_lived

    settings = Settings()
    refusal = check_bind(args.host, keys=KeyRing.from_settings(settings).enabled,
                         allow_open=args.allow_open or settings.service.allow_open_network)
    if refusal:
        print(refusal, file=sys.stderr)
        return 2
    app = create_app(settings)
    freeze_long_lived()  # the imports' objects: full collections skip them from now on
    uvicorn.run(app, host=args.host, port=args.port, log_level="info",
                **uvicorn_options(settings))
    return 0


def _worker(args: argparse.Namespace) -> int:
    from service.hardening import private_home
    from worker.facade import run_celery_worker

    settings = Settings()
    # uploads, page images, KV: the service's user's only
    private_home(settings.storage.home.resolve())
    run_celery_worker(settings, concurrency=args.concurrency,
                      queues=tuple(q for q in args.queues.split(",") if q))
    return 0


def _ingest(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from service.hardening import private_home
    from service.views import skipped_pages_warning
    from storage.metadata import Document, DocumentId, Job, JobId, new_id
    from storage.text_safety import printable_name
    from worker.facade import IngestError, Worker

    settings = Settings()
    private_home(settings.storage.home.resolve())
    worker = Worker.local(settings)
    col = worker.meta.find_collection(args.collection, "default") or \
        worker.meta.create_collection(args.collection, "default")
    failures = 0
    for path in args.paths:
        shown = printable_name(str(path))  # a file name prints no control character
        try:
            data = path.read_bytes()
            checked = worker.check_upload(data, args.password, path.name)
        except (OSError, IngestError) as exc:
            print(f"{shown}: {getattr(exc, 'message', exc)}", file=sys.stderr)
            failures += 1
            continue
        doc_id, job_id = DocumentId(new_id("doc")), JobId(new_id("job"))
        worker.store_upload(doc_id, checked.data)
        worker.meta.add_job(Job(id=job_id, kind="ingest", document_id=doc_id))
        worker.meta.add_document(Document(id=doc_id, collection_id=col.id, filename=path.name,
                                       sha256=checked.sha256, size_bytes=len(data),
                                       pages_total=checked.page_count, job_id=job_id))
        job = threading.Thread(target=worker.ingest_here, args=(job_id, doc_id))
        job.start()
        with tqdm(total=checked.page_count, desc=printable_name(path.name), unit="page") as bar:
            while job.is_alive():
                job.join(0.2)
                doc = worker.meta.get_document(doc_id)
                bar.set_postfix_str(doc.stage)
                bar.total = max(doc.pages_total, 1)
                bar.n = doc.pages_done
                bar.refresh()
        doc = worker.meta.get_document(doc_id)
        if doc.status != "ready":
            print(f"{shown}: {doc.error}", file=sys.stderr)
            failures += 1
        else:
            print(f"{shown}: {doc.pages_total} page(s) -> document {doc_id}")
            warning = skipped_pages_warning(doc)
            if warning:
                reasons = "; ".join(f"page {p.number}: {p.reason}" for p in doc.skipped_pages)
                print(f"{shown}: warning: {warning} ({reasons})", file=sys.stderr)
    worker.close()
    return 1 if failures else 0


def _ask(args: argparse.Namespace) -> int:
    from conduit_core.policies.choice import PolicyOptions
    from service.hardening import private_home
    from storage.errors import NotFoundError
    from worker.facade import Question, Worker, WorkerError, parse_layers

    settings = Settings()
    private_home(settings.storage.home.resolve())  # a prefill writes page KV under it
    worker = Worker.local(settings)
    col = worker.meta.find_collection(args.collection, "default")
    if col is None:
        print(f"no collection named {args.collection!r}", file=sys.stderr)
        return 2
    question = Question(
        collection_id=col.id, question=args.question, top_k=args.top_k or settings.worker.top_k,
        max_new_tokens=args.max_new_tokens or settings.worker.max_new_tokens,
        policy=args.policy, budget=args.budget,
        options=PolicyOptions(gamma=args.gamma, score_layers=parse_layers(args.score_layers),
                              query_window=args.query_window, head_agg=args.head_agg),
    )
    stream = None if args.json else (lambda _id, text: print(text, end="", flush=True))
    try:
        conversation = _conversation(worker, args, col.id)
        if conversation is not None:
            question = worker.conversations.follow_up(conversation, question)
        result = worker.answer(question, on_token=stream)
        if conversation is not None:
            worker.conversations.record(
                conversation, args.question, result, [asdict(c) for c in result.citations],
                {"policy": result.policy, "flops_ratio_lm": result.flops_ratio_lm,
                 "cache": asdict(result.cache)})
    except (WorkerError, NotFoundError) as exc:
        print(exc.message if isinstance(exc, WorkerError) else str(exc), file=sys.stderr)
        return 2
    finally:
        worker.close()
    if args.json:
        print(json.dumps(asdict(result), indent=2))
    else:
        print()
        for c in result.citations:
            print(f"  [{c.filename} p.{c.page}] score={c.score:.4f}")
    return 0


def _conversation(worker: Worker, args: argparse.Namespace,
                  collection_id: CollectionId) -> Conversation | None:
    """The stored conversation `--conversation` names (None without it): a new one over the
    collection for "new" (its id printed to stderr)."""
    if args.conversation is None:
        return None
    if args.conversation == "new":
        made = worker.conversations.create("default", collection_id, None, args.question[:200])
        print(f"conversation {made.id}", file=sys.stderr)
        return made
    return worker.conversations.get("default", args.conversation)


if __name__ == "__main__":
    raise SystemExit(main())
