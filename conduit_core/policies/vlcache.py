"""Baseline `vlcache` (VLCache style): the first floor(budget * T_m) tokens of every page m.

Proportional to each page's size and rounded down per page, so the total can fall a few
tokens short of round(budget * N_v).
"""

from __future__ import annotations

import math

import torch

from conduit_core.policy_context import PolicyContext
from conduit_core.selection import first_per_page


def select(ctx: PolicyContext) -> torch.Tensor:
    """The leading floor(budget * T_m) visual tokens of each page."""
    counts = torch.tensor([math.floor(ctx.budget * s.length) for s in ctx.layout.segments],
                          dtype=torch.long)  # (M,)
    return ctx.visual_rows[first_per_page(ctx.page_of_visual, counts)]
