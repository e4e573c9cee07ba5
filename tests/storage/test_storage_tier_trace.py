"""Which tier served each page (`get_many_traced`) and which tiers hold it (`tiers_holding`):
the facts an answer's cache report and the page list are built from."""

from __future__ import annotations

from pathlib import Path

from storage.keys import PageHash
from storage.kv.disk import DiskKVStore
from storage.kv.memory import MemoryKVStore
from storage.kv.redis_store import RedisKVStore
from storage.kv.tiered import TieredKVStore
from tests.storage.kv_testkit import assert_same_page, make_page, tier


def _k(i: int) -> PageHash:
    return PageHash(f"{i:02x}" + "ab" * 31)


def _stack(tmp_path: Path, redis_url: str, prefix: str) -> TieredKVStore:
    return TieredKVStore([("memory", MemoryKVStore(1 << 28)),
                          ("redis", RedisKVStore(redis_url, prefix=prefix)),
                          ("disk", DiskKVStore(tmp_path / "kv", 1 << 30))])


def test_traced_read_names_the_serving_tier_then_memory_after_promotion(
        tmp_path: Path, redis_url: str, prefix: str) -> None:
    stack = _stack(tmp_path, redis_url, prefix)
    pages = {i: make_page(i) for i in (1, 2, 3)}
    tier(stack, "memory").put_many({_k(1): pages[1]})
    tier(stack, "redis").put_many({_k(2): pages[2]})
    tier(stack, "disk").put_many({_k(3): pages[3]})
    found, served = stack.get_many_traced([_k(1), _k(2), _k(3), _k(4), _k(2)])
    assert served == {_k(1): "memory", _k(2): "redis", _k(3): "disk"}
    assert set(found) == {_k(1), _k(2), _k(3)}
    for i in (1, 2, 3):
        assert_same_page(pages[i], found[_k(i)])
    _, again = stack.get_many_traced([_k(2), _k(3)])
    assert again == {_k(2): "memory", _k(3): "memory"}  # promoted by the first read
    assert (stack.stats().hits, stack.stats().misses) == (5, 1)


def test_tiers_holding_lists_every_tier_fastest_first(tmp_path: Path, redis_url: str,
                                                      prefix: str) -> None:
    stack = _stack(tmp_path, redis_url, prefix)
    stack.put_many({_k(5): make_page(5)})
    tier(stack, "disk").put_many({_k(6): make_page(6)})
    tier(stack, "memory").delete([_k(5)])
    held = stack.tiers_holding([_k(5), _k(6), _k(7)])
    assert held == {_k(5): ["redis", "disk"], _k(6): ["disk"], _k(7): []}
    assert stack.tier_stats()["disk"].hits == 0  # nothing was read
