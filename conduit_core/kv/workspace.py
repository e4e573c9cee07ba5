"""The runtime's workspace for assembled KV caches: buffers kept between requests and reused.

A request's prefill needs one batch-1 `KVCache` (every layer's keys and values for its
prompt and answer). Allocating it per request costs an allocation (on the CPU, large blocks
are mapped afresh and faulted in page by page; on a GPU, a caching-allocator lookup or a
device allocation) and, for the compiled passes, needs the same strides every time. The
workspace (one per loaded model: one dtype and device) keeps the caches that requests gave
back and hands one out (`take`) to the next request of the same capacity; it allocates only
when none of that capacity is idle.

What it decides:
* A cache is out (lent) from `take` until `give`; only a lent cache is taken back, and only
  once, so two requests never hold the same buffer, whatever a caller gives twice. The
  workspace keeps no reference to a lent cache: one never given back is freed with its last
  user (not reused, never leaked).
* Idle caches take at most `max_bytes` together; a cache given back past that evicts the
  longest idle ones (oldest first), and one larger than `max_bytes` is dropped.
  `max_bytes = 0` keeps nothing: every `take` allocates, as a fresh cache per request did.
* A cache comes back as its last user left it: like a fresh `torch.empty` one, its contents
  are undefined, and every position is written before it is read (`KVCache.allocate`).
  Handing one back is safe as soon as no later operation of its user reads it: the device's
  work on it is ordered before the next user's on the same stream.

When a request gives its cache back is the runtime's decision (`conduit_core.runtime`).
"""

from __future__ import annotations

import weakref
from collections import OrderedDict

from conduit_core.kv.kv_cache import KVCache
from conduit_core.model.adapters.base import VLMAdapter


class KVWorkspace:
    """Idle batch-1 caches of one adapter's dtype and device, bounded by `max_bytes`
    (module docstring)."""

    def __init__(self, adapter: VLMAdapter, max_bytes: int):
        if max_bytes < 0:
            raise ValueError("max_bytes must be >= 0")
        self.adapter = adapter
        self.max_bytes = max_bytes
        self._idle: OrderedDict[int, KVCache] = OrderedDict()  # by id, oldest first
        self._lent: weakref.WeakValueDictionary[int, KVCache] = weakref.WeakValueDictionary()

    @property
    def idle_bytes(self) -> int:
        """Bytes the idle caches hold."""
        return sum(_nbytes(cache) for cache in self._idle.values())

    def take(self, capacity: int) -> KVCache:
        """A batch-1 cache of `capacity` positions in the adapter's dtype and device, lent
        until `give`: an idle one of that capacity if any (the most recently given back),
        else a new one. Its contents are undefined."""
        found = next((i for i in reversed(self._idle) if self._idle[i].capacity == capacity),
                     None)
        cache = (self._idle.pop(found) if found is not None
                 else KVCache.allocate(self.adapter, 1, capacity))
        self._lent[id(cache)] = cache
        return cache

    def give(self, cache: KVCache) -> bool:
        """Take back a cache lent by `take` for the next request of its capacity; False (and
        nothing kept) for a cache not lent now: another's, or one given back already."""
        if self._lent.get(id(cache)) is not cache:
            return False
        del self._lent[id(cache)]
        size = _nbytes(cache)
        if size > self.max_bytes:
            return True
        held = self.idle_bytes
        while self._idle and held + size > self.max_bytes:
            held -= _nbytes(self._idle.popitem(last=False)[1])
        self._idle[id(cache)] = cache
        return True


def _nbytes(cache: KVCache) -> int:
    return 2 * cache.keys.numel() * cache.keys.element_size()
