"""Page loads: the joined path (every page in one batched copy, joined on the device,
re-rotation of all pages in a few operations, int8 dequantised on the device) and the CPU's
in-place path fill the cache exactly as a page-by-page load (`_per_page`, the reference here:
a copy per page and tensor, `rerotate` per page and layer)."""

from __future__ import annotations

from collections import Counter
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from conduit_core import PageInput, PageKV, ReuseRuntime
from conduit_core.kv.kv_cache import KVCache
from conduit_core.kv.page_loads import load_pages
from conduit_core.kv.staging import packed_buffer, pages_to_device
from conduit_core.passes.assembly import Assembly
from conduit_core.prompt.rotation import rerotate_into, shift_tables
from lab.ttft.op_count import LAUNCH_FREE, OpCounter, accelerator_path, count_ops
from storage.keys import PageHash
from storage.kv.codec import quantize_roundtrip
from storage.kv.disk import DiskKVStore
from tests.core.helpers import IMAGES, rerotate, segment_delta
from tests.device import TEST_DEVICE

PREFIX = "You answer questions about the pages below."
QUESTION = "What is on the second page?"


def _page_rows(asm: Assembly, cache: KVCache, embeds: torch.Tensor
               ) -> tuple[torch.Tensor, ...]:
    """The keys and values of the page rows of `cache`, and `embeds`."""
    rows = torch.cat([torch.arange(s.start, s.stop) for s in asm.layout.segments])
    dev = cache.keys.device
    return cache.keys[:, 0, :, rows.to(dev)], cache.values[:, 0, :, rows.to(dev)], embeds


def _assemble(rt: ReuseRuntime, kvs: list[PageKV]) -> tuple[torch.Tensor, ...]:
    """The page rows of the runtime's own assembly (its load path on this device)."""
    asm = rt.reuse.assemble(PREFIX, [PageInput(f"Page {i}:\n", kv) for i, kv in enumerate(kvs)],
                            QUESTION)
    return _page_rows(asm, asm.cache, asm.embeds)


def _per_page(rt: ReuseRuntime, kvs: list[PageKV]) -> tuple[torch.Tensor, ...]:
    """The reference: the same layout's page rows filled page by page (int8 pages dequantised
    on the host first), a blocking copy per tensor and `rerotate` per page and layer."""
    asm = rt.reuse.assemble(PREFIX, [PageInput(f"Page {i}:\n", kv) for i, kv in enumerate(kvs)],
                            QUESTION)
    layout, dev = asm.layout, rt.adapter.device
    cache = KVCache.allocate(rt.adapter, 1, layout.n)
    embeds = rt.adapter.embed_tokens(layout.token_ids)  # (N, hidden)
    for seg, kv in zip(layout.segments, [kv.dequantized() for kv in kvs], strict=True):
        delta = segment_delta(kv.position_ids, layout.position_ids[:, seg.start:seg.stop])
        rerotate(rt.adapter, kv.keys.to(dev), delta,
                 out=cache.keys[:, 0, :, seg.start:seg.stop])  # (L, kv, T, hd)
        cache.values[:, 0, :, seg.start:seg.stop] = kv.values
        embeds[seg.start:seg.stop] = kv.embeds.to(embeds.device, embeds.dtype)
    return _page_rows(asm, cache, embeds)


def _same(a: tuple[torch.Tensor, ...], b: tuple[torch.Tensor, ...]) -> None:
    for x, y in zip(a, b, strict=True):
        assert x.dtype == y.dtype and torch.equal(x, y)


def test_batched_loads_equal_per_page_loads(runtime: ReuseRuntime) -> None:
    kvs = runtime.prefill_pages([IMAGES["a"], IMAGES["b"], IMAGES["c"]])
    _same(_assemble(runtime, kvs), _per_page(runtime, kvs))
    _same(_assemble(runtime, kvs[::-1]), _per_page(runtime, kvs[::-1]))


def test_int8_pages_load_as_int8_and_dequantise_on_the_device(runtime: ReuseRuntime) -> None:
    """Int8 pages are staged as int8 plus scales and dequantised where the cache is; the cache
    holds exactly what the host-dequantised page would put there (and a mixed question
    too)."""
    floats = runtime.prefill_pages([IMAGES["a"], IMAGES["c"]])
    int8 = [quantize_roundtrip(kv) for kv in floats]
    assert all(kv.quantized and kv.keys.dtype == torch.int8 for kv in int8)
    host = [kv.dequantized() for kv in int8]
    _same(_assemble(runtime, int8), _per_page(runtime, host))
    _same(_assemble(runtime, [int8[0], floats[1]]), _per_page(runtime, [host[0], floats[1]]))


