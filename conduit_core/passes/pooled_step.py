"""The decode step of the pooled answers as one function of tensors with static shapes, so
that it can be captured once (a CUDA graph) or compiled (`torch.compile`, fullgraph) per
batch size (`conduit_core.passes.step_graphs`).

B sequences occupy slots 0..B-1 of the decode pool (`conduit_core.kv.kv_pool`); each gets one
new token. Everything the step reads that changes from step to step is a device tensor:
the token ids, each row's cache index (where its new K/V go; it attends to keys 0..row) and
its position. No Python value depends on them, so the step runs no host sync and issues the
same kernels every time: a capture replays it, a compiled graph never recompiles for new
values. A row may pad a batch: it writes its K/V at row 0 of its own (free) slot and attends
to that key alone, so it never touches an answer's slot and never makes a NaN.

Attention reads `span` positions of every slot under an additive mask hiding the keys past
each row (masked keys add exact zeros): the step's work depends on `span`, not on how many
positions the pool's answers hold. The captured step passes its bucket's span (static: the
longest answer's keys rounded up to a span bucket, `step_graphs.span_buckets`); the model's
own attention function runs it, and one layer's pool write and attention are shared with
the eager step (`batch_forward.forward_step`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from conduit_core.model.adapters.base import VLMAdapter
from conduit_core.passes.layer_forward import _attention_fn, _attn_impl, logits_of


def _key_mask(rows: torch.Tensor, span: int, dtype: torch.dtype) -> torch.Tensor:
    """Additive mask (B, 1, 1, span): 0 for keys 0..row of each row, the dtype's min after."""
    keys = torch.arange(span, device=rows.device).view(1, 1, 1, span)  # (1, 1, 1, S)
    past = keys > rows.view(-1, 1, 1, 1)  # (B, 1, 1, S)
    return torch.zeros(past.shape, dtype=dtype, device=rows.device).masked_fill(
        past, torch.finfo(dtype).min)


def pool_attention(attn: Any, attend: Callable[..., tuple[torch.Tensor, Any]],
                   q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keys: torch.Tensor,
                   values: torch.Tensor, slots: torch.Tensor, rows: torch.Tensor, span: int,
                   mask: torch.Tensor | None) -> torch.Tensor:
    """One layer's attention of B new tokens over pool slots 0..B-1: k, v (B, kv_heads, 1, hd)
    written into the layer's `keys`/`values` (S_pool, kv_heads, capacity, hd) at (slots[i],
    rows[i]), then q (B, heads, 1, hd) attends through `attend` (the model's attention
    function) over the first `span` positions of each slot under the additive `mask`
    (B, 1, 1, span) or none. Returns (B, 1, heads, hd). Shared by the eager batched step
    (`batch_forward.forward_step`) and the captured one (`pooled_forward`)."""
    b = q.shape[0]
    keys[slots, :, rows] = k[:, :, 0].to(keys.dtype)  # (B, kv_heads, hd)
    values[slots, :, rows] = v[:, :, 0].to(values.dtype)
    out, _ = attend(attn, q, keys[:b, :, :span], values[:b, :, :span], mask, dropout=0.0,
                    scaling=attn.scaling, is_causal=False)  # (B, 1, heads, hd)
    return out


@torch.no_grad()
def pooled_forward(adapter: VLMAdapter, keys: torch.Tensor, values: torch.Tensor,
                   token_ids: torch.Tensor, rows: torch.Tensor, positions: torch.Tensor,
                   span: int) -> torch.Tensor:
    """One new token (`token_ids` (B,)) for each of slots 0..B-1 at cache index `rows` (B,)
    and position `positions` (B,) (every RoPE axis: decode positions are text positions),
    through every layer; returns logits (B, vocab) float32 (see the module docstring)."""
    impl = _attn_impl(adapter)
    b = token_ids.shape[0]
    hidden = adapter.embed_tokens(token_ids.view(b, 1))  # (B, 1, hidden)
    pos = positions.view(1, b, 1).expand(adapter.rope_axes, b, 1)  # (P, B, 1)
    cos, sin = adapter.rotary(hidden, pos)  # (B, 1, hd) each
    slots = torch.arange(b, device=hidden.device)  # (B,)
    mask = _key_mask(rows, span, hidden.dtype)  # (B, 1, 1, S)
    for li, layer in enumerate(adapter.layers):
        attn = layer.self_attn
        residual = hidden
        h = layer.input_layernorm(hidden)  # (B, 1, hidden)
        q, k, v = adapter.qkv(attn, h)  # (B, heads|kv_heads, 1, hd)
        q = adapter.apply_rotary(q, cos, sin)
        k = adapter.apply_rotary(k, cos, sin)
        out = pool_attention(attn, _attention_fn(attn, impl), q, k, v, keys[li], values[li],
                             slots, rows, span, mask)  # (B, 1, heads, hd)
        hidden = residual + attn.o_proj(out.reshape(b, 1, -1))  # (B, 1, hidden)
        residual = hidden
        hidden = residual + adapter.mlp(layer.mlp, layer.post_attention_layernorm(hidden))
    return logits_of(adapter, hidden)[:, 0]  # (B, vocab)
