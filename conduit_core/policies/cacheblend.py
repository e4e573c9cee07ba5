"""Baseline `cacheblend` (CacheBlend): every token through the first layers, then only the
tokens whose K/V deviate most from the cache are carried on.

`CacheBlendPolicy(check_layer=1, ratio=None)`: all N tokens are recomputed through decoder
layers 0..check_layer (0-based, as LMCache's `blend_check_layers=[1]`); their fresh K/V
replace the stale ones at those layers. At the check layer each visual token's deviation
||K_fresh - K_stale||^2 + ||V_fresh - V_stale||^2 (summed over KV heads and dims) ranks
them; the top k = round(ratio * N_v) visual tokens, with all text tokens, are carried through
the remaining layers (the runtime's refresh pass); the others keep stale K/V above the check
layer. ratio None = the request's budget (CacheBlend's own default is 0.15). With
check_layer >= L - 1 every layer is recomputed for every token: a full prefill.

The carried rows resume from the check layer: the check pass's hidden states (every token
after layers 0..check, exact, since every token's K/V there is fresh) go to the runtime as
`ctx.resume`, and the refresh runs the carried rows through layers check + 1 .. L - 1 only.
FLOPs: N rows through check_layer + 1 layers (`ctx.extra_flops`), plus the carried rows
through the rest (the runtime's refresh): time and FLOPs describe the same work.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from conduit_core.model.flops import LMShape, rows_flops
from conduit_core.passes.layer_forward import computed_key_counts, forward_rows
from conduit_core.passes.refresh_pass import Resume
from conduit_core.policies.policy_context import PolicyContext, PolicyCost
from conduit_core.policies.selection import budget_tokens, topk_positions


@dataclass(frozen=True)
class CacheBlendPolicy:
    """KV-deviation selection at a check layer; see the module docstring."""

    check_layer: int = 1  # >= 0
    ratio: float | None = None  # in [0, 1], or None for the request's budget

    def __post_init__(self) -> None:
        if self.check_layer < 0:
            raise ValueError(f"check_layer must be >= 0, got {self.check_layer}")
        if self.ratio is not None and not 0.0 <= self.ratio <= 1.0:
            raise ValueError(f"ratio must be in [0, 1] or None, got {self.ratio}")

    def cost_profile(self, ctx: PolicyContext) -> PolicyCost:
        """The work `__call__` will do (for `conduit_core.cost.cost_model`)."""
        n_v = int(ctx.visual_rows.numel())
        k = ctx.k if self.ratio is None else budget_tokens(self.ratio, n_v)
        return PolicyCost(check_layers=min(self.check_layer, len(ctx.adapter.layers) - 1) + 1,
                          k=k)

    def __call__(self, ctx: PolicyContext) -> torch.Tensor:
        """Run the check pass (writing fresh K/V at layers <= check) and pick the carried
        visual tokens."""
        adapter = ctx.adapter
        layout, cache = ctx.layout, ctx.cache
        check = min(self.check_layer, len(adapter.layers) - 1)
        rows = ctx.visual_rows  # (N_v,)
        k = ctx.k if self.ratio is None else budget_tokens(self.ratio, int(rows.numel()))
        dev_rows = rows.to(cache.keys.device)
        stale_k = cache.keys[check, 0].index_select(1, dev_rows)  # (G, N_v, hd)
        stale_v = cache.values[check, 0].index_select(1, dev_rows)  # (G, N_v, hd)
        everything = torch.arange(layout.n)  # (N,)
        hidden = ctx.embeds.unsqueeze(0)  # (1, N, hidden)
        pos = layout.position_ids.unsqueeze(1)  # (P, 1, N)
        out = forward_rows(adapter, cache, hidden, everything, pos, n_keys=layout.n,
                           plain_causal=True, layers=range(check + 1))  # (1, N, hidden)
        ctx.resume = Resume(layer=check + 1, hidden=out[0])
        dk = (cache.keys[check, 0].index_select(1, dev_rows) - stale_k).float()  # (G, N_v, hd)
        dv = (cache.values[check, 0].index_select(1, dev_rows) - stale_v).float()
        deviation = dk.pow(2).sum(dim=(0, 2)) + dv.pow(2).sum(dim=(0, 2))  # (N_v,)
        chosen = rows[topk_positions(deviation.cpu(), k)]  # (k,)
        counts = computed_key_counts(adapter, everything, layout.n, plain_causal=True)
        ctx.extra_flops += rows_flops(LMShape.from_config(adapter.text_config), everything,
                                      n_layers=check + 1, key_counts=counts)
        return chosen


select = CacheBlendPolicy()
