"""Baseline `raw_attention` (SnapKV style): CONDUIT's score without the value norm,
optionally clustered by 1-D pooling inside each page, then one global top-k.

`RawAttentionPolicy(score=ScoreConfig(), pool_kernel=1, pool="max")`: s_j = mean over layers
and question tokens of agg over heads of A[l,h,q,j]; pool_kernel 1 = no pooling (SnapKV
itself uses an observation window, e.g. ScoreConfig(query_window=32), and a kernel of 5-7).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from conduit_core.passes.scoring import ScoreConfig
from conduit_core.policies.policy_context import PolicyContext, PolicyCost
from conduit_core.policies.selection import topk_positions


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


def pool_within_pages(scores: torch.Tensor, page_of: torch.Tensor, kernel: int,
                      mode: str = "max") -> torch.Tensor:
    """1-D pooling of scores (N_v,) with an odd `kernel`, stride 1, inside each page only
    (SnapKV's clustering step); `mode` is "max" or "avg" (avg over the in-page window)."""
    if kernel < 1 or kernel % 2 == 0:
        raise ValueError(f"pooling kernel must be odd and >= 1, got {kernel}")
    if mode not in ("max", "avg"):
        raise ValueError(f"pooling mode must be 'max' or 'avg', got {mode!r}")
    if kernel == 1:
        return scores.float()
    out = torch.empty_like(scores, dtype=torch.float32)
    pad = kernel // 2
    for m in torch.unique(page_of).tolist():
        pos = torch.nonzero(page_of == m).view(-1)
        x = scores[pos].float().view(1, 1, -1)  # (1, 1, T_m)
        if mode == "max":
            y = F.max_pool1d(F.pad(x, (pad, pad), value=-math.inf), kernel, stride=1)
        else:
            total = F.avg_pool1d(F.pad(x, (pad, pad)), kernel, stride=1) * kernel
            count = F.avg_pool1d(F.pad(torch.ones_like(x), (pad, pad)), kernel, stride=1)
            y = total / (count * kernel)  # mean over the window's in-page tokens
        out[pos] = y.view(-1)
    return out
