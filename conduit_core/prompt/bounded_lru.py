"""A thread-safe, bounded least-recently-used map whose misses are computed by the caller.

The prompt head cache and the label cache keep tensors computed from the loaded model under
token-id keys; both need the same thing: a hit refreshes the entry, a miss is computed
outside the lock (two threads may compute the same entry; the values are equal, the last one
stays) and the oldest entries go beyond `max_entries`. The caller learns whether its value
was computed (a miss costs work it may have to account for).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class BoundedLRU(Generic[K, V]):
    """At most `max_entries` values, the least recently used dropped first."""

    def __init__(self, max_entries: int):
        if max_entries < 1:
            raise ValueError(f"max_entries must be >= 1, got {max_entries}")
        self.max_entries = max_entries
        self._entries: OrderedDict[K, V] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def clear(self) -> None:
        """Drop every entry."""
        with self._lock:
            self._entries.clear()

    def get_or_compute(self, key: K, compute: Callable[[], V]) -> tuple[V, bool]:
        """The value under `key`, and whether `compute()` made it now."""
        with self._lock:
            if key in self._entries:
                self._entries.move_to_end(key)
                return self._entries[key], False
        value = compute()
        with self._lock:
            self._entries[key] = value
            self._entries.move_to_end(key)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)
        return value, True
