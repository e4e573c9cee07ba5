"""Baseline `prefix_reuse` (vLLM / SGLang prefix caching): only an identical leading run of
the prompt is reused; every visual token after it is recomputed. Budget-independent.

A page's cache was computed for its canonical context `[page opening | segment]`. The
assembled prompt starts with that exact run only when its first page segment sits right
after the template opening with nothing (no prefix, no label) before it; then that page is
reused and every later page recomputed. Otherwise nothing visual is reused. (Prefix caches
key image tokens by image content, so another page's identical placeholder ids never match.)
"""

from __future__ import annotations

import torch

from conduit_core.policies.policy_context import PolicyContext


def reused_visual_rows(ctx: PolicyContext) -> torch.Tensor:
    """Sequence indices of the visual tokens inside the identical leading run."""
    opening = torch.tensor(ctx.adapter.page_opening_ids(), dtype=torch.long)  # (O,)
    segments = ctx.layout.segments
    ids = ctx.layout.token_ids
    if (segments and segments[0].start == opening.numel()
            and torch.equal(ids[:opening.numel()], opening)):
        return torch.arange(segments[0].start, segments[0].stop)
    return torch.zeros(0, dtype=torch.long)


def select(ctx: PolicyContext) -> torch.Tensor:
    """Every visual token outside the identical leading run."""
    rows = ctx.visual_rows  # (N_v,)
    return rows[~torch.isin(rows, reused_visual_rows(ctx))]
