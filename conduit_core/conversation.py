"""A conversation's KV kept as a prefix: after a turn, its assembled and refreshed cache with
its answer's rows, under a key; a follow-up that finds it computes only its own rows.

The key of a prefix (`prefix_key`) is the model's fingerprint, the namespace (tenant), the
refresh policy as chosen with its budget, the token ids so far and the identity of every page
in it, in order: a prefix is reused only where the same policy would have built it from the
same text and pages, so that a rebuilt prefix and a kept one are the same tensors up to float
rounding (a kept answer's rows are its decode's, a rebuilt one's one pass's). The keeping
is bounded in prefixes per namespace and in bytes across namespaces, least recently used
dropped (`ConversationCache`); a process that restarts rebuilds on the first follow-up.

A kept turn (`KeptTurn`) is what keying its prefix needs; its rows are taken as its answer
ends (`take_rows`) from the cache its answer was decoded in, which holds the turn's
refreshed K/V and the answer's tokens' K/V at their positions, exact: only the rows the decode
never computed are left to `complete_prefix` (the end of the assistant's turn, a last token
never fed back, an answer whose text tokenizes otherwise) with the opening of the next user
turn, which every follow-up starts with. A rebuild takes its rows from a turn's assembled cache
and computes every answer row in that one pass. A follow-up's own rows (`assemble_turn`): the
prefix's exact K/V copied in as the layout's head, the pages the turn adds loaded and
re-rotated to their places; the runtime's passes then compute its text rows and refresh its
pages by the request's policy with the whole conversation before them.
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
    """A turn to keep once its answer is known: what its prefix's key is made of, and where
    its answer starts."""

    namespace: str
    choice: str  # the policy as chosen, with its budget (`ReuseRuntime` spells it)
    token_ids: torch.Tensor  # (n,) the turn's layout
    page_ids: tuple[str, ...]  # every page of the conversation so far, in order
    next_position: int  # position of the answer's first token


@dataclass(frozen=True)
class PrefixRows:
    """A kept turn's prefix being made: `token_ids` (its layout, its answer, the next
    opening), rows [0, exact) of `cache` taken exact, the rest still to compute."""

    kept: KeptTurn
    cache: KVCache  # (L, 1, kv_heads, len(token_ids), hd)
    token_ids: torch.Tensor  # (n + m,)
    exact: int


def take_rows(adapter: VLMAdapter, kept: KeptTurn, source: KVCache, answer: str,
              decoded: Sequence[int] = ()) -> PrefixRows:
    """Copy the exact rows of `kept`'s prefix out of `source`: its n layout rows and the
    answer's first c rows, c the longest run of `decoded` (the tokens whose K/V decoding
    wrote after the layout, in order) that the answer as the conversation holds it
    (`VLMAdapter.answer_ids` of `answer`) starts with."""
    n = int(kept.token_ids.shape[0])
    ids = adapter.answer_ids(answer) + adapter.page_opening_ids()
    c = 0
    while c < min(len(decoded), len(ids)) and int(decoded[c]) == ids[c]:
        c += 1
    cache = KVCache.allocate(adapter, 1, n + len(ids))
    cache.keys[:, :, :, :n + c] = source.keys[:, :1, :, :n + c]
    cache.values[:, :, :, :n + c] = source.values[:, :1, :, :n + c]
    token_ids = torch.cat([kept.token_ids.cpu(), torch.tensor(ids, dtype=torch.long)])
    return PrefixRows(kept=kept, cache=cache, token_ids=token_ids, exact=n + c)


@torch.no_grad()
def complete_prefix(adapter: VLMAdapter, costs: RowCosts,
                    rows: PrefixRows) -> tuple[HeadKV, float]:
    """The prefix a follow-up starts from: `rows`' exact rows and the rest computed in one
    pass after them at the positions decoding gives them; and the LM FLOPs of that pass."""
    n = int(rows.kept.token_ids.shape[0])
    total = int(rows.token_ids.shape[0])
    todo = torch.arange(rows.exact, total)  # (r,)
    spent = 0.0
    if todo.numel():
        positions = (rows.kept.next_position + todo - n).expand(adapter.rope_axes, -1)  # (P, r)
        embeds = adapter.embed_tokens(rows.token_ids[todo].to(adapter.device)).unsqueeze(0)
        forward_rows(adapter, rows.cache, embeds, todo.to(adapter.device),
                     positions.unsqueeze(1).to(adapter.device), n_keys=total,
                     outputs=torch.tensor([todo.numel() - 1]))  # (1, r, hidden) unread
        spent = costs.rows(todo, total, last_only=True)
    hidden = torch.zeros(0, adapter.text_config.hidden_size, dtype=adapter.dtype)
    prefix = HeadKV(token_ids=tuple(int(t) for t in rows.token_ids.tolist()),
                    keys=rows.cache.keys[:, 0], values=rows.cache.values[:, 0], hidden=hidden)
    return prefix, spent


def assemble_turn(adapter: VLMAdapter, layout: Layout, pages: Sequence[PageInput],
                  prefix: HeadKV, cache: KVCache, namespace: str) -> Assembly:
    """A follow-up's assembly in `cache`: `prefix`'s exact K/V in rows [0, layout.head) as
    the head, the pages it adds loaded and re-rotated into their segments (module
    docstring)."""
    if prefix.n != layout.head:
        raise ValueError(f"a prefix of {prefix.n} rows under a head of {layout.head}")
    embeds = adapter.embed_tokens(layout.token_ids)  # (N, hidden)
    assembly = Assembly(layout=layout, cache=cache, embeds=embeds,
                        image_grids=[p.kv.image_grid for p in pages], last_only=True,
                        layer0_exact=not any(p.kv.quantized for p in pages),
                        namespace=namespace)
    load_pages(adapter, layout, [p.kv for p in pages], cache, embeds)
    prefix.copy_into(cache)
    assembly.head = prefix
    return assembly
