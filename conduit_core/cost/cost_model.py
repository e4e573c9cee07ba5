"""What a prefill will cost before it runs, so that reuse never costs more than full prefill.

The runtime computes, per request, the rows a refresh runs
(`conduit_core.passes.refresh_pass.refresh_rows`) and charges them as computed
(`conduit_core.model.flops`, `RowCosts` here). This module predicts that charge before the
policy runs (`plan_refresh`):

  * a policy that selects without a forward pass (random, EPIC, value norm, full reuse,
    prefix reuse, full prefill, ...) is run first: its choice is cheap and exact, so the
    prediction is the refresh's exact cost, and the choice is kept for the refresh;
  * a policy with a forward pass declares it with `cost_profile(ctx) -> PolicyCost` (the
    scoring pass it runs, CacheBlend's check layers, and its k). Its refreshed tokens are not
    known before that pass, so the prediction places its k tokens where the same policy's
    choices fell in earlier answers at the same budget (`conduit_core.cost.choice_history`; evenly
    over the pages when there were none): the linear part of the cost is exact, the attention
    part an estimate of their key counts.

Where the choice is not known, the decision uses an upper bound instead of the estimate (every
refreshed row reading every key, every text row recomputed), so that no answer costs more than
its fallback; the estimate is what the answer reports (`AnswerResult.predicted_flops_lm`;
how close it comes: docs/DECISIONS.md, "The cost estimate learns where a policy's choices
fall").

The alternative every prediction is compared with is a full prefill from the cached page
embeddings (vision tower skipped): every row after the cached head recomputed, or every row
on the plain causal path where that is cheaper (a masked subset computes up to a row block
of keys more per row, which outweighs the head where attention dominates the cost: tiny
models). Where the policy's bound exceeds it, the runtime runs that instead and says so
(`RefreshPlan.fallback`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from conduit_core.cost.choice_history import even_rows
from conduit_core.model.adapters.base import VLMAdapter
from conduit_core.model.flops import FlopsModel
from conduit_core.passes.layer_forward import computed_key_counts
from conduit_core.passes.refresh_pass import refresh_rows
from conduit_core.passes.scoring import ScoreConfig
from conduit_core.passes.stale_pass import fused_layers, pass_layers, trimmed_last
from conduit_core.policies.policy_context import PolicyContext, PolicyCost, RefreshPolicy
from conduit_core.prompt.layout import Layout


@dataclass(frozen=True)
class RefreshPlan:
    """A prediction of the policy's language-model FLOPs and of the fallback's."""

    predicted_lm: float
    fallback_lm: float
    visual: torch.Tensor | None  # the choice, when it was made while predicting (cheap policy)
    fallback_whole: bool = False  # the fallback recomputes the head too (plain causal path)
    bound_lm: float | None = None  # the most the policy can cost (None: predicted_lm is exact)
    cap: int | None = None  # a forward-pass policy's k: the most it refreshes

    @property
    def fallback(self) -> bool:
        """The policy could cost more than a full prefill from cached embeddings: decided on
        the upper bound, so that an answer never costs more than the fallback."""
        bound = self.predicted_lm if self.bound_lm is None else self.bound_lm
        return bound > self.fallback_lm


@dataclass(frozen=True)
class RowCosts:
    """Language-model FLOPs of the runtime's passes, as `forward_rows` computes them."""

    adapter: VLMAdapter
    flops: FlopsModel

    def refresh(self, layout: Layout, rows: torch.Tensor, last_only: bool,
                start_layer: int = 0) -> float:
        """Rows (R,) run from `start_layer` through the last layer over the layout's keys;
        with `last_only` the last layer runs in full for the last row only."""
        return self.rows(rows, layout.n, last_only, start_layer)

    def rows(self, rows: torch.Tensor, n: int, last_only: bool, start_layer: int = 0,
             stop_layer: int | None = None) -> float:
        """`refresh` over the first `n` keys of any sequence (a label computed after its
        head: rows [h, h + t), n = h + t); with `stop_layer`, through layer stop_layer - 1
        only (`last_only` then trims that layer)."""
        if rows.numel() == 0:
            return 0.0
        stop = len(self.adapter.layers) if stop_layer is None else stop_layer
        n_layers = stop - start_layer
        plain = rows.numel() == n
        counts = computed_key_counts(self.adapter, rows, n, plain_causal=plain)
        if not last_only:
            return self.flops.rows(rows, n_layers=n_layers, key_counts=counts)
        out_counts = computed_key_counts(self.adapter, rows[-1:], n)
        return self.flops.trimmed(rows, n_layers, counts, out_counts)

    def after_scoring(self, layout: Layout, rows: torch.Tensor, last_only: bool) -> float:
        """A refresh after a scoring pass (`text_from_layer_one`): the visual rows among
        `rows` through layer 0, then every row from layer 1 on."""
        if rows.numel() == 0 or len(self.adapter.layers) < 2:
            return self.refresh(layout, rows, last_only)
        visual = rows[~torch.isin(rows, layout.text_rows())]  # (V,)
        counts = computed_key_counts(self.adapter, visual, layout.n)
        first = self.flops.rows(visual, n_layers=1, key_counts=counts) if visual.numel() else 0.0
        return first + self.refresh(layout, rows, last_only, start_layer=1)

    def scoring(self, layout: Layout, text_rows: torch.Tensor, config: ScoreConfig,
                last_only: bool) -> float:
        """The scoring pass: `text_rows` through its layers (up to the last scored one:
        `pass_layers`; the last one trimmed to the last row where `trimmed_last`), plus the
        scored question rows' probabilities and the value norms at the scored layers; at the
        layers where the probabilities give the attention output (`fused_layers`), the rows'
        attention is that product with the values instead of the layer's own."""
        n_layers = len(self.adapter.layers)
        layers = range(n_layers)[config.layer_slice(n_layers)]
        n_scored = int(config.scored_rows(int(layout.question_rows().numel()),
                                          layout.prompt).numel())
        extras = self.flops.scoring(n_scored, layout.n, len(layers))
        trimmed = trimmed_last(config, n_layers, last_only)
        cost = self.rows(text_rows, layout.n, trimmed,
                         stop_layer=pass_layers(config, n_layers)) + extras
        fused = len(fused_layers(layers, n_scored, int(text_rows.numel()), trimmed,
                                 self.adapter.device))
        if fused:
            counts = computed_key_counts(self.adapter, text_rows, layout.n)  # (R,)
            own = fused * self.flops.lm.pair_cost * float(counts.double().sum())
            cost += self.flops.value_mix(float(text_rows.numel()) * layout.n, fused) - own
        return cost

    def bound(self, layout: Layout, rows: torch.Tensor, last_only: bool,
              start_layer: int = 0) -> float:
        """The most `refresh` of this many rows can cost: every row charged every key."""
        if rows.numel() == 0:
            return 0.0
        n, n_layers = layout.n, len(self.adapter.layers) - start_layer
        every = torch.full((rows.numel(),), n, dtype=torch.long)
        if not last_only:
            return self.flops.rows(rows, n_layers=n_layers, key_counts=every)
        return self.flops.trimmed(rows, n_layers, every, every[-1:])

    def head(self, h: int) -> float:
        """A prompt head of `h` tokens computed alone (`conduit_core.passes.prompt_head`):
        every row through every layer on the plain causal path, all outputs kept."""
        return self.rows(torch.arange(h), h, last_only=False)

    def check(self, layout: Layout, layers: int) -> float:
        """Every row through the first `layers` layers on the plain causal path."""
        everything = torch.arange(layout.n)
        counts = computed_key_counts(self.adapter, everything, layout.n, plain_causal=True)
        return self.flops.rows(everything, n_layers=layers, key_counts=counts)


