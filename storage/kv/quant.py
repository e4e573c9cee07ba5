"""Optional int8 quantisation of cached keys and values.

Keys are quantised per channel (one scale per layer, head and head-dim channel, over all
tokens), values per token (one scale per layer, head and token, over the head dim), both
symmetric with round-to-nearest. Dequantised error is at most half a step: for every element
`|x - dequant(quant(x))| <= scale / 2` with `scale = amax / 127` over its group, plus the
rounding of the output dtype (bf16 keeps 8 significant bits).

Int8 tiers return pages in `PageKV`'s int8 form (int8 keys/values plus these scales): the
runtime copies them as they are and dequantises on its device with the same formula
(`conduit_core.page_kv.dequantize_int8`), so no tier dequantises on the host. A page already
in int8 form is stored as it is, never quantised twice.
"""

from __future__ import annotations

import torch

from conduit_core.page_kv import PageKV

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


def int8_parts(page: PageKV) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Int8 keys, key scales, int8 values, value scales of `page`: its own in the int8 form
    (never quantised twice), else quantised now."""
    if page.key_scale is not None and page.value_scale is not None:
        return page.keys, page.key_scale, page.values, page.value_scale
    kq, ks = quantize_keys(page.keys)
    vq, vs = quantize_values(page.values)
    return kq, ks, vq, vs
