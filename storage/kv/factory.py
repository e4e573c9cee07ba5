"""`build_kv_store`: the tier stack the service runs with.

Embedded (no Redis URL): memory LRU -> disk under `home/kv`.
Distributed (Redis URL): memory LRU -> Redis (shared by all workers) -> disk. The disk tier
is then a node-local cache behind Redis; pass `disk_bytes=0` for memory -> Redis only (e.g.
workers without a persistent volume). `memory_bytes=0` drops the memory tier. With
`quantize=True` Redis and disk hold int8 keys/values and the memory tier holds the same
dequantised tensors, so every tier serves identical pages.
"""

from __future__ import annotations

from pathlib import Path

from storage.kv.base import KVStore
from storage.kv.disk import DiskKVStore
from storage.kv.memory import MemoryKVStore
from storage.kv.redis_store import RedisKVStore
from storage.kv.tiered import TieredKVStore


def build_kv_store(home: Path, *, memory_bytes: int, disk_bytes: int, redis_url: str | None,
                   redis_ttl_s: int | None = None, quantize: bool = False) -> TieredKVStore:
    """Build the tier stack described in this module's docstring."""
    tiers: list[tuple[str, KVStore]] = []
    if memory_bytes > 0:
        tiers.append(("memory", MemoryKVStore(memory_bytes, quantize=quantize)))
    if redis_url:
        tiers.append(("redis", RedisKVStore(redis_url, ttl_s=redis_ttl_s, quantize=quantize)))
    if disk_bytes > 0 or not redis_url:
        if disk_bytes <= 0:
            raise ValueError("the embedded form (no Redis URL) needs disk_bytes > 0")
        tiers.append(("disk", DiskKVStore(Path(home) / "kv", disk_bytes, quantize=quantize)))
    return TieredKVStore(tiers)
