"""Baseline `full_prefill`: refresh every visual token (equals a full prefill of the layout,
from the cached layer-0 embeddings; the vision tower is not re-run)."""

from __future__ import annotations

import torch

from conduit_core.policies.policy_context import PolicyContext


def select(ctx: PolicyContext) -> torch.Tensor:
    """All visual token indices."""
    return ctx.visual_rows
