"""Baseline `epic` (EPIC / MPIC-k): the first tokens of every page.

`EpicPolicy(k_per_page=None, split="even")`: with k_per_page set, every page refreshes its
first min(k_per_page, T_m) tokens whatever the budget (MPIC-k as published). With None, the
budget k = `PolicyContext.k` is split over the pages, never more than a page holds, largest
remainder first (`selection.quota_split`), so the policy spends exactly k:
  split="even"   the same share for every page (the registered `epic`)
  split="size"   shares in proportion to page sizes T_m (the lab's `epic_proportional`)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from conduit_core.policies.policy_context import PolicyContext
from conduit_core.policies.selection import first_per_page, quota_split


@dataclass(frozen=True)
class EpicPolicy:
    """First-k-of-every-page refresh; see the module docstring."""

    k_per_page: int | None = None  # >= 0, or None to split the request budget
    split: str = "even"  # "even" or "size"

    def __post_init__(self) -> None:
        if self.k_per_page is not None and self.k_per_page < 0:
            raise ValueError(f"k_per_page must be >= 0, got {self.k_per_page}")
        if self.split not in ("even", "size"):
            raise ValueError(f"split must be 'even' or 'size', got {self.split!r}")

    def __call__(self, ctx: PolicyContext) -> torch.Tensor:
        """The leading tokens of each page."""
        sizes = torch.tensor([s.length for s in ctx.layout.segments], dtype=torch.long)  # (M,)
        if self.k_per_page is None:
            weights = torch.ones_like(sizes) if self.split == "even" else sizes
            counts = quota_split(sizes, ctx.k, weights=weights)
        else:
            counts = sizes.clamp(max=self.k_per_page)
        return ctx.visual_rows[first_per_page(ctx.page_of_visual, counts)]


select = EpicPolicy()
