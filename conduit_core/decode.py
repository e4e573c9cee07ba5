"""Greedy and sampled decoding from an assembled KV cache, with stop tokens and streaming.

The first token is picked from the prefill logits; each further token is one row through the
batched step, its K/V appended at the next cache index of its own cache (or its decode-pool
slot: `conduit_core.kv.kv_pool`), its position one past the last. A step moves every
unfinished answer one token further, the forwards of all of them in one batch
(`conduit_core.passes.batch_forward`, or a captured or compiled step of the pooled answers:
`conduit_core.passes.step_graphs`); an answer alone is a batch of one. Row indices and
positions of all steps are made on the device once, and the picked token stays there for its
embedding: a step copies the token ids of all its sequences to the host in one read (for
stop tokens and text) and nothing to the device.

Text is detokenized incrementally by the tokenizers library's `DecodeStream` (constant work
per token). A piece is emitted only once it holds complete characters: a multi-byte
character split across tokens waits for its last byte. Bytes that never form a character
(a model emitting invalid UTF-8) and control characters other than newline and tab are
dropped, so the text holds no U+FFFD or control characters, and the streamed pieces
concatenate to exactly the final text; `on_token` is called with an empty piece only for
tokens that add no character (callers that stream skip those).
"""

from __future__ import annotations

import time
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from tokenizers.decoders import DecodeStream

from conduit_core.answer_types import TokenCallback, TokenId
from conduit_core.kv.kv_cache import KVCache
from conduit_core.kv.kv_pool import DecodePool
from conduit_core.model.adapters.base import VLMAdapter
from conduit_core.passes.batch_forward import StepRow, forward_step
from conduit_core.passes.step_graphs import StepGraphs


class Sampler:
    """Greedy when temperature == 0, else temperature + nucleus (top-p) sampling."""

    def __init__(self, temperature: float = 0.0, top_p: float = 1.0, seed: int | None = None):
        self.temperature = temperature
        self.top_p = top_p
        self.generator: torch.Generator | None = None
        self.seed = seed

    def pick(self, logits: torch.Tensor) -> torch.Tensor:
        """One token id (0-d tensor, on the logits' device) from logits (V,)."""
        if self.temperature <= 0.0:
            return logits.argmax()
        if self.generator is None:
            self.generator = torch.Generator(device=logits.device)
            self.generator.manual_seed(self.seed if self.seed is not None else
                                       int(torch.randint(0, 2**31 - 1, ()).item()))
        probs = torch.softmax(logits.float() / self.temperature, dim=-1)  # (V,)
        if self.top_p < 1.0:
            sorted_p, order = probs.sort(descending=True)
            keep = sorted_p.cumsum(-1) - sorted_p < self.top_p  # always keeps the top token
            probs = torch.zeros_like(probs).scatter(0, order, sorted_p * keep)
        return torch.multinomial(probs, 1, generator=self.generator)[0]


def printable(text: str) -> str:
    """`text` without U+FFFD and control characters (newline and tab kept)."""
    if text.isprintable() and "\ufffd" not in text:
        return text
    return "".join(ch for ch in text if ch in "\n\t" or (
        ch != "\ufffd" and unicodedata.category(ch) != "Cc"))


class Detokenizer:
    """Incremental detokenization of one generated sequence (see the module docstring).

    `tokenizer` is a transformers fast tokenizer (its `backend_tokenizer`) or a
    `tokenizers.Tokenizer`. Special tokens are skipped.
    """

    MAX_PENDING = 8  # tokens held back waiting for a character's last byte (UTF-8: <= 4)

    def __init__(self, tokenizer: Any):
        backend = getattr(tokenizer, "backend_tokenizer", tokenizer)
        self._backend = backend
        self._stream = DecodeStream(skip_special_tokens=True)
        self._pending = 0

    def step(self, token_id: int) -> str:
        """The complete characters `token_id` adds (possibly none)."""
        piece = self._stream.step(self._backend, token_id)
        if piece is None:  # an incomplete character: wait, but not for ever
            self._pending += 1
            if self._pending < self.MAX_PENDING:
                return ""
            self._stream = DecodeStream(skip_special_tokens=True)  # invalid bytes: drop them
        self._pending = 0
        return printable(piece or "")


