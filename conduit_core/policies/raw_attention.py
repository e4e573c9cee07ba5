"""Baseline `raw_attention` (SnapKV style): CONDUIT's score without the value norm,
optionally clustered by 1-D pooling inside each page, then one global top-k.

`RawAttentionPolicy(score=ScoreConfig(), pool_kernel=1, pool="max")`: s_j = mean over layers
and question tokens of agg over heads of A[l,h,q,j]; pool_kernel 1 = no pooling (SnapKV
itself uses an observation window, e.g. ScoreConfig(query_window=32), and a kernel of 5-7).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from conduit_core.cost.cost_model import PolicyCost
from conduit_core.policies.policy_context import PolicyContext
from conduit_core.policies.scoring import ScoreConfig
from conduit_core.policies.selection import pool_within_pages, topk_positions


@dataclass(frozen=True)
class RawAttentionPolicy:
    """Attention-only scoring; see the module docstring."""

    score: ScoreConfig = field(default_factory=ScoreConfig)
    pool_kernel: int = 1  # odd, >= 1
    pool: str = "max"  # "max" or "avg"

    def __post_init__(self) -> None:
        if self.pool_kernel < 1 or self.pool_kernel % 2 == 0:
            raise ValueError(f"pool_kernel must be odd and >= 1, got {self.pool_kernel}")
        if self.pool not in ("max", "avg"):
            raise ValueError(f"pool must be 'max' or 'avg', got {self.pool!r}")

    def cost_profile(self, ctx: PolicyContext) -> PolicyCost:
        """The work `__call__` will do (for `conduit_core.cost.cost_model`)."""
        scores = 0 < ctx.k < ctx.visual_rows.numel()
        return PolicyCost(scoring=self.score if scores else None, k=ctx.k)

    def __call__(self, ctx: PolicyContext) -> torch.Tensor:
        """The k visual tokens with the highest (pooled) question attention."""
        rows = ctx.visual_rows  # (N_v,)
        if ctx.k == 0 or ctx.k >= rows.numel():  # the choice needs no scores
            return rows[:ctx.k]
        s = ctx.scores(self.score).attention  # (N,)
        s = pool_within_pages(s.cpu()[rows], ctx.page_of_visual, self.pool_kernel, self.pool)
        return rows[topk_positions(s, ctx.k)]


select = RawAttentionPolicy()
