"""Fair sharing between tenants, in process (issue 60, point 3): the turn order of
`TenantQueue`, `TenantSlots`' cap, the reader memory budget, and the answer engine's
admission across tenants (a real tiny transformers model). The ingest queue's turns, the
caps and the probes are checked over HTTP in `tests/faults/test_fair_tenants.py`."""

from __future__ import annotations

import threading
import time

import pytest

from conduit_core import AnswerRequest, PageInput, ReuseRuntime
from tests.core.conftest import load_builtin
from tests.core.helpers import IMAGES
from worker.engine import AnswerEngine
from worker.fairness import TenantBusyError, TenantQueue, TenantSlots
from worker.ingest.budget import ReaderBudget
from worker.ingest.errors import ReaderBudgetError


def test_a_tenant_with_many_items_gets_every_other_turn() -> None:
    q: TenantQueue[str] = TenantQueue()
    q.push("a", "a1")
    assert q.pop() == "a1"  # a1 runs; a queues three more, then b one
    for item in ("a2", "a3", "a4"):
        q.push("a", item)
    q.push("b", "b1")
    assert list(q) == ["a2", "a3", "a4", "b1"]  # oldest first
    assert q.peek() == "b1"  # a was served last: b goes first (a FIFO gives a2)
    assert [q.pop() for _ in range(4)] == ["b1", "a2", "a3", "a4"]
    assert len(q) == 0 and q.peek() is None
    with pytest.raises(IndexError):
        q.pop()


def test_turns_alternate_and_remove_drops_one_item() -> None:
    q: TenantQueue[str] = TenantQueue()
    for item in ("a1", "a2", "a3"):
        q.push("a", item)
    for item in ("b1", "b2"):
        q.push("b", item)
    q.remove("a2")
    assert [q.pop() for _ in range(4)] == ["a1", "b1", "a3", "b2"]


def test_slots_refuse_beyond_the_cap_counting_what_is_held_elsewhere() -> None:
    slots = TenantSlots(2, "answers in flight", "CONDUIT_MAX_ANSWERS_PER_TENANT")
    with slots.hold("a"), slots.hold("a"):
        with pytest.raises(TenantBusyError) as refused:
            with slots.hold("a"):
                pass
        assert refused.value.http_status == 429
        assert "CONDUIT_MAX_ANSWERS_PER_TENANT" in refused.value.message
        with slots.hold("b"):  # another tenant is not affected
            assert slots.held("b") == 1
        assert slots.held("a") == 2
    assert slots.held("a") == 0
    with pytest.raises(TenantBusyError):  # one held elsewhere, plus two here
        with slots.hold("a", already=1), slots.hold("a", already=1):
            pass
    with TenantSlots(0, "x", "y").hold("a", already=10 ** 6):  # 0 = unlimited
        pass


def test_the_reader_budget_bounds_the_sum_of_reservations() -> None:
    budget = ReaderBudget(2048)
    first, second = budget.reserve(1024, 0), budget.reserve(1024, 0)
    assert budget.in_use_mb == 2048
    with pytest.raises(ReaderBudgetError):  # no wait: refused at once
        budget.reserve(1024, 0)
    with pytest.raises(ReaderBudgetError) as refused:
        budget.reserve(1024, 0.05)
    assert refused.value.http_status == 503 and "CONDUIT_READER_MEMORY_MB" in refused.value.message
    threading.Timer(0.1, first.release).start()  # a waiting reader starts when one ends
    third = budget.reserve(1024, 5)
    first.release()  # releasing twice gives nothing back twice
    assert budget.in_use_mb == 2048 and budget.peak_mb == 2048
    second.release()
    third.release()
    whole = budget.reserve(4096, 0)  # a reader above the whole budget runs alone
    assert budget.in_use_mb == 2048
    with pytest.raises(ReaderBudgetError):
        budget.reserve(1, 0)
    whole.release()
    assert budget.in_use_mb == 0


@pytest.fixture(scope="module")
def rt(tmp_path_factory: pytest.TempPathFactory) -> ReuseRuntime:
    runtime = ReuseRuntime(load_builtin("builtin:tiny-qwen2-vl",
                                        tmp_path_factory.mktemp("models")))
    runtime.reuse.stop_ids = []  # every answer runs to its max_new_tokens
    return runtime


def test_the_engine_admits_another_tenants_question_before_a_tenants_backlog(
        rt: ReuseRuntime) -> None:
    kvs = rt.prefill_pages([IMAGES["a"]])
    engine = AnswerEngine(lambda: rt, max_active=1)
    first_token: list[str] = []
    hold = threading.Event()  # a1's first token holds the engine until the others queue

    def ask(name: str, tenant: str) -> None:
        seen = threading.Event()

        def on_token(_t: int, _p: str) -> None:
            if not seen.is_set():
                seen.set()
                first_token.append(name)  # the engine thread: one at a time
                if name == "a1":
                    hold.wait(60)
        engine.answer(AnswerRequest("Be brief.", [PageInput("P:", kvs[0])], f"Q {name}?",
                                    max_new_tokens=4), on_token=on_token, tenant=tenant)

    threads = [threading.Thread(target=ask, args=("a1", "a"))]
    try:
        threads[0].start()
        while not first_token:  # a1 holds the only slot
            time.sleep(0.01)
        for name, tenant in [("a2", "a"), ("a3", "a"), ("a4", "a"), ("b1", "b")]:
            threads.append(threading.Thread(target=ask, args=(name, tenant)))
            threads[-1].start()
            while engine.stats().queued < len(threads) - 1:  # queued in this order
                time.sleep(0.01)
        hold.set()
        for t in threads:
            t.join(120)
    finally:
        hold.set()
        engine.close()
    # first come first served would give a1 a2 a3 a4 b1
    assert first_token == ["a1", "b1", "a2", "a3", "a4"], first_token