@dataclass
class DecodeOutput:
    """Generated tokens and how generation ended."""

    token_ids: list[TokenId]
    text: str
    stop_reason: str  # "stop" or "length"
    ttft_s: float


@dataclass
class DecodeState:
    """One answer being generated: its own cache, where its next token goes, how it picks.

    Made by `DecodeState.start` after a prefill; `decode_step` advances any number of them by
    one token each in one forward. `done` once a stop token is picked, `max_new_tokens` are
    out, or its `on_token` raised (then `error` holds what it raised: a client that went
    away leaves the batch, the others go on). `on_end` is called once when it ends by a stop
    token or its length, while its cache still holds every row it wrote (before a pool
    slot is given back).
    """

    cache: KVCache  # (L, 1, kv_heads, capacity, hd); room for max_new_tokens - 1 more rows
    n_keys: int  # rows in the cache after the prefill (the first new token's index)
    logits: torch.Tensor  # (V,) float32: the next token is picked from these
    sampler: Sampler
    stops: frozenset[int]
    max_new_tokens: int
    detok: Detokenizer
    rows: torch.Tensor  # (max_new_tokens,) cache indices on the device
    positions: torch.Tensor  # (P, max_new_tokens) position ids on the device
    t0: float
    first_position: int = 0  # positions[:, 0] on every axis (decode positions are text's)
    on_token: TokenCallback | None = None
    tokens: list[TokenId] = field(default_factory=list)
    pieces: list[str] = field(default_factory=list)
    picked: int = 0  # tokens picked so far (stop token included)
    ttft_s: float = 0.0
    stop_reason: str = "length"
    done: bool = False
    error: BaseException | None = None
    slot: int | None = None  # its `DecodePool` slot once admitted (then `cache` is the slot)
    tier: int = 0  # the pool's tier its slot lies in
    on_end: Callable[[], None] | None = None

    @classmethod
    def start(cls, adapter: VLMAdapter, cache: KVCache, first_logits: torch.Tensor, *,
              n_keys: int, next_position: int, max_new_tokens: int, sampler: Sampler,
              stop_ids: list[int], tokenizer: Any, on_token: TokenCallback | None = None,
              t0: float | None = None) -> DecodeState:
        """The state right after a prefill whose last-row logits are `first_logits` (V,)."""
        dev = adapter.device
        rows = torch.arange(n_keys, n_keys + max_new_tokens, device=dev)  # (T,)
        positions = torch.arange(next_position, next_position + max_new_tokens,
                                 device=dev).expand(adapter.rope_axes, -1)  # (P, T)
        return cls(cache=cache, n_keys=n_keys, logits=first_logits, sampler=sampler,
                   stops=frozenset(stop_ids), max_new_tokens=max_new_tokens,
                   detok=Detokenizer(tokenizer), rows=rows, positions=positions,
                   t0=time.perf_counter() if t0 is None else t0, on_token=on_token,
                   first_position=next_position)

    @property
    def kv_tokens(self) -> int:
        """Positions this answer's cache needs (its share of the KV memory in flight): its
        prompt and its answer."""
        return self.n_keys + self.max_new_tokens

    def take(self, tok: TokenId) -> bool:
        """Report token `tok`, picked from `logits` (its id read back with the batch's): True
        when it needs a forward for the token after it, else False (and `done` is set)."""
        if self.picked == 0:
            self.ttft_s = time.perf_counter() - self.t0
        self.picked += 1
        if tok in self.stops:
            self.stop_reason, self.done = "stop", True
            return False
        self.tokens.append(tok)
        piece = self.detok.step(tok)
        self.pieces.append(piece)
        if self.on_token is not None:
            try:
                self.on_token(tok, piece)
            except BaseException as exc:  # noqa: BLE001 - this answer ends; the batch goes on
                self.error, self.done = exc, True
                return False
        if self.picked == self.max_new_tokens:
            self.done = True
            return False
        return True

    def step_row(self) -> StepRow:
        """This sequence's part of the next forward (after a `take` that returned True)."""
        i = self.picked - 1
        return StepRow(cache=self.cache, row=self.rows[i:i + 1],
                       position=self.positions[:, i:i + 1], n_keys=self.n_keys + self.picked,
                       slot=self.slot, tier=self.tier, position_id=self.first_position + i)

    def output(self) -> DecodeOutput:
        """What was generated (so far, or in all once `done`)."""
        return DecodeOutput(token_ids=list(self.tokens), text="".join(self.pieces),
                            stop_reason=self.stop_reason, ttft_s=self.ttft_s)


