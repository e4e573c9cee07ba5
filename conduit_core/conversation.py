"""A conversation's KV kept as a prefix: after a turn, its assembled and refreshed cache with
its answer's rows, under a key; a follow-up that finds it computes only its own rows.

The key of a prefix (`prefix_key`) is the model's fingerprint, the namespace (tenant), the
refresh policy as chosen with its budget, the token ids so far and the identity of every page
in it, in order: a prefix is reused only where the same policy would have built it from the
same text and pages, so that a rebuilt prefix and a kept one are the same tensors. The keeping
is bounded in prefixes per namespace and in bytes across namespaces, least recently used
dropped (`ConversationCache`); a process that restarts rebuilds on the first follow-up.

A kept turn (`KeptTurn`) holds its refreshed cache until its answer is known; the answer's
rows (`VLMAdapter.answer_ids` of its text) are then computed in one pass over that cache
(`extend_prefix`), the same pass a rebuild runs, so a hit and a rebuild agree. A follow-up's
own rows (`assemble_turn`): the prefix's exact K/V copied in as the layout's head, the pages
the turn adds loaded and re-rotated to their places; the runtime's passes then compute its
text rows and refresh its pages by the request's policy with the whole conversation before
them.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from conduit_core.answer_types import PageInput, Turn
from conduit_core.cost.cost_model import RowCosts
from conduit_core.kv.kv_cache import KVCache
from conduit_core.kv.page_loads import load_pages
from conduit_core.model.adapters.base import VLMAdapter
from conduit_core.passes.assembly import Assembly
from conduit_core.passes.layer_forward import forward_rows
from conduit_core.passes.prompt_head import HeadKV
from conduit_core.prompt.conversation import TurnText
from conduit_core.prompt.layout import Layout


def _text(pages: Sequence[PageInput], question: str, answer: str | None) -> TurnText:
    return TurnText([p.label for p in pages], [p.kv.token_ids for p in pages],
                    [p.kv.image_grid for p in pages], question, answer)


def history_texts(history: Sequence[Turn]) -> list[TurnText]:
    """The answered `history` as the layout's turns."""
    return [_text(t.pages, t.question, t.answer) for t in history]


def turn_texts(history: Sequence[Turn], pages: Sequence[PageInput],
               question: str) -> list[TurnText]:
    """The answered `history` and the turn asked now as the layout's turns."""
    return [*history_texts(history), _text(pages, question, None)]


def page_ids(pages: Sequence[PageInput]) -> list[str]:
    """Each page's identity: its `page_id`, or a digest of its layer-0 embeddings."""
    return [p.page_id or hashlib.sha256(
        p.kv.embeds.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes()
    ).hexdigest() for p in pages]


def prefix_key(fingerprint: str, namespace: str, choice: str, token_ids: torch.Tensor,
               pages: Sequence[str]) -> str:
    """The key of a conversation prefix (module docstring): a sha256 hex digest."""
    digest = hashlib.sha256()
    for part in (fingerprint, namespace, choice, *pages):
        digest.update(part.encode())
        digest.update(b"\0")
    digest.update(token_ids.to(torch.int64).cpu().numpy().tobytes())
    return digest.hexdigest()


class ConversationCache:
    """Kept prefixes, at most `per_namespace` for each namespace and `max_bytes` of K/V in
    all, the least recently used dropped first (a namespace's own oldest past its count, the
    oldest of all past the bytes). Thread-safe."""

    def __init__(self, per_namespace: int = 8, max_bytes: int = 2**30):
        if per_namespace < 1 or max_bytes < 1:
            raise ValueError("a conversation cache keeps at least one prefix")
        self.per_namespace, self.max_bytes = per_namespace, max_bytes
        self._entries: OrderedDict[tuple[str, str], HeadKV] = OrderedDict()
        self._counts: dict[str, int] = {}
        self.nbytes = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, namespace: str, key: str) -> HeadKV | None:
        """The prefix under `key` in `namespace`, or None."""
        with self._lock:
            prefix = self._entries.get((namespace, key))
            if prefix is not None:
                self._entries.move_to_end((namespace, key))
            return prefix

    def put(self, namespace: str, key: str, prefix: HeadKV) -> None:
        """Keep `prefix` under `key` in `namespace`, dropping the oldest past the bounds (a
        prefix larger than `max_bytes` alone is not kept)."""
        with self._lock:
            if (namespace, key) in self._entries:
                self._drop((namespace, key))
            self._entries[(namespace, key)] = prefix
            self._counts[namespace] = self._counts.get(namespace, 0) + 1
            self.nbytes += _nbytes(prefix)
            if self._counts[namespace] > self.per_namespace:
                self._drop(next(k for k in self._entries if k[0] == namespace))
            while self.nbytes > self.max_bytes:
                self._drop(next(iter(self._entries)))

    def _drop(self, entry: tuple[str, str]) -> None:
        prefix = self._entries.pop(entry)
        self.nbytes -= _nbytes(prefix)
        self._counts[entry[0]] -= 1
        if not self._counts[entry[0]]:
            del self._counts[entry[0]]

    def clear(self) -> None:
        """Drop every kept prefix (a restart's state)."""
        with self._lock:
            self._entries.clear()
            self._counts.clear()
            self.nbytes = 0


