"""Decode slots: the caches of the answers being generated, side by side in tensors shared by
many answers, so that a batched decode step attends for all of them in one call per layer.

An answer's prefill fills its own `KVCache` (batch one, its own capacity). At its first decode
step, when a slot is free and the pool can hold it, its first positions are copied into a
slot once (`admit`: one copy per answer, never one per step) and its `DecodeState.cache`
becomes that slot, a view of the pool; its own cache is then free. The slots are held in
tiers (`SlotTier`: one (L, slots, kv_heads, capacity, hd) pair each); a tier's occupied slots
are always 0..size-1: an answer that ends (`release`) hands its slot to the tier's last answer
(one copy of that answer's cache), so a step's pooled rows read one view of a tier with a
mask, never a gathered copy.

A growing pool (the default, for the eager step) is one tier that grows (slots doubling up to
`max_slots`, positions a slot holds rounded up to `POSITION_STEP`) while
`slots * capacity <= max_positions`; it admits an answer by its whole need (prompt and
longest answer), and one it cannot hold decodes from its own cache on the per-sequence path
of `batch_forward.forward_step`. Positions past an answer's keys are zero in its slot (masked,
but never NaN from uninitialised memory). The tier keeps its largest shape when answers leave
(at most `max_positions` positions): growing copies every occupied slot while the others
wait for their next token, so a burst pays it once, not each time the batch refills.

A fixed pool (`fixed=True`, what a captured or compiled decode step needs:
`conduit_core.passes.step_graphs`) is a ladder of tiers allocated once and kept while the
pool lives, their tensors never moving, so a step captured over them stays valid. The default
ladder (`ladder`) gives three quarters of `max_positions` to `max_slots` short slots and the
rest to `max_slots // 8` (at least one) slots of a longer capacity; where those would not be
longer it is one tier of `max_slots` slots, as many positions each. A fixed pool admits an
answer by the positions it needs up to its next token (`holds`), into the first tier with
room. An answer that outgrows its slot moves (`move`): its keys are copied once into a free
slot of the next tier that holds it, where it rejoins that tier's captured step; where no
tier has room it moves to a cache of its own (its whole need) and decodes eagerly beside the
captured steps until a slot that holds it frees. No other answer leaves its slot for a move
but the tier's last one, which takes the freed slot.
"""

from __future__ import annotations

from typing import Protocol

import torch

from conduit_core.kv.kv_cache import KVCache
from conduit_core.model.adapters.base import VLMAdapter

POSITION_STEP = 64  # a slot's capacity grows in multiples of this
SHORT_SHARE = 0.75  # of a fixed pool's positions, the share of its short slots
LONG_SLOTS = 8  # a fixed pool has one long slot for this many short ones (at least one)


class PoolOwner(Protocol):
    """What the pool reads and sets of a decoding answer (`conduit_core.decode.DecodeState`
    is one): its cache (the slot's view once admitted), its tier and slot, and how many of
    its positions hold keys."""

    cache: KVCache
    slot: int | None
    tier: int
    n_keys: int  # keys after its prefill
    picked: int  # tokens picked so far: n_keys + picked - 1 positions hold keys
    done: bool

    @property
    def kv_tokens(self) -> int:
        """Positions its cache needs to its last token."""


def _steps(positions: int) -> int:
    """`positions` rounded down to `POSITION_STEP`."""
    return positions // POSITION_STEP * POSITION_STEP


