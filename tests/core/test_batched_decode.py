"""Batched decode is the same decode: answers advanced together in one forward per step
(different prompt lengths, page counts, answer lengths, joining and leaving the batch at
different steps) give the token ids and logits each gives alone, for every registered policy
on each builtin family; and one answer alone equals the layer loop's own row-by-row decode.
Every step's logits are compared; in bfloat16 (here explicitly, and the whole file under
CONDUIT_TEST_DTYPE=bfloat16) the batch is teacher forced with each answer's tokens alone, and
the comparison fails without the pool's key mask or with every answer reading slot 0."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from conduit_core import AnswerRequest, PageInput, ReuseRuntime
from conduit_core.answer_state import AnswerState
from conduit_core.decode import Sampler
from conduit_core.passes import batch_forward
from conduit_core.passes.layer_forward import forward_rows, logits_of
from conduit_core.policies import POLICIES, choose_policy
from lab import answering
from tests.core.conftest import FAMILIES, load_builtin
from tests.core.helpers import IMAGES
from tests.device import LOW_PRECISION, TEST_DEVICE, atol, tol

TOL = atol("logits")  # 1e-4 in float32 (CONDUIT_TEST_DTYPE widens it: tests/device.py)
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
                                        for i, k in enumerate(keys)], question,
                          policy=choose_policy(policy),
                          budget=0.3, max_new_tokens=n, temperature=temperature, seed=seed)
            for keys, question, n in QUESTIONS]


class Forced(Sampler):
    """Picks the given tokens in turn (teacher forcing: the batch reads what the answer alone
    generated, so every step's logits are comparable even after a near-tie in bf16)."""

    def __init__(self, tokens: list[int]):
        super().__init__()
        self.tokens = list(tokens)

    def pick(self, logits: torch.Tensor) -> torch.Tensor:
        return torch.tensor(self.tokens.pop(0), device=logits.device)


def _alone(rt: ReuseRuntime, request: AnswerRequest) -> tuple[list[int], list[torch.Tensor]]:
    """Token ids and the logits of every pick of one answer decoded by itself."""
    state = answering.start_answer(rt, request)
    logits = [state.decode.logits.clone()]
    while not state.done:
        rt.step([state])
        if not state.done:
            logits.append(state.decode.logits.clone())
    return list(rt.result(state).token_ids), logits


def _together(rt: ReuseRuntime, requests: list[AnswerRequest],
              forced: list[list[int]] | None = None
              ) -> tuple[list[list[int]], list[list[torch.Tensor]], int]:
    """The same answers in one running batch, each joining at its `JOIN_AT` step (with
    `forced`, each picks those tokens); also returns the largest batch a step ran with."""
    states: list[AnswerState | None] = [None] * len(requests)
    logits: list[list[torch.Tensor]] = [[] for _ in requests]
    sizes, step = [], 0
    while True:
        for i, request in enumerate(requests):
            if states[i] is None and JOIN_AT[i] <= step:
                state = states[i] = answering.start_answer(rt, request)
                if forced is not None:
                    state.decode.sampler = Forced(forced[i])
                logits[i].append(state.decode.logits.clone())
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


def _worst(rt: ReuseRuntime, requests: list[AnswerRequest], atol: float, rtol: float,
           forced: bool) -> float:
    """The largest |batched - alone| / (atol + rtol |alone|) over every step's logits of
    every answer (> 1: out of bounds); with `forced`, the batch picks each answer's tokens
    alone. Token ids must agree (forced: by construction)."""
    alone = [_alone(rt, r) for r in requests]
    ids, logits, widest = _together(rt, requests, [a[0] for a in alone] if forced else None)
    assert widest == len(requests)  # every question was in one step at once
    worst = 0.0
    for i, (want_ids, want_logits) in enumerate(alone):
        assert ids[i] == want_ids, i
        assert len(logits[i]) == len(want_logits), i
        for got, want in zip(logits[i], want_logits, strict=True):
            bound = atol + rtol * want.float().abs()
            worst = max(worst, float(((got.float() - want.float()).abs() / bound).max()))
    return worst


def _check(rt: ReuseRuntime, requests: list[AnswerRequest], label: str) -> None:
    """Batched answers against each answer alone, every step's logits within the test dtype's
    bound (float32: free running, the same tokens; a low precision: teacher forced)."""
    rtol = tol("logits")["rtol"] if LOW_PRECISION else 0.0
    assert _worst(rt, requests, TOL, rtol, forced=LOW_PRECISION) <= 1.0, label


@pytest.mark.parametrize("family", FAMILIES)
def test_batched_answers_equal_answers_alone_for_every_policy(family: str,
                                                               model_cache: Path) -> None:
    rt = ReuseRuntime(load_builtin(family, model_cache), never_above_full=False)
    rt.reuse.stop_ids = []  # every answer runs to its own max_new_tokens: the batch shrinks
    for policy in POLICIES:
        _check(rt, _requests(rt, policy), f"{family} {policy}")


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_sampled_answers_and_eager_attention_batch_alike(attn: str, model_cache: Path) -> None:
    rt = ReuseRuntime(load_builtin("builtin:tiny-qwen2-vl", model_cache, attn=attn))
    _check(rt, _requests(rt, "conduit"), f"{attn} greedy")
    _check(rt, _requests(rt, "conduit", seed=3, temperature=1.5), f"{attn} sampled")


def _bf16_runtime(model_cache: Path) -> ReuseRuntime:
    rt = ReuseRuntime(load_builtin("builtin:tiny-qwen2-vl", model_cache, dtype="bfloat16",
                                   device=TEST_DEVICE), never_above_full=False)
    assert rt.adapter.dtype == torch.bfloat16
    rt.reuse.stop_ids = []
    return rt


BF16 = {"atol": 5e-2, "rtol": 5e-2}  # tests/device.py's bfloat16 logits bound


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("policy", ["conduit", "full_prefill"])
def test_every_step_of_a_batch_agrees_within_the_dtypes_bound(
        dtype: str, policy: str, model_cache: Path) -> None:
    """Mixed lengths and page counts, teacher forced with each answer's tokens alone: every
    step's logits within the dtype's bound (CI runs float32 by default: bf16 here too)."""
    if dtype == "bfloat16":
        rt, bounds = _bf16_runtime(model_cache), BF16
    else:
        rt = ReuseRuntime(load_builtin("builtin:tiny-qwen2-vl", model_cache, dtype="float32",
                                       device=TEST_DEVICE), never_above_full=False)
        rt.reuse.stop_ids, bounds = [], {"atol": 1e-4, "rtol": 0.0}
    assert _worst(rt, _requests(rt, policy), bounds["atol"], bounds["rtol"], forced=True) <= 1


def test_bf16_comparison_fails_without_the_pools_key_mask(
        model_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Seeded fault: pooled rows of a shorter answer read the zero keys past its own."""
    monkeypatch.setattr(batch_forward, "_pool_mask", lambda *_args: None)
    rt = _bf16_runtime(model_cache)
    assert _worst(rt, _requests(rt, "conduit"), forced=True, **BF16) > 1.0


def test_bf16_comparison_fails_when_every_answer_reads_slot_0(
        model_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Seeded fault: the pooled attention reads slot 0's keys and values for every row."""
    real = batch_forward._attention_fn

    def slot_0(attn: Any, impl: str) -> Any:
        attend = real(attn, impl)

        def wrong(module: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  *args: Any, **kwargs: Any) -> Any:
            return attend(module, q, k[:1].expand_as(k), v[:1].expand_as(v), *args, **kwargs)
        return wrong

    monkeypatch.setattr(batch_forward, "_attention_fn", slot_0)
    rt = _bf16_runtime(model_cache)
    assert _worst(rt, _requests(rt, "conduit"), forced=True, **BF16) > 1.0


@pytest.mark.parametrize("family", FAMILIES)
def test_one_answer_equals_the_row_by_row_decode(family: str, model_cache: Path) -> None:
    """The batched step with a batch of one against the shared layer loop (`forward_rows`,
    one row at a time, as decode ran before batching)."""
    rt = ReuseRuntime(load_builtin(family, model_cache))
    rt.reuse.stop_ids = []
    request = _requests(rt, "conduit")[1]
    ids, logits = _alone(rt, request)
    state = answering.start_answer(rt, request)
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
    rt.reuse.stop_ids = []
    requests = _requests(rt, "conduit")
    alone = [_alone(rt, r)[0] for r in requests]

    def gone(_tok: int, _piece: str) -> None:
        raise ConnectionError("client went away")

    states = [answering.start_answer(rt, r, on_token=gone if i == 1 else None)
              for i, r in enumerate(requests)]
    while not all(s.done for s in states):
        rt.step(states)
    assert isinstance(states[1].error, ConnectionError) and states[1].decode.picked == 1
    for i in (0, 2):
        assert list(rt.result(states[i]).token_ids) == alone[i]
    with pytest.raises(ConnectionError):
        answering.finish(rt, answering.start_answer(rt, requests[1], on_token=gone))
