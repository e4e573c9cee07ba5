"""Every registered policy on the tiny Qwen2-VL: budgets, the budget-1.0 invariant,
seeding, and the FLOPs each answer reports."""

from __future__ import annotations

import pytest
import torch

from conduit_core.answer_types import AnswerRequest
from conduit_core.model.flops import (
    LMShape,
    full_prefill_flops,
    rows_flops,
    trimmed_rows_flops,
    vision_flops,
)
from conduit_core.passes.row_attention import group_bounds, row_groups
from conduit_core.policies import POLICIES, choose_policy
from conduit_core.policies.cacheblend import CacheBlendPolicy
from conduit_core.policies.selection import budget_tokens
from conduit_core.runtime import ReuseRuntime
from lab import answering
from lab.refresh_probe import probe_full_prefill, probe_refresh
from tests.device import TEST_DEVICE, same_answer, tol

from .conftest import CachedPages

PREFIX = "You answer questions about scanned archive pages."
LABELS = ["Page 1:", "Page 2:", "Page 3:"]
QUESTION = "Which page names the ledger?"
BUDGETED = ["random", "raw_attention", "value_norm", "cacheblend", "epic", "epic_proportional",
            "conduit", "conduit_no_amp", "conduit_per_page", "conduit_focus"]


def block_counts(rows: torch.Tensor, n: int) -> torch.Tensor:
    """Keys the grouped attention computes per row: its group's last row + 1, the rows cut
    into `row_attention.row_groups` groups of the test device (four on the CPU) where the
    keys read in all are fewest."""
    out = torch.empty_like(rows)
    for start, stop, _ in group_bounds(rows, n, row_groups(TEST_DEVICE)):
        out[start:stop] = min(int(rows[:stop].max()) + 1, n)
    return out


def request(cached: CachedPages, policy: str, budget: float, **kw: object) -> AnswerRequest:
    prefix = str(kw.pop("prefix", PREFIX))
    labels = list(kw.pop("labels", LABELS))  # type: ignore[call-overload]
    return AnswerRequest(prefix=prefix, pages=cached.inputs(labels), question=QUESTION,
                         policy=choose_policy(policy), budget=budget, max_new_tokens=2, seed=7,
                         **kw)  # type: ignore[arg-type]


def test_registry_names() -> None:
    assert set(POLICIES) == {"full_prefill", "full_reuse", "prefix_reuse", "random",
                             "raw_attention", "value_norm", "cacheblend", "epic",
                             "epic_proportional", "conduit", "conduit_adaptive", "conduit_no_amp",
                             "conduit_per_page", "conduit_focus"}
    assert set(BUDGETED) | {"full_prefill", "full_reuse", "prefix_reuse",
                            "conduit_adaptive"} == set(POLICIES)


@pytest.mark.parametrize("budget", [0.03, 0.05, 0.1, 0.3, 0.55])
def test_every_policy_refreshes_its_budget(cached: CachedPages, budget: float) -> None:
    """One rounding rule (`budget_tokens`: Python's round of budget * N_v) for every
    budgeted policy; the three budget-free ones refresh what they are defined by; the
    budget caps `conduit_adaptive` and `conduit_focus` (a count per question), and on these
    random weights (diffuse attention) the default's cap binds at the budgets it serves."""
    sizes = [kv.num_tokens for kv in cached.kvs]
    n_v = sum(sizes)
    expected = {name: budget_tokens(budget, n_v) for name in BUDGETED}
    expected |= {"full_prefill": n_v, "full_reuse": 0, "prefix_reuse": n_v}
    assert budget_tokens(budget, n_v) == round(budget * n_v)
    for name in POLICIES:
        result = answering.answer(cached.runtime, request(cached, name, budget))
        assert result.visual_tokens == n_v
        if name == "conduit_adaptive" or (name == "conduit_focus" and budget > 0.3):
            assert 0 < result.refreshed_visual_tokens <= budget_tokens(budget, n_v)
            continue
        assert result.refreshed_visual_tokens == expected[name], (name, budget)


def test_first_token_policies_pick_page_heads(cached: CachedPages) -> None:
    starts = []
    probe = probe_refresh(cached.runtime, request(cached, "epic", 0.2))  # k = 9: 3 per page
    layout = cached.runtime.reuse.assemble(PREFIX, cached.inputs(LABELS), QUESTION).layout
    for seg in layout.segments:
        starts += list(range(seg.start, seg.start + 3))
    assert probe.visual_rows.tolist() == starts
    probe = probe_refresh(cached.runtime, request(cached, "epic_proportional", 0.2))
    k = round(0.2 * sum(s.length for s in layout.segments))
    counts = []
    for seg in layout.segments:  # a leading run of each page, in proportion to its size
        mine = [r for r in probe.visual_rows.tolist() if seg.start <= r < seg.stop]
        assert mine == list(range(seg.start, seg.start + len(mine)))
        counts.append(len(mine))
    n_v = sum(s.length for s in layout.segments)
    assert sum(counts) == k
    assert all(abs(c - k * s.length / n_v) < 1 for c, s in zip(counts, layout.segments,
                                                                strict=True))


