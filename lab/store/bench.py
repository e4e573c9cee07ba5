"""Store benchmark: each KV tier's write/read MB/s against the raw ceiling measured alike.

For `pages` random pages of the given shape, each tier writes the batch (`put_many`) and reads
it back (`get_many`). In the same run, interleaved with the tier runs, the same encoded bytes
go through the plain path underneath the tier:
  disk:   one file per page, write + fsync; read = one `readinto` of the whole file into a
          buffer allocated the way the tier allocates its own;
  redis:  one SET / GET per page of the page's bytes, all in one pipeline, same client library;
  memory: a bytes copy (the tier keeps references, so it beats this "ceiling" by far).
MB/s counts the encoded entry bytes on both sides; each figure is the best of `repeats`,
with the raw and tier runs of an operation back to back in alternating order.

    conduit-lab bench store      # writes lab/store/results/store.json
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import redis
import torch

from conduit_core.page_kv import ModelFingerprint, PageKV
from storage.keys import PageHash
from storage.kv.codec import encode_page
from storage.kv.disk import DiskKVStore
from storage.kv.memory import MemoryKVStore
from storage.kv.redis_store import RedisKVStore


def _pages(n: int, tokens: int, layers: int, kv_heads: int, head_dim: int, hidden: int,
           dtype: torch.dtype) -> dict[PageHash, PageKV]:
    fp = ModelFingerprint(name="bench", revision="0", dtype=str(dtype).removeprefix("torch."),
                          config_hash="0" * 64, template_version="bench")
    g = torch.Generator().manual_seed(0)
    out: dict[PageHash, PageKV] = {}
    for i in range(n):
        out[PageHash(f"{i:04x}" + "b" * 60)] = PageKV(
            embeds=torch.randn(tokens, hidden, generator=g).to(dtype),
            keys=torch.randn(layers, kv_heads, tokens, head_dim, generator=g).to(dtype),
            values=torch.randn(layers, kv_heads, tokens, head_dim, generator=g).to(dtype),
            position_ids=torch.arange(tokens).expand(3, tokens).clone(),
            token_ids=torch.arange(tokens), image_grid=torch.tensor([1, 16, 16]),
            fingerprint=fp)
    return out


def _seconds(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    result = fn()
    dt = time.perf_counter() - t0
    del result  # freeing what was read is not part of the operation
    return dt


class _Timer:
    """Best-of-N seconds per (tier, op, side); tier and raw runs alternate their order."""

    def __init__(self) -> None:
        self.best: dict[tuple[str, str, str], float] = {}
        self.round = 0

    def pair(self, tier: str, op: str, raw_fn: Callable[[], object],
             tier_fn: Callable[[], object]) -> None:
        """Time the raw and the tier side of one operation, in alternating order."""
        sides = [("raw", raw_fn), ("tier", tier_fn)]
        for side, fn in sides if self.round % 2 == 0 else sides[::-1]:
            key = (tier, op, side)
            self.best[key] = min(_seconds(fn), self.best.get(key, float("inf")))


def _disk_cases(timer: _Timer, pages: dict[PageHash, PageKV], blobs: list[bytes],
                work: Path) -> None:
    store_root, raw_root = work / "store", work / "raw"
    for d in (store_root, raw_root):  # remove files, keep the (shard) directories
        d.mkdir(parents=True, exist_ok=True)
        for f in d.rglob("*"):
            if f.is_file():
                f.unlink()

    def raw_write() -> None:
        for i, blob in enumerate(blobs):
            fd = os.open(raw_root / f"{i}.bin", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            view = memoryview(blob)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
            os.close(fd)

    def raw_read() -> list[np.ndarray]:
        bufs = []  # kept, like the pages a tier read returns
        for i, blob in enumerate(blobs):
            with open(raw_root / f"{i}.bin", "rb", buffering=0) as f:
                buf = np.empty(len(blob), dtype=np.uint8)  # the tier's own allocation
                f.readinto(buf.data)
                bufs.append(buf)
        return bufs

    keys = list(pages)
    store = DiskKVStore(store_root, 1 << 40)
    timer.pair("disk", "write", raw_write, lambda: store.put_many(pages))
    os.sync()  # no writeback of the files just written during the reads
    timer.pair("disk", "read", raw_read, lambda: store.get_many(keys))


def _redis_cases(timer: _Timer, pages: dict[PageHash, PageKV], blobs: list[bytes],
                 url: str) -> None:
    prefix = f"bench:{uuid.uuid4().hex[:8]}"
    client = redis.Redis.from_url(url)
    store = RedisKVStore(url, prefix=prefix)
    keys = list(pages)
    raw_keys = [f"{prefix}:raw:{i}" for i in range(len(blobs))]

    def raw_write() -> None:
        pipe = client.pipeline(transaction=False)
        for k, blob in zip(raw_keys, blobs, strict=True):
            pipe.set(k, blob)
        pipe.execute()

    def raw_read() -> list[Any]:
        pipe = client.pipeline(transaction=False)
        for k in raw_keys:
            pipe.get(k)
        return pipe.execute()

    try:
        timer.pair("redis", "write", raw_write, lambda: store.put_many(pages))
        timer.pair("redis", "read", raw_read, lambda: store.get_many(keys))
    finally:
        client.delete(*raw_keys)
        store.delete(keys)
        client.close()
        store.close()


def _memory_cases(timer: _Timer, pages: dict[PageHash, PageKV], blobs: list[bytes]) -> None:
    store = MemoryKVStore(1 << 40)
    keys = list(pages)
    timer.pair("memory", "write", lambda: [bytearray(b) for b in blobs],
               lambda: store.put_many(pages))
    timer.pair("memory", "read", lambda: [bytearray(b) for b in blobs],
               lambda: store.get_many(keys))


def run_store_bench(*, pages: int = 16, tokens_per_page: int = 256, layers: int = 28,
                    kv_heads: int = 4, head_dim: int = 128, hidden: int = 3584,
                    dtype: str = "bfloat16", redis_url: str | None = None,
                    out: Path | None = None, repeats: int = 7) -> dict[str, Any]:
    """Measure every tier against its raw ceiling; print a table, write JSON to `out`.

    The default shape is a Qwen2-7B-class LM page of 256 visual tokens (28 layers x 4 KV
    heads x 128, bf16: about 16.5 MB per page with its embeddings). Without `redis_url` a
    temporary redis-server is started (and stopped) for the run.
    """
    torch.set_num_threads(1)
    load = os.getloadavg()[0]
    tdtype = getattr(torch, dtype)
    batch = _pages(pages, tokens_per_page, layers, kv_heads, head_dim, hidden, tdtype)
    blobs = [encode_page(p).to_bytes() for p in batch.values()]
    total = sum(len(b) for b in blobs)
    stop: Callable[[], None] | None = None
    work = Path(tempfile.mkdtemp(prefix="conduit-bench-store-"))
    try:
        if redis_url is None:
            from lab.processes import start_redis

            redis_url, stop = start_redis(work / "redis")
        with redis.Redis.from_url(redis_url) as probe:
            redis_version = str(probe.info("server").get("redis_version"))
        timer = _Timer()
        for i in range(repeats):
            timer.round = i
            _memory_cases(timer, batch, blobs)
            _disk_cases(timer, batch, blobs, work / "disk")
            _redis_cases(timer, batch, blobs, redis_url)
    finally:
        if stop is not None:
            stop()
        shutil.rmtree(work, ignore_errors=True)
    rows = []
    for tier in ("memory", "disk", "redis"):
        for op in ("write", "read"):
            tier_mb = total / timer.best[(tier, op, "tier")] / 1e6
            raw_mb = total / timer.best[(tier, op, "raw")] / 1e6
            rows.append({"tier": tier, "op": op, "mb_per_s": round(tier_mb, 2),
                         "raw_mb_per_s": round(raw_mb, 2),
                         "fraction": round(tier_mb / raw_mb, 3)})
    result: dict[str, Any] = {
        "config": {"pages": pages, "tokens_per_page": tokens_per_page, "layers": layers,
                   "kv_heads": kv_heads, "head_dim": head_dim, "hidden": hidden,
                   "dtype": dtype, "bytes_per_page": total // pages, "total_bytes": total,
                   "repeats": repeats, "statistic": "best of repeats", "torch_threads": 1,
                   "cpus": os.cpu_count(), "load_avg_1m_at_start": round(load, 2),
                   "redis_version": redis_version},
        "rows": rows,
    }
    print(f"{'tier':8} {'op':6} {'MB/s':>10} {'raw MB/s':>10} {'fraction':>9}")
    for r in rows:
        print(f"{r['tier']:8} {r['op']:6} {r['mb_per_s']:>10.1f} {r['raw_mb_per_s']:>10.1f} "
              f"{r['fraction']:>9.3f}")
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2) + "\n")
    return result