def test_staged_loads_equal_per_page_loads(runtime: ReuseRuntime) -> None:
    """The path an accelerator takes (pages in one batched copy, joined on the device), run
    on the CPU too: the same cache as the per-page load, float, int8 and mixed pages alike,
    in any order."""
    floats = runtime.prefill_pages([IMAGES["a"], IMAGES["b"], IMAGES["c"]])
    # int8 pages of their own tensors (a decoded entry views one buffer: the packed path)
    int8 = [replace(q, keys=q.keys.clone()) for q in map(quantize_roundtrip, floats)]
    assert all(packed_buffer(kv.tensors()) is None for kv in floats + int8)
    for kvs in (floats, floats[::-1], int8, int8[::-1], [int8[0], floats[1], int8[2]]):
        _same(_staged(runtime, kvs), _per_page(runtime, kvs))


def _staged(runtime: ReuseRuntime, kvs: list[PageKV],
            mode: TorchDispatchMode | None = None) -> tuple[torch.Tensor, ...]:
    """The page rows of a cache filled by the accelerator's load path, run on any device
    (inside `mode`, where given)."""
    asm = runtime.reuse.assemble(
        PREFIX, [PageInput(f"Page {i}:\n", kv) for i, kv in enumerate(kvs)],
                                 QUESTION)
    cache = KVCache.allocate(runtime.adapter, 1, asm.layout.n)
    embeds = runtime.adapter.embed_tokens(asm.layout.token_ids)
    with accelerator_path(), mode or nullcontext():  # as on an accelerator
        load_pages(runtime.adapter, asm.layout, kvs, cache, embeds)
    rows = torch.cat([torch.arange(s.start, s.stop) for s in asm.layout.segments])
    dev = cache.keys.device
    return cache.keys[:, 0, :, rows.to(dev)], cache.values[:, 0, :, rows.to(dev)], embeds


class _PageReads(OpCounter):
    """An `OpCounter` that also counts, by name, the operations that read one of `kvs`'
    own (host) tensors, views aside."""

    def __init__(self, kvs: list[PageKV]) -> None:
        super().__init__()
        self.storages = {t.untyped_storage().data_ptr() for kv in kvs for t in kv.tensors()}
        self.reads: Counter[str] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        name = func.overloadpacket.__name__.rstrip("_")
        if name not in LAUNCH_FREE and any(
                t.untyped_storage().data_ptr() in self.storages
                for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)):
            self.reads[name] += 1
        return super().__torch_dispatch__(func, types, args, kwargs)


@pytest.mark.parametrize("packed", [False, True])
def test_the_page_load_is_one_copy_and_no_host_pass(runtime: ReuseRuntime, tmp_path: Path,
                                                    packed: bool) -> None:
    """On the accelerator's path, at 2, 8 and 32 pages (of their own tensors, or packed as
    the disk tier reads them), the pages' host tensors are read by one operation, the
    batched copy (no host concatenation, no other host pass), and the load issues the same
    operations whatever the number of pages."""
    kvs = runtime.prefill_pages([IMAGES["a"], IMAGES["b"], IMAGES["c"]])
    if packed:
        keys = [PageHash(f"{i:02x}" + "ab" * 31) for i in range(3)]
        store = DiskKVStore(tmp_path, 1 << 30, quantize=False, fsync=False)
        store.put_many(dict(zip(keys, kvs, strict=True)))
        read = store.get_many(keys)
        kvs = [read[k] for k in keys]
    counts = []
    for pages in (2, 8, 32):
        mode = _PageReads(kvs)
        _staged(runtime, [kvs[i % len(kvs)] for i in range(pages)], mode)
        assert mode.reads == {"_foreach_copy": 1}, (pages, mode.reads)
        counts.append(mode.by_name)
    assert counts[0] == counts[1] == counts[2], counts


@pytest.mark.parametrize("quantize", [False, True])
def test_pages_read_from_disk_cross_as_read(runtime: ReuseRuntime, tmp_path: Path,
                                            quantize: bool) -> None:
    """Pages the disk tier read (each in one host buffer of its own) take the packed path:
    their buffers cross as they are and are joined on the device; the cache is the one the
    per-page load fills from the same pages, in any order and with labels between them."""
    floats = runtime.prefill_pages([IMAGES["a"], IMAGES["b"], IMAGES["c"]])
    keys = [PageHash(f"{i:02x}" + "ef" * 31) for i in range(3)]
    store = DiskKVStore(tmp_path, 1 << 30, quantize=quantize, fsync=False)
    store.put_many(dict(zip(keys, floats, strict=True)))
    read = store.get_many(keys)
    kvs = [read[k] for k in keys]
    assert all(packed_buffer(kv.tensors()) is not None for kv in kvs)
    assert all(packed_buffer(kv.tensors()) is None for kv in floats)  # tensor by tensor
    for order in (kvs, kvs[::-1], [kvs[1], kvs[0]]):
        want = _per_page(runtime, [kv.dequantized() for kv in order])
        _same(_staged(runtime, order), want)