def _nbytes(prefix: HeadKV) -> int:
    """Bytes of a prefix's K/V."""
    return prefix.keys.nbytes + prefix.values.nbytes


@dataclass(frozen=True)
class KeptTurn:
    """A turn to keep once its answer is known: its refreshed cache (rows [0, len(token_ids))
    hold the turn's K/V) and what its key is made of."""

    namespace: str
    choice: str  # the policy as chosen, with its budget (`ReuseRuntime` spells it)
    cache: KVCache
    token_ids: torch.Tensor  # (n,) the turn's layout
    page_ids: tuple[str, ...]  # every page of the conversation so far, in order
    next_position: int  # position of the answer's first token


@torch.no_grad()
def extend_prefix(adapter: VLMAdapter, costs: RowCosts, kept: KeptTurn,
                  answer: str) -> tuple[HeadKV, float]:
    """The prefix a follow-up of `kept` starts from: its K/V and the answer's rows
    (`answer_ids`, at the positions decoding gave them) computed in one pass over it; and the
    LM FLOPs of that pass."""
    n = int(kept.token_ids.shape[0])
    ids = torch.tensor(adapter.answer_ids(answer), dtype=torch.long)  # (m,)
    m = int(ids.shape[0])
    cache = KVCache.allocate(adapter, 1, n + m)
    cache.keys[:, :, :, :n] = kept.cache.keys[:, :1, :, :n]
    cache.values[:, :, :, :n] = kept.cache.values[:, :1, :, :n]
    rows = torch.arange(n, n + m)  # (m,)
    positions = (kept.next_position + torch.arange(m)).expand(adapter.rope_axes, m)  # (P, m)
    embeds = adapter.embed_tokens(ids.to(adapter.device)).unsqueeze(0)  # (1, m, hidden)
    forward_rows(adapter, cache, embeds, rows.to(adapter.device),
                 positions.unsqueeze(1).to(adapter.device), n_keys=n + m,
                 outputs=torch.tensor([m - 1]))
    token_ids = torch.cat([kept.token_ids.cpu(), ids])  # (n + m,)
    hidden = torch.zeros(0, adapter.text_config.hidden_size, dtype=adapter.dtype)
    prefix = HeadKV(token_ids=tuple(int(t) for t in token_ids.tolist()),
                    keys=cache.keys[:, 0].clone(), values=cache.values[:, 0].clone(),
                    hidden=hidden)
    return prefix, costs.rows(rows, n + m, last_only=True)


def assemble_turn(adapter: VLMAdapter, layout: Layout, pages: Sequence[PageInput],
                  prefix: HeadKV, extra_capacity: int, namespace: str) -> Assembly:
    """A follow-up's assembly: `prefix`'s exact K/V in rows [0, layout.head) as the head,
    the pages it adds loaded and re-rotated into their segments (module docstring)."""
    if prefix.n != layout.head:
        raise ValueError(f"a prefix of {prefix.n} rows under a head of {layout.head}")
    cache = KVCache.allocate(adapter, 1, layout.n + extra_capacity)
    embeds = adapter.embed_tokens(layout.token_ids)  # (N, hidden)
    assembly = Assembly(layout=layout, cache=cache, embeds=embeds,
                        image_grids=[p.kv.image_grid for p in pages], last_only=True,
                        layer0_exact=not any(p.kv.quantized for p in pages),
                        namespace=namespace)
    load_pages(adapter, layout, [p.kv for p in pages], cache, embeds)
    prefix.copy_into(cache)
    assembly.head = prefix
    return assembly
