"""Filling an assembled cache from cached pages, all pages at once.

`load_pages`, on an accelerator: pages a store read into host buffers of their own (the disk
tier reads each entry straight into one, pinned where CUDA is available) cross as they are, one
non-blocking copy a page, and are joined into the span of the prompt from the first page to the
last on the device (`staging.packed_to_device`: no host copy besides the read). Other pages
(prefilled here, from Redis) are laid out in one host buffer, pinned where CUDA is available
(all pages' keys and values at their places in the span, the embeddings and int8 scales after
them; `conduit_core.kv.staging.HostStage`), and the buffer crosses to the device in one
non-blocking copy. Int8 pages cross as int8 plus scales and are dequantised there. Then the
keys of all pages turn into the cache in a few operations, each row by its own page's shift
(`rotation.rerotate_into` with a (span, head_dim) table; the label rows between pages are
written too, with whatever the buffer held there: like every text row, they are computed before
anything reads them), the values go in with one copy and the embeddings with one indexed copy.
On the CPU the pages already are where the cache is: each page turns straight from its own
tensors into its rows, all layers at once in steps that fit the core's cache; the staged path
(`stage_on_cpu=True`) gives the same values, and is what the tests run on a CPU. Both leave in
the page rows exactly the values a page-by-page load (each page turned by its own shift, one
layer at a time) would (tests/core/test_page_loads.py).

Public API:
  load_pages(adapter, layout, kvs, cache, embeds, stage_on_cpu=False) -> None
      embeds (N, hidden) filled in place
"""

from __future__ import annotations

import numpy as np
import torch

from conduit_core.kv.kv_cache import KVCache
from conduit_core.kv.staging import HostStage, packed_to_device
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


