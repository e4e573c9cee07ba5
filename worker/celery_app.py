"""The distributed runner: a Celery app on the Redis broker, JSON-serialised tasks only.

Tasks are thin wrappers over the same pipeline functions the in-process runner calls. Each worker
process builds its `WorkerContext` (stores + model) once, from `Settings`, on first task. An
answer streams back over a Redis pub/sub channel the API subscribed to before sending the task:
`{"token": [id, text]}` messages, then `{"done": answer}` or `{"error": message, "status": code}`.
A conversation's follow-up goes to the queue of the worker that keeps its prefix while that
worker is alive (`worker.conversation_routes`), else to the shared answer queue.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from typing import Any

import redis
from celery import Celery, Task
from celery.signals import worker_shutting_down
from kombu.exceptions import OperationalError

from storage.errors import UnavailableError
from storage.metadata import DocumentId, JobId
from worker.answer_job import Answer, Question, answer_question
from worker.broker_holdings import held_task_ids, withdraw
from worker.context import WorkerContext, build_context
from worker.conversation_routes import SHARED_QUEUE, Beacon, Routes, worker_id, worker_queue
from worker.errors import AnswerCancelledError, WorkerError
from worker.heap import freeze_long_lived
from worker.recovery import mark_failed
from worker.runners import TokenSink, execute_ingest_job
from worker.settings import Settings
from worker.token_bus import CLAIM_PREFIX, token_bus
from worker.wire import answer_from_json, answer_to_json, question_from_json, question_to_json

log = logging.getLogger(__name__)

INGEST_TASK = "conduit.ingest"
ANSWER_TASK = "conduit.answer"
# one queue per kind, so that a question never waits in line behind a long ingest
INGEST_QUEUE = "conduit.ingest"
ANSWER_QUEUE = SHARED_QUEUE  # each worker also consumes its own (`worker_queue`)
CHANNEL_PREFIX = "conduit:answer:"


class RemoteAnswerError(WorkerError):
    """A worker refused or failed a question; carries the worker's message and status."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.http_status = status


def visibility_timeout_s(settings: Settings) -> int:
    """How long the broker waits for an unacknowledged task before redelivering it: the
    ingest deadline plus two leases (a live ingest is never redelivered; a dead worker's is
    within this, and usually sooner by the reaper's requeue after one lease)."""
    return int(settings.worker.ingest_timeout_s + 2 * settings.worker.job_lease_s)


INGEST_RETRIES = 5  # retries of an ingest that met unreachable storage, with backoff


def make_celery(broker_url: str, settings: Settings | None = None) -> Celery:
    """A Celery app on `broker_url` that accepts and emits JSON only (never pickle)."""
    settings = settings or Settings()
    app = Celery("conduit", broker=broker_url, backend=None)
    app.conf.update(
        task_serializer="json",
        accept_content=["json"],
        result_serializer="json",
        task_acks_late=True,  # a worker that dies mid-task leaves the message to another
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        broker_connection_retry_on_startup=True,
        broker_transport_options={"visibility_timeout": visibility_timeout_s(settings)},
        task_ignore_result=True,
        task_routes={INGEST_TASK: {"queue": INGEST_QUEUE}, ANSWER_TASK: {"queue": ANSWER_QUEUE}},
    )
    app.task(name=INGEST_TASK, bind=True, max_retries=INGEST_RETRIES)(_ingest_task)
    app.task(name=ANSWER_TASK)(_answer_task)  # acked late too: see `CeleryRunner.answer`
    return app


_ctx: WorkerContext | None = None
_ctx_lock = threading.Lock()
_holder: tuple[str, Routes] | None = None  # this worker's id and routes, once it consumes


def _context() -> WorkerContext:
    global _ctx
    with _ctx_lock:
        if _ctx is None:
            _ctx = build_context(Settings())
        return _ctx


