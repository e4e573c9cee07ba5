"""The decode pool: answers being generated share one pair of KV tensors (one attention call
a layer for all of them). Slots are taken at the first step, kept contiguous when answers
end, grown within the pool's limits, and given back; an answer the pool cannot hold decodes
from its own cache, in the same step as pooled ones. A fixed ladder of tiers moves an answer
that outgrows its slot to the next tier or its own cache, in a step that reads back one thing.
Every arrangement gives the same tokens and logits (pooled, mixed, none pooled, a step that
leaves a slot out, moved)."""

from __future__ import annotations

import gc
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from conduit_core import AnswerRequest, PageInput, ReuseRuntime
from conduit_core.answer_state import AnswerState
from conduit_core.kv.kv_pool import POSITION_STEP, DecodePool
from conduit_core.passes.step_graphs import StepGraphs
from conduit_core.policies import choose_policy
from lab import answering
from lab.ttft.host_syncs import SyncCounter
from tests.core.conftest import FAMILIES, load_builtin
from tests.core.helpers import IMAGES
from tests.core.test_batched_decode import Forced
from tests.device import LOW_PRECISION, atol, same_answer, tol

TOL = atol("logits")
# (page keys, question, max_new_tokens): different prompt lengths and page counts
SHAPES = [(["a"], "What is it?", 6), (["a", "b"], "Which page has the larger table?", 9),
          (["c", "b", "a"], "Summarise the third page.", 4)]


def _runtime(family: str, cache: Path, dtype: str | None = None, **pool: int) -> ReuseRuntime:
    rt = ReuseRuntime(load_builtin(family, cache, dtype=dtype), never_above_full=False, **pool)
    rt.reuse.stop_ids = []  # each answer runs to its own length: the batch shrinks
    return rt


def _requests(rt: ReuseRuntime) -> list[AnswerRequest]:
    kvs = dict(zip("abc", rt.prefill_pages([IMAGES[k] for k in "abc"]), strict=True))
    return [AnswerRequest("Be brief.", [PageInput(f"Page {i + 1}:\n", kvs[k])
                                        for i, k in enumerate(keys)], q,
                          policy=choose_policy("conduit"),
                          budget=0.3, max_new_tokens=n) for keys, q, n in SHAPES]


def _run(rt: ReuseRuntime, requests: list[AnswerRequest], forced: list[list[int]] | None = None
         ) -> tuple[list[list[int]], list[list[torch.Tensor]], list[int]]:
    """All requests decoded together (with `forced`, each answer picks those tokens: teacher
    forcing): token ids, each pick's logits, pool size each step."""
    states = [answering.start_answer(rt, r) for r in requests]
    for state, tokens in zip(states, forced or [], strict=False):
        state.decode.sampler = Forced(tokens)
    logits = [[s.decode.logits.clone()] for s in states]
    sizes = []
    while not all(s.done for s in states):
        before = [s.decode.picked for s in states]
        rt.step(states)
        sizes.append(rt.pool.size)
        for i, s in enumerate(states):
            if s.decode.picked > before[i] and not s.done:
                logits[i].append(s.decode.logits.clone())
    return [list(rt.result(s).token_ids) for s in states], logits, sizes


def _agree(family: str, model_cache: Path, dtype: str | None, atol: float,
           rtol: float) -> None:
    """Pooled and mixed steps against own-cache steps: the same tokens (a low precision:
    teacher forced with the own-cache answers' tokens) and every step's logits within
    (atol, rtol)."""
    ref_rt = _runtime(family, model_cache, dtype, decode_positions=1)  # nothing fits
    ref_ids, ref_logits, ref_sizes = _run(ref_rt, _requests(ref_rt))
    assert set(ref_sizes) == {0}
    low = ref_rt.adapter.dtype != torch.float32
    for label, pool in [("pooled", {}), ("mixed", {"decode_slots": 2})]:
        rt = _runtime(family, model_cache, dtype, **pool)
        ids, logits, sizes = _run(rt, _requests(rt), ref_ids if low else None)
        assert max(sizes) == (3 if label == "pooled" else 2), label
        assert rt.pool.size == 0, label  # all given back
        assert ids == ref_ids, label
        for got, want in zip(logits, ref_logits, strict=True):
            assert len(got) == len(want)
            for g, w in zip(got, want, strict=True):
                torch.testing.assert_close(g.float(), w.float(), atol=atol, rtol=rtol,
                                           msg=f"{family} {label}")


@pytest.mark.parametrize("family", FAMILIES)
def test_pooled_mixed_and_own_cache_steps_agree(family: str, model_cache: Path) -> None:
    _agree(family, model_cache, None, TOL, tol("logits")["rtol"] if LOW_PRECISION else 0.0)


def test_pooled_steps_agree_in_bfloat16_every_step(model_cache: Path) -> None:
    """bfloat16 in CI too: mixed lengths, teacher forced, every step within bf16's bound."""
    _agree("builtin:tiny-qwen2-vl", model_cache, "bfloat16", 5e-2, 5e-2)


