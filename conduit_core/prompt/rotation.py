"""Re-rotation of cached keys to new positions (RoPE composes: R(p + d) = R(d) R(p)).

A span's shift is read from its position ids, never from token counts, and every token of a
span must move by the same amount on every axis (`span_deltas` raises ConduitCoreError
otherwise). The shift's angles d * inv_freq are formed in float64 from the model's own rotary
frequencies (`rotary_emb.inv_freq`, after any linear/llama3/yarn remapping; the adapter
refuses length-dependent RoPE types): in float32, d * inv_freq loses about d * 6e-8 radians,
0.6% of a key at a shift of 100,000 positions. Under M-RoPE the shift is the same on all
three axes, so every frequency turns by d * inv_freq whatever its section. The rotation
itself is float32 math written straight into the destination (the assembled cache).

`rerotate_into` turns keys into a destination, each row by its own shift, in steps of at most
`rotate_chunk_elements(device)` float32 elements: on a GPU all pages of a question staged as
one span (`page_loads`) turn in a handful of launches for all layers, not a few per page and
layer; on the CPU a step stays in the core's cache (a few layers of a page; larger steps
stream from memory and are slower). It writes element for element what turning one page by
one shift, one layer at a time, writes (the tests' reference, tests/core/helpers.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from conduit_core.errors import ConduitCoreError
from conduit_core.model.adapters.base import VLMAdapter

# float32 elements of one rotation step, per device. CPU: 2^17 (512 KiB an operand) keeps a
# step in the core's L2 cache (whole-span steps stream from memory and are slower).
# Accelerators: a handful of launches for the whole question.
ROTATE_CHUNK_ELEMENTS = {"cpu": 1 << 17}
DEFAULT_ROTATE_CHUNK_ELEMENTS = 1 << 26  # accelerators: 256 MiB of float32
_NOT_UNIFORM = ("page segment positions do not shift uniformly; the page was prefilled under a "
               "different segment layout than it is reused in")


def rotate_chunk_elements(device: torch.device) -> int:
    """Float32 elements one batched rotation step may form on `device`."""
    return ROTATE_CHUNK_ELEMENTS.get(torch.device(device).type, DEFAULT_ROTATE_CHUNK_ELEMENTS)


def span_deltas(old_positions: torch.Tensor, new_positions: torch.Tensor,
                lengths: Sequence[int]) -> list[int]:
    """Shifts (new - old) of consecutive spans of `lengths` tokens (each at least 1), both
    position tensors (P, sum of lengths) on the host (numpy, no device work). Raises
    ConduitCoreError unless each span moved uniformly."""
    diff = (new_positions.to(torch.long).numpy()
            - old_positions.to(torch.long).numpy())  # (P, T)
    firsts = np.cumsum([0, *lengths[:-1]])  # (S,) each span's first column
    deltas = diff[0, firsts]  # (S,)
    if not bool((diff == np.repeat(deltas, lengths)[None, :]).all()):
        raise ConduitCoreError(_NOT_UNIFORM)
    return [int(d) for d in deltas]


def shift_cos_sin(adapter: VLMAdapter, delta: int,
                  device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin (head_dim,) float32 of a shift by `delta` positions, angles in float64,
    without the rotary embedding's attention scaling (it is already in the cached keys)."""
    inv_freq = adapter.language_model.rotary_emb.inv_freq.to(device, torch.float64)  # (hd/2,)
    angles = delta * inv_freq
    emb = torch.cat((angles, angles))  # (hd,) the rotate-half layout
    return emb.cos().float(), emb.sin().float()


def shift_tables(adapter: VLMAdapter, deltas: Sequence[int], lengths: Sequence[int],
                 device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin (T, head_dim) float32: the rows of segment i (`lengths[i]` of them, in
    order) turned by `deltas[i]`; each row equals `shift_cos_sin` of its delta."""
    inv_freq = adapter.language_model.rotary_emb.inv_freq.to(device, torch.float64)  # (hd/2,)
    d = torch.tensor(list(deltas), dtype=torch.float64, device=device)  # (S,)
    angles = d.view(-1, 1) * inv_freq.view(1, -1)  # (S, hd/2)
    emb = torch.cat((angles, angles), dim=-1)  # (S, hd) the rotate-half layout
    cos, sin = emb.cos().float(), emb.sin().float()  # (S, hd) each
    hd = emb.shape[-1]
    return (torch.cat([c.expand(n, hd) for c, n in zip(cos, lengths, strict=True)]),
            torch.cat([s.expand(n, hd) for s, n in zip(sin, lengths, strict=True)]))  # (T, hd)


def rerotate_into(src: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, dst: torch.Tensor,
                  chunk_elements: int | None = None) -> None:
    """Turn keys src (L, kv, T, hd), row t by cos[t], sin[t] ((T, hd), or (1, hd) for one
    shift), and write them to dst (L, kv, T, hd; any float dtype, any strides). A few layers
    (or, on the CPU, a part of one) per step, as `rotate_chunk_elements` allows."""
    n_layers, kv, t, hd = src.shape
    if t == 0:
        return
    half = hd // 2
    budget = chunk_elements or rotate_chunk_elements(src.device)
    step = max(1, budget // max(1, kv * t * hd))  # layers per step
    parts = 1 if step > 1 else -(-kv * t * hd // budget)  # row blocks of one layer
    rows = -(-t // parts)  # rows per step, the blocks of a layer as even as can be
    one = cos.shape[0] == 1
    sin_lo, sin_hi = sin[:, :half], sin[:, half:]  # (T | 1, hd/2) each
    for lo in range(0, n_layers, step):
        for r0 in range(0, t, rows):
            part = slice(r0, r0 + rows)
            c = cos if one else cos[part]  # (r | 1, hd)
            s_lo, s_hi = (sin_lo, sin_hi) if one else (sin_lo[part], sin_hi[part])
            k = src[lo:lo + step, :, part].float()  # (l, kv, r, hd)
            rotated = k * c  # (l, kv, r, hd)
            rotated[..., :half].addcmul_(k[..., half:], s_lo, value=-1.0)
            rotated[..., half:].addcmul_(k[..., :half], s_hi)
            dst[lo:lo + step, :, part].copy_(rotated)
