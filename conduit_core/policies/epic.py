"""Baseline `epic` (EPIC / MPIC-k): the first k tokens of every page are refreshed.

`EpicPolicy(k_per_page=None)`: with k_per_page set, every page refreshes its first
min(k_per_page, T_m) tokens whatever the budget (MPIC-k as published); with None (the
registered default) the budget round(budget * N_v) is split evenly over the pages (remainder
to the earlier pages, never more than a page holds), so EPIC spends exactly the budget.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from conduit_core.policy_context import PolicyContext
from conduit_core.selection import first_per_page, quota_split


@dataclass(frozen=True)
class EpicPolicy:
    """First-k-of-every-page refresh; see the module docstring."""

    k_per_page: int | None = None  # >= 0, or None to split the request budget evenly

    def __post_init__(self) -> None:
        if self.k_per_page is not None and self.k_per_page < 0:
            raise ValueError(f"k_per_page must be >= 0, got {self.k_per_page}")

    def __call__(self, ctx: PolicyContext) -> torch.Tensor:
        """The leading tokens of each page."""
        sizes = torch.tensor([s.length for s in ctx.layout.segments], dtype=torch.long)  # (M,)
        if self.k_per_page is None:
            counts = quota_split(sizes, ctx.k, weights=torch.ones_like(sizes))
        else:
            counts = sizes.clamp(max=self.k_per_page)
        return ctx.visual_rows[first_per_page(ctx.page_of_visual, counts)]


select = EpicPolicy()
