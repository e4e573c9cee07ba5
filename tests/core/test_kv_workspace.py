"""The runtime's KV workspace (issue 65, point 2): an answer's assembled cache is reused by the
next answer of its capacity, never while anything still reads it.

On the tiny Qwen2-VL, driven as the answer engine drives the runtime (`prefill_steps`, `step`,
`release`, `result`): sequential answers write into the same storage; two prefills in flight
and an answer decoding from its own cache (the decode pool full) hold distinct caches; a
prefill that fails or is closed gives its cache back; a turn kept as a conversation prefix
gives it back as any answer does (its prefix's rows come from its decode); idle caches stay
within their bound; and tokens and
first-token logits are bitwise those of a fresh cache per answer (`kv_workspace_bytes=0`, the
code before the workspace) for the four policies, with a dirty reused cache and another
prefill between an answer's prefill and its first decode step.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

import pytest
import torch

from conduit_core import AnswerRequest, PageInput, ReuseRuntime
from conduit_core.answer_state import AnswerState
from conduit_core.kv.workspace import KVWorkspace
from conduit_core.model.loader import LoadedVLM
from conduit_core.pass_observer import Phase
from conduit_core.passes.assembly import Assembly
from conduit_core.passes.layer_groups import drain
from conduit_core.policies import choose_policy
from tests.core.conftest import load_builtin
from tests.core.helpers import IMAGES

FAMILY = "builtin:tiny-qwen2-vl"
POLICIES = ("conduit", "conduit_per_page", "full_reuse", "full_prefill")


@pytest.fixture(scope="module")
def vlm(tmp_path_factory: pytest.TempPathFactory) -> LoadedVLM:
    return load_builtin(FAMILY, Path(tmp_path_factory.mktemp("models")))


@pytest.fixture(scope="module")
def pages(vlm: LoadedVLM) -> list[PageInput]:
    kvs = ReuseRuntime(vlm).prefill_pages([IMAGES["a"], IMAGES["b"], IMAGES["c"]])
    return [PageInput(f"Page {i + 1}:\n", kv) for i, kv in enumerate(kvs)]


def _request(pages: list[PageInput], question: str, policy: str = "conduit",
             **kw: object) -> AnswerRequest:
    return AnswerRequest("Be brief.", pages, question, policy=choose_policy(policy),
                         budget=0.3, max_new_tokens=8, **kw)  # type: ignore[arg-type]


def _prefill(rt: ReuseRuntime, request: AnswerRequest) -> AnswerState:
    return drain(rt.prefill_steps(request))


def _finish(rt: ReuseRuntime, states: list[AnswerState]) -> list[list[int]]:
    """Decode `states` together to their ends, as the engine does; their tokens."""
    while not all(s.done for s in states):
        rt.step([s for s in states if not s.done])
        for s in states:
            if s.done:
                rt.release(s)
    return [list(rt.result(s).token_ids) for s in states]


def _ptr(state: AnswerState) -> int:
    assert state.lease is not None
    return state.lease.keys.data_ptr()


def test_sequential_answers_write_into_the_same_storage(vlm: LoadedVLM,
                                                        pages: list[PageInput]) -> None:
    rt = ReuseRuntime(vlm, never_above_full=False)
    first = _prefill(rt, _request(pages[:2], "What is on the first page?"))
    storage = (_ptr(first), first.decode.cache.values.data_ptr())
    rt.step([first])  # its first decode step copies it into a pool slot: it goes back now
    assert first.decode.slot is not None and first.lease is None
    assert rt.reuse.workspace.idle_bytes > 0
    _finish(rt, [first])
    second = _prefill(rt, _request(pages[1:], "Which page has the table?"))
    assert (_ptr(second), second.decode.cache.values.data_ptr()) == storage
    _finish(rt, [second])


def test_prefills_in_flight_and_an_unpooled_answer_hold_their_own_caches(
        vlm: LoadedVLM, pages: list[PageInput]) -> None:
    """With one decode slot, the second answer decodes from its own cache; a prefill that
    starts meanwhile gets the first answer's cache (pooled), never the second's."""
    rt = ReuseRuntime(vlm, never_above_full=False, decode_slots=1, decode_positions=4096)
    alone = ReuseRuntime(vlm, never_above_full=False, kv_workspace_bytes=0)
    requests = [_request(pages[:2], "What is on the first page?"),
                _request(pages[1:], "Which page has the table?"),
                _request([pages[2], pages[0]], "What does the last page show?")]
    want = [_finish(alone, [_prefill(alone, r)])[0] for r in requests]

    a_steps, b_steps = rt.prefill_steps(requests[0]), rt.prefill_steps(requests[1])
    assert next(a_steps) == next(b_steps) == "assembled"  # two prefills in flight
    a, b = drain(a_steps), drain(b_steps)
    assert a.lease is not None and b.lease is not None
    assert a.lease.capacity == b.lease.capacity and _ptr(a) != _ptr(b)
    a_ptr, b_ptr = _ptr(a), _ptr(b)
    rt.step([a, b])
    assert a.decode.slot == 0 and b.decode.slot is None  # b decodes from its own cache
    c = _prefill(rt, requests[2])
    assert c.lease is not None and c.lease.capacity == b.lease.capacity
    assert _ptr(c) == a_ptr and _ptr(c) != b_ptr
    assert _finish(rt, [a, b, c]) == want


def _dirty_then(rt: ReuseRuntime, pages: list[PageInput], request: AnswerRequest
                ) -> tuple[torch.Tensor, list[int]]:
    """`request`'s first logits and tokens on `rt` after an answer of the same capacity left
    its cache dirty, with another prefill between its prefill and its first step."""
    _finish(rt, [_prefill(rt, _request(pages[::-1], "Name every number you see here."))])
    state = _prefill(rt, request)
    logits = state.decode.logits.clone()
    other = _prefill(rt, _request(pages[1:] + pages[:1], "Is anything written twice?"))
    assert state.lease is not None and other.lease is not None
    assert other.lease.capacity == state.lease.capacity and _ptr(other) != _ptr(state)
    tokens = _finish(rt, [state, other])[0]
    return logits, tokens


@pytest.mark.parametrize("policy", POLICIES)
def test_answers_equal_a_fresh_cache_per_answer(vlm: LoadedVLM, pages: list[PageInput],
                                                policy: str) -> None:
    request = _request(pages, "Which page has the larger table?", policy)
    fresh = ReuseRuntime(vlm, never_above_full=False, kv_workspace_bytes=0)
    state = _prefill(fresh, request)
    assert state.lease is not None and state.lease.capacity == state.layout.n + 8
    want_logits, want_tokens = state.decode.logits.clone(), _finish(fresh, [state])[0]

    logits, tokens = _dirty_then(ReuseRuntime(vlm, never_above_full=False), pages, request)
    assert torch.equal(logits, want_logits)
    assert tokens == want_tokens


class _FailIn:
    """A pass observer whose phase `name` raises when it starts."""

    def __init__(self, name: Phase):
        self.name = name

    def phase(self, name: Phase, assembly: Assembly) -> AbstractContextManager[object]:
        return self._run(name)

    @contextmanager
    def _run(self, name: Phase) -> Iterator[None]:
        if name == self.name:
            raise RuntimeError(f"{name} failed")
        yield


@pytest.mark.parametrize("phase", ["page_load", "refresh"])
def test_a_failed_prefill_gives_its_cache_back(vlm: LoadedVLM, pages: list[PageInput],
                                               phase: Phase) -> None:
    rt = ReuseRuntime(vlm, never_above_full=False)
    request = _request(pages[:2], "What is on the first page?")
    rt.reuse.observer = _FailIn(phase)
    with pytest.raises(RuntimeError, match=f"{phase} failed"):
        _prefill(rt, request)
    rt.reuse.observer = None
    held = rt.reuse.workspace.idle_bytes
    assert held > 0
    state = _prefill(rt, request)  # the failed one's cache, taken again
    assert rt.reuse.workspace.idle_bytes == 0
    _finish(rt, [state])
    assert rt.reuse.workspace.idle_bytes == held


def test_a_closed_prefill_gives_its_cache_back(vlm: LoadedVLM,
                                               pages: list[PageInput]) -> None:
    rt = ReuseRuntime(vlm, never_above_full=False)
    steps = rt.prefill_steps(_request(pages[:2], "What is on the first page?"))
    assert next(steps) == "assembled"
    assert rt.reuse.workspace.idle_bytes == 0
    steps.close()  # the engine's cancel
    assert rt.reuse.workspace.idle_bytes > 0


def test_a_kept_turn_gives_its_cache_back_as_any_answer(
        vlm: LoadedVLM, pages: list[PageInput]) -> None:
    rt = ReuseRuntime(vlm, never_above_full=False)
    state = _prefill(rt, _request(pages[:2], "What is on the first page?", keep=True,
                                  tenant="t"))
    rt.step([state])  # into a pool slot: its prefix's rows will come from there
    assert state.decode.slot is not None and state.lease is None
    assert rt.reuse.workspace.idle_bytes > 0
    while not state.done:
        rt.step([state])
    rt.release(state)  # the engine releases an ended answer before taking its result
    rt.result(state)
    assert len(rt.conversations) == 1


def test_idle_caches_stay_within_their_bound(vlm: LoadedVLM) -> None:
    one = KVWorkspace(vlm.adapter, 2**30).take(64)
    size = 2 * one.keys.numel() * one.keys.element_size()
    space = KVWorkspace(vlm.adapter, 2 * size)
    caches = [space.take(64) for _ in range(3)]
    assert len({c.keys.data_ptr() for c in caches}) == 3
    for c in caches:
        assert space.give(c)
        assert space.idle_bytes <= 2 * size
    assert space.idle_bytes == 2 * size
    assert not space.give(caches[2])  # given back already: not kept twice
    again = [space.take(64), space.take(64)]
    assert {c.keys.data_ptr() for c in again} == {c.keys.data_ptr() for c in caches[1:]}
    small = KVWorkspace(vlm.adapter, size - 1)
    assert small.give(small.take(64)) and small.idle_bytes == 0
