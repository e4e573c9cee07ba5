"""Job runners: where an ingest job executes. In-process (embedded) runs jobs on one background
thread of the serving process; the Celery runner (distributed) sends them to GPU workers."""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Protocol

from storage.metadata import DocumentId, JobId
from worker.answer_job import Answer, Question, answer_question
from worker.context import WorkerContext
from worker.ingest_job import run_ingest

TokenSink = Callable[[int, str], None]

log = logging.getLogger(__name__)


class JobRunner(Protocol):
    """Runs ingest jobs (status is read back from the metadata store) and answers questions."""

    def submit_ingest(self, job_id: JobId, document_id: DocumentId) -> None:
        """Queue the ingestion of an uploaded document."""
        ...

    def answer(self, question: Question, on_token: TokenSink | None = None) -> Answer:
        """Answer a question where the model lives; blocks until the answer is complete."""
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

    def answer(self, question: Question, on_token: TokenSink | None = None) -> Answer:
        """Answer in this process (the model is loaded here)."""
        return answer_question(self._ctx, question, on_token=on_token)

    def shutdown(self) -> None:
        """Stop accepting jobs and wait for the running one."""
        self._pool.shutdown(wait=True, cancel_futures=True)


def _log_crash(future: Future[None]) -> None:
    exc = future.exception()
    if exc is not None:
        log.error("job crashed: %r", exc)
