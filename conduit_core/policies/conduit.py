"""`conduit`: norm-weighted question attention, image-level amplification, one global top-k.

From the scoring pass (`PolicyContext.scores()`), every visual token j gets
  s_j = mean over layers, question tokens of agg over heads of A[l,h,q,j] ||V[l,g(h),j]||
(reduced layer by layer in the scoring pass, `conduit_core.passes.scoring`); page m's total
R_m = sum_j s_j scales its tokens by c_m = (R_m / mean_m R_m)^gamma; the
k = `PolicyContext.k` (round(budget * N_v)) highest s'_j = c_m s_j over all
pages are refreshed (text tokens are always recomputed and not charged to the budget).

A `ConduitPolicy` runs under one `ConduitConfig`; variants (the per-page quota, the lab's
ablations) are configurations, or subclasses that choose their own k from the amplified
scores (`amplified`, then `positions`). Calling the policy skips the scoring pass where the
choice cannot depend on scores (k = 0 or k = N_v); `cost_profile` declares that pass to the
cost model before it runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from conduit_core.errors import InvalidRequestError
from conduit_core.passes.scoring import ScoreConfig
from conduit_core.policies.choice import PolicyOptions
from conduit_core.policies.policy_context import PolicyContext, PolicyCost
from conduit_core.policies.selection import (
    page_amplification,
    per_page_topk,
    quota_split,
    topk_positions,
)


@dataclass(frozen=True)
class ConduitConfig:
    """CONDUIT's knobs (the request's budget sets k: `PolicyContext.k`).

    gamma:     amplification exponent >= 0; 0 turns amplification off (c_m = 1).
    score:     scoring layers, question-token set and head aggregation (`ScoreConfig`).
    per_page:  False = one global top-k (CONDUIT); True = each page refreshes its share of k
               in proportion to its size (the per-page-quota ablation).
    """

    gamma: float = 1.0
    score: ScoreConfig = field(default_factory=ScoreConfig)
    per_page: bool = False

    def __post_init__(self) -> None:
        if self.gamma < 0:
            raise ValueError(f"gamma must be >= 0, got {self.gamma}")


@dataclass(frozen=True)
class ConduitChoice:
    """One CONDUIT decision with the quantities behind it."""

    rows: torch.Tensor  # (<= k,) sequence indices of the refreshed visual tokens, ascending,
    # on the scores' device (never read back before the refresh), or on the host where a
    # policy decided it from scores it read (`conduit_focus`)
    scores: torch.Tensor  # (N_v,) amplified scores s'_j in visual-token order
    amplification: torch.Tensor  # (M,) c_m per page


@dataclass(frozen=True)
class ConduitPolicy:
    """The CONDUIT refresh policy under one configuration."""

    config: ConduitConfig = field(default_factory=ConduitConfig)
    fixed: frozenset[str] = frozenset()  # `PolicyOptions` knobs that define this variant

    def amplified(self, ctx: PolicyContext) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Score (the scoring pass, through `ctx`) and amplify: the visual rows (N_v,), their
        amplified scores s'_j (N_v,), both on the scores' device, and c_m per page (M,)."""
        cfg = self.config
        weighted = ctx.scores(cfg.score).weighted  # (N,) on the device, never read back
        rows = ctx.visual_rows.to(weighted.device)  # (N_v,)
        s = weighted[rows]  # (N_v,)
        page_of = ctx.page_of_visual  # (N_v,) on the host
        c = page_amplification(s, page_of, ctx.num_pages, cfg.gamma)  # (M,)
        return rows, s * c[page_of.to(c.device)], c

    def positions(self, ctx: PolicyContext, amplified: torch.Tensor, k: int) -> torch.Tensor:
        """The positions (k,) among the visual tokens of the k to refresh: the highest
        amplified scores (N_v,), over all pages or, with `per_page`, per page by quota."""
        if self.config.per_page:  # the quotas from the page sizes, on the host
            page_of = ctx.page_of_visual  # (N_v,)
            sizes = torch.bincount(page_of, minlength=ctx.num_pages)  # (M,)
            return per_page_topk(amplified, page_of, quota_split(sizes, k))
        return topk_positions(amplified, k)

    def explain(self, ctx: PolicyContext) -> ConduitChoice:
        """Score, amplify and select the request's k; runs the scoring pass through `ctx`."""
        rows, amplified, c = self.amplified(ctx)
        pos = self.positions(ctx, amplified, ctx.k)
        return ConduitChoice(rows=rows[pos], scores=amplified, amplification=c)

    def with_options(self, options: PolicyOptions) -> ConduitPolicy:
        """This policy with the request's knobs applied (unset knobs keep their values)."""
        cfg = self.config
        o = options
        pinned = sorted(o.set_knobs() & self.fixed)
        if pinned:
            raise InvalidRequestError(
                f"{', '.join(pinned)} cannot be set for this policy: it is defined by it")
        try:
            score = ScoreConfig(
                layers=cfg.score.layers if o.score_layers is None else o.score_layers,
                query_window=cfg.score.query_window if o.query_window is None
                else o.query_window,
                head_agg=cfg.score.head_agg if o.head_agg is None else o.head_agg,  # type: ignore[arg-type]
            )
            gamma = cfg.gamma if o.gamma is None else o.gamma
            return replace(self, config=replace(cfg, gamma=gamma, score=score))
        except ValueError as exc:
            raise InvalidRequestError(str(exc)) from None

    def cost_profile(self, ctx: PolicyContext) -> PolicyCost:
        """The work `__call__` will do (for `conduit_core.cost.cost_model`)."""
        k = ctx.k
        scores = 0 < k < ctx.visual_rows.numel()
        return PolicyCost(scoring=self.config.score if scores else None, k=k)

    def __call__(self, ctx: PolicyContext) -> torch.Tensor:
        """Sequence indices of the visual tokens to refresh. With k = 0 or k = N_v the choice
        does not depend on scores, so no scoring pass is run (nor charged)."""
        k = ctx.k
        if k == 0:
            return torch.zeros(0, dtype=torch.long)
        if k >= ctx.visual_rows.numel():
            return ctx.visual_rows
        return self.explain(ctx).rows


select = ConduitPolicy()
