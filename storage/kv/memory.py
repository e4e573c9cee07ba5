"""In-process LRU tier with a byte budget, holding host memory only."""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence

from conduit_core.page_kv import PageKV
from storage.keys import PageHash
from storage.kv.base import Counters, TierStats
from storage.kv.codec import quantize_roundtrip

log = logging.getLogger(__name__)


class MemoryKVStore:
    """Thread-safe LRU of `PageKV` objects, evicting least recently used past `max_bytes`.

    Entries are held and returned by reference (no copy) once they are on the host: a page
    with tensors on an accelerator (a page prefilled in this process) is copied to host
    memory first, page-locked where CUDA is available (`PageKV.to_host`), so `max_bytes` is
    host memory whatever the device, and every page reaches the runtime the same way. With
    `quantize=True` each page is stored as an int8 tier would return it (int8 keys and
    values plus scales), so every tier of a quantised stack serves identical tensors. An
    entry larger than the whole budget is not cached.
    """

    def __init__(self, max_bytes: int, *, quantize: bool = False) -> None:
        if max_bytes < 0:
            raise ValueError("max_bytes must be >= 0")
        self.max_bytes = max_bytes
        self.quantize = quantize
        self._entries: OrderedDict[PageHash, PageKV] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self._counters = Counters()

    def get_many(self, keys: Sequence[PageHash]) -> dict[PageHash, PageKV]:
        """Entries found, each bumped to most recently used."""
        found: dict[PageHash, PageKV] = {}
        with self._lock:
            for key in keys:
                page = self._entries.get(key)
                if page is not None:
                    self._entries.move_to_end(key)
                    found[key] = page
        self._counters.add(hits=len(found), misses=len(keys) - len(found))
        return found

    def put_many(self, items: Mapping[PageHash, PageKV]) -> None:
        """Insert or replace entries, then evict down to the budget."""
        evicted = 0
        for key, page in items.items():
            page = page.to_host()
            if self.quantize and not page.quantized:
                page = quantize_roundtrip(page).to_host()
            size = page.nbytes
            if size > self.max_bytes:
                log.debug("page %s (%d bytes) exceeds the memory budget; not cached", key, size)
                continue
            with self._lock:
                old = self._entries.pop(key, None)
                if old is not None:
                    self._bytes -= old.nbytes
                self._entries[key] = page
                self._bytes += size
                while self._bytes > self.max_bytes:
                    _, victim = self._entries.popitem(last=False)
                    self._bytes -= victim.nbytes
                    evicted += 1
        self._counters.add(evictions=evicted)

    def contains(self, keys: Sequence[PageHash]) -> set[PageHash]:
        """Keys held now."""
        with self._lock:
            return {k for k in keys if k in self._entries}

    def delete(self, keys: Iterable[PageHash]) -> None:
        """Drop entries."""
        with self._lock:
            for key in keys:
                old = self._entries.pop(key, None)
                if old is not None:
                    self._bytes -= old.nbytes

    def stats(self) -> TierStats:
        """Counters and current size."""
        with self._lock:
            size, n = self._bytes, len(self._entries)
        return self._counters.snapshot(bytes_=size, entries=n)
