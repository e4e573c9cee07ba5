"""The scoring ("stale") pass: text rows over the assembled, not yet refreshed cache.

All text tokens run through all layers against the stale, re-rotated page KV (exact causal
mask, writing their own fresh K/V). At each layer the question rows' attention probabilities
over all keys are recorded (softmax over all N keys, per query head; query head h reads KV
head h // (H / G)), with the cache's value norms at that layer.

Public API:
  StaleScores(probs, value_norms, question_rows, text_rows, text_hidden=None)
    probs        (L, H, n_question, N) float32, rows sum to 1 (keys after the row get 0)
    value_norms  (L, G, N) float32, ||V||_2 per cached token and KV head (pre-o_proj values)
    text_hidden  (N_t, hidden) last-layer hidden states of text_rows (the runtime reuses the
                 rows before the first refreshed visual token: they are already exact)
  stale_pass(adapter, cache, embeds, position_ids, text_rows, question_rows, n_keys)
      -> StaleScores
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from conduit_core.adapters.base import VLMAdapter
from conduit_core.kv_cache import KVCache
from conduit_core.layer_forward import forward_rows


@dataclass
class StaleScores:
    """Per-layer question attention and value norms from the stale pass."""

    probs: torch.Tensor  # (L, H, n_question, N) float32
    value_norms: torch.Tensor  # (L, G, N) float32
    question_rows: torch.Tensor  # (n_question,) sequence indices
    text_rows: torch.Tensor  # (N_t,) sequence indices that were computed
    text_hidden: torch.Tensor | None = None  # (N_t, hidden) their last-layer hidden states


def stale_pass(
    adapter: VLMAdapter,
    cache: KVCache,
    embeds: torch.Tensor,
    position_ids: torch.Tensor,
    text_rows: torch.Tensor,
    question_rows: torch.Tensor,
    n_keys: int,
) -> StaleScores:
    """Run `text_rows` over the cache (embeds (N, hidden), position_ids (P, N)) and record
    the attention of `question_rows` (a subset of text_rows) at every layer."""
    device = adapter.device
    text_rows = text_rows.to(device)
    question_rows = question_rows.to(device)
    pick = torch.searchsorted(text_rows, question_rows)  # (n_q,) places inside text_rows
    cfg = adapter.text_config
    n_layers, heads, kv_heads = len(adapter.layers), cfg.num_attention_heads, cache.keys.shape[2]
    probs = torch.zeros(n_layers, heads, question_rows.numel(), n_keys,
                        dtype=torch.float32, device=device)  # (L, H, n_q, N)
    value_norms = torch.zeros(n_layers, kv_heads, n_keys, dtype=torch.float32,
                              device=device)  # (L, G, N)
    n_q, rep = question_rows.numel(), heads // kv_heads
    # keys before the earliest question row are visible to every question row: only the
    # columns from there on need the causal mask
    first = int(question_rows.min()) if n_q else n_keys
    hidden_keys = (torch.arange(first, n_keys, device=device).view(1, -1)
                   > question_rows.view(-1, 1))  # (n_q, N - first)

    def observe(layer: int, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> None:
        scaling = adapter.layers[layer].self_attn.scaling
        qq = q[0, :, pick].float().reshape(kv_heads, rep * n_q, -1)  # (G, rep*n_q, hd)
        k = keys[0].float()  # (G, N, hd): query head h reads KV head h // rep
        scores = torch.matmul(qq, k.transpose(1, 2)).view(heads, n_q, n_keys)  # (H, n_q, N)
        scores.mul_(scaling)
        scores[:, :, first:].masked_fill_(hidden_keys, float("-inf"))
        torch.softmax(scores, dim=-1, out=probs[layer])
        value_norms[layer] = values[0].float().norm(dim=-1)  # (G, N)

    hidden = embeds[text_rows].unsqueeze(0)  # (1, N_t, hidden)
    pos = position_ids[:, text_rows.cpu()].unsqueeze(1)  # (P, 1, N_t)
    out = forward_rows(adapter, cache, hidden, text_rows, pos, n_keys=n_keys,
                       observer=observe)  # (1, N_t, hidden)
    return StaleScores(probs=probs, value_norms=value_norms, question_rows=question_rows,
                       text_rows=text_rows, text_hidden=out[0])
