"""Attention supervision without materialising attention: sdpa everywhere, queries and keys
kept on the layers whose attention is supervised, probabilities formed for the supervised rows.

The eager kernel returns every layer's (B, heads, N, N) probabilities; at page scale (N about
1,500, batch 16) that is most of a training step's time and memory, while the loss reads a few
hundred entries. `Tap` registers an attention function (transformers' `AttentionInterface`)
that runs sdpa and, on the layers asked for, keeps the rotated queries and keys; `log_probs`
then scores each supervised (row, key) pair against that row's causal keys only.

Public API:
  Tap(layers)                     .install(model), .log_probs(layer, targets, head) -> (T,)
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

NAME = "conduit_testbed_tap"
_ACTIVE: list[Tap] = []


def _tapped_sdpa(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                 attention_mask: torch.Tensor | None, **kwargs: Any) -> Any:
    layer = getattr(module, "layer_idx", None)
    for tap in _ACTIVE:
        if layer in tap.layers and getattr(module, "is_causal", False):
            tap.kept[layer] = (query, key, float(kwargs.get("scaling") or module.scaling))
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


AttentionInterface.register(NAME, _tapped_sdpa)


class Tap:
    """Keeps the rotated queries (B, heads, N, D) and keys (B, kv_heads, N, D) of `layers`."""

    def __init__(self, layers: set[int]):
        self.layers = set(layers)
        self.kept: dict[int, tuple[torch.Tensor, torch.Tensor, float]] = {}

    def install(self, model: Any) -> None:
        """Switch `model` to the tapped sdpa kernel and make this tap the active one."""
        model.set_attn_implementation(NAME)
        _ACTIVE[:] = [self]

    def log_probs(self, layer: int, targets: torch.Tensor, head: int = 0) -> torch.Tensor:
        """log P(row attends to key) under head `head` of `layer` for each (batch row, query
        index, key index) of `targets` (T, 3), from the last forward; causal (a key after its
        query has probability 0)."""
        q_all, k_all, scale = self.kept[layer]
        group = q_all.shape[1] // k_all.shape[1]
        out = torch.empty(len(targets), dtype=torch.float32, device=q_all.device)  # (T,)
        for b in targets[:, 0].unique().tolist():
            mine = targets[:, 0] == b  # (T,) this batch row's targets, one key matrix
            i, j = targets[mine, 1], targets[mine, 2]
            q = q_all[b, head, i]  # (t, D)
            keys = k_all[b, head // group]  # (N, D)
            scores = (q @ keys.T).float() * scale  # (t, N)
            later = torch.arange(keys.shape[0], device=keys.device)[None, :] > i[:, None]
            scores = scores.masked_fill(later, float("-inf"))
            out[mine] = scores.log_softmax(-1).gather(1, j[:, None])[:, 0]  # (t,)
        return out
