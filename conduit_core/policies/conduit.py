"""`conduit`: norm-weighted question attention, image-level amplification, one global top-k.

From the scoring pass (`PolicyContext.scores()`), every visual token j gets
  s_j = mean over layers, question tokens of agg over heads of A[l,h,q,j] ||V[l,g(h),j]||
(reduced layer by layer in the scoring pass, `conduit_core.passes.scoring`); page m's total
R_m = sum_j s_j scales its tokens by c_m = (R_m / mean_m R_m)^gamma; the
k = `PolicyContext.k` (round(budget * N_v)) highest s'_j = c_m s_j over all
pages are refreshed (text tokens are always recomputed and not charged to the budget).

Public API:
  ConduitConfig(budget=None, gamma=1.0, score=ScoreConfig(), per_page=False, mass=None)
  ConduitPolicy(config, fixed=frozenset())   a RefreshPolicy (`fixed`: option names that
                                   define the variant, refused in `with_options`);
                                   .explain(ctx) -> ConduitChoice (always
                                   scores; calling the policy skips scoring when k is 0 or N_v);
                                   .cost_profile(ctx) -> PolicyCost
  ConduitChoice(rows, scores, amplification)
  select = ConduitPolicy()         the registered `conduit`
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from conduit_core.errors import InvalidRequestError
from conduit_core.passes.scoring import ScoreConfig
from conduit_core.policies.choice import PolicyOptions
from conduit_core.policies.policy_context import PolicyContext, PolicyCost
from conduit_core.policies.selection import (
    budget_tokens,
    mass_k,
    page_amplification,
    per_page_topk,
    quota_split,
    topk_positions,
)


@dataclass(frozen=True)
class ConduitConfig:
    """CONDUIT's knobs.

    budget:    fraction of visual tokens to refresh, in [0, 1]; None = the request's budget
               (`AnswerRequest.budget`, default 0.10).
    gamma:     amplification exponent >= 0; 0 turns amplification off (c_m = 1).
    score:     scoring layers, question-token set and head aggregation (`ScoreConfig`).
    per_page:  False = one global top-k (CONDUIT); True = each page refreshes its share of k
               in proportion to its size (the per-page-quota ablation).
    mass:      None = refresh exactly the budget's k; m in (0, 1] = a budget per question:
               the fewest top tokens holding m of the amplified score mass, at most k (the
               budget is then the cap on the refresh, and on its FLOPs).
    """

    budget: float | None = None
    gamma: float = 1.0
    score: ScoreConfig = field(default_factory=ScoreConfig)
    per_page: bool = False
    mass: float | None = None

    def __post_init__(self) -> None:
        if self.budget is not None and not 0.0 <= self.budget <= 1.0:
            raise ValueError(f"budget must be in [0, 1] or None, got {self.budget}")
        if self.gamma < 0:
            raise ValueError(f"gamma must be >= 0, got {self.gamma}")
        if self.mass is not None and not 0.0 < self.mass <= 1.0:
            raise ValueError(f"mass must be in (0, 1] or None, got {self.mass}")


@dataclass(frozen=True)
class ConduitChoice:
    """One CONDUIT decision with the quantities behind it."""

    rows: torch.Tensor  # (k,) sequence indices of the refreshed visual tokens, ascending, on
    # the scores' device (the choice is never read back before the refresh)
    scores: torch.Tensor  # (N_v,) amplified scores s'_j in visual-token order
    amplification: torch.Tensor  # (M,) c_m per page


@dataclass(frozen=True)
class ConduitPolicy:
    """The CONDUIT refresh policy under one configuration."""

    config: ConduitConfig = field(default_factory=ConduitConfig)
    fixed: frozenset[str] = frozenset()  # `PolicyOptions` knobs that define this variant

    def budget_k(self, ctx: PolicyContext) -> int:
        """Visual tokens to refresh: the config's budget, else the request's."""
        if self.config.budget is None:
            return ctx.k
        return budget_tokens(self.config.budget, int(ctx.visual_rows.numel()))

    def explain(self, ctx: PolicyContext) -> ConduitChoice:
        """Score, amplify and select; runs the scoring pass through `ctx`."""
        cfg = self.config
        k = self.budget_k(ctx)
        weighted = ctx.scores(cfg.score).weighted  # (N,) on the device, never read back
        rows = ctx.visual_rows.to(weighted.device)  # (N_v,)
        s = weighted[rows]  # (N_v,)
        page_of = ctx.page_of_visual  # (N_v,) on the host
        c = page_amplification(s, page_of, ctx.num_pages, cfg.gamma)  # (M,)
        amplified = s * c[page_of.to(c.device)]  # (N_v,)
        if cfg.mass is not None:  # a k the scores decide: read back (not the default)
            k = mass_k(amplified, cfg.mass, k)
        if cfg.per_page:  # the quotas from the page sizes, on the host
            sizes = torch.bincount(page_of, minlength=ctx.num_pages)  # (M,)
            pos = per_page_topk(amplified, page_of, quota_split(sizes, k))
        else:
            pos = topk_positions(amplified, k)
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
            return ConduitPolicy(replace(cfg, gamma=gamma, score=score), self.fixed)
        except ValueError as exc:
            raise InvalidRequestError(str(exc)) from None

    def cost_profile(self, ctx: PolicyContext) -> PolicyCost:
        """The work `__call__` will do (for `conduit_core.cost.cost_model`)."""
        k = self.budget_k(ctx)
        scores = 0 < k < ctx.visual_rows.numel()
        return PolicyCost(scoring=self.config.score if scores else None, k=k)

    def __call__(self, ctx: PolicyContext) -> torch.Tensor:
        """Sequence indices of the visual tokens to refresh. With k = 0 or k = N_v the choice
        does not depend on scores, so no scoring pass is run (nor charged)."""
        k = self.budget_k(ctx)
        if k == 0:
            return torch.zeros(0, dtype=torch.long)
        if k >= ctx.visual_rows.numel():
            return ctx.visual_rows
        return self.explain(ctx).rows


select = ConduitPolicy()
