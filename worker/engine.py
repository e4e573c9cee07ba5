"""`AnswerEngine`: one per process, the only thread that runs the model. Concurrent questions
are batched (continuous batching); a newcomer's prefill and ingest page batches run between
the running answers' decode steps.

The engine thread repeats one step, in three parts. Schedule: `worker.scheduler.Scheduler`
decides, under the engine's lock, what the step runs (`SchedulerOutput`: admission in turn
across tenants under the slot and KV budgets, at most one unit of prefill work, the running
batch). Execute: under `model_lock`, outside the engine's lock, the step runs phases of
the prefilling question (`ReuseRuntime.prefill_steps`: page-KV assembly and re-rotation;
scoring pass and selection; refresh and first-token logits; the two passes cut into groups of
`layer_group` decoder layers, each group a phase), as many as fit in the step's prefill
budget and at least one (`worker.prefill_pace`: a share of the running batch's decode step
time; all of them when no answer is decoding), or one queued model job
(`run`), then one batched decode step of every running answer (`ReuseRuntime.step`), the
newcomer whose prefill just ended among them. So a running answer waits between two tokens
for about `1 + prefill_share` decode steps, however many questions arrive. Update: finished and
failed answers leave the batch and are handed their results. `model_lock` is also taken by
code outside the engine that uses the runtime directly (the lab's evaluation harness).

A question leaves the batch at the next step when its token callback raises (a client gone)
or its `cancel` event is set; a question that waits longer than `queue_wait_s` for a slot is
refused (`AnswerQueueFullError`, 503 with Retry-After). Memory stays bounded: at most
`max_active` caches and `max_kv_tokens` positions; a question that alone needs more is
refused at once (`AnswerTooLargeError`, 422).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, TypeVar

from conduit_core.answer_state import AnswerState
from conduit_core.answer_types import AnswerRequest, AnswerResult, TokenCallback
from conduit_core.runtime import ReuseRuntime
from worker import engine_metrics as metrics
from worker.errors import AnswerCancelledError, AnswerQueueFullError, AnswerTooLargeError
from worker.prefill_pace import PrefillPace
from worker.scheduler import Scheduler, SchedulerOutput, Ticket, kv_tokens_needed

log = logging.getLogger(__name__)
T = TypeVar("T")

__all__ = ["AnswerEngine", "EngineStats", "kv_tokens_needed"]


@dataclass
class StepOutcome:
    """What the execute part of a step leaves to its update part."""

    prefilled: tuple[Ticket, AnswerState] | None = None  # a prefill that reached its logits
    failed: list[tuple[Ticket, BaseException]] = field(default_factory=list)


@dataclass(frozen=True)
class EngineStats:
    """What the engine holds now."""

    queued: int  # questions waiting for a slot
    active: int  # answers in the running batch
    kv_tokens: int  # cache positions reserved by the active answers
    jobs: int  # model jobs (ingest page batches) waiting


class AnswerEngine:
    """Batches concurrent questions over one model; see the module docstring.
    `prefill_share`: a step's prefill budget over the running batch's decode step time;
    `prefill_budget_s`: a fixed budget in its place (0: one phase a step)."""

    def __init__(self, runtime: Callable[[], ReuseRuntime], *, max_active: int = 16,
                 max_kv_tokens: int = 65536, queue_wait_s: float = 60.0,
                 model_lock: Any | None = None, prefill_share: float = 0.5,
                 prefill_budget_s: float | None = None) -> None:
        self._runtime_fn = runtime
        self._model_lock = model_lock if model_lock is not None else threading.Lock()
        self._cond = threading.Condition()  # guards the scheduler and `_closed`
        self._scheduler = Scheduler(max_active=max_active, max_kv_tokens=max_kv_tokens,
                                    queue_wait_s=queue_wait_s)
        self._closed = False
        self._pace = PrefillPace(prefill_share, prefill_budget_s)
        self._thread = threading.Thread(target=self._loop, name="conduit-engine", daemon=True)
        self._thread.start()

    @property
    def max_active(self) -> int:
        return self._scheduler.max_active

    @property
    def max_kv_tokens(self) -> int:
        return self._scheduler.max_kv_tokens

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
        ticket = Ticket(request=request, tenant=tenant, on_token=on_token, cancel=cancel,
                        need=need)
        with self._cond:
            if self._closed:
                raise AnswerQueueFullError("the answer engine is shutting down; retry")
            self._scheduler.submit(ticket)
            metrics.QUEUE_LENGTH.set(len(self._scheduler.queue))
            self._cond.notify_all()
        result: AnswerResult = ticket.future.result()
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
            self._scheduler.submit_job((fn, future))
            self._cond.notify_all()
        return future.result()

    def stats(self) -> EngineStats:
        """Queue length, batch size and reserved KV now."""
        with self._cond:
            s = self._scheduler
            return EngineStats(queued=len(s.queue), active=len(s.active),
                               kv_tokens=s.kv_reserved, jobs=len(s.jobs))

    def close(self) -> None:
        """Stop: questions and jobs still waiting are refused; running answers end."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout=30)

    # ---- the engine thread: schedule -> execute -> update ----------------------------
    def _loop(self) -> None:
        while True:
            with self._cond:
                while not (self._closed or self._scheduler.has_work):
                    self._cond.wait()
                if self._closed:
                    self._fail_all()
                    return
                out = self._scheduler.schedule()
                self._scheduled(out)
                if out.idle:  # nothing can run until a question or a job comes in
                    self._cond.wait(0.1)  # (or a queued one expires)
                    continue
            try:
                outcome = self._execute(out)
            except Exception:  # noqa: BLE001 - keep serving; the failed answers are told
                log.exception("answer engine step failed")
                outcome = StepOutcome(failed=[
                    (t, RuntimeError("internal error while answering"))
                    for t in [*([out.prefill] if out.prefill else []), *out.decode]])
            try:
                self._update(outcome)
            except Exception:  # noqa: BLE001 - the engine thread must not die
                log.exception("answer engine could not retire the step's answers")

    def _scheduled(self, out: SchedulerOutput) -> None:
        """Tell what left the queue and export the queue's gauges (under the lock)."""
        for ticket, error in out.expired:
            if isinstance(error, AnswerCancelledError):
                metrics.CANCELLED.inc()
            ticket.future.set_exception(error)
        if out.admitted is not None:
            metrics.QUEUE_SECONDS.observe(out.admitted.admitted_at - out.admitted.queued_at)
        metrics.QUEUE_LENGTH.set(len(self._scheduler.queue))
        metrics.ACTIVE.set(len(self._scheduler.active))

    def _execute(self, out: SchedulerOutput) -> StepOutcome:
        """Run the step's model work: its unit of prefill work, then the decode step."""
        outcome = StepOutcome()
        rt = self._runtime_fn()
        with self._model_lock:
            if out.prefill is not None:
                self._prefill_phases(rt, out.prefill, outcome,
                                     self._pace.budget(bool(out.decode), out.backlog))
            if out.job is not None:
                fn, future = out.job
                try:
                    future.set_result(fn())
                except BaseException as exc:  # noqa: BLE001 - handed to the job's caller
                    future.set_exception(exc)
            batch = list(out.decode)
            if outcome.prefilled is not None:  # the newcomer decodes its first token now
                newcomer, state = outcome.prefilled
                newcomer.state = state
                batch.append(newcomer)
            running = []
            for t in batch:
                assert t.state is not None
                if t.cancelled and not t.state.done:  # leaves at this step
                    t.state.decode.error = AnswerCancelledError("the client went away")
                    t.state.decode.done = True
                if not t.state.done:
                    running.append(t.state)
            if running:
                metrics.BATCH_SIZE.observe(len(running))
                began = time.perf_counter()
                rt.step(running)
                took = time.perf_counter() - began
                self._pace.decoded(took)
                metrics.STEP_SECONDS.observe(took)
            for t in batch:  # decode slots of the answers that ended (the lock guards the pool)
                if t.state is not None and t.state.done:
                    rt.release(t.state)
        return outcome

    def _prefill_phases(self, rt: ReuseRuntime, ticket: Ticket, outcome: StepOutcome,
                        budget_s: float) -> None:
        """Phases of `ticket`'s prefill, at least one, until it ends, its client is gone or
        the next would not fit in `budget_s`; a failure (or its client gone) ends it
        alone."""
        began = start = time.perf_counter()
        try:
            if ticket.cancelled:
                raise AnswerCancelledError("the client went away")
            if ticket.steps is None:
                ticket.steps = rt.prefill_steps(ticket.request, ticket.on_token)
            while True:
                phase = next(ticket.steps)
                now = time.perf_counter()
                metrics.PHASE_SECONDS.labels(phase).observe(now - start)
                self._pace.ran(ticket.phase, now - start)
                ticket.phase = phase
                if ticket.cancelled or not self._pace.fits(phase, now - began, budget_s):
                    break
                start = now
        except StopIteration as done:
            last = metrics.PREFILL_PHASES[-1]
            took = time.perf_counter() - start
            metrics.PHASE_SECONDS.labels(last).observe(took)
            self._pace.ran(ticket.phase, took)
            outcome.prefilled = (ticket, done.value)
        except BaseException as exc:  # noqa: BLE001 - handed to the question's caller
            if ticket.steps is not None:
                ticket.steps.close()
            outcome.failed.append((ticket, exc))

    def _update(self, outcome: StepOutcome) -> None:
        """Take the ended and failed answers out of the batch, then hand them their
        results (outside the lock: a result is computed from its answer's state)."""
        with self._cond:
            if outcome.prefilled is not None:
                self._scheduler.prefilled(*outcome.prefilled)
            failed = self._scheduler.retire([t for t, _ in outcome.failed])
            done = self._scheduler.retire(self._scheduler.finished())
            metrics.ACTIVE.set(len(self._scheduler.active))
            self._cond.notify_all()
        if failed:
            self._release([t for t in failed if t.state is not None])
        for ticket, error in outcome.failed:
            if ticket in failed:
                self._tell(ticket, error)
        for t in done:
            assert t.state is not None
            if t.state.error is not None:
                self._tell(t, t.state.error)
            else:
                t.future.set_result(self._runtime_fn().result(t.state))
            t.state = None  # its cache goes now, not when the caller lets go

    def _release(self, tickets: list[Ticket]) -> None:
        """Give back the decode slots of answers dropped mid-way."""
        rt = self._runtime_fn()
        with self._model_lock:
            for t in tickets:
                assert t.state is not None
                rt.release(t.state)

    @staticmethod
    def _tell(ticket: Ticket, error: BaseException) -> None:
        if isinstance(error, AnswerCancelledError):
            metrics.CANCELLED.inc()
        ticket.state = None
        if not ticket.future.done():
            ticket.future.set_exception(error)

    def _fail_all(self) -> None:
        """At close (under the lock): refuse everything still held."""
        tickets, jobs = self._scheduler.drain()
        for t in tickets:
            if not t.future.done():
                t.future.set_exception(AnswerQueueFullError("the answer engine stopped"))
        for _, future in jobs:
            if not future.done():
                future.set_exception(RuntimeError("the answer engine stopped"))
