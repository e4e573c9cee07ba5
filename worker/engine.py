"""`AnswerEngine`: one per process, the only thread that runs the model. Concurrent questions
are batched (continuous batching) and ingest prefill is interleaved with them.

A scheduler thread loops: when no question is being prefilled, admit at most one waiting
question (fair across tenants: the oldest question of the tenant admitted least recently,
`worker.fairness.TenantQueue`; first come first served within a tenant) when a slot is free
(`max_active` answers in the batch) and its KV fits (`max_kv_tokens` cache positions in
flight, counted from each answer's own cache); run one phase of the prefilling question
(`ReuseRuntime.prefill_steps`: page-KV assembly and re-rotation; scoring pass and selection;
refresh and first-token logits); run at most one queued model job (an ingest page batch:
`run`); then one batched decode step of every active answer (`ReuseRuntime.step`), so
running answers keep streaming while another question is prefilled (a decode step between
its phases) or a document is ingested. Each iteration's model work holds `model_lock` (code
outside the engine that uses the runtime directly, e.g. the lab's evaluation harness, takes
the same lock).

A question leaves the batch at the next step when its token callback raises (a client gone)
or its `cancel` event is set; a question that waits longer than `queue_wait_s` for a slot is
refused (`AnswerQueueFullError`, 503 with Retry-After). Memory stays bounded: at most
`max_active` caches and `max_kv_tokens` positions; a question that alone needs more is
refused at once (`AnswerTooLargeError`, 422).

Public API:
  AnswerEngine(runtime: Callable[[], ReuseRuntime], *, max_active, max_kv_tokens,
               queue_wait_s, model_lock=None)
    .answer(request, on_token=None, cancel=None, tenant="") -> (AnswerResult, queue_s)   blocks
    .run(fn) -> fn()   a model job (ingest prefill) run between decode steps; blocks
    .stats() -> EngineStats(queued, active, kv_tokens, jobs)
    .close()
  kv_tokens_needed(request) -> int   upper bound of the cache positions a request needs
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, TypeVar

from conduit_core.answer_state import AnswerState
from conduit_core.answer_types import AnswerRequest, AnswerResult, TokenCallback
from conduit_core.runtime import PrefillSteps, ReuseRuntime
from worker import engine_metrics as metrics
from worker.errors import AnswerCancelledError, AnswerQueueFullError, AnswerTooLargeError
from worker.fairness import TenantQueue

log = logging.getLogger(__name__)
T = TypeVar("T")
# slack for the prompt's template tokens (chat markers, generation prompt) over its text
TEMPLATE_TOKENS = 64


def kv_tokens_needed(request: AnswerRequest) -> int:
    """An upper bound of the cache positions `request` allocates: its pages' tokens, its
    text (a token holds at least one character of it) plus the template, and its answer."""
    text = len(request.prefix) + len(request.question) + sum(len(p.label)
                                                             for p in request.pages)
    return (sum(p.kv.num_tokens for p in request.pages) + text + TEMPLATE_TOKENS
            + request.max_new_tokens)


@dataclass(eq=False)  # identity: two questions over the same pages are still two tickets
class _Ticket:
    """One submitted question, from the queue to its result."""

    request: AnswerRequest
    tenant: str  # whose question: admission takes turns between tenants
    on_token: TokenCallback | None
    cancel: threading.Event | None
    need: int  # KV positions reserved while admitted (the estimate, then the actual cache)
    queued_at: float = field(default_factory=time.perf_counter)
    admitted_at: float = 0.0
    steps: PrefillSteps | None = None  # its prefill, between admission and first logits
    state: AnswerState | None = None
    future: Future[AnswerResult] = field(default_factory=Future)

    @property
    def cancelled(self) -> bool:
        return self.cancel is not None and self.cancel.is_set()


@dataclass(frozen=True)
class EngineStats:
    """What the engine holds now."""

    queued: int  # questions waiting for a slot
    active: int  # answers in the running batch
    kv_tokens: int  # cache positions reserved by the active answers
    jobs: int  # model jobs (ingest page batches) waiting


class AnswerEngine:
    """Batches concurrent questions over one model; see the module docstring."""

    def __init__(self, runtime: Callable[[], ReuseRuntime], *, max_active: int = 16,
                 max_kv_tokens: int = 65536, queue_wait_s: float = 60.0,
                 model_lock: Any | None = None) -> None:
        self._runtime_fn = runtime
        self.max_active = max_active
        self.max_kv_tokens = max_kv_tokens
        self.queue_wait_s = queue_wait_s
        self._model_lock = model_lock if model_lock is not None else threading.Lock()
        self._cond = threading.Condition()
        self._queue: TenantQueue[_Ticket] = TenantQueue()
        self._jobs: deque[tuple[Callable[[], Any], Future[Any]]] = deque()
        self._active: list[_Ticket] = []
        self._prefilling: _Ticket | None = None  # engine thread only
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="conduit-engine", daemon=True)
        self._thread.start()

    # ---- callers --------------------------------------------------------------------
    def answer(self, request: AnswerRequest, on_token: TokenCallback | None = None,
               cancel: threading.Event | None = None,
               tenant: str = "") -> tuple[AnswerResult, float]:
        """Queue `request` as `tenant`'s, wait for its answer; returns it and its time in the
        queue."""
        need = kv_tokens_needed(request)
        if need > self.max_kv_tokens:
            raise AnswerTooLargeError(
                f"this question needs about {need} KV cache positions, more than the "
                f"{self.max_kv_tokens} this worker holds at once (CONDUIT_MAX_KV_TOKENS_"
                "IN_FLIGHT); ask over fewer pages or for a shorter answer")
        ticket = _Ticket(request=request, tenant=tenant, on_token=on_token, cancel=cancel,
                         need=need)
        with self._cond:
            if self._closed:
                raise AnswerQueueFullError("the answer engine is shutting down; retry")
            self._queue.push(tenant, ticket)
            metrics.QUEUE_LENGTH.set(len(self._queue))
            self._cond.notify_all()
        result = ticket.future.result()
        return result, ticket.admitted_at - ticket.queued_at

    def run(self, fn: Callable[[], T]) -> T:
        """Run `fn` (model work: an ingest page batch) on the engine thread, between decode
        steps, and return what it returns (or raise what it raises)."""
        if threading.current_thread() is self._thread:
            return fn()
        future: Future[T] = Future()
        with self._cond:
            if self._closed:
                raise RuntimeError("the answer engine is closed")
            self._jobs.append((fn, future))
            self._cond.notify_all()
        return future.result()

    def stats(self) -> EngineStats:
        """Queue length, batch size and reserved KV now."""
        with self._cond:
            return EngineStats(queued=len(self._queue), active=len(self._active),
                               kv_tokens=sum(t.need for t in self._active),
                               jobs=len(self._jobs))

    def close(self) -> None:
        """Stop: questions and jobs still waiting are refused; running answers end."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout=30)

    # ---- the scheduler thread ---------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self._cond:
                while not (self._closed or self._queue or self._jobs or self._active):
                    self._cond.wait()
                if self._closed:
                    self._fail_all()
                    return
                ticket = self._admit() if self._prefilling is None else None
                job = self._jobs.popleft() if self._jobs else None
                active = list(self._active)
            try:
                self._iteration(ticket, job, active)
            except Exception:  # noqa: BLE001 - keep serving; the failed answers are told
                log.exception("answer engine step failed")
                try:
                    self._fail(active, "internal error while answering")
                except Exception:  # noqa: BLE001 - the engine thread must not die
                    log.exception("answer engine could not fail the batch cleanly")

    def _admit(self) -> _Ticket | None:
        """The next question to prefill (the tenants' turn, `TenantQueue`), or None; expires
        those that waited too long and drops those cancelled in the queue. Called under the
        condition."""
        now = time.perf_counter()
        for waiting in list(self._queue):
            if waiting.cancelled:
                metrics.CANCELLED.inc()
                self._queue.remove(waiting)
                waiting.future.set_exception(AnswerCancelledError("the client went away"))
            elif now - waiting.queued_at > self.queue_wait_s:
                self._queue.remove(waiting)
                waiting.future.set_exception(AnswerQueueFullError(
                    f"no answer slot freed within {self.queue_wait_s:.0f} s; retry later"))
        metrics.QUEUE_LENGTH.set(len(self._queue))
        head = self._queue.peek()
        if head is None:
            return None
        reserved = sum(t.need for t in self._active)
        if len(self._active) >= self.max_active or (
                self._active and reserved + head.need > self.max_kv_tokens):
            return None  # nobody overtakes the question whose turn it is
        ticket = self._queue.pop()
        ticket.admitted_at = now
        metrics.QUEUE_SECONDS.observe(now - ticket.queued_at)
        self._active.append(ticket)
        metrics.QUEUE_LENGTH.set(len(self._queue))
        metrics.ACTIVE.set(len(self._active))
        return ticket

    def _iteration(self, ticket: _Ticket | None,
                   job: tuple[Callable[[], Any], Future[Any]] | None,
                   active: list[_Ticket]) -> None:
        rt = self._runtime_fn()
        with self._model_lock:
            if ticket is not None:
                ticket.steps = rt.prefill_steps(ticket.request, ticket.on_token)
                self._prefilling = ticket
            if self._prefilling is not None:
                self._prefill_phase(self._prefilling)
            if job is not None:
                fn, future = job
                try:
                    future.set_result(fn())
                except BaseException as exc:  # noqa: BLE001 - handed to the job's caller
                    future.set_exception(exc)
            running = []
            for t in active:
                if t.state is None:
                    continue
                if t.cancelled and not t.state.done:  # leaves at this step
                    t.state.decode.error = AnswerCancelledError("the client went away")
                    t.state.decode.done = True
                if not t.state.done:
                    running.append(t)
            if running:
                metrics.BATCH_SIZE.observe(len(running))
                with metrics.STEP_SECONDS.time():
                    rt.step([t.state for t in running if t.state is not None])
            for t in active:  # decode slots of the answers that ended (the lock guards the pool)
                if t.state is not None and t.state.done:
                    rt.release(t.state)
        self._retire(rt, active)

    def _prefill_phase(self, ticket: _Ticket) -> None:
        """One phase of the prefilling question; a failure (or its client gone) ends it
        alone."""
        assert ticket.steps is not None
        start = time.perf_counter()
        try:
            if ticket.cancelled:
                raise AnswerCancelledError("the client went away")
            phase = next(ticket.steps)
            metrics.PHASE_SECONDS.labels(phase).observe(time.perf_counter() - start)
            return
        except StopIteration as done:
            last = metrics.PREFILL_PHASES[-1]
            metrics.PHASE_SECONDS.labels(last).observe(time.perf_counter() - start)
            ticket.state = done.value
            assert ticket.state is not None
            ticket.need = ticket.state.kv_tokens  # the actual cache, not the estimate
        except BaseException as exc:  # noqa: BLE001 - handed to the question's caller
            ticket.steps.close()
            if isinstance(exc, AnswerCancelledError):
                metrics.CANCELLED.inc()
            with self._cond:
                self._active.remove(ticket)
                self._cond.notify_all()
            ticket.future.set_exception(exc)
        ticket.steps = None
        self._prefilling = None

    def _retire(self, rt: ReuseRuntime, active: list[_Ticket]) -> None:
        """Hand finished answers their results and free their slots."""
        done = [t for t in active if t.state is not None and t.state.done]
        if not done:
            return
        with self._cond:
            for t in done:
                self._active.remove(t)
            metrics.ACTIVE.set(len(self._active))
            self._cond.notify_all()
        for t in done:
            assert t.state is not None
            if t.state.error is not None:
                if isinstance(t.state.error, AnswerCancelledError):
                    metrics.CANCELLED.inc()
                t.future.set_exception(t.state.error)
            else:
                t.future.set_result(rt.result(t.state))
            t.state = None  # its cache goes now, not when the caller lets go

    def _fail(self, tickets: list[_Ticket], message: str) -> None:
        if self._prefilling in tickets:
            self._prefilling = None
        with self._cond:
            for t in tickets:
                if t in self._active:
                    self._active.remove(t)
            self._cond.notify_all()
        held = [t.state for t in tickets if t.state is not None]
        if held:  # their decode slots (a state exists only once the runtime does)
            rt = self._runtime_fn()
            with self._model_lock:
                for state in held:
                    rt.release(state)
        for t in tickets:
            t.state = None
            if not t.future.done():
                t.future.set_exception(RuntimeError(message))

    def _fail_all(self) -> None:
        """At close (under the condition): refuse everything still held."""
        for t in [*self._queue, *self._active]:
            if not t.future.done():
                t.future.set_exception(AnswerQueueFullError("the answer engine stopped"))
        for _, future in self._jobs:
            if not future.done():
                future.set_exception(RuntimeError("the answer engine stopped"))
        self._queue.clear()
        self._active.clear()
        self._jobs.clear()
