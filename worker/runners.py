"""Job runners: where an ingest job executes. In-process (embedded) runs jobs on one background
thread of the serving process (its prefill page batches go through the process's answer engine,
between decode steps) and answers on the request threads through the same engine; the Celery
runner (distributed) sends them to GPU workers."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Protocol

from storage.errors import NotFoundError, UnavailableError
from storage.metadata import DocumentId, JobId, MetadataStore
from worker.answer_job import Answer, Question, answer_question
from worker.context import WorkerContext
from worker.fairness import TenantQueue
from worker.ingest_job import run_ingest
from worker.recovery import (
    gave_up_message,
    heartbeat,
    job_outcome,
    mark_failed,
    remove_page_images,
)

TokenSink = Callable[[int, str], None]

log = logging.getLogger(__name__)


class JobRunner(Protocol):
    """Runs ingest jobs (status is read back from the metadata store) and answers questions."""

    def submit_ingest(self, job_id: JobId, document_id: DocumentId) -> None:
        """Queue the ingestion of an uploaded document."""
        ...

    def answer(self, question: Question, on_token: TokenSink | None = None,
               cancel: threading.Event | None = None) -> Answer:
        """Answer a question where the model lives; blocks until the answer is complete.
        `cancel` set (its client went away) ends it early with `AnswerCancelledError`."""
        ...

    def shutdown(self) -> None:
        """Stop accepting jobs and wait for the running one."""
        ...

    def held_jobs(self) -> set[JobId] | None:
        """Jobs whose queue entry still exists (this process's queue, or the broker's messages
        waiting or taken and unacknowledged); None when that cannot be known now."""
        ...


def execute_ingest_job(ctx: WorkerContext, job_id: JobId, document_id: DocumentId) -> None:
    """Claim one ingest job, run it under a renewed lease, and record its outcome.

    A job that is finished, or held by a live worker, is skipped (a redelivered message or a
    reaper's requeue is harmless), and so is one whose document an earlier attempt already
    finished (its job record is closed from the document); one claimed more than
    `max_ingest_attempts` times fails its document with a message instead of running again.
    """
    s = ctx.settings
    job = ctx.meta.claim_job(job_id, s.worker.job_lease_s)
    if job is None:
        log.info("ingest %s is finished or held by a live worker; skipped", job_id)
        return
    try:
        doc = ctx.meta.get_document(document_id)
    except NotFoundError:
        ctx.meta.update_job(job_id, status="failed", error="the document was deleted")
        return
    outcome = job_outcome(doc)
    if outcome is not None and doc.job_id == job_id:  # an earlier attempt finished it, then
        # lost its job record to a storage outage: ingesting again would put a ready document
        # back to "processing" (questions over it refused meanwhile) for nothing
        ctx.meta.update_job(job_id, status=outcome, error=doc.error)
        return
    if job.attempts > s.worker.max_ingest_attempts:
        log.error("ingest %s of %s: attempt %d; giving up", job_id, document_id, job.attempts)
        mark_failed(ctx, document_id, job_id, gave_up_message(job.attempts - 1),
                    pages_total=doc.pages_total)
        return
    try:
        with heartbeat(ctx.meta, job_id, s.worker.job_lease_s / 6):
            run_ingest(ctx, document_id)
        doc = ctx.meta.get_document(document_id)
    except NotFoundError:  # deleted while it ran: drop what it wrote
        remove_page_images(ctx, document_id)
        ctx.meta.update_job(job_id, status="failed", error="the document was deleted")
        return
    except UnavailableError:  # storage is restarting: hand the job back for a retry
        _release(ctx, job_id)
        raise
    if doc.status == "ready":
        ctx.meta.update_job(job_id, status="succeeded")
    elif doc.status == "failed":
        ctx.meta.update_job(job_id, status="failed", error=doc.error)


def _release(ctx: WorkerContext, job_id: JobId) -> None:
    """Put a job back to `queued` so a retry can claim it at once (best effort: if storage is
    still down, its lease expires and the reaper requeues it)."""
    try:
        ctx.meta.update_job(job_id, status="queued")
    except Exception as exc:  # storage still down
        log.warning("could not release %s: %s", job_id, exc)


def queued_documents(meta: MetadataStore, tenant: str) -> int:
    """How many of `tenant`'s documents wait for or are in ingestion (`queued` or
    `processing`), read from the metadata store: the same count in both forms."""
    return sum(d.status in ("queued", "processing")
               for c in meta.list_collections(tenant) if c.tenant == tenant
               for d in meta.list_documents(c.id))


class InProcessRunner:
    """Runs ingest jobs one at a time on a background thread (one model, one device), taking
    turns between tenants (`worker.fairness.TenantQueue`: the tenant served least recently
    goes next, first come first served within a tenant), so that one tenant's many or slow
    documents delay another's by at most the one that is running."""

    def __init__(self, ctx: WorkerContext) -> None:
        self._ctx = ctx
        self._jobs: TenantQueue[tuple[JobId, DocumentId]] = TenantQueue()
        self._queued: set[JobId] = set()  # queued or running
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="conduit-job", daemon=True)
        self._thread.start()

    def submit_ingest(self, job_id: JobId, document_id: DocumentId) -> None:
        """Queue the ingestion of an uploaded document behind its tenant's earlier ones."""
        tenant = self._tenant_of(document_id)
        with self._cond:
            if self._closed:
                raise RuntimeError("the job runner is shut down")
            if job_id in self._queued:
                return
            self._queued.add(job_id)
            self._jobs.push(tenant, (job_id, document_id))
            self._cond.notify_all()

    def _tenant_of(self, document_id: DocumentId) -> str:
        """The tenant whose turn the document takes ("" when its records cannot be read: it
        still runs, and the job itself settles a deleted document)."""
        try:
            doc = self._ctx.meta.get_document(document_id)
            return self._ctx.meta.get_collection(doc.collection_id).tenant
        except (NotFoundError, UnavailableError):
            return ""

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not (self._closed or self._jobs):
                    self._cond.wait()
                if self._closed:
                    return
                job_id, document_id = self._jobs.pop()
            try:
                execute_ingest_job(self._ctx, job_id, document_id)
            except Exception as exc:  # noqa: BLE001 - the job thread serves the next job
                log.error("job crashed: %r", exc)
            finally:
                with self._cond:
                    self._queued.discard(job_id)

    def held_jobs(self) -> set[JobId] | None:
        """Jobs queued or running on this process's job thread."""
        with self._cond:
            return set(self._queued)

    def answer(self, question: Question, on_token: TokenSink | None = None,
               cancel: threading.Event | None = None) -> Answer:
        """Answer in this process (the model is loaded here), in its answer engine: many
        request threads wait here at once and their questions are decoded together."""
        return answer_question(self._ctx, question, on_token=on_token, cancel=cancel)

    def shutdown(self) -> None:
        """Stop accepting jobs and wait for the running one. Jobs still queued stay `queued`
        in the metadata store; the next start's reconcile requeues them."""
        with self._cond:
            self._closed = True
            self._jobs.clear()
            self._cond.notify_all()
        self._thread.join()
