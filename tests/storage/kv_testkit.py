"""Shared helpers of the storage tests: realistic random `PageKV`s, process workers, and what
the tests read of a store that the product never asks (a tier by name, a SCAN of Redis)."""

from __future__ import annotations

from pathlib import Path

import redis
import torch

from conduit_core.page_kv import ModelFingerprint, PageKV
from storage.kv.base import KVStore
from storage.kv.tiered import TieredKVStore

FINGERPRINT = ModelFingerprint(name="Qwen/Qwen2-VL-2B-Instruct", revision="abc123",
                               dtype="bfloat16", config_hash="f" * 64, template_version="page-v1")

# (tokens, layers, kv_heads, head_dim, hidden): a small shape for logic tests and the shape of
# a 2B Qwen2-VL page capped at 256 visual tokens (28 layers x 2 KV heads x 128 dims).
SMALL = (24, 3, 2, 16, 64)
QWEN2VL_2B = (256, 28, 2, 128, 1536)


def make_page(seed: int = 0, shape: tuple[int, int, int, int, int] = SMALL,
              dtype: torch.dtype = torch.bfloat16,
              fingerprint: ModelFingerprint = FINGERPRINT) -> PageKV:
    """A page with random tensors of `shape` = (tokens, layers, kv_heads, head_dim, hidden)."""
    t, layers, heads, dim, hidden = shape
    g = torch.Generator().manual_seed(seed)
    start = 4 + seed % 7
    pos = torch.arange(start, start + t).expand(3, t).clone()
    return PageKV(
        embeds=torch.randn(t, hidden, generator=g).to(dtype),
        keys=(torch.randn(layers, heads, t, dim, generator=g) * 3).to(dtype),
        values=torch.randn(layers, heads, t, dim, generator=g).to(dtype),
        position_ids=pos,
        token_ids=torch.randint(0, 150_000, (t,), generator=g),
        image_grid=torch.tensor([1, 2 * t // 8, 8], dtype=torch.int64),
        fingerprint=fingerprint,
    )


def assert_same_page(a: PageKV, b: PageKV) -> None:
    """Bit-exact equality of every tensor (int8 scales included), dtype and the fingerprint."""
    assert a.fingerprint == b.fingerprint
    assert a.quantized == b.quantized and a.compute_dtype == b.compute_dtype
    names = ("embeds", "keys", "values", "position_ids", "token_ids", "image_grid")
    for name in names + (("key_scale", "value_scale") if a.quantized else ()):
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and x.shape == y.shape, name
        x, y = x.contiguous(), y.contiguous()
        assert torch.equal(x.view(torch.uint8) if x.dtype.is_floating_point else x,
                           y.view(torch.uint8) if y.dtype.is_floating_point else y), name


def disk_writer(root: str, key: str, page: PageKV, barrier: object, rounds: int) -> None:
    """Process target (fork): delete and rewrite the same page in a disk store `rounds` times.

    The page comes from the parent through fork, so the child runs no parallel torch kernel
    (OpenMP is not fork-safe once the parent has used it).
    """
    torch.set_num_threads(1)
    from storage.kv.disk import DiskKVStore

    barrier.wait()  # type: ignore[attr-defined]
    for _ in range(rounds):
        # delete then write: writers really overlap (a put skips a page already on disk)
        store = DiskKVStore(Path(root), 1 << 34, stale_tmp_s=3600)
        store.delete([key])  # type: ignore[list-item]
        store.put_many({key: page})  # type: ignore[dict-item]


def tier(stack: TieredKVStore, name: str) -> KVStore:
    """The tier of `stack` called `name` (`KeyError` if none)."""
    return dict(stack.tiers)[name]


def redis_entries(url: str, prefix: str = "conduit:kv") -> int:
    """Entries a Redis KV tier holds under `prefix`, counted by a SCAN (the store's own stats
    never scan)."""
    client = redis.Redis.from_url(url)
    try:
        return sum(1 for _ in client.scan_iter(match=f"{prefix}:*:h", count=1000))
    finally:
        client.close()
