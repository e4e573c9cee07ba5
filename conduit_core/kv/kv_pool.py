"""Decode slots: the caches of the answers being generated, side by side in one pair of
tensors, so that a batched decode step attends for all of them in one call per layer.

An answer's prefill fills its own `KVCache` (batch one, its own capacity). At its first decode
step, when a slot is free and the pool can hold it, its first `n_keys` positions are copied
into a slot once (`admit`: one copy per answer, never one per step) and its
`DecodeState.cache` becomes that slot, a view of the pool; its own cache is then free. The
occupied slots are always 0..size-1: an answer that ends (`release`) hands its slot to the
pool's last answer (one copy of that answer's cache), so a step's pooled rows read one view
of the pool with a mask, never a gathered copy.

The pool grows (slots doubling up to `max_slots`, positions a slot holds rounded up to
`POSITION_STEP`) while `slots * capacity <= max_positions`; an answer it cannot hold decodes
from its own cache on the per-sequence path of `batch_forward.forward_step`. Positions past an
answer's keys are zero in its slot (masked, but never NaN from uninitialised memory), and the
tensors are dropped when the last answer leaves, so an idle pool holds no memory.

A fixed pool (`fixed=True`, what a captured or compiled decode step needs:
`conduit_core.passes.step_graphs`) is allocated once at its largest, `max_slots` slots of
`max_positions // max_slots` positions (rounded down to `POSITION_STEP`), and kept while the
pool lives: its tensors never move, so a step captured over them stays valid; an answer longer
than a slot decodes from its own cache, its part of a step eager beside the pooled answers'
captured one (`conduit_core.decode.decode_step`).
"""

from __future__ import annotations

from typing import Protocol

import torch

from conduit_core.kv.kv_cache import KVCache
from conduit_core.model.adapters.base import VLMAdapter

POSITION_STEP = 64  # a slot's capacity grows in multiples of this


class PoolOwner(Protocol):
    """What the pool reads and sets of a decoding answer (`conduit_core.decode.DecodeState`
    is one): its cache (the slot's view once admitted), its slot, and how many of its
    positions hold keys."""

    cache: KVCache
    slot: int | None
    n_keys: int  # keys after its prefill
    picked: int  # tokens picked so far: n_keys + picked - 1 positions hold keys
    done: bool

    @property
    def kv_tokens(self) -> int:
        """Positions its cache needs to its last token."""


class DecodePool:
    """Slots 0..size-1 of one (L, slots, kv_heads, capacity, hd) pair, one decoding answer
    each (see the module docstring)."""

    def __init__(self, adapter: VLMAdapter, max_slots: int = 16, max_positions: int = 65536,
                 fixed: bool = False):
        if max_slots < 1 or max_positions < 1:
            raise ValueError("need max_slots >= 1 and max_positions >= 1")
        if fixed and max_positions // max_slots < POSITION_STEP:
            raise ValueError(f"a fixed pool needs max_positions >= {POSITION_STEP} * max_slots")
        self.adapter = adapter
        self.max_slots = max_slots
        self.max_positions = max_positions
        self.fixed = fixed
        self.keys: torch.Tensor | None = None  # (L, slots, kv_heads, capacity, hd)
        self.values: torch.Tensor | None = None
        self.owners: list[PoolOwner] = []  # owners[i] holds slot i

    @property
    def size(self) -> int:
        """Occupied slots."""
        return len(self.owners)

    def _shape(self) -> tuple[int, int]:
        """(slots, capacity) allocated now; (0, 0) while empty."""
        return (0, 0) if self.keys is None else (int(self.keys.shape[1]),
                                                 int(self.keys.shape[3]))

    def admit(self, state: PoolOwner) -> bool:
        """Move `state`'s cache into the next slot (growing the pool if it may); False when
        the pool is full or would exceed `max_positions` (the state keeps its own cache)."""
        need = state.kv_tokens
        if self.fixed:
            self.allocate()
        slots, capacity = self._shape()
        if self.size == self.max_slots or (self.fixed and need > capacity):
            return False
        want_slots = slots if self.size < slots else min(self.max_slots, max(1, 2 * slots))
        want_capacity = max(capacity, -(-need // POSITION_STEP) * POSITION_STEP)
        if (want_slots, want_capacity) != (slots, capacity):
            if want_slots * want_capacity > self.max_positions:
                return False
            self._grow(want_slots, want_capacity)
        slot = self.size
        self.owners.append(state)
        self._place(slot, state.cache, state.n_keys + state.picked - 1)
        state.slot = slot
        state.cache = self._view(slot)
        return True

    def release(self, state: PoolOwner) -> None:
        """Free `state`'s slot; the last slot's answer moves into it."""
        slot = state.slot
        if slot is None:
            return
        state.slot = None
        last = self.owners.pop()
        if last is not state:
            self.owners[slot] = last
            self._place(slot, last.cache, last.kv_tokens)
            last.slot = slot
            last.cache = self._view(slot)
        if not self.owners and not self.fixed:
            self.keys = self.values = None

    @property
    def fixed_capacity(self) -> int:
        """Positions a slot of the fixed pool holds (see the module docstring)."""
        return self.max_positions // self.max_slots // POSITION_STEP * POSITION_STEP

    def allocate(self) -> None:
        """A fixed pool's tensors, at their one size (see the module docstring)."""
        if self.keys is None:
            self._grow(self.max_slots, self.fixed_capacity)

    def _view(self, slot: int) -> KVCache:
        assert self.keys is not None and self.values is not None
        return KVCache(keys=self.keys[:, slot:slot + 1], values=self.values[:, slot:slot + 1])

    def _place(self, slot: int, cache: KVCache, n: int) -> None:
        """Copy positions [0, n) of `cache` into `slot` and zero the rest of the slot."""
        assert self.keys is not None and self.values is not None
        n = min(n, cache.capacity)
        for pool, src in ((self.keys, cache.keys), (self.values, cache.values)):
            pool[:, slot:slot + 1, :, :n] = src[:, :, :, :n]
            pool[:, slot:slot + 1, :, n:] = 0

    def _grow(self, slots: int, capacity: int) -> None:
        """Reallocate (zeroed) as (slots, capacity) and view every owner's slot anew."""
        cfg = self.adapter.text_config
        head_dim = self.adapter.layers[0].self_attn.head_dim
        shape = (len(self.adapter.layers), slots, cfg.num_key_value_heads, capacity, head_dim)
        keys = torch.zeros(shape, dtype=self.adapter.dtype, device=self.adapter.device)
        values = torch.zeros_like(keys)
        if self.keys is not None and self.values is not None:
            old_slots, old_capacity = self._shape()
            keys[:, :old_slots, :, :old_capacity] = self.keys
            values[:, :old_slots, :, :old_capacity] = self.values
        self.keys, self.values = keys, values
        for i, owner in enumerate(self.owners):
            owner.cache = self._view(i)
