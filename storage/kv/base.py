"""The batched `KVStore` protocol every page-KV tier implements, and its statistics."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from conduit_core.page_kv import PageKV
from storage.keys import PageHash


@dataclass(frozen=True)
class TierStats:
    """Counters of one tier since it was opened, plus what it holds now.

    hits/misses count keys asked for by `get_many`; `corrupt` counts entries that failed
    verification (each also counted as a miss and removed); `errors` counts I/O failures that
    were absorbed (the call degraded to a miss or a skipped write); `bytes`/`entries` describe
    the current contents as far as the tier can tell (`entries` is -1 where counting would
    cost a scan: the Redis tier).
    """

    hits: int = 0
    misses: int = 0
    bytes: int = 0
    entries: int = 0
    evictions: int = 0
    corrupt: int = 0
    errors: int = 0


@runtime_checkable
class KVStore(Protocol):
    """A page-hash keyed store of `PageKV`s; every call is batched.

    Returned `PageKV`s may be shared with other callers (the memory tier hands out the object
    it holds): treat them as immutable and clone before modifying tensors in place.
    """

    def get_many(self, keys: Sequence[PageHash]) -> dict[PageHash, PageKV]:
        """The entries found; misses (including corrupt or partial entries) are absent."""
        ...

    def put_many(self, items: Mapping[PageHash, PageKV]) -> None:
        """Store entries (an existing entry under the same hash may be kept or replaced)."""
        ...

    def contains(self, keys: Sequence[PageHash]) -> set[PageHash]:
        """Which of `keys` are (probably) present, without reading them."""
        ...

    def delete(self, keys: Iterable[PageHash]) -> None:
        """Remove entries; absent keys are ignored."""
        ...

    def stats(self) -> TierStats:
        """Counters and current size."""
        ...


class Counters:
    """Thread-safe hit/miss/eviction/corrupt/error counters behind `TierStats`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.hits = self.misses = self.evictions = self.corrupt = self.errors = 0

    def add(self, *, hits: int = 0, misses: int = 0, evictions: int = 0, corrupt: int = 0,
            errors: int = 0) -> None:
        """Increment counters atomically."""
        with self._lock:
            self.hits += hits
            self.misses += misses
            self.evictions += evictions
            self.corrupt += corrupt
            self.errors += errors

    def snapshot(self, *, bytes_: int, entries: int) -> TierStats:
        """A `TierStats` of the counters and the given current size."""
        with self._lock:
            return TierStats(hits=self.hits, misses=self.misses, bytes=bytes_, entries=entries,
                             evictions=self.evictions, corrupt=self.corrupt, errors=self.errors)
