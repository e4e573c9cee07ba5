"""Finding 7 and the KV fault cases: bytes changed on disk or in Redis are never served.

Before the fix, disk entries were mapped copy-on-write and promoted by reference into the
memory tier: bytes flipped on disk after a load changed the next read, corruption counter 0.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import redis

from lab.processes import start_redis
from storage.keys import PageHash
from storage.kv import DiskKVStore, MemoryKVStore, RedisKVStore, TieredKVStore
from tests.storage.kv_testkit import assert_same_page, make_page

KEY = PageHash("ab" * 32)


def _flip(path: Path, offset_from_end: int = 100) -> None:
    """Change one byte of the file in place (as a bad disk or a stray writer would)."""
    with open(path, "r+b") as f:
        f.seek(-offset_from_end, 2)
        byte = f.read(1)
        f.seek(-offset_from_end, 2)
        f.write(bytes([byte[0] ^ 0xFF]))


def test_bytes_flipped_on_disk_after_a_load_are_never_served(tmp_path: Path) -> None:
    page = make_page(1)
    DiskKVStore(tmp_path, 1 << 30).put_many({KEY: page})
    disk = DiskKVStore(tmp_path, 1 << 30)
    stack = TieredKVStore([("memory", MemoryKVStore(1 << 30)), ("disk", disk)])
    first = stack.get_many([KEY])[KEY]  # read from disk, promoted into memory
    _flip(disk.path(KEY))
    again = stack.get_many([KEY])[KEY]  # served from memory
    assert_same_page(first, page)
    assert_same_page(again, page)


def test_bytes_flipped_on_disk_before_a_load_are_a_counted_miss(tmp_path: Path) -> None:
    disk = DiskKVStore(tmp_path, 1 << 30)
    disk.put_many({KEY: make_page(2)})
    _flip(disk.path(KEY))
    assert disk.get_many([KEY]) == {}
    assert disk.stats().corrupt == 1
    assert not disk.path(KEY).exists()  # removed: the next read recomputes


def test_an_altered_redis_value_is_a_counted_miss_and_removed(tmp_path: Path) -> None:
    url, stop = start_redis(tmp_path)
    try:
        prefix = f"t{uuid.uuid4().hex[:8]}"
        store = RedisKVStore(url, prefix=prefix)
        store.put_many({KEY: make_page(3)})
        raw = redis.Redis.from_url(url)
        layer = f"{prefix}:{{{KEY}}}:0"
        value = bytearray(raw.get(layer) or b"")
        value[len(value) // 2] ^= 0xFF
        raw.set(layer, bytes(value))
        assert store.get_many([KEY]) == {}
        assert store.stats().corrupt == 1
        assert raw.keys(f"{prefix}:*") == []
        store.close()
    finally:
        stop()
