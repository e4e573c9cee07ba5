"""Cached page labels (`conduit_core.label_cache`): stale like their pages, exact where a
refresh covers them.

* the first label's cached K/V equal a full prefill's rows (computed in its exact context);
* with every page token refreshed (budget 1.0, the fallback) the answer equals a full
  prefill's, on every family;
* at a partial budget the labels are not recomputed: fewer rows and FLOPs than with labels as
  text rows; a label is recomputed with its whole page and only then;
* an answer computes the labels its refresh keeps stale, after the cost model planned them:
  charged to it once, predicted, none for a page refreshed whole; the cache is bounded;
* with `label_refresh` "always" every refresh recomputes every label, with "budget" inside
  the refresh budget (fewer visual tokens);
* a policy the cost model must run to learn its rows (no cost profile) reads the labels'
  stale K/V in its scoring pass, as one with a profile does, not rows still unwritten; its
  plan counts that pass and the labels it computed.
"""

from __future__ import annotations

import pytest
import torch

from conduit_core import PageInput, ReuseRuntime
from conduit_core.answer_types import AnswerRequest, AnswerResult
from conduit_core.label_cache import LabelCache
from conduit_core.passes.refresh_pass import refresh_rows
from conduit_core.policies import POLICIES, choose_policy, get_policy, register_policy
from conduit_core.policies.policy_context import PolicyContext
from lab import answering
from lab.refresh_probe import probe_full_prefill, probe_refresh
from tests.core.helpers import IMAGES, own_flops
from tests.device import tol

PREFIX = "You answer questions about the document pages shown. Cite pages by their labels."
QUESTION = "What is the total amount due, and who signed?"
LABELS = ["[report.pdf p.1]", "[report.pdf p.2]", "[annex.pdf p.7]"]


def _pages(rt: ReuseRuntime) -> list[PageInput]:
    kvs = rt.prefill_pages([IMAGES["a"], IMAGES["b"], IMAGES["c"]])
    return [PageInput(label, kv) for label, kv in zip(LABELS, kvs, strict=True)]


@pytest.fixture
def labelled(runtime: ReuseRuntime) -> ReuseRuntime:
    """Labels refreshed only with their whole page (`label_refresh="page"`)."""
    return ReuseRuntime(runtime.vlm, label_cache=True, label_refresh="page",
                        never_above_full=False)


def test_first_label_equals_full_prefill_rows(labelled: ReuseRuntime) -> None:
    pages = list(zip(LABELS, [IMAGES["a"], IMAGES["b"], IMAGES["c"]], strict=True))
    ref = answering.assemble_fresh(labelled, PREFIX, pages, QUESTION)
    answering.prefill(labelled, ref, ref.layout.visual_rows())  # every row, plain causal
    asm = labelled.reuse.assemble(PREFIX, _pages(labelled), QUESTION)
    assert asm.layout.stale_labels and len(asm.layout.labels) == 3
    first = asm.layout.labels[0]
    assert first.start == asm.layout.head  # right after the head: its exact context
    rows = slice(first.start, first.stop)
    torch.testing.assert_close(asm.cache.keys[:, 0, :, rows], ref.cache.keys[:, 0, :, rows],
                               **tol("keys"))
    torch.testing.assert_close(asm.cache.values[:, 0, :, rows],
                               ref.cache.values[:, 0, :, rows], **tol("keys"))
    later = asm.layout.labels[1]  # stale: it did not see page 1 in its prefill
    assert not torch.allclose(asm.cache.values[-1, 0, :, later.start:later.stop],
                              ref.cache.values[-1, 0, :, later.start:later.stop], atol=1e-4)


def test_every_page_refreshed_equals_full_prefill(labelled: ReuseRuntime) -> None:
    rt = labelled  # every family (the `runtime` fixture's)
    images = [IMAGES["a"], IMAGES["b"], IMAGES["c"]]
    pages = _pages(rt)
    ref = probe_full_prefill(rt, PREFIX, list(zip(LABELS, images, strict=True)), QUESTION)
    for policy in ("conduit", "full_prefill"):
        req = AnswerRequest(PREFIX, pages, QUESTION, policy=choose_policy(policy), budget=1.0)
        got = probe_refresh(rt, req, last_only=True)
        torch.testing.assert_close(got.logits[-1], ref.logits[-1], **tol("logits"))
        labels = torch.cat([torch.arange(s.start, s.stop) for s in
                            rt.reuse.assemble(PREFIX, pages, QUESTION).layout.labels])
        assert bool(torch.isin(labels, got.computed_rows).all()), policy


