"""Re-rotation of cached keys to new positions (RoPE composes: R(p + d) = R(d) R(p)).

The shift's angles d * inv_freq are formed in float64 from the model's own rotary
frequencies (`rotary_emb.inv_freq`, after any linear/llama3/yarn remapping; the adapter
refuses length-dependent RoPE types): in float32, d * inv_freq loses about d * 6e-8 radians,
0.6% of a key at a shift of 100,000 positions. Under M-RoPE the shift is the same on all
three axes, so every frequency turns by d * inv_freq whatever its section. The rotation
itself is float32 math written straight into the destination (the assembled cache).

Two forms, equal element for element (the same float32 operations on the same values):
`rerotate` turns one page by one shift, one decoder layer at a time (the per-page path);
`rerotate_rows` turns all pages of a question at once, each token by its own page's shift
(a (T, head_dim) table), a few layers per operation: its float32 temporaries are bounded by
`rotate_chunk_elements(device)` elements (a few layers on the CPU, all of them on a GPU for
typical prompts), so a question costs a handful of launches, not about 5 per page and layer.

Public API:
  segment_delta(old_positions, new_positions) -> int
      the shift of a page segment, taken from the position ids (never from token counts);
      raises ConduitCoreError unless every token on every axis moved by the same amount.
  shift_cos_sin(adapter, delta, device) -> (cos, sin) (head_dim,) float32, unit scale
  shift_tables(adapter, deltas, lengths, device) -> (cos, sin) (T, head_dim) float32,
      segment i's `lengths[i]` rows turned by `deltas[i]`
  rerotate(adapter, keys, delta, out=None) -> keys rotated by `delta` positions
      keys (L, kv_heads, T, head_dim) (rotated layer by layer) or any (..., T, head_dim);
      `out` (same shape, any float dtype, any strides) receives the result when given.
  rerotate_rows(keys, cos, sin, out, rows, *, key_scale=None, page_of=None, kv_dtype=None,
                chunk_elements=None) -> None
      keys (L, kv, T, hd) of several segments (or int8 with per-page, per-channel scales
      `key_scale` (L, kv, pages, hd) and `page_of` (T,): dequantised to `kv_dtype` first, as
      `PageKV.dequantized` does) turned by the tables and written to out[:, :, rows]
      (out (L, kv, capacity, hd), rows (T,)).
  ROTATE_CHUNK_ELEMENTS = {"cpu": 2**22}, DEFAULT 2**26;  rotate_chunk_elements(device)
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from conduit_core.adapters.base import VLMAdapter
from conduit_core.errors import ConduitCoreError
from conduit_core.page_kv import dequantize_int8

ROTATE_CHUNK_ELEMENTS = {"cpu": 1 << 22}  # float32 elements of one rotation op, per device
DEFAULT_ROTATE_CHUNK_ELEMENTS = 1 << 26  # accelerators: 256 MiB of float32


def rotate_chunk_elements(device: torch.device) -> int:
    """Float32 elements one batched rotation step may form on `device`."""
    return ROTATE_CHUNK_ELEMENTS.get(torch.device(device).type, DEFAULT_ROTATE_CHUNK_ELEMENTS)


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


def shift_tables(adapter: VLMAdapter, deltas: Sequence[int], lengths: Sequence[int],
                 device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin (T, head_dim) float32: the rows of segment i (`lengths[i]` of them, in
    order) turned by `deltas[i]`; each row equals `shift_cos_sin` of its delta."""
    inv_freq = adapter.language_model.rotary_emb.inv_freq.to(device, torch.float64)  # (hd/2,)
    d = torch.tensor(list(deltas), dtype=torch.float64, device=device)  # (S,)
    angles = d.view(-1, 1) * inv_freq.view(1, -1)  # (S, hd/2)
    emb = torch.cat((angles, angles), dim=-1)  # (S, hd) the rotate-half layout
    reps = torch.tensor(list(lengths), device=device)  # (S,)
    cos = emb.cos().float().repeat_interleave(reps, dim=0)  # (T, hd)
    sin = emb.sin().float().repeat_interleave(reps, dim=0)  # (T, hd)
    return cos, sin


def rerotate_rows(keys: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, out: torch.Tensor,
                  rows: torch.Tensor, *, key_scale: torch.Tensor | None = None,
                  page_of: torch.Tensor | None = None, kv_dtype: torch.dtype | None = None,
                  chunk_elements: int | None = None) -> None:
    """Turn keys (L, kv, T, hd) by per-row tables cos/sin (T, hd) and write them to
    out[:, :, rows] (out (L, kv, capacity, hd)); see the module docstring."""
    n_layers, kv, t, hd = keys.shape
    if t == 0:
        return
    half = hd // 2
    budget = chunk_elements or rotate_chunk_elements(keys.device)
    step = max(1, budget // max(1, kv * t * hd))  # layers per operation
    for lo in range(0, n_layers, step):
        hi = min(n_layers, lo + step)
        if key_scale is not None and page_of is not None and kv_dtype is not None:
            scale = key_scale[lo:hi].index_select(2, page_of)  # (l, kv, T, hd) per-page scales
            k = dequantize_int8(keys[lo:hi], scale, kv_dtype).float()  # (l, kv, T, hd)
        else:
            k = keys[lo:hi].float()  # (l, kv, T, hd)
        rotated = k * cos  # (l, kv, T, hd)
        rotated[..., :half].addcmul_(k[..., half:], sin[:, :half], value=-1.0)
        rotated[..., half:].addcmul_(k[..., :half], sin[:, half:])
        out[lo:hi].index_copy_(2, rows, rotated.to(out.dtype))  # (l, kv, cap, hd)
