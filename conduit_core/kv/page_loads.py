"""Filling an assembled cache from cached pages, all pages at once.

On an accelerator, every page's tensors, on the host as the stores left them, cross in one
batched copy into one device buffer (`staging.pages_to_device`: no host concatenation, no
host pass over the bytes besides the read), and are joined there into the span of the prompt
from the first page to the last (one `torch.cat` per tensor kind: keys and values at their
places in the span, zeros in the label rows between pages; the embeddings; for int8 pages,
the scales). Int8 pages cross as int8 plus scales and are dequantised there. Then the keys of
all pages turn into the cache in a few operations, each row by its own page's shift
(`rotation.rerotate_into`; the label rows between pages are written too, zeros: like every
text row, they are computed before anything reads them), the values go in with one copy and
the embeddings with one indexed copy. The operations issued do not depend on the number of
pages; what the host computes for them (each page's shift, its rows) is numpy arithmetic on
the layout, done before the copy.

On the devices of `PAGE_BY_PAGE` (the CPU) the pages already are where the cache is, and
memory passes cost more than operations: each page turns straight from its own tensors into its
rows, all layers at once in steps that fit the core's cache (joining the pages first is a
second pass over their bytes, and measured slower: lab/ttft/NOTES.md). Both paths leave in the
page rows exactly the values a page-by-page load (each page turned by its own shift, one layer
at a time) would (tests/core/test_page_loads.py, which also runs the joined path on the CPU).
"""

from __future__ import annotations

import numpy as np
import torch

from conduit_core.kv.kv_cache import KVCache
from conduit_core.kv.staging import pages_to_device
from conduit_core.model.adapters.base import VLMAdapter
from conduit_core.page_kv import PageKV, dequantize_int8
from conduit_core.prompt.layout import Layout
from conduit_core.prompt.rotation import (
    rerotate_into,
    rotate_chunk_elements,
    shift_cos_sin,
    shift_tables,
    span_deltas,
)

# device types whose pages turn in place, page by page (module docstring)
PAGE_BY_PAGE = {"cpu"}


def load_pages(adapter: VLMAdapter, layout: Layout, kvs: list[PageKV], cache: KVCache,
               embeds: torch.Tensor) -> None:
    """Write the pages' re-rotated keys, values and embeddings (N, hidden) into their rows
    of the batch-1 cache (module docstring)."""
    if not kvs:
        return
    if not all(kv.quantized for kv in kvs):  # a mixed question: the float form throughout
        kvs = [kv.dequantized() for kv in kvs]
    rows = np.concatenate([np.arange(s.start, s.stop) for s in layout.segments])  # (T,)
    old = np.concatenate([kv.position_ids.cpu().numpy() for kv in kvs], axis=1)  # (P, T)
    deltas = span_deltas(torch.from_numpy(old), layout.position_ids.cpu()[:, rows],
                         [s.length for s in layout.segments])  # one shift a page
    if adapter.device.type in PAGE_BY_PAGE:
        _load_in_place(adapter, layout, kvs, deltas, cache, embeds)
    else:
        _load_staged(adapter, layout, kvs, deltas, cache, embeds, rows)


def _load_in_place(adapter: VLMAdapter, layout: Layout, kvs: list[PageKV], deltas: list[int],
                   cache: KVCache, embeds: torch.Tensor) -> None:
    """The CPU: each page's own tensors turned and copied straight into its rows."""
    for seg, kv, delta in zip(layout.segments, kvs, deltas, strict=True):
        rows = slice(seg.start, seg.stop)
        keys, values = kv.keys, kv.values  # (L, kv, T, hd)
        if kv.key_scale is not None and kv.value_scale is not None and kv.kv_dtype:
            keys = dequantize_int8(keys, kv.key_scale, kv.kv_dtype)
            values = dequantize_int8(values, kv.value_scale, kv.kv_dtype)
        cos, sin = shift_cos_sin(adapter, delta, keys.device)  # (hd,) each
        rerotate_into(keys, cos.view(1, -1), sin.view(1, -1), cache.keys[:, 0, :, rows])
        cache.values[:, 0, :, rows] = values
        embeds[rows] = kv.embeds  # (T, hidden)


