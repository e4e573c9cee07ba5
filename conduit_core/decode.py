"""Greedy and sampled decoding from an assembled KV cache, with stop tokens and streaming.

Public API:
  Sampler(temperature=0.0, top_p=1.0, seed=None)   .pick(logits (V,)) -> token id
  Detokenizer(tokenizer)   incremental text: .step(token_id) -> str (complete characters only)
  printable(text) -> str   text without U+FFFD and control characters (newline, tab kept)
  DecodeOutput(token_ids, text, stop_reason, ttft_s)
  decode(adapter, cache, first_logits, *, n_keys, next_position, max_new_tokens, sampler,
         stop_ids, tokenizer, on_token=None, t0=None) -> DecodeOutput
The first token is picked from the prefill logits; each further token is one row through the
shared layer loop, its K/V appended at the next cache index, its position one past the last.
Row indices and positions of all steps are made on the device once, and the picked token
stays there for its embedding: a step copies one scalar to the host (the token id, for stop
tokens and text) and nothing to the device.

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
from dataclasses import dataclass
from typing import Any

import torch
from tokenizers.decoders import DecodeStream

from conduit_core.adapters.base import VLMAdapter
from conduit_core.answer_types import TokenCallback, TokenId
from conduit_core.kv_cache import KVCache
from conduit_core.layer_forward import forward_rows, logits_of


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
    called once per generated token with the characters it completed (see `Detokenizer`).
    """
    t0 = time.perf_counter() if t0 is None else t0
    dev = adapter.device
    tokens: list[TokenId] = []
    pieces: list[str] = []
    ttft, reason = 0.0, "length"
    logits = first_logits
    stops = set(stop_ids)
    detok = Detokenizer(tokenizer)
    rows = torch.arange(n_keys, n_keys + max_new_tokens, device=dev)  # (T,) cache indices
    positions = torch.arange(next_position, next_position + max_new_tokens,
                             device=dev).expand(adapter.rope_axes, -1)  # (P, T)
    for step in range(max_new_tokens):
        picked = sampler.pick(logits)  # 0-d, on the device
        tok = TokenId(int(picked.item()))  # the step's one device-to-host copy
        if step == 0:
            ttft = time.perf_counter() - t0
        if tok in stops:
            reason = "stop"
            break
        tokens.append(tok)
        piece = detok.step(tok)
        pieces.append(piece)
        if on_token is not None:
            on_token(tok, piece)
        if step == max_new_tokens - 1:
            break
        emb = adapter.embed_tokens(picked.view(1, 1))  # (1, 1, hidden)
        pos = positions[:, step:step + 1].unsqueeze(1)  # (P, 1, 1)
        hidden = forward_rows(adapter, cache, emb, rows[step:step + 1], pos,
                              n_keys=n_keys + step + 1, plain_causal=True)  # (1, 1, hidden)
        logits = logits_of(adapter, hidden)[0, -1]  # (V,)
    return DecodeOutput(token_ids=tokens, text="".join(pieces), stop_reason=reason,
                        ttft_s=ttft)
