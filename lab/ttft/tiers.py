"""The page-KV tiers of the TTFT benchmark: pages stored once, loaded per request.

Every tier is the real store from `storage/kv`: `memory` (MemoryKVStore, returns the held
objects), `disk` (DiskKVStore; the entries' pages are dropped from the OS page cache with
`posix_fadvise(DONTNEED)` before every load, so each load reads the device: a cold read, not
a page-cache copy) and `redis` (RedisKVStore against a real `redis-server` started for the
run on a loopback port, stopped at exit).

Public API:
  BenchTiers(names, workdir)   context manager;  .put(pages, tag, only=None) -> keys,
                               .load(tier, keys) -> (pages, seconds), .names,
                               .bytes_per_page: {tier: bytes of the tensors a page loads as,
                               its latest load's mean (int8 scales included)}
  TIER_NOTES: dict[str, str]   how each tier is set up (recorded in the results)
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType

import torch

from conduit_core.page_kv import PageKV
from storage.keys import PageHash
from storage.kv import DiskKVStore, KVStore, MemoryKVStore, RedisKVStore

TIER_NOTES = {
    "memory": "in-process LRU (objects held, no copy)",
    "disk": "safetensors files + xxh3 checksum, OS page cache dropped before each load "
            "(posix_fadvise DONTNEED)",
    "redis": "redis-server on loopback, entries split per layer, pipelined",
}
_UNLIMITED = 1 << 40


def _drop_page_cache(path: Path) -> None:
    """Ask the kernel to forget the cached pages of `path` (it is clean: fsynced)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


class BenchTiers:
    """Open the named tiers under `workdir`; see the module docstring."""

    def __init__(self, names: Sequence[str], workdir: Path) -> None:
        unknown = [n for n in names if n not in TIER_NOTES]
        if unknown:
            raise ValueError(f"unknown tiers {unknown}; known: {sorted(TIER_NOTES)}")
        self.names = list(names)
        self.workdir = Path(workdir)
        self.stores: dict[str, KVStore] = {}
        self.bytes_per_page: dict[str, int] = {}
        self._stops: list[Callable[[], None]] = []

    def __enter__(self) -> BenchTiers:
        try:
            for name in self.names:
                self.stores[name] = self._open(name)
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def _open(self, name: str) -> KVStore:
        if name == "memory":
            return MemoryKVStore(_UNLIMITED)
        if name == "disk":
            return DiskKVStore(self.workdir / "kv", _UNLIMITED)
        from lab.processes import start_redis  # a real server, as the tests use

        url, stop = start_redis(self.workdir)
        self._stops.append(stop)
        return RedisKVStore(url)

    def close(self) -> None:
        """Stop the servers this object started."""
        while self._stops:
            self._stops.pop()()

    def put(self, pages: Sequence[PageKV], tag: str = "",
            only: str | None = None) -> list[PageHash]:
        """Store `pages` in every tier (or only in tier `only`); returns their keys."""
        keys = [PageHash(hashlib.sha256(f"ttft-bench/{tag}/{i}".encode()).hexdigest())
                for i in range(len(pages))]
        items = dict(zip(keys, pages, strict=True))
        for name, store in self.stores.items():
            if only is not None and name != only:
                continue
            store.put_many(items)
            if len(store.contains(keys)) != len(keys):
                raise RuntimeError(f"tier {name} did not keep the benchmark pages")
        return keys

    def load(self, tier: str, keys: Sequence[PageHash]) -> tuple[list[PageKV], float]:
        """The pages of `keys` from `tier`, and the seconds the load took (a miss raises)."""
        store = self.stores[tier]
        if isinstance(store, DiskKVStore):
            for key in keys:
                _drop_page_cache(store.path(key))
        t0 = time.perf_counter()
        got = store.get_many(list(keys))
        seconds = time.perf_counter() - t0
        missing = [k for k in keys if k not in got]
        if missing:
            raise RuntimeError(f"tier {tier} lost {len(missing)} benchmark pages")
        pages = [got[k] for k in keys]
        self.bytes_per_page[tier] = sum(p.nbytes for p in pages) // max(1, len(pages))
        return pages, seconds


def sync(device: torch.device) -> None:
    """Wait for queued device work (CUDA) so wall-clock timings are complete."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
