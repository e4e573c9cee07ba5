"""What a refresh policy sees: the seam between the runtime and `conduit_core/policies/`.

A policy is a function `(ctx: PolicyContext) -> torch.Tensor` returning the sequence indices
of the visual (page segment) tokens to refresh; the runtime then recomputes those plus all
text tokens. Budget k = round(budget * N_v).

Public API:
  PolicyContext(layout, budget, seed, scorer, cache, embeds, adapter)
    .k, .visual_rows, .page_of_visual, .num_pages
    .scores() -> StaleScores      runs the scoring pass once (lazily) and counts its FLOPs
    .extra_flops                     FLOPs spent by scoring (added to the answer's accounting)
  RefreshPolicy = Callable[[PolicyContext], torch.Tensor]
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from conduit_core.adapters.base import VLMAdapter
from conduit_core.kv_cache import KVCache
from conduit_core.layout import Layout
from conduit_core.stale_pass import StaleScores


@dataclass
class PolicyContext:
    """Inputs of a refresh decision for one assembled request."""

    layout: Layout
    budget: float
    seed: int | None
    scorer: Callable[[], tuple[StaleScores, float]]  # runs the scoring pass -> (result, flops)
    cache: KVCache  # the assembled (stale, re-rotated) cache; policies only read it, except
    # cacheblend, which writes every token's fresh K/V at its first layers (its method)
    embeds: torch.Tensor  # (N, hidden) layer-0 embeddings of the layout
    adapter: VLMAdapter  # the model, for policies that run layers themselves (cacheblend)
    extra_flops: float = 0.0
    _scores: StaleScores | None = field(default=None, repr=False)

    @property
    def visual_rows(self) -> torch.Tensor:
        """Sequence indices of all page segment tokens (N_v,)."""
        return self.layout.visual_rows()

    @property
    def page_of_visual(self) -> torch.Tensor:
        """Page number of each visual token, aligned with `visual_rows` (N_v,)."""
        return torch.cat([torch.full((s.length,), s.page, dtype=torch.long)
                          for s in self.layout.segments]) if self.layout.segments \
            else torch.zeros(0, dtype=torch.long)

    @property
    def num_pages(self) -> int:
        """Pages in the layout."""
        return len(self.layout.segments)

    @property
    def k(self) -> int:
        """Refresh budget in tokens: round(budget * N_v), clamped to [0, N_v]."""
        n_v = int(self.visual_rows.numel())
        return max(0, min(n_v, round(self.budget * n_v)))

    def scores(self) -> StaleScores:
        """The scoring pass result (computed on first call; its FLOPs are counted)."""
        if self._scores is None:
            self._scores, flops = self.scorer()
            self.extra_flops += flops
        return self._scores


RefreshPolicy = Callable[[PolicyContext], torch.Tensor]
