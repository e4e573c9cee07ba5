"""The runtime's own KV cache: preallocated tensors written in place at chosen rows.

`DynamicCache.update` only appends; refresh needs to overwrite keys/values of arbitrary token
indices, so the runtime keeps one tensor per kind for all layers, allocated at the answer's
capacity and left uninitialised (every row is written before it is read); the runtime's
workspace lends one to each answer and reuses it for the next (`conduit_core.kv.workspace`).
Its write count is a cheap change stamp for whoever caches something computed from it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from conduit_core.model.adapters.base import VLMAdapter


@dataclass
class KVCache:
    """Per-layer keys (after RoPE) and values for a batch of sequences."""

    keys: torch.Tensor  # (L, B, kv_heads, capacity, head_dim)
    values: torch.Tensor  # (L, B, kv_heads, capacity, head_dim)
    writes: int = field(default=0, compare=False)  # `write` calls so far
    # the key count whose bucket tail a compiled forward zeroed since the cache was lent
    # (`conduit_core.passes.buckets.clear_tail`); None: not since
    cleared_tail: int | None = field(default=None, compare=False)

    @classmethod
    def allocate(cls, adapter: VLMAdapter, batch: int, capacity: int) -> KVCache:
        """A cache sized for the adapter's language model, not initialised: every position
        is written before it is read (assembly fills the page rows; a pass writes its own
        rows at a layer before attending; decode writes each new row before reading it)."""
        cfg = adapter.text_config
        attn = adapter.layers[0].self_attn
        shape = (len(adapter.layers), batch, cfg.num_key_value_heads, capacity, attn.head_dim)
        keys = torch.empty(shape, dtype=adapter.dtype, device=adapter.device)
        return cls(keys=keys, values=torch.empty_like(keys))

    @property
    def capacity(self) -> int:
        """Positions the cache can hold."""
        return int(self.keys.shape[3])

    def write(self, layer: int, rows: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Overwrite positions `rows` (R,) of `layer` with k, v (B, kv_heads, R, head_dim)."""
        self.writes += 1
        self.keys[layer].index_copy_(2, rows, k.to(self.keys.dtype))
        self.values[layer].index_copy_(2, rows, v.to(self.values.dtype))

    def view(self, layer: int, n_keys: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of positions [0, n_keys): (B, kv_heads, n_keys, head_dim) each."""
        return self.keys[layer, :, :, :n_keys], self.values[layer, :, :, :n_keys]
