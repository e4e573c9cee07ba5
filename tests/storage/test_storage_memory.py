"""Memory tier: LRU under a byte budget, thread safety, int8 parity."""

from __future__ import annotations

import threading

import torch

from storage.keys import PageHash
from storage.kv.codec import quantize_roundtrip
from storage.kv.memory import MemoryKVStore
from tests.storage.kv_testkit import assert_same_page, make_page


def _k(i: int) -> PageHash:
    return PageHash(f"{i:064x}")


def test_round_trip_and_stats() -> None:
    page = make_page(1)
    store = MemoryKVStore(10 * page.nbytes)
    store.put_many({_k(1): page})
    got = store.get_many([_k(1), _k(2)])
    assert list(got) == [_k(1)] and got[_k(1)] is page
    assert store.contains([_k(1), _k(2)]) == {_k(1)}
    s = store.stats()
    assert (s.hits, s.misses, s.entries, s.bytes) == (1, 1, 1, page.nbytes)
    store.delete([_k(1), _k(3)])
    assert store.get_many([_k(1)]) == {} and store.stats().bytes == 0


def test_lru_eviction_under_byte_budget() -> None:
    pages = {_k(i): make_page(i) for i in range(4)}
    size = pages[_k(0)].nbytes
    store = MemoryKVStore(3 * size)
    store.put_many({k: pages[k] for k in (_k(0), _k(1), _k(2))})
    store.get_many([_k(0)])  # 1 is now least recently used
    store.put_many({_k(3): pages[_k(3)]})
    assert store.contains(list(pages)) == {_k(0), _k(2), _k(3)}
    s = store.stats()
    assert s.evictions == 1 and s.bytes == 3 * size and s.bytes <= store.max_bytes
    store.put_many({_k(9): make_page(9, (400, 3, 2, 16, 64))})  # larger than the budget
    assert store.contains([_k(9)]) == set() and store.stats().entries == 3


def test_concurrent_use_keeps_byte_accounting_exact() -> None:
    pages = [make_page(i) for i in range(6)]
    size = pages[0].nbytes
    store = MemoryKVStore(4 * size)

    def work(offset: int) -> None:
        for n in range(300):
            i = (n + offset) % 6
            store.put_many({_k(i): pages[i]})
            store.get_many([_k((i + 1) % 6), _k(i)])
            if n % 7 == 0:
                store.delete([_k((i + 2) % 6)])

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    s = store.stats()
    held = store.get_many([_k(i) for i in range(6)])
    assert s.bytes == size * len(held) <= store.max_bytes
    assert s.entries == len(held)


def test_quantized_memory_tier_serves_what_int8_tiers_serve() -> None:
    page = make_page(5)
    store = MemoryKVStore(10 * page.nbytes, quantize=True)
    store.put_many({_k(5): page})
    got = store.get_many([_k(5)])[_k(5)]
    assert_same_page(got, quantize_roundtrip(page))
    assert not torch.equal(got.keys, page.keys)