@pytest.mark.parametrize("name", sorted(set(POLICIES) - {"full_reuse"}))
def test_budget_one_equals_full_prefill(cached: CachedPages, name: str) -> None:
    ref = probe_full_prefill(cached.runtime, PREFIX, cached.fresh(LABELS), QUESTION,
                             logits="all")
    got = probe_refresh(cached.runtime, request(cached, name, 1.0), logits="all")
    assert torch.equal(got.rows, ref.rows) and got.logits.shape == ref.logits.shape
    torch.testing.assert_close(got.logits, ref.logits, **tol("logits"))


def test_prefix_reuse_reuses_an_identical_leading_page(cached: CachedPages) -> None:
    labels = ["", "Page 2:", "Page 3:"]
    probe = probe_refresh(cached.runtime, request(cached, "prefix_reuse", 0.0, prefix="",
                                                  labels=labels))
    layout = cached.runtime.reuse.assemble("", cached.inputs(labels), QUESTION).layout
    first = layout.segments[0]
    assert first.start == len(cached.runtime.adapter.page_opening_ids())
    assert probe.visual_rows.tolist() == [r for s in layout.segments[1:]
                                          for r in range(s.start, s.stop)]
    ref = probe_full_prefill(cached.runtime, "", cached.fresh(labels), QUESTION)
    torch.testing.assert_close(probe.logits[-1], ref.logits[-1], **tol("logits"))


def test_random_is_seeded(cached: CachedPages) -> None:
    a = probe_refresh(cached.runtime, request(cached, "random", 0.2))
    b = probe_refresh(cached.runtime, request(cached, "random", 0.2))
    c = probe_refresh(cached.runtime, AnswerRequest(
        prefix=PREFIX, pages=cached.inputs(LABELS), question=QUESTION,
        policy=choose_policy("random"),
        budget=0.2, seed=8))
    assert torch.equal(a.visual_rows, b.visual_rows)
    assert not torch.equal(a.visual_rows, c.visual_rows)


def test_answer_flops_are_scoring_plus_refresh(cached: CachedPages) -> None:
    rt = ReuseRuntime(cached.runtime.vlm, label_cache=False,  # the labels are text rows
                      never_above_full=False)
    shape = LMShape.from_config(rt.adapter.text_config)
    asm = rt.reuse.assemble(PREFIX, cached.inputs(LABELS), QUESTION, last_only=True)
    text, n = asm.fresh_text_rows(), asm.layout.n  # the head comes from the head cache
    assert asm.exact_rows > 0 and text.numel() < asm.layout.text_rows().numel()
    n_q = asm.layout.question_rows().numel()
    last = torch.tensor([n])  # the one row whose last layer runs in full sees every key

    def charged(rows: torch.Tensor) -> float:  # rows through every layer, the last trimmed
        return trimmed_rows_flops(shape, rows, shape.layers, block_counts(rows, n), last)

    full_lm = trimmed_rows_flops(shape, torch.arange(n), shape.layers, torch.arange(n) + 1,
                                 last)
    full = full_lm + vision_flops(rt.adapter, asm.image_grids)
    # the scoring pass: its text rows as the blocked attention computes them, plus every
    # layer's float32 QK^T of the question rows over all n keys for every head (2 dh), softmax
    # and norm-weighted reduction (8 per pair and head), and value norms (2 dh per key, KV head)
    scoring_lm = (charged(text)
                  + shape.layers * (n_q * n * shape.heads * (2 * shape.head_dim + 8)
                                    + 2 * shape.kv_heads * shape.head_dim * n))
    assert block_counts(text, n).sum() > (text + 1).sum()  # charged above the causal pairs
    for name, scoring in [("conduit", True), ("random", False), ("value_norm", False)]:
        probe = probe_refresh(rt, request(cached, name, 0.1), last_only=True)
        result = answering.answer(rt, request(cached, name, 0.1))
        computed = probe.computed_rows
        if scoring:  # the visual rows through layer 0; every row from layer 1 (its text
            # rows' layer 0 is the scoring pass's, exact: layer-0 K/V are never stale)
            visual = probe.visual_rows
            used = (rows_flops(shape, visual, 1, block_counts(visual, n)) + scoring_lm
                    + trimmed_rows_flops(shape, computed, shape.layers - 1,
                                         block_counts(computed, n), last))
        else:
            used = charged(computed)
        assert probe.extra_flops == pytest.approx(scoring_lm if scoring else 0.0)
        # text rows before the first refreshed visual row come from the scoring pass
        first = int(probe.visual_rows.min()) if scoring else asm.exact_rows
        assert torch.equal(computed, probe.rows[probe.rows >= max(first, asm.exact_rows)])
        assert int((probe.rows < first).sum()) > asm.exact_rows or not scoring
        assert result.flops_full == pytest.approx(full)
        assert result.flops_full_lm == pytest.approx(full_lm)
        assert result.flops_used == result.flops_used_lm == pytest.approx(used)  # no vision
        assert result.flops_ratio_lm == pytest.approx(used / full_lm)
        assert result.flops_ratio_total == pytest.approx(used / full)
        assert result.flops_ratio_total < result.flops_ratio_lm
    reuse = answering.answer(rt, request(cached, "full_reuse", 0.1))
    assert reuse.flops_used == pytest.approx(charged(text))


