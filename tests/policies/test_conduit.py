"""CONDUIT's own properties: c = 1 with one page, and global selection vs a per-page quota
when one page carries the signal."""

from __future__ import annotations

import pytest
import torch

from conduit_core.answer_types import AnswerRequest
from conduit_core.passes.assembly import Assembly
from conduit_core.passes.scoring import ScoreConfig
from conduit_core.passes.stale_pass import StaleScores
from conduit_core.policies import choose_policy, get_policy
from conduit_core.policies.conduit import ConduitConfig, ConduitPolicy
from conduit_core.policies.policy_context import PolicyContext
from lab import answering
from lab.ablations.conduit_adaptive import AdaptiveConduitPolicy
from tests.core.helpers import token_scores

from .conftest import CachedPages

PREFIX = "Archive notes."
QUESTION = "What does the ledger say?"


def context(cached: CachedPages, asm: Assembly, budget: float,
            scores: StaleScores | None = None) -> PolicyContext:
    rt = cached.runtime

    def scorer(config: ScoreConfig) -> tuple[StaleScores, float]:
        return (scores, 0.0) if scores is not None else rt.reuse.scoring(asm, config)

    return PolicyContext(layout=asm.layout, budget=budget, seed=0, scorer=scorer,
                         cache=asm.cache, embeds=asm.embeds, adapter=rt.adapter)


def share_on(rows: torch.Tensor, asm: Assembly, page: int) -> float:
    seg = asm.layout.segments[page]
    return float(((rows >= seg.start) & (rows < seg.stop)).float().mean())


def test_one_page_amplification_is_one(cached: CachedPages) -> None:
    asm = cached.runtime.reuse.assemble(PREFIX, cached.inputs(["Page:", "", ""])[:1], QUESTION)
    choice = ConduitPolicy().explain(context(cached, asm, 0.3))
    assert choice.amplification.tolist() == [1.0]
    plain = ConduitPolicy(ConduitConfig(gamma=0.0)).explain(context(cached, asm, 0.3))
    assert torch.equal(choice.rows, plain.rows)
    assert choice.rows.numel() == round(0.3 * asm.layout.segments[0].length)


def test_several_pages_get_different_amplification(cached: CachedPages) -> None:
    asm = cached.runtime.reuse.assemble(PREFIX, cached.inputs(["A", "B", "C"]), QUESTION)
    c = ConduitPolicy().explain(context(cached, asm, 0.1)).amplification
    assert c.shape == (3,) and float(c.mean()) == pytest.approx(1.0)
    assert float(c.max() - c.min()) > 0.01


