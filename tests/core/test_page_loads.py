"""Page loads: the joined path (pages joined into one staged buffer, one copy, re-rotation of all
pages in a few operations, int8 dequantised on the device) and the CPU's in-place path fill the
cache exactly as a page-by-page load (`_per_page`, the reference here: a copy per page and
tensor, `rerotate` per page and layer)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from conduit_core import PageInput, PageKV, ReuseRuntime
from conduit_core.kv.kv_cache import KVCache
from conduit_core.kv.page_loads import load_pages
from conduit_core.kv.staging import packed_buffer, packed_to_device, stage
from conduit_core.passes.assembly import Assembly
from conduit_core.prompt.rotation import rerotate_into, shift_tables
from lab.ttft.op_count import accelerator_path
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
    """The path an accelerator takes (pages joined into one staged buffer, one copy, views of
    it), run on the CPU too: the same cache as the per-page load, float, int8 and mixed pages
    alike, in any order."""
    floats = runtime.prefill_pages([IMAGES["a"], IMAGES["b"], IMAGES["c"]])
    # int8 pages of their own tensors (a decoded entry views one buffer: the packed path)
    int8 = [replace(q, keys=q.keys.clone()) for q in map(quantize_roundtrip, floats)]
    assert all(packed_to_device([kv.tensors()], "cpu") is None for kv in floats + int8)
    for kvs in (floats, floats[::-1], int8, int8[::-1], [int8[0], floats[1], int8[2]]):
        _same(_staged(runtime, kvs), _per_page(runtime, kvs))


def _staged(runtime: ReuseRuntime, kvs: list[PageKV]) -> tuple[torch.Tensor, ...]:
    """The page rows of a cache filled by the accelerator's load path, run on any device."""
    asm = runtime.reuse.assemble(
        PREFIX, [PageInput(f"Page {i}:\n", kv) for i, kv in enumerate(kvs)],
                           QUESTION)
    cache = KVCache.allocate(runtime.adapter, 1, asm.layout.n)
    embeds = runtime.adapter.embed_tokens(asm.layout.token_ids)
    with accelerator_path():  # pages joined, whole-span steps, as on an accelerator
        load_pages(runtime.adapter, asm.layout, kvs, cache, embeds)
    rows = torch.cat([torch.arange(s.start, s.stop) for s in asm.layout.segments])
    dev = cache.keys.device
    return cache.keys[:, 0, :, rows.to(dev)], cache.values[:, 0, :, rows.to(dev)], embeds


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
    assert packed_to_device([kv.tensors() for kv in kvs], "cpu") is not None
    assert packed_to_device([kv.tensors() for kv in floats], "cpu") is None  # staged instead
    for order in (kvs, kvs[::-1], [kvs[1], kvs[0]]):
        want = _per_page(runtime, [kv.dequantized() for kv in order])
        _same(_staged(runtime, order), want)


def test_packed_to_device_returns_every_tensor_at_its_offset() -> None:
    """Two packed buffers (header bytes before the tensors, as an entry has) cross into one
    device buffer; each tensor comes back equal, at its own offset."""
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
    assert packed_buffer(groups[0]) is not None
    out = packed_to_device(groups, torch.device(TEST_DEVICE))
    assert out is not None
    assert len({t.untyped_storage().data_ptr() for g in out for t in g}) == 1
    for got_g, want_g in zip(out, want, strict=True):
        for got, w in zip(got_g, want_g, strict=True):
            assert got.dtype == w.dtype and torch.equal(got.cpu(), w)
    assert packed_buffer([groups[0][0], torch.arange(3)]) is None  # two buffers


def test_int8_staging_copies_int8_bytes() -> None:
    """What crosses to the device for an int8 page is int8 plus float32 scales."""
    q = torch.randint(-127, 128, (2, 2, 5, 8), dtype=torch.int8)
    scale = torch.rand(2, 2, 1, 8)
    staged_q, staged_scale = stage([q, scale], torch.device(TEST_DEVICE))
    assert staged_q.dtype == torch.int8 and torch.equal(staged_q.cpu(), q)
    assert torch.equal(staged_scale.cpu(), scale)


def test_stage_makes_one_buffer_of_every_tensor() -> None:
    parts = [torch.randn(3, 2, 4, 8), torch.randn(5, 6).to(torch.bfloat16), torch.arange(5),
             torch.randn(3, 2, 4, 8)[:, :, 1:]]  # a strided one too
    out = stage(parts, torch.device(TEST_DEVICE))
    for got, want in zip(out, parts, strict=True):
        assert got.device.type == torch.device(TEST_DEVICE).type and got.dtype == want.dtype
        assert torch.equal(got.cpu(), want)
    storages = {t.untyped_storage().data_ptr() for t in out}
    assert len(storages) == 1  # one buffer, so one host-to-device copy


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
