"""Re-rotation of cached keys to new positions (RoPE composes: R(p + d) = R(d) R(p)).

Public API:
  segment_delta(old_positions, new_positions) -> int
      the shift of a page segment, taken from the position ids (never from token counts);
      raises ConduitCoreError unless every token on every axis moved by the same amount.
  rerotate(adapter, keys, delta) -> keys rotated by `delta` positions, computed in float32
      keys (..., kv_heads, T, head_dim); cos/sin come from the model's own rotary embedding
      with the attention scaling divided out (it is already in the cached keys).
"""

from __future__ import annotations

import torch

from conduit_core.adapters.base import VLMAdapter
from conduit_core.errors import ConduitCoreError


def segment_delta(old_positions: torch.Tensor, new_positions: torch.Tensor) -> int:
    """Shift (new - old) of a segment's positions, both (P, T); must be uniform."""
    diff = new_positions.to(torch.long) - old_positions.to(torch.long).to(new_positions.device)
    delta = int(diff[0, 0])
    if not bool((diff == delta).all()):
        raise ConduitCoreError(
            "page segment positions do not shift uniformly; the page was prefilled under a "
            "different segment layout than it is reused in")
    return delta


def rerotate(adapter: VLMAdapter, keys: torch.Tensor, delta: int) -> torch.Tensor:
    """Rotate RoPE'd keys (..., T, head_dim) by `delta` positions (float32 math)."""
    if delta == 0:
        return keys
    like = torch.zeros(1, dtype=torch.float32, device=keys.device)
    pos = torch.full((adapter.rope_axes, 1, 1), delta, dtype=torch.long, device=keys.device)
    cos, sin = adapter.rotary(like, pos)  # (1, 1, hd) float32
    scale = float(getattr(adapter.language_model.rotary_emb, "attention_scaling", 1.0))
    cos, sin = cos.view(-1) / scale, sin.view(-1) / scale  # (hd,)
    k = keys.float()
    half = k.shape[-1] // 2
    rotated = torch.cat((-k[..., half:], k[..., :half]), dim=-1)
    return (k * cos + rotated * sin).to(keys.dtype)
