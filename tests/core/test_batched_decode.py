"""Batched decode is the same decode: answers advanced together in one forward per step
(different prompt lengths, page counts, answer lengths, joining and leaving the batch at
different steps) give the token ids and logits each gives alone, for every registered policy
on each builtin family; and one answer alone equals the layer loop's own row-by-row decode."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from conduit_core import AnswerRequest, PageInput, ReuseRuntime
from conduit_core.answer_state import AnswerState
from conduit_core.passes.layer_forward import forward_rows, logits_of
from conduit_core.policies import POLICIES
from tests.core.conftest import FAMILIES, load_builtin
from tests.core.helpers import IMAGES
from tests.device import LOW_PRECISION, TEST_DEVICE, atol

TOL = atol("logits")  # 1e-4 in float32 (CONDUIT_TEST_DTYPE widens it: tests/device.py)
BF16_TOL = 5e-2  # bfloat16's logits bound (tests/device.py), for the explicit bf16 test
# (page images, question, max_new_tokens): other lengths, other page counts
QUESTIONS = [
    (["a"], "What is it?", 7),
    (["a", "b"], "Which of the two pages has the larger table, and what is its title?", 11),
    (["c", "b", "a"], "Summarise the third page.", 5),
]
JOIN_AT = [0, 0, 2]  # the step at which each question joins the running batch


def _requests(rt: ReuseRuntime, policy: str, seed: int | None = None,
              temperature: float = 0.0) -> list[AnswerRequest]:
    kvs = dict(zip("abc", rt.prefill_pages([IMAGES[k] for k in "abc"]), strict=True))
    return [AnswerRequest("Be brief.", [PageInput(f"Page {i + 1}:\n", kvs[k])
                                        for i, k in enumerate(keys)], question, policy=policy,
                          budget=0.3, max_new_tokens=n, temperature=temperature, seed=seed)
            for keys, question, n in QUESTIONS]


def _alone(rt: ReuseRuntime, request: AnswerRequest) -> tuple[list[int], list[torch.Tensor]]:
    """Token ids and the logits of every pick of one answer decoded by itself."""
    state = rt.start_answer(request)
    logits = [state.decode.logits.clone()]
    while not state.done:
        rt.step([state])
        logits.append(state.decode.logits.clone())
    return list(rt.result(state).token_ids), logits


def _together(rt: ReuseRuntime, requests: list[AnswerRequest]
              ) -> tuple[list[list[int]], list[list[torch.Tensor]], int]:
    """The same answers in one running batch, each joining at its `JOIN_AT` step; also
    returns the largest batch a step ran with."""
    states: list[AnswerState | None] = [None] * len(requests)
    logits: list[list[torch.Tensor]] = [[] for _ in requests]
    sizes, step = [], 0
    while True:
        for i, request in enumerate(requests):
            if states[i] is None and JOIN_AT[i] <= step:
                states[i] = rt.start_answer(request)
                logits[i].append(states[i].decode.logits.clone())  # type: ignore[union-attr]
        live = [s for s in states if s is not None and not s.done]
        if not live and all(s is not None for s in states):
            break
        sizes.append(len(live))
        before = [s.decode.picked if s is not None else -1 for s in states]
        rt.step(live)
        for i, s in enumerate(states):
            if s is not None and s.decode.picked > before[i] and not s.done:
                logits[i].append(s.decode.logits.clone())
        step += 1
    ids = [[int(t) for t in rt.result(s).token_ids] for s in states if s is not None]
    return ids, logits, max(sizes)


def _check(rt: ReuseRuntime, requests: list[AnswerRequest], label: str,
           tol: float = TOL, low_precision: bool = LOW_PRECISION) -> None:
    """Batched answers against each answer alone: the same token ids (in a low precision the
    first token; later ones may part after a near-tie) and logits within `tol`."""
    alone = [_alone(rt, r) for r in requests]
    ids, logits, widest = _together(rt, requests)
    assert widest == len(requests), label  # every question was in one step at once
    for i, (want_ids, want_logits) in enumerate(alone):
        if low_precision:
            assert ids[i][:1] == want_ids[:1], (label, i)
            assert torch.allclose(logits[i][0].float(), want_logits[0].float(), atol=tol,
                                  rtol=tol), (label, i)
            continue
        assert ids[i] == want_ids, (label, i)
        assert torch.allclose(logits[i][0], want_logits[0], atol=tol, rtol=0), (label, i)
        for got, want in zip(logits[i], want_logits, strict=False):
            assert torch.allclose(got, want, atol=tol, rtol=0), (label, i)


@pytest.mark.parametrize("family", FAMILIES)
def test_batched_answers_equal_answers_alone_for_every_policy(family: str,
                                                               model_cache: Path) -> None:
    rt = ReuseRuntime(load_builtin(family, model_cache), never_above_full=False)
    rt._stop_ids = []  # every answer runs to its own max_new_tokens: the batch shrinks
    for policy in POLICIES:
        _check(rt, _requests(rt, policy), f"{family} {policy}")


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_sampled_answers_and_eager_attention_batch_alike(attn: str, model_cache: Path) -> None:
    rt = ReuseRuntime(load_builtin("builtin:tiny-qwen2-vl", model_cache, attn=attn))
    _check(rt, _requests(rt, "conduit"), f"{attn} greedy")
    _check(rt, _requests(rt, "conduit", seed=3, temperature=1.5), f"{attn} sampled")


@pytest.mark.parametrize("policy", ["conduit", "full_prefill", "random"])
def test_batched_answers_in_bfloat16_agree_within_its_rounding(policy: str,
                                                                model_cache: Path) -> None:
    """bfloat16, as users run real checkpoints: a batch of mixed lengths and page counts
    gives each answer's first token and first-token logits within bf16's bound (the run
    on a GPU: `CONDUIT_TEST_DTYPE=bfloat16`, every test of this file)."""
    rt = ReuseRuntime(load_builtin("builtin:tiny-qwen2-vl", model_cache, dtype="bfloat16",
                                   device=TEST_DEVICE), never_above_full=False)
    assert rt.adapter.dtype == torch.bfloat16
    rt._stop_ids = []
    _check(rt, _requests(rt, policy), f"bf16 {policy}", tol=BF16_TOL, low_precision=True)


@pytest.mark.parametrize("family", FAMILIES)
def test_one_answer_equals_the_row_by_row_decode(family: str, model_cache: Path) -> None:
    """The batched step with a batch of one against the shared layer loop (`forward_rows`,
    one row at a time, as decode ran before batching)."""
    rt = ReuseRuntime(load_builtin(family, model_cache))
    rt._stop_ids = []
    request = _requests(rt, "conduit")[1]
    ids, logits = _alone(rt, request)
    state = rt.start_answer(request)
    d, adapter = state.decode, rt.adapter
    want = [d.logits]
    for step, tok in enumerate(ids[:-1]):
        emb = adapter.embed_tokens(torch.tensor([[tok]]))  # (1, 1, hidden)
        pos = d.positions[:, step:step + 1].unsqueeze(1)  # (P, 1, 1)
        hidden = forward_rows(adapter, d.cache, emb, d.rows[step:step + 1], pos,
                              n_keys=d.n_keys + step + 1, plain_causal=True)  # (1, 1, hidden)
        want.append(logits_of(adapter, hidden)[0, -1])  # (V,)
    assert [int(w.argmax()) for w in want] == ids
    for got, ref in zip(logits, want, strict=False):
        assert torch.allclose(got, ref, atol=TOL, rtol=0), family


def test_a_callback_that_raises_leaves_the_batch_alone(model_cache: Path) -> None:
    """A client that goes away (its token callback raises) ends its own answer at that step;
    the others in the batch go on and give what they give alone."""
    rt = ReuseRuntime(load_builtin("builtin:tiny-qwen2-vl", model_cache))
    rt._stop_ids = []
    requests = _requests(rt, "conduit")
    alone = [_alone(rt, r)[0] for r in requests]

    def gone(_tok: int, _piece: str) -> None:
        raise ConnectionError("client went away")

    states = [rt.start_answer(r, on_token=gone if i == 1 else None)
              for i, r in enumerate(requests)]
    while not all(s.done for s in states):
        rt.step(states)
    assert isinstance(states[1].error, ConnectionError) and states[1].decode.picked == 1
    for i in (0, 2):
        assert list(rt.result(states[i]).token_ids) == alone[i]
    with pytest.raises(ConnectionError):
        rt.finish(rt.start_answer(requests[1], on_token=gone))
