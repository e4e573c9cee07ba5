"""The worker as the service sees it: one `Worker` object, and the types and errors its
methods take and raise. The service imports nothing else of the worker (tests/test_layering.py).

A `Worker` is built once per process by an entry point: `Worker.serve` for the HTTP app (the
job runner, in-process or Celery, the reaper and the retrieval index check start with it),
`Worker.local` for the command line (the pipeline runs in the calling process). It decides
how a request's work is split between the API process and the workers: which limits an upload
is checked against, what deleting a document removes, where an answer runs, how many answers
and queued uploads one tenant may hold. Reads of the metadata store go through `meta` (the
storage layer's records); everything that writes files, queues jobs or loads the model goes
through a method here.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from storage.errors import NotFoundError
from storage.gc import release_pages
from storage.keys import PageHash
from storage.kv.tiered import TieredKVStore
from storage.metadata import CollectionId, Document, DocumentId, Job, JobId, MetadataStore
from storage.metadata.usage import Quota, Usage
from worker.answer_job import Answer, Citation, Question, answer_question, check_scope
from worker.context import WorkerContext, build_context
from worker.conversation_turns import PastTurn
from worker.conversations import ConversationFullError, Conversations, open_store
from worker.errors import AnswerCancelledError, WorkerError
from worker.fairness import TenantSlots, answer_cap, queued_documents_cap
from worker.heap import freeze_long_lived
from worker.ingest.errors import IngestError
from worker.ingest.sandbox import ReaderLimits
from worker.policy_options import parse_layers
from worker.recovery import Reaper, job_is_stale, remove_page_images, settled_job
from worker.retrieval.index.maintain import IndexCheck
from worker.retrieval.index.pipeline import (
    on_collection_deleted,
    on_document_deleted,
    retrieval_indexes,
    start_index_check,
)
from worker.runners import (
    InProcessRunner,
    JobRunner,
    TokenSink,
    execute_ingest_job,
    queued_documents,
)
from worker.settings import Settings
from worker.uploads import (
    CheckedUpload,
    UploadTooLargeError,
    accepted_formats,
    check_quota,
    check_room,
    check_upload,
    conversion,
    store_upload,
    tenant_quota,
    upload_path,
)

__all__ = [
    "Answer", "AnswerCancelledError", "CheckedUpload", "Citation", "ConversationFullError",
    "Conversations", "IngestError", "PastTurn", "Question",
    "TokenSink", "UploadTooLargeError", "Worker", "WorkerError",
    "freeze_long_lived", "parse_layers", "run_celery_worker",
]

log = logging.getLogger(__name__)


class Worker:
    """One process's worker: its stores, its job runner (None on the command line, where
    jobs run in the calling thread) and the per-tenant caps of the API process."""

    def __init__(self, ctx: WorkerContext, runner: JobRunner | None = None, *,
                 keyed: bool = False) -> None:
        self._ctx = ctx
        self._runner = runner
        self._reaper: Reaper | None = None
        s = ctx.settings
        # what one tenant may hold at once (`worker.fairness`): answers, queued uploads
        self._answer_slots = TenantSlots(answer_cap(s, keyed), "answers in flight",
                                         "CONDUIT_MAX_ANSWERS_PER_TENANT")
        self._upload_slots = TenantSlots(queued_documents_cap(s, keyed),
                                         "documents queued for ingestion",
                                         "CONDUIT_MAX_QUEUED_DOCUMENTS_PER_TENANT")
        # stored conversations, each tenant's own (`worker.conversations`)
        self.conversations = Conversations(ctx, open_store(ctx))

    @classmethod
    def local(cls, settings: Settings) -> Worker:
        """The stores the settings name, for a command that runs the pipeline itself."""
        return cls(build_context(settings))

    @classmethod
    def serve(cls, settings: Settings, *, keyed: bool) -> Worker:
        """The API process's worker: the job runner (in-process when embedded, Celery when
        distributed), the reaper (a startup reconcile, then a pass every reaper_interval_s:
        no document stays stuck) and a background check of the retrieval indexes (stale ones
        rebuild while questions scan). `keyed`: API keys are configured (tenant caps apply
        by default)."""
        ctx = build_context(settings)
        runner: JobRunner
        if settings.embedded:
            runner = InProcessRunner(ctx)
        else:
            from worker.celery_app import CeleryRunner

            runner = CeleryRunner(settings.storage.redis_url or "", settings)
        worker = cls(ctx, runner, keyed=keyed)
        worker._reaper = Reaper(ctx, runner.submit_ingest, runner.held_jobs)
        worker._reaper.start()
        start_index_check(ctx)
        return worker

    def close(self) -> None:
        """Stop the reaper and the runner, then the engine and the stores."""
        if self._reaper is not None:
            self._reaper.stop()
        if self._runner is not None:
            self._runner.shutdown()
        self._ctx.close()

    # what the service reads
    @property
    def settings(self) -> Settings:
        """The deployment's settings."""
        return self._ctx.settings

    @property
    def meta(self) -> MetadataStore:
        """The metadata store: collections, documents, pages, jobs, usage."""
        return self._ctx.meta

    @property
    def kv(self) -> TieredKVStore:
        """The page-KV tiers (for their metrics)."""
        return self._ctx.kv

    @property
    def home(self) -> Path:
        """The resolved home directory."""
        return self._ctx.home

    @property
    def model_loaded(self) -> bool:
        """Whether this process has loaded the model (never, in a distributed API process)."""
        return self._ctx.model_loaded

    def queue_lengths(self) -> dict[str, int]:
        """Jobs waiting in each of the broker's queues (none when embedded: no broker);
        `UnavailableError` when the broker cannot be read."""
        lengths = getattr(self._runner, "queue_lengths", None)
        return {} if lengths is None else dict(lengths())

    # answers
    def check_question(self, question: Question, *, pages: bool = False) -> Question:
        """The question with its policy resolved, or a `WorkerError` (4xx) unless it can be
        answered as asked; the checks that need the model run here when it lives in this
        process. `pages=True` also requires ready pages in its scope."""
        return check_scope(self._ctx, question, with_model=self.settings.embedded,
                           pages=pages)

    def answer(self, question: Question, on_token: TokenSink | None = None,
               cancel: threading.Event | None = None) -> Answer:
        """Answer where the model lives (the runner; on the command line, this thread);
        `cancel` set ends it early with `AnswerCancelledError`."""
        if self._runner is None:
            return answer_question(self._ctx, question, on_token=on_token)
        return self._runner.answer(question, on_token=on_token, cancel=cancel)

    @contextmanager
    def answer_slot(self, tenant: str) -> Iterator[None]:
        """Hold one of `tenant`'s answers in flight; `TenantBusyError` (429) at its cap."""
        with self._answer_slots.hold(tenant):
            yield

    # uploads and ingestion
    @contextmanager
    def upload_slot(self, tenant: str) -> Iterator[None]:
        """Hold one of `tenant`'s uploads, counted with its documents queued or in ingestion;
        `TenantBusyError` (429, nothing stored) beyond the cap."""
        queued = queued_documents(self.meta, tenant) if self._upload_slots.cap else 0
        with self._upload_slots.hold(tenant, already=queued):
            yield

    @property
    def quota(self) -> Quota:
        """Each tenant's limits (0 = none)."""
        return tenant_quota(self.settings)

    def usage(self, tenant: str) -> Usage:
        """What `tenant`'s documents take now."""
        return self.meta.usage(tenant)

    def check_upload(self, data: bytes, password: str | None,
                     filename: str | None = None) -> CheckedUpload:
        """Sniff the upload's format (checked against `filename`), make it a PDF where it
        is another format and open it in a confined reader under the deployment's limits;
        an `IngestError` (4xx, 503 when the readers' memory budget is spent) if it is
        unusable. Nothing is written."""
        s = self.settings
        return check_upload(data, password=password, max_bytes=s.worker.max_upload_bytes,
                            max_pages=s.worker.max_pages,
                            limits=ReaderLimits(s.worker.page_memory_mb, s.worker.page_timeout_s,
                                                budget_mb=s.worker.reader_memory_mb),
                            filename=filename, convert=conversion(s))

    def accepted_formats(self) -> list[dict[str, object]]:
        """The formats an upload may have here (Office ones only where LibreOffice runs)."""
        return accepted_formats(conversion(self.settings))

    def check_room(self, tenant: str, checked: CheckedUpload) -> None:
        """Raise unless the upload fits the tenant's quota (413) and leaves the disk reserve
        free (507)."""
        check_quota(self.meta, tenant, self.quota, checked)
        check_room(self.home, len(checked.data), self.settings.storage.disk_reserve_bytes)

    def store_upload(self, document_id: DocumentId, data: bytes) -> None:
        """Write a checked upload's bytes atomically."""
        store_upload(self.home, document_id, data)

    def remove_upload(self, document_id: DocumentId) -> None:
        """Delete a stored upload (none: nothing to do)."""
        upload_path(self.home, document_id).unlink(missing_ok=True)

    def submit_ingest(self, job_id: JobId, document_id: DocumentId) -> None:
        """Queue a stored document's ingestion (the API process's runner)."""
        if self._runner is None:
            raise RuntimeError("a local worker ingests in the caller's thread: ingest_here")
        self._runner.submit_ingest(job_id, document_id)

    def ingest_here(self, job_id: JobId, document_id: DocumentId) -> None:
        """Run one ingest job in the calling thread (the command line); its outcome is on
        the document record."""
        execute_ingest_job(self._ctx, job_id, document_id)

    # documents, pages and jobs
    def held_by_live_worker(self, doc: Document) -> bool:
        """Whether a worker is ingesting the document now (its job runs under a live lease)."""
        if doc.status not in ("queued", "processing") or doc.job_id is None:
            return False
        try:
            job = self.meta.get_job(doc.job_id)
        except NotFoundError:
            return False
        return job.status == "running" and not job_is_stale(job, self.settings.worker.job_lease_s)

    def delete_document_files(self, doc: Document) -> int:
        """Remove a document's upload, page images, the cached pages no other document uses
        and its entries in the retrieval index; the number of cached pages released. The
        records go with `release_pages`; the job is the caller's to settle."""
        self.remove_upload(doc.id)
        remove_page_images(self._ctx, doc.id)
        released = release_pages(self.kv, self.meta, doc.id)
        on_document_deleted(self._ctx, doc.collection_id, doc.id)
        return len(released)

    def delete_collection(self, collection_id: CollectionId) -> None:
        """Delete an empty collection and its retrieval index (409 while it holds
        documents)."""
        self.meta.delete_collection(collection_id)
        on_collection_deleted(self._ctx, collection_id)

    def settled_job(self, job: Job, doc: Document) -> Job:
        """The job as its document's state settles it (a finished document closes its job)."""
        return settled_job(job, doc)

    def page_image_path(self, relative: str) -> Path:
        """Absolute path of a stored page image."""
        return self._ctx.page_image_path(relative)

    def kv_tiers_holding(self, hashes: Sequence[PageHash]) -> dict[PageHash, list[str]]:
        """For each page hash, the KV tiers holding its cache."""
        return self.kv.tiers_holding(list(hashes))

    # retrieval indexes
    def indexed_collections(self) -> list[str]:
        """Collections with a persistent retrieval index."""
        return retrieval_indexes(self._ctx).indexed_collections()

    def rebuild_index(self, collection_id: str) -> int:
        """Rebuild a collection's retrieval index from the store; the pages indexed."""
        return retrieval_indexes(self._ctx).rebuild(self.meta, collection_id)

    def check_index(self, collection_id: str) -> IndexCheck:
        """Compare a collection's retrieval index with the store."""
        return retrieval_indexes(self._ctx).check(self.meta, collection_id)


def run_celery_worker(settings: Settings, concurrency: int, queues: tuple[str, ...]) -> None:
    """Run a Celery worker in this process (`conduit worker`; needs the Redis URL)."""
    from worker.celery_app import run_worker

    run_worker(settings, concurrency=concurrency, queues=queues)
