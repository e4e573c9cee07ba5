"""One decode step of several sequences in one forward, each over its own KV.

Every active answer's keys and values are either a slot of one tier of the runtime's
`DecodePool` (the answers being generated, side by side in one pair of tensors) or its own
`KVCache` of batch one (an answer the pool could not hold; a slot of another tier reads the
same way, its view standing for its cache). A decode step gives each sequence one new token:
their layer-0 embeddings are stacked into one batch, and every layer's norms, q/k/v
projections, rotary embedding, output projection and MLP run batched over the rows.

Attention, with the model's own attention function as `layer_forward.forward_rows` calls it:
  * pooled rows (the step holds every occupied slot, 0..P-1): one scatter writes their K/V at
    each slot's own index, and one call attends over the pool's view, as far as the longest
    row's key count, under an additive mask that hides each slot's keys past its own (none
    when all have as many keys); masked keys add exact zeros, so the result is each
    sequence's own attention up to float rounding;
  * any other row (its own cache, or a step that leaves an occupied slot out): its K/V
    written at its own cache index and one call over its cache's first `n_keys` positions
    (a view, never a copy); the last row sees every key, so no mask (an all-zero additive
    mask under eager).
Rows run in the order pooled-by-slot, then the others; the logits come back in the caller's
order.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from conduit_core.kv.kv_cache import KVCache
from conduit_core.kv.kv_pool import SlotTier
from conduit_core.model.adapters.base import VLMAdapter
from conduit_core.passes.layer_forward import _attention_fn, _attn_impl, logits_of
from conduit_core.passes.pooled_step import pool_attention
from conduit_core.passes.row_attention import causal_row_mask


@dataclass(frozen=True)
class StepRow:
    """One sequence's new token in a batched decode step."""

    cache: KVCache  # (L, 1, kv_heads, capacity, hd): its own cache or its pool slot's view
    row: torch.Tensor  # (1,) int64 on the device: the cache index the token's K/V go to
    position: torch.Tensor  # (P, 1) int64 on the device: the token's position ids
    n_keys: int  # keys the token attends to: its cache index + 1
    slot: int | None = None  # its decode-pool slot, if it has one
    tier: int = 0  # the pool's tier that slot lies in (`kv_pool.SlotTier`)
    position_id: int = 0  # `position` as a host int (decode positions: equal on every axis)


def _pooled_count(rows: list[StepRow], pool: SlotTier | None) -> int:
    """P when rows[:P] are slots 0..P-1 of `pool` and P is all of its slots, else 0."""
    if pool is None or pool.size == 0 or len(rows) < pool.size:
        return 0
    p = pool.size
    return p if all(r.slot == i for i, r in enumerate(rows[:p])) else 0


def _pool_mask(n_keys: list[int], dtype: torch.dtype, device: torch.device
               ) -> torch.Tensor | None:
    """Additive mask (P, 1, 1, max n) hiding each row's keys past its own; None if all equal."""
    n = max(n_keys)
    if min(n_keys) == n:
        return None
    counts = torch.tensor(n_keys, device=device).view(-1, 1, 1, 1)  # (P, 1, 1, 1)
    past = torch.arange(n, device=device).view(1, 1, 1, -1) >= counts  # (P, 1, 1, n)
    mask = torch.zeros(past.shape, dtype=dtype, device=device)
    return mask.masked_fill_(past, torch.finfo(dtype).min)


@torch.no_grad()
def forward_step(adapter: VLMAdapter, rows: list[StepRow], token_ids: torch.Tensor,
                 pool: SlotTier | None = None) -> torch.Tensor:
    """Run one new token per sequence (`token_ids` (B,), on the device) through every layer,
    writing each token's K/V into its sequence's cache or slot; returns logits (B, vocab)."""
    impl = _attn_impl(adapter)
    b = len(rows)
    order = sorted(range(b), key=lambda i: (rows[i].slot is None, rows[i].slot or 0))
    permuted = order != list(range(b))
    if permuted:
        rows = [rows[i] for i in order]
        token_ids = token_ids[torch.tensor(order, device=token_ids.device)]
    p = _pooled_count(rows, pool)
    hidden = adapter.embed_tokens(token_ids.view(b, 1))  # (B, 1, hidden)
    pos = torch.stack([r.position for r in rows], dim=1)  # (P, B, 1)
    cos, sin = adapter.rotary(hidden, pos)  # (B, 1, hd) each
    n_keys = [r.n_keys for r in rows]
    own = range(p, b)
    masks: dict[int, torch.Tensor | None] = {
        i: causal_row_mask(rows[i].row, n_keys[i], hidden.dtype) if impl == "eager" else None
        for i in own}  # (1, 1, 1, n_i)
    if p:
        assert pool is not None and pool.keys is not None and pool.values is not None
        slots = torch.arange(p, device=hidden.device)  # (P,)
        slot_rows = torch.cat([r.row for r in rows[:p]])  # (P,)
        n_pool = max(n_keys[:p])
        pool_mask = _pool_mask(n_keys[:p], hidden.dtype, hidden.device)  # (P, 1, 1, n)
        if pool_mask is None and impl == "eager":
            pool_mask = torch.zeros((p, 1, 1, n_pool), dtype=hidden.dtype, device=hidden.device)
    for li, layer in enumerate(adapter.layers):
        attn = layer.self_attn
        residual = hidden
        h = layer.input_layernorm(hidden)  # (B, 1, hidden)
        q, k, v = adapter.qkv(attn, h)  # (B, heads|kv_heads, 1, hd)
        q = adapter.apply_rotary(q, cos, sin)
        k = adapter.apply_rotary(k, cos, sin)
        attend = _attention_fn(attn, impl)
        outs = []
        if p:
            assert pool is not None and pool.keys is not None and pool.values is not None
            outs.append(pool_attention(attn, attend, q[:p], k[:p], v[:p], pool.keys[li],
                                       pool.values[li], slots, slot_rows, n_pool,
                                       pool_mask))  # (P, 1, heads, hd)
        for i in own:
            r = rows[i]
            r.cache.write(li, r.row, k[i:i + 1], v[i:i + 1])
            keys, values = r.cache.view(li, n_keys[i])  # (1, kv_heads, n_i, hd)
            out, _ = attend(attn, q[i:i + 1], keys, values, masks[i], dropout=0.0,
                            scaling=attn.scaling, is_causal=False)  # (1, 1, heads, hd)
            outs.append(out)
        att = torch.cat(outs).reshape(b, 1, -1)  # (B, 1, heads * hd)
        hidden = residual + attn.o_proj(att)
        residual = hidden
        hidden = residual + adapter.mlp(layer.mlp, layer.post_attention_layernorm(hidden))
    logits = logits_of(adapter, hidden)[:, 0]  # (B, vocab)
    if permuted:
        inverse = torch.empty(b, dtype=torch.long)
        inverse[torch.tensor(order)] = torch.arange(b)
        logits = logits[inverse.to(logits.device)]
    return logits