def test_partial_budget_keeps_labels_stale(runtime: ReuseRuntime,
                                           labelled: ReuseRuntime) -> None:
    plain = ReuseRuntime(runtime.vlm, label_cache=False, never_above_full=False)
    pages = _pages(labelled)
    req = AnswerRequest(PREFIX, pages, QUESTION, policy=choose_policy("conduit"), budget=0.1)
    answering.answer(labelled, req)  # the labels are in the cache from here on
    with_labels = probe_refresh(labelled, req, last_only=True)
    as_text = probe_refresh(plain, req, last_only=True)
    layout = labelled.reuse.assemble(PREFIX, pages, QUESTION).layout
    label_rows = torch.cat([torch.arange(s.start, s.stop) for s in layout.labels])
    assert not bool(torch.isin(label_rows, with_labels.rows).any())  # in neither pass
    assert bool(torch.isin(label_rows, as_text.rows).all())
    assert with_labels.extra_flops < as_text.extra_flops  # the scoring pass skips them
    assert with_labels.refresh_flops <= as_text.refresh_flops  # equal when every chosen
    # token lies after the last label (its text rows then come from the scoring pass)


def test_label_refreshed_with_its_whole_page(labelled: ReuseRuntime) -> None:
    layout = labelled.reuse.assemble(PREFIX, _pages(labelled), QUESTION).layout
    second = layout.segments[1]
    whole = torch.arange(second.start, second.stop)
    assert layout.refreshed_label_rows(whole).tolist() == list(
        range(layout.labels[1].start, layout.labels[1].stop))
    assert layout.refreshed_label_rows(whole[1:]).numel() == 0  # one token short
    rows, _ = refresh_rows(layout, layout.head, whole, scored=False)
    assert bool(torch.isin(torch.arange(layout.labels[1].start, layout.labels[1].stop),
                           rows).all())
    assert not bool(torch.isin(torch.arange(layout.labels[0].start, layout.labels[0].stop),
                               rows).any())


def test_fresh_labels_are_recomputed_by_every_refresh(runtime: ReuseRuntime) -> None:
    """label_refresh="always": the scoring pass reads the labels stale, the refresh
    recomputes every one of them at any budget (full reuse too) but the first, which the
    label cache computed in its exact context right after the head; the FLOPs are predicted
    and a refresh of every page still equals full prefill."""
    rt = ReuseRuntime(runtime.vlm, label_refresh="always", never_above_full=False)
    page_only = ReuseRuntime(runtime.vlm, label_refresh="page", never_above_full=False)
    pages = _pages(rt)
    layout = rt.reuse.assemble(PREFIX, pages, QUESTION).layout
    first = layout.labels[0]
    assert first.start == layout.head
    label_rows = torch.cat([torch.arange(s.start, s.stop) for s in layout.labels[1:]])
    assert layout.label_refresh == "always" and layout.stale_labels
    assert torch.equal(layout.refreshed_label_rows(torch.zeros(0, dtype=torch.long)),
                       label_rows)
    for policy in ("conduit", "full_reuse"):
        req = AnswerRequest(PREFIX, pages, QUESTION, policy=choose_policy(policy), budget=0.1,
                            max_new_tokens=2)
        answering.answer(rt, req)  # the labels are in the cache from here on
        answering.answer(page_only, req)
        fresh, stale = probe_refresh(rt, req, last_only=True), probe_refresh(page_only, req,
                                                                            last_only=True)
        assert bool(torch.isin(label_rows, fresh.rows).all())
        assert not bool(torch.isin(torch.arange(first.start, first.stop), fresh.rows).any())
        assert not bool(torch.isin(label_rows, stale.rows).any())
        assert torch.equal(fresh.visual_rows, stale.visual_rows)  # the same choice
        assert fresh.refresh_flops > stale.refresh_flops
        result = answering.answer(rt, req)
        assert result.predicted_flops_lm == pytest.approx(result.flops_used_lm, rel=0.05)
    with pytest.raises(ValueError, match="label_refresh"):
        ReuseRuntime(runtime.vlm, label_refresh="sometimes")
    whole = probe_refresh(rt, AnswerRequest(PREFIX, pages, QUESTION,
                                            policy=choose_policy("conduit"),
                                            budget=1.0), last_only=True)
    images = [IMAGES["a"], IMAGES["b"], IMAGES["c"]]
    full = probe_full_prefill(rt, PREFIX, list(zip(LABELS, images, strict=True)), QUESTION)
    torch.testing.assert_close(whole.logits[-1], full.logits[-1], **tol("logits"))


