"""Page-KV store: a batched `KVStore` protocol with memory, Redis, disk and tiered stores."""

from storage.kv.base import KVStore, TierStats
from storage.kv.codec import decode_page, encode_page
from storage.kv.disk import DiskKVStore
from storage.kv.factory import build_kv_store
from storage.kv.memory import MemoryKVStore
from storage.kv.redis_store import RedisKVStore
from storage.kv.tiered import TieredKVStore

__all__ = [
    "DiskKVStore", "KVStore", "MemoryKVStore", "RedisKVStore", "TierStats", "TieredKVStore",
    "build_kv_store", "decode_page", "encode_page",
]