def _load_staged(adapter: VLMAdapter, layout: Layout, kvs: list[PageKV], deltas: list[int],
                 cache: KVCache, embeds: torch.Tensor, rows: np.ndarray) -> None:
    """An accelerator: the pages cross in one batched copy and are joined on the device,
    then a few operations for all pages (`rows` (T,): the page rows of the layout, in
    order)."""
    dev = adapter.device
    first, last = layout.segments[0].start, layout.segments[-1].stop
    n_layers, heads, _, hd = kvs[0].keys.shape
    span = last - first
    kv_dtype = kvs[0].kv_dtype  # int8 pages: the dtype they dequantise to
    keys, values, page_embeds, *scales = _spans(layout, kvs, dev)
    deltas_at, lengths, at = [], [], first
    for seg, delta in zip(layout.segments, deltas, strict=True):
        deltas_at += [0, delta]  # the label rows before the page: any values, not turned
        lengths += [seg.start - at, seg.stop - seg.start]
        at = seg.stop
    cos, sin = shift_tables(adapter, deltas_at, lengths, dev)  # (span, hd) each
    dst_k, dst_v = cache.keys[:, 0, :, first:last], cache.values[:, 0, :, first:last]
    if kv_dtype is None:
        rerotate_into(keys, cos, sin, dst_k)  # (L, kv, span, hd), a few operations
        dst_v.copy_(values)
    else:
        page_of = torch.from_numpy(np.repeat(np.arange(len(kvs)).repeat(2), lengths)).to(
            dev)  # (span,) the page of each row, a gap and a page per page
        step = max(1, rotate_chunk_elements(dev) // (heads * span * hd))  # layers per step
        for lo in range(0, n_layers, step):
            hi = lo + step
            k = dequantize_int8(keys[lo:hi], scales[0][lo:hi].index_select(2, page_of),
                                kv_dtype)  # (l, kv, span, hd)
            rerotate_into(k, cos, sin, dst_k[lo:hi])
            dst_v[lo:hi] = dequantize_int8(values[lo:hi], scales[1][lo:hi], kv_dtype)
    embeds.index_copy_(0, torch.from_numpy(rows).to(dev),
                       page_embeds.to(embeds.dtype))  # (N, hidden)


def _gapped(layout: Layout, parts: list[torch.Tensor]) -> list[torch.Tensor]:
    """The pieces of the span from the first page to the last, in order: `parts` (L, kv,
    T_i, d), one a page, with a zero block (L, kv, gap, d) between consecutive pages for the
    label rows (views of one zero: one `torch.cat` of the pieces joins the span)."""
    zero = parts[0].new_zeros(())  # the label rows' one element
    out = [parts[0]]
    for prev, seg, part in zip(layout.segments[:-1], layout.segments[1:], parts[1:], strict=True):
        n_layers, heads, _, d = part.shape
        out += [zero.expand(n_layers, heads, seg.start - prev.stop, d), part]
    return out


def _spans(layout: Layout, kvs: list[PageKV], dev: torch.device) -> list[torch.Tensor]:
    """Keys and values (L, kv, span, hd) at their places in the span, embeddings (T, hidden)
    and, for int8 pages, key scales (L, kv, P, hd) and value scales (L, kv, span, 1), on the
    device: every page crosses in the one batched copy (`pages_to_device`), then one
    `torch.cat` a tensor kind there, zeros in the label rows between pages."""
    moved = pages_to_device([kv.tensors() for kv in kvs], dev)  # PageKV.tensors() order
    out = [torch.cat(_gapped(layout, [page[1] for page in moved]), dim=2),  # (L, kv, span, hd)
           torch.cat(_gapped(layout, [page[2] for page in moved]), dim=2),
           torch.cat([page[0] for page in moved])]  # (T, hidden)
    if kvs[0].kv_dtype is not None:
        out += [torch.cat([page[6] for page in moved], dim=2),  # (L, kv, P, hd)
                torch.cat(_gapped(layout, [page[7] for page in moved]), dim=2)]  # (L, kv, span, 1)
    return out