def _ingest_task(task: Task, job_id: str, document_id: str) -> None:
    ctx = _context()
    try:
        execute_ingest_job(ctx, JobId(job_id), DocumentId(document_id))
    except UnavailableError as exc:
        if task.request.retries >= INGEST_RETRIES:
            mark_failed(ctx, DocumentId(document_id), JobId(job_id),
                        f"storage stayed unavailable during ingestion: {exc}")
            return
        delay = min(60, 2 ** (task.request.retries + 1))
        log.warning("ingest %s met unavailable storage; retry in %d s", job_id, delay)
        raise task.retry(exc=exc, countdown=delay) from exc


ALIVE_EVERY_S = 2.0  # a worker answering a question says so this often
STALL_S = 15.0  # silence after which the API presumes the answering worker dead
LAST_MESSAGE_WAIT_S = 10.0  # how long a task waits for its last message to be published


def _answer_task(question: dict[str, Any], channel: str) -> None:
    ctx = _context()
    assert ctx.settings.storage.redis_url
    bus = token_bus(ctx.settings.storage.redis_url)  # publishes off the engine's thread
    if not bus.claim(channel, ctx.settings.worker.answer_timeout_s):
        log.info("the question on %s is answered by another delivery; skipped", channel)
        return

    def token(tid: int, text: str) -> None:  # nobody listening: the client went away
        if not bus.listening(channel):
            raise AnswerCancelledError("nobody listens to this answer any more")
        bus.send(channel, {"token": [tid, text]})

    stop = threading.Event()

    def alive() -> None:  # lets the API tell a slow answer from a dead worker
        while not stop.wait(ALIVE_EVERY_S):
            bus.send(channel, {"alive": 1})

    beat = threading.Thread(target=alive, daemon=True)
    last: dict[str, Any]
    try:
        bus.send(channel, {"started": 1})
        beat.start()
        asked = question_from_json(question)
        answer = answer_question(ctx, asked, on_token=token)
        _record_route(ctx, asked, answer)  # before the answer: its follow-up may come at once
        last = {"done": answer_to_json(answer)}
    except WorkerError as exc:
        last = {"error": exc.message, "status": exc.http_status}
    except Exception as exc:  # the worker survives; the caller gets a clean 500
        log.exception("answer task failed")
        last = {"error": f"internal error while answering: {type(exc).__name__}",
                "status": 500}
    finally:
        stop.set()
    if not bus.send(channel, last, wait=LAST_MESSAGE_WAIT_S):
        log.warning("the answer on %s reached nobody (the API stopped listening)", channel)
    if beat.is_alive():
        beat.join()
    bus.release(channel)


def _record_route(ctx: WorkerContext, question: Question, answer: Answer) -> None:
    """Record this worker as the holder of the conversation whose prefix it just kept."""
    if not question.keep or _holder is None:
        return
    holder, routes = _holder
    try:
        routes.record(question, answer.answer, holder, ctx.settings.worker.conversation_ttl_s)
    except (redis.RedisError, OSError) as exc:  # its follow-up goes to the shared queue
        log.warning("could not record the conversation's route: %s", exc)


