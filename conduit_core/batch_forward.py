"""One decode step of several sequences in one forward, each over its own KV cache.

Every active answer owns a `KVCache` of batch one (its own length and capacity). A decode
step gives each sequence one new token: their layer-0 embeddings are stacked into one batch
(B, 1, hidden), and every layer's norms, q/k/v projections, rotary embedding, output
projection and MLP run batched over the B rows. Only attention is per sequence: each new row
writes its key and value at its own cache index and attends over its own cache's first
`n_keys + 1` positions (a view, never a copy), with the model's own attention function
exactly as `layer_forward.forward_rows` calls it for one last row (no mask under sdpa, an
all-zero additive mask under eager). A row that is the last of its sequence sees every key,
so no mask is needed; padding the keys of all sequences to one length with an additive mask
is the GPU alternative (one attention call), left for when a GPU measures it.

Public API:
  StepRow(cache, row, position, n_keys)   one sequence's part of a step: its cache, the cache
                                  index the new token's K/V go to (1,) on the device, its
                                  position ids (P, 1) on the device, and row + 1
  forward_step(adapter, rows: list[StepRow], token_ids (B,)) -> logits (B, vocab) float32
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from conduit_core.adapters.base import VLMAdapter
from conduit_core.kv_cache import KVCache
from conduit_core.layer_forward import _attention_fn, _attn_impl, logits_of
from conduit_core.row_attention import causal_row_mask


@dataclass(frozen=True)
class StepRow:
    """One sequence's new token in a batched decode step."""

    cache: KVCache  # (L, 1, kv_heads, capacity, hd): this sequence's own cache
    row: torch.Tensor  # (1,) int64 on the device: the cache index the token's K/V go to
    position: torch.Tensor  # (P, 1) int64 on the device: the token's position ids
    n_keys: int  # keys the token attends to: its cache index + 1


@torch.no_grad()
def forward_step(adapter: VLMAdapter, rows: list[StepRow],
                 token_ids: torch.Tensor) -> torch.Tensor:
    """Run one new token per sequence (`token_ids` (B,), on the device) through every layer,
    writing each token's K/V into its own sequence's cache; returns logits (B, vocab)."""
    impl = _attn_impl(adapter)
    b = len(rows)
    hidden = adapter.embed_tokens(token_ids.view(b, 1))  # (B, 1, hidden)
    pos = torch.stack([r.position for r in rows], dim=1)  # (P, B, 1)
    cos, sin = adapter.rotary(hidden, pos)  # (B, 1, hd) each
    n_keys = [r.n_keys for r in rows]
    masks: list[torch.Tensor | None] = [
        causal_row_mask(r.row, n, hidden.dtype) if impl == "eager" else None  # (1, 1, 1, n)
        for r, n in zip(rows, n_keys, strict=True)]
    for li, layer in enumerate(adapter.layers):
        attn = layer.self_attn
        residual = hidden
        h = layer.input_layernorm(hidden)  # (B, 1, hidden)
        q, k, v = adapter.qkv(attn, h)  # (B, heads|kv_heads, 1, hd)
        q = adapter.apply_rotary(q, cos, sin)
        k = adapter.apply_rotary(k, cos, sin)
        attend = _attention_fn(attn, impl)
        outs = []
        for i, r in enumerate(rows):
            r.cache.write(li, r.row, k[i:i + 1], v[i:i + 1])
            keys, values = r.cache.view(li, n_keys[i])  # (1, kv_heads, n_i, hd)
            out, _ = attend(attn, q[i:i + 1], keys, values, masks[i], dropout=0.0,
                            scaling=attn.scaling, is_causal=False)  # (1, 1, heads, hd)
            outs.append(out)
        att = torch.cat(outs).reshape(b, 1, -1)  # (B, 1, heads * hd)
        hidden = residual + attn.o_proj(att)
        residual = hidden
        hidden = residual + layer.mlp(layer.post_attention_layernorm(hidden))
    return logits_of(adapter, hidden)[:, 0]  # (B, vocab)
