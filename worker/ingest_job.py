"""The ingest job: render every page, read its text (OCR when needed), embed it for retrieval,
and prefill page KV once per page hash. Progress is written to the metadata store per stage.

Metrics (default registry; the api's /metrics in the embedded form, a worker's metrics port in
the distributed one), counted when a document's ingestion ends:
  INGEST_PAGES      counter `conduit_ingest_pages_total{outcome}`: its pages, `ingested` or
                    `skipped` (unreadable, left out of a ready document)
  INGEST_DOCUMENTS  counter `conduit_ingest_documents_total{outcome}`: `ready` or `failed`
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

from PIL import Image
from prometheus_client import Counter

from conduit_core.page_kv import PageKV
from storage.errors import DiskFullError, NotFoundError, UnavailableError
from storage.keys import PageHash, page_hash
from storage.metadata import Document, DocumentId, Page, SkippedPage
from storage.metadata.records import IngestStage
from worker.context import WorkerContext
from worker.disk_cost import check_room_for, document_bytes
from worker.ingest.deadline import Deadline
from worker.ingest.errors import IngestError
from worker.ingest.pages import IngestedPage, check_readable, iter_pages
from worker.ingest.sandbox import PdfFacts, ReaderLimits
from worker.recovery import mark_failed, release_unreferenced
from worker.retrieval.document_context import document_context
from worker.retrieval.embedder import embedding_to_bytes
from worker.retrieval.index.pipeline import on_document_ready
from worker.retrieval.passages import embed_pages
from worker.uploads import upload_path

log = logging.getLogger(__name__)

INGEST_PAGES = Counter("conduit_ingest_pages", "Pages of documents whose ingestion ended "
                       "ready: ingested, or skipped as unreadable", ["outcome"])
INGEST_DOCUMENTS = Counter("conduit_ingest_documents", "Documents whose ingestion ended, by "
                           "outcome (ready, failed)", ["outcome"])
for _outcome in ("ingested", "skipped"):  # every series exists from the start (rate() at 0)
    INGEST_PAGES.labels(_outcome)
for _outcome in ("ready", "failed"):
    INGEST_DOCUMENTS.labels(_outcome)

PREFILL_BATCH = 4  # pages per prefill call
EMBED_BATCH = 32  # pages per embedding call (progress is reported after each)


@dataclass
class _Progress:
    ctx: WorkerContext
    document_id: DocumentId
    total: int = 0

    def __call__(self, stage: IngestStage, done: int) -> None:
        self.ctx.meta.update_progress(
            self.document_id, status="processing", stage=stage, pages_done=done,
            pages_total=self.total,
        )


def page_image_relpath(document_id: str, number: int) -> str:
    """Where a page image lives, relative to the home dir (lossless WebP: the render, bit for
    bit, in a third of a PNG's bytes on text pages; docs/DECISIONS.md, "Page images")."""
    return f"pages/{document_id}/{number:05d}.webp"


def run_ingest(ctx: WorkerContext, document_id: DocumentId) -> None:
    """Ingest one uploaded document; on any failure mark it failed with a clear message.

    `UnavailableError` (Redis restarting) propagates instead: the caller retries the job.
    Failure marking is best effort with retry (`recovery.mark_failed`), and a failed
    document keeps no page images.
    """
    doc = ctx.meta.get_document(document_id)
    progress = _Progress(ctx, document_id)
    try:
        pages, skipped = _ingest(ctx, doc, progress)
        cost = document_bytes(ctx, document_id, pages)  # charged: upload, images, KV, text
        try:
            check_room_for(ctx, doc, cost)
        except IngestError:  # the KV just computed goes too (unless another document has it)
            release_unreferenced(ctx, [p.page_hash for p in pages])
            raise
        ctx.meta.put_pages(document_id, pages)
        if skipped:
            log.warning("ingest of %s: %d of %d pages could not be read and were skipped",
                        document_id, len(skipped), progress.total)
        ctx.meta.update_progress(document_id, status="ready", stage="done",
                                 pages_done=progress.total, pages_total=progress.total,
                                 skipped_pages=skipped, size_bytes=cost)
        on_document_ready(ctx, doc.collection_id, document_id, pages)
        INGEST_PAGES.labels("ingested").inc(len(pages))
        INGEST_PAGES.labels("skipped").inc(len(skipped))
        INGEST_DOCUMENTS.labels("ready").inc()
    except (UnavailableError, NotFoundError):
        raise
    except IngestError as exc:
        log.warning("ingest of %s failed: %s", document_id, exc.message)
        _fail(ctx, doc, progress, exc.message)
    except DiskFullError as exc:
        log.error("ingest of %s failed: %s", document_id, exc)
        _fail(ctx, doc, progress, "the disk is full (no space left for the document's "
              "records); delete documents to free space, then upload it again")
    except OSError as exc:
        log.error("ingest of %s failed on storage: %s", document_id, exc)
        _fail(ctx, doc, progress, f"storage error during ingestion: {exc.strerror or exc}")
    except Exception as exc:
        log.exception("ingest of %s crashed", document_id)
        _fail(ctx, doc, progress, f"internal error during ingestion: {type(exc).__name__}")


def _fail(ctx: WorkerContext, doc: Document, progress: _Progress, message: str) -> None:
    INGEST_DOCUMENTS.labels("failed").inc()
    mark_failed(ctx, doc.id, None, message, pages_total=progress.total)


def _ingest(ctx: WorkerContext, doc: Document,
            progress: _Progress) -> tuple[list[Page], list[SkippedPage]]:
    s = ctx.settings.worker
    deadline = Deadline(s.ingest_timeout_s)
    collection = ctx.meta.get_collection(doc.collection_id)
    namespace = collection.page_namespace
    fingerprint = ctx.runtime.vlm.fingerprint
    data = upload_path(ctx.home, doc.id).read_bytes()
    opened: list[PdfFacts] = []

    def on_open(facts: PdfFacts) -> None:
        opened.append(facts)
        progress.total = facts.page_count

    pages: list[Page] = []
    unreadable: list[IngestedPage] = []
    # the PDF is opened, and its pages drawn and read, only in confined reader processes
    for item in iter_pages(data, dpi=s.render_dpi, max_pixels=s.max_page_pixels, ocr=s.ocr,
                           ocr_workers=s.ocr_workers, deadline=deadline,
                           limits=ReaderLimits(s.page_memory_mb, s.page_timeout_s,
                                               budget_mb=s.reader_memory_mb),
                           max_pages=s.max_pages, on_open=on_open,
                           on_progress=lambda p: progress(p.stage, p.done)):
        if item.error is not None:
            unreadable.append(item)
            continue
        assert item.image is not None  # rendering is on
        rel = page_image_relpath(doc.id, item.number)
        path = ctx.page_image_path(rel)
        path.parent.mkdir(parents=True, exist_ok=True)
        item.image.save(path, format="WEBP", lossless=True, method=0)
        key = page_hash(fingerprint=fingerprint, render=ctx.render, image=item.image,
                        namespace=namespace)
        pages.append(Page(document_id=doc.id, number=item.number, page_hash=key,
                          text=item.text.text, text_source=item.text.source,
                          image_path=rel, width=item.width, height=item.height))
    check_readable(progress.total, unreadable, opened[0].truncated)
    check_room_for(ctx, doc, document_bytes(ctx, doc.id, pages))  # the images, before prefill
    progress("index", 0)
    context = document_context(doc.filename, opened[0].title, pages[0].text if pages else "")
    for start in range(0, len(pages), EMBED_BATCH):
        batch = pages[start:start + EMBED_BATCH]
        matrices = embed_pages([p.text for p in batch], ctx.embedder,
                               contexts=[context] * len(batch))
        for page, matrix in zip(batch, matrices, strict=True):
            page.context = context
            page.embedding = None if matrix is None else embedding_to_bytes(matrix)
        progress("index", start + len(batch))
    deadline.check(len(pages), len(pages))
    if s.prefill_on_ingest:
        ensure_prefilled(ctx, pages, on_done=lambda n: progress("prefill", n))
    return pages, [SkippedPage(p.number, p.error or "unreadable") for p in unreadable]


def _prefill(ctx: WorkerContext, images: list[Image.Image]) -> list[PageKV]:
    """One page batch's prefill (run on the answer engine's thread)."""
    return ctx.runtime.prefill_pages(images)


def ensure_prefilled(
    ctx: WorkerContext, pages: Sequence[Page], on_done: Callable[[int], None] | None = None
) -> int:
    """Prefill the KV of every page whose hash is not stored yet; return how many were computed.

    Identical pages (same hash) are prefilled once, across documents and within one.
    """
    present = ctx.kv.contains([PageHash(p.page_hash) for p in pages])
    todo: dict[str, Page] = {}
    for p in pages:
        if p.page_hash not in present:
            todo.setdefault(p.page_hash, p)
    missing = list(todo.values())
    stored = len(pages) - len(missing)
    if on_done:
        on_done(stored)
    prefill_now(ctx, missing, on_done and (lambda n: on_done(stored + n)))
    return len(missing)


def prefill_now(ctx: WorkerContext, pages: Sequence[Page],
                on_done: Callable[[int], None] | None = None) -> dict[PageHash, PageKV]:
    """Prefill `pages` (distinct hashes) now, whatever the store holds, in page batches run
    between decode steps; store each batch (`on_done(pages done so far)` after it) and return
    the KV computed, by hash (a question answers from what it computed, not from a re-read
    another question could race with)."""
    out: dict[PageHash, PageKV] = {}
    for start in range(0, len(pages), PREFILL_BATCH):
        batch = pages[start:start + PREFILL_BATCH]
        images = [Image.open(ctx.page_image_path(p.image_path)).convert("RGB") for p in batch]
        kvs = ctx.engine.run(partial(_prefill, ctx, images))  # between decode steps
        fresh = {PageHash(p.page_hash): kv for p, kv in zip(batch, kvs, strict=True)}
        ctx.kv.put_many(fresh)
        out.update(fresh)
        if on_done:
            on_done(len(out))
    return out