class CeleryRunner:
    """`JobRunner` that sends jobs and questions to Celery workers through the broker.

    An answer's wait is bounded three ways: 503 when no worker starts the question within
    `answer_queue_wait_s` (the task expires unrun; meanwhile a question whose message the
    broker no longer holds, taken by a worker that froze and died, is sent again once a lease,
    and the worker's claim of the channel answers it once); a worker silent for `STALL_S`
    mid-answer is presumed dead and the question is sent once more (unless tokens were already
    relayed: then 503); 504 when the answer is not complete within `answer_timeout_s`.
    A follow-up sent to its holder's own queue is taken back from there and sent to the shared
    queue once the holder's liveness key lapses, or when it waited there a whole lease (a
    holder too busy to start it); a question sent again goes to the shared queue.
    """

    def __init__(self, broker_url: str, settings: Settings | None = None) -> None:
        s = settings or Settings()
        self._app = make_celery(broker_url, s)
        self._bus = redis.Redis.from_url(broker_url)  # one pool; each answer subscribes on it
        self._timeout = s.worker.answer_timeout_s
        self._queue_wait = s.worker.answer_queue_wait_s
        self._lease = s.worker.job_lease_s  # a question unstarted and unheld this long: lost
        self._routes = Routes(self._bus)

    def submit_ingest(self, job_id: JobId, document_id: DocumentId) -> None:
        """Queue the ingestion of an uploaded document on the broker (the job id is the task
        id, so `held_jobs` can tell which jobs the broker still holds)."""
        self._app.send_task(INGEST_TASK, args=[job_id, document_id], task_id=job_id)

    def held_jobs(self) -> set[JobId] | None:
        """Jobs whose message waits in the ingest queue or is taken and not yet acknowledged;
        None when the broker cannot be read (the reaper then requeues no queued job)."""
        try:
            return {JobId(i) for i in held_task_ids(self._bus, (INGEST_QUEUE,))}
        except UnavailableError:
            return None

    def queue_lengths(self) -> dict[str, int]:
        """Jobs waiting for a worker in each queue: the length of its Redis list (the one
        KEDA's redis trigger reads; taken jobs leave it). `UnavailableError` when Redis
        cannot be read."""
        try:
            return {queue: int(self._bus.llen(queue))  # type: ignore[arg-type]
                    for queue in (ANSWER_QUEUE, INGEST_QUEUE)}
        except (redis.RedisError, OSError) as exc:
            raise UnavailableError(f"the broker is unavailable ({type(exc).__name__})") from exc

    def answer(self, question: Question, on_token: TokenSink | None = None,
               cancel: threading.Event | None = None) -> Answer:
        """Send the question to a worker and relay its tokens until the answer arrives.
        `cancel` set: stop listening (the worker sees nobody subscribed and drops it)."""
        channel = CHANNEL_PREFIX + uuid.uuid4().hex
        sub = self._bus.pubsub(ignore_subscribe_messages=True)
        try:
            sub.subscribe(channel)
            return self._relay(sub, channel, question, on_token, cancel)
        except (redis.RedisError, OSError, OperationalError) as exc:
            raise RemoteAnswerError(f"the message broker is unavailable ({type(exc).__name__}); "
                                    "retry shortly", 503) from exc
        finally:
            sub.close()

    def _send(self, question: Question, channel: str, routed: bool = True) -> str | None:
        """Send the question: `routed`, a follow-up to the queue of the live worker holding
        its conversation (returned), else to the shared queue (None)."""
        holder = self._routes.holder_for(question) if routed else None
        # a question nobody waits for any more is dropped unrun, not answered later; the
        # channel is the task id, so `_lost` can look for the message in the broker
        self._app.send_task(ANSWER_TASK, args=[question_to_json(question), channel],
                            expires=self._queue_wait, task_id=channel,
                            queue=ANSWER_QUEUE if holder is None else worker_queue(holder))
        return holder

    def _lost(self, channel: str, holder: str | None) -> bool:
        """Whether the question's message is neither waiting nor taken by a live worker (a
        worker that froze holding it and died took it along)."""
        queues = (ANSWER_QUEUE,) if holder is None else (ANSWER_QUEUE, worker_queue(holder))
        try:
            return channel not in held_task_ids(self._bus, queues)
        except UnavailableError:
            return False

    def _taken_back(self, channel: str, holder: str, waited_s: float) -> bool:
        """Whether the message waiting in `holder`'s queue was taken back from there because
        the holder is dead or left it waiting a whole lease."""
        try:
            if waited_s < self._lease and self._routes.alive(holder):
                return False
            return withdraw(self._bus, worker_queue(holder), channel)
        except (UnavailableError, redis.RedisError, OSError):
            return False  # the broker is unreadable: looked at again in a second

    def _relay(self, sub: Any, channel: str, question: Question,
               on_token: TokenSink | None, cancel: threading.Event | None = None) -> Answer:
        holder = self._send(question, channel)
        now = time.monotonic()
        deadline, heard, started, sends, relayed = now + self._timeout, now, False, 1, False
        sent_at = routed_at = now
        while (now := time.monotonic()) < deadline:
            if cancel is not None and cancel.is_set():
                raise AnswerCancelledError("the client went away")
            if not started and now - heard > self._queue_wait:
                raise RemoteAnswerError(f"no worker took the question within "
                                        f"{self._queue_wait:.0f} s; retry later", 503)
            if (not started and holder is not None
                    and self._taken_back(channel, holder, now - routed_at)):
                log.warning("the worker %s holding the conversation did not take its "
                            "follow-up; sending it to the shared queue", holder)
                holder = self._send(question, channel, routed=False)
            if not started and now - sent_at >= self._lease:
                sent_at = now  # looked for once a lease; a lost message is sent again
                if self._lost(channel, holder):
                    log.warning("the question's message on %s was lost; sending it again",
                                channel)
                    holder = self._send(question, channel, routed=False)
            if started and now - heard > STALL_S:
                if relayed or sends > 1:
                    raise RemoteAnswerError("the worker answering the question stopped; "
                                            "retry", 503)
                log.warning("answering worker went silent; sending the question again")
                self._bus.delete(CLAIM_PREFIX + channel)  # presumed dead: another may take it
                holder = self._send(question, channel, routed=False)
                heard, started, sends = now, False, sends + 1
            message = sub.get_message(timeout=1.0)
            if message is None:
                continue
            heard = time.monotonic()
            data = json.loads(message["data"])
            if "started" in data:
                started = True
            elif "token" in data and on_token is not None:
                relayed = True
                on_token(int(data["token"][0]), str(data["token"][1]))
            elif "done" in data:
                return answer_from_json(data["done"])
            elif "error" in data:
                raise RemoteAnswerError(data["error"], int(data["status"]))
        raise RemoteAnswerError(f"no answer within {self._timeout:.0f} s", 504)

    def shutdown(self) -> None:
        """Close broker connections."""
        self._app.close()
        self._bus.close()


