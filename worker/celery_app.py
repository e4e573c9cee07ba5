"""The distributed job runner: a Celery app on the Redis broker, JSON-serialised tasks only.

Tasks are thin wrappers over the same pipeline functions the in-process runner calls. Each worker
process builds its `WorkerContext` (stores + model) once, from `Settings`, on first task.
"""

from __future__ import annotations

import logging
import threading

from celery import Celery

from storage.metadata import DocumentId, JobId
from worker.context import WorkerContext, build_context
from worker.jobs import execute_ingest_job
from worker.settings import Settings

log = logging.getLogger(__name__)

INGEST_TASK = "conduit.ingest"


def make_celery(broker_url: str) -> Celery:
    """A Celery app on `broker_url` that accepts and emits JSON only (never pickle)."""
    app = Celery("conduit", broker=broker_url, backend=None)
    app.conf.update(
        task_serializer="json",
        accept_content=["json"],
        result_serializer="json",
        task_acks_late=True,  # a worker that dies mid-job leaves the job to another
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        broker_connection_retry_on_startup=True,
        task_ignore_result=True,
    )
    app.task(name=INGEST_TASK)(_ingest_task)
    return app


_ctx: WorkerContext | None = None
_ctx_lock = threading.Lock()


def _context() -> WorkerContext:
    global _ctx
    with _ctx_lock:
        if _ctx is None:
            _ctx = build_context(Settings())
        return _ctx


def _ingest_task(job_id: str, document_id: str) -> None:
    execute_ingest_job(_context(), JobId(job_id), DocumentId(document_id))


class CeleryRunner:
    """`JobRunner` that sends jobs to Celery workers through the broker."""

    def __init__(self, broker_url: str) -> None:
        self._app = make_celery(broker_url)

    def submit_ingest(self, job_id: JobId, document_id: DocumentId) -> None:
        """Queue the ingestion of an uploaded document on the broker."""
        self._app.send_task(INGEST_TASK, args=[job_id, document_id])

    def shutdown(self) -> None:
        """Close broker connections."""
        self._app.close()


def run_worker(settings: Settings, concurrency: int = 1) -> None:
    """Run a Celery worker in this process (the `conduit worker` command)."""
    if not settings.redis_url:
        raise SystemExit("conduit worker needs CONDUIT_REDIS_URL (the broker)")
    app = make_celery(settings.redis_url)
    app.worker_main(["worker", "--loglevel=INFO", f"--concurrency={concurrency}",
                     "--pool=threads" if concurrency > 1 else "--pool=solo"])
