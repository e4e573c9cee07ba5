"""The cached prompt head: the part of every prompt before its first page, computed once.

A request's layout starts with its head (the chat template's opening and the prefix: for the
service, the fixed answer instructions), identical for every question with that prefix. It
is a true prefix (positions 0..h-1, nothing before it), so its K/V at every layer and its
last-layer hidden states are exactly those of a full prefill of any prompt that starts with
it: no re-rotation, no refresh. The runtime copies them into each assembled cache and
computes only the rows after the head (not computed = not charged).

Entries are keyed by the request's page namespace (a tenant, or the shared corpus) and the
head's token ids, so that whether a head is cached never tells one namespace what another
asked; they live with the loaded model (a process that restarts rebuilds them on its first
question). A small bound keeps memory flat when callers send many prefixes. A head computed
for an answer is charged to it (`ReuseSteps.assemble`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from conduit_core.kv.kv_cache import KVCache
from conduit_core.model.adapters.base import VLMAdapter
from conduit_core.passes.layer_forward import forward_rows
from conduit_core.prompt.bounded_lru import BoundedLRU


@dataclass(frozen=True)
class HeadKV:
    """A prompt head's exact K/V per layer and last-layer hidden states."""

    token_ids: tuple[int, ...]
    keys: torch.Tensor  # (L, kv_heads, h, hd), after RoPE at positions 0..h-1
    values: torch.Tensor  # (L, kv_heads, h, hd)
    hidden: torch.Tensor  # (h, hidden) last-layer states (before the final norm); a
    # conversation's prefix keeps none, (0, hidden): only answers (last row alone) follow it

    @property
    def n(self) -> int:
        """Tokens in the head."""
        return len(self.token_ids)

    def copy_into(self, cache: KVCache) -> None:
        """Write the head's K/V into rows [0, h) of a batch-1 cache."""
        cache.keys[:, 0, :, :self.n] = self.keys
        cache.values[:, 0, :, :self.n] = self.values


HeadKey = tuple[str, tuple[int, ...]]  # (page namespace, head token ids)


class HeadCache(BoundedLRU[HeadKey, HeadKV]):
    """Bounded LRU of computed prompt heads for one loaded model."""

    def __init__(self, max_entries: int = 8):
        super().__init__(max_entries)

    @torch.no_grad()
    def get(self, adapter: VLMAdapter, namespace: str, token_ids: torch.Tensor,
            position_ids: torch.Tensor) -> tuple[HeadKV, bool]:
        """The head with these token ids (h,) at `position_ids` (P, h) for `namespace`, and
        whether it was computed now (first use in that namespace).

        Positions are part of what the head's K/V depend on; a head is always at the start
        of its layout, so its positions are a function of its token ids."""
        ids = tuple(int(t) for t in token_ids.tolist())
        return self.get_or_compute((namespace, ids),
                                   lambda: _compute(adapter, ids, token_ids, position_ids))


def _compute(adapter: VLMAdapter, key: tuple[int, ...], token_ids: torch.Tensor,
             position_ids: torch.Tensor) -> HeadKV:
    h = len(key)
    cache = KVCache.allocate(adapter, 1, h)
    embeds = adapter.embed_tokens(token_ids.to(torch.long)).unsqueeze(0)  # (1, h, hidden)
    rows = torch.arange(h)
    hidden = forward_rows(adapter, cache, embeds, rows, position_ids.unsqueeze(1), n_keys=h,
                          plain_causal=True)  # (1, h, hidden)
    return HeadKV(token_ids=key, keys=cache.keys[:, 0].clone(),  # (L, kv, h, hd)
                  values=cache.values[:, 0].clone(), hidden=hidden[0].clone())