def test_labels_in_the_budget_take_its_rows(runtime: ReuseRuntime) -> None:
    """label_refresh="budget": every label is recomputed as with "always", and its rows come
    off the visual tokens, so the stale rows a refresh recomputes stay round(budget *
    (N_v + L)); FLOPs predicted; a refresh of every page still equals full prefill."""
    rt = ReuseRuntime(runtime.vlm, label_refresh="budget", never_above_full=False)
    always = ReuseRuntime(runtime.vlm, label_refresh="always", never_above_full=False)
    pages = _pages(rt)
    layout = rt.reuse.assemble(PREFIX, pages, QUESTION).layout
    n_labels = sum(s.length for s in layout.labels[1:])  # the first is exact as cached
    n_visual = int(layout.visual_rows().numel())
    assert layout.budget_label_rows() == n_labels > 0
    assert always.reuse.assemble(PREFIX, pages, QUESTION).layout.budget_label_rows() == 0
    label_rows = torch.cat([torch.arange(s.start, s.stop) for s in layout.labels[1:]])
    req = AnswerRequest(PREFIX, pages, QUESTION, policy=choose_policy("conduit"), budget=0.5,
                        max_new_tokens=2)
    answering.answer(rt, req)  # the labels are in the cache from here on
    got, full_share = probe_refresh(rt, req, last_only=True), probe_refresh(always, req,
                                                                            last_only=True)
    assert bool(torch.isin(label_rows, got.rows).all())
    assert got.visual_rows.numel() == round(0.5 * (n_visual + n_labels)) - n_labels
    assert full_share.visual_rows.numel() == round(0.5 * n_visual)
    assert got.refresh_flops < full_share.refresh_flops
    result = answering.answer(rt, req)
    assert result.predicted_flops_lm == pytest.approx(result.flops_used_lm, rel=0.05)
    small = AnswerRequest(PREFIX, pages, QUESTION, policy=choose_policy("conduit"), budget=0.01)
    assert probe_refresh(rt, small, last_only=True).visual_rows.numel() == 0  # not below 0
    whole = probe_refresh(rt, AnswerRequest(PREFIX, pages, QUESTION,
                                            policy=choose_policy("conduit"),
                                            budget=1.0), last_only=True)
    images = [IMAGES["a"], IMAGES["b"], IMAGES["c"]]
    full = probe_full_prefill(rt, PREFIX, list(zip(LABELS, images, strict=True)), QUESTION)
    assert whole.visual_rows.numel() == n_visual
    torch.testing.assert_close(whole.logits[-1], full.logits[-1], **tol("logits"))


def test_labels_charged_once_and_predicted(runtime: ReuseRuntime) -> None:
    rt = ReuseRuntime(runtime.vlm, label_cache=True, label_refresh="page",
                      never_above_full=False)
    assert rt.reuse.labels is not None
    pages = _pages(rt)

    def ask(policy: str, budget: float = 0.1) -> AnswerResult:
        return answering.answer(rt,
            AnswerRequest(PREFIX, pages, QUESTION, policy=choose_policy(policy), budget=budget,
                                       max_new_tokens=2))

    whole = ask("full_prefill")  # every page recomputed whole: no label is computed for it
    assert len(rt.reuse.labels) == 0
    random = ask("random")  # a choice made before any pass: the misses predicted exactly
    assert len(rt.reuse.labels) == 3
    assert random.fill_flops_lm > 0  # the misses, charged but not predicted: a path never
    # depends on which caches are warm
    assert random.predicted_flops_lm == pytest.approx(own_flops(random), rel=1e-9)
    again = ask("random")
    assert again.fill_flops_lm == 0.0  # the misses were charged once
    assert own_flops(random) == again.flops_used_lm
    assert again.predicted_flops_lm == pytest.approx(again.flops_used_lm, rel=1e-9)
    rt.reuse.labels.clear()
    first, second = ask("conduit"), ask("conduit")
    assert first.flops_used_lm > second.flops_used_lm == own_flops(first)
    for result in (first, second):
        assert result.predicted_flops_lm == pytest.approx(own_flops(result), rel=0.05)
    assert own_flops(whole) <= whole.flops_full_lm * (1.0 + 1e-9)


