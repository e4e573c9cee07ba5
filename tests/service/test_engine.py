"""The answer engine (`worker.engine`): concurrent questions are decoded together and give
the answers they give alone; slots, KV in flight and the queue wait bound what it holds;
a cancelled question or a raising token callback leaves the batch; model jobs (ingest page
batches) run between decode steps. Real tiny model, real threads."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from conduit_core import AnswerRequest, PageInput, ReuseRuntime
from conduit_core.answer_types import AnswerResult
from lab import answering
from tests.core.conftest import load_builtin
from tests.core.helpers import IMAGES
from worker.engine import AnswerEngine, kv_tokens_needed
from worker.engine_metrics import PREFILL_PHASES
from worker.errors import AnswerCancelledError, AnswerQueueFullError, AnswerTooLargeError


@pytest.fixture(scope="module")
def rt(tmp_path_factory: pytest.TempPathFactory) -> ReuseRuntime:
    runtime = ReuseRuntime(load_builtin("builtin:tiny-qwen2-vl",
                                        tmp_path_factory.mktemp("models")))
    runtime.reuse.stop_ids = []  # every answer runs to its max_new_tokens
    return runtime


@pytest.fixture(scope="module")
def requests(rt: ReuseRuntime) -> list[AnswerRequest]:
    kvs = rt.prefill_pages([IMAGES[k] for k in "abc"])
    return [AnswerRequest("Be brief.", [PageInput(f"P{j}:", kvs[j]) for j in range(1 + i % 3)],
                          f"Question number {i}: " + "why? " * i, max_new_tokens=6 + i)
            for i in range(6)]


def _batch_steps() -> tuple[float, float]:
    """(decode steps so far, answers advanced by them)."""
    count = REGISTRY.get_sample_value("conduit_engine_batch_size_count") or 0.0
    total = REGISTRY.get_sample_value("conduit_engine_batch_size_sum") or 0.0
    return count, total


def _concurrently(engine: AnswerEngine, reqs: list[AnswerRequest]
                  ) -> list[tuple[AnswerResult, float] | BaseException]:
    out: list[tuple[AnswerResult, float] | BaseException] = [RuntimeError("unset")] * len(reqs)
    start = threading.Barrier(len(reqs))

    def ask(i: int) -> None:
        start.wait()
        try:
            out[i] = engine.answer(reqs[i])
        except BaseException as exc:  # noqa: BLE001 - checked by the test
            out[i] = exc
    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(reqs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return out


def test_concurrent_questions_are_batched_and_answer_as_alone(
        rt: ReuseRuntime, requests: list[AnswerRequest]) -> None:
    for r in requests:  # the page labels cached: a label miss can tip the cost model to the
        answering.answer(rt, r)  # fallback for one answer and not for the next (tests/core)
    alone = [answering.answer(rt, r).token_ids for r in requests]
    engine = AnswerEngine(lambda: rt, max_active=8)
    try:
        before = _batch_steps()
        got = _concurrently(engine, requests)
        after = _batch_steps()
    finally:
        engine.close()
    for i, item in enumerate(got):
        assert not isinstance(item, BaseException), item
        assert item[0].token_ids == alone[i] and item[1] >= 0
    steps, advanced = after[0] - before[0], after[1] - before[1]
    assert rt.pool.size == 0  # every decode slot given back
    assert advanced == sum(len(t) for t in alone)  # every token picked in some step
    assert steps < advanced  # several answers per forward: they were batched


def _timings() -> dict[str, float]:
    """Counts and sums of the step and prefill-phase histograms so far."""
    names = {"steps": ("conduit_engine_step_seconds_count", {}),
             "step_s": ("conduit_engine_step_seconds_sum", {})}
    for phase in PREFILL_PHASES:
        names[phase] = ("conduit_engine_prefill_phase_seconds_count", {"phase": phase})
        names[phase + "_s"] = ("conduit_engine_prefill_phase_seconds_sum", {"phase": phase})
    return {k: REGISTRY.get_sample_value(n, labels) or 0.0 for k, (n, labels) in names.items()}


def test_step_and_prefill_phase_times_are_exported(
        rt: ReuseRuntime, requests: list[AnswerRequest]) -> None:
    engine = AnswerEngine(lambda: rt, max_active=4)
    try:
        before, steps_before = _timings(), _batch_steps()
        got = _concurrently(engine, requests)
        after, steps_after = _timings(), _batch_steps()
    finally:
        engine.close()
    assert all(not isinstance(g, BaseException) for g in got)
    delta = {k: after[k] - before[k] for k in after}
    assert delta["steps"] == steps_after[0] - steps_before[0] > 0  # one time per decode step
    assert delta["step_s"] > 0
    for phase in PREFILL_PHASES:  # each question's three phases, timed
        assert delta[phase] == len(requests) and delta[phase + "_s"] > 0


def test_one_slot_is_serial_and_first_come_first_served(
        rt: ReuseRuntime, requests: list[AnswerRequest]) -> None:
    engine = AnswerEngine(lambda: rt, max_active=1)
    order: list[int] = []
    try:
        got = _concurrently(engine, requests[:3])
        assert all(not isinstance(g, BaseException) for g in got)
        queued = sorted(g[1] for g in got if not isinstance(g, BaseException))
        assert queued[0] < 0.05 and queued[-1] > queued[0]  # the later ones waited
        before = _batch_steps()
        for i in range(3):  # sequential submissions come back in order
            engine.answer(requests[i], on_token=lambda _t, _p, i=i: order.append(i))  # type: ignore[misc]
        steps, advanced = (a - b for a, b in zip(_batch_steps(), before, strict=True))
        assert steps == advanced  # a batch of one every step
    finally:
        engine.close()
    assert order == sorted(order)


def test_kv_in_flight_bounds_the_batch(rt: ReuseRuntime,
                                       requests: list[AnswerRequest]) -> None:
    need = max(kv_tokens_needed(r) for r in requests[:4])
    engine = AnswerEngine(lambda: rt, max_active=8, max_kv_tokens=need + need // 2)
    widest: list[int] = []
    real = rt.step

    def watch(states: list) -> None:  # type: ignore[type-arg]
        widest.append(engine.stats().kv_tokens)
        real(states)
    rt.step = watch  # type: ignore[method-assign]
    try:
        got = _concurrently(engine, requests[:4])
    finally:
        rt.step = real  # type: ignore[method-assign]
        engine.close()
    assert all(not isinstance(g, BaseException) for g in got)
    assert max(widest) <= need + need // 2
    with pytest.raises(AnswerTooLargeError):
        AnswerEngine(lambda: rt, max_kv_tokens=16).answer(requests[0])


def test_queue_wait_refuses_with_503(rt: ReuseRuntime, requests: list[AnswerRequest]) -> None:
    engine = AnswerEngine(lambda: rt, max_active=1, queue_wait_s=0.05)
    slow = threading.Event()

    def hold(_t: int, _p: str) -> None:
        slow.wait(2)  # the running answer keeps the only slot for a while
    try:
        first = threading.Thread(target=engine.answer, args=(requests[5], hold))
        first.start()
        with pytest.raises(AnswerQueueFullError) as info:
            engine.answer(requests[0])
        assert info.value.http_status == 503
        slow.set()
        first.join(30)
    finally:
        engine.close()


def test_cancelled_and_gone_questions_leave_the_batch(
        rt: ReuseRuntime, requests: list[AnswerRequest]) -> None:
    engine = AnswerEngine(lambda: rt, max_active=4)
    try:
        cancel = threading.Event()
        cancel.set()
        with pytest.raises(AnswerCancelledError):
            engine.answer(requests[1], cancel=cancel)
        seen: list[int] = []

        def gone(tok: int, _p: str) -> None:
            seen.append(tok)
            raise AnswerCancelledError("client went away")
        with pytest.raises(AnswerCancelledError):
            engine.answer(requests[2], on_token=gone)
        assert len(seen) == 1
        assert engine.stats().active == 0  # its slot and cache are free
        later = threading.Event()  # the client goes away while its answer decodes

        def leaving(_tok: int, _p: str) -> None:
            later.set()
        with pytest.raises(AnswerCancelledError):
            engine.answer(requests[2], on_token=leaving, cancel=later)
        assert rt.pool.size == 0  # its decode slot given back
        # the engine goes on serving
        assert engine.answer(requests[0])[0].token_ids == answering.answer(rt,
            requests[0]).token_ids
        assert rt.pool.size == 0
    finally:
        engine.close()


def test_model_jobs_run_between_decode_steps(rt: ReuseRuntime,
                                             requests: list[AnswerRequest]) -> None:
    engine = AnswerEngine(lambda: rt, max_active=4)
    steps_seen: list[float] = []

    def job() -> int:
        steps_seen.append(_batch_steps()[0])
        return 7
    try:
        runner = threading.Thread(target=engine.answer, args=(requests[5],))
        runner.start()
        assert engine.run(job) == 7
        with pytest.raises(ZeroDivisionError):
            engine.run(lambda: 1 // 0)
        runner.join(30)
        pages = engine.run(lambda: rt.prefill_pages([IMAGES["a"]]))
        assert pages[0].num_tokens > 0
    finally:
        engine.close()
    with pytest.raises(RuntimeError):
        engine.run(job)


def test_close_refuses_what_waits(rt: ReuseRuntime, tmp_path: Path) -> None:
    engine = AnswerEngine(lambda: rt)
    engine.close()
    with pytest.raises(AnswerQueueFullError):
        engine.answer(AnswerRequest("", [], "q?", max_new_tokens=1))


def _log_phases(rt: ReuseRuntime, events: list[str],
                on_phase: Callable[[str], None] | None = None) -> Callable[[], None]:
    """Make `rt.prefill_steps` append "<question head>:<phase>" (then ":state") to
    `events`; returns the function that puts the real one back."""
    real = rt.prefill_steps

    def logged(request: AnswerRequest, on_token=None, t0=None):  # type: ignore[no-untyped-def]
        name = request.question[:18]
        steps = real(request, on_token, t0)
        while True:
            try:
                phase = next(steps)
            except StopIteration as done:
                events.append(f"{name}:state")
                return done.value
            events.append(f"{name}:{phase}")
            if on_phase is not None:
                on_phase(name)
            yield phase
    rt.prefill_steps = logged  # type: ignore[method-assign]

    def restore() -> None:
        rt.prefill_steps = real  # type: ignore[method-assign]
    return restore


def _while_a_streams(engine: AnswerEngine, a: AnswerRequest, events: list[str],
                     during: Callable[[], AnswerResult]) -> AnswerResult:
    """Run `during` while the long answer `a` streams (its tokens logged as "A:token")."""
    started = threading.Event()

    def token_a(_t: int, _p: str) -> None:
        events.append("A:token")
        started.set()
    runner = threading.Thread(target=engine.answer, args=(a, token_a))
    runner.start()
    assert started.wait(30)
    got = during()
    runner.join(30)
    return got


def test_running_answers_decode_between_the_phases_of_a_prefill(
        rt: ReuseRuntime, requests: list[AnswerRequest]) -> None:
    events: list[str] = []
    cancel_b = threading.Event()

    def leave_b(name: str) -> None:
        if name == requests[1].question[:18]:
            cancel_b.set()  # its client goes away during its prefill
    restore = _log_phases(rt, events, leave_b)
    engine = AnswerEngine(lambda: rt, max_active=4, prefill_budget_s=0.0)  # a phase a step
    a, c = dataclasses.replace(requests[5], max_new_tokens=150), requests[3]
    name_a, name_c = a.question[:18], c.question[:18]

    def b_then_c() -> AnswerResult:
        with pytest.raises(AnswerCancelledError):
            engine.answer(requests[1], cancel=cancel_b)  # leaves at its next phase
        return engine.answer(c)[0]
    try:
        got = _while_a_streams(engine, a, events, b_then_c)
    finally:
        restore()
        engine.close()
    assert got.token_ids == answering.answer(rt, c).token_ids
    phases = [events.index(f"{name_c}:{p}") for p in ("assembled", "chosen", "state")]
    for before, after in zip(phases, phases[1:], strict=False):
        assert "A:token" in events[before:after], events  # A streamed during C's prefill
    assert f"{name_a}:state" in events and f"{requests[1].question[:18]}:chosen" not in events
    assert engine.stats().active == 0


def test_questions_over_the_same_pages_leave_in_any_order(
        rt: ReuseRuntime, requests: list[AnswerRequest]) -> None:
    """Tickets are compared by identity: retiring an answer that finishes before an earlier
    one over the same pages compared their requests field by field, down to the page
    tensors, and the error killed the engine thread (seen in the load bench)."""
    def pages() -> list[PageInput]:  # equal pages in new tensors, as each question loads them
        return [PageInput(f"P{j}:", kv) for j, kv in enumerate(rt.prefill_pages([IMAGES["a"]]))]
    same = [AnswerRequest("Be brief.", pages(), f"Same pages, question {i}?",
                          max_new_tokens=n) for i, n in enumerate((12, 2, 7))]
    engine = AnswerEngine(lambda: rt, max_active=4)
    try:
        got = _concurrently(engine, same)
        assert all(not isinstance(g, BaseException) for g in got), got
        assert engine.answer(requests[0])[0].token_ids == answering.answer(rt,
            requests[0]).token_ids
    finally:
        engine.close()


def test_a_step_runs_a_newcomers_phases_within_its_prefill_budget(
        rt: ReuseRuntime, requests: list[AnswerRequest]) -> None:
    """With no bound on a step's prefill time, a newcomer's phases all run in one step: the
    running answer gets no token between them (with a bound of 0, one phase a step: the
    test above)."""
    events: list[str] = []
    restore = _log_phases(rt, events)
    engine = AnswerEngine(lambda: rt, max_active=4, prefill_budget_s=float("inf"))
    a, c = dataclasses.replace(requests[5], max_new_tokens=150), requests[3]
    try:
        got = _while_a_streams(engine, a, events, lambda: engine.answer(c)[0])
    finally:
        restore()
        engine.close()
    assert got.token_ids == answering.answer(rt, c).token_ids
    name = c.question[:18]
    first, last = events.index(f"{name}:assembled"), events.index(f"{name}:state")
    assert "A:token" in events and "A:token" not in events[first:last], events