def ladder(max_slots: int, max_positions: int) -> list[tuple[int, int]]:
    """The default tiers of a fixed pool, (slots, capacity) each, shortest first (see the
    module docstring); their positions sum to at most `max_positions`."""
    short = _steps(int(max_positions * SHORT_SHARE) // max_slots)
    n_long = max(1, max_slots // LONG_SLOTS)
    long = _steps((max_positions - short * max_slots) // n_long)
    if short < POSITION_STEP or long <= short:
        return [(max_slots, _steps(max_positions // max_slots))]
    return [(max_slots, short), (n_long, long)]


def _used(state: PoolOwner) -> int:
    """Positions of `state`'s cache that hold keys."""
    return state.n_keys + state.picked - 1


class SlotTier:
    """Slots 0..size-1 of one (L, slots, kv_heads, capacity, hd) pair, one decoding answer
    each (see the module docstring)."""

    def __init__(self, adapter: VLMAdapter, max_slots: int, max_positions: int,
                 capacity: int | None = None):
        self.adapter = adapter
        self.max_slots = max_slots
        self.max_positions = max_positions
        self.capacity = capacity  # a fixed tier's slot capacity; None: it grows
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

    def allocate(self) -> None:
        """A fixed tier's tensors, at their one size."""
        if self.keys is None and self.capacity is not None:
            self._grow(self.max_slots, self.capacity)

    def admit(self, state: PoolOwner, need: int) -> bool:
        """Copy `state`'s keys into the next slot, which must hold `need` positions (growing
        the tier if it may); False when it cannot (the state is left as it was)."""
        self.allocate()
        slots, capacity = self._shape()
        if self.size == self.max_slots or (self.capacity is not None and need > capacity):
            return False
        want_slots = slots if self.size < slots else min(self.max_slots, max(1, 2 * slots))
        want_capacity = max(capacity, -(-need // POSITION_STEP) * POSITION_STEP)
        if (want_slots, want_capacity) != (slots, capacity):
            if want_slots * want_capacity > self.max_positions:
                return False
            self._grow(want_slots, want_capacity)
        slot = self.size
        self.owners.append(state)
        self._place(slot, state.cache, _used(state))
        state.slot = slot
        state.cache = self._view(slot)
        return True

    def vacate(self, slot: int) -> None:
        """Drop the owner of `slot` from this tier (its fields untouched): the last slot's
        answer moves into it."""
        last = self.owners.pop()
        if slot < len(self.owners):
            self.owners[slot] = last
            self._place(slot, last.cache, _used(last) + 1)  # + its next row, if written
            last.slot = slot
            last.cache = self._view(slot)

    def _view(self, slot: int) -> KVCache:
        assert self.keys is not None and self.values is not None
        return KVCache(keys=self.keys[:, slot:slot + 1], values=self.values[:, slot:slot + 1])

    def _place(self, slot: int, cache: KVCache, n: int) -> None:
        """Copy positions [0, n) of `cache` into `slot` and zero the rest of the slot."""
        assert self.keys is not None and self.values is not None
        n = min(n, cache.capacity, int(self.keys.shape[3]))
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


class DecodePool:
    """The decoding answers' slots, in one growing tier or a fixed ladder of tiers (see the
    module docstring)."""

    def __init__(self, adapter: VLMAdapter, max_slots: int = 16, max_positions: int = 65536,
                 fixed: bool = False, tiers: list[tuple[int, int]] | None = None):
        if max_slots < 1 or max_positions < 1:
            raise ValueError("need max_slots >= 1 and max_positions >= 1")
        if fixed and max_positions // max_slots < POSITION_STEP:
            raise ValueError(f"a fixed pool needs max_positions >= {POSITION_STEP} * max_slots")
        self.adapter = adapter
        self.fixed = fixed
        if not fixed:
            self.tiers = [SlotTier(adapter, max_slots, max_positions)]
            return
        shape = tiers if tiers is not None else ladder(max_slots, max_positions)
        if (any(s < 1 or c < 1 for s, c in shape)
                or [c for _, c in shape] != sorted({c for _, c in shape})
                or sum(s * c for s, c in shape) > max_positions):
            raise ValueError(f"tiers {shape} must lengthen and hold at most "
                             f"{max_positions} positions")
        self.tiers = [SlotTier(adapter, s, s * c, c) for s, c in shape]

    @property
    def size(self) -> int:
        """Occupied slots, all tiers together."""
        return sum(t.size for t in self.tiers)

    def allocate(self) -> None:
        """A fixed pool's tensors, every tier at its one size."""
        for tier in self.tiers:
            tier.allocate()

    def holds(self, state: PoolOwner) -> bool:
        """Whether `state`'s slot holds its keys up to its next token."""
        tier = self.tiers[state.tier].capacity
        return state.slot is not None and (tier is None or _used(state) + 1 <= tier)

    def admit(self, state: PoolOwner) -> bool:
        """Move `state`'s cache into a slot: a growing pool's, by its whole need; a fixed
        pool's, the first tier's that holds it to its next token. False when none can (the
        state keeps its own cache)."""
        need = _used(state) + 1 if self.fixed else state.kv_tokens
        for t, tier in enumerate(self.tiers):
            if tier.admit(state, need):
                state.tier = t
                return True
        return False

    def release(self, state: PoolOwner) -> None:
        """Free `state`'s slot (see `SlotTier.vacate`)."""
        slot = state.slot
        if slot is None:
            return
        state.slot = None
        self.tiers[state.tier].vacate(slot)
        state.tier = 0

    def move(self, state: PoolOwner) -> None:
        """Move an answer that outgrew its slot into a slot of the next tier that holds it,
        else into a cache of its own (see the module docstring)."""
        old, slot = state.tier, state.slot
        assert slot is not None
        need = _used(state) + 1
        for t in range(old + 1, len(self.tiers)):
            if self.tiers[t].admit(state, need):
                state.tier = t
                self.tiers[old].vacate(slot)
                return
        own = KVCache.allocate(self.adapter, 1, max(state.kv_tokens, need))
        n = _used(state)
        own.keys[:, :, :, :n] = state.cache.keys[:, :, :, :n]
        own.values[:, :, :, :n] = state.cache.values[:, :, :, :n]
        state.cache, state.slot, state.tier = own, None, 0
        self.tiers[old].vacate(slot)