def constructed_scores(asm: Assembly, signal_page: int, n_layers: int, heads: int,
                       kv_heads: int) -> StaleScores:
    """Question attention spread over every key, three times denser on one page."""
    n = asm.layout.n
    weight = torch.ones(n)
    seg = asm.layout.segments[signal_page]
    weight[seg.start:seg.stop] = 3.0
    weight[torch.randperm(n, generator=torch.Generator().manual_seed(0))[:n // 2]] *= 1.1
    q_rows = asm.layout.question_rows()
    probs = (weight / weight.sum()).expand(n_layers, heads, q_rows.numel(), n).clone()
    norms = torch.ones(n_layers, kv_heads, n)
    return StaleScores(weighted=token_scores(probs, norms, ScoreConfig()),
                       attention=token_scores(probs, norms, ScoreConfig(), value_norm=False),
                       config=ScoreConfig(), question_rows=q_rows,
                       text_rows=asm.layout.text_rows())


def test_global_selection_follows_the_signal_page(cached: CachedPages) -> None:
    rt = cached.runtime
    asm = rt.reuse.assemble(PREFIX, cached.inputs(["A", "B", "C"]), QUESTION)
    cfg = rt.adapter.text_config
    scores = constructed_scores(asm, 1, len(rt.adapter.layers), cfg.num_attention_heads,
                                cfg.num_key_value_heads)
    budget = 0.2  # k = 9 of 45; page 2 holds 17
    chosen = ConduitPolicy().explain(context(cached, asm, budget, scores))
    quota = ConduitPolicy(ConduitConfig(per_page=True)).explain(context(cached, asm, budget,
                                                                         scores))
    assert chosen.amplification[1] > 1.0 > float(chosen.amplification[0])
    assert share_on(chosen.rows, asm, 1) == 1.0
    assert share_on(quota.rows, asm, 1) == pytest.approx(3 / 9)  # quotas 4, 3, 2
    # the registered variant pins gamma = 0: under quotas amplification changes nothing
    registered = get_policy("conduit_per_page").explain(context(cached, asm, budget, scores))
    assert torch.equal(registered.rows.sort().values, quota.rows.sort().values)
    assert torch.equal(registered.amplification, torch.ones_like(registered.amplification))


def test_real_scoring_pass_follows_a_loud_page(cached: CachedPages) -> None:
    """Make page 3's cached values 4x larger (a page the question's norm-weighted attention
    must favour) and run the real scoring pass: the global top-k goes there, a quota not."""
    rt = cached.runtime
    asm = rt.reuse.assemble(PREFIX, cached.inputs(["A", "B", "C"]), QUESTION)
    seg = asm.layout.segments[2]
    with torch.inference_mode():
        asm.cache.values[:, :, :, seg.start:seg.stop] *= 4.0
    budget = 0.2
    chosen = ConduitPolicy().explain(context(cached, asm, budget))
    asm2 = rt.reuse.assemble(PREFIX, cached.inputs(["A", "B", "C"]), QUESTION)
    with torch.inference_mode():
        asm2.cache.values[:, :, :, seg.start:seg.stop] *= 4.0
    quota = ConduitPolicy(ConduitConfig(per_page=True)).explain(context(cached, asm2, budget))
    assert float(chosen.amplification[2]) > 1.5
    assert share_on(chosen.rows, asm, 2) > 0.5
    assert share_on(quota.rows, asm2, 2) == pytest.approx(2 / 9)


def test_knobs_change_the_choice_and_are_validated(cached: CachedPages) -> None:
    """Each knob on its own: the policy picks the top-k of exactly the scores that knob
    defines (the scoring pass is checked against the all-layers reference in
    tests/core/test_stale_pass.py), and gamma scales page amplification as c_m^gamma."""
    rt = cached.runtime
    for score in [ScoreConfig(layers=(1, 2)), ScoreConfig(query_window=1),
                  ScoreConfig(head_agg="max")]:
        asm = rt.reuse.assemble(PREFIX, cached.inputs(["A", "B", "C"]), QUESTION)
        ctx = context(cached, asm, 0.2)
        choice = ConduitPolicy(ConduitConfig(score=score, gamma=0.0)).explain(ctx)
        mine = ctx.scores(score).weighted.cpu()[asm.layout.visual_rows()]  # (N_v,)
        assert not torch.allclose(mine, ctx.scores().weighted.cpu()[asm.layout.visual_rows()])
        top = asm.layout.visual_rows()[torch.sort(-mine, stable=True).indices[:ctx.k]]
        assert torch.equal(choice.rows, top.sort().values), score
    asm = rt.reuse.assemble(PREFIX, cached.inputs(["A", "B", "C"]), QUESTION)
    one = ConduitPolicy(ConduitConfig(gamma=1.0)).explain(context(cached, asm, 0.2))
    two = ConduitPolicy(ConduitConfig(gamma=2.0)).explain(context(cached, asm, 0.2))
    torch.testing.assert_close(two.amplification, one.amplification ** 2)
    with pytest.raises(ValueError):
        ConduitConfig(gamma=-1.0)


def test_answer_reports_its_budget(cached: CachedPages) -> None:
    result = answering.answer(cached.runtime, AnswerRequest(
        prefix=PREFIX, pages=cached.inputs(["A", "B", "C"]), question=QUESTION,
        policy=choose_policy("conduit"), budget=0.1, max_new_tokens=3))
    assert result.refreshed_visual_tokens == round(0.1 * result.visual_tokens)
    assert 0.0 < result.flops_ratio_total < result.flops_ratio_lm


def test_budget_per_question_stops_at_the_score_mass(cached: CachedPages) -> None:
    """The lab's adaptive CONDUIT refreshes the fewest top tokens holding `mass` of the
    amplified score mass, never more than the budget's k (the cap)."""
    asm = cached.runtime.reuse.assemble(PREFIX, cached.inputs(["A", "B", "C"]), QUESTION)
    fixed = ConduitPolicy().explain(context(cached, asm, 0.5))
    total = float(fixed.scores.sum())
    for mass in (0.2, 0.5):
        rows = AdaptiveConduitPolicy(mass=mass).explain(context(cached, asm, 0.5)).rows
        assert 0 < rows.numel() <= fixed.rows.numel()
        held = torch.sort(fixed.scores, descending=True).values[:rows.numel()]
        assert float(held.sum()) >= mass * total - 1e-6
        assert float(held[:-1].sum()) < mass * total  # one fewer would not do
        assert set(rows.tolist()) <= set(fixed.rows.tolist())  # the top of the same ranking
    capped = AdaptiveConduitPolicy(mass=1.0).explain(context(cached, asm, 0.1)).rows
    assert torch.equal(capped, ConduitPolicy().explain(context(cached, asm, 0.1)).rows)
    with pytest.raises(ValueError, match="mass"):
        AdaptiveConduitPolicy(mass=1.5)


def test_an_answer_says_how_much_it_looked_at_each_page(cached: CachedPages) -> None:
    """With a scoring pass, each page's peak attention normalised over the pages; without
    one (full reuse), nothing."""
    pages = cached.inputs(["A", "B", "C"])
    scored = answering.answer(cached.runtime,
        AnswerRequest(prefix=PREFIX, pages=pages, question=QUESTION,
                                                 policy=choose_policy("conduit"), budget=0.1,
                                                 max_new_tokens=1))
    assert len(scored.page_attention) == 3 and not scored.fallback
    assert sum(scored.page_attention) == pytest.approx(1.0)
    assert all(a > 0 for a in scored.page_attention)
    asm = cached.runtime.reuse.assemble(PREFIX, pages, QUESTION)
    stale, _ = cached.runtime.reuse.scoring(asm)
    peaks = torch.stack([stale.attention[s.start:s.stop].max() for s in asm.layout.segments])
    shares = torch.tensor(asm.page_attention(), device=peaks.device)
    assert torch.allclose(shares, peaks / peaks.sum(), atol=1e-5)
    reuse = answering.answer(cached.runtime,
        AnswerRequest(prefix=PREFIX, pages=pages, question=QUESTION,
                      policy=choose_policy("full_reuse"), max_new_tokens=1))
    assert reuse.page_attention == ()