def test_label_cache_is_bounded_and_needs_the_head(runtime: ReuseRuntime) -> None:
    rt = ReuseRuntime(runtime.vlm, label_cache=True)
    assert rt.reuse.labels is not None
    rt.reuse.labels = LabelCache(max_entries=2)
    rt.reuse.assemble(PREFIX, _pages(rt), QUESTION)
    assert len(rt.reuse.labels) == 2  # three labels, the least recently used went
    with pytest.raises(ValueError):
        LabelCache(max_entries=0)
    with pytest.raises(ValueError):
        ReuseRuntime(runtime.vlm, label_cache=True, head_cache=False)


def test_warmed_labels_are_charged_to_no_answer(runtime: ReuseRuntime) -> None:
    rt = ReuseRuntime(runtime.vlm, label_cache=True, never_above_full=False)
    pages = _pages(rt)
    assert answering.warm_labels(rt, PREFIX, pages) > 0  # three labels computed, nothing assembled
    assert rt.reuse.labels is not None and len(rt.reuse.labels) == 3
    assert answering.warm_labels(rt, PREFIX, pages) == 0.0
    req = AnswerRequest(PREFIX, pages, QUESTION,
                        policy=choose_policy("random"), budget=0.1, max_new_tokens=2)
    first, second = answering.answer(rt, req), answering.answer(rt, req)
    assert first.flops_used_lm == second.flops_used_lm  # the first paid for no label


def test_a_policy_without_a_cost_profile_reads_the_labels(runtime: ReuseRuntime) -> None:
    rt = ReuseRuntime(runtime.vlm, label_cache=True, never_above_full=False)
    assert rt.reuse.labels is not None
    pages = _pages(rt)
    ref = rt.reuse.assemble(PREFIX, pages, QUESTION)  # labels loaded; kept alive: its memory is not
    spans = ref.layout.labels  # handed to the answer's cache
    rt.reuse.labels.clear()  # the answer computes them (charged, and predicted)
    conduit = get_policy("conduit")
    seen: list[torch.Tensor] = []

    def profileless(ctx: PolicyContext) -> torch.Tensor:  # run by the cost model itself
        rows = conduit(ctx)  # its scoring pass read the cache, labels included
        seen.append(torch.cat([ctx.cache.keys[:, 0, :, s.start:s.stop] for s in spans], -2))
        return rows

    assert getattr(conduit, "cost_profile", None) is not None
    register_policy("profileless", profileless)
    try:
        got, again = (answering.answer(rt,
            AnswerRequest(PREFIX, pages, QUESTION, policy=choose_policy("profileless"),
                                              budget=0.1, max_new_tokens=4)) for _ in range(2))
    finally:
        POLICIES.pop("profileless")
    want = torch.cat([ref.cache.keys[:, 0, :, s.start:s.stop] for s in spans], -2)
    torch.testing.assert_close(seen[0], want, rtol=0, atol=0)  # (L, kv, labels, hd)
    assert got.flops_used_lm > again.flops_used_lm  # the labels charged to the first
    assert own_flops(got) == again.flops_used_lm
    for result in (got, again):
        assert result.predicted_flops_lm == pytest.approx(own_flops(result), rel=1e-9)
    plain = answering.answer(rt, AnswerRequest(PREFIX, pages, QUESTION,
                                               policy=choose_policy("conduit"),
                                               budget=0.1, max_new_tokens=4))
    assert got.token_ids == plain.token_ids
