"""The cached prompt head, the trimmed last layer and the cost model (issue 26).

* the head's K/V and states equal a full prefill's rows; answers with and without the head
  cache agree; one entry per prefix, bounded;
* the answer path computes the last layer in full only for the last row: its first-token
  logits equal those of the all-rows path;
* the cost model predicts each policy's LM FLOPs before it runs (within 5% where the choice
  is made by a scoring pass, exactly otherwise), and where a policy would cost more than a
  full prefill from cached embeddings, that runs instead.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from PIL import Image

from conduit_core import PageInput, ReuseRuntime
from conduit_core.answer_types import AnswerRequest
from conduit_core.model.loader import load_vlm
from conduit_core.passes.prompt_head import HeadCache
from conduit_core.policies import POLICIES, choose_policy, register_policy
from conduit_core.policies.conduit import ConduitConfig
from lab import answering
from lab.ablations.conduit_adaptive import AdaptiveConduitPolicy
from lab.refresh_probe import probe_refresh
from tests.core.helpers import IMAGES, own_flops, page_image
from tests.device import TEST_DEVICE, TEST_DTYPE, same_answer, tol

PREFIX = "You answer questions about the document pages shown. Cite pages by their labels."
QUESTION = "What is the total amount due, and who signed?"


def _inputs(rt: ReuseRuntime, images: list[Image.Image]) -> list[PageInput]:
    return [PageInput(f"[doc.pdf p.{i + 1}]", kv)
            for i, kv in enumerate(rt.prefill_pages(images))]


def test_head_rows_equal_full_prefill(runtime: ReuseRuntime) -> None:
    pages = [("[a p.1]", IMAGES["a"]), ("[b p.2]", IMAGES["b"])]
    ref = answering.assemble_fresh(runtime, PREFIX, pages, QUESTION)
    answering.prefill(runtime, ref, ref.layout.visual_rows())  # every row, plain causal
    asm = runtime.reuse.assemble(PREFIX, _inputs(runtime, [IMAGES["a"], IMAGES["b"]]), QUESTION)
    head = asm.head
    assert head is not None and head.n == asm.layout.head > 0
    assert head.n < asm.layout.segments[0].start  # the first label is not part of it
    torch.testing.assert_close(asm.cache.keys[:, 0, :, :head.n],
                               ref.cache.keys[:, 0, :, :head.n], **tol("keys"))
    torch.testing.assert_close(asm.cache.values[:, 0, :, :head.n],
                               ref.cache.values[:, 0, :, :head.n], **tol("keys"))


def test_answers_agree_with_and_without_head_cache(runtime: ReuseRuntime) -> None:
    no_head = ReuseRuntime(runtime.vlm, head_cache=False, label_cache=False,
                           never_above_full=False)
    with_head = ReuseRuntime(runtime.vlm, label_cache=False, never_above_full=False)
    inputs = _inputs(runtime, [IMAGES["a"], IMAGES["b"], IMAGES["c"]])
    for policy in ("conduit", "full_prefill", "random", "cacheblend"):
        req = AnswerRequest(PREFIX, inputs, QUESTION, policy=choose_policy(policy), budget=0.3,
                            max_new_tokens=6)
        a, b = answering.answer(with_head, req), answering.answer(no_head, req)
        assert same_answer(a.token_ids, b.token_ids), policy
        assert a.head_tokens > 0 and b.head_tokens == 0
        assert a.fill_flops_lm > 0 or own_flops(a) == a.flops_used_lm, policy
        assert own_flops(a) < b.flops_used_lm, policy  # a cached head is not run again
        pa = probe_refresh(with_head, req, last_only=True).logits[-1]
        pb = probe_refresh(no_head, req, last_only=True).logits[-1]
        torch.testing.assert_close(pa, pb, **tol("logits"))
    # one prefix, one entry
    assert with_head.reuse.heads is not None and len(with_head.reuse.heads) == 1
    answering.answer(with_head, AnswerRequest("Another prefix.", inputs, QUESTION,
                                              max_new_tokens=1))
    assert len(with_head.reuse.heads) == 2


def test_head_cache_is_bounded(runtime: ReuseRuntime) -> None:
    cache = HeadCache(max_entries=2)
    ids = [torch.tensor([3, 4, 5]), torch.tensor([3, 4, 6]), torch.tensor([7])]
    first, computed = cache.get(runtime.adapter, "", ids[0], torch.arange(3).expand(3, 3))
    assert computed
    assert cache.get(runtime.adapter, "", ids[0], torch.arange(3).expand(3, 3)) == (first, False)
    for t in ids[1:]:
        cache.get(runtime.adapter, "", t, torch.arange(t.numel()).expand(3, t.numel()))
    assert len(cache) == 2  # the least recently used entry went
    # another namespace never reads this one's entries
    _, computed = cache.get(runtime.adapter, "tenant-b", ids[2], torch.arange(1).expand(3, 1))
    assert computed
    with pytest.raises(ValueError):
        HeadCache(max_entries=0)


def test_last_row_only_matches_all_rows(runtime: ReuseRuntime) -> None:
    rt = ReuseRuntime(runtime.vlm, never_above_full=False)
    inputs = _inputs(rt, [IMAGES["a"], IMAGES["c"]])
    for policy in ("conduit", "random", "full_reuse", "full_prefill", "cacheblend"):
        req = AnswerRequest(PREFIX, inputs, QUESTION, policy=choose_policy(policy), budget=0.2)
        full = probe_refresh(rt, req, logits="all")
        last = probe_refresh(rt, req, last_only=True)
        assert last.logits.shape[0] == 1 and full.logits.shape[0] == full.rows.numel()
        torch.testing.assert_close(last.logits[-1], full.logits[-1], **tol("logits"))
        assert last.refresh_flops < full.refresh_flops or policy == "full_reuse", policy


# policies whose choice comes out of a forward pass: their cost is estimated, not exact
POLICY_SCORES = {"conduit": True, "conduit_no_amp": True, "conduit_per_page": True,
                 "conduit_focus": True, "raw_attention": True, "cacheblend": True,
                 "conduit_adaptive": True}
# k is chosen per question, at most the budget's: predicted at it with no earlier answer,
# then at the share of it the same policy refreshed before (`conduit_focus`
# chooses its own k too, but reaches its cap on these random weights: held as closely as
# `conduit_per_page`; under its cap: tests/core/test_one_plan.py)
CAPPED = {"conduit_adaptive"}


@pytest.fixture(scope="module")
def paged(tmp_path_factory: pytest.TempPathFactory) -> tuple[ReuseRuntime, list[PageInput]]:
    """Tiny Qwen2-VL with pages of 224 visual tokens (realistic page sizes)."""
    vlm = load_vlm("builtin:tiny-qwen2-vl", cache_dir=Path(tmp_path_factory.mktemp("m")),
                   max_image_tokens=256, device=TEST_DEVICE, dtype=TEST_DTYPE)
    rt = ReuseRuntime(vlm)
    images = [page_image(10 + i, (448, 392)) for i in range(3)]
    return rt, _inputs(rt, images)


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_prediction_matches_measured(paged: tuple[ReuseRuntime, list[PageInput]],
                                     policy: str) -> None:
    rt, inputs = paged
    assert inputs[0].kv.num_tokens >= 200
    for budget in (0.05, 0.1, 0.2):
        result = answering.answer(rt, AnswerRequest(PREFIX, inputs, QUESTION,
                                                    policy=choose_policy(policy),
                                         budget=budget, max_new_tokens=1))
        predicted = result.fallback_flops_lm if result.fallback else result.predicted_flops_lm
        if policy in CAPPED and not result.fallback:  # the estimate of its cap: from above
            assert own_flops(result) <= predicted * 1.05, (policy, budget)
            continue
        own = own_flops(result)  # the first answer also computed the head and labels
        assert predicted == pytest.approx(own, rel=0.05), (policy, budget)
        if not POLICY_SCORES.get(policy, False):  # chosen before it ran: exact
            assert predicted == pytest.approx(own, rel=1e-9), policy
        assert own <= result.flops_full_lm


def test_a_budget_per_question_is_predicted_from_earlier_answers(
        paged: tuple[ReuseRuntime, list[PageInput]]) -> None:
    """A policy that refreshes part of its cap is predicted at the cap with no earlier
    answer, then at the share of it the same policy refreshed before. (Random weights
    spread the attention, so a small mass keeps it under the cap here.)"""
    rt, inputs = paged
    register_policy("test_mass_10",
                    AdaptiveConduitPolicy(ConduitConfig(gamma=0.0), mass=0.1))
    try:
        request = AnswerRequest(PREFIX, inputs, QUESTION,
                                policy=choose_policy("test_mass_10"), budget=0.3,
                                max_new_tokens=1)
        first = answering.answer(rt, request)
        assert not first.fallback
        assert first.refreshed_visual_tokens < round(0.3 * first.visual_tokens)  # under it
        assert first.flops_used_lm < 0.95 * first.predicted_flops_lm  # predicted at the cap
        again = answering.answer(rt, request)
        assert again.predicted_flops_lm == pytest.approx(again.flops_used_lm, rel=0.05)
    finally:
        POLICIES.pop("test_mass_10")


def test_reuse_never_costs_more_than_full_prefill(runtime: ReuseRuntime) -> None:
    """Tiny pages under a long prompt: scoring plus refresh would cost more than computing
    every row from the cached embeddings, so that runs instead, and says so."""
    rt = ReuseRuntime(runtime.vlm)
    inputs = _inputs(rt, [IMAGES["a"]])
    long_question = " ".join([QUESTION] * 6)
    req = AnswerRequest(PREFIX, inputs, long_question, policy=choose_policy("conduit"), budget=0.5,
                        max_new_tokens=4)
    got = answering.answer(rt, req)
    assert got.fallback and got.predicted_flops_lm > 0.8 * got.fallback_flops_lm
    assert got.refreshed_visual_tokens == got.visual_tokens
    assert own_flops(got) == pytest.approx(got.fallback_flops_lm)
    assert own_flops(got) < got.flops_full_lm
    full = answering.answer(rt, AnswerRequest(PREFIX, inputs, long_question,
                                              policy=choose_policy("full_prefill"),
                                   max_new_tokens=4))
    assert got.token_ids == full.token_ids and not full.fallback
    own = answering.answer(ReuseRuntime(runtime.vlm, never_above_full=False), req)
    assert not own.fallback and own.flops_used_lm > got.flops_used_lm
    assert own.refreshed_visual_tokens == round(0.5 * own.visual_tokens)