def test_slots_stay_contiguous_grow_and_hold_each_answers_keys(model_cache: Path) -> None:
    rt = _runtime("builtin:tiny-qwen2-vl", model_cache)
    states: list[AnswerState] = [answering.start_answer(rt, r) for r in _requests(rt)]
    own = [s.decode.cache for s in states]
    n = [s.decode.n_keys for s in states]
    rt.step(states)  # each takes a slot at its first step (the pool doubles 1 -> 2 -> 4)
    pool = rt.pool.tiers[0]  # a growing pool: one tier
    assert [s.decode.slot for s in states] == [0, 1, 2] and pool.keys is not None
    assert pool.keys.shape[1] == 4
    assert pool.keys.shape[3] % POSITION_STEP == 0
    assert pool.keys.shape[3] >= max(s.kv_tokens for s in states)
    for s, cache, k in zip(states, own, n, strict=True):
        assert s.decode.cache.keys.data_ptr() != cache.keys.data_ptr()  # now a pool slot
        assert torch.equal(s.decode.cache.keys[:, :, :, :k], cache.keys[:, :, :, :k])
        assert not s.decode.cache.keys[:, :, :, k + 1:].any()  # zero past its keys
    kept = states[2].decode.cache.keys[:, :, :, :n[2] + 1].clone()
    rt.release(states[0])  # the last answer moves into the freed slot 0
    assert states[0].decode.slot is None and pool.size == 2
    assert [states[2].decode.slot, states[1].decode.slot] == [0, 1]
    assert torch.equal(pool.keys[:, 0:1, :, :n[2] + 1], kept)
    rt.release(states[0])  # again: nothing
    assert pool.size == 2
    rt.release(states[1])
    rt.release(states[2])
    assert pool.size == 0 and pool.keys is not None and pool.keys.shape[1] == 4
    keys = pool.keys.data_ptr()  # the tier keeps its largest shape: a second burst of answers
    again = [answering.start_answer(rt, r) for r in _requests(rt)]
    rt.step(again)  # takes the slots it left, without growing (no reallocation, no copy)
    assert [s.decode.slot for s in again] == [0, 1, 2] and pool.keys.data_ptr() == keys
    for s in again:
        k = s.decode.n_keys
        assert not s.decode.cache.keys[:, :, :, k + 1:].any()  # the earlier answers' rows zeroed
    for s in again:
        rt.release(s)


def test_a_step_that_leaves_a_slot_out_stays_exact(model_cache: Path) -> None:
    """Stepping one pooled answer alone (another holds a slot) runs the per-sequence path
    over the slot views."""
    rt = _runtime("builtin:tiny-qwen2-vl", model_cache)
    requests = _requests(rt)[:2]
    ref_ids, _, _ = _run(_runtime("builtin:tiny-qwen2-vl", model_cache, decode_positions=1),
                         requests[:1])
    a, b = (answering.start_answer(rt, r) for r in requests)
    rt.step([a, b])
    assert rt.pool.size == 2
    while not a.done:
        rt.step([a])  # b keeps its slot meanwhile
    assert same_answer(list(rt.result(a).token_ids), ref_ids[0])
    assert rt.pool.size == 1 and b.decode.slot == 0


def test_an_answer_ended_by_its_owner_gives_its_slot_back(model_cache: Path) -> None:
    """The engine ends a cancelled answer by setting `done`: the next step frees its slot
    (and `release` does at once)."""
    rt = _runtime("builtin:tiny-qwen2-vl", model_cache)
    a, b = (answering.start_answer(rt, r) for r in _requests(rt)[1:])
    rt.step([a, b])
    a.decode.done = True
    rt.step([b])
    assert rt.pool.size == 1 and a.decode.slot is None and b.decode.slot == 0


def test_a_pool_too_small_leaves_answers_on_their_own_caches(model_cache: Path) -> None:
    rt = _runtime("builtin:tiny-qwen2-vl", model_cache, decode_positions=POSITION_STEP)
    states = [answering.start_answer(rt, r) for r in _requests(rt)]
    rt.step(states)
    slotted = [s.decode.slot is not None for s in states]
    assert slotted == [s.kv_tokens <= POSITION_STEP for s in states] and not all(slotted)
    assert rt.pool.size == sum(slotted)
    with pytest.raises(ValueError):
        ReuseRuntime(rt.vlm, decode_slots=0)


def test_a_fixed_ladder_moves_an_answer_that_outgrows_its_slot(model_cache: Path) -> None:
    """Three short slots and one long one, the step eager: two answers outgrow their short
    slots; the first to do so moves to the long slot, the second to a cache of its own (the
    long one taken), the third stays. Each step reads back one thing (the token ids), the
    moves' included, and the tokens are those of answers on their own caches."""
    ref = _runtime("builtin:tiny-qwen2-vl", model_cache, decode_positions=1)  # nothing fits
    probes = [answering.start_answer(ref, r) for r in _requests(ref)]
    prompts = [p.decode.n_keys for p in probes]
    short = -(-(max(prompts) + 2) // POSITION_STEP) * POSITION_STEP
    lengths = [short + 20 - prompts[0], short + 30 - prompts[1], short - prompts[2] - 1]
    requests = [replace(r, max_new_tokens=n)
                for r, n in zip(_requests(ref), lengths, strict=True)]
    want, _, _ = _run(ref, requests)

    rt = _runtime("builtin:tiny-qwen2-vl", model_cache, decode_slots=3)
    rt.pool = DecodePool(rt.adapter, 3, 4 * short + POSITION_STEP, fixed=True,
                         tiers=[(3, short), (1, short + POSITION_STEP)])
    rt.graphs = StepGraphs(rt.adapter, rt.pool, "off")
    states = [answering.start_answer(rt, r) for r in requests]
    places, reads = [], []
    while not all(s.done for s in states):
        alive = [obj for obj in gc.get_objects() if issubclass(type(obj), torch.Tensor)]
        with SyncCounter(device=alive) as counter:
            rt.step(states)
        reads.append(counter.total)
        places.append([(s.decode.tier, s.decode.slot) for s in states if not s.done])
    got = [list(rt.result(s).token_ids) for s in states]
    assert got == want
    assert max(reads) == 1, reads
    assert rt.pool.size == 0
    long_slot = [i for i, p in enumerate(places) if (1, 0) in p]
    own = [i for i, p in enumerate(places) if (0, None) in p]
    assert long_slot and own and long_slot[0] <= own[0], places  # one moved up, one out
