"""Re-rotation of cached keys to new positions (RoPE composes: R(p + d) = R(d) R(p)).

The shift's angles d * inv_freq are formed in float64 from the model's own rotary
frequencies (`rotary_emb.inv_freq`, after any linear/llama3/yarn remapping; the adapter
refuses length-dependent RoPE types): in float32, d * inv_freq loses about d * 6e-8 radians,
0.6% of a key at a shift of 100,000 positions. Under M-RoPE the shift is the same on all
three axes, so every frequency turns by d * inv_freq whatever its section. The rotation
itself is float32 math, one decoder layer at a time, written straight into the destination
(the assembled cache): one layer's float32 temporaries, not the whole page's.

Public API:
  segment_delta(old_positions, new_positions) -> int
      the shift of a page segment, taken from the position ids (never from token counts);
      raises ConduitCoreError unless every token on every axis moved by the same amount.
  shift_cos_sin(adapter, delta, device) -> (cos, sin) (head_dim,) float32, unit scale
  rerotate(adapter, keys, delta, out=None) -> keys rotated by `delta` positions
      keys (L, kv_heads, T, head_dim) (rotated layer by layer) or any (..., T, head_dim);
      `out` (same shape, any float dtype, any strides) receives the result when given.
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


def shift_cos_sin(adapter: VLMAdapter, delta: int,
                  device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin (head_dim,) float32 of a shift by `delta` positions, angles in float64,
    without the rotary embedding's attention scaling (it is already in the cached keys)."""
    inv_freq = adapter.language_model.rotary_emb.inv_freq.to(device, torch.float64)  # (hd/2,)
    angles = delta * inv_freq
    emb = torch.cat((angles, angles))  # (hd,) the rotate-half layout
    return emb.cos().float(), emb.sin().float()


def rerotate(adapter: VLMAdapter, keys: torch.Tensor, delta: int,
             out: torch.Tensor | None = None) -> torch.Tensor:
    """Rotate RoPE'd keys (..., T, head_dim) by `delta` positions (float32 math)."""
    if out is None:
        out = torch.empty_like(keys)
    if delta == 0:
        return out.copy_(keys)
    cos, sin = shift_cos_sin(adapter, delta, keys.device)  # (hd,) each
    half = keys.shape[-1] // 2
    pairs = zip(keys, out, strict=True) if keys.dim() == 4 else iter([(keys, out)])
    for src, dst in pairs:  # (kv, T, hd): one decoder layer at a time
        k = src.float()  # (..., T, hd)
        rotated = k * cos  # (..., T, hd)
        rotated[..., :half].addcmul_(k[..., half:], sin[:half], value=-1.0)
        rotated[..., half:].addcmul_(k[..., :half], sin[half:])
        dst.copy_(rotated)
    return out
