"""Optional int8 quantisation of cached keys and values.

Keys are quantised per channel (one scale per layer, head and head-dim channel, over all
tokens), values per token (one scale per layer, head and token, over the head dim), both
symmetric with round-to-nearest. Dequantised error is at most half a step: for every element
`|x - dequant(quant(x))| <= scale / 2` with `scale = amax / 127` over its group, plus the
rounding of the output dtype (bf16 keeps 8 significant bits).
"""

from __future__ import annotations

import torch

QMAX = 127
_MIN_SCALE = 1e-30


def _quantize(x: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    xf = x.float()
    scale = (xf.abs().amax(dim=dim, keepdim=True) / QMAX).clamp_min(_MIN_SCALE)
    q = torch.round(xf / scale).clamp_(-QMAX, QMAX).to(torch.int8)
    return q, scale


def quantize_keys(keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel int8 of `(L, H, T, D)` keys: int8 tensor and float32 scales `(L, H, 1, D)`."""
    return _quantize(keys, dim=2)


def quantize_values(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token int8 of `(L, H, T, D)` values: int8 tensor and float32 scales `(L, H, T, 1)`."""
    return _quantize(values, dim=3)


def dequantize(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Inverse of the quantisers above, cast to `dtype`."""
    return (q.float() * scale).to(dtype)
