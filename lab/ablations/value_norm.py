"""Baseline `value_norm`: refresh the k visual tokens with the largest cached value norm
||V[l, g, j]||_2 (mean over layers, agg over heads as in `ScoreConfig`), one global top-k.

The stale value norms are already in the assembled cache, so this baseline needs no scoring
pass and pays no scoring FLOPs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from conduit_core.passes.scoring import ScoreConfig
from conduit_core.policies.policy_context import PolicyContext
from conduit_core.policies.selection import topk_positions


@dataclass(frozen=True)
class ValueNormPolicy:
    """Value-norm-only scoring; `score.query_window` does not apply (no queries)."""

    score: ScoreConfig = field(default_factory=ScoreConfig)

    def __call__(self, ctx: PolicyContext) -> torch.Tensor:
        """The k visual tokens with the largest stale value norms."""
        rows = ctx.visual_rows  # (N_v,)
        values = ctx.cache.values  # (L, 1, G, cap, hd)
        n_layers = values.shape[0]
        layers = range(n_layers)[self.score.layer_slice(n_layers)]
        lo, hi = (int(rows.min()), int(rows.max()) + 1) if rows.numel() else (0, 0)
        total = torch.zeros(hi - lo, dtype=torch.float32, device=values.device)  # (span,)
        for layer in layers:  # one layer's norms at a time, no copy of the values
            norms = torch.linalg.vector_norm(values[layer, 0, :, lo:hi], dim=-1,
                                             dtype=torch.float32)  # (G, span)
            total += norms.mean(dim=0) if self.score.head_agg == "mean" else norms.amax(dim=0)
        score = (total / len(layers)).cpu()[rows - lo]  # (N_v,)
        return rows[topk_positions(score, ctx.k)]  # (k,)


select = ValueNormPolicy()
