"""Read-through, write-through stack of tiers, fastest first (memory -> Redis -> disk)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from conduit_core.page_kv import PageKV
from storage.keys import PageHash
from storage.kv.base import Counters, KVStore, TierStats


class TieredKVStore:
    """A `KVStore` over named tiers, fastest first.

    `get_many` asks each tier for what is still missing and copies every hit into the faster
    tiers that missed it (promotion); `put_many` and `delete` go to every tier. `stats()` counts
    hits/misses of the stack as a whole (a key found in any tier is a hit); `tier_stats()`
    gives each tier's own counters by name, for metrics.
    """

    def __init__(self, tiers: Sequence[tuple[str, KVStore]]) -> None:
        if not tiers:
            raise ValueError("a tiered store needs at least one tier")
        names = [name for name, _ in tiers]
        if len(set(names)) != len(names):
            raise ValueError(f"tier names must be unique: {names}")
        self.tiers: list[tuple[str, KVStore]] = list(tiers)
        self._counters = Counters()

    def get_many(self, keys: Sequence[PageHash]) -> dict[PageHash, PageKV]:
        """Read through the tiers, promoting hits into the faster tiers."""
        return self.get_many_traced(keys)[0]

    def get_many_traced(
        self, keys: Sequence[PageHash]
    ) -> tuple[dict[PageHash, PageKV], dict[PageHash, str]]:
        """`get_many`, also naming the tier that served each entry found (for an answer's
        cache report): `(entries, {key: tier name})`."""
        wanted = list(dict.fromkeys(keys))
        found: dict[PageHash, PageKV] = {}
        served_by: dict[PageHash, str] = {}
        for level, (name, store) in enumerate(self.tiers):
            missing = [k for k in wanted if k not in found]
            if not missing:
                break
            hits = store.get_many(missing)
            if hits:
                for _, faster in self.tiers[:level]:
                    faster.put_many(hits)
                found.update(hits)
                served_by.update(dict.fromkeys(hits, name))
        self._counters.add(hits=len(found), misses=len(wanted) - len(found))
        return found, served_by

    def put_many(self, items: Mapping[PageHash, PageKV]) -> None:
        """Write to every tier."""
        if items:
            for _, store in self.tiers:
                store.put_many(items)

    def contains(self, keys: Sequence[PageHash]) -> set[PageHash]:
        """Keys present in any tier."""
        present: set[PageHash] = set()
        for _, store in self.tiers:
            rest = [k for k in keys if k not in present]
            if not rest:
                break
            present |= store.contains(rest)
        return present

    def tiers_holding(self, keys: Sequence[PageHash]) -> dict[PageHash, list[str]]:
        """For each key, the names of the tiers that (probably) hold it, fastest first; an
        empty list when none does. Reads no entries."""
        holding: dict[PageHash, list[str]] = {k: [] for k in keys}
        for name, store in self.tiers:
            for key in store.contains(list(holding)):
                holding[key].append(name)
        return holding

    def delete(self, keys: Iterable[PageHash]) -> None:
        """Remove entries from every tier."""
        keys = list(keys)
        if keys:
            for _, store in self.tiers:
                store.delete(keys)

    def stats(self) -> TierStats:
        """Whole-stack hits/misses; bytes, evictions, corrupt and errors summed over tiers;
        entries is the largest tier's count (the stack holds at least that many pages)."""
        per = list(self.tier_stats().values())
        own = self._counters.snapshot(bytes_=0, entries=0)
        return TierStats(hits=own.hits, misses=own.misses, bytes=sum(s.bytes for s in per),
                         entries=max((s.entries for s in per), default=0),
                         evictions=sum(s.evictions for s in per),
                         corrupt=sum(s.corrupt for s in per), errors=sum(s.errors for s in per))

    def tier_stats(self) -> dict[str, TierStats]:
        """Each tier's own counters, by tier name."""
        return {name: store.stats() for name, store in self.tiers}