def load_pages(adapter: VLMAdapter, layout: Layout, kvs: list[PageKV], cache: KVCache,
               embeds: torch.Tensor, stage_on_cpu: bool = False) -> None:
    """Write the pages' re-rotated keys, values and embeddings (N, hidden) into their rows
    of the batch-1 cache (module docstring)."""
    if not kvs:
        return
    if not all(kv.quantized for kv in kvs):  # a mixed question: the float form throughout
        kvs = [kv.dequantized() for kv in kvs]
    rows = np.concatenate([np.arange(s.start, s.stop) for s in layout.segments])  # (T,)
    deltas = span_deltas(torch.cat([kv.position_ids for kv in kvs], dim=1).cpu(),
                         layout.position_ids.cpu()[:, torch.from_numpy(rows)],
                         [s.length for s in layout.segments])  # one shift a page
    if adapter.device.type == "cpu" and not stage_on_cpu:
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
    """An accelerator: the pages cross in one copy each (packed, as a store read them) or
    in one staged buffer, then a few operations for all pages (`rows` (T,): the page rows
    of the layout, in order)."""
    dev = adapter.device
    first, last = layout.segments[0].start, layout.segments[-1].stop
    n_layers, heads, _, hd = kvs[0].keys.shape
    span = last - first
    kv_dtype = kvs[0].kv_dtype  # int8 pages: the dtype they dequantise to
    moved = _packed_spans(layout, kvs, dev)
    keys, values, page_embeds, *scales = moved if moved is not None else _staged_spans(
        layout, kvs, dev)
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
        page_of = torch.repeat_interleave(
            torch.arange(len(kvs)).repeat_interleave(2),  # a gap and a page per page
            torch.tensor(lengths)).to(dev)  # (span,) the page of each row
        step = max(1, rotate_chunk_elements(dev) // (heads * span * hd))  # layers per step
        for lo in range(0, n_layers, step):
            hi = lo + step
            k = dequantize_int8(keys[lo:hi], scales[0][lo:hi].index_select(2, page_of),
                                kv_dtype)  # (l, kv, span, hd)
            rerotate_into(k, cos, sin, dst_k[lo:hi])
            dst_v[lo:hi] = dequantize_int8(values[lo:hi], scales[1][lo:hi], kv_dtype)
    embeds.index_copy_(0, torch.from_numpy(rows).to(dev),
                       page_embeds.to(embeds.dtype))  # (N, hidden)


def _staged_spans(layout: Layout, kvs: list[PageKV], dev: torch.device) -> list[torch.Tensor]:
    """Keys and values (L, kv, span, hd) at their places in the span, embeddings (T, hidden)
    and, for int8 pages, key scales (L, kv, P, hd) and value scales (L, kv, span, 1), filled
    into one host buffer that crosses in one copy (`HostStage`)."""
    first, last = layout.segments[0].start, layout.segments[-1].stop
    n_layers, heads, _, hd = kvs[0].keys.shape
    span, tokens = last - first, sum(kv.num_tokens for kv in kvs)
    specs = [((n_layers, heads, span, hd), kvs[0].keys.dtype),
             ((n_layers, heads, span, hd), kvs[0].values.dtype),
             ((tokens, kvs[0].embeds.shape[-1]), kvs[0].embeds.dtype)]
    if kvs[0].kv_dtype is not None:  # key scales per page and channel, value scales per row
        specs += [((n_layers, heads, len(kvs), hd), torch.float32),
                  ((n_layers, heads, span, 1), torch.float32)]
    staged = HostStage(specs, dev)
    done = 0
    for i, (seg, kv) in enumerate(zip(layout.segments, kvs, strict=True)):
        rows, t = slice(seg.start - first, seg.stop - first), kv.num_tokens
        staged.host[0][:, :, rows] = kv.keys  # (L, kv, T, hd) at its place in the span
        staged.host[1][:, :, rows] = kv.values
        staged.host[2][done:done + t] = kv.embeds  # (T, hidden)
        if kv.key_scale is not None and kv.value_scale is not None:
            staged.host[3][:, :, i:i + 1] = kv.key_scale  # (L, kv, 1, hd)
            staged.host[4][:, :, rows] = kv.value_scale  # (L, kv, T, 1)
        done += t
    return staged.to_device()  # the one copy


def _packed_spans(layout: Layout, kvs: list[PageKV], dev: torch.device
                  ) -> list[torch.Tensor] | None:
    """`_staged_spans`' tensors from pages that each view one host buffer of their own (as
    the disk tier reads them): each buffer crosses as it is (`packed_to_device`, no host
    copy) and the spans are joined on the device, zeros in the label rows between pages;
    None when a page is not packed."""
    moved = packed_to_device([kv.tensors() for kv in kvs], dev)
    if moved is None:
        return None
    n_layers, heads, _, hd = kvs[0].keys.shape
    quantized = kvs[0].kv_dtype is not None
    gaps = [seg.start - prev.stop for prev, seg in zip(layout.segments[:-1], layout.segments[1:],
                                                  strict=True)]
    widest = max(gaps, default=0)
    zero_k = torch.zeros(n_layers, heads, widest, hd, dtype=kvs[0].keys.dtype, device=dev)
    zero_s = torch.zeros(n_layers, heads, widest, 1, device=dev)  # value scales' gap rows
    keys, values, value_scales = [moved[0][1]], [moved[0][2]], [moved[0][7] if quantized
                                                                 else zero_s]
    for gap, page in zip(gaps, moved[1:], strict=True):
        keys += [zero_k[:, :, :gap], page[1]]  # (L, kv, gap, hd), (L, kv, T, hd)
        values += [zero_k[:, :, :gap], page[2]]
        if quantized:
            value_scales += [zero_s[:, :, :gap], page[7]]  # (L, kv, gap, 1), (L, kv, T, 1)
    out = [torch.cat(keys, dim=2), torch.cat(values, dim=2),  # (L, kv, span, hd) each
           torch.cat([page[0] for page in moved])]  # (T, hidden)
    if quantized:
        out += [torch.cat([page[6] for page in moved], dim=2),  # (L, kv, P, hd)
                torch.cat(value_scales, dim=2)]  # (L, kv, span, 1)
    return out

