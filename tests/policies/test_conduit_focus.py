"""`conduit_focus`, a product policy (issue 67): its rule on hand-made scores (the mass count, the
floor, the page boundary within the cap, the diffuse case), and on the tiny random-weight
Qwen2-VL, whose attention is diffuse, the cap binds: the same tokens, answer and FLOPs as
`conduit_per_page`."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from conduit_core.answer_types import AnswerRequest
from conduit_core.passes.stale_pass import StaleScores
from conduit_core.policies import choose_policy, get_policy
from conduit_core.policies.choice import DEFAULT_POLICY
from conduit_core.policies.conduit_focus import (
    BOUNDARY,
    FocusPolicy,
    boundary_rows,
    focus_counts,
    mass_count,
    within_cap,
)
from conduit_core.policies.policy_context import PolicyContext
from conduit_core.policies.selection import quota_split
from conduit_core.prompt.layout import Segment
from lab import answering
from lab.refresh_probe import probe_refresh

from .conftest import CachedPages

LABELS = ["Page 1:", "Page 2:", "Page 3:"]
QUESTION = "Which page names the ledger?"
PAGES = np.repeat(np.arange(3), [18, 17, 10])  # (45,) the fixture's pages, delimiters in


def test_the_mass_count_by_hand() -> None:
    spike = np.array([1.0, 10.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    assert mass_count(spike, 0.5, 8) == 1  # 10 of 17
    assert mass_count(spike, 0.7, 8) == 3  # 12 of 17 is 0.71
    assert mass_count(spike, 0.7, 2) == 2  # not reached within the cap: the cap
    assert mass_count(np.zeros(8), 0.5, 5) == 5 and mass_count(spike, 0.5, 0) == 0
    with pytest.raises(ValueError):
        mass_count(spike, 0.0, 8)


def test_each_page_keeps_its_floor_and_its_share_of_the_mass() -> None:
    sizes = torch.tensor([18, 17, 10])
    assert quota_split(sizes, 6).tolist() == [3, 2, 1]  # the floor at k = 22: 0.3 k = 6
    spike = np.full(45, 0.01, dtype=np.float32)
    spike[[36, 37, 38]] = 10.0  # on the last page: two of them hold half the mass
    assert focus_counts(spike, PAGES, 3, 22).tolist() == [3, 2, 2]  # type: ignore[union-attr]
    spread = np.full(45, 2.4, dtype=np.float32)
    spread[[0, 1, 2, 3, 18, 19, 20, 36, 37]] = 10.0  # nine hold half, over every floor
    assert focus_counts(spread, PAGES, 3, 22).tolist() == [4, 3, 2]  # type: ignore[union-attr]
    assert focus_counts(np.ones(45, dtype=np.float32), PAGES, 3, 22) is None  # diffuse
    spread = np.full(45, 8.0, dtype=np.float32)
    spread[[*range(12), *range(18, 27)]] = 10.0  # 21 hold half: with the floor, 22 or more
    assert focus_counts(spread, PAGES, 3, 22) is None


def test_a_chosen_page_start_brings_the_end_of_the_page_before() -> None:
    segments = [Segment(10, 20, 0), Segment(34, 10, 1), Segment(48, 8, 2)]
    assert boundary_rows(segments, {11, 12, 40}, 4) == []  # no page but the first started
    assert boundary_rows(segments, {35}, 4) == [28, 27, 26, 25]  # before 29, its delimiter
    assert boundary_rows(segments, {35}, 64) == list(range(28, 10, -1))  # the page, no more
    assert boundary_rows(segments, {35, 49}, 2) == [28, 42, 27, 41]  # nearest their ends


def test_the_boundary_stays_within_the_cap() -> None:
    calls: list[int] = []

    def fewer(k: int) -> torch.Tensor:
        calls.append(k)
        return torch.arange(29, 29 + k)

    chosen = torch.tensor([31, 32])
    assert within_cap(chosen, [28, 27], 5, fewer).tolist() == [27, 28, 31, 32]  # it fits
    assert within_cap(chosen, [], 5, fewer) is chosen and calls == []
    chosen = torch.tensor([31, 32, 33, 34])
    assert within_cap(chosen, [28, 27, 26], 5, fewer).tolist() == [26, 27, 28, 29, 30]
    assert calls == [2]  # the room left beside the three
    calls.clear()
    chosen = torch.tensor([27, 31, 32, 33, 34])  # holds one of the two: room for four, but
    assert within_cap(chosen, [28, 27], 5, fewer).tolist() == [27, 28, 29, 30, 31]
    assert calls == [4, 3]  # the choice at four holds neither: then room for three
    calls.clear()
    rows = within_cap(torch.tensor([31]), [28, 27, 26, 25, 24], 3, fewer)
    assert rows.tolist() == [26, 27, 28] and calls == [0]  # the k nearest alone


def _scored(cached: CachedPages, budget: float, weighted: torch.Tensor) -> PolicyContext:
    """A context over the fixture's pages whose scoring pass gives `weighted` (N_v,) at the
    visual rows (0 elsewhere)."""
    rt = cached.runtime
    asm = rt.reuse.assemble("Archive pages.", cached.inputs(LABELS), QUESTION)
    ctx = rt.reuse.policy_context(asm, budget, 0)
    full = torch.zeros(asm.layout.n)
    full[ctx.visual_rows] = weighted
    policy = get_policy("conduit_focus")
    assert isinstance(policy, FocusPolicy)
    rows = asm.layout.question_rows()
    ctx.add_scores(policy.config.score, StaleScores(
        weighted=full.to(asm.cache.keys.device), attention=full, config=policy.config.score,
        question_rows=rows, text_rows=rows), 0.0)
    return ctx


def test_the_rule_on_hand_made_scores(cached: CachedPages) -> None:
    spike = torch.full((45,), 0.01)
    spike[[18, 19]] = 10.0  # page 2's opening delimiter and first token: half the mass
    ctx = _scored(cached, 0.5, spike)
    first, second, last = ctx.layout.segments
    assert ctx.k == 22
    rows = get_policy("conduit_focus")(ctx).tolist()  # floor [3, 2, 1], page 2's two held
    boundary = list(range(first.start + 1, first.stop - 1))  # the page before, 16 rows
    assert rows == sorted({first.start, *boundary, second.start, second.start + 1,
                           last.start})
    assert FocusPolicy(boundary=0)(ctx).tolist() == [
        first.start, first.start + 1, first.start + 2, second.start, second.start + 1,
        last.start]
    ctx = _scored(cached, 0.3, spike)  # k = 14: the 14 rows nearest page 1's end
    assert get_policy("conduit_focus")(ctx).tolist() == list(range(first.stop - 15,
                                                                   first.stop - 1))
    ctx = _scored(cached, 0.1, torch.rand(45, generator=torch.Generator().manual_seed(0)))
    per_page = get_policy("conduit_per_page")(ctx)  # diffuse: the quota's choice, the same
    assert torch.equal(get_policy("conduit_focus")(ctx), per_page)  # pass, no boundary


@pytest.mark.parametrize("budget", [0.05, 0.1, 0.3])
def test_on_random_weights_the_cap_binds(cached: CachedPages, budget: float) -> None:
    """Diffuse attention: `conduit_focus` refreshes k, the default's (`conduit_per_page`)
    tokens, and answers as it does at the same charged FLOPs."""
    assert DEFAULT_POLICY == "conduit_per_page" and BOUNDARY == 64
    results, rows = {}, {}
    for name in ("conduit_focus", "conduit_per_page"):
        request = AnswerRequest(prefix="Archive pages.", pages=cached.inputs(LABELS),
                                question=QUESTION, policy=choose_policy(name), budget=budget,
                                max_new_tokens=3)
        rows[name] = probe_refresh(cached.runtime, request).visual_rows
        results[name] = answering.answer(cached.runtime, request)
    focus, per_page = results["conduit_focus"], results["conduit_per_page"]
    assert torch.equal(rows["conduit_focus"], rows["conduit_per_page"])
    assert focus.refreshed_visual_tokens == per_page.refreshed_visual_tokens > 0
    assert focus.token_ids == per_page.token_ids
    assert focus.flops_used_lm == per_page.flops_used_lm
    assert focus.fallback == per_page.fallback


def test_options_as_conduit_per_page(cached: CachedPages) -> None:
    from conduit_core.errors import InvalidRequestError
    from conduit_core.policies.choice import PolicyOptions

    chosen = choose_policy("conduit_focus", PolicyOptions(score_layers="all", query_window=4,
                                                          head_agg="max")).select
    assert isinstance(chosen, FocusPolicy) and chosen.boundary == BOUNDARY
    assert chosen.config.score.query_window == 4 and chosen.config.gamma == 0.0
    with pytest.raises(InvalidRequestError):
        choose_policy("conduit_focus", PolicyOptions(gamma=1.0))
    assert replace(chosen, boundary=0).boundary == 0
