"""What a refresh policy sees: the seam between the runtime and `conduit_core/policies/`.

A policy is a function `(ctx: PolicyContext) -> torch.Tensor` returning the sequence indices
of the visual (page segment) tokens to refresh; the runtime then recomputes those plus all
text tokens. Budget k = round(budget * N_v), or, where every refresh recomputes L cached
label rows inside the budget (`Layout.budget_label_rows`), round(budget * (N_v + L)) - L
(at least 0): the refreshed rows then stay within the same share of the cached ones.

A policy reads the layout and the assembled stale cache; it may ask for the scoring pass
(`PolicyContext.scores`, run once per `ScoreConfig` and charged to the answer) or run layers
itself and leave the refresh a `Resume` (CacheBlend). One that runs a forward pass declares
that work before it runs (`cost_profile(ctx) -> PolicyCost`), so that the cost model can
predict it (`conduit_core.cost.cost_model`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from conduit_core.kv.kv_cache import KVCache
from conduit_core.model.adapters.base import VLMAdapter
from conduit_core.passes.refresh_pass import Resume
from conduit_core.passes.scoring import ScoreConfig
from conduit_core.passes.stale_pass import StaleScores
from conduit_core.policies.selection import budget_tokens
from conduit_core.prompt.layout import Layout


@dataclass(frozen=True)
class PolicyCost:
    """The forward work a policy does: its scoring pass (None: none), the layers every row
    runs before it chooses (CacheBlend's check pass; 0: none), and the tokens it refreshes."""

    scoring: ScoreConfig | None = None
    check_layers: int = 0
    k: int = 0


@dataclass
class PolicyContext:
    """Inputs of a refresh decision for one assembled request."""

    layout: Layout
    budget: float
    seed: int | None
    scorer: Callable[[ScoreConfig], tuple[StaleScores, float]]  # scoring pass -> (result, flops)
    cache: KVCache  # the assembled (stale, re-rotated) cache; policies only read it, except
    # cacheblend, which writes every token's fresh K/V at its first layers (its method)
    embeds: torch.Tensor  # (N, hidden) layer-0 embeddings of the layout
    adapter: VLMAdapter  # the model, for policies that run layers themselves (cacheblend)
    extra_flops: float = 0.0
    resume: Resume | None = None
    _scores: dict[ScoreConfig, StaleScores] = field(default_factory=dict, repr=False)

    @property
    def visual_rows(self) -> torch.Tensor:
        """Sequence indices of all page segment tokens (N_v,)."""
        return self.layout.visual_rows()

    @property
    def page_of_visual(self) -> torch.Tensor:
        """Page number of each visual token, aligned with `visual_rows` (N_v,) int64."""
        return self.layout.page_of_visual()

    @property
    def num_pages(self) -> int:
        """Pages in the layout."""
        return len(self.layout.segments)

    @property
    def k(self) -> int:
        """Refresh budget in visual tokens: `budget_tokens(budget, N_v)`, the one rounding
        rule, less the label rows charged to the budget (module docstring)."""
        labels = self.layout.budget_label_rows()
        n_v = int(self.visual_rows.numel())
        return max(0, budget_tokens(self.budget, n_v + labels) - labels)

    def scores(self, config: ScoreConfig | None = None) -> StaleScores:
        """The scoring pass result for `config` (computed on first call; its FLOPs are
        counted)."""
        config = config or ScoreConfig()
        if config not in self._scores:
            self.add_scores(config, *self.scorer(config))
        return self._scores[config]

    def add_scores(self, config: ScoreConfig, scores: StaleScores, flops: float) -> None:
        """Hand the policy a scoring pass for `config` run ahead (by the runtime, in layer
        groups between other work) and count its FLOPs, as `scores` would."""
        self._scores[config] = scores
        self.extra_flops += flops

    def scoring_passes(self) -> list[StaleScores]:
        """The scoring passes run for this context, in the order they ran."""
        return list(self._scores.values())

    def needs_scores(self, config: ScoreConfig | None) -> bool:
        """Whether a scoring pass for `config` is still to run (None: none asked for)."""
        return config is not None and config not in self._scores


RefreshPolicy = Callable[[PolicyContext], torch.Tensor]
