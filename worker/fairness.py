"""Fair sharing between tenants: what one tenant may hold at once (`TenantSlots`: its answers in
flight, its uploads being checked) and a queue served least-recently-served first across
tenants (`TenantQueue`: the embedded ingest queue, the answer engine's admission).

A tenant past its cap is refused at once (`TenantBusyError`, 429 with Retry-After), never
queued; a cap of 0 is unlimited, and the caps come from the settings (`answer_cap`,
`queued_documents_cap`). The queue keeps each tenant's items in arrival order and takes the
next item from the tenant served least recently, so one tenant's burst cannot starve another.
"""

from __future__ import annotations

import itertools
import threading
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Generic, TypeVar

from worker.errors import WorkerError
from worker.settings import Settings

T = TypeVar("T")


class TenantBusyError(WorkerError):
    """The tenant already holds as much as one tenant may at once: retry later."""

    http_status = 429
    retry_after_s = 5


class TenantSlots:
    """At most `cap` holds per tenant at once (0: unlimited). Thread-safe.

    `hold(tenant, already)` counts `already` (what the tenant holds elsewhere, e.g. its
    documents queued in the metadata store) with the holds taken here; beyond `cap` it raises
    `TenantBusyError` naming `what` and the `setting` that sets the cap, and holds nothing.
    """

    def __init__(self, cap: int, what: str, setting: str) -> None:
        self.cap = cap
        self._what = what
        self._setting = setting
        self._held: dict[str, int] = {}
        self._lock = threading.Lock()

    @contextmanager
    def hold(self, tenant: str, already: int = 0) -> Iterator[None]:
        """Take one slot of `tenant` for the block; `TenantBusyError` when none is free."""
        with self._lock:
            now = self._held.get(tenant, 0)
            if self.cap and now + already >= self.cap:
                raise TenantBusyError(
                    f"this API key already has {now + already} {self._what} (at most "
                    f"{self.cap} at once, {self._setting}); retry when one ends")
            self._held[tenant] = now + 1
        try:
            yield
        finally:
            with self._lock:
                left = self._held[tenant] - 1
                if left:
                    self._held[tenant] = left
                else:
                    del self._held[tenant]

    def held(self, tenant: str) -> int:
        """The slots `tenant` holds now."""
        with self._lock:
            return self._held.get(tenant, 0)


def answer_cap(settings: Settings, keyed: bool) -> int:
    """Answers one tenant may have active or queued (0: unlimited): the setting, or unset,
    half of the engine's slots when API keys are configured (`keyed`), unlimited without."""
    if settings.worker.max_answers_per_tenant is not None:
        return settings.worker.max_answers_per_tenant
    return max(1, settings.worker.max_active_answers // 2) if keyed else 0


def queued_documents_cap(settings: Settings, keyed: bool) -> int:
    """Documents one tenant may have queued or in ingestion (0: unlimited): the setting, or
    unset, 16 when API keys are configured (`keyed`), unlimited without."""
    if settings.worker.max_queued_documents_per_tenant is not None:
        return settings.worker.max_queued_documents_per_tenant
    return 16 if keyed else 0


class TenantQueue(Generic[T]):
    """Items queued per tenant, first in first out within a tenant; across tenants the next
    item is the head of the tenant served least recently (a tenant never served first, the
    oldest head breaking ties). So a tenant that queued many items gets every other turn,
    not the whole queue, as soon as another tenant queues one. Not thread-safe: the owner
    holds its own lock."""

    def __init__(self) -> None:
        self._queues: dict[str, deque[tuple[int, T]]] = {}
        self._served: dict[str, int] = {}  # tenant -> tick of its last pop
        self._seq = itertools.count(1)
        self._ticks = itertools.count(1)

    def push(self, tenant: str, item: T) -> None:
        """Queue `item` behind `tenant`'s earlier items."""
        self._queues.setdefault(tenant, deque()).append((next(self._seq), item))

    def _next_tenant(self) -> str | None:
        if not self._queues:
            return None
        return min(self._queues,
                   key=lambda t: (self._served.get(t, 0), self._queues[t][0][0]))

    def peek(self) -> T | None:
        """The item `pop` would return, or None when empty."""
        tenant = self._next_tenant()
        return None if tenant is None else self._queues[tenant][0][1]

    def pop(self) -> T:
        """Take the next item (`IndexError` when empty); its tenant becomes the most
        recently served."""
        tenant = self._next_tenant()
        if tenant is None:
            raise IndexError("pop from an empty TenantQueue")
        queue = self._queues[tenant]
        _, item = queue.popleft()
        if not queue:
            del self._queues[tenant]
        self._served[tenant] = next(self._ticks)
        return item

    def remove(self, item: T) -> None:
        """Drop `item` (compared by identity) wherever it waits; no error if absent."""
        for tenant, queue in list(self._queues.items()):
            kept = deque(e for e in queue if e[1] is not item)
            if len(kept) != len(queue):
                if kept:
                    self._queues[tenant] = kept
                else:
                    del self._queues[tenant]
                return

    def clear(self) -> None:
        """Drop every queued item (the turns already taken are kept)."""
        self._queues.clear()

    def __len__(self) -> int:
        return sum(len(q) for q in self._queues.values())

    def __iter__(self) -> Iterator[T]:
        """Every queued item, oldest first."""
        entries = sorted((e for q in self._queues.values() for e in q), key=lambda e: e[0])
        return iter([item for _, item in entries])