def plan_refresh(costs: RowCosts, layout: Layout, exact_rows: int, last_only: bool,
                 ctx: PolicyContext, policy: RefreshPolicy,
                 place: Callable[[torch.Tensor, int], torch.Tensor] = even_rows,
                 text_from_one: bool = True) -> RefreshPlan:
    """Predict the policy's prefill FLOPs for this layout and the fallback's (see module);
    `place(visual_rows, k)` is where a forward-pass policy's k rows are assumed to lie;
    `text_from_one`: a refresh after a scoring pass starts its text rows at layer 1."""
    visual_all = layout.visual_rows()
    fallback_rows, _ = refresh_rows(layout, exact_rows, visual_all, scored=False)
    suffix = costs.refresh(layout, fallback_rows, last_only)
    whole = costs.refresh(layout, torch.arange(layout.n), last_only)
    fallback, from_start = min(suffix, whole), whole < suffix
    profile: Callable[[PolicyContext], PolicyCost] | None = getattr(policy, "cost_profile",
                                                                    None)
    if profile is None:  # the policy runs now; a forward pass it ran is spent (extra_flops)
        visual = policy(ctx).to(torch.long).cpu().unique()  # (k,)
        scored = bool(ctx.extra_flops)
        passes = ctx.scoring_passes()  # the refresh reuses the last one's text rows
        reuse = not passes or passes[-1].text_hidden is not None
        rows, _ = refresh_rows(layout, exact_rows, visual, scored=scored, reuse=reuse)
        refresh = (costs.after_scoring(layout, rows, last_only) if scored and text_from_one
                   else costs.refresh(layout, rows, last_only))
        return RefreshPlan(ctx.extra_flops + refresh, fallback, visual, from_start)
    cost = profile(ctx)
    guess = place(visual_all, cost.k)  # (k,)
    predicted = 0.0
    scored = cost.scoring is not None
    reuse = True  # a scoring pass through every layer leaves the refresh its text rows
    if cost.scoring is not None:
        text = layout.text_rows()
        predicted += costs.scoring(layout, text[text >= exact_rows], cost.scoring, last_only)
        n_layers = len(costs.adapter.layers)
        reuse = pass_layers(cost.scoring, n_layers) == n_layers
    if cost.check_layers:
        predicted += costs.check(layout, cost.check_layers)
    rows, _ = refresh_rows(layout, exact_rows, guess, scored=scored, reuse=reuse)
    refresh = (costs.after_scoring(layout, rows, last_only)
               if scored and text_from_one and not cost.check_layers
               else costs.refresh(layout, rows, last_only, start_layer=cost.check_layers))
    # the bound: every text row after the head and every page label recomputed (a page
    # chosen whole takes its label, the first one included), every row reading every key
    most, _ = refresh_rows(layout, exact_rows, visual_all[-cost.k:] if cost.k else guess,
                           scored=False)
    most = torch.cat([most, layout.label_rows()]).unique(sorted=True)  # (R,)
    most = most[most >= exact_rows]
    bound = predicted + costs.bound(layout, most, last_only, start_layer=cost.check_layers)
    return RefreshPlan(predicted + refresh, fallback, None, from_start, bound, cost.k)
