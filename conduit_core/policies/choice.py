"""A refresh policy in the one form a request carries it: a `PolicyChoice`, the registered
name with the options it runs with and the configured policy they resolve to.

A choice is made once, where a request enters (`conduit_core.policies.registry.
choose_policy`), and every later step reads it: the runtime runs `select`, the answer
reports `name`, the cost model's history of earlier choices is keyed by the whole choice.
`PolicyOptions` are the per-request knobs of the CONDUIT family; `over` is the one rule by
which a request's knobs override a deployment's.

This module imports no policy and no torch, so that the settings can name the default
policy without loading the model code.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from conduit_core.policies.policy_context import RefreshPolicy

DEFAULT_POLICY = "conduit_per_page"  # the refresh policy of a request that names none


@dataclass(frozen=True)
class PolicyOptions:
    """Per-request knobs of the CONDUIT family (`conduit`; `conduit_per_page` and
    `conduit_focus`, which refuse gamma); None leaves the policy's own value (meanings and
    bounds: `conduit_core.passes.scoring.ScoreConfig`,
    `conduit_core.policies.conduit.ConduitConfig`).

    gamma:         amplification exponent >= 0 (0 = no image-level amplification).
    score_layers:  "all", a half-open (start, stop) range of decoder layers to score with,
                   or a depth f in (0, 1]: the first ceil(f * L) of the model's L layers (the
                   scoring pass stops after its last scored layer).
    query_window:  score with only the last w question tokens (None = all of them).
    head_agg:      "mean" or "max" over query heads.
    """

    gamma: float | None = None
    score_layers: str | tuple[int, int] | float | None = None
    query_window: int | None = None
    head_agg: str | None = None

    def is_default(self) -> bool:
        """True when no knob is set."""
        return self == PolicyOptions()

    def over(self, base: PolicyOptions) -> PolicyOptions:
        """These knobs where set, `base`'s where not (a request's over a deployment's)."""
        return PolicyOptions(
            gamma=base.gamma if self.gamma is None else self.gamma,
            score_layers=base.score_layers if self.score_layers is None else self.score_layers,
            query_window=base.query_window if self.query_window is None else self.query_window,
            head_agg=base.head_agg if self.head_agg is None else self.head_agg)

    def set_knobs(self) -> frozenset[str]:
        """The names of the knobs that are set."""
        return frozenset(name for name, value in (
            ("gamma", self.gamma), ("score_layers", self.score_layers),
            ("query_window", self.query_window), ("head_agg", self.head_agg))
            if value is not None)


@dataclass(frozen=True)
class PolicyChoice:
    """A refresh policy resolved once for a request: the registered name, the options it was
    configured with, and the configured policy. Equal choices run the same selection."""

    name: str
    options: PolicyOptions
    select: RefreshPolicy = field(compare=False, repr=False)
