"""The distributed runner: a Celery app on the Redis broker, JSON-serialised tasks only.

Tasks are thin wrappers over the same pipeline functions the in-process runner calls. Each worker
process builds its `WorkerContext` (stores + model) once, from `Settings`, on first task. An
answer streams back over a Redis pub/sub channel the API subscribed to before sending the task:
`{"token": [id, text]}` messages, then `{"done": answer}` or `{"error": message, "status": code}`.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from typing import Any

import redis
from celery import Celery

from storage.metadata import DocumentId, JobId
from worker.answer_job import Answer, Question, answer_question
from worker.context import WorkerContext, build_context
from worker.errors import WorkerError
from worker.jobs import TokenSink, execute_ingest_job
from worker.settings import Settings
from worker.wire import answer_from_json, answer_to_json, question_from_json, question_to_json

log = logging.getLogger(__name__)

INGEST_TASK = "conduit.ingest"
ANSWER_TASK = "conduit.answer"
# one queue per kind, so that a question never waits in line behind a long ingest
INGEST_QUEUE = "conduit.ingest"
ANSWER_QUEUE = "conduit.answer"
CHANNEL_PREFIX = "conduit:answer:"


class RemoteAnswerError(WorkerError):
    """A worker refused or failed a question; carries the worker's message and status."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.http_status = status


def make_celery(broker_url: str) -> Celery:
    """A Celery app on `broker_url` that accepts and emits JSON only (never pickle)."""
    app = Celery("conduit", broker=broker_url, backend=None)
    app.conf.update(
        task_serializer="json",
        accept_content=["json"],
        result_serializer="json",
        task_acks_late=True,  # a worker that dies mid-ingest leaves the job to another
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        broker_connection_retry_on_startup=True,
        task_ignore_result=True,
        task_routes={INGEST_TASK: {"queue": INGEST_QUEUE}, ANSWER_TASK: {"queue": ANSWER_QUEUE}},
    )
    app.task(name=INGEST_TASK)(_ingest_task)
    app.task(name=ANSWER_TASK, acks_late=False)(_answer_task)
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


def _answer_task(question: dict[str, Any], channel: str) -> None:
    ctx = _context()
    assert ctx.settings.redis_url
    bus = redis.Redis.from_url(ctx.settings.redis_url)

    def send(message: dict[str, Any]) -> None:
        bus.publish(channel, json.dumps(message))

    try:
        answer = answer_question(ctx, question_from_json(question),
                                 on_token=lambda tid, text: send({"token": [tid, text]}))
        send({"done": answer_to_json(answer)})
    except WorkerError as exc:
        send({"error": exc.message, "status": exc.http_status})
    except Exception as exc:  # the worker survives; the caller gets a clean 500
        log.exception("answer task failed")
        send({"error": f"internal error while answering: {type(exc).__name__}", "status": 500})
    finally:
        bus.close()


class CeleryRunner:
    """`JobRunner` that sends jobs and questions to Celery workers through the broker."""

    def __init__(self, broker_url: str, answer_timeout_s: float = 600.0) -> None:
        self._app = make_celery(broker_url)
        self._bus = redis.Redis.from_url(broker_url)  # one pool; each answer subscribes on it
        self._timeout = answer_timeout_s

    def submit_ingest(self, job_id: JobId, document_id: DocumentId) -> None:
        """Queue the ingestion of an uploaded document on the broker."""
        self._app.send_task(INGEST_TASK, args=[job_id, document_id])

    def answer(self, question: Question, on_token: TokenSink | None = None) -> Answer:
        """Send the question to a worker and relay its tokens until the answer arrives."""
        channel = CHANNEL_PREFIX + uuid.uuid4().hex
        sub = self._bus.pubsub(ignore_subscribe_messages=True)
        try:
            sub.subscribe(channel)
            # a question nobody waits for any more is dropped unrun, not answered later
            self._app.send_task(ANSWER_TASK, args=[question_to_json(question), channel],
                                expires=self._timeout)
            deadline = time.monotonic() + self._timeout
            while time.monotonic() < deadline:
                message = sub.get_message(timeout=1.0)
                if message is None:
                    continue
                data = json.loads(message["data"])
                if "token" in data and on_token is not None:
                    on_token(int(data["token"][0]), str(data["token"][1]))
                elif "done" in data:
                    return answer_from_json(data["done"])
                elif "error" in data:
                    raise RemoteAnswerError(data["error"], int(data["status"]))
            raise RemoteAnswerError(f"no worker answered within {self._timeout:.0f} s", 504)
        finally:
            sub.close()

    def shutdown(self) -> None:
        """Close broker connections."""
        self._app.close()
        self._bus.close()


def run_worker(settings: Settings, concurrency: int = 2,
               queues: tuple[str, ...] = (ANSWER_QUEUE, INGEST_QUEUE)) -> None:
    """Run a Celery worker in this process (the `conduit worker` command).

    With concurrency >= 2 (threads) an answer can run between an ingest's prefill batches:
    both share one model, and the model lock is held per batch, not per document.
    """
    if not settings.redis_url:
        raise SystemExit("conduit worker needs CONDUIT_REDIS_URL (the broker)")
    app = make_celery(settings.redis_url)
    app.worker_main(["worker", "--loglevel=INFO", f"--concurrency={concurrency}",
                     "--pool=threads" if concurrency > 1 else "--pool=solo",
                     f"--queues={','.join(queues)}"])
