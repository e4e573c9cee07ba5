"""Job runners: where an ingest job executes. In-process (embedded) runs jobs on one background
thread of the serving process; the Celery runner (distributed) sends them to GPU workers."""

from __future__ import annotations

import logging
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Protocol

from storage.metadata import DocumentId, JobId
from worker.context import WorkerContext
from worker.ingest_job import run_ingest

log = logging.getLogger(__name__)


class JobRunner(Protocol):
    """Accepts ingest jobs; status is read back from the metadata store."""

    def submit_ingest(self, job_id: JobId, document_id: DocumentId) -> None:
        """Queue the ingestion of an uploaded document."""
        ...

    def shutdown(self) -> None:
        """Stop accepting jobs and wait for the running one."""
        ...


def execute_ingest_job(ctx: WorkerContext, job_id: JobId, document_id: DocumentId) -> None:
    """Run one ingest job and record its outcome on the job record."""
    ctx.meta.update_job(job_id, status="running")
    run_ingest(ctx, document_id)
    doc = ctx.meta.get_document(document_id)
    if doc.status == "ready":
        ctx.meta.update_job(job_id, status="succeeded")
    else:
        ctx.meta.update_job(job_id, status="failed", error=doc.error)


class InProcessRunner:
    """Runs jobs one at a time on a background thread (one model, one device)."""

    def __init__(self, ctx: WorkerContext) -> None:
        self._ctx = ctx
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="conduit-job")

    def submit_ingest(self, job_id: JobId, document_id: DocumentId) -> None:
        """Queue the ingestion of an uploaded document."""
        future: Future[None] = self._pool.submit(execute_ingest_job, self._ctx, job_id,
                                                 document_id)
        future.add_done_callback(_log_crash)

    def shutdown(self) -> None:
        """Stop accepting jobs and wait for the running one."""
        self._pool.shutdown(wait=True, cancel_futures=True)


def _log_crash(future: Future[None]) -> None:
    exc = future.exception()
    if exc is not None:
        log.error("job crashed: %r", exc)
