"""A question between its prefill and its last token: the prefill half of an answer hands
this to the decode half (`ReuseRuntime.prefill_steps` / `.step` / `.result`).

The state carries what decoding needs and what the result must report; the result's
accounting (tokens, timing, FLOPs used against a full prefill) is made once, from a finished
state, so every answer path reports its costs the same way.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from conduit_core.answer_types import AnswerResult
from conduit_core.conversation import KeptTurn, PrefixRows
from conduit_core.cost.cost_model import RefreshPlan, RowCosts
from conduit_core.decode import DecodeState
from conduit_core.kv.kv_cache import KVCache
from conduit_core.model.adapters.base import VLMAdapter
from conduit_core.prompt.layout import Layout


@dataclass
class AnswerState:
    """What the decode half of one answer needs, and what its result reports."""

    decode: DecodeState  # cache, rows, positions, first logits, sampler, stop ids, timing
    layout: Layout
    image_grids: list[torch.Tensor]
    last_only: bool
    exact_rows: int  # leading rows from the head cache
    policy: str
    refreshed: int  # visual tokens the refresh recomputed
    flops_used_lm: float
    vision_ran: bool
    fill_flops_lm: float = 0.0  # of flops_used_lm: head and labels computed on cache misses
    plan: RefreshPlan | None = None
    fallback: bool = False
    prefill_s: float = 0.0  # start of the prefill to its first logits
    page_attention: tuple[float, ...] = ()  # `Assembly.page_attention` of its scoring pass
    conversation: str = ""  # a follow-up's prefix: "hit" or "rebuilt" (`AnswerResult`)
    kept: KeptTurn | None = None  # the turn to keep as a prefix once its answer is known
    kept_rows: PrefixRows | None = None  # its rows, taken from its decode when it ended
    lease: KVCache | None = None  # its assembled cache, until the runtime gives it back

    @property
    def done(self) -> bool:
        """No further token to generate (stop token, length, or its callback raised)."""
        return self.decode.done

    @property
    def error(self) -> BaseException | None:
        """What its token callback raised, if it did."""
        return self.decode.error

    @property
    def kv_tokens(self) -> int:
        """Positions its cache holds (prompt + max_new_tokens - 1)."""
        return self.decode.kv_tokens


def answer_result(state: AnswerState, costs: RowCosts, adapter: VLMAdapter) -> AnswerResult:
    """The `AnswerResult` of a state: its tokens, timing and FLOPs accounting."""
    out = state.decode.output()
    layout = state.layout
    n_v = int(layout.visual_rows().numel())
    vision = adapter.vision_flops(state.image_grids)
    full_lm = costs.refresh(layout, torch.arange(layout.n), state.last_only)
    used = state.flops_used_lm
    plan = state.plan
    return AnswerResult(
        text=out.text, token_ids=out.token_ids, ttft_s=out.ttft_s,
        total_s=time.perf_counter() - state.decode.t0, refreshed_visual_tokens=state.refreshed,
        visual_tokens=n_v, flops_full_lm=full_lm, flops_vision=vision,
        flops_used_lm=used, flops_used_vision=vision if state.vision_ran else 0.0,
        policy=state.policy, prompt_tokens=layout.n, stop_reason=out.stop_reason,
        head_tokens=state.exact_rows, fallback=state.fallback,
        fill_flops_lm=state.fill_flops_lm,
        predicted_flops_lm=plan.predicted_lm if plan else used,
        fallback_flops_lm=plan.fallback_lm if plan else used,
        page_attention=state.page_attention, conversation=state.conversation)
