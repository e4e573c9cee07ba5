"""Disk tier, parallel reads: a question's pages read on the pool are the bytes read one by
one, into staging memory of their own; a corrupt page among them is still found and removed;
pages missing from disk fall through to the next tier."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from conduit_core.kv.staging import packed_buffer
from storage.keys import PageHash
from storage.kv.disk import DiskKVStore
from storage.kv.redis_store import RedisKVStore
from storage.kv.tiered import TieredKVStore
from tests.storage.kv_testkit import assert_same_page, make_page

SHAPE = (256, 6, 4, 32, 64)  # tokens, layers, kv heads, head dim, hidden: 0.8 MB a bf16 page
N = 8


def _k(i: int) -> PageHash:
    return PageHash(f"{i:02x}" + "cd" * 31)


@pytest.mark.parametrize("quantize", [False, True])
def test_parallel_reads_equal_sequential_reads(tmp_path: Path, quantize: bool) -> None:
    pages = {_k(i): make_page(i, SHAPE) for i in range(N)}
    DiskKVStore(tmp_path, 1 << 30, quantize=quantize, fsync=False).put_many(pages)
    one = DiskKVStore(tmp_path, 1 << 30, read_threads=1).get_many(list(pages))
    many_store = DiskKVStore(tmp_path, 1 << 30, read_threads=4)
    for _ in range(3):  # the pool reused across calls
        many = many_store.get_many(list(pages))
        assert list(many) == list(pages)
        for key in pages:
            assert_same_page(one[key], many[key])
            assert many[key].quantized == quantize
    buffers = {packed_buffer(p.tensors()).data_ptr() for p in many.values()}  # type: ignore[union-attr]
    assert len(buffers) == N  # each page in one buffer of its own: it crosses as it is
    assert many_store.stats().hits == 3 * N


def test_a_corrupt_page_among_parallel_reads_is_a_miss_and_removed(tmp_path: Path) -> None:
    pages = {_k(i): make_page(i, SHAPE) for i in range(N)}
    store = DiskKVStore(tmp_path, 1 << 30, fsync=False, read_threads=4)
    store.put_many(pages)
    path = store.path(_k(5))
    blob = bytearray(path.read_bytes())
    blob[len(blob) * 3 // 4] ^= 0x01  # one bit of the last layers' values
    path.write_bytes(bytes(blob))
    got = store.get_many(list(pages))
    assert list(got) == [k for k in pages if k != _k(5)]
    for key, page in got.items():
        assert_same_page(pages[key], page)
    s = store.stats()
    assert (s.hits, s.misses, s.corrupt) == (N - 1, 1, 1) and not path.exists()


def test_pages_missing_from_disk_fall_through_to_the_next_tier(
        tmp_path: Path, redis_url: str, prefix: str) -> None:
    """Disk first, Redis behind it: pages deleted from disk, or corrupt there, are served by
    Redis; a page in neither is absent (the caller prefills it)."""
    pages = {_k(i): make_page(i, SHAPE) for i in range(N)}
    disk = DiskKVStore(tmp_path, 1 << 30, fsync=False, read_threads=4)
    redis_tier = RedisKVStore(redis_url, prefix=prefix)
    try:
        stack = TieredKVStore([("disk", disk), ("redis", redis_tier)])
        stack.put_many(pages)
        disk.delete([_k(1), _k(6)])
        corrupt = disk.path(_k(3))
        corrupt.write_bytes(corrupt.read_bytes()[:-64])  # truncated
        stack.delete([_k(7)])  # in no tier
        found, served_by = stack.get_many_traced(list(pages))
        assert set(found) == set(pages) - {_k(7)}
        assert {k for k, t in served_by.items() if t == "redis"} == {_k(1), _k(3), _k(6)}
        for key, page in found.items():
            assert_same_page(pages[key], page)
        assert disk.stats().corrupt == 1
        assert disk.contains([_k(1), _k(3), _k(6)]) == {_k(1), _k(3), _k(6)}  # promoted
    finally:
        redis_tier.close()


def test_read_pages_land_in_staging_memory(tmp_path: Path) -> None:
    """A page read from disk views one host buffer, pinned exactly where CUDA is available
    (so the runtime's copy to the device is asynchronous)."""
    store = DiskKVStore(tmp_path, 1 << 30, fsync=False)
    store.put_many({_k(0): make_page(0, SHAPE)})
    page = store.get_many([_k(0)])[_k(0)]
    buf = packed_buffer(page.tensors())
    assert buf is not None and buf.is_pinned() == torch.cuda.is_available()
    assert page.keys.untyped_storage().nbytes() == store.path(_k(0)).stat().st_size
