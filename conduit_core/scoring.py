"""Token scores from the scoring pass (DESIGN.md section 2, "Scoring pass"), and the knobs.

The scoring pass (`conduit_core.stale_pass`) yields, per layer l, the question rows' attention
probabilities over all keys `probs[l, h, q, j]` (softmax over all keys, query head h) and the
cached value norms `value_norms[l, g, j] = ||V[l, g, j]||_2` (pre-o_proj values, KV head g).
Query head h reads KV head g(h) = h // (H / G). CONDUIT's score is

    s_j = mean over layers, question tokens q of  agg over heads h of  A[l,h,q,j] ||V[l,g(h),j]||

with agg = mean by default. The raw-attention (SnapKV) and value-norm-only baselines drop one
factor of the product.

Public API:
  ScoreConfig(layers="all", query_window=None, head_agg="mean")   knobs, validated
  token_scores(probs, value_norms, config, *, attention=True, value_norm=True) -> (N,)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

HeadAgg = Literal["mean", "max"]


@dataclass(frozen=True)
class ScoreConfig:
    """How the per-layer scoring statistics are reduced to one score per token.

    layers:        "all", or a half-open range (start, stop) of decoder layer indices (negative
                   indices count from the end, Python style); at least one layer must remain.
    query_window:  None = every question token; w >= 1 = only the last w question tokens
                   (the SnapKV observation window).
    head_agg:      "mean" or "max" over query heads.
    """

    layers: str | tuple[int, int] = "all"
    query_window: int | None = None
    head_agg: HeadAgg = "mean"

    def __post_init__(self) -> None:
        if isinstance(self.layers, str):
            if self.layers != "all":
                raise ValueError(f"layers must be 'all' or (start, stop), got {self.layers!r}")
        elif len(self.layers) != 2:
            raise ValueError(f"layers range must be (start, stop), got {self.layers!r}")
        if self.query_window is not None and self.query_window < 1:
            raise ValueError(f"query_window must be >= 1 or None, got {self.query_window}")
        if self.head_agg not in ("mean", "max"):
            raise ValueError(f"head_agg must be 'mean' or 'max', got {self.head_agg!r}")

    def layer_slice(self, n_layers: int) -> slice:
        """The selected layers as a slice of [0, n_layers); raises if it is empty."""
        sl = slice(None) if self.layers == "all" else slice(*self.layers)
        if len(range(n_layers)[sl]) == 0:
            raise ValueError(f"layers {self.layers!r} selects no layer of {n_layers}")
        return sl


def token_scores(
    probs: torch.Tensor,
    value_norms: torch.Tensor,
    config: ScoreConfig,
    *,
    attention: bool = True,
    value_norm: bool = True,
) -> torch.Tensor:
    """Score every key token: (N,) float32.

    probs (L, H, Q, N) question-row attention probabilities; value_norms (L, G, N).
    `attention=False` scores by value norm alone, `value_norm=False` by attention alone.
    """
    n_layers, heads, n_q, _ = probs.shape
    kv_heads = value_norms.shape[1]
    sl = config.layer_slice(n_layers)
    p = probs[sl].float()  # (L', H, Q, N)
    if config.query_window is not None:
        p = p[:, :, max(0, n_q - config.query_window):]  # (L', H, w, N)
    if not attention:
        p = torch.ones_like(p[:, :, :1])  # (L', H, 1, N): the norm alone
    if value_norm:
        vn = value_norms[sl].float().repeat_interleave(heads // kv_heads, dim=1)  # (L', H, N)
        p = p * vn.unsqueeze(2)  # (L', H, Q, N)
    per_head = p.mean(dim=1) if config.head_agg == "mean" else p.amax(dim=1)  # (L', Q, N)
    return per_head.mean(dim=(0, 1))  # (N,)
