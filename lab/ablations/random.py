"""Baseline `random`: k = round(budget * N_v) visual tokens drawn uniformly, seeded.

The draw uses the request's seed (0 when the request has none), so a request is reproducible.
"""

from __future__ import annotations

import torch

from conduit_core.policies.policy_context import PolicyContext


def select(ctx: PolicyContext) -> torch.Tensor:
    """k visual token indices chosen uniformly at random without replacement."""
    rows = ctx.visual_rows  # (N_v,)
    gen = torch.Generator().manual_seed(ctx.seed if ctx.seed is not None else 0)
    pick = torch.randperm(rows.numel(), generator=gen)[:ctx.k]  # (k,)
    return rows[pick.sort().values]
