"""Blocked causal attention of a row subset over a KV cache (the sdpa fast path).

A subset of rows (sequence indices) attends over the cache with the exact causal rule "row r
sees keys 0..r". One sdpa call with an (R, N) mask makes every row read all N keys (no
kernel skips masked blocks given an arbitrary mask), and transformers' GQA handling copies
K/V to every query head. Here instead:
  * rows (ascending) are split into blocks of at most `ROW_CHUNK` rows that span at most
    `ROW_SPAN` sequence positions; a block reads only the keys up to its largest row, so each
    row reads its own key count plus at most `ROW_SPAN` more, instead of N (without the span
    limit, 64 sparse refreshed rows spread over a long prompt all read up to the last one);
  * GQA is folded into the rows: the query heads that share a KV head are stacked along the
    row axis, q (B, G, rep * c, hd) against K/V (B, G, n, hd), so K/V are never repeated;
  * the block masks (additive float, (1, 1, rep * c, n)) are built once per forward and
    shared by all layers.
The result equals `F.scaled_dot_product_attention` over the full mask up to float rounding
(the masked keys contribute exact zeros either way).

The block shape is chosen per device (`block_shape`): on the CPU, blocks of 64 rows spanning
at most 256 positions keep the wasted keys and the masks small; on an accelerator, where a
call costs a launch and a few microseconds whatever its size, blocks of up to 1,024 rows
spanning up to 8,192 positions make a refresh one or a few masked calls per layer (each row
then reads up to its block's last row; `layer_forward.computed_key_counts` charges that).

Public API:
  ROW_CHUNK = 64;  ROW_SPAN = 256          the CPU block shape
  BLOCK_SHAPES = {"cpu": (64, 256)};  DEFAULT_BLOCK_SHAPE = (1024, 8192)  (rows, span)
  block_shape(device) -> (chunk, span)
  RowBlock(start, stop, n_keys, mask)
  block_bounds(rows, n_keys, chunk=ROW_CHUNK, span=ROW_SPAN) -> list[(start, stop, n_keys)]
  row_blocks(rows, n_keys, dtype, rep, chunk=ROW_CHUNK, device=None, span=ROW_SPAN)
      -> list[RowBlock]
  blocked_attention(q, keys, values, blocks, scaling) -> (B, R, heads, hd)
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass

import torch
import torch.nn.functional as F

ROW_CHUNK = 64
ROW_SPAN = 256
BLOCK_SHAPES = {"cpu": (ROW_CHUNK, ROW_SPAN)}  # (rows per block, positions spanned) per device
DEFAULT_BLOCK_SHAPE = (1024, 8192)  # accelerators: few launches, a bounded mask per block


def block_shape(device: torch.device | str) -> tuple[int, int]:
    """(rows per block, positions a block may span) for attention on `device`."""
    return BLOCK_SHAPES.get(torch.device(device).type, DEFAULT_BLOCK_SHAPE)


@dataclass(frozen=True)
class RowBlock:
    """Rows [start, stop) of the subset, which see keys [0, n_keys) under `mask`."""

    start: int
    stop: int
    n_keys: int
    mask: torch.Tensor | None  # (1, 1, rep * (stop - start), n_keys) additive; None: all


def causal_row_mask(rows: torch.Tensor, n_keys: int, dtype: torch.dtype) -> torch.Tensor:
    """Additive mask (1, 1, R, n_keys): 0 where key index <= row index, else dtype min."""
    keys = torch.arange(n_keys, device=rows.device)  # (n_keys,)
    allowed = keys.view(1, -1) <= rows.view(-1, 1)  # (R, n_keys)
    mask = torch.zeros(allowed.shape, dtype=dtype, device=rows.device)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask.view(1, 1, *allowed.shape)  # (1, 1, R, n_keys)


def block_bounds(rows: torch.Tensor, n_keys: int, chunk: int = ROW_CHUNK,
                 span: int = ROW_SPAN) -> list[tuple[int, int, int]]:
    """Blocks of consecutive entries of `rows` (R,) on the host: (start, stop, keys read),
    at most `chunk` entries and, for ascending rows, at most `span` positions apart."""
    if chunk < 1 or span < 0:
        raise ValueError("chunk must be >= 1 and span >= 0")
    host = rows.cpu().tolist()
    if host == sorted(host):  # the common case: one bisection per block, not a step per row
        return _ascending_bounds(host, n_keys, chunk, span)
    out = []
    start = 0
    while start < len(host):
        stop, low, high = start + 1, host[start], host[start]
        while stop < len(host) and stop - start < chunk:
            nxt = host[stop]
            if max(high, nxt) - min(low, nxt) > span:
                break
            low, high = min(low, nxt), max(high, nxt)
            stop += 1
        out.append((start, stop, min(high + 1, n_keys)))
        start = stop
    return out


def _ascending_bounds(host: list[int], n_keys: int, chunk: int, span: int
                      ) -> list[tuple[int, int, int]]:
    """`block_bounds` of ascending rows: a block ends at `chunk` entries or before the first
    row more than `span` positions after its first one."""
    out = []
    start = 0
    while start < len(host):
        stop = min(start + chunk, bisect_right(host, host[start] + span, lo=start))
        out.append((start, stop, min(host[stop - 1] + 1, n_keys)))
        start = stop
    return out


def row_blocks(rows: torch.Tensor, n_keys: int, dtype: torch.dtype, rep: int,
               chunk: int = ROW_CHUNK, device: torch.device | None = None,
               span: int = ROW_SPAN) -> list[RowBlock]:
    """`block_bounds` blocks of `rows` (R,), each with its key range and its additive mask
    repeated for the `rep` query heads of a KV head, built on `device` (default: the rows'
    device; key ranges are read on the CPU, no device sync)."""
    device = rows.device if device is None else device
    host = rows.cpu()
    out = []
    for start, stop, limit in block_bounds(host, n_keys, chunk, span):
        part = host[start:stop]  # (c,)
        mask: torch.Tensor | None = None
        if int(part.min()) + 1 < limit:  # some row cannot see every key of the block
            mask = causal_row_mask(part.to(device), limit, dtype).repeat(1, 1, rep, 1)
            # (1, 1, rep*c, limit): row order matches the GQA fold in blocked_attention
        out.append(RowBlock(start, stop, limit, mask))
    return out


def blocked_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                      blocks: list[RowBlock], scaling: float) -> torch.Tensor:
    """Attention of q (B, H, R, hd) over keys/values (B, G, N, hd) by `blocks`; returns
    (B, R, H, hd) like transformers' attention functions."""
    b, heads, rows, hd = q.shape
    groups = keys.shape[1]
    rep = heads // groups
    out = q.new_empty(b, rows, heads, hd)  # (B, R, H, hd), contiguous: callers view it
    for blk in blocks:
        c = blk.stop - blk.start
        qq = q[:, :, blk.start:blk.stop].reshape(b, groups, rep * c, hd)  # (B, G, rep*c, hd)
        o = F.scaled_dot_product_attention(
            qq, keys[:, :, :blk.n_keys], values[:, :, :blk.n_keys], attn_mask=blk.mask,
            scale=scaling)  # (B, G, rep*c, hd)
        out[:, blk.start:blk.stop] = o.reshape(b, heads, c, hd).transpose(1, 2)  # CUDA kernels
        # may return o non-contiguous: reshape copies only then
    return out
