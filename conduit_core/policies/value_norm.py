"""Baseline `value_norm`: refresh the k visual tokens with the largest cached value norm
||V[l, g, j]||_2 (mean over layers, agg over heads as in `ScoreConfig`), one global top-k.

The stale value norms are already in the assembled cache, so this baseline needs no scoring
pass and pays no scoring FLOPs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from conduit_core.policy_context import PolicyContext
from conduit_core.scoring import ScoreConfig
from conduit_core.selection import topk_positions


@dataclass(frozen=True)
class ValueNormPolicy:
    """Value-norm-only scoring; `score.query_window` does not apply (no queries)."""

    score: ScoreConfig = field(default_factory=ScoreConfig)

    def __call__(self, ctx: PolicyContext) -> torch.Tensor:
        """The k visual tokens with the largest stale value norms."""
        rows = ctx.visual_rows  # (N_v,)
        values = ctx.cache.values[:, 0].index_select(2, rows.to(ctx.cache.values.device))
        norms = values.float().norm(dim=-1)  # (L, G, N_v)
        norms = norms[self.score.layer_slice(norms.shape[0])]  # (L', G, N_v)
        per_head = norms.mean(dim=1) if self.score.head_agg == "mean" else norms.amax(dim=1)
        return rows[topk_positions(per_head.mean(dim=0).cpu(), ctx.k)]  # (k,)


select = ValueNormPolicy()
