"""Tiered store: read-through with promotion, write-through, per-tier stats, the factory."""

from __future__ import annotations

from pathlib import Path

import pytest

from storage.keys import PageHash
from storage.kv.disk import DiskKVStore
from storage.kv.factory import build_kv_store
from storage.kv.memory import MemoryKVStore
from storage.kv.redis_store import RedisKVStore
from storage.kv.tiered import TieredKVStore
from tests.storage.kv_testkit import assert_same_page, make_page, tier


def _k(i: int) -> PageHash:
    return PageHash(f"{i:02x}" + "ef" * 31)


def _stack(tmp_path: Path, redis_url: str, prefix: str) -> TieredKVStore:
    return TieredKVStore([("memory", MemoryKVStore(1 << 28)),
                          ("redis", RedisKVStore(redis_url, prefix=prefix)),
                          ("disk", DiskKVStore(tmp_path / "kv", 1 << 30))])


def test_read_through_promotes_into_faster_tiers(tmp_path: Path, redis_url: str,
                                                 prefix: str) -> None:
    stack = _stack(tmp_path, redis_url, prefix)
    page = make_page(1)
    tier(stack, "disk").put_many({_k(1): page})
    got = stack.get_many([_k(1), _k(2)])
    assert list(got) == [_k(1)]
    assert_same_page(page, got[_k(1)])
    for name in ("memory", "redis"):
        assert tier(stack, name).contains([_k(1)]) == {_k(1)}, name
    per = stack.tier_stats()
    assert (per["memory"].hits, per["memory"].misses) == (0, 2)
    assert (per["redis"].hits, per["redis"].misses) == (0, 2)
    assert (per["disk"].hits, per["disk"].misses) == (1, 1)
    assert stack.get_many([_k(1)])[_k(1)] is tier(stack, "memory").get_many([_k(1)])[_k(1)]
    per = stack.tier_stats()
    assert per["memory"].hits == 2 and per["redis"].hits == 0 and per["disk"].hits == 1
    total = stack.stats()
    assert (total.hits, total.misses) == (2, 1)


def test_redis_hit_promotes_to_memory_only(tmp_path: Path, redis_url: str,
                                           prefix: str) -> None:
    stack = _stack(tmp_path, redis_url, prefix)
    tier(stack, "redis").put_many({_k(3): make_page(3)})
    assert set(stack.get_many([_k(3)])) == {_k(3)}
    assert tier(stack, "memory").contains([_k(3)]) == {_k(3)}
    assert tier(stack, "disk").contains([_k(3)]) == set()


def test_write_through_and_delete_everywhere(tmp_path: Path, redis_url: str,
                                             prefix: str) -> None:
    stack = _stack(tmp_path, redis_url, prefix)
    stack.put_many({_k(1): make_page(1), _k(2): make_page(2)})
    for name, store in stack.tiers:
        assert store.contains([_k(1), _k(2)]) == {_k(1), _k(2)}, name
    assert stack.contains([_k(1), _k(9)]) == {_k(1)}
    stack.delete([_k(1)])
    for name, store in stack.tiers:
        assert store.contains([_k(1), _k(2)]) == {_k(2)}, name
    assert stack.stats().entries == 1


def test_redis_down_falls_back_to_disk(tmp_path: Path) -> None:
    from lab.processes import start_redis

    url, stop = start_redis(tmp_path)
    stack = TieredKVStore([("redis", RedisKVStore(url, attempts=1)),
                           ("disk", DiskKVStore(tmp_path / "kv", 1 << 30))])
    stack.put_many({_k(1): make_page(1)})
    stop()
    assert set(stack.get_many([_k(1)])) == {_k(1)}
    assert stack.tier_stats()["redis"].errors >= 1


def test_factory_layouts(tmp_path: Path, redis_url: str) -> None:
    def names(store: TieredKVStore) -> list[str]:
        return [n for n, _ in store.tiers]

    embedded = build_kv_store(tmp_path, memory_bytes=1 << 20, disk_bytes=1 << 30,
                              redis_url=None)
    assert names(embedded) == ["memory", "disk"]
    assert isinstance(tier(embedded, "disk"), DiskKVStore)
    assert (tmp_path / "kv").is_dir()
    full = build_kv_store(tmp_path, memory_bytes=1 << 20, disk_bytes=1 << 30,
                          redis_url=redis_url, redis_ttl_s=60)
    assert names(full) == ["memory", "redis", "disk"]
    remote = build_kv_store(tmp_path, memory_bytes=0, disk_bytes=0, redis_url=redis_url)
    assert names(remote) == ["redis"]
    with pytest.raises(ValueError):
        build_kv_store(tmp_path, memory_bytes=1, disk_bytes=0, redis_url=None)


def test_quantized_stack_serves_identical_tensors_from_every_tier(tmp_path: Path) -> None:
    stack = build_kv_store(tmp_path, memory_bytes=1 << 28, disk_bytes=1 << 30,
                           redis_url=None, quantize=True)
    page = make_page(4)
    stack.put_many({_k(4): page})
    from_memory = stack.get_many([_k(4)])[_k(4)]
    tier(stack, "memory").delete([_k(4)])
    from_disk = stack.get_many([_k(4)])[_k(4)]
    assert_same_page(from_memory, from_disk)
