"""The answer engine's scheduler (`worker.scheduler`) on its own: admission under the slot and
KV budgets with nobody overtaking, turns between tenants, one newcomer prefilled at a time,
at most one unit of prefill work a step (a phase or a model job, taking turns), expiry of
the queue, and retirement freeing what an answer held. Real requests and, where an answer
must exist, real decode states of the tiny builtin model."""

from __future__ import annotations

import threading
from concurrent.futures import Future

import pytest

from conduit_core import AnswerRequest, PageInput, ReuseRuntime
from conduit_core.answer_state import AnswerState
from tests.core.conftest import load_builtin
from tests.core.helpers import IMAGES
from worker.errors import AnswerCancelledError, AnswerQueueFullError
from worker.scheduler import Job, Scheduler, Ticket


@pytest.fixture(scope="module")
def rt(tmp_path_factory: pytest.TempPathFactory) -> ReuseRuntime:
    return ReuseRuntime(load_builtin("builtin:tiny-qwen2-vl", tmp_path_factory.mktemp("models")))


def _ticket(name: str, tenant: str = "", need: int = 100) -> Ticket:
    return Ticket(request=AnswerRequest("Be brief.", [], f"{name}?", max_new_tokens=1),
                  tenant=tenant, on_token=None, cancel=None, need=need)


def _state(rt: ReuseRuntime) -> AnswerState:
    """A real answer's decode state after its prefill (one token to go)."""
    kv = rt.prefill_pages([IMAGES["a"]])[0]
    steps = rt.prefill_steps(AnswerRequest("Be brief.", [PageInput("P:", kv)], "Why?",
                                           max_new_tokens=1))
    while True:
        try:
            next(steps)
        except StopIteration as done:
            state: AnswerState = done.value
            return state


def _job() -> Job:
    return (lambda: None, Future())


def test_admission_keeps_the_kv_budget_and_nobody_overtakes(rt: ReuseRuntime) -> None:
    s = Scheduler(max_active=8, max_kv_tokens=250, queue_wait_s=60)
    first, second, big, small = (_ticket("first"), _ticket("second"), _ticket("big", need=200),
                                 _ticket("small", need=10))
    for t in (first, second, big, small):
        s.submit(t)
    assert s.schedule().admitted is first
    assert s.schedule().admitted is None  # first is still prefilling: one newcomer at a time
    s.prefilled(first, _state(rt))
    out = s.schedule()
    assert out.admitted is second and out.prefill is second and out.decode == [first]
    s.prefilled(second, _state(rt))
    assert s.kv_reserved == first.need + second.need
    for _ in range(3):  # big does not fit beside them, and small does not overtake it
        assert s.schedule().admitted is None
    assert len(s.queue) == 2
    for t in (first, second):
        assert t.state is not None
        rt.step([t.state])  # its one token: the answer ends
    assert s.retire(s.finished()) == [first, second]
    assert s.schedule().admitted is big and s.kv_reserved == 200


def test_a_question_alone_is_admitted_whatever_its_size() -> None:
    s = Scheduler(max_active=2, max_kv_tokens=10, queue_wait_s=60)
    huge = _ticket("huge", need=1000)  # the engine refuses such a question before it queues
    s.submit(huge)
    assert s.schedule().admitted is huge


def test_slots_bound_the_batch(rt: ReuseRuntime) -> None:
    s = Scheduler(max_active=1, max_kv_tokens=1 << 20, queue_wait_s=60)
    a, b = _ticket("a"), _ticket("b")
    s.submit(a)
    s.submit(b)
    assert s.schedule().admitted is a
    s.prefilled(a, _state(rt))
    assert s.schedule().admitted is None and s.schedule().decode == [a]
    assert a.state is not None
    rt.step([a.state])
    s.retire(s.finished())
    assert s.schedule().admitted is b


def test_turns_between_tenants(rt: ReuseRuntime) -> None:
    s = Scheduler(max_active=8, max_kv_tokens=1 << 20, queue_wait_s=60)
    backlog = [_ticket(f"a{i}", tenant="a") for i in range(3)]
    for t in backlog:
        s.submit(t)
    late = _ticket("b0", tenant="b")
    s.submit(late)
    order = []
    for _ in range(4):
        out = s.schedule()
        assert out.admitted is not None
        order.append(out.admitted.request.question)
        s.prefilled(out.admitted, _state(rt))
    assert order == ["a0?", "b0?", "a1?", "a2?"]  # b's one question gets the second turn


def test_one_unit_of_prefill_work_a_step_phases_and_jobs_taking_turns() -> None:
    s = Scheduler(max_active=4, max_kv_tokens=1 << 20, queue_wait_s=60)
    q = _ticket("q")
    s.submit(q)
    jobs = [_job(), _job(), _job()]
    for j in jobs:
        s.submit_job(j)
    units = []
    for _ in range(6):
        out = s.schedule()
        assert not (out.prefill is not None and out.job is not None)
        units.append("phase" if out.prefill is q else "job" if out.job is not None else "-")
    assert units == ["phase", "job", "phase", "job", "phase", "job"]
    assert s.schedule().prefill is q  # the jobs done, the phases run every step
    s.submit_job(jobs[0])
    s.prefilling = None  # its prefill ended
    assert s.schedule().job is jobs[0]  # with no prefill, a job runs at once


def test_the_queue_drops_the_gone_and_refuses_the_expired() -> None:
    s = Scheduler(max_active=1, max_kv_tokens=1 << 20, queue_wait_s=5)
    holder, gone, old, fresh = (_ticket(n) for n in ("holder", "gone", "old", "fresh"))
    gone.cancel = threading.Event()
    gone.cancel.set()
    for t in (holder, gone, old, fresh):
        s.submit(t)
    old.queued_at -= 10
    out = s.schedule(now=fresh.queued_at + 1)
    assert out.admitted is holder
    why = {t.request.question: type(e) for t, e in out.expired}
    assert why == {"gone?": AnswerCancelledError, "old?": AnswerQueueFullError}
    assert list(s.queue) == [fresh]


def test_retire_frees_the_slot_and_the_prefill(rt: ReuseRuntime) -> None:
    s = Scheduler(max_active=1, max_kv_tokens=1 << 20, queue_wait_s=60)
    failing, nxt = _ticket("failing"), _ticket("next")
    s.submit(failing)
    s.submit(nxt)
    assert s.schedule().admitted is failing
    assert s.retire([failing, nxt]) == [failing]  # only what was admitted leaves the batch
    assert s.prefilling is None and s.kv_reserved == 0
    out = s.schedule()
    assert out.admitted is nxt and out.prefill is nxt
    tickets, jobs = s.drain()
    assert tickets == [nxt] and jobs == [] and not s.has_work


def test_an_answer_that_ended_leaves_at_retire(rt: ReuseRuntime) -> None:
    s = Scheduler(max_active=2, max_kv_tokens=1 << 20, queue_wait_s=60)
    t = _ticket("t")
    s.submit(t)
    s.schedule()
    s.prefilled(t, _state(rt))
    assert s.finished() == [] and s.schedule().decode == [t]
    assert t.state is not None
    rt.step([t.state])
    assert s.finished() == [t]
    s.retire([t])
    assert s.schedule().decode == [] and not s.has_work
    rt.release(t.state)