def decode_step(adapter: VLMAdapter, states: list[DecodeState],
                pool: DecodePool | None = None, graphs: StepGraphs | None = None) -> None:
    """Advance every unfinished state by one token: each picks (and reports) its token, and
    those that go on run one batched forward (`batch_forward.forward_step`) for their next
    logits. A batch of one is the single-answer path. With a `pool`, answers that ended
    (here or by their owner setting `done`) give their slots back before the forward, one
    that outgrew its slot moves (`DecodePool.move`), and those going on that have none take
    one if the pool can hold them. With prepared `graphs`, each tier whose pooled answers
    they cover (every one of them) runs in its bucket; the rest (an answer no slot holds,
    a tier not covered) run their part eagerly beside them."""
    going: list[DecodeState] = []
    picked: list[torch.Tensor] = []
    live = [s for s in states if not s.done]
    picks = [s.sampler.pick(s.logits) for s in live]  # 0-d each, on the device
    ids = torch.stack(picks).tolist() if picks else []  # the step's one device-to-host copy
    for state, token, tok in zip(live, picks, ids, strict=True):
        if state.take(TokenId(tok)):
            going.append(state)
            picked.append(token)
        elif state.on_end is not None and state.error is None:
            state.on_end()
    if pool is not None:
        for tier in pool.tiers:
            for owner in [s for s in tier.owners if s.done]:
                pool.release(owner)
        for state in going:
            if state.slot is not None and not pool.holds(state):
                pool.move(state)
            if state.slot is None:
                pool.admit(state)
    if not going:
        return
    rows = [s.step_row() for s in going]
    order: list[int] = []
    parts: list[torch.Tensor] = []
    rest = list(range(len(rows)))
    for t in range(len(pool.tiers) if pool is not None and graphs is not None else 0):
        assert graphs is not None
        mine = [i for i in rest if rows[i].slot is not None and rows[i].tier == t]
        if graphs.covers(t, [rows[i] for i in mine]):
            parts.append(graphs.step(t, [rows[i] for i in mine], [picked[i] for i in mine]))
            order += mine
            rest = [i for i in rest if i not in mine]
    if rest:  # eagerly beside the buckets: a slot of a later tier reads as its own cache
        parts.append(forward_step(adapter, [rows[i] if rows[i].tier == 0 else
                                            replace(rows[i], slot=None) for i in rest],
                                  torch.stack([picked[i] for i in rest]),
                                  pool.tiers[0] if pool is not None else None))
        order += rest
    logits = torch.cat(parts) if len(parts) > 1 else parts[0]  # (B, V) in the order `order`
    for i, at in enumerate(order):
        going[at].logits = logits[i]  # (V,)


def decode(
    adapter: VLMAdapter,
    cache: KVCache,
    first_logits: torch.Tensor,
    *,
    n_keys: int,
    next_position: int,
    max_new_tokens: int,
    sampler: Sampler,
    stop_ids: list[int],
    tokenizer: Any,
    on_token: TokenCallback | None = None,
    t0: float | None = None,
) -> DecodeOutput:
    """Generate up to `max_new_tokens` after a prefill whose last-row logits are given.

    `n_keys` tokens are in the cache; it must have room for max_new_tokens - 1 more.
    Stop tokens end generation and are not part of the output. `on_token(id, piece)` is
    called once per generated token with the characters it completed (see `Detokenizer`);
    what it raises is raised here. The same `decode_step` as a batch, with a batch of one.
    """
    state = DecodeState.start(adapter, cache, first_logits, n_keys=n_keys,
                              next_position=next_position, max_new_tokens=max_new_tokens,
                              sampler=sampler, stop_ids=stop_ids, tokenizer=tokenizer,
                              on_token=on_token, t0=t0)
    while not state.done:
        decode_step(adapter, [state])
    if state.error is not None:
        raise state.error
    return state.output()
