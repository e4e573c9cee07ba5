"""Every registered policy on the tiny Qwen2-VL: budgets, the budget-1.0 invariant,
seeding, and the FLOPs each answer reports."""

from __future__ import annotations

import math

import pytest
import torch

from conduit_core.answer_types import AnswerRequest
from conduit_core.flops import LMShape, full_prefill_flops, rows_flops, vision_flops
from conduit_core.policies import POLICIES
from conduit_core.policies.cacheblend import CacheBlendPolicy
from conduit_core.refresh_probe import probe_full_prefill, probe_refresh

from .conftest import CachedPages

PREFIX = "You answer questions about scanned archive pages."
LABELS = ["Page 1:", "Page 2:", "Page 3:"]
QUESTION = "Which page names the ledger?"
BUDGETED = ["random", "raw_attention", "value_norm", "cacheblend", "epic", "conduit",
            "conduit_no_amp", "conduit_per_page"]


def request(cached: CachedPages, policy: str, budget: float, **kw: object) -> AnswerRequest:
    prefix = str(kw.pop("prefix", PREFIX))
    labels = list(kw.pop("labels", LABELS))  # type: ignore[call-overload]
    return AnswerRequest(prefix=prefix, pages=cached.inputs(labels), question=QUESTION,
                         policy=policy, budget=budget, max_new_tokens=2, seed=7, **kw)  # type: ignore[arg-type]


def test_registry_names() -> None:
    assert set(POLICIES) == {"full_prefill", "full_reuse", "prefix_reuse", "random",
                             "raw_attention", "value_norm", "cacheblend", "epic", "vlcache",
                             "conduit", "conduit_no_amp", "conduit_per_page"}


@pytest.mark.parametrize("budget", [0.05, 0.1, 0.3])
def test_every_policy_refreshes_its_budget(cached: CachedPages, budget: float) -> None:
    sizes = [kv.num_tokens for kv in cached.kvs]
    n_v = sum(sizes)
    expected = {name: round(budget * n_v) for name in BUDGETED}
    expected |= {"full_prefill": n_v, "full_reuse": 0, "prefix_reuse": n_v,
                 "vlcache": sum(math.floor(budget * t) for t in sizes)}
    for name in POLICIES:
        result = cached.runtime.answer(request(cached, name, budget))
        assert result.visual_tokens == n_v
        assert result.refreshed_visual_tokens == expected[name], name


def test_first_token_policies_pick_page_heads(cached: CachedPages) -> None:
    starts = []
    probe = probe_refresh(cached.runtime, request(cached, "epic", 0.2))  # k = 9: 3 per page
    layout = cached.runtime.assemble(PREFIX, cached.inputs(LABELS), QUESTION).layout
    for seg in layout.segments:
        starts += list(range(seg.start, seg.start + 3))
    assert probe.visual_rows.tolist() == starts
    probe = probe_refresh(cached.runtime, request(cached, "vlcache", 0.2))  # floor .2 T_m
    want = [r for seg in layout.segments for r in range(seg.start, seg.start
                                                         + math.floor(0.2 * seg.length))]
    assert probe.visual_rows.tolist() == want


@pytest.mark.parametrize("name", sorted(set(POLICIES) - {"full_reuse"}))
def test_budget_one_equals_full_prefill(cached: CachedPages, name: str) -> None:
    ref = probe_full_prefill(cached.runtime, PREFIX, cached.fresh(LABELS), QUESTION)
    got = probe_refresh(cached.runtime, request(cached, name, 1.0))
    assert torch.equal(got.rows, ref.rows)
    assert torch.allclose(got.logits, ref.logits, atol=1e-4, rtol=0)


def test_prefix_reuse_reuses_an_identical_leading_page(cached: CachedPages) -> None:
    labels = ["", "Page 2:", "Page 3:"]
    probe = probe_refresh(cached.runtime, request(cached, "prefix_reuse", 0.0, prefix="",
                                                  labels=labels))
    layout = cached.runtime.assemble("", cached.inputs(labels), QUESTION).layout
    first = layout.segments[0]
    assert first.start == len(cached.runtime.adapter.page_opening_ids())
    assert probe.visual_rows.tolist() == [r for s in layout.segments[1:]
                                          for r in range(s.start, s.stop)]
    ref = probe_full_prefill(cached.runtime, "", cached.fresh(labels), QUESTION)
    assert torch.allclose(probe.logits[-1], ref.logits[-1], atol=1e-4, rtol=0)