def worker_threads(settings: Settings, concurrency: int) -> int:
    """Task threads of a worker process: one per answer slot of its engine (a question
    waits on its thread while the engine batches it), plus `concurrency - 1` so that ingests
    (whose page batches the same engine interleaves) can run beside a full batch."""
    return settings.worker.max_active_answers + max(0, concurrency - 1)


def _hold_conversations(url: str) -> tuple[Beacon, str]:
    """Start this worker's liveness key and its routes' records; the name of its own queue."""
    global _holder
    client = redis.Redis.from_url(url)
    holder = worker_id()
    _holder = (holder, Routes(client))
    beacon = Beacon(client, holder)
    beacon.start()
    # a worker shutting down takes no more messages: its follow-ups go elsewhere at once
    worker_shutting_down.connect(lambda **_: beacon.stop(), weak=False)
    return beacon, worker_queue(holder)


def run_worker(settings: Settings, concurrency: int = 2,
               queues: tuple[str, ...] = (ANSWER_QUEUE, INGEST_QUEUE)) -> None:
    """Run a Celery worker in this process (the `conduit worker` command).

    The process runs one answer engine; it takes `worker_threads` tasks at once (threads
    pool; prefetch multiplier 1, acknowledged late, so a crash leaves at most that many
    messages to the broker's redelivery), and its answers are decoded together. A worker that
    answers also consumes its own answer queue and keeps its liveness key while it runs
    (`worker.conversation_routes`).
    """
    if not settings.storage.redis_url:
        raise SystemExit("conduit worker needs CONDUIT_REDIS_URL (the broker)")
    app = make_celery(settings.storage.redis_url, settings)
    _context().preload_model()  # the model loads (and is fingerprinted) before any task
    if settings.worker.worker_metrics_port:
        from prometheus_client import start_http_server

        start_http_server(settings.worker.worker_metrics_port)  # the engine's series
    threads = worker_threads(settings, concurrency)
    beacon: Beacon | None = None
    if ANSWER_QUEUE in queues:  # an answering worker also takes its conversations' follow-ups
        beacon, own = _hold_conversations(settings.storage.redis_url)
        queues = (*queues, own)
    freeze_long_lived()  # the imports' objects: full collections skip them from now on
    try:
        app.worker_main(["worker", "--loglevel=INFO", f"--concurrency={threads}",
                         "--pool=threads" if threads > 1 else "--pool=solo",
                         f"--queues={','.join(queues)}"])
    finally:
        if beacon is not None:
            beacon.stop()