def test_pages_cross_in_one_batched_copy_each_tensor_at_its_offset() -> None:
    """Two packed buffers (header bytes before the tensors, as an entry has) and a page of
    separate tensors (one strided) cross into one device buffer in one operation; each
    tensor comes back equal, in its dtype (int8 stays int8), at its own offset."""
    groups, want = [], []
    for seed, head in ((0, 128), (1, 64)):
        g = torch.Generator().manual_seed(seed)
        parts = [torch.randn(2, 3, 5, 8, generator=g).to(torch.bfloat16),
                 torch.randint(-127, 128, (4, 6), generator=g, dtype=torch.int8),
                 torch.arange(7)]
        buf = torch.empty(head + sum(p.numel() * p.element_size() for p in parts) + 64,
                          dtype=torch.uint8)
        views, at = [], head
        for p in parts:
            n = p.numel() * p.element_size()
            at = -(-at // 8) * 8
            v = buf[at:at + n].view(p.dtype).view(p.shape)
            v.copy_(p)
            views.append(v)
            at += n
        groups.append(views)
        want.append(parts)
    loose = [torch.rand(2, 2, 1, 8), torch.randn(3, 2, 4, 8)[:, :, 1:],
             torch.randint(-127, 128, (2, 2, 5, 8), dtype=torch.int8)]
    groups.append(loose)
    want.append(loose)
    assert packed_buffer(groups[0]) is not None and packed_buffer(loose) is None
    out, ops = count_ops(lambda: pages_to_device(groups, torch.device(TEST_DEVICE)))
    assert ops.by_name == {"_foreach_copy": 1}, ops.by_name
    assert len({t.untyped_storage().data_ptr() for g in out for t in g}) == 1
    for got_g, want_g in zip(out, want, strict=True):
        for got, w in zip(got_g, want_g, strict=True):
            assert got.device.type == torch.device(TEST_DEVICE).type
            assert got.dtype == w.dtype and torch.equal(got.cpu(), w)
    assert packed_buffer([groups[0][0], torch.arange(3)]) is None  # two buffers


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_batched_rerotation_equals_per_page_rerotation(runtime: ReuseRuntime,
                                                       dtype: torch.dtype) -> None:
    """`rerotate_into` over several pages laid out in one span, each by its own shift (zero,
    small, negative, very large), writes exactly what `rerotate` writes page by page and
    layer by layer, in one step or in many."""
    g = torch.Generator().manual_seed(0)
    adapter = runtime.adapter
    n_layers = len(adapter.layers)
    kv, hd = adapter.text_config.num_key_value_heads, adapter.layers[0].self_attn.head_dim
    lengths, deltas = [7, 1, 12, 5], [0, 3, -40, 1_000_003]
    pages = [(torch.randn(n_layers, kv, t, hd, generator=g) * 4).to(dtype) for t in lengths]
    starts = [2, 11, 14, 30]  # page rows inside a 40-row cache, gaps between them
    want = torch.zeros(n_layers, kv, 40, hd, dtype=dtype)
    span = torch.zeros_like(want)
    for keys, start, delta in zip(pages, starts, deltas, strict=True):
        rerotate(adapter, keys, delta, out=want[:, :, start:start + keys.shape[2]])
        span[:, :, start:start + keys.shape[2]] = keys
    span_d, span_n, last = [], [], starts[0]
    for start, t, delta in zip(starts, lengths, deltas, strict=True):
        span_d += [0, delta]
        span_n += [start - last, t]
        last = start + t
    cos, sin = shift_tables(adapter, span_d, span_n, torch.device("cpu"))
    for chunk in (None, 1, kv * 3 * hd, kv * (last - starts[0]) * hd):
        got = torch.zeros_like(want)
        rerotate_into(span[:, :, starts[0]:last], cos, sin, got[:, :, starts[0]:last],
                      chunk_elements=chunk)
        assert torch.equal(got, want), chunk


def test_runtime_returns_host_pages(runtime: ReuseRuntime) -> None:
    (kv,) = runtime.prefill_pages([IMAGES["a"]])
    pinned = torch.cuda.is_available()
    for t in kv.tensors():
        assert t.device.type == "cpu" and t.is_pinned() == pinned
