"""Filling an assembled cache from cached pages: the batched load and the per-page one.

`load_pages` (the runtime's default) stages every page tensor a question needs in one host
buffer, pinned where CUDA is available, and copies it to the device in one non-blocking copy
(`conduit_core.staging`; int8 pages as int8 plus scales, dequantised on the device), then
re-rotates every page's keys by its own shift in a few operations (`rotation.rerotate_rows`)
and writes keys, values and layer-0 embeddings into their rows with one indexed copy each.
`load_per_page` is the path before it (a blocking copy per page and tensor, one rotation per
page and layer), kept for A/B measurements (`ReuseRuntime(page_loads="per_page")`). Both
leave exactly the same values in the cache (tests/core/test_page_loads.py).

Public API:
  load_pages(adapter, layout, kvs, cache, embeds) -> None   embeds (N, hidden) filled in place
  load_per_page(adapter, layout, kvs, cache, embeds) -> None
"""

from __future__ import annotations

import torch

from conduit_core.adapters.base import VLMAdapter
from conduit_core.kv_cache import KVCache
from conduit_core.layout import Layout
from conduit_core.page_kv import PageKV, dequantize_int8
from conduit_core.rotation import (
    rerotate,
    rerotate_rows,
    rotate_chunk_elements,
    segment_delta,
    shift_tables,
)
from conduit_core.staging import stage


def load_pages(adapter: VLMAdapter, layout: Layout, kvs: list[PageKV], cache: KVCache,
               embeds: torch.Tensor) -> None:
    """Stage the pages' tensors in one host buffer, copy it to the device at once, and write
    re-rotated keys, values and embeddings (N, hidden) into their rows of a batch-1 cache."""
    if not kvs:
        return
    dev = adapter.device
    if not all(kv.quantized for kv in kvs):  # a mixed question: the float form throughout
        kvs = [kv.dequantized() for kv in kvs]
    deltas, lengths = [], []
    for seg, kv in zip(layout.segments, kvs, strict=True):
        deltas.append(segment_delta(kv.position_ids, layout.position_ids[:, seg.start:seg.stop]))
        lengths.append(seg.stop - seg.start)
    rows = torch.cat([torch.arange(seg.start, seg.stop)
                      for seg in layout.segments]).to(dev)  # (T,) page rows, in order
    groups = [([kv.keys for kv in kvs], 2), ([kv.values for kv in kvs], 2),
              ([kv.embeds for kv in kvs], 0)]
    if kvs[0].quantized:
        groups += [([kv.key_scale for kv in kvs if kv.key_scale is not None], 2),
                   ([kv.value_scale for kv in kvs if kv.value_scale is not None], 2)]
    staged = stage(groups, dev)  # keys, values (L, kv, T, hd), embeds (T, hidden), scales
    keys, values, page_embeds = staged[:3]
    cos, sin = shift_tables(adapter, deltas, lengths, dev)  # (T, hd) each
    kv_dtype = kvs[0].kv_dtype
    if kv_dtype is not None:  # int8: key scales (L, kv, pages, hd), value scales (L, kv, T, 1)
        key_scale, value_scale = staged[3:]
        page_of = torch.repeat_interleave(torch.arange(len(kvs)),
                                          torch.tensor(lengths)).to(dev)  # (T,)
        rerotate_rows(keys, cos, sin, cache.keys[:, 0], rows, key_scale=key_scale,
                      page_of=page_of, kv_dtype=kv_dtype)
        step = max(1, rotate_chunk_elements(dev) // max(1, values[0].numel()))
        for lo in range(0, values.shape[0], step):  # a few layers per dequantisation
            cache.values[lo:lo + step, 0].index_copy_(
                2, rows, dequantize_int8(values[lo:lo + step], value_scale[lo:lo + step],
                                         cache.values.dtype))  # (l, kv, T, hd)
    else:
        rerotate_rows(keys, cos, sin, cache.keys[:, 0], rows)  # (L, kv, cap, hd) in place
        cache.values[:, 0].index_copy_(2, rows, values.to(cache.values.dtype))
    embeds.index_copy_(0, rows, page_embeds.to(embeds.dtype))  # (N, hidden)


def load_per_page(adapter: VLMAdapter, layout: Layout, kvs: list[PageKV], cache: KVCache,
                  embeds: torch.Tensor) -> None:
    """The per-page load: a blocking copy per page and tensor, one rotation per page and
    layer; int8 pages dequantised on the host first."""
    dev = adapter.device
    for seg, kv in zip(layout.segments, [kv.dequantized() for kv in kvs], strict=True):
        delta = segment_delta(kv.position_ids, layout.position_ids[:, seg.start:seg.stop])
        rerotate(adapter, kv.keys.to(dev), delta,
                 out=cache.keys[:, 0, :, seg.start:seg.stop])  # (L, kv, T, hd) in place
        cache.values[:, 0, :, seg.start:seg.stop] = kv.values  # copied to the device
        embeds[seg.start:seg.stop] = kv.embeds.to(embeds.device, embeds.dtype)
