"""Greedy and sampled decoding from an assembled KV cache, with stop tokens and streaming.

Public API:
  Sampler(temperature=0.0, top_p=1.0, seed=None)   .pick(logits (V,)) -> token id
  DecodeOutput(token_ids, text, stop_reason, ttft_s)
  decode(adapter, cache, first_logits, *, n_keys, next_position, max_new_tokens, sampler,
         stop_ids, detokenize, on_token=None, t0=None) -> DecodeOutput
The first token is picked from the prefill logits; each further token is one row through the
shared layer loop, its K/V appended at the next cache index, its position one past the last.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

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
    detokenize: Callable[[list[TokenId]], str],
    on_token: TokenCallback | None = None,
    t0: float | None = None,
) -> DecodeOutput:
    """Generate up to `max_new_tokens` after a prefill whose last-row logits are given.

    `n_keys` tokens are in the cache; it must have room for max_new_tokens - 1 more.
    Stop tokens end generation and are not part of the output.
    """
    t0 = time.perf_counter() if t0 is None else t0
    tokens: list[TokenId] = []
    text, ttft, reason = "", 0.0, "length"
    logits = first_logits
    stops = set(stop_ids)
    for step in range(max_new_tokens):
        tok = TokenId(int(sampler.pick(logits).item()))
        if step == 0:
            ttft = time.perf_counter() - t0
        if tok in stops:
            reason = "stop"
            break
        tokens.append(tok)
        full = detokenize(tokens)
        piece = "" if full.endswith("\ufffd") else full[len(text):]
        if piece:
            text = full
        if on_token is not None:
            on_token(tok, piece)
        if step == max_new_tokens - 1:
            break
        row = torch.tensor([n_keys], device=adapter.device)  # (1,)
        emb = adapter.embed_tokens(torch.tensor([[tok]], device=adapter.device))  # (1, 1, hidden)
        pos = torch.full((adapter.rope_axes, 1, 1), next_position + step, dtype=torch.long)
        hidden = forward_rows(adapter, cache, emb, row, pos, n_keys=n_keys + 1, plain_causal=True)
        logits = logits_of(adapter, hidden)[0, -1]  # (V,)
        n_keys += 1
    return DecodeOutput(token_ids=tokens, text=detokenize(tokens), stop_reason=reason,
                        ttft_s=ttft)