def test_cacheblend_flops_and_check_layer(cached: CachedPages,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    rt = cached.runtime
    shape = LMShape.from_config(rt.adapter.text_config)
    n_layers = len(rt.adapter.layers)
    for check in (0, 1):
        monkeypatch.setitem(POLICIES, "cacheblend_x", CacheBlendPolicy(check_layer=check))
        probe = probe_refresh(rt, request(cached, "cacheblend_x", 0.1), last_only=True)
        n = int(probe.rows.max()) + 1
        head = int((probe.rows < probe.computed_rows.min()).sum())  # from the head cache
        # every token through layers 0..check (causal), then the carried rows resume from the
        # check layer: through the remaining layers only, not again from layer 0
        assert head > 0 and torch.equal(probe.computed_rows, probe.rows[head:])
        check_pass = rows_flops(shape, torch.arange(n), n_layers=check + 1)
        carried = trimmed_rows_flops(shape, probe.computed_rows, n_layers - check - 1,
                                     block_counts(probe.computed_rows, n), torch.tensor([n]))
        assert probe.extra_flops == pytest.approx(check_pass)
        assert probe.refresh_flops == pytest.approx(carried)
        result = answering.answer(rt, request(cached, "cacheblend_x", 0.1))
        assert result.flops_used_lm == pytest.approx(check_pass + carried)
        assert result.refreshed_visual_tokens == round(0.1 * result.visual_tokens)
    # a check at the last layer recomputes everything: a full prefill (every row through
    # every layer in full, the last one included)
    monkeypatch.setitem(POLICIES, "cacheblend_x", CacheBlendPolicy(check_layer=n_layers - 1))
    full = answering.answer(rt, request(cached, "cacheblend_x", 0.1))
    ref = answering.answer_full_prefill(rt,
        PREFIX, cached.fresh(LABELS), QUESTION, max_new_tokens=2)
    assert full.flops_used == pytest.approx(full_prefill_flops(shape, full.prompt_tokens))
    assert same_answer(full.token_ids, ref.token_ids)


def test_score_based_policies_skip_scoring_at_trivial_budgets(cached: CachedPages) -> None:
    rt = cached.runtime
    reuse = answering.answer(rt, request(cached, "full_reuse", 0.0))
    everything = answering.answer(rt, request(cached, "full_prefill", 1.0))
    for name in ("conduit", "raw_attention", "conduit_per_page"):
        assert answering.answer(rt, request(cached, name, 0.0)).flops_used == reuse.flops_used
        assert answering.answer(rt, request(cached, name, 1.0)).flops_used == everything.flops_used
    assert answering.answer(rt, request(cached, "conduit", 0.1)).flops_used > reuse.flops_used


def test_probes_form_only_the_logits_asked_for(cached: CachedPages) -> None:
    """By default a probe forms the last row's logits only (what the callers read; every
    row's at a 152k vocabulary is 0.6 MB a row); `logits="all"` keeps every row's."""
    rt = cached.runtime
    vocab = rt.adapter.lm_head.out_features
    req = request(cached, "conduit", 0.2)
    last, every = probe_refresh(rt, req), probe_refresh(rt, req, logits="all")
    assert last.logits.shape == (1, vocab)
    assert every.logits.shape == (every.rows.numel(), vocab) and every.rows.numel() > 1
    torch.testing.assert_close(last.logits[-1], every.logits[-1], **tol("logits"))
    ref = probe_full_prefill(rt, PREFIX, cached.fresh(LABELS), QUESTION)
    assert ref.logits.shape == (1, vocab)
    with pytest.raises(ValueError, match="last"):
        probe_refresh(rt, req, logits="some")  # type: ignore[arg-type]
