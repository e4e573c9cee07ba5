"""The answer engine's scheduler: what one engine step runs, decided from what waits and what
runs, and nothing run here (`worker.engine` executes a step and hands its outcome back).

It decides four things. Admission: the question whose turn it is (`TenantQueue`: the tenant
served least recently, first come first served within a tenant) joins the batch when a slot
is free (`max_active`) and its KV fits (`max_kv_tokens` cache positions reserved by the
answers in the batch, each counted from `kv_tokens_needed` until its cache exists, then from
the cache itself); nobody overtakes the question whose turn it is, and a question waits
until the previous newcomer's prefill is done. Expiry: a queued question whose client went
away is dropped, one that waited longer than `queue_wait_s` is refused. Prefill work: at most
one unit a step, either the prefilling question (the engine runs its phases within the
step's prefill budget, `worker.prefill_pace`) or one model job (an ingest page batch), taking
turns when both wait, so the running batch decodes after every unit and its streams keep
flowing. Retirement: answers
that ended, or failed, leave the batch.

Not thread-safe: the engine calls it under its own lock.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from conduit_core.answer_state import AnswerState
from conduit_core.answer_types import AnswerRequest, TokenCallback
from conduit_core.runtime import PrefillSteps
from worker.errors import AnswerCancelledError, AnswerQueueFullError
from worker.fairness import TenantQueue

# slack for the prompt's template tokens (chat markers, generation prompt) over its text
TEMPLATE_TOKENS = 64

Job = tuple[Callable[[], Any], Future[Any]]  # model work run between decode steps, its result


def kv_tokens_needed(request: AnswerRequest) -> int:
    """An upper bound of the cache positions `request` allocates: its pages' tokens, its
    text (a token holds at least one character of it) plus the template, and its answer;
    for a follow-up, its earlier turns' pages, text and template too (its layout holds the
    whole conversation)."""
    pages = [*(p for t in request.history for p in t.pages), *request.pages]
    text = (len(request.prefix) + len(request.question) + sum(len(p.label) for p in pages)
            + sum(len(t.question) + len(t.answer) for t in request.history))
    return (sum(p.kv.num_tokens for p in pages) + text
            + TEMPLATE_TOKENS * (1 + len(request.history)) + request.max_new_tokens)


@dataclass(eq=False)  # identity: two questions over the same pages are still two tickets
class Ticket:
    """One submitted question, from the queue to its result."""

    request: AnswerRequest
    tenant: str  # whose question: admission takes turns between tenants
    on_token: TokenCallback | None
    cancel: threading.Event | None
    need: int  # KV positions reserved while admitted (the estimate, then the actual cache)
    queued_at: float = field(default_factory=time.perf_counter)
    admitted_at: float = 0.0
    steps: PrefillSteps | None = None  # its prefill, between admission and first logits
    phase: str | None = None  # the last phase of its prefill that ran
    state: AnswerState | None = None  # its decode state, from its first logits
    future: Future[Any] = field(default_factory=Future)  # its AnswerResult or error

    @property
    def cancelled(self) -> bool:
        return self.cancel is not None and self.cancel.is_set()

    @property
    def running(self) -> bool:
        """Decoding: its prefill is done and its answer is not."""
        return self.state is not None and not self.state.done


@dataclass(frozen=True)
class SchedulerOutput:
    """What one engine step runs, in this order."""

    admitted: Ticket | None  # joined the batch: the prefilling question from now on
    prefill: Ticket | None  # runs its next prefill phases
    job: Job | None  # runs one model job (never in the same step as a prefill phase)
    decode: list[Ticket]  # the running batch: one batched decode step
    expired: list[tuple[Ticket, BaseException]]  # left the queue; told why, nothing run
    backlog: int = 0  # questions queued beyond the free slots: the batch cannot take them all

    @property
    def idle(self) -> bool:
        return (self.prefill is None and self.job is None and not self.decode
                and not self.expired)


class Scheduler:
    """The queue, the batch and the prefill in progress; see the module docstring."""

    def __init__(self, *, max_active: int, max_kv_tokens: int, queue_wait_s: float) -> None:
        self.max_active = max_active
        self.max_kv_tokens = max_kv_tokens
        self.queue_wait_s = queue_wait_s
        self.queue: TenantQueue[Ticket] = TenantQueue()
        self.jobs: deque[Job] = deque()
        self.active: list[Ticket] = []  # admitted: prefilling or decoding
        self.prefilling: Ticket | None = None
        self._job_turn = False  # whose turn it is when a prefill phase and a job both wait

    # ---- what comes in -------------------------------------------------------------
    def submit(self, ticket: Ticket) -> None:
        """Queue `ticket` behind its tenant's earlier questions."""
        self.queue.push(ticket.tenant, ticket)

    def submit_job(self, job: Job) -> None:
        """Queue a model job behind the earlier ones."""
        self.jobs.append(job)

    @property
    def has_work(self) -> bool:
        return bool(self.queue or self.jobs or self.active)

    @property
    def kv_reserved(self) -> int:
        """Cache positions reserved by the admitted answers."""
        return sum(t.need for t in self.active)

    # ---- one step ------------------------------------------------------------------
    def schedule(self, now: float | None = None) -> SchedulerOutput:
        """Decide the next step: expire the queue, admit, pick the unit of prefill work and
        the running batch."""
        now = time.perf_counter() if now is None else now
        expired = self._expire(now)
        admitted = self._admit(now) if self.prefilling is None else None
        prefill, job = self.prefilling, None
        if self.jobs and (prefill is None or self._job_turn):
            prefill, job = None, self.jobs.popleft()
        if prefill is not None and job is None and self.jobs:
            self._job_turn = True  # a job waits behind this phase: it goes next
        elif job is not None:
            self._job_turn = False
        decode = [t for t in self.active if t.running]
        backlog = max(0, len(self.queue) - (self.max_active - len(self.active)))
        return SchedulerOutput(admitted=admitted, prefill=prefill, job=job, decode=decode,
                               expired=expired, backlog=backlog)

    def _expire(self, now: float) -> list[tuple[Ticket, BaseException]]:
        out: list[tuple[Ticket, BaseException]] = []
        for waiting in list(self.queue):
            if waiting.cancelled:
                out.append((waiting, AnswerCancelledError("the client went away")))
            elif now - waiting.queued_at > self.queue_wait_s:
                out.append((waiting, AnswerQueueFullError(
                    f"no answer slot freed within {self.queue_wait_s:.0f} s; retry later")))
        for ticket, _ in out:
            self.queue.remove(ticket)
        return out

    def _admit(self, now: float) -> Ticket | None:
        head = self.queue.peek()
        if head is None:
            return None
        if len(self.active) >= self.max_active or (
                self.active and self.kv_reserved + head.need > self.max_kv_tokens):
            return None  # nobody overtakes the question whose turn it is
        ticket = self.queue.pop()
        ticket.admitted_at = now
        self.active.append(ticket)
        self.prefilling = ticket
        return ticket

    # ---- what a step did -----------------------------------------------------------
    def prefilled(self, ticket: Ticket, state: AnswerState) -> None:
        """`ticket`'s prefill ended with its first logits: it decodes from the next step,
        reserving its actual cache rather than the estimate."""
        ticket.steps, ticket.state = None, state
        ticket.need = state.kv_tokens
        if self.prefilling is ticket:
            self.prefilling = None

    def retire(self, tickets: list[Ticket]) -> list[Ticket]:
        """Take `tickets` (answers ended, failed or abandoned) out of the batch; returns
        those that were in it."""
        gone = [t for t in tickets if t in self.active]
        for t in gone:
            self.active.remove(t)
            if self.prefilling is t:
                self.prefilling = None
            t.steps = None
        return gone

    def finished(self) -> list[Ticket]:
        """The admitted answers whose decoding ended (their last token or an error)."""
        return [t for t in self.active if t.state is not None and t.state.done]

    def drain(self) -> tuple[list[Ticket], list[Job]]:
        """Everything held (queued and admitted questions, waiting jobs), now emptied."""
        tickets, jobs = [*self.queue, *self.active], list(self.jobs)
        self.queue.clear()
        self.active.clear()
        self.jobs.clear()
        self.prefilling = None
        return tickets, jobs