def test_random_is_seeded(cached: CachedPages) -> None:
    a = probe_refresh(cached.runtime, request(cached, "random", 0.2))
    b = probe_refresh(cached.runtime, request(cached, "random", 0.2))
    c = probe_refresh(cached.runtime, AnswerRequest(
        prefix=PREFIX, pages=cached.inputs(LABELS), question=QUESTION, policy="random",
        budget=0.2, seed=8))
    assert torch.equal(a.visual_rows, b.visual_rows)
    assert not torch.equal(a.visual_rows, c.visual_rows)


def test_answer_flops_are_scoring_plus_refresh(cached: CachedPages) -> None:
    rt = cached.runtime
    shape = LMShape.from_config(rt.adapter.text_config)
    asm = rt.assemble(PREFIX, cached.inputs(LABELS), QUESTION)
    text = asm.layout.text_rows()
    full_lm = full_prefill_flops(shape, asm.layout.n)
    full = full_lm + vision_flops(rt.adapter, asm.image_grids)
    for name, scoring in [("conduit", True), ("random", False), ("value_norm", False)]:
        probe = probe_refresh(rt, request(cached, name, 0.1))
        result = rt.answer(request(cached, name, 0.1))
        used = (rows_flops(shape, probe.computed_rows)
                + (rows_flops(shape, text) if scoring else 0.0))
        first = int(probe.visual_rows.min())  # text rows before it come from the scoring pass
        reused = probe.rows[probe.rows < first] if scoring else probe.rows[:0]
        assert torch.equal(probe.computed_rows, probe.rows[reused.numel():])
        assert (reused.numel() > 0) == scoring  # the prefix rows are reused after scoring
        assert result.flops_full == pytest.approx(full)
        assert result.flops_full_lm == pytest.approx(full_lm)
        assert result.flops_used == result.flops_used_lm == pytest.approx(used)  # no vision
        assert result.flops_ratio_lm == pytest.approx(used / full_lm)
        assert result.flops_ratio_total == pytest.approx(used / full)
        assert result.flops_ratio_total < result.flops_ratio_lm
    reuse = rt.answer(request(cached, "full_reuse", 0.1))
    assert reuse.flops_used == pytest.approx(rows_flops(shape, text))


def test_cacheblend_flops_and_check_layer(cached: CachedPages,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    rt = cached.runtime
    shape = LMShape.from_config(rt.adapter.text_config)
    n_layers = len(rt.adapter.layers)
    for check in (0, 1):
        monkeypatch.setitem(POLICIES, "cacheblend_x", CacheBlendPolicy(check_layer=check))
        probe = probe_refresh(rt, request(cached, "cacheblend_x", 0.1))
        n = int(probe.rows.max()) + 1
        # every token through layers 0..check, the carried rows through the rest
        expected = (rows_flops(shape, torch.arange(n), n_layers=check + 1)
                    + rows_flops(shape, probe.rows, n_layers=n_layers - check - 1))
        assert probe.extra_flops + rows_flops(shape, probe.rows) == pytest.approx(expected)
        result = rt.answer(request(cached, "cacheblend_x", 0.1))
        assert result.refreshed_visual_tokens == round(0.1 * result.visual_tokens)
    # a check at the last layer recomputes everything: a full prefill
    monkeypatch.setitem(POLICIES, "cacheblend_x", CacheBlendPolicy(check_layer=n_layers - 1))
    full = rt.answer(request(cached, "cacheblend_x", 0.1))
    ref = rt.answer_full_prefill(PREFIX, cached.fresh(LABELS), QUESTION, max_new_tokens=2)
    assert full.flops_used == pytest.approx(ref.flops_used - vision_flops(
        rt.adapter, rt.assemble(PREFIX, cached.inputs(LABELS), QUESTION).image_grids))
    assert full.token_ids == ref.token_ids


def test_score_based_policies_skip_scoring_at_trivial_budgets(cached: CachedPages) -> None:
    rt = cached.runtime
    reuse = rt.answer(request(cached, "full_reuse", 0.0))
    everything = rt.answer(request(cached, "full_prefill", 1.0))
    for name in ("conduit", "raw_attention", "conduit_per_page"):
        assert rt.answer(request(cached, name, 0.0)).flops_used == reuse.flops_used
        assert rt.answer(request(cached, name, 1.0)).flops_used == everything.flops_used
    assert rt.answer(request(cached, "conduit", 0.1)).flops_used > reuse.flops_used
