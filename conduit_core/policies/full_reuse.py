"""Baseline `full_reuse` (budget 0): refresh no visual token; only text is computed fresh."""

from __future__ import annotations

import torch

from conduit_core.policies.policy_context import PolicyContext


def select(ctx: PolicyContext) -> torch.Tensor:
    """No visual token indices."""
    return torch.zeros(0, dtype=torch.long)
